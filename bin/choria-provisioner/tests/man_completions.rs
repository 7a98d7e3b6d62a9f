//! The man pages and shell completions the packages install, as the built binary writes them
//! (`choria-provisioner generate-assets --out DIR`, a hidden command): a page for the command
//! and for every command and sub command `--help` lists, each rendered by the system's man
//! page formatter and naming its command; the list `cargo xtask dist` packages
//! (`packaging::assets::MAN_PAGES`) the same; and the bash completion, sourced by a bash
//! started without any start-up file (so without the bash-completion package's helpers),
//! completing `choria-provisioner de<TAB>` to `deny`. The hidden command gets neither a page nor
//! a completion.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_choria-provisioner");

/// The commands of cli.rs that `--help` shows, at the top level.
const COMMANDS: [&str; 12] = [
    "run", "check", "policy", "status", "nodes", "node", "pause", "resume", "deny", "approve",
    "reject", "rotate",
];

fn output(cmd: &mut Command) -> Output {
    let o = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(o.status.success(), "{cmd:?} failed: {o:?}");
    o
}

fn text(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Runs `generate-assets` into a new directory.
fn generate() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(BIN)
        .arg("generate-assets")
        .arg("--out")
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "generate-assets failed: {out:?}");
    dir
}

/// The sub commands under clap's `Commands:` heading of `choria-provisioner WORDS --help`,
/// without `help`.
fn listed(words: &[String]) -> Vec<String> {
    let help = text(&output(Command::new(BIN).args(words).arg("--help")));
    let Some((_, rest)) = help.split_once("\nCommands:\n") else {
        return Vec::new();
    };
    rest.lines()
        .take_while(|l| l.starts_with("  "))
        .filter(|l| !l.starts_with("   "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|w| *w != "help")
        .map(str::to_string)
        .collect()
}

/// Every command path `--help` shows, the top command as the empty path, depth first.
fn visible_commands() -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let mut todo = vec![Vec::new()];
    while let Some(path) = todo.pop() {
        for sub in listed(&path) {
            let mut deeper = path.clone();
            deeper.push(sub);
            todo.push(deeper);
        }
        out.push(path);
    }
    out
}

/// The program that renders a man page to text here, if any: man-db's `man -l`, groff or
/// mandoc.
fn renderer() -> Option<&'static str> {
    ["man", "groff", "mandoc"].into_iter().find(|p| {
        Command::new("sh")
            .arg("-c")
            .arg(format!("command -v {p}"))
            .output()
            .is_ok_and(|o| o.status.success())
    })
}

/// `page` rendered as plain text by `program`, 200 columns wide, overstrikes removed.
fn render(program: &str, page: &Path) -> String {
    let mut cmd = Command::new(program);
    match program {
        "man" => cmd.arg("-l").arg(page).env("MANWIDTH", "200"),
        "groff" => cmd
            .args(["-man", "-Tutf8", "-P-cbou", "-rLL=200n"])
            .arg(page),
        _ => cmd.args(["-Tutf8", "-Owidth=200"]).arg(page),
    };
    cmd.env("MANPAGER", "cat")
        .env("PAGER", "cat")
        .env("LC_ALL", "C.UTF-8");
    let raw = text(&output(&mut cmd));
    // A character followed by a backspace is overstruck (bold or underlined) by the next one.
    let mut plain = String::new();
    for c in raw.chars() {
        if c == '\u{8}' {
            plain.pop();
        } else {
            plain.push(c);
        }
    }
    plain
}

#[test]
fn a_man_page_for_every_command_names_its_command() {
    let commands = visible_commands();
    let top: BTreeSet<&str> = commands
        .iter()
        .filter(|p| p.len() == 1)
        .map(|p| p[0].as_str())
        .collect();
    assert_eq!(top, COMMANDS.into_iter().collect(), "--help's commands");
    for nested in [["deny", "add"], ["policy", "eval"], ["rotate", "status"]] {
        assert!(
            commands.contains(&nested.map(String::from).to_vec()),
            "{nested:?}"
        );
    }

    let dir = generate();
    let man = dir.path().join("man/man1");
    let written: BTreeSet<String> = std::fs::read_dir(&man)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    let page_of = |path: &[String]| {
        let mut words = vec!["choria-provisioner".to_string()];
        words.extend(path.iter().cloned());
        words.join("-")
    };
    let expected: BTreeSet<String> = commands
        .iter()
        .map(|p| format!("{}.1", page_of(p)))
        .collect();
    // One page a command `--help` shows, and no other (none for `help` or the hidden command).
    assert_eq!(written, expected);
    let packaged: BTreeSet<String> = packaging::assets::MAN_PAGES
        .iter()
        .map(|p| format!("{p}.1"))
        .collect();
    assert_eq!(packaged, expected, "packaging::assets::MAN_PAGES");

    let Some(program) = renderer() else {
        println!("skipped: no man, groff or mandoc here, the man pages are not rendered");
        return;
    };
    for path in &commands {
        let page = page_of(path);
        let rendered = render(program, &man.join(format!("{page}.1")));
        // Justified text: words may be apart by more than one space.
        let rendered = rendered
            .split(' ')
            .filter(|w| !w.is_empty())
            .collect::<Vec<_>>()
            .join(" ");
        let name = rendered
            .split("NAME\n")
            .nth(1)
            .unwrap_or_else(|| panic!("{page}: no NAME section in\n{rendered}"));
        assert!(
            name.trim_start().starts_with(&format!("{page} ")),
            "{page}: {program} renders NAME as\n{name}"
        );
        let synopsis = rendered
            .split("SYNOPSIS\n")
            .nth(1)
            .unwrap_or_else(|| panic!("{page}: no SYNOPSIS section in\n{rendered}"));
        let mut typed = vec!["choria-provisioner".to_string()];
        typed.extend(path.iter().cloned());
        let typed = typed.join(" ");
        assert!(
            synopsis.trim_start().starts_with(&format!("{typed} ")),
            "{page}: {program} renders SYNOPSIS as\n{synopsis}"
        );
    }
}

