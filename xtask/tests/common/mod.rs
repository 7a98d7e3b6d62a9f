//! What the tidy tests share: the workspace root and its `cargo metadata`.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The workspace root (the folder above xtask/).
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default()
}

/// What `cargo ARGS` prints, run in the workspace root; the test fails when cargo does.
pub fn cargo(args: &[&str]) -> Vec<u8> {
    let out = Command::new(env!("CARGO"))
        .args(args)
        .current_dir(root())
        .output()
        .expect("cargo runs");
    assert!(
        out.status.success(),
        "cargo {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// The workspace's packages as `cargo metadata --no-deps` describes them.
pub fn metadata() -> serde_json::Value {
    let out = cargo(&["metadata", "--format-version", "1", "--no-deps"]);
    serde_json::from_slice(&out).expect("metadata is JSON")
}
