//! `cargo xtask bench --plot FILE.svg`: the nodes provisioned over time of every contender of a
//! run, one line each, drawn with `plotters` into an SVG file.

use std::path::Path;

use anyhow::{anyhow, Result};
use plotters::prelude::*;

/// One contender's curve.
#[derive(Debug, Clone)]
pub struct Line {
    /// Its name in the legend.
    pub label: String,
    /// (seconds since the provisioner started, nodes provisioned), in time order.
    pub points: Vec<(f64, f64)>,
}

/// Draws `lines` under `title` into the SVG file `path`.
pub fn draw(path: &Path, title: &str, lines: &[Line]) -> Result<()> {
    let all = || lines.iter().flat_map(|l| l.points.iter());
    let max_x = all().map(|p| p.0).fold(1.0, f64::max);
    let max_y = all().map(|p| p.1).fold(1.0, f64::max);
    let fail = |e: &dyn std::fmt::Display| anyhow!("cannot draw {}: {e}", path.display());
    let root = SVGBackend::new(path, (960, 540)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| fail(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(20)
        .x_label_area_size(45)
        .y_label_area_size(80)
        .build_cartesian_2d(0f64..max_x * 1.03, 0f64..max_y * 1.05)
        .map_err(|e| fail(&e))?;
    chart
        .configure_mesh()
        .x_desc("seconds since the provisioner started")
        .y_desc("nodes provisioned")
        .y_label_formatter(&|y| format!("{y:.0}"))
        .draw()
        .map_err(|e| fail(&e))?;
    for (i, line) in lines.iter().enumerate() {
        let colour = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(
                line.points.iter().copied(),
                colour.stroke_width(3),
            ))
            .map_err(|e| fail(&e))?
            .label(line.label.as_str())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 24, y)], colour.stroke_width(3))
            });
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .draw()
        .map_err(|e| fail(&e))?;
    root.present().map_err(|e| fail(&e))?;
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn every_contender_is_a_labelled_line_of_the_svg() {
        let dir = std::env::temp_dir().join(format!("xtask-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("bench.svg");
        let lines = vec![
            Line {
                label: "ours, exec helper".into(),
                points: vec![(0.0, 0.0), (5.0, 4000.0), (12.5, 10000.0)],
            },
            Line {
                label: "Go provisioner".into(),
                points: vec![(0.0, 0.0), (100.0, 2500.0), (190.0, 10000.0)],
            },
        ];
        draw(&path, "10000 nodes, ed25519", &lines).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(svg.starts_with("<svg"), "{}", &svg[..100.min(svg.len())]);
        for text in [
            "ours, exec helper",
            "Go provisioner",
            "10000 nodes, ed25519",
            "nodes provisioned",
        ] {
            assert!(svg.contains(text), "{text} missing from the plot");
        }
        // One polyline per contender, plus the legend's marks.
        assert!(svg.matches("<polyline").count() >= 2, "{svg}");
    }
}
