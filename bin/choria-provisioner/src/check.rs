//! `choria-provisioner check`: validate everything a rollout depends on, without connecting, and
//! say what the daemon would do. Every problem is listed, not just the first. The judge is the
//! daemon's own ([`provisioner::preflight`]): a setup `check` passes starts, and one it fails
//! does not.

use anyhow::{bail, Result};
use provisioner::preflight::Report;
use provisioner::VERSION;

use crate::cli::{check_paths, CheckArgs};

/// Run the checks, print the plan and the findings, fail when there is any problem.
pub fn main(debug: bool, args: CheckArgs) -> Result<()> {
    let mut report = Report::examine(&check_paths(&args.files, debug));
    if args.probe {
        report.probe();
    }
    match crate::cli::COMMIT {
        Some(c) => print!(
            "choria-provisioner {VERSION} (commit {c})\n{}",
            report.plan()
        ),
        None => print!("choria-provisioner {VERSION}\n{}", report.plan()),
    }
    for w in report.warnings() {
        println!("warning: {w}");
    }
    let mut fatal = 0usize;
    for text in report.fatal() {
        println!("problem: {text}");
        fatal += 1;
    }
    if fatal == 0 {
        println!("ok: the configuration is usable");
        Ok(())
    } else {
        bail!("{fatal} problem(s) found")
    }
}
