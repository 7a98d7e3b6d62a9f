//! What a client holding only a `provisioning.jwt` (every server waiting to be provisioned has
//! one) can do to the provisioner's shared state on a real Choria broker (go-choria, as `cargo
//! xtask interop` builds it): it lands in the `provisioning` account with the permissions
//! go-choria gives it, so every write to the election bucket, the active-active claims bucket
//! and the audit stream, through the `choria.streams` import or directly, is refused by the
//! broker as a permissions violation; and the provisioner's own election still works beside it.
#![allow(clippy::unwrap_used)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use choria_rpc_client::election::{self, Election, ElectionError};
use test_support::go_env::{self, EnvOptions, GoEnv};
use test_support::Mode;
use tokio_util::sync::CancellationToken;

/// The subjects a forger would write, and why each matters.
const FORGED: [(&str, &str); 8] = [
    (
        "choria.streams.$KV.CHORIA_LEADER_ELECTION.provisioner",
        "the election through the import",
    ),
    ("$KV.CHORIA_LEADER_ELECTION.provisioner", "the election"),
    (
        "choria.streams.STREAM.INFO.KV_CHORIA_LEADER_ELECTION",
        "the JetStream API through the import",
    ),
    (
        "$JS.API.STREAM.INFO.KV_CHORIA_PROVISIONER_CLAIMS",
        "the account's own JetStream API",
    ),
    (
        "$KV.CHORIA_PROVISIONER_CLAIMS.replica.forged",
        "a forged active-active heartbeat",
    ),
    (
        "choria.streams.$KV.CHORIA_PROVISIONER_CLAIMS.node.n1",
        "a forged claim through the import",
    ),
    ("choria.provisioner.audit", "the audit stream"),
    (
        "$JS.API.STREAM.CREATE.CHORIA_PROVISIONER_AUDIT",
        "creating a stream",
    ),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provisioning_client_cannot_touch_the_election_claims_or_audit() {
    let choria = go_env::require_choria_bin();
    let dir = tempfile::tempdir().unwrap();
    let env = GoEnv::start(
        &choria,
        &EnvOptions {
            dir: dir.path().to_path_buf(),
            servers: 0,
            mode: Mode::Plain,
            wait: false,
            default_provisioning: false,
        },
    )
    .unwrap_or_else(|e| panic!("the go-choria environment did not start: {e}"));
    let get = |k: &str| env.get(k).unwrap_or_else(|| panic!("no {k}")).to_string();
    let url = format!("tls://127.0.0.1:{}", get("broker_port"));
    let jwt = std::fs::read_to_string(get("provisioning_jwt")).unwrap();

    // Connected as a server in provisioning mode connects: TLS without a client certificate,
    // the provisioning JWT as the token.
    let violations = Arc::new(Mutex::new(Vec::<String>::new()));
    let seen = Arc::clone(&violations);
    let hostile = async_nats::ConnectOptions::with_token(jwt.trim().to_string())
        .require_tls(true)
        .add_root_certificates(get("tls_ca").into())
        .event_callback(move |event| {
            let seen = Arc::clone(&seen);
            async move {
                if let async_nats::Event::ServerError(e) = event {
                    seen.lock().unwrap().push(e.to_string());
                }
            }
        })
        .connect(&url)
        .await
        .unwrap_or_else(|e| panic!("a provisioning-mode client cannot connect: {e}"));

    // The provisioner's own election runs beside the forger.
    let client_cfg =
        choria_rpc_client::config::ChoriaConfig::load(get("client_config").as_ref()).unwrap();
    let settings =
        choria_rpc_client::connection::ConnectionSettings::from_config(&client_cfg).unwrap();
    let provisioner = choria_rpc_client::connection::connect(&settings)
        .await
        .unwrap_or_else(|e| panic!("the provisioner cannot connect: {e}"));
    let cancel = CancellationToken::new();
    let elected = Election::choose(
        provisioner.clone(),
        election::PROVISIONER_ELECTION,
        "prov.example.net",
        &election::backoff::FIVE_SEC,
        &cancel,
    )
    .await
    .unwrap()
    .expect("an election");

    for (subject, _) in FORGED {
        hostile
            .publish(subject, "forged r-x.example.net".into())
            .await
            .unwrap();
    }
    // Allowed to a server, as a control: no violation for it.
    hostile
        .publish(
            "choria.lifecycle.event.startup.provision_mode_server",
            "{}".into(),
        )
        .await
        .unwrap();
    hostile.flush().await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let got = violations.lock().unwrap().clone();
        let missing: Vec<&str> = FORGED
            .iter()
            .filter(|(s, _)| !got.iter().any(|v| v.contains(s)))
            .map(|(s, _)| *s)
            .collect();
        if missing.is_empty() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the broker did not refuse {missing:?}; it said {got:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let got = violations.lock().unwrap().clone();
    assert!(
        got.iter()
            .all(|v| v.to_lowercase().contains("permissions violation")),
        "{got:?}"
    );
    assert!(
        !got.iter().any(|v| v.contains("choria.lifecycle")),
        "the control publish was refused: {got:?}"
    );

    // The election bucket answers the provisioner: it opens and campaigns through the import.
    // The broker makes its buckets once it is up (the environment was not waited for), so a
    // missing bucket is asked again, as the daemon's election does.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let info = loop {
        match elected.open().await {
            Err(ElectionError::BucketNotFound { .. }) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            other => break other,
        }
    };
    assert!(
        info.is_ok(),
        "the provisioner cannot open its election: {info:?}"
    );
    cancel.cancel();
}
