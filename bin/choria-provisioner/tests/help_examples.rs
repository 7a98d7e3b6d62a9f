//! Every subcommand's help ends with a real example, and the example is valid: its flags and
//! values parse (the files it names made to exist, then `--help` appended, which clap honours
//! only once everything before it has parsed).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_choria-provisioner");

const SUBCOMMANDS: [&[&str]; 20] = [
    &["run"],
    &["check"],
    &["policy"],
    &["policy", "eval"],
    &["status"],
    &["nodes"],
    &["node"],
    &["pause"],
    &["resume"],
    &["deny"],
    &["deny", "add"],
    &["deny", "rm"],
    &["deny", "ls"],
    &["approve"],
    &["reject"],
    &["rotate"],
    &["rotate", "status"],
    &["rotate", "pause"],
    &["rotate", "resume"],
    &["rotate", "abort"],
];

fn help(dir: &std::path::Path, args: &[String]) -> (bool, String) {
    let o = Command::new(BIN)
        .args(args)
        .arg("--help")
        .current_dir(dir)
        .output()
        .unwrap();
    (
        o.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        ),
    )
}

#[test]
fn every_subcommand_ends_its_help_with_an_example_that_parses() {
    let dir = tempfile::tempdir().unwrap();
    for f in ["prov.yaml", "main.cfg", "in.json"] {
        std::fs::write(dir.path().join(f), "").unwrap();
    }
    let listed = help(dir.path(), &[]).1;
    for sub in SUBCOMMANDS {
        if sub.len() == 1 {
            assert!(
                listed.contains(&format!("  {} ", sub[0])),
                "{sub:?} not listed"
            );
        }
        let path: Vec<String> = sub.iter().map(|s| s.to_string()).collect();
        let (ok, text) = help(dir.path(), &path);
        assert!(ok, "{sub:?} --help: {text}");
        let lines: Vec<&str> = text.trim_end().lines().collect();
        let n = lines.len();
        assert!(
            n >= 2 && lines[n - 2] == "Example:",
            "{sub:?}: help does not end with an example:\n{text}"
        );
        let example = shlex::split(lines[n - 1].trim()).unwrap();
        assert_eq!(
            example[0],
            "choria-provisioner",
            "{sub:?}: {}",
            lines[n - 1]
        );
        assert!(
            example[1..].starts_with(&path[..1]),
            "{sub:?}: the example runs another command: {}",
            lines[n - 1]
        );
        let (ok, text) = help(dir.path(), &example[1..]);
        assert!(
            ok,
            "{sub:?}: the example {example:?} does not parse: {text}"
        );
    }
}

#[test]
fn an_example_with_a_wrong_flag_is_caught() {
    let dir = tempfile::tempdir().unwrap();
    let (ok, text) = help(dir.path(), &["deny".into(), "add".into(), "--bogus".into()]);
    assert!(!ok, "{text}");
}
