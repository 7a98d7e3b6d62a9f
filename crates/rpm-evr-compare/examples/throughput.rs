//! Comparisons per second of each crate, measured in interleaved rounds so that load from other
//! processes on a shared machine falls on all of them alike. Prints the median of the rounds.
//!
//! `cargo run --release -p rpm-evr-compare --example throughput`
#![allow(clippy::unwrap_used)] // bad benchmark inputs should stop the run at once

use rpm_evr_compare::{ParsedPairs, BENCH_PAIRS};
use std::hint::black_box;
use std::time::{Duration, Instant};

const ROUNDS: usize = 21;

/// A named measurement: one pass over all pairs.
type Measurement<'a> = (&'static str, Box<dyn FnMut() + 'a>);
const ROUND: Duration = Duration::from_millis(100);

/// Runs `f` (one pass over all pairs) for about one round; returns comparisons per second.
fn round(f: &mut dyn FnMut()) -> f64 {
    let start = Instant::now();
    let mut passes = 0u64;
    while start.elapsed() < ROUND {
        for _ in 0..100 {
            f();
        }
        passes += 100;
    }
    (passes * BENCH_PAIRS.len() as u64) as f64 / start.elapsed().as_secs_f64()
}

fn main() {
    let ParsedPairs {
        ours,
        rpm_version: rv,
        rpm_crate: rc,
    } = ParsedPairs::new();

    let mut cases: Vec<Measurement> = vec![
        (
            "cmp parsed: rpm-evr",
            Box::new(|| {
                ours.iter().for_each(|(a, b)| {
                    black_box(black_box(a).cmp(black_box(b)));
                })
            }),
        ),
        (
            "cmp parsed: rpm-version 0.5.1",
            Box::new(|| {
                rv.iter().for_each(|(a, b)| {
                    black_box(black_box(a).cmp(black_box(b)));
                })
            }),
        ),
        (
            "cmp parsed: rpm 0.23.4 Evr",
            Box::new(|| {
                rc.iter().for_each(|(a, b)| {
                    black_box(black_box(a).cmp(black_box(b)));
                })
            }),
        ),
        (
            "parse+cmp: rpm-evr compare_evr",
            Box::new(|| {
                BENCH_PAIRS.iter().for_each(|(a, b)| {
                    black_box(rpm_evr::compare_evr(black_box(a), black_box(b)).unwrap());
                })
            }),
        ),
        (
            "parse+cmp: rpm-evr Version::parse",
            Box::new(|| {
                BENCH_PAIRS.iter().for_each(|(a, b)| {
                    let (a, b) = (
                        rpm_evr::Version::parse(black_box(a)).unwrap(),
                        rpm_evr::Version::parse(black_box(b)).unwrap(),
                    );
                    black_box(a.cmp(&b));
                })
            }),
        ),
        (
            "parse+cmp: rpm-version 0.5.1",
            Box::new(|| {
                BENCH_PAIRS.iter().for_each(|(a, b)| {
                    black_box(rpm_version::rpm_evr_compare(black_box(a), black_box(b)));
                })
            }),
        ),
        (
            "parse+cmp: rpm 0.23.4 Evr",
            Box::new(|| {
                BENCH_PAIRS.iter().for_each(|(a, b)| {
                    black_box(rpm::Evr::parse(black_box(a)).cmp(&rpm::Evr::parse(black_box(b))));
                })
            }),
        ),
    ];
    let mut rates = vec![Vec::with_capacity(ROUNDS); cases.len()];
    for _ in 0..ROUNDS {
        for (i, (_, f)) in cases.iter_mut().enumerate() {
            rates[i].push(round(f.as_mut()));
        }
    }
    println!("| measurement | million comparisons/s (median of {ROUNDS} interleaved rounds) |");
    println!("| --- | --- |");
    for ((name, _), mut r) in cases.iter().zip(rates) {
        r.sort_by(f64::total_cmp);
        println!("| {name} | {:.1} |", r[ROUNDS / 2] / 1e6);
    }
}
