//! The same comparisons through rpm-evr, rpm-version and rpm's Evr, in one run.
#![allow(clippy::unwrap_used)] // a benchmark with bad inputs should stop at once

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use rpm_evr_compare::{ParsedPairs, BENCH_PAIRS};
use std::hint::black_box;
use std::time::Duration;

fn parsed_cmp(c: &mut Criterion) {
    let ParsedPairs {
        ours,
        rpm_version: rv,
        rpm_crate: rc,
    } = ParsedPairs::new();

    let mut group = c.benchmark_group("cmp parsed");
    group.throughput(Throughput::Elements(BENCH_PAIRS.len() as u64));
    group.bench_function(BenchmarkId::from_parameter("rpm-evr"), |bench| {
        bench.iter(|| {
            ours.iter().for_each(|(a, b)| {
                black_box(black_box(a).cmp(black_box(b)));
            })
        })
    });
    group.bench_function(BenchmarkId::from_parameter("rpm-version"), |bench| {
        bench.iter(|| {
            rv.iter().for_each(|(a, b)| {
                black_box(black_box(a).cmp(black_box(b)));
            })
        })
    });
    group.bench_function(BenchmarkId::from_parameter("rpm"), |bench| {
        bench.iter(|| {
            rc.iter().for_each(|(a, b)| {
                black_box(black_box(a).cmp(black_box(b)));
            })
        })
    });
    group.finish();
}

fn parse_and_cmp(c: &mut Criterion) {
    let mut group = c.benchmark_group("parse and cmp");
    group.throughput(Throughput::Elements(BENCH_PAIRS.len() as u64));
    group.bench_function(
        BenchmarkId::from_parameter("rpm-evr compare_evr"),
        |bench| {
            bench.iter(|| {
                for (a, b) in BENCH_PAIRS {
                    black_box(rpm_evr::compare_evr(black_box(a), black_box(b)).unwrap());
                }
            })
        },
    );
    group.bench_function(
        BenchmarkId::from_parameter("rpm-evr Version::parse"),
        |bench| {
            bench.iter(|| {
                for (a, b) in BENCH_PAIRS {
                    let a = rpm_evr::Version::parse(black_box(a)).unwrap();
                    let b = rpm_evr::Version::parse(black_box(b)).unwrap();
                    black_box(a.cmp(&b));
                }
            })
        },
    );
    group.bench_function(BenchmarkId::from_parameter("rpm-version"), |bench| {
        bench.iter(|| {
            for (a, b) in BENCH_PAIRS {
                black_box(rpm_version::rpm_evr_compare(black_box(a), black_box(b)));
            }
        })
    });
    group.bench_function(BenchmarkId::from_parameter("rpm"), |bench| {
        bench.iter(|| {
            for (a, b) in BENCH_PAIRS {
                black_box(rpm::Evr::parse(black_box(a)).cmp(&rpm::Evr::parse(black_box(b))));
            }
        })
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(30);
    targets = parsed_cmp, parse_and_cmp
}
criterion_main!(benches);
