//! The documentation's checks: the Markdown pages under `docs/` (`cargo xtask docs` runs
//! [`check`]), and in this crate's tests the examples they show against the real code.
//!
//! The documentation is plain Markdown indexed by `docs/SUMMARY.md` (mdBook's layout, so
//! `mdbook build docs` also works where mdBook is installed). [`check`] checks that:
//!
//! - every page named in `SUMMARY.md` exists and every page in `docs/` is named there;
//! - every relative link of every page resolves to a file, and every `#anchor` to a heading;
//! - every command in a code block that starts with `choria-provisioner`, `choria-fleet-sim` or
//!   `cargo xtask` names a subcommand and flags the real program accepts (read from the built
//!   binaries' `--help` and from xtask's own clap definition).
//!
//! The tests (`cargo test -p docs-check`) run the YAML examples through the provisioner's
//! configuration loader (`docs_config`), the helper examples against the helper contract
//! (`docs_helpers`), and the monitoring page and dashboards against the real metrics exposition
//! (`docs_metrics`).

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Why the documentation could not be checked, or that it failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A page or a program could not be read.
    #[error("{what}: {err}")]
    Io {
        /// What was being read.
        what: String,
        /// The operating system's error.
        err: std::io::Error,
    },
    /// The pages have problems, each printed.
    #[error("{0} problem(s) in docs/")]
    Problems(usize),
}

/// The result of the checks.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// `path`'s text, naming it on failure.
fn read(path: &Path) -> Result<String> {
    fs::read_to_string(path).map_err(|err| Error::Io {
        what: format!("cannot read {}", path.display()),
        err,
    })
}

/// Checks the pages of `root/docs` and the commands they show against the binaries in `bins`
/// (a program not built there is reported and its commands are not checked) and against
/// `xtask`, xtask's clap definition. Prints each problem and a summary line.
pub fn check(root: &Path, bins: &Path, xtask: &clap::Command) -> Result<()> {
    let docs = root.join("docs");
    let pages = markdown_pages(&docs)?;
    let mut problems = Vec::new();

    check_summary(&docs, &pages, &mut problems)?;
    for page in &pages {
        check_links(&docs, page, &mut problems)?;
    }
    let clis = known_clis(bins, xtask)?;
    let mut commands = 0;
    for page in &pages {
        commands += check_commands(page, &clis, &mut problems)?;
    }
    if let Some(Some(cli)) = clis.get("choria-provisioner") {
        check_synopsis(&docs.join("configuration.md"), cli, &mut problems)?;
    }

    if !problems.is_empty() {
        for p in &problems {
            eprintln!("docs: {p}");
        }
        return Err(Error::Problems(problems.len()));
    }
    println!(
        "docs: {} pages, every link resolves, {commands} commands name real subcommands and flags",
        pages.len()
    );
    Ok(())
}

