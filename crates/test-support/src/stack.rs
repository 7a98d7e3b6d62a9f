//! A local provisioning run from the workspace's binaries: the binaries built by cargo, the
//! run's signer and CA (made by `choria-demo-helper`), the run's provisioner settings, and the
//! fleet simulator's command. `cargo xtask demo` and `bench` and the fault suite run on it.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::provisioner::Provisioner;
use crate::{Error, IoContext, Mode, Result};

/// Run `cmd`, failing with its name and what it printed (standard error, then standard output)
/// when it exits non-zero; its standard output.
pub fn run(cmd: &mut Command) -> Result<String> {
    let out = cmd.output().ctx(|| format!("cannot start {cmd:?}"))?;
    if !out.status.success() {
        return Err(Error::Failed(format!(
            "{cmd:?} failed ({}): {} {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim(),
            String::from_utf8_lossy(&out.stdout).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Build the provisioner, the fleet simulator and the demo helper (`release` for benchmarks)
/// and return the directory holding them.
pub fn build_binaries(release: bool) -> Result<PathBuf> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    // Run from `cargo run` or `cargo test`, this process has the caller's CARGO_MANIFEST_DIR;
    // build scripts that watch it (ring's) would see it change between this build and a
    // plain `cargo build` and rebuild ring, rustls and everything above them each time.
    cmd.current_dir(crate::workspace_root())
        .env_remove("CARGO_MANIFEST_DIR")
        .args(["build", "--quiet"]);
    if release {
        cmd.arg("--release");
    }
    cmd.args(["-p", "choria-provisioner", "-p", "choria-fleet-sim"])
        .args(["-p", "choria-demo-helper"]);
    let status = cmd.status().ctx(|| format!("cannot start {cmd:?}"))?;
    if !status.success() {
        return Err(Error::Failed(format!("{cmd:?} failed: {status}")));
    }
    let profile = if release { "release" } else { "debug" };
    Ok(crate::workspace_root().join("target").join(profile))
}

/// The release demo helper linked statically and position-dependent (`crt-static`,
/// `relocation-model=static`), for the benchmark's process helper, and its path. A process
/// helper runs once per node, so its start-up is on the hot path: this build has no dynamic
/// loader work (opening libraries, symbol lookup) and no relocations to apply at start (half the
/// page faults of a static-pie build), and starts in about half the time of the dynamically
/// linked one. It is built for the host's target triple into `target/static`, apart from the
/// other binaries, since the flags would otherwise rebuild every crate. With `build` false the
/// existing build is used.
pub fn static_helper(build: bool) -> Result<PathBuf> {
    let root = crate::workspace_root();
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let version = run(Command::new(rustc).arg("-vV"))?;
    let host = version
        .lines()
        .find_map(|l| l.strip_prefix("host: "))
        .map(str::trim)
        .ok_or_else(|| Error::Failed("rustc -vV names no host triple".into()))?
        .to_string();
    let path = root
        .join("target/static")
        .join(&host)
        .join("release/choria-demo-helper");
    if !build {
        return if path.is_file() {
            Ok(path)
        } else {
            Err(Error::Failed(format!(
                "no statically linked helper at {} (run without --no-build once)",
                path.display()
            )))
        };
    }
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(&root)
        .env_remove("CARGO_MANIFEST_DIR")
        .env(
            "RUSTFLAGS",
            "-C target-feature=+crt-static -C relocation-model=static",
        )
        .args(["build", "--quiet", "--release", "-p", "choria-demo-helper"])
        .args(["--target", &host, "--target-dir"])
        .arg(root.join("target/static"));
    let status = cmd.status().ctx(|| format!("cannot start {cmd:?}"))?;
    if !status.success() {
        return Err(Error::Failed(format!("{cmd:?} failed: {status}")));
    }
    Ok(path)
}

/// A new ed25519 signer in `dir` (`signer.seed`, `signer.pub`, made by the demo helper); returns
/// its public key in hex.
pub fn init_signer(bins: &Path, dir: &Path) -> Result<String> {
    crate::mkdir(dir)?;
    let out = run(Command::new(bins.join("choria-demo-helper"))
        .arg("init-signer")
        .arg(dir))?;
    Ok(out.trim().to_string())
}

/// The shared files of one run: the signer and the CA, and the provisioning token.
#[derive(Clone, Debug)]
pub struct RunFiles {
    /// The ed25519 seed signing provisioning JWTs (and server JWTs in ed25519 mode).
    pub signer_seed: PathBuf,
    /// Its public key, hex.
    pub signer_pub: String,
    /// The CA certificate the demo helper signs CSRs with.
    pub ca_cert: PathBuf,
    /// Its key.
    pub ca_key: PathBuf,
    /// The provisioning token.
    pub token: String,
}

/// Write the signer and the CA of a run into `dir` (both made by the demo helper in `bins`).
pub fn write_run_files(dir: &Path, bins: &Path) -> Result<RunFiles> {
    crate::mkdir(dir)?;
    let signer_pub = init_signer(bins, dir)?;
    run(Command::new(bins.join("choria-demo-helper"))
        .arg("init-ca")
        .arg(dir)
        .stdout(Stdio::null()))?;
    Ok(RunFiles {
        signer_seed: dir.join("signer.seed"),
        signer_pub,
        ca_cert: dir.join("ca.pem"),
        ca_key: dir.join("ca-key.pem"),
        token: "s3cret-demo-token".into(),
    })
}

impl RunFiles {
    /// The run's provisioner, `provisioner`, on `broker` with `helper` in `mode`: the run's
    /// token and signer (which also signs server JWTs in ed25519 mode), `info` logs in
    /// `<dir>/provisioner.log`, site `local`, privileged certificate names denied, started with
    /// `run` and the demo helper's environment, and given 3 s to drain on SIGTERM when dropped.
    /// Another provisioner of the run is [`Provisioner::for_identity`] of this one.
    pub fn provisioner(&self, dir: &Path, broker: &str, helper: &str, mode: Mode) -> Provisioner {
        let mut p = Provisioner::new("provisioner", broker, helper, &self.token, &self.signer_pub)
            .features(mode.features())
            .yaml("cert_deny_list:\n  - \"\\\\.privileged\\\\.choria$\"\n");
        p.logfile = Some(dir.join("provisioner.log"));
        p.loglevel = "info".into();
        p.site = "local".into();
        if mode == Mode::Ed25519 {
            p.jwt_signing_key = Some(self.signer_seed.clone());
        }
        p.args = vec!["run".into()];
        p.env = self.helper_env(broker);
        p.grace = Duration::from_secs(3);
        p
    }

    /// The fleet simulator's command for this run: broker, size, mode, token, identity prefix,
    /// the provisioning-JWT signer and, in ed25519 mode, the issuer key server JWTs are checked
    /// against; its progress goes to `log`. Callers add the run's own switches.
    pub fn fleet_sim(
        &self,
        bins: &Path,
        url: &str,
        nodes: usize,
        mode: Mode,
        prefix: &str,
        log: &Path,
    ) -> Result<Command> {
        let log = std::fs::File::create(log).ctx(|| format!("creating {}", log.display()))?;
        let mut cmd = Command::new(bins.join("choria-fleet-sim"));
        cmd.args(["--broker", url, "--nodes", &nodes.to_string()])
            .args(["--mode", mode.name()])
            .args(["--token", &self.token, "--identity-prefix", prefix])
            .arg("--provisioning-signer")
            .arg(&self.signer_seed)
            .stdout(Stdio::null())
            .stderr(log);
        if mode == Mode::Ed25519 {
            cmd.args(["--issuer-public", &self.signer_pub]);
        }
        Ok(cmd)
    }

    /// The environment the demo helper reads (brokers, CA, issuer), set on the provisioner so
    /// its helper inherits it.
    pub fn helper_env(&self, broker: &str) -> Vec<(String, String)> {
        [
            ("CHORIA_BROKERS", broker.to_string()),
            ("CHORIA_CA_CERT", self.ca_cert.display().to_string()),
            ("CHORIA_CA_KEY", self.ca_key.display().to_string()),
            ("CHORIA_ISSUER", self.signer_pub.clone()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }
}

/// The last `fleet-sim:` summary line of a simulator log.
pub fn sim_summary(log: &Path) -> Option<String> {
    std::fs::read_to_string(log)
        .ok()?
        .lines()
        .rev()
        .find(|l| l.starts_with("fleet-sim:"))
        .map(str::to_string)
}
