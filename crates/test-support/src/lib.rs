//! Test harness shared by the workspace's integration tests.
//!
//! [`NatsServer`] starts a real `nats-server` (JetStream on, store in a temporary directory) on a
//! free loopback port and stops it when dropped. The binary is found, in order, through the
//! `NATS_SERVER_BIN` environment variable, `target/tools/bin/nats-server` in the workspace (where
//! `cargo xtask test` installs it), and `PATH`.
#![deny(missing_docs)]
#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The workspace root, derived from this crate's manifest directory.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

/// Path of the `nats-server` binary the tests use.
pub fn nats_server_bin() -> PathBuf {
    if let Ok(p) = std::env::var("NATS_SERVER_BIN") {
        return PathBuf::from(p);
    }
    let local = workspace_root().join("target/tools/bin/nats-server");
    if local.exists() {
        return local;
    }
    PathBuf::from("nats-server")
}

/// A free TCP port on 127.0.0.1 (bound then released; good enough for tests).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A running nats-server, killed on drop.
pub struct NatsServer {
    child: Child,
    port: u16,
    store: tempfile::TempDir,
    extra_config: String,
}

impl NatsServer {
    /// Start a nats-server with JetStream on a free loopback port.
    pub fn start() -> Self {
        Self::start_with_config("")
    }

    /// Start a nats-server whose configuration file gets `extra` appended (accounts, TLS...).
    pub fn start_with_config(extra: &str) -> Self {
        let store = tempfile::tempdir().unwrap();
        let port = free_port();
        let child = Self::spawn_child(port, &store, extra);
        NatsServer {
            child,
            port,
            store,
            extra_config: extra.to_string(),
        }
    }

    fn spawn_child(port: u16, store: &tempfile::TempDir, extra_config: &str) -> Child {
        let conf = store.path().join("nats.conf");
        let body = format!(
            "listen: 127.0.0.1:{port}\njetstream {{\n  store_dir: \"{}\"\n}}\n{extra_config}\n",
            store.path().join("js").display()
        );
        std::fs::write(&conf, body).unwrap();
        let mut child = Command::new(nats_server_bin())
            .arg("-c")
            .arg(&conf)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot start nats-server ({}): {e}; run `cargo xtask test` or set NATS_SERVER_BIN",
                    nats_server_bin().display()
                )
            });
        // Wait until the server says it is ready (or the port accepts connections).
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut sent = false;
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if !sent && line.contains("Server is ready") {
                    let _ = tx.send(());
                    sent = true;
                }
            }
        });
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if rx.try_recv().is_ok() {
                break;
            }
            if let Ok(Some(status)) = child.try_wait() {
                panic!("nats-server exited early: {status}");
            }
            assert!(
                Instant::now() < deadline,
                "nats-server did not become ready on port {port}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        child
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
    pub fn restart(&mut self) {
        self.stop();
        self.child = Self::spawn_child(self.port, &self.store, &self.extra_config);
    }

    /// Stop the server now.
    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Runs `f` on a thread of its own and returns its result, panicking with `what` if it has not
/// returned within `timeout`: a test for "refused promptly" fails instead of hanging the suite
/// (a function that spins is left running until the test process exits).
pub fn returns_within<T: Send + 'static>(
    what: &str,
    timeout: Duration,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(timeout) {
        Ok(v) => v,
        Err(_) => panic!("{what} did not return within {timeout:?}"),
    }
}
