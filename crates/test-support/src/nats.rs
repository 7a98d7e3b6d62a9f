//! A real `nats-server` on loopback: one server ([`NatsServer`]) or a three-server JetStream
//! cluster ([`NatsCluster`]).

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
    let log = match log {
        Some(p) => Some(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(p)
                .ctx(|| format!("opening {}", p.display()))?,
        ),
        None => None,
    };
    let ready = guard.wait_stderr_line("Server is ready", log, Duration::from_secs(15))?;
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
        tempfile::tempdir()
            .ctx(|| "creating a temporary directory".into())
            .and_then(|tmp| {
                let mut s = Self::start_in_free_port(tmp.path(), extra, false)?;
                s._tmp = Some(tmp);
                Ok(s)
            })
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// As [`NatsServer::start_in`] on a free port.
    ///
    /// The port is free when chosen and taken only when the server starts, so a process
    /// starting beside it (another scenario, an outgoing connection) may take it first: a server
    /// that exits at start is tried again on a fresh port, three times in all (the exits are
    /// kept in its log when `log` is set).
    pub fn start_in_free_port(dir: &Path, extra: &str, log: bool) -> Result<Self> {
        Self::start_in_free_port_with(dir, extra, log, free_port)
    }

    /// [`NatsServer::start_in_free_port`] with the ports drawn from `pick`.
    fn start_in_free_port_with(
        dir: &Path,
        extra: &str,
        log: bool,
        mut pick: impl FnMut() -> u16,
    ) -> Result<Self> {
        let mut last = None;
        for _ in 0..3 {
            match Self::start_in(dir, pick(), extra, log) {
                Err(Error::Failed(e)) if e.contains("exited early") => {
                    eprintln!("test-support: {e}; starting it again on a fresh port");
                    last = Some(e)
                }
                other => return other,
            }
        }
        Err(Error::Failed(last.unwrap_or_default()))
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

    /// The server process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.proc.as_ref().map(ProcessGuard::pid)
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

/// How a cluster that never placed a replicated stream is reported (and retried).
const NO_PLACEMENT: &str = "the cluster placed no replicated stream";

/// How a cluster whose servers never all routed to each other is reported (and retried).
const NOT_FORMED: &str = "the cluster did not form";

/// Whether the server with monitoring port `http` routes to the other `size - 1` servers and
/// reports JetStream healthy; what is missing when not.
fn server_state(http: u16, size: usize) -> std::result::Result<(), String> {
    // The body may come chunked: read the one number rather than parse the JSON.
    let routes = metrics::http_get(http, "/routez")
        .ok_or_else(|| "monitoring port not answering".to_string())?
        .1
        .split_once("\"num_routes\":")
        .and_then(|(_, rest)| rest.trim_start().split([',', '\n']).next())
        .and_then(|n| n.trim().parse::<usize>().ok())
        .unwrap_or(0);
    if routes + 1 < size {
        return Err(format!("{routes} routes"));
    }
    match metrics::http_get(http, "/healthz") {
        Some((200, _)) => Ok(()),
        Some((st, body)) => Err(format!(
            "healthz {st}: {}",
            body.trim().chars().take(160).collect::<String>()
        )),
        None => Err("healthz not answering".into()),
    }
}

/// Creates and deletes a memory stream with `replicas` replicas through the server on `port`
/// over a plain NATS connection; the JetStream API's answer when it is not a success.
fn probe_placement(port: u16, replicas: usize) -> std::result::Result<(), String> {
    use std::io::{Read as _, Write as _};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(|e| e.to_string())?;
    let create = format!(
        "{{\"name\":\"PLACEMENT_PROBE\",\"subjects\":[\"placement.probe\"],\"storage\":\"memory\",\"num_replicas\":{replicas}}}"
    );
    write!(
        s,
        "CONNECT {{\"verbose\":false,\"pedantic\":false}}\r\nSUB _INBOX.probe 1\r\nPUB $JS.API.STREAM.CREATE.PLACEMENT_PROBE _INBOX.probe {}\r\n{create}\r\nPUB $JS.API.STREAM.DELETE.PLACEMENT_PROBE _INBOX.probe 0\r\n\r\nPING\r\n",
        create.len()
    )
    .map_err(|e| e.to_string())?;
    // Both answers (create, then delete) arrive before the PONG that follows them.
    let mut got = String::new();
    let mut buf = [0u8; 4096];
    let start = std::time::Instant::now();
    while start.elapsed() < Duration::from_secs(5) {
        let n = s.read(&mut buf).map_err(|e| e.to_string())?;
        if n == 0 {
            break;
        }
        got.push_str(&String::from_utf8_lossy(&buf[..n]));
        if got.matches("MSG _INBOX.probe").count() >= 2 && got.ends_with("\r\n") {
            break;
        }
    }
    let create_answer = got
        .split("MSG _INBOX.probe")
        .nth(1)
        .unwrap_or_default()
        .to_string();
    if create_answer.contains("\"config\"") && !create_answer.contains("\"error\"") {
        Ok(())
    } else {
        let line = create_answer.lines().nth(1).unwrap_or("no answer").trim();
        Err(line.chars().take(200).collect())
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
        Self::start_with(size, "")
    }

    /// Start a cluster of `size` servers with `extra` added to every server's configuration
    /// (for example `max_payload: 4MB`).
    ///
    /// The ports are free when chosen but taken only when the servers start, so a process
    /// starting beside them (another test, an outgoing connection) may take one first: a server
    /// that exits at start is retried with fresh ports, three times in all.
    pub fn start_with(size: usize, extra: &str) -> Result<Self> {
        let mut last = None;
        for _ in 0..3 {
            match Self::start_once(size, extra) {
                Err(Error::Failed(e))
                    if e.contains("exited early")
                        || e.contains(NO_PLACEMENT)
                        || e.contains(NOT_FORMED) =>
                {
                    // Said even when the next try succeeds: a cluster that needed one is a
                    // finding of its own (the logs of a cluster that did not form are kept).
                    eprintln!("test-support: {e}; starting the cluster again on fresh ports");
                    last = Some(e)
                }
                other => return other,
            }
        }
        Err(Error::Failed(last.unwrap_or_default()))
    }

    fn start_once(size: usize, extra: &str) -> Result<Self> {
        let tmp = tempfile::tempdir().ctx(|| "creating a temporary directory".into())?;
        // Nine distinct ports: the operating system may hand the same free port out twice.
        let mut taken = std::collections::BTreeSet::new();
        let mut port = || loop {
            let p = free_port();
            if taken.insert(p) {
                return p;
            }
        };
        let ports: Vec<(u16, u16, u16)> = (0..size).map(|_| (port(), port(), port())).collect();
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
                 cluster {{\n  name: test\n  listen: 127.0.0.1:{cluster}\n  routes: [{}]\n}}\n{extra}\n",
                routes.join(", ")
            );
            let conf = dir.join("nats.conf");
            crate::write(&conf, &config(*client, &dir, &extra))?;
            servers.push(spawn(&conf, Some(&dir.join("nats-server.log")))?);
        }
        let formed = crate::wait_until(Duration::from_secs(60), Duration::from_millis(100), || {
            ports
                .iter()
                .all(|(_, _, http)| server_state(*http, size).is_ok())
        });
        if !formed {
            // Each server's state and the end of its log go into the error, and the logs are
            // kept: the temporary directory would otherwise go with the failed attempt.
            let states: Vec<String> = ports
                .iter()
                .enumerate()
                .map(|(n, (_, _, http))| {
                    let state = server_state(*http, size).err().unwrap_or("ready".into());
                    let log =
                        std::fs::read_to_string(tmp.path().join(format!("n{n}/nats-server.log")))
                            .unwrap_or_default();
                    let tail: Vec<&str> = log.lines().rev().take(3).collect();
                    format!(
                        "n{n}: {state}; log ends {:?}",
                        tail.into_iter().rev().collect::<Vec<_>>()
                    )
                })
                .collect();
            let kept = tmp.keep();
            return Err(Error::Failed(format!(
                "{NOT_FORMED} in 60 s ({}); logs under {}",
                states.join("; "),
                kept.display()
            )));
        }
        // JetStream places a replicated stream only once its meta leader has every peer
        // current: until then creating one fails with "no suitable peers for placement", and
        // now and then a freshly formed cluster never gets there. So placement is tried for
        // real (a memory stream with a replica on every server, then deleted) for up to 30 s;
        // a cluster that places nothing is replaced by a fresh one.
        let mut answer = String::new();
        let placed = crate::wait_until(Duration::from_secs(30), Duration::from_millis(250), || {
            match probe_placement(ports[0].0, size) {
                Ok(()) => true,
                Err(e) => {
                    answer = e;
                    false
                }
            }
        });
        if !placed {
            return Err(Error::Failed(format!(
                "{NO_PLACEMENT} in 30 s ({answer}); logs under {}",
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

/// A NATS JWT (`ed25519-nkey`) with `claims` (iss, sub, iat, jti and name added), signed by
/// `issuer`.
fn nats_jwt(
    issuer: &nkeys::KeyPair,
    subject: &str,
    name: &str,
    nats: serde_json::Value,
) -> Result<String> {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    static SERIAL: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let serial = SERIAL.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let claims = serde_json::json!({
        "jti": format!("TEST{now}X{serial}X{}", std::process::id()),
        "iat": now,
        "iss": issuer.public_key(),
        "name": name,
        "sub": subject,
        "nats": nats,
    });
    let header = b64.encode(br#"{"typ":"JWT","alg":"ed25519-nkey"}"#);
    let signing_input = format!("{header}.{}", b64.encode(claims.to_string()));
    let sig = issuer
        .sign(signing_input.as_bytes())
        .map_err(|e| Error::Failed(format!("signing the {name} JWT: {e}")))?;
    Ok(format!("{signing_input}.{}", b64.encode(sig)))
}

/// The text of a NATS credentials file (as `nsc` writes it) for `jwt` and `seed`.
pub fn creds_file_text(jwt: &str, seed: &str) -> String {
    format!(
        "-----BEGIN NATS USER JWT-----\n{jwt}\n------END NATS USER JWT------\n\n\
         ************************* IMPORTANT *************************\n\
         NKEY Seed printed below can be used to sign and prove identity.\n\
         NKEYs are sensitive and should be treated as secrets.\n\n\
         -----BEGIN USER NKEY SEED-----\n{seed}\n------END USER NKEY SEED------\n\n\
         *************************************************************\n"
    )
}

/// A nats-server in operator (JWT) mode on loopback: an operator, a system account and one
/// account (`PROVISIONING`) preloaded in a memory resolver, users of that account with
/// credentials files made on demand ([`NatsOperator::user_creds`]), and a leafnode port so a
/// plain server can bridge clients that cannot use credentials into the account
/// ([`NatsOperator::start_leaf`]). No user/password login exists here: a client needs a
/// credentials file. Killed on drop.
pub struct NatsOperator {
    _proc: ProcessGuard,
    port: u16,
    leaf_port: u16,
    http_port: u16,
    account: nkeys::KeyPair,
    dir: tempfile::TempDir,
}

impl NatsOperator {
    /// Start the server (operator, accounts and resolver generated fresh).
    pub fn start() -> Result<Self> {
        let dir = tempfile::tempdir().ctx(|| "creating a temporary directory".into())?;
        let operator = nkeys::KeyPair::new_operator();
        let system = nkeys::KeyPair::new_account();
        let account = nkeys::KeyPair::new_account();
        let op_jwt = nats_jwt(
            &operator,
            &operator.public_key(),
            "TEST-OPERATOR",
            serde_json::json!({
                "type": "operator",
                "version": 2,
                "system_account": system.public_key(),
            }),
        )?;
        let account_claims = |jetstream: bool| {
            let mut limits = serde_json::json!({
                "subs": -1, "data": -1, "payload": -1, "imports": -1, "exports": -1,
                "wildcards": true, "conn": -1, "leaf": -1,
            });
            if jetstream {
                limits["mem_storage"] = serde_json::json!(-1);
                limits["disk_storage"] = serde_json::json!(-1);
                limits["streams"] = serde_json::json!(-1);
                limits["consumer"] = serde_json::json!(-1);
            }
            serde_json::json!({
                "limits": limits,
                "default_permissions": {"pub": {}, "sub": {}},
                "type": "account",
                "version": 2,
            })
        };
        let sys_jwt = nats_jwt(
            &operator,
            &system.public_key(),
            "SYS",
            account_claims(false),
        )?;
        let acc_jwt = nats_jwt(
            &operator,
            &account.public_key(),
            "PROVISIONING",
            account_claims(true),
        )?;
        let op_file = dir.path().join("operator.jwt");
        crate::write(&op_file, &op_jwt)?;
        let (port, leaf_port, http_port) = (free_port(), free_port(), free_port());
        let conf = dir.path().join("nats.conf");
        crate::write(
            &conf,
            &format!(
                "listen: 127.0.0.1:{port}\nhttp: 127.0.0.1:{http_port}\n\
                 jetstream {{\n  store_dir: \"{store}\"\n}}\n\
                 operator: \"{op}\"\nsystem_account: {sys}\n\
                 resolver: MEMORY\nresolver_preload: {{\n  {sys}: \"{sys_jwt}\"\n  {acc}: \"{acc_jwt}\"\n}}\n\
                 leafnodes {{\n  listen: 127.0.0.1:{leaf_port}\n}}\n",
                store = dir.path().join("jetstream").display(),
                op = op_file.display(),
                sys = system.public_key(),
                acc = account.public_key(),
            ),
        )?;
        let proc = spawn(&conf, Some(&dir.path().join("nats-server.log")))?;
        Ok(NatsOperator {
            _proc: proc,
            port,
            leaf_port,
            http_port,
            account,
            dir,
        })
    }

    /// `nats://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("nats-server.log")).unwrap_or_default()
    }

    /// A new user of the account and its credentials file `<name>.creds` (mode 0600) in the
    /// server's directory.
    pub fn user_creds(&self, name: &str) -> Result<PathBuf> {
        let user = nkeys::KeyPair::new_user();
        let jwt = nats_jwt(
            &self.account,
            &user.public_key(),
            name,
            serde_json::json!({
                "pub": {}, "sub": {}, "subs": -1, "data": -1, "payload": -1,
                "type": "user", "version": 2,
            }),
        )?;
        let seed = user
            .seed()
            .map_err(|e| Error::Failed(format!("the seed of user {name}: {e}")))?;
        let path = self.dir.path().join(format!("{name}.creds"));
        crate::write(&path, &creds_file_text(&jwt, &seed))?;
        crate::owner_only(&path)?;
        Ok(path)
    }

    /// Start a plain nats-server (no authentication) joined to the account as a leafnode with
    /// `creds`, and wait until the link is up: clients of the leaf share subjects with the
    /// account's clients.
    pub fn start_leaf(&self, creds: &Path) -> Result<LeafNats> {
        let port = free_port();
        let dir = self.dir.path().join(format!("leaf-{port}"));
        crate::mkdir(&dir)?;
        let conf = dir.join("nats.conf");
        crate::write(
            &conf,
            &format!(
                "listen: 127.0.0.1:{port}\nleafnodes {{\n  remotes: [\n    {{ url: \"nats-leaf://127.0.0.1:{}\", credentials: \"{}\" }}\n  ]\n}}\n",
                self.leaf_port,
                creds.display()
            ),
        )?;
        let proc = spawn(&conf, Some(&dir.join("nats-server.log")))?;
        let linked = crate::wait_until(Duration::from_secs(15), Duration::from_millis(50), || {
            metrics::http_get(self.http_port, "/leafz").is_some_and(|(_, body)| {
                body.split_once("\"leafnodes\":")
                    .and_then(|(_, rest)| rest.trim_start().split([',', '\n']).next())
                    .and_then(|n| n.trim().parse::<usize>().ok())
                    .is_some_and(|n| n >= 1)
            })
        });
        if !linked {
            return Err(Error::Failed(format!(
                "the leafnode did not link to the operator-mode server; logs under {}",
                self.dir.path().display()
            )));
        }
        Ok(LeafNats { _proc: proc, port })
    }
}

/// A plain nats-server linked as a leafnode into a [`NatsOperator`]'s account. Killed on drop.
pub struct LeafNats {
    _proc: ProcessGuard,
    port: u16,
}

impl LeafNats {
    /// `nats://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::io::{BufRead, BufReader};

    #[test]
    fn a_server_whose_port_is_taken_at_start_moves_to_a_fresh_one() {
        let dir = tempfile::tempdir().unwrap();
        // The first port drawn is taken by another listener before the server binds it.
        let mut taken = Vec::new();
        let nats = NatsServer::start_in_free_port_with(dir.path(), "", true, || {
            let port = free_port();
            if taken.is_empty() {
                taken.push((
                    port,
                    std::net::TcpListener::bind(("127.0.0.1", port)).unwrap(),
                ));
            }
            port
        })
        .unwrap();
        let first = taken[0].0;
        assert_ne!(nats.port(), first);
        // The server answers on its port with its INFO line.
        let mut s = std::net::TcpStream::connect(("127.0.0.1", nats.port())).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut info = String::new();
        BufReader::new(&mut s).read_line(&mut info).unwrap();
        assert!(info.starts_with("INFO "), "{info}");
        let log = std::fs::read_to_string(dir.path().join("nats-server.log")).unwrap();
        assert!(
            log.contains(&format!("{first}")),
            "the failed start is in the log: {log}"
        );
    }
}