/// The command synopsis at the top of configuration.md's "Command line" (its first `text`
/// block) names every subcommand of the binary and every flag each accepts.
fn check_synopsis(page: &Path, cli: &Cli, problems: &mut Vec<String>) -> Result<()> {
    let text = read(page)?;
    let Some(section) = text.split("## Command line").nth(1) else {
        problems.push(format!("{}: no Command line section", name(page)));
        return Ok(());
    };
    let block = section
        .split("```text\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .unwrap_or("");
    // The top-level flags (`run`'s, since it is the default command) count for every command
    // in clap's help; each command's synopsis shows its own.
    let top = cli.commands.get("").cloned().unwrap_or_default();
    for (sub, flags) in &cli.commands {
        if sub.is_empty() {
            continue;
        }
        let sub_help_flags: Vec<&String> = if sub == "run" {
            flags.iter().collect()
        } else {
            flags.iter().filter(|f| !top.contains(*f)).collect()
        };
        let lines: Vec<&str> = block
            .lines()
            .filter(|l| {
                l.split_whitespace()
                    .any(|w| w.trim_matches(|c| c == '[' || c == ']') == sub)
            })
            .collect();
        if lines.is_empty() {
            problems.push(format!(
                "{}: the command synopsis does not list `{sub}`",
                name(page)
            ));
            continue;
        }
        let shown: BTreeSet<String> = lines.iter().flat_map(|l| flags_in(l)).collect();
        for f in sub_help_flags {
            if !shown.contains(f) && !["--help", "--version", "--debug"].contains(&f.as_str()) {
                problems.push(format!(
                    "{}: the command synopsis does not show `{sub} {f}`",
                    name(page)
                ));
            }
        }
    }
    Ok(())
}

/// Every `.md` file directly under `docs/`, sorted.
fn markdown_pages(docs: &Path) -> Result<Vec<PathBuf>> {
    let io = |err| Error::Io {
        what: format!("cannot read {}", docs.display()),
        err,
    };
    let mut pages = Vec::new();
    for entry in fs::read_dir(docs).map_err(io)? {
        let path = entry.map_err(io)?.path();
        if path.extension().is_some_and(|e| e == "md") {
            pages.push(path);
        }
    }
    pages.sort();
    Ok(pages)
}

fn name(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

fn check_summary(docs: &Path, pages: &[PathBuf], problems: &mut Vec<String>) -> Result<()> {
    let summary = docs.join("SUMMARY.md");
    let text = read(&summary)?;
    let listed: BTreeSet<String> = links(&text)
        .into_iter()
        .filter(|l| !is_external(l))
        .map(|l| l.split('#').next().unwrap_or_default().to_string())
        .collect();
    for page in pages {
        let n = name(page);
        if n != "SUMMARY.md" && !listed.contains(&n) {
            problems.push(format!("{n} is not listed in SUMMARY.md"));
        }
    }
    Ok(())
}

fn is_external(link: &str) -> bool {
    link.starts_with("http://") || link.starts_with("https://") || link.starts_with("mailto:")
}

/// The targets of inline Markdown links `[text](target)` outside code.
fn links(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in prose_lines(text) {
        let mut rest = line;
        while let Some(i) = rest.find("](") {
            let after = &rest[i + 2..];
            let Some(end) = after.find(')') else { break };
            let target = after[..end].split_whitespace().next().unwrap_or_default();
            if !target.is_empty() {
                out.push(target.to_string());
            }
            rest = &after[end..];
        }
    }
    out
}

/// Lines outside fenced code blocks.
fn prose_lines(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if !fenced {
            out.push(line);
        }
    }
    out
}

/// GitHub's heading anchors: lower case, punctuation dropped, spaces to dashes, duplicates
/// numbered.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = BTreeSet::new();
    for line in prose_lines(text) {
        let t = line.trim_start();
        if !t.starts_with('#') {
            continue;
        }
        let title = t.trim_start_matches('#').trim();
        let slug: String = title
            .to_lowercase()
            .chars()
            .filter_map(|c| match c {
                ' ' => Some('-'),
                c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
                _ => None,
            })
            .collect();
        let n = seen.entry(slug.clone()).or_insert(0);
        let anchor = if *n == 0 {
            slug.clone()
        } else {
            format!("{slug}-{n}")
        };
        *n += 1;
        out.insert(anchor);
    }
    out
}

fn check_links(docs: &Path, page: &Path, problems: &mut Vec<String>) -> Result<()> {
    let text = read(page)?;
    let here = name(page);
    for link in links(&text) {
        if is_external(&link) {
            continue;
        }
        let (file, anchor) = match link.split_once('#') {
            Some((f, a)) => (f, Some(a)),
            None => (link.as_str(), None),
        };
        let target = if file.is_empty() {
            page.to_path_buf()
        } else {
            docs.join(file)
        };
        if !target.exists() {
            problems.push(format!("{here}: link {link} names a missing file"));
            continue;
        }
        if let Some(a) = anchor {
            let body = fs::read_to_string(&target).unwrap_or_default();
            if !anchors(&body).contains(a) {
                problems.push(format!("{here}: link {link} names a missing heading"));
            }
        }
    }
    Ok(())
}

/// A program's subcommands and the flags each accepts.
#[derive(Debug, Default)]
pub struct Cli {
    /// Subcommand name to its flags; "" holds the flags accepted without a subcommand.
    pub commands: BTreeMap<String, BTreeSet<String>>,
}

