//! Runs rpm's answers through all three crates: rpm-evr must agree with rpm on every case; the
//! peers' disagreements are printed as data (run with `--nocapture` to see them).
#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

use rpm_evr_compare::{load_cases, Impl};
use std::cmp::Ordering;

fn show(o: Option<Ordering>) -> &'static str {
    match o {
        Some(Ordering::Less) => "<",
        Some(Ordering::Equal) => "=",
        Some(Ordering::Greater) => ">",
        None => "rejected",
    }
}

#[test]
fn rpm_evr_agrees_with_rpm_on_every_case_and_peers_are_tallied() {
    let cases = load_cases().unwrap();
    assert!(cases.len() > 5000, "only {} cases", cases.len());
    println!("{} cases answered by rpm 4.18", cases.len());
    println!("| implementation | agrees with rpm | disagrees | Eq/Ord inconsistent |");
    println!("| --- | --- | --- | --- |");
    let mut examples = Vec::new();
    for imp in Impl::ALL {
        let mut wrong = 0;
        let mut inconsistent = 0;
        for case in &cases {
            let got = imp.compare(case);
            if got != Some(case.expected) {
                wrong += 1;
                if examples.iter().filter(|(i, _)| *i == imp).count() < 8 {
                    let line = format!(
                        "{}: {:?} vs {:?} ({}:{}): rpm says {}, it says {}",
                        imp.name(),
                        case.a,
                        case.b,
                        case.table,
                        case.line,
                        show(Some(case.expected)),
                        show(got)
                    );
                    examples.push((imp, line));
                }
            }
            if !imp.eq_agrees_with_cmp(case) {
                inconsistent += 1;
            }
        }
        println!(
            "| {} | {} | {} | {} |",
            imp.name(),
            cases.len() - wrong,
            wrong,
            inconsistent
        );
        if imp == Impl::RpmEvr {
            assert_eq!(wrong, 0, "rpm-evr disagrees with rpm: {:#?}", examples);
            assert_eq!(inconsistent, 0, "rpm-evr's == disagrees with its cmp");
        }
    }
    println!("\nexamples of disagreement with rpm:");
    for (_, line) in &examples {
        println!("  {line}");
    }
}

#[test]
fn the_rpm_crate_and_rpm_version_are_told_apart_from_rpm_evr_on_a_known_case() {
    // rpm treats a release made only of separators as present, so "1.0-." is newer than "1.0".
    let case = load_cases()
        .unwrap()
        .into_iter()
        .find(|c| c.table == "evr.tsv" && c.a == "1.0-." && c.b == "1.0")
        .unwrap();
    assert_eq!(case.expected, Ordering::Greater);
    assert_eq!(Impl::RpmEvr.compare(&case), Some(Ordering::Greater));
    assert_eq!(Impl::RpmVersion.compare(&case), Some(Ordering::Equal));
    assert_eq!(Impl::RpmCrate.compare(&case), Some(Ordering::Equal));
}
