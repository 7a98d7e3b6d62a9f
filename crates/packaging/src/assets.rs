//! The man pages and shell completions of every package. They do not depend on the
//! architecture, so each `cargo xtask dist` writes them once, with a provisioner binary of the
//! run that this machine can execute (`choria-provisioner generate-assets --out DIR`, a hidden
//! command; under qemu-user when only another architecture's binary was built), and [`stage`]
//! puts them into each package's staged tree: the man pages gzipped (`gzip -9n`, as Debian
//! policy asks; the RPMs are built without rpm's post-install compression), the completion
//! scripts as written.

use std::fs;
use std::path::Path;
use std::process::Command;

use crate::build::{install_file, set_mode};
use crate::error::{bail, Context, Result};
use crate::host::run;

/// Where the man pages are installed, relative to `/`.
pub const MAN_DIR: &str = "usr/share/man/man1";

/// The man pages, one a visible command and sub command, as `generate-assets` names them
/// (clap_mangen's naming: the command's words joined by `-`); each is installed as
/// `MAN_DIR/PAGE.1.gz`. The binary's `man_completions` test holds this list to the commands
/// `--help` shows.
pub const MAN_PAGES: &[&str] = &[
    "choria-provisioner",
    "choria-provisioner-run",
    "choria-provisioner-check",
    "choria-provisioner-policy",
    "choria-provisioner-policy-eval",
    "choria-provisioner-status",
    "choria-provisioner-nodes",
    "choria-provisioner-node",
    "choria-provisioner-pause",
    "choria-provisioner-resume",
    "choria-provisioner-deny",
    "choria-provisioner-deny-add",
    "choria-provisioner-deny-rm",
    "choria-provisioner-deny-ls",
    "choria-provisioner-approve",
    "choria-provisioner-reject",
    "choria-provisioner-rotate",
    "choria-provisioner-rotate-status",
    "choria-provisioner-rotate-pause",
    "choria-provisioner-rotate-resume",
    "choria-provisioner-rotate-abort",
];

/// The completion scripts: where `generate-assets` writes each under its `--out`, and where the
/// packages install it, relative to `/`. zsh's goes to `site-functions`, which zsh's `fpath`
/// holds on Enterprise Linux, Fedora and SUSE (and in zsh's own default build); Debian's and
/// Ubuntu's zsh read `vendor-completions` and `/usr/local/share/zsh/site-functions`, so there
/// it takes `fpath+=(/usr/share/zsh/site-functions)` before `compinit`.
pub const COMPLETIONS: [(&str, &str); 3] = [
    (
        "completions/bash/choria-provisioner",
        "usr/share/bash-completion/completions/choria-provisioner",
    ),
    (
        "completions/zsh/_choria-provisioner",
        "usr/share/zsh/site-functions/_choria-provisioner",
    ),
    (
        "completions/fish/choria-provisioner.fish",
        "usr/share/fish/vendor_completions.d/choria-provisioner.fish",
    ),
];

/// Every file the assets add to a package, relative to `/`.
pub fn packaged() -> Vec<String> {
    MAN_PAGES
        .iter()
        .map(|page| format!("{MAN_DIR}/{page}.1.gz"))
        .chain(COMPLETIONS.iter().map(|(_, dest)| dest.to_string()))
        .collect()
}

/// Runs `binary generate-assets --out out`, through `runner` (qemu-user) when one is given;
/// `out` is emptied first.
pub fn generate(binary: &Path, runner: Option<&Path>, out: &Path) -> Result<()> {
    if out.exists() {
        fs::remove_dir_all(out).with_context(|| format!("cannot clear {}", out.display()))?;
    }
    let mut cmd = match runner {
        Some(runner) => {
            let mut cmd = Command::new(runner);
            cmd.arg(binary);
            cmd
        }
        None => Command::new(binary),
    };
    cmd.arg("generate-assets").arg("--out").arg(out);
    run(&mut cmd).with_context(|| {
        format!(
            "{} could not write the man pages and completions into {}",
            binary.display(),
            out.display()
        )
    })?;
    println!(
        "dist: man pages and completions written into {}",
        out.display()
    );
    Ok(())
}

/// Installs what [`generate`] wrote under `assets` into the staged tree `stage`, mode 0644:
/// each of [`MAN_PAGES`] gzipped into [`MAN_DIR`], each of [`COMPLETIONS`]. A page or script
/// missing from `assets`, or a page there that [`MAN_PAGES`] does not list, fails.
pub fn stage(assets: &Path, stage: &Path) -> Result<()> {
    let man = assets.join("man/man1");
    let mut unlisted = Vec::new();
    for entry in fs::read_dir(&man).with_context(|| format!("cannot read {}", man.display()))? {
        let name = entry?.file_name().to_string_lossy().to_string();
        match name.strip_suffix(".1") {
            Some(page) if MAN_PAGES.contains(&page) => {}
            _ => unlisted.push(name),
        }
    }
    if !unlisted.is_empty() {
        unlisted.sort();
        bail!(
            "{} holds {} that packaging's MAN_PAGES does not list (crates/packaging/src/assets.rs)",
            man.display(),
            unlisted.join(", ")
        );
    }
    let missing: Vec<String> = MAN_PAGES
        .iter()
        .map(|page| format!("man/man1/{page}.1"))
        .chain(COMPLETIONS.iter().map(|(src, _)| src.to_string()))
        .filter(|src| !assets.join(src).is_file())
        .collect();
    if !missing.is_empty() {
        bail!(
            "generate-assets wrote no {} under {}",
            missing.join(", "),
            assets.display()
        );
    }
    for page in MAN_PAGES {
        let dest = stage.join(MAN_DIR).join(format!("{page}.1.gz"));
        gzip(&man.join(format!("{page}.1")), &dest)?;
    }
    for (src, dest) in COMPLETIONS {
        install_file(&assets.join(src), &stage.join(dest), 0o644)?;
    }
    Ok(())
}

/// `gzip -9n` of `src` into `dest` (no name or time stamp inside, so a rebuild makes the same
/// bytes), mode 0644.
fn gzip(src: &Path, dest: &Path) -> Result<()> {
    let o = Command::new("gzip")
        .args(["-9", "-n", "-c"])
        .arg(src)
        .output()
        .context("cannot run gzip")?;
    if !o.status.success() {
        bail!(
            "gzip -9n {} failed: {}",
            src.display(),
            String::from_utf8_lossy(&o.stderr)
        );
    }
    if let Some(dir) = dest.parent() {
        fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    fs::write(dest, o.stdout).with_context(|| format!("cannot write {}", dest.display()))?;
    set_mode(dest, 0o644)
}
