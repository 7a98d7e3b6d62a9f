//! A packaged binary of another architecture provisions a simulated fleet under qemu-user
//! (Debian's `qemu-user-static`): the emulated `choria-provisioner` against the host's
//! nats-server, fleet simulator and demo helper. The helper is the demo helper's webhook, so each
//! node's request is signed with HMAC-SHA256 by `ring`'s assembly for the emulated architecture,
//! and the nodes are enrolled in ed25519 mode, so the emulated binary signs their server JWTs.
//!
//! qemu is started explicitly rather than through binfmt_misc, which containers and CI machines
//! often lack.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use test_support::stack::write_run_files;
use test_support::webhook::WebhookPlan;
use test_support::{Mode, NatsServer};

use crate::error::{bail, Context, Result};
use crate::fleet::SimFleet;
use crate::host::{apt_install, capture, section, which};
use crate::targets::Arch;
use crate::{root, target_dir};

/// How many simulated servers are provisioned: enough to run every worker a few times.
const NODES: usize = 8;

/// qemu-user for `arch`, installed from Debian's qemu-user-static when missing.
pub(crate) fn qemu(arch: Arch) -> Result<PathBuf> {
    let names = [
        format!("qemu-{}-static", arch.name()),
        format!("qemu-{}", arch.name()),
    ];
    let find = || names.iter().find_map(|n| which(n).ok());
    if let Some(q) = find() {
        return Ok(q);
    }
    println!("dist: qemu-user not found, installing Debian's qemu-user-static");
    apt_install(&["qemu-user-static"], true);
    find().with_context(|| {
        format!(
            "{} not found and could not be installed: apt-get install qemu-user-static",
            names[0]
        )
    })
}

/// Runs `binary` (for `arch`) under qemu-user: `--version`, then provisioning [`NODES`]
/// simulated servers; `bins` holds the host's fleet simulator and demo helper.
pub fn provision_fleet(binary: &Path, arch: Arch, bins: &Path) -> Result<()> {
    let qemu = qemu(arch)?;
    let version = capture(Command::new(&qemu).arg(binary).arg("--version"))?;
    if !version.starts_with("choria-provisioner ") {
        bail!("under {}, --version prints {version:?}", qemu.display());
    }
    println!(
        "ok: under {}, the {} binary prints {}",
        qemu.display(),
        arch.name(),
        version.trim()
    );
    let dir = target_dir(&root()).join(format!("dist/qemu-{}", arch.name()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let result = fleet(&qemu, binary, arch, bins, &dir);
    if result.is_err() {
        for f in ["provisioner.out", "provisioner.log", "fleet-sim.log"] {
            section(
                &format!("{f} (end)"),
                &test_support::logs::tail(&dir.join(f), 30),
            );
        }
    }
    result
}

fn fleet(qemu: &Path, binary: &Path, arch: Arch, bins: &Path, dir: &Path) -> Result<()> {
    let nats = NatsServer::start_in_free_port(dir, "", true)?;
    let url = nats.url();
    let files = write_run_files(dir, bins)?;
    let plan = WebhookPlan::new(dir)?;
    let _webhook = plan.start(bins, &files, &url, &dir.join("webhook.log"))?;
    let mut settings = files
        .provisioner(dir, &url, &plan.url, Mode::Ed25519)
        .yaml(&plan.extra_yaml());
    settings.workers = 4;
    let mut launch = settings.prepare(binary, dir)?;
    // qemu runs the binary; the generated arguments follow as they would.
    launch.args.insert(0, binary.display().to_string());
    launch.program = qemu.to_path_buf();
    let started = Instant::now();
    let mut prov = launch.spawn()?;
    prov.wait_ready(Duration::from_secs(60))?;
    println!(
        "dist: the {} provisioner under qemu listens for startup events after {:.1}s",
        arch.name(),
        started.elapsed().as_secs_f64()
    );

    let mut sim = SimFleet::start(
        &files,
        bins,
        &url,
        (NODES, Mode::Ed25519, "qemu-node"),
        &dir.join("fleet-sim.log"),
        Duration::from_secs(180),
    )?;
    let status = sim.wait("under qemu", || prov.exited().is_some())?;
    let metrics = prov.metrics();
    prov.ensure_no_panic()?;
    prov.stop_cleanly(Duration::from_secs(15))?;
    sim.check(status, &metrics, "under qemu")?;
    println!(
        "ok: under {}, the {} binary provisioned {NODES} simulated servers ({}, webhook helper) \
         in {:.1}s and stopped cleanly",
        qemu.display(),
        arch.name(),
        Mode::Ed25519.name(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
