//! The man pages and shell completions of a clap command, as the packages install them: one
//! section 1 page a visible command and sub command, named as clap_mangen names them
//! (`NAME.1`, `NAME-SUB.1`, `NAME-SUB-SUB.1`), and the bash, zsh and fish completions
//! (clap_complete). `choria-provisioner generate-assets --out DIR` writes them with [`write`];
//! `cargo xtask dist` runs it once and installs the files into every package.
//!
//! Hidden commands get no page and are not completed.

use std::fs;
use std::path::Path;

use clap::{Command, CommandFactory};
use clap_complete::Shell;

/// Why the assets could not be written.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A directory or file could not be made or written, or a page rendered.
    #[error("cannot {action} {}", path.display())]
    Io {
        /// What was being done (`create`, `write`, `render`).
        action: &'static str,
        /// The file or directory.
        path: std::path::PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// clap_complete wrote a bash script in which a sub command has no case.
    #[error("the bash completion of {name} has no case for {state}")]
    BashScript {
        /// The program.
        name: String,
        /// The state without a case.
        state: String,
    },
}

/// The result of writing the assets.
pub type Result<T, E = Error> = std::result::Result<T, E>;

fn io<'a>(action: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> Error + 'a {
    move |source| Error::Io {
        action,
        path: path.to_path_buf(),
        source,
    }
}

/// Writes the assets of `T`'s command (of release `version`) under `out`:
/// `man/man1/NAME.1` and one page a visible sub command, `completions/bash/NAME`,
/// `completions/zsh/_NAME` and `completions/fish/NAME.fish`.
pub fn write<T: CommandFactory>(version: &str, out: &Path) -> Result<()> {
    let cmd = T::command();
    let name = cmd.get_name().to_string();
    let man = out.join("man/man1");
    create_dir(&man)?;
    // The pages document the commands as typed: no `help` sub command of their own.
    let mut built = cmd.clone().disable_help_subcommand(true);
    built.build();
    man_pages(&built, &man, &format!("{name} {version}"))?;
    let mut visible = without_hidden(&cmd);
    let completions = out.join("completions");
    for (shell, file) in [
        (Shell::Bash, format!("bash/{name}")),
        (Shell::Zsh, format!("zsh/_{name}")),
        (Shell::Fish, format!("fish/{name}.fish")),
    ] {
        let path = completions.join(file);
        create_dir(path.parent().unwrap_or(&completions))?;
        let mut script = Vec::new();
        clap_complete::generate(shell, &mut visible, &name, &mut script);
        if shell == Shell::Bash {
            script = bash_arms_as_the_loop_spells_them(&String::from_utf8_lossy(&script), &name)?
                .into_bytes();
        }
        write_file(&path, &script)?;
    }
    Ok(())
}

/// The page of `cmd` (built, so its sub commands carry their full names) and of each visible
/// sub command below it, into `dir`; `source` is the footer's program and version.
fn man_pages(cmd: &Command, dir: &Path, source: &str) -> Result<()> {
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        man_pages(sub, dir, source)?;
    }
    let page = clap_mangen::Man::new(cmd.clone()).source(source);
    let path = dir.join(page.get_filename());
    let mut roff = Vec::new();
    page.render(&mut roff).map_err(io("render", &path))?;
    write_file(&path, &roff)
}

/// `cmd` without its hidden sub commands, at every level, for the completion scripts (which
/// clap_complete writes for every sub command it is given). clap cannot remove a sub command,
/// so a level that hides one is assembled anew from its arguments, groups, visible sub commands
/// and the settings the scripts read; the other levels are kept as they are.
fn without_hidden(cmd: &Command) -> Command {
    if !cmd.get_subcommands().any(Command::is_hide_set) {
        return cmd.clone().mut_subcommands(|s| without_hidden(&s));
    }
    let subs = cmd
        .get_subcommands()
        .filter(|s| !s.is_hide_set())
        .map(without_hidden);
    let mut out = Command::new(cmd.get_name().to_string())
        .args(cmd.get_arguments().cloned())
        .groups(cmd.get_groups().cloned())
        .subcommands(subs.collect::<Vec<_>>())
        .visible_aliases(
            cmd.get_visible_aliases()
                .map(str::to_string)
                .collect::<Vec<_>>(),
        )
        .disable_version_flag(cmd.is_disable_version_flag_set())
        .disable_help_flag(cmd.is_disable_help_flag_set())
        .disable_help_subcommand(cmd.is_disable_help_subcommand_set());
    if let Some(about) = cmd.get_about() {
        out = out.about(about.clone());
    }
    if let Some(about) = cmd.get_long_about() {
        out = out.long_about(about.clone());
    }
    if let Some(version) = cmd.get_version() {
        out = out.version(version.to_string());
    }
    out
}

/// clap_complete's bash script finds the sub command being completed with a loop that sets
/// `cmd` to the command name with `-` as `__`, then `__subcmd__` and each sub command
/// (`choria__provisioner__subcmd__deny`), but spells the case arms that act on it with the
/// name's `-` as `__subcmd__` (`choria__subcmd__provisioner__subcmd__deny)`): for a hyphenated
/// name no arm below the top level ever matches, so nothing past a sub command completes
/// (clap-rs/clap#6421, clap_complete 4.6.12). The arms are respelt as the loop spells them, and
/// a script in which any value the loop sets has no arm is refused.
fn bash_arms_as_the_loop_spells_them(script: &str, name: &str) -> Result<String> {
    const SEP: &str = "__subcmd__";
    let script = if name.contains('-') {
        let arm = format!("{}{SEP}", name.replace('-', SEP));
        script.replace(&arm, &format!("{}{SEP}", name.replace('-', "__")))
    } else {
        script.to_string()
    };
    let arms: Vec<&str> = script
        .lines()
        .filter_map(|l| l.trim().strip_suffix(')'))
        .collect();
    for line in script.lines() {
        let state = line
            .trim()
            .strip_prefix("cmd=\"")
            .and_then(|s| s.strip_suffix('"'));
        if let Some(state) = state.filter(|s| !s.is_empty() && !arms.contains(s)) {
            return Err(Error::BashScript {
                name: name.to_string(),
                state: state.to_string(),
            });
        }
    }
    Ok(script)
}

fn create_dir(dir: &Path) -> Result<()> {
    fs::create_dir_all(dir).map_err(io("create", dir))
}

fn write_file(path: &Path, bytes: &[u8]) -> Result<()> {
    fs::write(path, bytes).map_err(io("write", path))
}
