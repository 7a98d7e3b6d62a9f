//! Every provisioner configuration shown in the documentation (each ```yaml block under `docs/`)
//! and the packaged default configuration load through the provisioner's own configuration
//! loader without errors and without unknown-key warnings.

#![allow(clippy::unwrap_used)]

use test_support::workspace_root as root;

use provisioner::config::{Config, ConfigWarning};

/// The ```yaml blocks of a Markdown text, with the line each starts on.
fn yaml_blocks(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut current: Option<(usize, String)> = None;
    for (n, line) in text.lines().enumerate() {
        let t = line.trim_start();
        if let Some((start, body)) = current.take() {
            if t.starts_with("```") {
                out.push((start, body));
            } else {
                current = Some((start, body + line + "\n"));
            }
        } else if t == "```yaml" {
            current = Some((n + 2, String::new()));
        }
    }
    out
}

fn assert_loads(text: &str, origin: &str) {
    let loaded = Config::from_yaml(text, origin)
        .unwrap_or_else(|e| panic!("{origin}: the configuration loader refuses it: {e}"));
    let unknown: Vec<_> = loaded
        .warnings
        .iter()
        .filter(|w| matches!(w, ConfigWarning::UnknownKey(_)))
        .collect();
    assert!(unknown.is_empty(), "{origin}: unknown keys: {unknown:?}");
}

#[test]
fn every_yaml_example_in_the_docs_loads() {
    let docs = root().join("docs");
    let mut seen = 0;
    for entry in std::fs::read_dir(&docs).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "md") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        for (line, block) in yaml_blocks(&text) {
            let origin = format!("{}:{line}", path.display());
            assert_loads(&block, &origin);
            seen += 1;
        }
    }
    // The configuration reference, the enrollment modes and the HA page all show configurations:
    // an extraction that finds few blocks is broken, not passing.
    assert!(seen >= 5, "only {seen} yaml blocks found under docs/");
}

#[test]
fn the_packaged_default_configuration_loads() {
    let path = root().join("packaging/choria-provisioner.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    assert_loads(&text, &path.display().to_string());
    let loaded = Config::from_yaml(&text, &path).unwrap();
    assert!(loaded.warnings.is_empty(), "{:?}", loaded.warnings);
    assert!(loaded.config.provision.features().jwt);
    assert_eq!(
        loaded.config.logfile,
        "/var/log/choria-provisioner/choria-provisioner.log"
    );
}

#[test]
fn a_wrong_example_would_be_caught() {
    // The check above must be able to fail: an interval under a minute and a misspelt key.
    assert!(Config::from_yaml("interval: 10s\n", "bad").is_err());
    let loaded = Config::from_yaml("intervall: 5m\n", "typo").unwrap();
    assert!(loaded
        .warnings
        .iter()
        .any(|w| matches!(w, ConfigWarning::UnknownKey(k) if k == "intervall")));
}
