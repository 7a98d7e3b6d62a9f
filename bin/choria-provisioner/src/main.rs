//! `choria-provisioner`: the daemon that owns the early life of Choria Servers.
//!
//! This binary is thin: it parses flags, loads and validates both configuration files before
//! anything binds, sets up logging, and hands over to the `provisioner` library's daemon (or [`check`]). Every error
//! reaches the operator as one line on stderr and a non-zero exit code.

mod check;
mod cli;
mod control_cli;
mod policy_cli;
mod rotate_cli;
mod run;
mod status_cli;

use std::process::ExitCode;

use clap::Parser;
use provisioner::status_text::Query;

/// mimalloc rather than the C library's allocator: a node's cycle allocates and frees many
/// short-lived buffers (envelopes, log lines, JSON) across the runtime's threads, where glibc's
/// malloc and free are a large share of the daemon's CPU (see ARCHITECTURE.md). Its
/// arenas are large and aligned, so where transparent huge pages are `always` each touched
/// region would be backed by 2 MiB pages: [`main`] turns them off for the process first.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    // Without huge pages the daemon's resident memory follows what it uses (about 40 MiB
    // rather than 57 MiB for a 10,000-node run). Helpers inherit the setting; where the call is
    // refused the daemon works as before.
    #[cfg(target_os = "linux")]
    let _ = rustix::thread::disable_transparent_huge_pages(true);
    let cli = cli::Cli::parse();
    if cli.version {
        println!("{}", cli::VERSION);
        return ExitCode::SUCCESS;
    }
    let command = match cli.command() {
        Ok(c) => c,
        Err(e) => e.exit(),
    };
    let result = match command {
        cli::Command::Run(args) => run::main(cli.debug, args),
        cli::Command::Check(args) => check::main(cli.debug, args),
        cli::Command::Policy(cli::PolicyCommand::Eval(args)) => policy_cli::eval(&args),
        cli::Command::Status(args) => status_cli::run(&args, Query::Status),
        cli::Command::Nodes(a) if a.pending => status_cli::run(&a.api, Query::Pending),
        cli::Command::Nodes(a) => status_cli::run(
            &a.api,
            Query::Nodes {
                offset: a.offset,
                limit: a.limit,
                state: a.state.clone(),
            },
        ),
        cli::Command::Node(a) => status_cli::run(&a.api, Query::Node(a.identity.clone())),
        cli::Command::Pause(args) => control_cli::pause(cli.debug, &args),
        cli::Command::Resume(args) => control_cli::resume(cli.debug, &args),
        cli::Command::Deny(cmd) => control_cli::deny(cli.debug, &cmd),
        cli::Command::Rotate(args) => rotate_cli::main(cli.debug, &args),
        cli::Command::Approve(args) => control_cli::decide(cli.debug, &args, true),
        cli::Command::Reject(args) => control_cli::decide(cli.debug, &args, false),
        cli::Command::GenerateAssets { out } => {
            cli_assets::write::<cli::Cli>(cli::VERSION, &out).map_err(Into::into)
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // One readable line: the chain of causes joined, no backtrace, no Debug dump.
            // Go's (fisk's) prefix, so a wrapper that matches it keeps working.
            eprintln!(
                "choria-provisioner: error: {}",
                provisioner::one_line(e.as_ref())
            );
            ExitCode::FAILURE
        }
    }
}
