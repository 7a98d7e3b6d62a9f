//! The puppet security provider end to end: a Puppet-style ssldir made by a test CA, a Choria
//! configuration without any `plugin.security.provider` (so puppet, as in go-choria), a real
//! nats-server that requires TLS with a client certificate from that CA, the provisioner binary
//! and a simulated fleet. The provisioner connects with the certificate, key and CA of its
//! ssldir, signs its requests with that key (protocol v1, caller `choria=<USER>.mcollective`)
//! and provisions the fleet; `check` shows the resolved files and names a missing one by its
//! full path.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use choria_fleet_sim::Mode;
use choria_rpc_client::protocol::{RequestSecurity, ServerRequest};
use common::*;
use futures::StreamExt as _;
use test_support::ca::Issued;

const WAIT: Duration = Duration::from_secs(60);

/// The user the provisioner runs as in these tests, so its certname is `<USER>.mcollective`.
const USER: &str = "puppetprov";
const CERTNAME: &str = "puppetprov.mcollective";

/// A test CA, a broker certificate for 127.0.0.1 and a Puppet ssldir holding the CA as
/// `certs/ca.pem` and the provisioner's certificate and key as `certs/<CERTNAME>.pem` and
/// `private_keys/<CERTNAME>.pem`.
struct Pki {
    ssldir: PathBuf,
    broker: Issued,
    ca: PathBuf,
}

impl Pki {
    fn new(dir: &Path) -> Pki {
        let work = dir.join("pki");
        std::fs::create_dir_all(&work).unwrap();
        let ca = test_ca(&work);
        let broker = ca.issue("localhost", &["127.0.0.1", "localhost"]).unwrap();
        let client = ca.issue(CERTNAME, &[]).unwrap();
        let ssldir = dir.join("puppet/ssl");
        std::fs::create_dir_all(ssldir.join("certs")).unwrap();
        std::fs::create_dir_all(ssldir.join("private_keys")).unwrap();
        std::fs::copy(&ca.cert, ssldir.join("certs/ca.pem")).unwrap();
        std::fs::copy(&client.cert, ssldir.join(format!("certs/{CERTNAME}.pem"))).unwrap();
        let key = ssldir.join(format!("private_keys/{CERTNAME}.pem"));
        std::fs::copy(&client.key, &key).unwrap();
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
        Pki {
            ssldir,
            broker,
            ca: ca.cert,
        }
    }

    fn certificate(&self) -> PathBuf {
        self.ssldir.join(format!("certs/{CERTNAME}.pem"))
    }

    fn key(&self) -> PathBuf {
        self.ssldir.join(format!("private_keys/{CERTNAME}.pem"))
    }

    /// Broker configuration: TLS with a client certificate from the CA required of every TLS
    /// client; the simulated fleet (provisioning-mode servers have no certificate) connects
    /// without TLS.
    fn broker_config(&self) -> String {
        format!(
            "allow_non_tls: true\ntls {{\n  cert_file: \"{}\"\n  key_file: \"{}\"\n  ca_file: \"{}\"\n  verify: true\n  timeout: 5\n}}\n",
            self.broker.cert.display(),
            self.broker.key.display(),
            self.ca.display()
        )
    }
}

/// The provisioner's files: the usual YAML with TLS and signing on, and a Choria configuration
/// with brokers, identity and ssldir only (no security provider: puppet). Its certname comes from
/// `USER`; the sample helper hands the nodes `CHORIA_BROKERS`.
fn prepare(env: &Env, pki: &Pki) -> Launch {
    let mut p = env.plain();
    p.identity = "puppet-prov".into();
    p.jwt_signing_key = None;
    p.choria_insecure = false;
    p.choria_config = Some(format!(
        "identity = puppet-prov\nplugin.choria.middleware_hosts = 127.0.0.1:{}\n\
         plugin.choria.ssldir = {}\n",
        env.nats.port(),
        pki.ssldir.display()
    ));
    env.prepare(&p.env("USER", USER).env("MCOLLECTIVE_CERTNAME", ""))
}