fn flags_in(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for word in text
        .split(|c: char| c.is_whitespace() || matches!(c, ',' | '[' | ']' | '(' | ')' | '|' | '='))
    {
        if let Some(f) = word.strip_prefix("--") {
            let f: String = f
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                .collect();
            if !f.is_empty() {
                out.insert(format!("--{f}"));
            }
        }
    }
    out
}

fn help(bin: &Path, args: &[&str]) -> Result<String> {
    let o = Command::new(bin)
        .args(args)
        .arg("--help")
        .output()
        .map_err(|err| Error::Io {
            what: format!("cannot run {} --help", bin.display()),
            err,
        })?;
    Ok(format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    ))
}

/// Subcommands listed under clap's `Commands:` heading.
fn clap_subcommands(help: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut inside = false;
    for line in help.lines() {
        if line.trim_end() == "Commands:" {
            inside = true;
            continue;
        }
        if inside {
            if !line.starts_with("  ") {
                break;
            }
            if let Some(w) = line.split_whitespace().next() {
                if w != "help" {
                    out.push(w.to_string());
                }
            }
        }
    }
    out
}

fn clap_cli(bin: &Path) -> Result<Option<Cli>> {
    let top = help(bin, &[])?;
    if !top.contains("--") {
        return Ok(None);
    }
    let mut cli = Cli::default();
    let mut global = flags_in(&top);
    global.extend(["--help".to_string(), "--version".to_string()]);
    for sub in clap_subcommands(&top) {
        let sub_help = help(bin, &[&sub])?;
        let mut f = flags_in(&sub_help);
        // A command with its own subcommands (`policy eval`): their flags count for it.
        for nested in clap_subcommands(&sub_help) {
            f.extend(flags_in(&help(bin, &[&sub, &nested])?));
        }
        f.extend(global.iter().cloned());
        cli.commands.insert(sub, f);
    }
    cli.commands.insert(String::new(), global);
    Ok(Some(cli))
}

/// xtask's commands and the flags each accepts, from its clap definition.
pub fn xtask_cli(xtask: &clap::Command) -> Cli {
    let longs = |c: &clap::Command| -> Vec<String> {
        c.get_arguments()
            .filter_map(|a| a.get_long())
            .map(|l| format!("--{l}"))
            .collect()
    };
    let mut cli = Cli::default();
    for sub in xtask.get_subcommands() {
        let mut flags: BTreeSet<String> = longs(sub).into_iter().collect();
        flags.insert("--help".into());
        for nested in sub.get_subcommands() {
            flags.extend(longs(nested));
        }
        cli.commands.insert(sub.get_name().to_string(), flags);
    }
    // The fault suite takes its own flags.
    if let Some(f) = cli.commands.get_mut("faults") {
        f.extend(["--list", "--release", "--bins"].map(String::from));
    }
    cli
}

/// The programs whose commands the pages may show: the built binaries in `bins`, when there,
/// and xtask.
fn known_clis(bins: &Path, xtask: &clap::Command) -> Result<BTreeMap<&'static str, Option<Cli>>> {
    let mut out = BTreeMap::new();
    for prog in ["choria-provisioner", "choria-fleet-sim"] {
        let bin = bins.join(prog);
        let cli = if bin.is_file() { clap_cli(&bin)? } else { None };
        if cli.is_none() {
            println!("docs: {prog} has no --help to check against, its commands are not checked");
        }
        out.insert(prog, cli);
    }
    out.insert("cargo xtask", Some(xtask_cli(xtask)));
    Ok(out)
}

