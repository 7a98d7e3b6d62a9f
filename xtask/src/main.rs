//! `cargo xtask`: the build tool — the test set-up, the local demo and benchmark, the go-choria
//! peers and the interop run with them, the entry point of the fault suite (the `fault-suite`
//! crate), packaging (the `packaging` crate), the documentation checks (`docs-check`) and the
//! benchmark (`bench-harness`). Process-level harness code (brokers,
//! processes, metrics, the Go environment) lives in `test-support`.

mod demo;
mod interop;
mod peers;
mod test_run;
mod tools;

use std::path::PathBuf;
use std::process::Command;

use anyhow::Result;
use clap::{Parser, Subcommand};

/// cargo xtask: what is not `cargo build`.
#[derive(Parser, Debug)]
#[command(name = "cargo xtask", bin_name = "cargo xtask", version)]
pub struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// A local broker, simulated fleet and provisioner, with live progress.
    Demo(demo::Args),
    /// Provisioning throughput and cost (release builds), optionally beside the Go provisioner.
    Bench(bench_harness::Args),
    /// Release packages: tarball, RPM and Debian package.
    Dist(packaging::Args),
    /// Check the documentation.
    Docs {
        /// Check against the binaries already built and skip the documentation tests.
        #[arg(long)]
        no_build: bool,
    },
    /// Install what the tests need (nats-server, the go-choria peer), then fmt check, clippy
    /// and every test.
    Test {
        /// More arguments for `cargo test --workspace`.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// The fault-injection suite (the fault-suite crate): lying nodes, failing helpers, broker
    /// and leader loss ([--list] [--release] [--bins DIR] [SCENARIO ...]).
    #[command(disable_help_flag = true)]
    Faults {
        /// --list, --release, --bins DIR and scenario names, passed to the suite.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Our provisioner against real go-choria servers.
    Interop {
        /// The flows to run (all when none).
        #[arg(value_enum)]
        flows: Vec<interop::Flow>,
    },
    /// Build the Go test peers (go-choria server/broker/CLI, Go provisioner), cached; or run
    /// a go-choria environment.
    Peers {
        #[command(subcommand)]
        command: Option<peers::Cmd>,
    },
    /// Install nats-server under target/tools/bin and print its path.
    NatsServer,
}

fn main() {
    if let Err(e) = run(Cli::parse()) {
        eprintln!("xtask: {e:#}");
        std::process::exit(1);
    }
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Cmd::Test { args } => test(&args),
        Cmd::Demo(args) => demo::main(args),
        Cmd::Bench(mut args) => {
            tools::ensure_nats_server()?;
            if args.vs_go && args.go_bin.is_none() {
                peers::build_provisioner()?;
                args.go_bin = Some(peers::provisioner_bin());
            }
            Ok(bench_harness::bench(args)?)
        }
        Cmd::Dist(args) => {
            // The checks that provision a simulated fleet run a broker.
            if args.verify || args.install_test {
                tools::ensure_nats_server()?;
            }
            Ok(packaging::dist(args)?)
        }
        Cmd::Interop { flows } => interop::main(&flows),
        Cmd::Faults { args } => faults(&args),
        Cmd::Docs { no_build } => docs(!no_build),
        Cmd::Peers { command } => peers::main(command.unwrap_or(peers::Cmd::Build)),
        Cmd::NatsServer => {
            println!("{}", tools::ensure_nats_server()?.display());
            Ok(())
        }
    }
}

/// `cargo xtask faults ARGS...`: `cargo run -p fault-suite -- ARGS...`, with nats-server
/// installed first.
fn faults(args: &[String]) -> Result<()> {
    let nats = tools::ensure_nats_server()?;
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    tools::run(
        Command::new(cargo)
            .current_dir(tools::root())
            .args(["run", "--quiet", "-p", "fault-suite", "--"])
            .args(args)
            .env("NATS_SERVER_BIN", nats),
    )
}

/// `cargo xtask docs [--no-build]`: the documentation's checks (the docs-check crate) against
/// freshly built binaries, then its tests (the examples against the real code) and the sample
/// policies' through `policy eval`; with `build` false against the binaries already built, and
/// no tests.
fn docs(build: bool) -> Result<()> {
    let root = tools::root();
    let cargo = |args: &[&str]| {
        let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
        cmd.current_dir(&root).args(args);
        cmd
    };
    if build {
        let bins = ["-p", "choria-provisioner", "-p", "choria-fleet-sim"];
        tools::run(cargo(&["build", "-q"]).args(bins))?;
    }
    let bins = packaging::target_dir(&root).join("debug");
    docs_check::check(&root, &bins, &<Cli as clap::CommandFactory>::command())?;
    if build {
        tools::run(&mut cargo(&["test", "-q", "-p", "docs-check"]))?;
        let policies = ["-p", "choria-provisioner", "--test", "docs_policies"];
        tools::run(cargo(&["test", "-q"]).args(policies))?;
    }
    Ok(())
}

/// `cargo xtask test`: the one test command.
fn test(args: &[String]) -> Result<()> {
    let nats: PathBuf = tools::ensure_nats_server()?;
    eprintln!("xtask: using {}", nats.display());
    tools::ensure_test_programs();
    // The interop tests talk to a real go-choria broker and servers: build that peer (cached).
    peers::build_choria()?;
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let root = tools::root();
    let cargo = |args: &[&str]| {
        let mut cmd = Command::new(&cargo);
        cmd.current_dir(&root).args(args);
        cmd
    };
    tools::run(&mut cargo(&["fmt", "--all", "--", "--check"]))?;
    tools::run(&mut cargo(&[
        "clippy",
        "--workspace",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ]))?;
    if !args.is_empty() {
        // A developer's selection: cargo test as given.
        return tools::run(
            cargo(&["test", "--workspace"])
                .args(args)
                .env("NATS_SERVER_BIN", &nats),
        );
    }
    let cargo_bin = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    test_run::run(&cargo_bin, &root, &nats)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use clap::CommandFactory;

    #[test]
    fn the_docs_check_reads_xtasks_commands_and_their_flags() {
        let cli = docs_check::xtask_cli(&super::Cli::command());
        let bench = cli.commands.get("bench").unwrap();
        assert!(bench.contains("--nodes") && bench.contains("--vs-go"));
        let dist = cli.commands.get("dist").unwrap();
        assert!(dist.contains("--verify") && dist.contains("--install-test"));
        assert!(cli.check_command(" dist --verify", true).is_ok());
        assert!(cli.check_command(" dist --nodes 3", true).is_err());
    }
}
