//! A real `nats-server` on loopback: one server ([`NatsServer`]) or a three-server JetStream
//! cluster ([`NatsCluster`]).

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::{free_port, metrics, Error, IoContext, ProcessGuard, Result};

/// Path of the `nats-server` binary the tests use.
pub fn nats_server_bin() -> PathBuf {
    if let Ok(p) = std::env::var("NATS_SERVER_BIN") {
        return PathBuf::from(p);
    }
    let local = crate::workspace_root().join("target/tools/bin/nats-server");
    if local.exists() {
        return local;
    }
    PathBuf::from("nats-server")
}

/// Start `nats-server -c conf` (killed at once on drop) and wait until it says it is ready.
/// Its log is appended to `log` when given.
pub fn spawn(conf: &Path, log: Option<&Path>) -> Result<ProcessGuard> {
    let bin = nats_server_bin();
    let mut guard = ProcessGuard::spawn(
        "nats-server",
        Command::new(&bin)
            .arg("-c")
            .arg(conf)
            .stdout(Stdio::null())
            .stderr(Stdio::piped()),
    )
    .map_err(|e| {
        Error::Failed(format!(
            "{e}; run `cargo xtask test` or set NATS_SERVER_BIN ({})",
            bin.display()
        ))
    })?
    .drop_grace(Duration::ZERO);
    let mut log = match log {
        Some(p) => Some(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(p)
                .ctx(|| format!("opening {}", p.display()))?,
        ),
        None => None,
    };
    let stderr = guard
        .child
        .stderr
        .take()
        .ok_or_else(|| Error::Failed("nats-server has no stderr".into()))?;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut sent = false;
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(f) = log.as_mut() {
                let _ = writeln!(f, "{line}");
            }
            if !sent && line.contains("Server is ready") {
                let _ = tx.send(());
                sent = true;
            }
        }
    });
    let ready = crate::wait_until(Duration::from_secs(15), Duration::from_millis(20), || {
        rx.try_recv().is_ok() || !guard.running()
    });
    if let Some(st) = guard.exited() {
        return Err(Error::Failed(format!(
            "nats-server ({}) exited early: {st}",
            conf.display()
        )));
    }
    if !ready {
        return Err(Error::Failed(format!(
            "nats-server ({}) did not become ready",
            conf.display()
        )));
    }
    Ok(guard)
}

/// A nats-server configuration: listen on `port`, JetStream stored under `dir`, then `extra`.
pub fn config(port: u16, dir: &Path, extra: &str) -> String {
    format!(
        "listen: 127.0.0.1:{port}\njetstream {{\n  store_dir: \"{}\"\n}}\n{extra}\n",
        dir.join("jetstream").display()
    )
}

/// A running nats-server with JetStream, killed on drop.
pub struct NatsServer {
    proc: Option<ProcessGuard>,
    port: u16,
    dir: PathBuf,
    log: Option<PathBuf>,
    _tmp: Option<tempfile::TempDir>,
}

impl NatsServer {
    /// Start a nats-server with JetStream on a free loopback port.
    ///
    /// # Panics
    /// When the server cannot be started (the message says how to install it).
    pub fn start() -> Self {
        Self::start_with_config("")
    }

    /// Start a nats-server whose configuration file gets `extra` appended (accounts, TLS...).
    ///
    /// # Panics
    /// When the server cannot be started.
    pub fn start_with_config(extra: &str) -> Self {
        let started = tempfile::tempdir()
            .ctx(|| "creating a temporary directory".into())
            .and_then(|tmp| {
                let mut s = Self::start_in(tmp.path(), free_port(), extra, false)?;
                s._tmp = Some(tmp);
                Ok(s)
            });
        started.unwrap_or_else(|e| panic!("{e}"))
    }

