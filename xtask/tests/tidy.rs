//! The code map stays true: ARCHITECTURE.md's table of crates, their folders and the workspace
//! crates each may use is compared with what `cargo metadata` says. A dependency edge the map
//! does not name, an edge the map names that does not exist, a crate missing from the map or a
//! folder not named after its package fails the test, which prints the table as it should read.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

mod common;
use common::{cargo, metadata, root};

#[derive(Debug, Default, PartialEq, Eq)]
struct Row {
    folder: String,
    normal: BTreeSet<String>,
    dev: BTreeSet<String>,
}

/// The workspace as `cargo metadata` sees it: package -> row.
fn actual() -> BTreeMap<String, Row> {
    let meta = metadata();
    let packages = meta["packages"].as_array().expect("packages");
    let names: BTreeSet<String> = packages
        .iter()
        .filter_map(|p| p["name"].as_str().map(str::to_string))
        .collect();
    let root = root();
    let mut rows = BTreeMap::new();
    for p in packages {
        let name = p["name"].as_str().unwrap_or_default().to_string();
        let manifest = PathBuf::from(p["manifest_path"].as_str().unwrap_or_default());
        let folder = manifest
            .parent()
            .and_then(|d| d.strip_prefix(&root).ok())
            .map(|d| d.display().to_string())
            .unwrap_or_default();
        let mut row = Row {
            folder,
            ..Row::default()
        };
        for d in p["dependencies"].as_array().into_iter().flatten() {
            let dep = d["name"].as_str().unwrap_or_default().to_string();
            if !names.contains(&dep) {
                continue;
            }
            match d["kind"].as_str() {
                Some("dev") => row.dev.insert(dep),
                _ => row.normal.insert(dep),
            };
        }
        // A crate used normally is usable in its tests too: the map lists it once.
        let normal = row.normal.clone();
        row.dev.retain(|d| !normal.contains(d));
        rows.insert(name, row);
    }
    rows
}

fn names(cell: &str) -> BTreeSet<String> {
    cell.split(',')
        .map(|s| s.trim().trim_matches('`').trim().to_string())
        .filter(|s| !s.is_empty() && s != "—" && s != "-")
        .collect()
}

/// The table under "## Allowed dependency edges" in ARCHITECTURE.md.
fn mapped() -> BTreeMap<String, Row> {
    let text = std::fs::read_to_string(root().join("ARCHITECTURE.md")).expect("ARCHITECTURE.md");
    let section = text
        .split("## Allowed dependency edges")
        .nth(1)
        .expect("ARCHITECTURE.md has an \"Allowed dependency edges\" section");
    let mut rows = BTreeMap::new();
    for line in section.lines().skip_while(|l| !l.starts_with('|')) {
        if !line.starts_with('|') {
            break;
        }
        let cells: Vec<&str> = line.trim().trim_matches('|').split('|').collect();
        if cells.len() != 4 || cells[0].contains("---") || cells[0].trim() == "crate" {
            continue;
        }
        let crate_name = cells[0].trim().trim_matches('`').to_string();
        rows.insert(
            crate_name,
            Row {
                folder: cells[1].trim().trim_matches('`').to_string(),
                normal: names(cells[2]),
                dev: names(cells[3]),
            },
        );
    }
    rows
}

fn table(rows: &BTreeMap<String, Row>) -> String {
    let list = |s: &BTreeSet<String>| {
        if s.is_empty() {
            "—".to_string()
        } else {
            s.iter()
                .map(|n| format!("`{n}`"))
                .collect::<Vec<_>>()
                .join(", ")
        }
    };
    let mut out =
        String::from("| crate | folder | may use | may also use in tests |\n|---|---|---|---|\n");
    for (name, r) in rows {
        out.push_str(&format!(
            "| `{name}` | `{}` | {} | {} |\n",
            r.folder,
            list(&r.normal),
            list(&r.dev)
        ));
    }
    out
}

#[test]
fn architecture_md_names_every_crate_and_every_edge() {
    let actual = actual();
    let mapped = mapped();
    let mut problems = Vec::new();
    for (name, a) in &actual {
        let Some(m) = mapped.get(name) else {
            problems.push(format!("{name} is not in the map"));
            continue;
        };
        if a.folder != m.folder {
            problems.push(format!(
                "{name} lives in {} but the map says {}",
                a.folder, m.folder
            ));
        }
        for d in a.normal.difference(&m.normal) {
            problems.push(format!("{name} uses {d}, which the map does not allow"));
        }
        for d in a.dev.difference(&m.dev) {
            problems.push(format!(
                "{name}'s tests use {d}, which the map does not allow"
            ));
        }
        for d in m.normal.difference(&a.normal) {
            problems.push(format!("the map lets {name} use {d}, which it does not"));
        }
        for d in m.dev.difference(&a.dev) {
            problems.push(format!(
                "the map lets {name}'s tests use {d}, which they do not"
            ));
        }
    }
    for name in mapped.keys().filter(|n| !actual.contains_key(*n)) {
        problems.push(format!(
            "the map names {name}, which is not in the workspace"
        ));
    }
    assert!(
        problems.is_empty(),
        "ARCHITECTURE.md is out of date:\n  {}\n\nThe table should read:\n\n{}",
        problems.join("\n  "),
        table(&actual)
    );
}

