//! provision-core does no I/O: the tokio it compiles has no networking, processes, signals or
//! files. Features add up across a workspace, so this asks cargo for the crate's own feature
//! tree (`cargo tree -p provision-core -e features`) and fails on any of them.

use std::collections::BTreeSet;
use std::process::Command;

/// The features of tokio in provision-core's dependency tree.
fn tokio_features() -> BTreeSet<String> {
    let out = Command::new(env!("CARGO"))
        .args([
            "tree",
            "--offline",
            "-p",
            "provision-core",
            "-e",
            "features",
            "--prefix",
            "none",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo runs");
    assert!(
        out.status.success(),
        "cargo tree failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let features: BTreeSet<String> = text
        .lines()
        .filter_map(|l| l.trim().strip_prefix("tokio feature \""))
        .filter_map(|l| l.split('"').next())
        .map(str::to_string)
        .collect();
    assert!(
        features.contains("rt"),
        "tokio's features were not found in the tree:\n{text}"
    );
    features
}

fn assert_absent(forbidden: &[&str]) {
    let features = tokio_features();
    let found: Vec<&str> = forbidden
        .iter()
        .copied()
        .filter(|f| features.contains(*f))
        .collect();
    assert!(
        found.is_empty(),
        "provision-core compiles tokio with {found:?} (all: {features:?}); declare tokio features \
         per crate, never in [workspace.dependencies]"
    );
}

#[test]
fn tokio_has_no_networking_signals_or_files() {
    assert_absent(&["net", "signal", "fs"]);
}

#[test]
fn tokio_has_no_processes() {
    assert_absent(&["process"]);
}
