//! Go test peers: a go-choria build (broker, server, CLI) and the Go provisioner, built once and
//! cached under `target/peers/`, and the commands that run test-support's go-choria environment
//! by hand.
//!
//! `cargo xtask peers [build]` builds both binaries into `target/peers/bin/` and skips a build
//! when the binary exists and its stamp (a hash of the pinned inputs) has not changed.
//! `cargo xtask peers env --dir DIR [--servers N] [--mode plain|pki|ed25519] [--no-wait]` starts a
//! broker and N provisioning-mode servers and leaves them running; `cargo xtask peers stop --dir
//! DIR` stops them.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use test_support::go_env::{self, EnvOptions, GoEnv};
use test_support::Mode;

use crate::tools::{root, run, which};

/// The go-choria release the Choria peer is built from (also pinned in
/// `xtask/peers/choria/go.mod`; the stamp covers that file).
pub const GO_CHORIA_VERSION: &str = "v0.30.2";

/// The appbuilder release the Choria peer builds against, patched (see `prepare_appbuilder`).
const APPBUILDER_VERSION: &str = "v0.19.0";

/// The Go provisioner release installed as `choria-provisioner`.
pub const PROVISIONER_VERSION: &str = "v0.16.0";

/// `target/peers/bin`, where the peers are installed.
pub fn bin_dir() -> PathBuf {
    root().join("target/peers/bin")
}

/// The Choria peer binary (broker, server and CLI in one).
pub fn choria_bin() -> PathBuf {
    go_env::choria_bin()
}

/// The Go provisioner binary.
pub fn provisioner_bin() -> PathBuf {
    bin_dir().join("choria-provisioner")
}

/// `cargo xtask peers ...`
#[derive(clap::Subcommand, Debug)]
pub enum Cmd {
    /// Build the Choria peer and the Go provisioner (the default).
    Build,
    /// Start a go-choria broker and provisioning-mode servers in DIR and leave them running.
    Env {
        /// Directory for every file and log.
        #[arg(long)]
        dir: PathBuf,
        /// How many servers.
        #[arg(long, default_value_t = 3)]
        servers: usize,
        /// plain, pki or ed25519.
        #[arg(long, default_value = "plain")]
        mode: Mode,
        /// Do not wait for the servers to answer.
        #[arg(long)]
        no_wait: bool,
    },
    /// Provision DIR's servers with the real CLI and the sample helper.
    Selftest {
        /// The environment's directory.
        #[arg(long)]
        dir: PathBuf,
    },
    /// Stop everything `env` started in DIR.
    Stop {
        /// The environment's directory.
        #[arg(long)]
        dir: PathBuf,
    },
}

/// Run a `peers` command.
pub fn main(cmd: Cmd) -> Result<()> {
    match cmd {
        Cmd::Build => build(),
        Cmd::Env {
            dir,
            servers,
            mode,
            no_wait,
        } => {
            build_choria()?;
            let opts = EnvOptions {
                dir,
                servers,
                mode,
                wait: !no_wait,
                default_provisioning: false,
            };
            let env = GoEnv::start(&choria_bin(), &opts)?;
            print!("{}", env.describe());
            env.detach();
            Ok(())
        }
        Cmd::Selftest { dir } => Ok(go_env::selftest(&dir)?),
        Cmd::Stop { dir } => Ok(go_env::stop(&dir)?),
    }
}

/// Build every peer. A Go provisioner the module proxy will not serve is reported, not fatal, so
/// the Choria peer stays usable.
fn build() -> Result<()> {
    build_choria()?;
    if let Err(err) = build_provisioner() {
        eprintln!("xtask: warning: the Go provisioner is not available: {err:#}");
    }
    Ok(())
}

/// FNV-1a over the inputs that decide a build, so an edited go.mod or main.go rebuilds.
fn stamp_of(parts: &[&[u8]]) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for byte in part.iter().chain(b"\0") {
            hash ^= u64::from(*byte);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
    }
    format!("{hash:016x}")
}

fn up_to_date(bin: &Path, stamp: &str) -> bool {
    let stamp_file = bin.with_extension("stamp");
    bin.is_file() && std::fs::read_to_string(stamp_file).is_ok_and(|s| s.trim() == stamp)
}

fn go() -> Result<Command> {
    which("go").context("the peers need Go 1.25 or newer on PATH")?;
    let mut cmd = Command::new("go");
    cmd.env("GOFLAGS", "-mod=mod");
    Ok(cmd)
}

