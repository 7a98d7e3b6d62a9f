//! The daemon's monitor listener: where it binds (`monitor_address`), what `check` says about
//! it and the identity and CSR name rules.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream};
use std::process::Command;
use std::time::Duration;

use common::*;

fn get(addr: SocketAddr, path: &str) -> std::io::Result<u16> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    s.set_read_timeout(Some(Duration::from_secs(3)))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )?;
    let mut buf = String::new();
    s.read_to_string(&mut buf)?;
    buf.split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("not an HTTP answer: {buf:?}")))
}

fn ipv6_loopback_available() -> bool {
    std::net::TcpListener::bind((Ipv6Addr::LOCALHOST, 0)).is_ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_monitor_address_ipv4_and_ipv6_clients_are_answered() {
    let env = Env::new();
    let mut prov = env.start(&ProvOptions::new(example_helper("helper-plain.py")));
    prov.wait_ready().await;
    let port = prov.port;
    let out = prov.output();
    let v6 = ipv6_loopback_available();
    if v6 {
        assert!(
            out.contains(&format!(
                "serving /metrics, /healthz and /readyz on [::]:{port} (every interface, IPv4 and IPv6)"
            )),
            "{out}"
        );
    }
    let (v4_status, v6_status) = tokio::task::spawn_blocking(move || {
        (
            get((Ipv4Addr::LOCALHOST, port).into(), "/healthz").unwrap(),
            v6.then(|| get((Ipv6Addr::LOCALHOST, port).into(), "/metrics").unwrap()),
        )
    })
    .await
    .unwrap();
    assert_eq!(v4_status, 200);
    if v6 {
        assert_eq!(v6_status, Some(200), "no answer on [::1]:{port}");
    }
    prov.stop_with("TERM").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn monitor_address_binds_that_address_only() {
    let env = Env::new();
    let opts =
        ProvOptions::new(example_helper("helper-plain.py")).yaml("monitor_address: 127.0.0.1");
    let mut prov = env.start(&opts);
    prov.wait_ready().await;
    let port = prov.port;
    assert!(
        prov.output().contains(&format!(
            "serving /metrics, /healthz and /readyz on 127.0.0.1:{port}\n"
        )),
        "{}",
        prov.output()
    );
    let v6 = ipv6_loopback_available();
    let (v4, v6_err) = tokio::task::spawn_blocking(move || {
        (
            get((Ipv4Addr::LOCALHOST, port).into(), "/healthz").unwrap(),
            v6.then(|| get((Ipv6Addr::LOCALHOST, port).into(), "/healthz").unwrap_err()),
        )
    })
    .await
    .unwrap();
    assert_eq!(v4, 200);
    if let Some(e) = v6_err {
        assert_eq!(e.kind(), ErrorKind::ConnectionRefused, "{e}");
    }
    prov.stop_with("TERM").await;
}

#[test]
fn check_prints_the_monitor_address_and_the_identity_and_csr_name_rules() {
    let dir = tempfile::tempdir().unwrap();
    let signer = Signer::new(dir.path());
    let cfg = dir.path().join("c.cfg");
    std::fs::write(
        &cfg,
        "identity = prov1.example.net\nplugin.choria.middleware_hosts = nats://broker.example.net:4222\n",
    )
    .unwrap();
    let base = format!(
        "helper: {}\ntoken: x\nchoria_insecure: true\njwt_verify_cert: {}\nmonitor_port: 9100\n\
         features:\n  jwt: true\n",
        example_helper("helper-plain.py"),
        signer.public_hex
    );
    let run = |extra: &str| {
        let yaml = dir.path().join("p.yaml");
        std::fs::write(&yaml, format!("{base}{extra}")).unwrap();
        let o = Command::new(BIN)
            .arg("check")
            .arg("--config")
            .arg(&yaml)
            .arg("--choria-config")
            .arg(&cfg)
            .output()
            .unwrap();
        let out = String::from_utf8_lossy(&o.stdout).into_owned();
        assert!(
            o.status.success(),
            "{out}{}",
            String::from_utf8_lossy(&o.stderr)
        );
        out
    };
    let out = run("");
    for want in [
        "monitoring: port 9100 on every interface, IPv4 and IPv6 (monitor_address unset)",
        "identities: the built-in grammar",
        "extra CSR DNS names: none (every DNS name must be the identity)",
    ] {
        assert!(out.contains(want), "{want:?} missing:\n{out}");
    }
    let out = run(
        "monitor_address: 10.1.2.3\nidentity_pattern: '[a-z0-9-]+\\.lab'\n\
         csr_extra_dns_names: '[a-z0-9-]+\\.svc\\.lab'\n",
    );
    for want in [
        "monitoring: port 9100 on 10.1.2.3 (monitor_address)",
        "identities: identity_pattern \"[a-z0-9-]+\\\\.lab\"",
        "extra CSR DNS names: csr_extra_dns_names \"[a-z0-9-]+\\\\.svc\\\\.lab\"",
    ] {
        assert!(out.contains(want), "{want:?} missing:\n{out}");
    }
}
