//! What the packaged unit must hold to: a service user that is not root, and a
//! `systemd-analyze security` exposure of at most 1.0. `cargo xtask dist --verify` checks the
//! staged unit with it and the test `unit_security` of this crate the one in packaging/, so a
//! change that loosens the sandbox fails before any package is built.

use std::path::Path;
use std::process::Command;

use crate::error::{Error, Result};
use crate::host::combined;

/// The highest exposure allowed, in tenths as `systemd-analyze security` prints it (1.0).
pub const MAX_EXPOSURE_TENTHS: u32 = 10;

/// The directives of a unit's `[Service]` section, in order (a key may repeat; an empty value
/// resets the key, as systemd reads it).
pub fn service_directives(text: &str) -> Vec<(String, String)> {
    let mut in_service = false;
    let mut out = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') {
            in_service = line == "[Service]";
            continue;
        }
        if !in_service || line.starts_with('#') || line.starts_with(';') || line.is_empty() {
            continue;
        }
        if let Some((k, v)) = line.split_once('=') {
            out.push((k.trim().to_string(), v.trim().to_string()));
        }
    }
    out
}

/// The last value of `key` among `directives`, empty when it is not set.
pub fn last<'a>(directives: &'a [(String, String)], key: &str) -> &'a str {
    directives
        .iter()
        .rev()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
        .unwrap_or("")
}

/// The user the unit runs its service as, refusing root: `User=` unset, `root` or `0` without
/// `DynamicUser=yes` is an error naming what to do instead.
pub fn service_user(text: &str) -> Result<String> {
    let d = service_directives(text);
    let user = last(&d, "User");
    let dynamic = matches!(last(&d, "DynamicUser"), "yes" | "true" | "1" | "on");
    if dynamic || !matches!(user, "" | "root" | "0") {
        return Ok(if user.is_empty() {
            "(dynamic)".to_string()
        } else {
            user.to_string()
        });
    }
    Err(Error::Failed(format!(
        "the unit runs its service as root (User={user:?}): it must name the packages' service \
         account (User=choria-provisioner) or DynamicUser=yes; sites that need root use the \
         run-as-root drop-in"
    )))
}

/// `systemd-analyze security --offline=true UNIT`: the overall exposure in tenths and the whole
/// report; the inner error says why this systemd-analyze cannot judge a unit file offline (older
/// than systemd 250). Drop-ins in `UNIT.d/` beside the file count, as systemd reads them.
pub fn exposure(analyze: &Path, unit: &Path) -> Result<Result<(u32, String), String>> {
    let o = Command::new(analyze)
        .args(["security", "--offline=true"])
        .arg(unit)
        .output()
        .map_err(|e| Error::Failed(format!("cannot run {}: {e}", analyze.display())))?;
    let text = combined(&o);
    if text.contains("unrecognized option") || text.contains("Unknown option") {
        return Ok(Err(format!(
            "{} has no --offline (systemd 250 or newer needed)",
            analyze.display()
        )));
    }
    match overall_tenths(&text) {
        Some(t) => Ok(Ok((t, text))),
        None => Err(Error::Failed(format!(
            "systemd-analyze security printed no overall exposure level for {}:\n{text}",
            unit.display()
        ))),
    }
}

/// The overall exposure in tenths from a `systemd-analyze security` report: the number in
/// "Overall exposure level for X: 1.0 OK".
pub fn overall_tenths(report: &str) -> Option<u32> {
    let line = report
        .lines()
        .find(|l| l.contains("Overall exposure level for"))?;
    let value = line.rsplit(": ").next()?.split_whitespace().next()?;
    let (whole, tenth) = value.split_once('.')?;
    Some(whole.parse::<u32>().ok()? * 10 + tenth.parse::<u32>().ok()?)
}

/// Exposure in tenths as systemd-analyze prints it.
pub fn format_tenths(t: u32) -> String {
    format!("{}.{}", t / 10, t % 10)
}