/// Checks each command line in the page's code blocks; returns how many were checked.
fn check_commands(
    page: &Path,
    clis: &BTreeMap<&'static str, Option<Cli>>,
    problems: &mut Vec<String>,
) -> Result<usize> {
    let text = read(page)?;
    let here = name(page);
    let mut checked = 0;
    let mut fenced = false;
    let mut pending = String::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            pending.clear();
            continue;
        }
        if !fenced {
            continue;
        }
        // Join continuation lines ending in a backslash.
        let l = line.trim();
        if let Some(head) = l.strip_suffix('\\') {
            pending.push_str(head);
            pending.push(' ');
            continue;
        }
        pending.push_str(l);
        let full = std::mem::take(&mut pending);
        let cmd = full
            .trim_start_matches("$ ")
            .trim_start_matches("# ")
            .trim_start_matches("sudo ")
            .trim();
        // Comments after a command are not part of it.
        let cmd = cmd.split(" #").next().unwrap_or(cmd);
        // Only the first command of a pipeline or list.
        let cmd = [" | ", " && ", " || ", "; ", " > ", " < ", " 2>"]
            .iter()
            .fold(cmd, |c, sep| c.split(sep).next().unwrap_or(c))
            .trim();
        for (prog, cli) in clis {
            let Some(args) = cmd.strip_prefix(prog) else {
                continue;
            };
            if !(args.is_empty() || args.starts_with(' ')) {
                continue;
            }
            let Some(cli) = cli else { continue };
            checked += 1;
            if let Err(e) = cli.check_command(args, *prog == "cargo xtask") {
                problems.push(format!("{here}: `{cmd}`: {e}"));
            }
        }
    }
    Ok(checked)
}

impl Cli {
    /// Whether `args` (what follows the program's name in a page) name a subcommand and flags
    /// this program accepts; a program whose commands all need a subcommand is
    /// `needs_subcommand`. The error says what is wrong.
    pub fn check_command(&self, args: &str, needs_subcommand: bool) -> Result<(), String> {
        // Usage synopses write optional parts in brackets: `[run]`, `[--pid FILE]`.
        let words: Vec<&str> = args
            .split_whitespace()
            .map(|w| w.trim_matches(|c| c == '[' || c == ']'))
            .filter(|w| !w.is_empty())
            .collect();
        let first = words.first().copied().unwrap_or_default();
        let (sub, rest) = if !first.is_empty() && !first.starts_with('-') {
            if !self.commands.contains_key(first) {
                return Err(format!("no subcommand {first:?}"));
            }
            (first, words.get(1..).unwrap_or_default())
        } else {
            if needs_subcommand {
                return Err("no subcommand named".into());
            }
            // Without a subcommand: the default (`run`) flags apply.
            let default = if self.commands.contains_key("run") {
                "run"
            } else {
                ""
            };
            (default, words.as_slice())
        };
        let known = self.commands.get(sub).cloned().unwrap_or_default();
        for w in rest {
            if let Some(flag) = w.strip_prefix("--") {
                let flag = format!("--{}", flag.split('=').next().unwrap_or_default());
                if flag != "--" && !known.contains(&flag) {
                    return Err(format!("{sub:?} has no flag {flag}"));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn provisioner_cli() -> Cli {
        let mut cli = Cli::default();
        let global: BTreeSet<String> = ["--debug", "--help", "--version"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let mut run = global.clone();
        run.extend(["--config", "--choria-config", "--pid"].map(String::from));
        cli.commands.insert("run".into(), run.clone());
        cli.commands.insert("check".into(), run);
        cli.commands.insert(String::new(), global);
        cli
    }

    #[test]
    fn commands_are_checked_against_the_cli() {
        let cli = provisioner_cli();
        assert!(cli
            .check_command(" check --config a.yaml --choria-config b.cfg", false)
            .is_ok());
        assert!(cli.check_command(" --config a.yaml --pid x", false).is_ok());
        assert!(cli
            .check_command(" [--debug] [run] --config FILE [--pid FILE]", false)
            .is_ok());
        assert!(cli.check_command(" check --config=a.yaml", false).is_ok());
        assert!(cli.check_command(" chek --config a.yaml", false).is_err());
        assert!(cli.check_command(" run --confg a.yaml", false).is_err());
        assert!(cli.check_command(" --config a", true).is_err());
    }

    #[test]
    fn anchors_follow_github_rules() {
        let a = anchors("# Title\n## The `server_claims`\n```\n# not a heading\n```\n## Title\n");
        assert!(a.contains("title") && a.contains("title-1"));
        assert!(a.contains("the-server_claims"));
        assert!(!a.contains("not-a-heading"));
    }

    #[test]
    fn links_outside_code_are_found() {
        let l = links("see [a](a.md#x) and `[b](b.md)`\n```\n[c](c.md)\n```\n[d](https://x)\n");
        assert_eq!(l, vec!["a.md#x", "b.md", "https://x"]);
    }
}
