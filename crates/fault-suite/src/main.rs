//! The fault-injection suite, run by `cargo xtask faults [--release] [--list] [SCENARIO...]`
//! (that is `cargo run -p fault-suite -- ARGS`).
//!
//! Every scenario runs the real provisioner, fleet simulator, nats-server and a helper on
//! loopback, injects one fault, and checks the same invariants:
//!
//! 1. the provisioner neither panics nor exits, and stops cleanly on SIGTERM at the end;
//! 2. no node that failed a check was configured (read from the simulator's `--report`);
//! 3. every node is provisioned once the fault clears, within the stated time;
//! 4. the error counters on `/metrics` and the provisioner's log name what happened.
//!
//! Node faults are fixed for the life of a simulated fleet (the simulator picks the affected
//! nodes by a hash of their identity), so "the fault clears" means the simulator is started again
//! without the fault: every node comes back in provisioning mode and announces itself with a
//! startup event, which is what makes the provisioner try the failed nodes again (discovery runs
//! only once a minute). Helper faults clear by switching the helper script to the working helper.
//!
//! The scenarios are a table ([`scenarios::scenarios`]) of functions grouped by theme, on a
//! harness ([`harness`]) over `test-support`.

mod active_active;
mod broker;
mod floods;
mod ha;
mod harness;
mod helper_faults;
mod jwt_faults;
mod keys;
mod monitor;
mod node_faults;
mod rotation;
mod scenarios;
mod secrets;
mod webhook_faults;

use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};

use harness::Env;
use scenarios::{scenarios, Scenario};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Err(e) = run(&args) {
        eprintln!("faults: {e:#}");
        std::process::exit(1);
    }
}

/// `[--release] [--bins DIR] [--list] [SCENARIO...]`: no scenario runs them all. `--bins`
/// runs the provisioner, the fleet simulator and the demo helper found in DIR (a release build
/// made already, such as the packages' static one) and builds none.
fn run(args: &[String]) -> Result<()> {
    let mut release = false;
    let mut prebuilt: Option<std::path::PathBuf> = None;
    let mut only = Vec::new();
    let mut args = args.iter();
    while let Some(a) = args.next() {
        match a.as_str() {
            "--release" => release = true,
            "--bins" => {
                let dir = args.next().context("--bins needs a directory")?;
                prebuilt = Some(dir.into());
            }
            "--list" => {
                for s in scenarios() {
                    println!("{:<22} {}", s.name, s.about);
                }
                return Ok(());
            }
            s if s.starts_with('-') => {
                bail!("unknown faults flag {s:?} (--release, --bins DIR, --list, SCENARIO...)")
            }
            s => only.push(s.to_string()),
        }
    }
    let all = scenarios();
    for o in &only {
        ensure!(
            all.iter().any(|s| s.name == o),
            "unknown scenario {o:?}; see --list"
        );
    }
    let bins = match prebuilt {
        Some(dir) => {
            for b in [
                "choria-provisioner",
                "choria-fleet-sim",
                "choria-demo-helper",
            ] {
                ensure!(
                    dir.join(b).is_file(),
                    "--bins {}: there is no {b} there",
                    dir.display()
                );
            }
            // Built with optimisations: the scenarios' notes say so.
            release = true;
            eprintln!("faults: running the binaries in {}", dir.display());
            std::fs::canonicalize(&dir)?
        }
        None => {
            eprintln!("faults: building the provisioner, the fleet simulator and the demo helper");
            test_support::stack::build_binaries(release)?
        }
    };
    let base = test_support::workspace_root().join("target/faults");
    let chosen: Vec<&Scenario> = all
        .iter()
        .filter(|s| only.is_empty() || only.iter().any(|o| o == s.name))
        .collect();
    // Only the chosen scenarios' directories start empty: a run of other scenarios beside this
    // one keeps its files.
    for s in &chosen {
        let _ = std::fs::remove_dir_all(base.join(s.name));
    }
    std::fs::create_dir_all(&base)?;
    let env = Env {
        bins,
        base,
        release,
    };
    let started = Instant::now();
    let run_one = |s: &Scenario| {
        eprintln!("faults: {} — {}", s.name, s.about);
        let t = Instant::now();
        let res = (s.run)(&env, s.name);
        let took = t.elapsed();
        match &res {
            Ok(note) => eprintln!(
                "faults: {} PASS in {:.1}s: {note}",
                s.name,
                took.as_secs_f64()
            ),
            Err(e) => eprintln!(
                "faults: {} FAIL after {:.1}s: {e:#}\n  files: {}",
                s.name,
                took.as_secs_f64(),
                env.base.join(s.name).display()
            ),
        }
        (s.name, took, res)
    };
    let mut results: Vec<(&str, Duration, Result<String>)> = std::thread::scope(|scope| {
        let long: Vec<_> = chosen
            .iter()
            .filter(|s| s.long)
            .map(|s| scope.spawn(|| run_one(s)))
            .collect();
        // The other scenarios mostly wait (for a discovery interval, a restart, a timeout):
        // they run in FAULT_JOBS lanes side by side (default 4), each lane in turn.
        let lanes = std::env::var("FAULT_JOBS")
            .ok()
            .and_then(|j| j.parse::<usize>().ok())
            .filter(|&j| j > 0)
            .unwrap_or(4);
        let short: Vec<&&Scenario> = chosen.iter().filter(|s| !s.long).collect();
        let lane_handles: Vec<_> = (0..lanes)
            .map(|lane| {
                let mine: Vec<&Scenario> = short
                    .iter()
                    .skip(lane)
                    .step_by(lanes)
                    .map(|s| **s)
                    .collect();
                let run_one = &run_one;
                scope.spawn(move || mine.into_iter().map(run_one).collect::<Vec<_>>())
            })
            .collect();
        // A thread that panicked stands in the results as one failed, unnamed scenario.
        let panicked = |what: &str| ("?", Duration::ZERO, Err(anyhow::anyhow!("{what} panicked")));
        let mut out = Vec::new();
        for h in lane_handles {
            out.extend(h.join().unwrap_or_else(|_| vec![panicked("scenario lane")]));
        }
        for h in long {
            out.push(h.join().unwrap_or_else(|_| panicked("scenario thread")));
        }
        out
    });
    let order = |n: &str| all.iter().position(|s| s.name == n).unwrap_or(usize::MAX);
    results.sort_by_key(|r| order(r.0));
    println!();
    println!("fault suite ({:.0}s)", started.elapsed().as_secs_f64());
    let mut failed = 0;
    for (name, took, res) in &results {
        match res {
            Ok(note) => println!("  PASS {name:<22} {:>6.1}s  {note}", took.as_secs_f64()),
            Err(e) => {
                failed += 1;
                println!("  FAIL {name:<22} {:>6.1}s  {e:#}", took.as_secs_f64());
            }
        }
    }
    if failed > 0 {
        bail!("{failed} of {} fault scenarios failed", results.len());
    }
    Ok(())
}