    /// Start a nats-server with its configuration, JetStream store and (with `log`) its
    /// `nats-server.log` in `dir`, on `port`, so that a restart keeps both.
    pub fn start_in(dir: &Path, port: u16, extra: &str, log: bool) -> Result<Self> {
        crate::mkdir(dir)?;
        crate::write(&dir.join("nats.conf"), &config(port, dir, extra))?;
        let mut s = NatsServer {
            proc: None,
            port,
            dir: dir.to_path_buf(),
            log: log.then(|| dir.join("nats-server.log")),
            _tmp: None,
        };
        s.proc = Some(spawn(&s.dir.join("nats.conf"), s.log.as_deref())?);
        Ok(s)
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `nats://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// Kill the server and start it again on the same port and store (a broker restart).
    ///
    /// # Panics
    /// When it does not start again.
    pub fn restart(&mut self) {
        self.stop();
        self.start_again().unwrap_or_else(|e| panic!("{e}"));
    }

    /// Start a stopped server again on the same port and store (its log appended to); a running
    /// one is killed first.
    pub fn start_again(&mut self) -> Result<()> {
        self.stop();
        let conf = self.dir.join("nats.conf");
        self.proc = Some(spawn(&conf, self.log.as_deref())?);
        Ok(())
    }

    /// Stop the server now (SIGKILL).
    pub fn stop(&mut self) {
        if let Some(mut p) = self.proc.take() {
            p.kill();
        }
    }

    /// Stop the server as an operator would: SIGTERM, SIGKILL after `grace`.
    pub fn terminate(&mut self, grace: Duration) -> Option<std::process::ExitStatus> {
        self.proc.take().and_then(|mut p| p.terminate(grace))
    }
}

/// Three nats-servers with JetStream on loopback, routed to each other as one cluster, killed
/// on drop.
pub struct NatsCluster {
    servers: Vec<ProcessGuard>,
    ports: Vec<u16>,
    _tmp: tempfile::TempDir,
}

impl NatsCluster {
    /// Start a three-server cluster and wait until every server routes to the other two and
    /// reports JetStream healthy.
    pub fn start() -> Result<Self> {
        Self::start_sized(3)
    }

    /// Start a cluster of `size` servers.
    pub fn start_sized(size: usize) -> Result<Self> {
        let tmp = tempfile::tempdir().ctx(|| "creating a temporary directory".into())?;
        let ports: Vec<(u16, u16, u16)> = (0..size)
            .map(|_| (free_port(), free_port(), free_port()))
            .collect();
        let routes: Vec<String> = ports
            .iter()
            .map(|(_, cluster, _)| format!("nats-route://127.0.0.1:{cluster}"))
            .collect();
        let mut servers = Vec::new();
        for (n, (client, cluster, http)) in ports.iter().enumerate() {
            let dir = tmp.path().join(format!("n{n}"));
            crate::mkdir(&dir)?;
            let extra = format!(
                "server_name: n{n}\nhttp: 127.0.0.1:{http}\n\
                 cluster {{\n  name: test\n  listen: 127.0.0.1:{cluster}\n  routes: [{}]\n}}\n",
                routes.join(", ")
            );
            let conf = dir.join("nats.conf");
            crate::write(&conf, &config(*client, &dir, &extra))?;
            servers.push(spawn(&conf, Some(&dir.join("nats-server.log")))?);
        }
        let formed = crate::wait_until(Duration::from_secs(30), Duration::from_millis(100), || {
            ports.iter().all(|(_, _, http)| {
                // The body may come chunked: read the one number rather than parse the JSON.
                let routed = metrics::http_get(*http, "/routez").is_some_and(|(_, body)| {
                    body.split_once("\"num_routes\":")
                        .and_then(|(_, rest)| rest.trim_start().split([',', '\n']).next())
                        .and_then(|n| n.trim().parse::<usize>().ok())
                        .is_some_and(|n| n + 1 >= size)
                });
                routed && metrics::http_get(*http, "/healthz").is_some_and(|(st, _)| st == 200)
            })
        });
        if !formed {
            return Err(Error::Failed(format!(
                "the {size}-server cluster did not form; logs under {}",
                tmp.path().display()
            )));
        }
        Ok(NatsCluster {
            servers,
            ports: ports.iter().map(|p| p.0).collect(),
            _tmp: tmp,
        })
    }

    /// The client URL of every server.
    pub fn urls(&self) -> Vec<String> {
        self.ports
            .iter()
            .map(|p| format!("nats://127.0.0.1:{p}"))
            .collect()
    }

    /// Every server's client URL, comma-separated (a Choria `middleware_hosts` value).
    pub fn url(&self) -> String {
        self.urls().join(",")
    }

    /// Kill server `n` (a broker lost).
    pub fn stop(&mut self, n: usize) {
        if let Some(s) = self.servers.get_mut(n) {
            s.kill();
        }
    }
}
