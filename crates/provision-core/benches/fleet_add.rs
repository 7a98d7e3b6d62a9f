//! The cost of `Fleet::add` as the queue fills and overflows: ten times the capacity in new
//! discovered nodes (the queue, then the discovery backlog of four times the queue, then as many
//! again dropped), then the same flood again as forged re-announcements (every add hits a full
//! queue). Prints the nanoseconds per add for each tenth of each phase and fails (exit status 1)
//! when the last tenth of a phase costs more than three times the phase's median tenth, which an
//! O(queue) step per add would (a hash table's growth makes single tenths jump, not the last).
//!
//! `cargo bench -p provision-core --bench fleet_add [-- CAPACITY]` (default 250,000, the
//! daemon's default `work_queue_size`).

use std::time::Instant;

use provision_core::fleet::BACKLOG_FACTOR;
use provision_core::testing::{FakeHelper, FakeNode, TOKEN};
use provision_core::{AddResult, Fleet, ProvisionConfig, Provisioner, Source};

fn main() {
    let capacity: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(250_000);
    let provisioner = Provisioner::builder(FakeNode::new(), FakeHelper::default())
        .config(
            ProvisionConfig::builder()
                .token(TOKEN)
                .build()
                .expect("config"),
        )
        .build();
    let fleet = Fleet::with_capacity(provisioner, capacity);
    // The queue, the backlog behind it (BACKLOG_FACTOR times the queue) and as much again
    // dropped from both.
    let names: Vec<String> = (0..capacity * (2 + 2 * BACKLOG_FACTOR))
        .map(|n| format!("node-{n}.example.net"))
        .collect();
    let mut worst = 1.0f64;
    for (phase, source) in [
        ("discovery, 10x capacity", Source::Discovery),
        ("forged events, queue full", Source::Event),
    ] {
        let tenth = names.len() / 10;
        let mut costs = Vec::new();
        let mut results = [0usize; 4];
        let mut line = String::new();
        for chunk in names.chunks(tenth) {
            let started = Instant::now();
            for name in chunk {
                match fleet.add(name, source) {
                    AddResult::Queued => results[0] += 1,
                    AddResult::Backlogged => results[1] += 1,
                    AddResult::QueueFull => results[2] += 1,
                    _ => results[3] += 1,
                }
            }
            let ns = started.elapsed().as_nanos() as f64 / chunk.len() as f64;
            costs.push(ns);
            line.push_str(&format!(" {ns:.0}"));
        }
        let last = costs.last().copied().unwrap_or(0.0);
        costs.sort_by(f64::total_cmp);
        let median = costs[costs.len() / 2].max(1.0);
        worst = worst.max(last / median);
        println!(
            "fleet_add phase=\"{phase}\" capacity={capacity} ns_per_add_by_tenth=[{}] queued={} backlogged={} full={} other={}",
            line.trim(),
            results[0],
            results[1],
            results[2],
            results[3]
        );
    }
    println!(
        "fleet_add flat={} last_tenth_over_median={worst:.2}",
        if worst <= 3.0 { "yes" } else { "no" }
    );
    if worst > 3.0 {
        std::process::exit(1);
    }
}
