//! The sample policies of `docs/examples/policies/`, each run with `policy eval` against its
//! recorded inputs in `inputs/<policy>/`: a file named `allow-...`, `deny-...` or `defer-...`
//! must get that decision. Run by `cargo xtask docs`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use common::policy_eval;

fn policies_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/examples/policies")
}

fn sorted(dir: &Path, ext: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == ext))
        .collect();
    v.sort();
    v
}

#[test]
fn every_sample_policy_gives_the_expected_decision_for_its_recorded_inputs() {
    let dir = tempfile::tempdir().unwrap();
    let policies = sorted(&policies_dir(), "rego");
    assert!(policies.len() >= 4, "{policies:?}");
    for policy in policies {
        let stem = policy.file_stem().unwrap().to_string_lossy().into_owned();
        let yaml = dir.path().join(format!("{stem}.yaml"));
        std::fs::write(
            &yaml,
            format!(
                "helper: /bin/true\ntoken: docs\nrego_policy: {}\n",
                policy.display()
            ),
        )
        .unwrap();
        let cases = sorted(&policies_dir().join("inputs").join(&stem), "json");
        let mut seen = BTreeSet::new();
        for case in &cases {
            let name = case.file_name().unwrap().to_string_lossy().into_owned();
            let expected = name.split('-').next().unwrap();
            assert!(
                ["allow", "deny", "defer"].contains(&expected),
                "{name}: name must start with allow-, deny- or defer-"
            );
            let out = policy_eval(&yaml, case, &[])
                .succeeded(&format!("{stem}/{name}"))
                .stdout;
            assert!(
                out.lines().any(|l| l == format!("decision: {expected}")),
                "{stem}/{name}: expected {expected}, got {out}"
            );
            seen.insert(expected.to_string());
        }
        // Each sample is shown both admitting and refusing (or deferring) a node.
        assert!(
            seen.len() >= 2,
            "{stem}: cases {cases:?} show only {seen:?}"
        );
    }
}
