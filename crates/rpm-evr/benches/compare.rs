//! Comparisons per second of parsed versions and of bare version strings.
#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use rpm_evr::{rpmvercmp, Version};
use std::hint::black_box;
use std::time::Duration;

/// Realistic pairs: the kind of versions a fleet reports, with the usual near misses.
const PAIRS: &[(&str, &str)] = &[
    ("1:2.4.1-3.el9", "1:2.4.10-1.el9"),
    ("0.27.0-1.el8", "0.27.0-1.el8"),
    ("5.14.0-362.24.1.el9_3", "5.14.0-362.18.1.el9_3"),
    ("1.0~rc1-1", "1.0-1"),
    ("2.0^20240101git1a2b3c-1.fc40", "2.0-1.fc40"),
    ("10.0001-1", "10.1-1"),
    ("3.2.1-4.el8", "3.2.1-4.el9"),
    ("1:1.1.1k-12.el8_9", "1:1.1.1k-9.el8_7"),
];

fn bench(c: &mut Criterion) {
    let parsed: Vec<(Version, Version)> = PAIRS
        .iter()
        .map(|(a, b)| (a.parse().unwrap(), b.parse().unwrap()))
        .collect();
    let mut group = c.benchmark_group("rpm-evr");
    group.throughput(Throughput::Elements(PAIRS.len() as u64));
    group.bench_function("Version::cmp", |bench| {
        bench.iter(|| {
            for (a, b) in &parsed {
                black_box(black_box(a).cmp(black_box(b)));
            }
        })
    });
    group.bench_function("rpmvercmp", |bench| {
        bench.iter(|| {
            for (a, b) in PAIRS {
                black_box(rpmvercmp(black_box(a), black_box(b)));
            }
        })
    });
    group.bench_function("parse", |bench| {
        bench.iter(|| {
            for (a, _) in PAIRS {
                black_box(Version::parse(black_box(a)).ok());
            }
        })
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    targets = bench
}
criterion_main!(benches);
