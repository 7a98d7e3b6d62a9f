//! The packaged configuration closes the status API: the daemon started from
//! `packaging/choria-provisioner.yaml` (its paths moved into a temporary directory, a free port
//! in place of 8080) answers `/api/v1/nodes` to loopback only, refuses a foreign `Host`, marks
//! its answers `Cache-Control: no-store`, and still serves `/metrics` to everyone.
#![allow(clippy::unwrap_used)]

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use test_support::ProcessGuard;

const BIN: &str = env!("CARGO_BIN_EXE_choria-provisioner");

fn get(addr: SocketAddr, path: &str, host: &str) -> Option<(u16, String)> {
    test_support::metrics::http_get_raw(addr, path, host, Duration::from_secs(5)).ok()
}

/// A non-loopback address of this host, if it has one.
fn lan_address() -> Option<IpAddr> {
    let out = std::process::Command::new("ip")
        .args(["-4", "-o", "addr", "show", "scope", "global"])
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .skip_while(|w| *w != "inet")
        .nth(1)
        .and_then(|c| c.split('/').next())
        .and_then(|a| a.parse().ok())
}

#[test]
fn the_packaged_configuration_serves_the_api_to_loopback_only() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display().to_string();
    let nats = test_support::NatsServer::start();
    let port = test_support::free_port();
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let packaged = std::fs::read_to_string(root.join("packaging/choria-provisioner.yaml")).unwrap();
    let helper = dir.path().join("helper");
    test_support::write_executable(&helper, "#!/bin/sh\necho '{}'\n").unwrap();
    let yaml = packaged
        .replace("/var/log/choria-provisioner", &d)
        .replace("/etc/choria-provisioner/helper", &helper.display().to_string())
        .replace("monitor_port: 8080", &format!("monitor_port: {port}"))
        .replace("token: \"change me\"", "token: s3cret")
        + "choria_insecure: true\n"
        // The package leaves the verification key for the site to set.
        + &format!("jwt_verify_cert: {}\n", "cd".repeat(32));
    assert!(
        !yaml
            .lines()
            .any(|l| l.trim_start().starts_with("monitor_token_file:")),
        "the package sets no token"
    );
    std::fs::write(dir.path().join("p.yaml"), &yaml).unwrap();
    std::fs::write(
        dir.path().join("c.cfg"),
        format!(
            "identity = p1.example.net\nplugin.choria.middleware_hosts = {}\n",
            nats.url()
        ),
    )
    .unwrap();
    let mut cmd = std::process::Command::new(BIN);
    cmd.args(["run", "--config", &format!("{d}/p.yaml"), "--choria-config"])
        .arg(format!("{d}/c.cfg"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    let _daemon = ProcessGuard::spawn("provisioner", &mut cmd).unwrap();
    let lo = SocketAddr::from(([127, 0, 0, 1], port));
    let host = format!("127.0.0.1:{port}");
    let started = Instant::now();
    while get(lo, "/healthz", &host).is_none() {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the daemon never listened"
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    let (status, raw) = get(lo, "/api/v1/nodes", &host).unwrap();
    assert_eq!(status, 200, "{raw}");
    assert!(
        raw.to_lowercase().contains("cache-control: no-store"),
        "{raw}"
    );
    let (status, raw) = get(lo, "/api/v1/nodes", "rebound.example.com").unwrap();
    assert_eq!(status, 403, "{raw}");
    if let Some(ip) = lan_address() {
        let lan = SocketAddr::new(ip, port);
        let (status, raw) = get(lan, "/api/v1/nodes", &format!("{ip}:{port}")).unwrap();
        assert_eq!(status, 403, "{raw}");
        assert!(raw.contains("monitor_token_file"), "{raw}");
        assert!(
            raw.to_lowercase().contains("cache-control: no-store"),
            "{raw}"
        );
        let (status, _) = get(lan, "/metrics", &format!("{ip}:{port}")).unwrap();
        assert_eq!(status, 200);
    } else {
        test_support::skip_unless_ci("no LAN address for the checks from another address");
    }
}
