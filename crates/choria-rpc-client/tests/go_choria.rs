//! Against the real thing: a go-choria broker and go-choria servers in provisioning mode,
//! started by test-support's Go environment (the Choria test peer built from go-choria by
//! `cargo xtask test` or `cargo xtask peers`). Our discovery finds them, our `rpcutil#inventory`
//! and `choria_provision#jwt` requests get their real replies, and a real server's startup
//! lifecycle event parses.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use choria_rpc_client::config::ChoriaConfig;
use choria_rpc_client::lifecycle::EventFormat;
use choria_rpc_client::rpc::{RequestErrorKind, RpcClient};
use test_support::go_env::{self, EnvOptions, GoEnv};
use test_support::Mode;

/// A running Go environment in a temporary directory, stopped on drop.
struct PeerEnv {
    env: GoEnv,
    _dir: tempfile::TempDir,
}

impl PeerEnv {
    fn start(servers: usize) -> Self {
        let choria = go_env::require_choria_bin();
        let dir = tempfile::tempdir().unwrap();
        let opts = EnvOptions {
            dir: dir.path().to_path_buf(),
            servers,
            mode: Mode::Plain,
            wait: true,
            default_provisioning: false,
        };
        let env = GoEnv::start(&choria, &opts)
            .unwrap_or_else(|e| panic!("the go-choria environment did not start: {e}"));
        PeerEnv { env, _dir: dir }
    }

    fn get(&self, k: &str) -> &str {
        self.env
            .get(k)
            .unwrap_or_else(|| panic!("env.conf has no {k}"))
    }

    fn servers(&self) -> Vec<String> {
        self.env.identities.clone()
    }

    /// The pid of a process the environment started, by name.
    fn pid_of(&self, name: &str) -> u32 {
        self.env
            .pid_of(name)
            .unwrap_or_else(|| panic!("no process {name} in the environment"))
    }
}

/// Restart a server process exactly as it was started (same program, arguments, environment
/// and directory): a real go-choria server then publishes a fresh startup event.
fn restart_process(pid: u32) -> std::process::Child {
    let split = |p: &Path| -> Vec<String> {
        std::fs::read(p)
            .unwrap()
            .split(|b| *b == 0)
            .filter(|s| !s.is_empty())
            .map(|s| String::from_utf8_lossy(s).into_owned())
            .collect()
    };
    let proc = PathBuf::from(format!("/proc/{pid}"));
    let argv = split(&proc.join("cmdline"));
    let env = split(&proc.join("environ"));
    let cwd = std::fs::read_link(proc.join("cwd")).unwrap();
    let exe = std::fs::read_link(proc.join("exe")).unwrap();
    let _ = Command::new("kill")
        .arg("-KILL")
        .arg(pid.to_string())
        .status();
    std::thread::sleep(Duration::from_millis(300));
    let mut cmd = Command::new(exe);
    cmd.args(&argv[1..]).env_clear().current_dir(cwd);
    for kv in env {
        if let Some((k, v)) = kv.split_once('=') {
            cmd.env(k, v);
        }
    }
    cmd.stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_go_choria_servers_answer_discovery_inventory_and_jwt() {
    let env = PeerEnv::start(2);
    let cfg = ChoriaConfig::load(Path::new(env.get("client_config"))).unwrap();
    let client = RpcClient::connect(&cfg)
        .await
        .expect("connect to the real Choria broker over mTLS");

    let mut found = client.discover_provisionable().await.unwrap().to_vec();
    found.sort();
    let mut want = env.servers();
    want.sort();
    assert_eq!(
        found, want,
        "discovery must find every real provisioning-mode server"
    );
    // go-choria matches `/.../` identity filters as expressions: the shards of a sharded
    // discovery find the same servers between them.
    for shards in [2, 3] {
        let mut by_shards = client
            .discover_provisionable_in(shards)
            .await
            .unwrap()
            .to_vec();
        by_shards.sort();
        assert_eq!(by_shards, want, "a discovery in {shards} shards");
    }

    let node = &want[0];
    let inv = client
        .inventory(node, Duration::from_secs(4))
        .await
        .unwrap();
    assert!(
        inv.agents.contains(&"choria_provision".to_string()),
        "agents: {:?}",
        inv.agents
    );
    assert_eq!(inv.main_collective, "provisioning");
    assert!(!inv.version.is_empty());
    assert_eq!(inv.raw["version"], inv.version.as_str());

    let token = env.get("token");
    let jwt = client
        .provision_jwt(node, token, Duration::from_secs(22))
        .await
        .unwrap();
    let on_disk = std::fs::read_to_string(env.get("provisioning_jwt")).unwrap();
    assert_eq!(
        jwt.jwt, on_disk,
        "the jwt action returns the provisioning.jwt verbatim"
    );
    assert_eq!(jwt.ecdh_public.len(), 64);
    assert!(jwt.ecdh_public.bytes().all(|b| b.is_ascii_hexdigit()));

    // An identity no server has: the Choria broker answers our request with a no-responders
    // status at once (the servers ignore the NATS reply subject and answer the envelope's).
    let start = std::time::Instant::now();
    let err = client
        .provision_jwt("nobody.example.net", token, Duration::from_secs(22))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), &RequestErrorKind::NoResponders, "{err}");
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(client.stats().no_responders, 1);

    // A wrong token is refused with go-choria's message, as a typed aborted error.
    let err = client
        .provision_jwt(node, "wrong", Duration::from_secs(22))
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("Incorrect provision token supplied"),
        "{err}"
    );

    // A server that starts publishes a startup event we parse.
    let mut events = client
        .subscribe_lifecycle("startup", "provision_mode_server", None)
        .await
        .unwrap();
    let mut child = restart_process(env.pid_of(node));
    let ev = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let ev = events.next().await.expect("event stream ended");
            if &ev.event.identity == node {
                return ev;
            }
        }
    })
    .await
    .expect("no startup event from the restarted server within 30s");
    assert_eq!(ev.event.component, "provision_mode_server");
    assert_eq!(ev.event.event_type(), "startup");
    assert_eq!(
        ev.format,
        EventFormat::CloudEvent,
        "go-choria servers publish CloudEvents by default"
    );
    let _ = child.kill();
    let _ = child.wait();
}

