//! A minimal Choria client for driving the fleet in tests: raw async-nats requests built with
//! the protocol module, replies collected on the request's reply subject.
#![allow(clippy::unwrap_used, dead_code)]

use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use choria_fleet_sim::{FleetConfig, ProvisioningJwt, SimFleet};
use choria_rpc_client::mcorpc::RpcReply;
use choria_rpc_client::protocol::{self, Filter, OutgoingRequest, Reply, Security};
use futures::StreamExt as _;

pub const TOKEN: &str = "s3cret";

/// One second.
pub const SEC: Duration = Duration::from_secs(1);

/// The time now, in Unix seconds.
pub fn now() -> i64 {
    SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// `v` sorted.
pub fn sorted<T: Ord>(mut v: Vec<T>) -> Vec<T> {
    v.sort();
    v
}

/// A client of `url` subscribed to `subject`, flushed so that it sees everything published
/// from now on.
pub async fn subscribe(url: &str, subject: &str) -> (async_nats::Client, async_nats::Subscriber) {
    let nc = async_nats::connect(url).await.unwrap();
    let sub = nc.subscribe(subject.to_string()).await.unwrap();
    nc.flush().await.unwrap();
    (nc, sub)
}

pub fn testdata(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("testdata")
        .join(name)
}

pub fn read(name: &str) -> String {
    std::fs::read_to_string(testdata(name)).unwrap()
}

/// A seed for an ed25519 provisioning signer (fast to sign with in debug builds).
pub const SIGNER_SEED: [u8; 32] = [9u8; 32];

/// The simulator's binary on `url` with `TOKEN`, the provisioning signer [`SIGNER_SEED`]
/// (written into `dir`) and its report written to `report`; more arguments follow.
pub fn sim_command(
    url: &str,
    dir: &std::path::Path,
    report: &std::path::Path,
) -> std::process::Command {
    let seed = dir.join("signer.seed");
    std::fs::write(&seed, hex::encode(SIGNER_SEED)).unwrap();
    // `option_env!`: this module is shared with the `drive` example, which has no binary path
    // and finds the simulator on PATH.
    let bin = option_env!("CARGO_BIN_EXE_choria-fleet-sim").unwrap_or("choria-fleet-sim");
    let mut cmd = std::process::Command::new(bin);
    cmd.args(["--broker", url, "--token", TOKEN])
        .arg("--provisioning-signer")
        .arg(&seed)
        .arg("--report")
        .arg(report);
    cmd
}

pub fn config(url: &str, nodes: usize) -> FleetConfig {
    let signer =
        choria_fleet_sim::crypto::JwtSigner::from_key_data(hex::encode(SIGNER_SEED).as_bytes())
            .unwrap();
    let mut cfg = FleetConfig::new(url, nodes, TOKEN, ProvisioningJwt::Sign(signer));
    cfg.rsa_keys_pem = Some(read("rsa-pool.pem"));
    cfg.restart_delay = Duration::from_millis(200);
    cfg.startup_rate = 0;
    cfg
}

/// Insists the simulator's run ended with exit status `code` and its last line of standard error
/// `last`; that standard error.
pub fn assert_sim_ended(out: &std::process::Output, code: i32, last: &str) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(code), "{stderr}");
    assert_eq!(stderr.lines().last(), Some(last), "{stderr}");
    stderr
}