/// Build the Choria peer from `xtask/peers/choria` unless it is up to date.
pub fn build_choria() -> Result<()> {
    let src = root().join("xtask/peers/choria");
    let mut inputs = Vec::new();
    for name in [
        "choria/go.mod",
        "choria/go.sum",
        "choria/main.go",
        "appbuilder-compat/parse_state_template.go",
    ] {
        let path = src.join("..").join(name);
        inputs.push(std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?);
    }
    let parts: Vec<&[u8]> = inputs.iter().map(Vec::as_slice).collect();
    let stamp = stamp_of(&parts);
    let bin = choria_bin();
    if up_to_date(&bin, &stamp) {
        return Ok(());
    }
    std::fs::create_dir_all(bin_dir())?;
    eprintln!(
        "xtask: building the Choria peer (go-choria {GO_CHORIA_VERSION}); this takes minutes"
    );
    let started = Instant::now();
    prepare_appbuilder()?;
    let tmp = bin.with_extension("tmp");
    run(go()?
        .current_dir(&src)
        .args(["build", "-trimpath", "-ldflags"])
        // go-choria's tag leaves build.Version at the release before it; servers report it in
        // their inventory, which the provisioner's upgrade logic compares.
        .arg(format!(
            "-X github.com/choria-io/go-choria/build.Version={}",
            GO_CHORIA_VERSION.trim_start_matches('v')
        ))
        .arg("-o")
        .arg(&tmp)
        .arg("."))?;
    std::fs::rename(&tmp, &bin)?;
    std::fs::write(bin.with_extension("stamp"), &stamp)?;
    eprintln!(
        "xtask: built {} in {:.0?}",
        bin.display(),
        started.elapsed()
    );
    Ok(())
}

/// go-choria v0.30.2 needs appbuilder v0.17.1, which the module proxy does not serve; v0.19.0 is
/// served but lacks `builder.ParseStateTemplate`. Copy v0.19.0 from the module cache to
/// `target/peers/appbuilder` (where `xtask/peers/choria/go.mod` replaces appbuilder) and add that
/// function from `xtask/peers/appbuilder-compat/`.
fn prepare_appbuilder() -> Result<()> {
    let out = go()?
        .current_dir(root().join("xtask/peers/choria"))
        .args(["mod", "download", "-json"])
        .arg(format!(
            "github.com/choria-io/appbuilder@{APPBUILDER_VERSION}"
        ))
        .output()
        .context("running go mod download")?;
    let text = String::from_utf8_lossy(&out.stdout);
    let Some(dir) = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("\"Dir\": \""))
        .and_then(|rest| rest.strip_suffix("\","))
    else {
        bail!("go mod download of appbuilder {APPBUILDER_VERSION} failed: {text}");
    };
    let copy = root().join("target/peers/appbuilder");
    if copy.exists() {
        std::fs::remove_dir_all(&copy)?;
    }
    run(Command::new("cp").arg("-r").arg(dir).arg(&copy))?;
    run(Command::new("chmod").arg("-R").arg("u+w").arg(&copy))?;
    std::fs::copy(
        root().join("xtask/peers/appbuilder-compat/parse_state_template.go"),
        copy.join("builder/zz_parse_state_template.go"),
    )?;
    Ok(())
}

/// Install the Go provisioner unless it is up to date.
pub fn build_provisioner() -> Result<()> {
    let stamp = stamp_of(&[PROVISIONER_VERSION.as_bytes()]);
    let bin = provisioner_bin();
    if up_to_date(&bin, &stamp) {
        return Ok(());
    }
    let gobin = root().join("target/peers/gobin");
    std::fs::create_dir_all(&gobin)?;
    std::fs::create_dir_all(bin_dir())?;
    eprintln!("xtask: installing the Go provisioner {PROVISIONER_VERSION}");
    let started = Instant::now();
    run(go()?
        .current_dir(root().join("target/peers"))
        .arg("install")
        .arg(format!(
            "github.com/choria-io/provisioner@{PROVISIONER_VERSION}"
        ))
        .env("GOBIN", &gobin))?;
    std::fs::rename(gobin.join("provisioner"), &bin)?;
    std::fs::write(bin.with_extension("stamp"), &stamp)?;
    eprintln!(
        "xtask: installed {} in {:.0?}",
        bin.display(),
        started.elapsed()
    );
    Ok(())
}