/// Where the captured request fixtures live.
fn captured_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/captured")
}

/// Check a request captured on the wire: it decodes as a v1 request from the provisioner to the
/// node, and its signature (or insecure marker) is what the sender's security mode makes.
fn check_captured(bytes: &[u8], node: &str, sender: &str) -> choria_rpc_client::protocol::Request {
    use choria_rpc_client::mcorpc::RpcRequest;
    use choria_rpc_client::protocol::{ProtocolVersion, ServerRequest};
    let req = ServerRequest::parse(bytes).expect("a captured request decodes");
    assert_eq!(req.version, ProtocolVersion::V1);
    assert_eq!(req.agent, "rpcutil");
    assert_eq!(req.collective, "provisioning");
    assert_eq!(req.sender, sender);
    assert!(req
        .reply_to
        .as_deref()
        .is_some_and(|r| r.starts_with("provisioning.reply.")));
    assert!(req.filter.identity.iter().any(|i| i == node) || req.filter.identity.is_empty());
    let body = RpcRequest::parse(&req.payload).expect("the RPC body decodes");
    assert_eq!(body.action, "ping");
    req.verify().expect("the signature verifies");
    req
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_captured_from_the_go_cli_and_from_us_decode_on_the_other_side() {
    let env = PeerEnv::start(1);
    let node = env.servers()[0].clone();
    let cfg = ChoriaConfig::load(Path::new(env.get("client_config"))).unwrap();
    let client = RpcClient::connect(&cfg).await.unwrap();
    let mut wire = client
        .nats()
        .subscribe(format!("provisioning.node.{node}"))
        .await
        .unwrap();
    choria_rpc_client::connection::round_trip(client.nats(), Duration::from_secs(5))
        .await
        .unwrap();
    let sender = env.get("client_identity").to_string();

    // The go-choria CLI's request, decoded by us.
    test_support::stack::run(
        Command::new(env.get("choria"))
            .args([
                "req",
                "rpcutil",
                "ping",
                "--json",
                "-I",
                &node,
                "--config",
                env.get("client_config"),
            ])
            .env("USER", "root"),
    )
    .unwrap();
    let theirs = tokio::time::timeout(Duration::from_secs(10), futures::StreamExt::next(&mut wire))
        .await
        .expect("the CLI's request was not seen on the wire")
        .unwrap();
    check_captured(&theirs.payload, &node, &sender);

    // Ours, decoded and answered by the real server (the reply proves it accepted the request).
    let data = client
        .call(
            &node,
            "rpcutil",
            "ping",
            &serde_json::json!({}),
            Duration::from_secs(4),
        )
        .await
        .expect("the real server answers our request");
    assert!(data["pong"].as_i64().is_some(), "{data}");
    let ours = tokio::time::timeout(Duration::from_secs(5), futures::StreamExt::next(&mut wire))
        .await
        .unwrap()
        .unwrap();
    check_captured(&ours.payload, &node, &cfg.identity);

    if std::env::var_os("CHORIA_UPDATE_FIXTURES").is_some() {
        std::fs::create_dir_all(captured_dir()).unwrap();
        std::fs::write(
            captured_dir().join("go-choria-cli-request-v1.json"),
            &theirs.payload,
        )
        .unwrap();
        std::fs::write(
            captured_dir().join("rust-client-request-v1.json"),
            &ours.payload,
        )
        .unwrap();
    }
}

/// The captured fixtures stay decodable: the Go CLI's request (x509-signed) and ours.
#[test]
fn captured_fixtures_decode() {
    let theirs = std::fs::read(captured_dir().join("go-choria-cli-request-v1.json")).unwrap();
    let req = check_captured(&theirs, "node1.example.net", "provisioner.mcollective");
    assert!(req.caller.starts_with("choria="), "{}", req.caller);
    let ours = std::fs::read(captured_dir().join("rust-client-request-v1.json")).unwrap();
    check_captured(&ours, "node1.example.net", "provisioner.mcollective");
}
