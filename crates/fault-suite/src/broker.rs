//! Infrastructure lost mid-run: the broker restarted, the provisioner killed with SIGKILL.

use std::time::Duration;

use anyhow::{ensure, Result};
use test_support::Mode;

use crate::harness::{ensure_all_provisioned, setup, Env, Setup};

pub fn broker_restart(env: &Env, name: &str) -> Result<String> {
    let mut run = setup(env, name, Setup::default())?;
    let p = run.start_provisioner("provisioner")?;
    let nodes = 40;
    // Slow nodes keep the run going long enough to pull the broker away mid-run.
    let (sim, before) = run.start_slow_fleet(p, "run", nodes)?;
    run.nats.terminate(Duration::from_secs(5));
    std::thread::sleep(Duration::from_secs(3));
    run.alive(p)?;
    let during = run.metric(p, "choria_provisioner_provisioned");
    run.nats.start_again()?;
    let t = run.wait_fleet(
        p,
        &sim,
        "the fleet to finish after the broker came back",
        nodes,
        Duration::from_secs(150),
    )?;
    let counted = run.metric(p, "choria_provisioner_provisioned");
    ensure!(
        counted > during,
        "the provisioner provisioned nothing after the broker came back ({counted})"
    );
    ensure_all_provisioned(&sim.finish()?)?;
    let log = run.log(p);
    ensure!(
        log.contains("(re)established") || log.to_lowercase().contains("reconnect"),
        "the log does not record the reconnection"
    );
    run.stop_all()?;
    Ok(format!(
        "{before} provisioned before the restart; all {nodes} done {:.1}s after it, {counted} counted by the provisioner (a node restarted while its reply was lost is provisioned but ends as a restart timeout; nodes interrupted mid-cycle come back through the next discovery, at most one 60 s interval)",
        t.as_secs_f64()
    ))
}

pub fn provisioner_sigkill(env: &Env, name: &str) -> Result<String> {
    let mut run = setup(env, name, Setup::in_mode(Mode::Ed25519))?;
    let p = run.start_provisioner("provisioner")?;
    let nodes = 40;
    let (sim, before) = run.start_slow_fleet(p, "run", nodes)?;
    // SIGKILL, then the same provisioner again on its files and port, which are free once it
    // is gone.
    run.restart(p)?;
    let t = run.wait_fleet(
        p,
        &sim,
        "the fleet to finish after the restart",
        nodes,
        Duration::from_secs(120),
    )?;
    let counted = run.metric(p, "choria_provisioner_provisioned");
    ensure!(
        counted > 0.0,
        "the restarted provisioner provisioned nothing"
    );
    let report = sim.finish()?;
    let mut twice = 0;
    for (id, n) in &report {
        ensure!(
            n.provisioned,
            "{id} not provisioned (a usable, consistent configuration): {:?} {:?}",
            n.actions,
            n.problems
        );
        if n.ok_count("configure") > 1 {
            twice += 1;
        }
    }
    run.stop_all()?;
    Ok(format!(
        "{before} provisioned before SIGKILL; the restarted provisioner finished the fleet in {:.1}s, {counted} nodes counted by it; {twice} nodes configured twice, each ending with credentials matching its key",
        t.as_secs_f64()
    ))
}
