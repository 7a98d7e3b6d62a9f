//! `cargo xtask`: everything that is not `cargo build` — test set-up, demo, benchmarks, interop
//! peers and packaging.

mod bench;
mod demo;
mod dist;
mod docs;
mod faults;
mod interop;
mod peers;
mod stack;
mod tools;

use anyhow::{bail, Result};

const USAGE: &str = "usage: cargo xtask <command> [args]

commands:
  demo          a local broker, simulated fleet and provisioner, with live progress
                [--nodes N] [--mode plain|pki|ed25519]
  bench         provisioning throughput and cost (release builds), optionally beside the Go provisioner
                --nodes N --mode plain|pki|ed25519 [--workers W] [--vs-go] [--go-bin PATH] [--timeout S]
                | --waiting N
  dist          release packages: tarball, RPM and Debian package
  docs          check the documentation
  test          install what the tests need (nats-server, the go-choria peer), then fmt check,
                clippy and every test
  faults        the fault-injection suite: lying nodes, failing helpers, broker and leader loss
                [--list] [--release] [SCENARIO ...]
  interop       our provisioner against real go-choria servers [plain|pki|ed25519|key ...]
  peers         build the Go test peers (go-choria server/broker/CLI, Go provisioner), cached
  nats-server   install nats-server under target/tools/bin and print its path
";

fn main() {
    if let Err(e) = run() {
        eprintln!("xtask: {e:#}");
        std::process::exit(1);
    }
}

fn run() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let cmd = args.next().unwrap_or_default();
    let rest: Vec<String> = args.collect();
    match cmd.as_str() {
        "test" => tools::test(&rest),
        "demo" => demo::main(&rest),
        "bench" => bench::main(&rest),
        "dist" => dist::main(&rest),
        "interop" => interop::main(&rest),
        "faults" => faults::main(&rest),
        "docs" => docs::main(&rest),
        "peers" => peers::main(&rest),
        "nats-server" => {
            println!("{}", tools::ensure_nats_server()?.display());
            Ok(())
        }
        "" | "help" | "--help" | "-h" => {
            print!("{USAGE}");
            Ok(())
        }
        other => bail!("unknown command {other:?}\n{USAGE}"),
    }
}
