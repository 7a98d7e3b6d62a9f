//! The code stays a tree a reader can hold: the size limits of crates, files and functions,
//! one implementation of the key delivery scheme, a binary without NATS, a driver-sized xtask,
//! and comments and documents that say what is rather than narrate how it came to be.

use std::path::{Path, PathBuf};
use std::process::Command;

mod common;
use common::{metadata, root};

/// The files git knows below `dir` (relative to the root) whose name ends in `ending`.
fn tracked(dir: &str, ending: &str) -> Vec<PathBuf> {
    let out = Command::new("git")
        .args([
            "ls-files",
            "--cached",
            "--others",
            "--exclude-standard",
            dir,
        ])
        .current_dir(root())
        .output()
        .expect("git runs");
    assert!(out.status.success(), "git ls-files {dir}");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.ends_with(ending) && root().join(l).is_file())
        .map(PathBuf::from)
        .collect()
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(root().join(path)).unwrap_or_default()
}

/// Whether a source file is test code as a whole: integration tests, benches, examples,
/// fuzz targets and a module file named `tests.rs`.
fn test_file(path: &Path) -> bool {
    let p = path.to_string_lossy();
    ["/tests/", "/benches/", "/examples/", "fuzz/"]
        .iter()
        .any(|d| p.contains(d) || p.starts_with(&d[1..]))
        || path.file_name().is_some_and(|f| f == "tests.rs")
}

/// The lines of `text` outside `#[cfg(test)]` items.
fn non_test_lines(text: &str) -> Vec<&str> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        if lines[i].trim_start().starts_with("#[cfg(test)]") {
            let mut j = i + 1;
            while j < lines.len() && lines[j].trim_start().starts_with("#[") {
                j += 1;
            }
            if j < lines.len() && lines[j].trim_end().ends_with(';') {
                i = j + 1;
                continue;
            }
            let mut depth = 0i64;
            let mut opened = false;
            while j < lines.len() {
                let l = lines[j];
                depth += l.matches('{').count() as i64 - l.matches('}').count() as i64;
                opened |= l.contains('{');
                j += 1;
                if opened && depth <= 0 {
                    break;
                }
            }
            i = j;
            continue;
        }
        out.push(lines[i]);
        i += 1;
    }
    out
}

/// Every function of `lines` as (name, first line, length): from its `fn` line to the closing
/// brace at the same indentation (rustfmt's layout).
fn functions(lines: &[&str]) -> Vec<(String, usize, usize)> {
    let mut out = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        let trimmed = l.trim_start();
        let indent = &l[..l.len() - trimmed.len()];
        let Some(at) = trimmed.find("fn ") else {
            continue;
        };
        let before = &trimmed[..at];
        let qualifiers = before.split_whitespace().all(|w| {
            matches!(w, "pub" | "async" | "const" | "unsafe" | "extern") || w.starts_with("pub(")
        });
        if !qualifiers || trimmed.ends_with(';') {
            continue;
        }
        let name: String = trimmed[at + 3..]
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        if trimmed.ends_with('}') {
            out.push((name, i + 1, 1));
            continue;
        }
        let close = format!("{indent}}}");
        if let Some(end) = lines[i..].iter().position(|x| x.trim_end() == close) {
            out.push((name, i + 1, end + 1));
        }
    }
    out
}