fn check(launch: &Launch) -> (bool, String) {
    let o = launch.command_for("check").output().unwrap();
    (
        o.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        ),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_puppet_provider_connects_with_its_ssldir_and_provisions_the_fleet() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let env = Env::with_broker_config(&pki.broker_config());
    let launch = prepare(&env, &pki);

    let (ok, out) = check(&launch);
    assert!(ok, "{out}");
    test_support::assert_contains_all(
        &out,
        &[
            "security: puppet".to_string(),
            format!("caller: choria={CERTNAME}"),
            format!("ssldir: {} (plugin.choria.ssldir)", pki.ssldir.display()),
            format!("certname: {CERTNAME} (USER, as <USER>.mcollective)"),
            format!("certificate: {}", pki.certificate().display()),
            format!("private key: {}", pki.key().display()),
            format!("CA: {}", pki.ssldir.join("certs/ca.pem").display()),
            "tls: on".to_string(),
        ],
    );

    // Every request the provisioner sends to a node, as the node receives it.
    let seen = Arc::new(Mutex::new(Vec::new()));
    let watcher = async_nats::connect(env.url()).await.unwrap();
    let mut sub = watcher.subscribe("provisioning.node.>").await.unwrap();
    watcher.flush().await.unwrap();
    let collected = seen.clone();
    let watch = tokio::spawn(async move {
        while let Some(m) = sub.next().await {
            collected.lock().unwrap().push(m.payload.to_vec());
        }
    });

    let fleet = env.fleet(env.fleet_config(3, Mode::Plain)).await;
    let mut prov = Prov::launch(&launch);
    prov.wait_ready().await;
    expect_provisioned(&fleet, 3, WAIT, &prov).await;
    prov.assert_provisioned(3.0).await;
    watch.abort();

    let cert_pem = std::fs::read_to_string(pki.certificate()).unwrap();
    let requests = seen.lock().unwrap().clone();
    assert!(!requests.is_empty(), "no directed request seen");
    for bytes in &requests {
        let req = ServerRequest::parse(bytes).unwrap();
        assert_eq!(req.caller, format!("choria={CERTNAME}"), "{}", req.agent);
        match &req.security {
            RequestSecurity::V1 { pubcert, .. } => {
                assert_eq!(pubcert, &cert_pem, "signed with another certificate")
            }
            other => panic!("not a version 1 request: {other:?}"),
        }
        req.verify()
            .unwrap_or_else(|e| panic!("{} request not signed by the ssldir key: {e}", req.agent));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_puppet_file_is_named_by_its_full_path_once_and_stops_the_daemon() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let env = Env::with_broker_config(&pki.broker_config());
    let launch = prepare(&env, &pki);
    std::fs::remove_file(pki.key()).unwrap();

    let (ok, out) = check(&launch);
    assert!(!ok, "{out}");
    let problems: Vec<&str> = out.lines().filter(|l| l.starts_with("problem:")).collect();
    assert_eq!(problems.len(), 1, "{out}");
    let key = pki.key().display().to_string();
    assert!(
        problems[0].contains(&format!(
            "the puppet provider's private key {key} does not exist"
        )),
        "{out}"
    );
    assert!(problems[0].contains(CERTNAME), "{out}");
    assert_eq!(
        out.matches(&key).count(),
        2,
        "the plan's line and the problem:\n{out}"
    );

    // The daemon refuses to start on the same problem, before it connects.
    let mut prov = Prov::launch(&launch);
    let status = prov
        .wait_exit(Duration::from_secs(20))
        .await
        .expect("still running");
    assert!(!status.success());
    let text = prov.output();
    assert!(text.contains("refusing to start"), "{text}");
    assert!(text.contains(&key), "{text}");
}
