//! The demo helper as a webhook (`choria-demo-helper serve`) for a local run: a port chosen and a
//! secret written first (so the provisioner's configuration can name them), then the server
//! started with the run's CA and broker. `cargo xtask demo --helper webhook`, the benchmark and
//! the fault suite use it.

use std::io::Write as _;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::stack::RunFiles;
use crate::{IoContext, ProcessGuard, Result};

/// The secret the demo webhook and the provisioner share in a local run.
const DEMO_SECRET: &str = "demo-webhook-secret-not-for-production";

/// Where a run's webhook will listen and the secret it checks, decided before it starts.
#[derive(Clone, Debug)]
pub struct WebhookPlan {
    /// The loopback port.
    pub port: u16,
    /// The URL the provisioner's `helper` names.
    pub url: String,
    /// The secret file (owner-only), for `helper_secret_file` and `--secret-file`.
    pub secret_file: PathBuf,
}

impl WebhookPlan {
    /// A free loopback port and the secret file written into `dir`.
    pub fn new(dir: &Path) -> Result<WebhookPlan> {
        crate::mkdir(dir)?;
        let port = crate::free_port();
        let secret_file = dir.join("helper.secret");
        crate::write(&secret_file, &format!("{DEMO_SECRET}\n"))?;
        crate::owner_only(&secret_file)?;
        Ok(WebhookPlan {
            port,
            url: format!("http://127.0.0.1:{port}/provision"),
            secret_file,
        })
    }

    /// The provisioner's YAML lines for it besides `helper`: the secret file, and replies
    /// required to be signed (the demo helper signs every answer).
    pub fn extra_yaml(&self) -> String {
        format!(
            "helper_secret_file: {}\nhelper_reply_signature: required\n",
            self.secret_file.display()
        )
    }

    /// The demo helper's command serving this plan with the run's CA, issuer and `broker`.
    pub fn command(&self, bins: &Path, files: &RunFiles, broker: &str) -> Command {
        let mut cmd = Command::new(bins.join("choria-demo-helper"));
        cmd.arg("serve")
            .args(["--listen", &format!("127.0.0.1:{}", self.port)])
            .arg("--secret-file")
            .arg(&self.secret_file)
            .envs(files.helper_env(broker));
        cmd
    }

    /// Starts the server (its output in `log`) and waits until it accepts connections.
    pub fn start(
        &self,
        bins: &Path,
        files: &RunFiles,
        broker: &str,
        log: &Path,
    ) -> Result<ProcessGuard> {
        let out = std::fs::File::create(log).ctx(|| format!("creating {}", log.display()))?;
        let err = out
            .try_clone()
            .ctx(|| format!("opening {}", log.display()))?;
        let mut cmd = self.command(bins, files, broker);
        cmd.stdin(Stdio::null()).stdout(out).stderr(err);
        let guard = ProcessGuard::spawn("demo webhook", &mut cmd)?.drop_grace(Duration::ZERO);
        crate::ports::wait_port(self.port, Duration::from_secs(10))?;
        Ok(guard)
    }
}

/// POSTs `body` to `url` (`http://ADDRESS/PATH`) with exactly these extra headers, on a
/// connection of its own that asks the server to close it; returns the connection with the
/// request written, for the caller to read the answer as its test needs.
pub fn raw_post(url: &str, headers: &[(&str, String)], body: &[u8]) -> Result<TcpStream> {
    let rest = url.strip_prefix("http://").unwrap_or(url);
    let (addr, path) = rest.split_once('/').unwrap_or((rest, ""));
    let mut s = TcpStream::connect(addr).ctx(|| format!("connecting to {addr}"))?;
    let mut head = format!(
        "POST /{path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes())
        .and_then(|()| s.write_all(body))
        .ctx(|| format!("posting to {url}"))?;
    Ok(s)
}