#[test]
fn crates_files_and_functions_stay_within_their_limits() {
    let mut problems = Vec::new();
    let mut per_crate: std::collections::BTreeMap<String, usize> = Default::default();
    for path in tracked("crates", ".rs")
        .into_iter()
        .chain(tracked("bin", ".rs"))
    {
        if test_file(&path) {
            continue;
        }
        let text = read(&path);
        let lines = non_test_lines(&text);
        let parts: Vec<&str> = path.to_str().unwrap_or_default().split('/').collect();
        let krate = parts[..2.min(parts.len())].join("/");
        *per_crate.entry(krate.clone()).or_default() += lines.len();
        if lines.len() > 1_200 {
            problems.push(format!(
                "{} holds {} lines outside its tests (at most 1,200)",
                path.display(),
                lines.len()
            ));
        }
        let checked = [
            "crates/provisioner",
            "crates/provisioner-config",
            "crates/fleet-lifecycle",
        ];
        if checked.contains(&krate.as_str()) {
            for (name, at, len) in functions(&lines) {
                if len > 150 {
                    problems.push(format!(
                        "{}: fn {name} (line {at} of its non-test code) runs {len} lines (at most 150)",
                        path.display()
                    ));
                }
            }
        }
    }
    for (krate, n) in per_crate {
        if n > 10_000 {
            problems.push(format!(
                "{krate} holds {n} lines of non-test Rust (at most 10,000)"
            ));
        }
    }
    let xtask: usize = tracked("xtask", ".rs")
        .iter()
        .map(|p| read(p).lines().count())
        .sum();
    if xtask >= 3_000 {
        problems.push(format!(
            "xtask/ holds {xtask} lines of Rust with its tests (under 3,000: a driver)"
        ));
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_function_finder_sees_a_function_and_its_end() {
    let text = "pub(crate) async fn one(a: u8) {\n    let x = 1;\n}\n\nimpl X {\n    fn two() {}\n    fn three() {\n    }\n}\n#[cfg(test)]\nmod tests {\n    fn hidden() {\n    }\n}\n";
    let lines = non_test_lines(text);
    let found = functions(&lines);
    assert_eq!(
        found,
        [
            ("one".to_string(), 1, 3),
            ("two".to_string(), 6, 1),
            ("three".to_string(), 7, 2)
        ]
    );
}

/// The X25519 key delivery and the legacy PEM encryption are `choria-crypto`'s alone: no other
/// crate uses the primitives they are built from, and none defines its own key derivation.
#[test]
fn one_key_delivery_scheme() {
    let meta = metadata();
    let mut problems = Vec::new();
    for p in meta["packages"].as_array().into_iter().flatten() {
        let name = p["name"].as_str().unwrap_or_default();
        if name == "choria-crypto" {
            continue;
        }
        for d in p["dependencies"].as_array().into_iter().flatten() {
            let dep = d["name"].as_str().unwrap_or_default();
            // md-5 also names a reply subject in the wire protocol, so it is not listed.
            if ["aes", "cbc", "x25519-dalek"].contains(&dep) {
                problems.push(format!(
                    "{name} uses {dep}: the key scheme is choria-crypto's"
                ));
            }
        }
    }
    for path in tracked("crates", ".rs")
        .into_iter()
        .chain(tracked("bin", ".rs"))
    {
        if path.starts_with("crates/choria-crypto") || test_file(&path) {
            continue;
        }
        let text = read(&path);
        for needle in ["EVP_BytesToKey", "Proc-Type: 4,ENCRYPTED", "fn derive_key"] {
            if text.contains(needle) {
                problems.push(format!("{} writes {needle}", path.display()));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The binary reaches NATS only through the library crates, in its tests too.
#[test]
fn the_binary_has_no_nats_dependency() {
    let manifest = read(Path::new("bin/choria-provisioner/Cargo.toml"));
    assert!(
        !manifest
            .lines()
            .any(|l| l.trim_start().starts_with("async-nats")),
        "bin/choria-provisioner/Cargo.toml names async-nats: use choria_rpc_client::async_nats"
    );
}

/// Phrases that narrate a change rather than say what is: they belong in a commit message or
/// the changelog, never in a comment, README.md, ARCHITECTURE.md or docs/.
const HISTORY: [&str; 14] = [
    "instead of",
    "no longer",
    "before this change",
    "after this change",
    "used to be",
    "previously",
    "formerly",
    "earlier build",
    "earlier version",
    "this release",
    "previous release",
    "went from",
    "the old ",
    "in this session",
];

fn history_in(text: &str) -> Option<&'static str> {
    let lower = text.to_lowercase();
    HISTORY.iter().copied().find(|p| lower.contains(p))
}

#[test]
fn comments_and_documents_say_what_is() {
    let mut problems = Vec::new();
    for path in tracked(".", ".rs") {
        for (n, line) in read(&path).lines().enumerate() {
            let t = line.trim_start();
            if !t.starts_with("//") {
                continue;
            }
            if let Some(p) = history_in(t) {
                problems.push(format!("{}:{}: \"{p}\": {t}", path.display(), n + 1));
            }
        }
    }
    let mut documents = vec![PathBuf::from("README.md"), PathBuf::from("ARCHITECTURE.md")];
    documents.extend(tracked("docs", ".md"));
    documents.extend(
        tracked("crates", "README.md")
            .into_iter()
            .chain(tracked("bin", "README.md")),
    );
    for path in documents {
        for (n, line) in read(&path).lines().enumerate() {
            if let Some(p) = history_in(line) {
                problems.push(format!("{}:{}: \"{p}\": {line}", path.display(), n + 1));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "history narrated where the code and documents should say what is (CHANGELOG.md and git \
         keep history):\n{}",
        problems.join("\n")
    );
}

#[test]
fn the_history_check_catches_its_phrases() {
    assert_eq!(history_in("// This No Longer copies."), Some("no longer"));
    assert_eq!(history_in("// Copies once, then shares."), None);
}
