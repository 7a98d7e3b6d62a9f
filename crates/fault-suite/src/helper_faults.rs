//! Helper faults: a script that misbehaves (hangs, exits non-zero, prints nothing, garbage or
//! 100 MiB, asks for an unparsable upgrade) until a `fixed` file appears, then runs the demo
//! helper. The scripts are in `crates/fault-suite/helpers/`.

use std::path::{Path, PathBuf};

use anyhow::{ensure, Context, Result};
use test_support::metrics::{metric_sum, scrape as scrape_all};

use crate::harness::{setup, Env, Run, Setup};

pub fn helper_script(env: &Env, name: &str, body: &str) -> Result<(PathBuf, PathBuf)> {
    let dir = env.base.join(name);
    std::fs::create_dir_all(&dir)?;
    let fixed = dir.join("fixed");
    let script = dir.join("helper.sh");
    let demo = env.bins.join("choria-demo-helper").display().to_string();
    let body = body
        .replace("@DEMO@", &demo)
        .replace("@DIR@", &dir.display().to_string());
    let text = format!(
        "#!/bin/sh\n# Misbehaves until {fixed} exists, then behaves.\nif [ -e '{fixed}' ]; then exec '{demo}' \"$@\"; fi\n{body}\n",
        fixed = fixed.display(),
    );
    test_support::write_executable(&script, &text)?;
    Ok((script, fixed))
}

/// A misbehaviour shipped in `crates/fault-suite/helpers/` (`@DEMO@` is the working helper, `@DIR@`
/// the scenario's directory).
pub fn shipped(name: &str) -> Result<String> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("helpers")
        .join(name);
    std::fs::read_to_string(&p).with_context(|| format!("cannot read {}", p.display()))
}

pub fn helper_fault(
    env: &Env,
    name: &str,
    script: &str,
    settings: Setup<'_>,
    sim_flags: &[String],
    words: &[&str],
    after: impl FnOnce(&Run) -> Result<String>,
) -> Result<String> {
    let body = shipped(script)?;
    let (helper, fixed) = helper_script(env, name, &body)?;
    let helper_s = helper.display().to_string();
    let mut run = setup(
        env,
        name,
        Setup {
            helper: Some(&helper_s),
            ..settings
        },
    )?;
    let p = run.start_provisioner("provisioner")?;
    let nodes = 6;
    let sim = run.start_sim("fault", "n", nodes, sim_flags)?;
    let t1 = run.wait_all_failed(p, "every node to fail in the helper", nodes)?;
    let metrics = scrape_all(run.provisioners[p].port);
    let report = sim.finish()?;
    let never = ["configure", "restart"];
    run.ensure_all_refused(p, &report, &never, words, "the helper failed")?;
    let helper_errors = metric_sum(&metrics, "choria_provisioner_helper_errors");
    let extra = after(&run)?;
    std::fs::write(&fixed, "")?;
    let t2 = run.provision_clear_fleet(p, nodes, sim_flags, "once the helper works")?;
    run.stop_all()?;
    Ok(format!(
        "{nodes} nodes failed in {:.1}s, none configured, helper_errors={helper_errors}{extra}; provisioned {:.1}s after the helper was fixed",
        t1.as_secs_f64(),
        t2.as_secs_f64()
    ))
}

pub fn helper_hang(env: &Env, name: &str) -> Result<String> {
    let pids = env.base.join(name).join("children");
    std::fs::create_dir_all(&pids)?;
    helper_fault(
        env,
        name,
        "hang.sh",
        Setup::default(),
        &[],
        &["did not finish", "timeout", "killed"],
        |_| {
            // Every child the helper left behind must be gone with it.
            let mut seen = 0;
            for e in std::fs::read_dir(&pids)? {
                let pid = e?.file_name().to_string_lossy().to_string();
                seen += 1;
                let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
                let state = stat
                    .rsplit_once(')')
                    .and_then(|(_, r)| r.split_whitespace().next())
                    .unwrap_or("");
                ensure!(
                    stat.is_empty() || state == "Z",
                    "the helper's child {pid} is still running ({state})"
                );
            }
            ensure!(seen > 0, "the hanging helper recorded no child");
            Ok(format!(", {seen} orphaned children all killed"))
        },
    )
}

/// [`helper_fault`] with the default setup, no simulator flags and nothing more to check.
fn plain_helper_fault(env: &Env, name: &str, script: &str, words: &[&str]) -> Result<String> {
    helper_fault(env, name, script, Setup::default(), &[], words, |_| {
        Ok(String::new())
    })
}

pub fn helper_exit(env: &Env, name: &str) -> Result<String> {
    plain_helper_fault(env, name, "exit1.sh", &["exit", "status", "helper"])
}

pub fn helper_silent(env: &Env, name: &str) -> Result<String> {
    plain_helper_fault(env, name, "silent.sh", &["helper", "empty", "eof", "json"])
}

pub fn helper_garbage(env: &Env, name: &str) -> Result<String> {
    plain_helper_fault(env, name, "garbage.sh", &["json", "helper", "invalid"])
}

pub fn helper_flood(env: &Env, name: &str) -> Result<String> {
    helper_fault(
        env,
        name,
        "flood.sh",
        Setup::default(),
        &[],
        &["more than", "output", "bytes"],
        |run| {
            // The provisioner must not have buffered the flood.
            let pid = run.provisioners[0].proc.pid();
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
            let hwm = status
                .lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|k| k.parse::<u64>().ok())
                .unwrap_or(0);
            ensure!(
                hwm < 100 * 1024,
                "provisioner peak RSS {hwm} KiB after the flood"
            );
            Ok(format!(", provisioner peak RSS {} MiB", hwm / 1024))
        },
    )
}

pub fn helper_bad_upgrade(env: &Env, name: &str) -> Result<String> {
    helper_fault(
        env,
        name,
        "bad-upgrade.sh",
        Setup {
            extra_yaml: "upgrades_repository: https://packages.example.net/choria\n",
            features: &["upgrades"],
            ..Setup::default()
        },
        &["--upgradable".into()],
        &["upgrade", "version"],
        |_| Ok(String::new()),
    )
}
