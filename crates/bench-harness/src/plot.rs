//! `cargo xtask bench --plot FILE.svg`: every contender of a run drawn with `plotters` into one
//! SVG file of two panels sharing the time axis: the nodes provisioned over time above, the
//! provisioner's resident memory over time below, one line a contender in each.

use std::path::Path;

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::{Error, Result};

/// One contender's curves.
#[derive(Debug, Clone)]
pub struct Line {
    /// Its name in the legend.
    pub label: String,
    /// (seconds since the provisioner started, nodes provisioned), in time order.
    pub provisioned: Vec<(f64, f64)>,
    /// (seconds since the provisioner started, the provisioner's resident MiB), in time order.
    pub rss_mib: Vec<(f64, f64)>,
}

/// Draws `lines` under `title` into the SVG file `path`.
pub fn draw(path: &Path, title: &str, lines: &[Line]) -> Result<()> {
    let fail =
        |e: &dyn std::fmt::Display| Error::Failed(format!("cannot draw {}: {e}", path.display()));
    let max_x = lines
        .iter()
        .flat_map(|l| l.provisioned.iter().chain(&l.rss_mib))
        .map(|p| p.0)
        .fold(1.0, f64::max);
    let root = SVGBackend::new(path, (960, 960)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| fail(&e))?;
    let root = root
        .titled(title, ("sans-serif", 24))
        .map_err(|e| fail(&e))?;
    let (top, bottom) = root.split_vertically(470);
    panel(&top, "nodes provisioned", max_x, lines, |l| &l.provisioned).map_err(|e| fail(&e))?;
    let rss = "provisioner resident memory (MiB)";
    panel(&bottom, rss, max_x, lines, |l| &l.rss_mib).map_err(|e| fail(&e))?;
    root.present().map_err(|e| fail(&e))?;
    Ok(())
}

/// One panel: `what` of every line over time (`points` picks its curve).
fn panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    what: &str,
    max_x: f64,
    lines: &[Line],
    points: fn(&Line) -> &[(f64, f64)],
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let max_y = lines
        .iter()
        .flat_map(|l| points(l).iter())
        .map(|p| p.1)
        .fold(1.0, f64::max);
    let mut chart = ChartBuilder::on(area)
        .caption(format!("{what} over time"), ("sans-serif", 18))
        .margin(20)
        .x_label_area_size(45)
        .y_label_area_size(90)
        .build_cartesian_2d(0f64..max_x * 1.03, 0f64..max_y * 1.05)?;
    chart
        .configure_mesh()
        .x_desc("seconds since the provisioner started")
        .y_desc(what)
        .y_label_formatter(&|y| format!("{y:.0}"))
        .draw()?;
    for (i, line) in lines.iter().enumerate() {
        let colour = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(
                points(line).iter().copied(),
                colour.stroke_width(3),
            ))?
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
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn every_contender_is_a_labelled_line_of_both_panels() {
        let dir = std::env::temp_dir().join(format!("bench-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("bench.svg");
        let lines = vec![
            Line {
                label: "ours, exec helper".into(),
                provisioned: vec![(0.0, 0.0), (5.0, 4000.0), (12.5, 10000.0)],
                rss_mib: vec![(0.2, 12.0), (5.0, 30.5), (12.5, 41.0)],
            },
            Line {
                label: "Go provisioner".into(),
                provisioned: vec![(0.0, 0.0), (100.0, 2500.0), (190.0, 10000.0)],
                rss_mib: vec![(0.2, 40.0), (100.0, 300.0), (190.0, 610.0)],
            },
        ];
        draw(&path, "10000 nodes, ed25519 mode", &lines).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(svg.starts_with("<svg"), "{}", &svg[..100.min(svg.len())]);
        for text in [
            "10000 nodes, ed25519 mode",
            "nodes provisioned over time",
            "provisioner resident memory (MiB) over time",
        ] {
            assert_eq!(svg.matches(text).count(), 1, "{text} once in the plot");
        }
        for label in ["ours, exec helper", "Go provisioner"] {
            assert_eq!(svg.matches(label).count(), 2, "{label} in both legends");
        }
        // A curve per contender in each panel, each with its legend mark.
        assert!(svg.matches("<polyline").count() >= 4, "{svg}");
        // The memory panel's scale reaches the Go provisioner's 610 MiB.
        assert!(svg.lines().any(|l| l.trim() == "600"), "{svg}");
    }
}