/// The nodes of the simulator's report at `path`.
pub fn read_report(path: &std::path::Path) -> Vec<serde_json::Value> {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

pub async fn start(url: &str, nodes: usize) -> SimFleet {
    SimFleet::start(config(url, nodes)).await.unwrap()
}

pub struct Client {
    pub nc: async_nats::Client,
    pub security: Security,
    pub sender: String,
    /// The collective requests go to (`provisioning` unless changed).
    pub collective: String,
}

impl Client {
    pub async fn v1(url: &str, sender: &str) -> Client {
        Client {
            nc: async_nats::connect(url).await.unwrap(),
            security: Security::insecure(format!("choria={sender}.mcollective")),
            sender: sender.to_string(),
            collective: "provisioning".into(),
        }
    }

    /// A v2 client with a throwaway JWT (provisioning-mode v2 servers do not verify callers).
    pub async fn v2(url: &str, sender: &str) -> Client {
        use choria_crypto::base64url;
        let jwt = format!(
            "{}.{}.{}",
            base64url::encode(r#"{"alg":"EdDSA","typ":"JWT"}"#),
            base64url::encode(format!(
                r#"{{"callerid":"{sender}","purpose":"choria_client_id"}}"#
            )),
            base64url::encode([0u8; 64])
        );
        Client {
            nc: async_nats::connect(url).await.unwrap(),
            security: Security::choria(jwt, [5u8; 32]).unwrap(),
            sender: sender.to_string(),
            collective: "provisioning".into(),
        }
    }

    /// A v1 client signing its requests with the test certificate and key, as a provisioned
    /// server's callers must, on `collective`.
    pub async fn v1_signed(url: &str, sender: &str, collective: &str) -> Client {
        Client {
            nc: async_nats::connect(url).await.unwrap(),
            security: Security::x509_from_pem(
                format!("choria={sender}.mcollective"),
                read("node-cert.pem"),
                &read("node-key.pem"),
            )
            .unwrap(),
            sender: sender.to_string(),
            collective: collective.to_string(),
        }
    }

    /// A v2 client whose caller JWT carries the public key of the seed it signs with.
    pub async fn v2_signed(url: &str, sender: &str, collective: &str) -> Client {
        let seed = [5u8; 32];
        let public = ed25519_dalek::SigningKey::from_bytes(&seed).verifying_key();
        let signer = choria_fleet_sim::crypto::JwtSigner::ed25519(
            ed25519_dalek::SigningKey::from_bytes(&[6u8; 32]),
        );
        let jwt = signer
            .sign(&serde_json::json!({
                "callerid": sender,
                "purpose": "choria_client_id",
                "public_key": hex::encode(public.as_bytes()),
            }))
            .unwrap();
        Client {
            nc: async_nats::connect(url).await.unwrap(),
            security: Security::choria(jwt, seed).unwrap(),
            sender: sender.to_string(),
            collective: collective.to_string(),
        }
    }

    /// Send a request (directed to `target` or broadcast) and collect replies until `want`
    /// arrived or `wait` passed.
    pub async fn request(
        &self,
        target: Option<&str>,
        agent: &str,
        payload: &[u8],
        filter: &Filter,
        want: usize,
        wait: Duration,
    ) -> Vec<Reply> {
        let id = protocol::new_request_id();
        let reply_to = protocol::reply_subject(&self.collective, self.security.caller_id(), &id);
        let mut sub = self.nc.subscribe(reply_to.clone()).await.unwrap();
        let bytes = protocol::encode_request(
            &self.security,
            &OutgoingRequest {
                agent,
                collective: &self.collective,
                payload,
                filter,
                ttl: 60,
                sender: &self.sender,
                id: &id,
                reply_to: &reply_to,
            },
            SystemTime::now(),
        )
        .unwrap();
        let subject = match target {
            Some(t) => protocol::directed_subject(&self.collective, t),
            None => protocol::broadcast_subject(&self.collective, agent),
        };
        self.nc.publish(subject, bytes).await.unwrap();
        self.nc.flush().await.unwrap();
        let mut out = Vec::new();
        let deadline = tokio::time::Instant::now() + wait;
        while out.len() < want {
            match tokio::time::timeout_at(deadline, sub.next()).await {
                Ok(Some(m)) => out.push(protocol::parse_reply(&m.payload).unwrap()),
                _ => break,
            }
        }
        out
    }

    /// Insists a broadcast whose filter matches no node gets no answer.
    pub async fn assert_unmatched_filter_unanswered(&self) {
        let none = self
            .request(
                None,
                "discovery",
                b"cGluZw==",
                &Filter::with_identity("nobody.example.net"),
                1,
                Duration::from_secs(1),
            )
            .await;
        assert!(none.is_empty(), "a filter matching no node was answered");
    }

    pub async fn discover(&self, want: usize, wait: Duration) -> Vec<String> {
        self.request(
            None,
            "discovery",
            protocol::DISCOVERY_PING,
            &Filter::with_agent("choria_provision"),
            want,
            wait,
        )
        .await
        .into_iter()
        .map(|r| r.transport_sender.unwrap_or_default())
        .collect()
    }

    /// A directed RPC to one node; `None` when it did not answer within `wait`.
    pub async fn rpc_wait(
        &self,
        node: &str,
        agent: &str,
        action: &str,
        data: serde_json::Value,
        wait: Duration,
    ) -> Option<(Reply, RpcReply)> {
        let body = choria_rpc_client::mcorpc::encode_request(agent, action, &data).unwrap();
        let r = self
            .request(
                Some(node),
                agent,
                &body,
                &Filter::with_identity(node),
                1,
                wait,
            )
            .await
            .into_iter()
            .next()?;
        let rpc = RpcReply::parse(&r.body).unwrap();
        Some((r, rpc))
    }

    pub async fn rpc(&self, node: &str, action: &str, data: serde_json::Value) -> RpcReply {
        self.rpc_wait(
            node,
            "choria_provision",
            action,
            data,
            Duration::from_secs(10),
        )
        .await
        .unwrap_or_else(|| panic!("{node} did not answer {action}"))
        .1
    }
}