#[test]
fn every_folder_is_named_after_its_package() {
    let wrong: Vec<String> = actual()
        .into_iter()
        .filter(|(name, r)| r.folder != "xtask" && !r.folder.ends_with(&format!("/{name}")))
        .map(|(name, r)| format!("{name} lives in {}", r.folder))
        .collect();
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// The crates published to crates.io together (`cargo publish` of this set, with rpm-evr).
const PUBLISHED: [&str; 10] = [
    "rpm-evr",
    "choria-crypto",
    "helper-protocol",
    "provision-core",
    "choria-rpc-client",
    "provisioner-metrics",
    "provisioner-status",
    "provisioner-config",
    "fleet-lifecycle",
    "provisioner",
];

/// The binary is argument parsing, logging set-up, signal handling and printing: under 1,000
/// lines, the application being the `provisioner` library's.
#[test]
fn the_binary_is_thin() {
    let dir = root().join("bin/choria-provisioner/src");
    let mut lines = 0;
    for entry in std::fs::read_dir(&dir).expect("the binary's sources") {
        let path = entry.expect("a directory entry").path();
        if path.extension().is_some_and(|e| e == "rs") {
            lines += std::fs::read_to_string(&path)
                .expect("a source file")
                .lines()
                .count();
        }
    }
    assert!(
        lines < 1000,
        "bin/choria-provisioner/src holds {lines} lines: move logic into crates/provisioner"
    );
}

/// provision-core does no I/O: no file, socket or process calls in its sources, and the tokio
/// it compiles has no networking, processes, signals or files (features add up across a
/// workspace, so cargo is asked for the crate's own feature tree).
#[test]
fn the_core_does_no_io() {
    let src = root().join("crates/provision-core/src");
    let mut found = Vec::new();
    for entry in std::fs::read_dir(&src).expect("the core's sources") {
        let path = entry.expect("a directory entry").path();
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        for needle in [
            "std::fs",
            "tokio::fs",
            "std::net",
            "tokio::net",
            "std::process",
            "tokio::process",
        ] {
            if text.contains(needle) {
                found.push(format!("{} uses {needle}", path.display()));
            }
        }
    }
    assert!(found.is_empty(), "{}", found.join("\n"));

    let out = cargo(&[
        "tree",
        "--offline",
        "-p",
        "provision-core",
        "-e",
        "features,normal",
        "--prefix",
        "none",
    ]);
    let text = String::from_utf8_lossy(&out);
    let tokio: BTreeSet<&str> = text
        .lines()
        .filter_map(|l| l.trim().strip_prefix("tokio feature \""))
        .filter_map(|l| l.split('"').next())
        .collect();
    assert!(
        tokio.contains("rt"),
        "tokio's features were not found in the tree:\n{text}"
    );
    let io: Vec<&&str> = ["net", "fs", "process", "signal"]
        .iter()
        .filter(|f| tokio.contains(**f))
        .collect();
    assert!(
        io.is_empty(),
        "provision-core compiles tokio with {io:?} (all: {tokio:?}); declare tokio features per \
         crate, never in [workspace.dependencies]"
    );
    for heavy in ["reqwest", "async-nats", "hyper"] {
        assert!(
            !text.lines().any(|l| l.starts_with(&format!("{heavy} v"))),
            "provision-core depends on {heavy}"
        );
    }
}

/// The published crates carry what crates.io and docs.rs need, and every workspace crate they
/// use is published too, with a version (a path alone cannot be published).
#[test]
fn the_published_crates_can_be_published() {
    let meta = metadata();
    let packages = meta["packages"].as_array().expect("packages");
    let mut problems = Vec::new();
    for p in packages {
        let name = p["name"].as_str().unwrap_or_default();
        if !PUBLISHED.contains(&name) {
            continue;
        }
        if p["publish"].as_array().is_some_and(|a| a.is_empty()) {
            problems.push(format!("{name} says publish = false"));
        }
        for key in [
            "description",
            "license",
            "repository",
            "readme",
            "rust_version",
        ] {
            if p[key].as_str().is_none_or(str::is_empty) {
                problems.push(format!("{name} has no {key}"));
            }
        }
        if p["metadata"]["docs"]["rs"].is_null() {
            problems.push(format!("{name} has no [package.metadata.docs.rs]"));
        }
        let dir = PathBuf::from(p["manifest_path"].as_str().unwrap_or_default());
        let readme = dir.parent().map(|d| d.join("README.md"));
        if !readme.is_some_and(|r| r.is_file()) {
            problems.push(format!("{name} has no README.md"));
        }
        for d in p["dependencies"].as_array().into_iter().flatten() {
            let dep = d["name"].as_str().unwrap_or_default();
            let is_dev = d["kind"].as_str() == Some("dev");
            let local = d["path"].is_string();
            if !local || is_dev {
                continue;
            }
            if !PUBLISHED.contains(&dep) {
                problems.push(format!("{name} uses {dep}, which is not published"));
            }
            if d["req"].as_str() == Some("*") {
                problems.push(format!("{name} uses {dep} by path without a version"));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