/// What the generated bash completion offers for `line` (the words typed, the last one being
/// completed), from `bash --norc --noprofile`: the script sourced, the function it registers
/// for choria-provisioner called as readline would call it, COMPREPLY printed a word a line.
fn bash_complete(script: &Path, line: &str) -> Vec<String> {
    let program = r#"
        if declare -F _init_completion _get_comp_words_by_ref >/dev/null; then
            echo "bash-completion's helpers are loaded" >&2; exit 3
        fi
        source "$1"
        spec=$(complete -p choria-provisioner)
        fn=${spec#*-F }; fn=${fn%% *}
        read -r -a COMP_WORDS <<< "$2"
        case "$2" in *' ') COMP_WORDS+=("") ;; esac
        COMP_CWORD=$(( ${#COMP_WORDS[@]} - 1 ))
        COMP_LINE=$2
        COMP_POINT=${#COMP_LINE}
        cur=${COMP_WORDS[COMP_CWORD]}
        prev=${COMP_WORDS[COMP_CWORD-1]}
        "$fn" choria-provisioner "$cur" "$prev"
        printf '%s\n' "${COMPREPLY[@]}"
    "#;
    let o = output(
        Command::new("bash")
            .args(["--norc", "--noprofile", "-c", program, "bash"])
            .arg(script)
            .arg(line)
            .env_remove("BASH_ENV"),
    );
    text(&o)
        .lines()
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect()
}

#[test]
fn bash_completes_commands_without_bash_completion_installed() {
    let dir = generate();
    let script: PathBuf = dir.path().join("completions/bash/choria-provisioner");
    assert_eq!(bash_complete(&script, "choria-provisioner de"), ["deny"]);
    assert_eq!(bash_complete(&script, "choria-provisioner deny a"), ["add"]);
    assert_eq!(
        bash_complete(&script, "choria-provisioner rotate st"),
        ["status"]
    );
    assert_eq!(
        bash_complete(&script, "choria-provisioner deny add --rea"),
        ["--reason"]
    );
    // The hidden command is not offered.
    assert_eq!(
        bash_complete(&script, "choria-provisioner gen"),
        Vec::<String>::new()
    );
    let all = bash_complete(&script, "choria-provisioner ");
    for c in COMMANDS {
        assert!(all.iter().any(|w| w == c), "{c} not offered: {all:?}");
    }
}

#[test]
fn the_hidden_command_is_in_no_help_page_or_completion() {
    let help = text(&output(Command::new(BIN).arg("--help")));
    assert!(!help.contains("generate-assets"), "{help}");
    let dir = generate();
    for script in [
        "completions/bash/choria-provisioner",
        "completions/zsh/_choria-provisioner",
        "completions/fish/choria-provisioner.fish",
    ] {
        let text = std::fs::read_to_string(dir.path().join(script)).unwrap();
        assert!(text.contains("rotate"), "{script} completes no command");
        assert!(
            !text.contains("generate-assets"),
            "{script} offers the hidden command"
        );
    }
    let top = std::fs::read_to_string(dir.path().join("man/man1/choria-provisioner.1")).unwrap();
    assert!(
        !top.contains("generate"),
        "the top page lists the hidden command"
    );
}

#[test]
fn a_directory_that_cannot_be_written_is_named_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a-file");
    std::fs::write(&file, "").unwrap();
    let o = Command::new(BIN)
        .arg("generate-assets")
        .arg("--out")
        .arg(&file)
        .output()
        .unwrap();
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("choria-provisioner: error: "), "{err}");
    assert!(
        err.contains(&file.join("man/man1").display().to_string()),
        "{err}"
    );
}
