//! `status`, `nodes` and `node`: the JSON API of a running provisioner, read over its monitor
//! listener and printed as aligned tables for people or as JSON (`--json`) for scripts
//! ([`provisioner::status_text`]). The listener comes from the daemon's YAML unless
//! `--monitor URL` and `--token-file` say otherwise ([`StatusClient::for_command`]).

use anyhow::{anyhow, Result};
use provisioner::status_client::StatusClient;
use provisioner::status_text::Query;

use crate::cli::ApiArgs;

/// Asks `query` of the provisioner `args` locate, and prints the answer.
pub fn run(args: &ApiArgs, query: Query) -> Result<()> {
    let path = query.path().map_err(|e| anyhow!(e))?;
    let client = StatusClient::for_command(
        args.config.as_deref(),
        args.monitor.as_deref(),
        args.token_file.as_deref(),
        std::path::Path::new(crate::cli::DEFAULT_CONFIG),
    )?;
    let runtime = provisioner::runtime(1)?;
    let v = runtime.block_on(client.get(&path))?;
    print!("{}", query.render(&v, args.json));
    Ok(())
}
