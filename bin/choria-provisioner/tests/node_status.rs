//! "Why is node X not provisioned?": the node history through the JSON API, the CLI over it,
//! the audit file and the status page, end to end against a real nats-server, the provisioner
//! binary, real helper processes and simulated fleets with faults.
//!
//! One provisioner meets, in one run, every kind of end a cycle has here: provisioned, deferred
//! and shut down by the helper, upgraded (and then provisioned), refused at the provisioning
//! JWT check, failed at `configure`; each must show the right state, step and cause through
//! `/api/v1/nodes/{identity}`, `choria-provisioner node` and `nodes`, and one audit line.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use choria_fleet_sim::{Mode, ProvisioningJwt};
use common::*;
use serde_json::{json, Value};

const WAIT: Duration = Duration::from_secs(90);

fn get_json(prov: &Prov, path: &str) -> (u16, Value) {
    let (status, body) = prov
        .get(path)
        .unwrap_or_else(|| panic!("GET {path} failed"));
    let v = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path}: {e}: {body}"));
    (status, v)
}

/// Runs the CLI; (success, stdout, stderr).
fn run_cli(args: &[&str]) -> (bool, String, String) {
    let ran = cli(args);
    (ran.ok, ran.stdout, ran.stderr)
}

fn audit_lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("audit line {l:?}: {e}")))
        .collect()
}

async fn wait_state(prov: &Prov, id: &str, state: &str) -> Value {
    let deadline = Instant::now() + WAIT;
    loop {
        let (status, v) = get_json(prov, &format!("/api/v1/nodes/{id}"));
        if status == 200 && v["state"] == state {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "{id} never reached {state}: {status} {v}\n{}",
            prov.output()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kind_of_end_shows_in_the_api_the_cli_and_the_audit_file() {
    let env = Env::new();
    let ids: Vec<String> = ["ok-1", "defer-1", "shutdown-1", "upgrade-1"]
        .iter()
        .map(|n| format!("{n}.example.net"))
        .collect();
    let mut main = env.fleet_config(ids.len(), Mode::Plain);
    main.identities = Some(ids.clone());
    main.upgradable = true;
    let main = env.fleet(main).await;

    // Provisioning JWTs signed by a key the provisioner does not trust.
    let stranger_dir = env.path().join("stranger");
    std::fs::create_dir_all(&stranger_dir).unwrap();
    let stranger = Signer::new(&stranger_dir);
    let mut bad_jwt = env.fleet_config(1, Mode::Plain);
    bad_jwt.identities = Some(vec!["badjwt-1.example.net".into()]);
    bad_jwt.provisioning_jwt = ProvisioningJwt::Sign(stranger.jwt_signer());
    let bad_jwt = env.fleet(bad_jwt).await;

    // A node that aborts every configure.
    let mut cfg_fail = env.fleet_config(1, Mode::Plain);
    cfg_fail.identities = Some(vec!["cfgfail-1.example.net".into()]);
    cfg_fail.faults.fail_action = vec![("configure".into(), 1.0)];
    let cfg_fail = env.fleet(cfg_fail).await;

    let audit = env.path().join("audit.jsonl");
    let opts = env
        .provisioner(format!("{} by-name 0.31.0", test_helper("scenario.py")))
        .yaml("upgrades_repository: https://repo.example.net/choria")
        .yaml(&format!("audit_file: {}", audit.display()))
        .features(&["jwt", "upgrades"]);
    let yaml = env.prepare(&opts).config;
    let mut prov = env.start_ready(&opts).await;
    let monitor = format!("http://127.0.0.1:{}", prov.port);

    // Provisioned (after its upgrade, the upgraded node too).
    expect_provisioned(&main, 2, WAIT, &prov).await;
    let ok = wait_state(&prov, "ok-1.example.net", "provisioned").await;
    assert_eq!(ok["step"], "done");
    assert_eq!(ok["cause"], "");
    assert_eq!(ok["found_by"], "discovery");
    let steps: Vec<&str> = ok["history"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["event"] == "step")
        .map(|e| e["step"].as_str().unwrap())
        .collect();
    assert_eq!(
        steps,
        [
            "choria_provision#jwt",
            "rpcutil#inventory",
            "helper",
            "choria_provision#configure",
            "choria_provision#restart"
        ],
        "{ok}"
    );
    let upgraded = wait_state(&prov, "upgrade-1.example.net", "provisioned").await;
    let finished: Vec<&str> = upgraded["history"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["event"] == "finished")
        .map(|e| e["step"].as_str().unwrap())
        .collect();
    assert_eq!(finished, ["upgraded", "provisioned"], "{upgraded}");

    // Deferred and shut down by the helper, with its message.
    let deferred = wait_state(&prov, "defer-1.example.net", "deferred").await;
    assert_eq!(deferred["step"], "helper");
    assert!(
        deferred["cause"]
            .as_str()
            .unwrap()
            .contains("the CMDB does not know defer-1.example.net yet"),
        "{deferred}"
    );
    assert!(deferred["helper_msg"]
        .as_str()
        .unwrap()
        .contains("does not know"));
    let shut = wait_state(&prov, "shutdown-1.example.net", "shut_down").await;
    assert_eq!(shut["step"], "choria_provision#shutdown");
    assert_eq!(
        shut["helper_msg"], "shutdown-1.example.net is not wanted here",
        "{shut}"
    );

    // Refused at the provisioning JWT check; failed at configure after its five tries.
    let refused = wait_state(&prov, "badjwt-1.example.net", "refused").await;
    assert_eq!(refused["step"], "jwt_check");
    assert!(
        refused["cause"]
            .as_str()
            .unwrap()
            .starts_with("could not validate JWT"),
        "{refused}"
    );
    let failed = wait_state(&prov, "cfgfail-1.example.net", "failed").await;
    assert_eq!(failed["step"], "choria_provision#configure");
    assert!(
        failed["cause"]
            .as_str()
            .unwrap()
            .starts_with("configuration failed: choria_provision#configure failed"),
        "{failed}"
    );
    let configure_step = failed["history"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["step"] == "choria_provision#configure")
        .cloned()
        .unwrap();
    assert_eq!(configure_step["ok"], false);
    assert_eq!(configure_step["tries"], 5, "{configure_step}");

    // The list, filtered and paginated.
    let (_, all) = get_json(&prov, "/api/v1/nodes?limit=2");
    assert_eq!(all["total"], 6, "{all}");
    assert_eq!(all["nodes"].as_array().unwrap().len(), 2);
    let (_, refused_list) = get_json(&prov, "/api/v1/nodes?state=refused");
    let listed: Vec<&str> = refused_list["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["identity"].as_str().unwrap())
        .collect();
    assert_eq!(listed, ["badjwt-1.example.net"]);
    let (status, bad) = get_json(&prov, "/api/v1/nodes?state=sideways");
    assert_eq!(status, 400, "{bad}");
    let (status, _) = get_json(&prov, "/api/v1/nodes/never-seen.example.net");
    assert_eq!(status, 404);

    // The status: role active (no election), counts, the history's cost.
    let (_, st) = get_json(&prov, "/api/v1/status");
    assert_eq!(st["role"], "active", "{st}");
    assert_eq!(st["paused"], false);
    assert_eq!(st["workers"], 4);
    assert_eq!(st["totals"]["provisioned"], prov.m("provisioned") as u64);
    assert_eq!(st["history"]["nodes"], 6);
    let per_node = st["history"]["bytes_per_node"].as_u64().unwrap();
    assert!(
        (200..20_000).contains(&per_node),
        "{per_node} bytes per node"
    );
    assert_eq!(st["history"]["outcomes"]["refused"], 1, "{st}");

    // The CLI, reading the monitor address from the same YAML, and from --monitor.
    let yaml_s = yaml.display().to_string();
    let (ok_run, out, err) = run_cli(&["node", "cfgfail-1.example.net", "--config", &yaml_s]);
    assert!(ok_run, "{err}");
    assert!(out.contains("State           failed"), "{out}");
    assert!(out.contains("choria_provision#configure"), "{out}");
    assert!(
        out.contains("configuration failed: choria_provision#configure failed"),
        "{out}"
    );
    let (ok_run, out, err) = run_cli(&["nodes", "--state", "deferred", "--monitor", &monitor]);
    assert!(ok_run, "{err}");
    let rows: Vec<&str> = out.lines().collect();
    assert!(
        rows[0].starts_with("IDENTITY") && rows[0].contains("CAUSE"),
        "{out}"
    );
    assert_eq!(rows.len(), 2, "{out}");
    assert!(
        rows[1].starts_with("defer-1.example.net  deferred  helper"),
        "{out}"
    );
    let (ok_run, out, err) = run_cli(&[
        "nodes",
        "--json",
        "--state",
        "shut_down",
        "--monitor",
        &monitor,
    ]);
    assert!(ok_run, "{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["nodes"][0]["identity"], "shutdown-1.example.net");
    let (ok_run, out, err) = run_cli(&["status", "--config", &yaml_s]);
    assert!(ok_run, "{err}");
    assert!(out.contains("Role") && out.contains("active"), "{out}");
    let (ok_run, out, _) = run_cli(&["status", "--json", "--monitor", &monitor]);
    assert!(ok_run);
    assert_eq!(
        serde_json::from_str::<Value>(&out).unwrap()["history"]["nodes"],
        6
    );
    let (ok_run, _, err) = run_cli(&["nodes", "--state", "sideways", "--monitor", &monitor]);
    assert!(!ok_run && err.contains("unknown state"), "{err}");
    let (ok_run, _, err) = run_cli(&["node", "never-seen.example.net", "--monitor", &monitor]);
    assert!(!ok_run, "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("not found"), "{err}");

    // The status page lists the recent failures, each linking to its history page.
    let (status, page) = prov.get("/").unwrap();
    assert_eq!(status, 200);
    for id in [
        "cfgfail-1.example.net",
        "badjwt-1.example.net",
        "defer-1.example.net",
    ] {
        assert!(
            page.contains(&format!("href=\"/nodes/{id}\"")),
            "{id}: {page}"
        );
    }
    assert!(!page.contains("href=\"/nodes/ok-1.example.net\""));
    let (status, node_page) = prov.get("/nodes/badjwt-1.example.net").unwrap();
    assert_eq!(status, 200);
    assert!(node_page.contains("jwt_check"), "{node_page}");

    // One audit line per decision, written when made.
    prov.stop_with("TERM").await;
    let lines = audit_lines(&audit);
    let decisions = |id: &str| -> Vec<String> {
        lines
            .iter()
            .filter(|l| l["identity"] == id)
            .map(|l| l["decision"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(decisions("ok-1.example.net"), ["provisioned"]);
    assert_eq!(
        decisions("upgrade-1.example.net"),
        ["upgraded", "provisioned"]
    );
    assert_eq!(decisions("defer-1.example.net"), ["deferred"]);
    assert_eq!(decisions("shutdown-1.example.net"), ["shut_down"]);
    assert_eq!(decisions("badjwt-1.example.net"), ["refused"]);
    assert_eq!(decisions("cfgfail-1.example.net"), ["failed"]);
    let up = lines.iter().find(|l| l["decision"] == "upgraded").unwrap();
    assert_eq!(up["upgrade"]["to"], "0.31.0");
    let refused_line = lines.iter().find(|l| l["decision"] == "refused").unwrap();
    assert_eq!(refused_line["step"], "jwt_check");
    assert_eq!(refused_line["provisioner"], "provisioner1");
    assert_eq!(refused_line["site"], "testsite");
    let text = std::fs::read_to_string(&audit).unwrap();
    assert!(!text.contains(TOKEN), "the token is in the audit file");
    assert!(!text.contains("eyJ"), "a JWT is in the audit file");

    // With the daemon gone the CLI says so on one line and fails.
    let (ok_run, _, err) = run_cli(&["status", "--config", &yaml_s]);
    assert!(!ok_run);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("cannot reach"), "{err}");

    main.shutdown().await;
    bad_jwt.shutdown().await;
    cfg_fail.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_wants_the_token_when_one_is_configured() {
    let env = Env::new();
    let token_file = env.path().join("monitor.token");
    std::fs::write(&token_file, "mon-7d1c2a-token\n").unwrap();
    let opts = env
        .plain()
        .yaml(&format!("monitor_token_file: {}", token_file.display()));
    let yaml = env.prepare(&opts).config;
    let mut prov = env.start_ready(&opts).await;
    for path in ["/", "/api/v1/status", "/api/v1/nodes", "/nodes/x"] {
        let (status, _) = prov.get(path).unwrap();
        assert_eq!(status, 401, "{path}");
    }
    // Metrics and health stay open.
    assert_eq!(prov.get("/metrics").unwrap().0, 200);
    assert_eq!(prov.get("/healthz").unwrap().0, 200);
    // The CLI reads the token file the YAML names.
    let yaml_s = yaml.display().to_string();
    let (ok_run, out, err) = run_cli(&["status", "--json", "--config", &yaml_s]);
    assert!(ok_run, "{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["role"], "active");
    // Without it, one line saying what is missing.
    let monitor = format!("http://127.0.0.1:{}", prov.port);
    let (ok_run, _, err) = run_cli(&["status", "--monitor", &monitor]);
    assert!(!ok_run);
    assert!(err.contains("bearer token"), "{err}");
    prov.stop_with("TERM").await;
    assert!(
        !prov.output().contains("mon-7d1c2a-token"),
        "the token was logged"
    );
}

/// The audit line of the one `provisioned` decision for `id`.
fn provisioned_line<'a>(lines: &'a [Value], id: &str) -> &'a Value {
    let mine: Vec<&Value> = lines
        .iter()
        .filter(|l| l["identity"] == id && l["decision"] == "provisioned")
        .collect();
    assert_eq!(mine.len(), 1, "{id}: {lines:?}");
    mine[0]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pki_records_name_the_certificate_by_serial_and_fingerprint() {
    let env = Env::new();
    let ca = test_ca(env.path());
    let fleet = env.fleet(env.fleet_config(3, Mode::Pki)).await;
    let mut bad_csr = env.fleet_config(1, Mode::Pki);
    bad_csr.identities = Some(vec!["badcsr-1.example.net".into()]);
    bad_csr.faults.bad_csr = 1.0;
    let bad_csr = env.fleet(bad_csr).await;
    let audit = env.path().join("audit.jsonl");
    let opts = env
        .pki_provisioner(example_helper("helper-pki.py"), &ca)
        .yaml(&format!("audit_file: {}", audit.display()));
    let mut prov = env.start_ready(&opts).await;
    expect_provisioned(&fleet, 3, WAIT, &prov).await;
    prov.assert_provisioned(3.0).await;
    let (_, node) = get_json(&prov, &format!("/api/v1/nodes/{}", fleet.identities()[0]));
    let refused = wait_state(&prov, "badcsr-1.example.net", "refused").await;
    assert_eq!(refused["step"], "csr_check", "{refused}");
    assert!(
        refused["cause"]
            .as_str()
            .unwrap()
            .starts_with("invalid CSR: "),
        "{refused}"
    );
    assert!(refused["issued"].is_null(), "{refused}");
    prov.stop_with("TERM").await;
    let lines = audit_lines(&audit);
    for r in fleet.report() {
        let cert = r.received.unwrap().certificate;
        let pem = env.path().join(format!("{}.crt", r.identity));
        std::fs::write(&pem, &cert).unwrap();
        // What openssl says of the certificate the node received.
        let out = run(Command::new("openssl")
            .args([
                "x509",
                "-noout",
                "-serial",
                "-fingerprint",
                "-sha256",
                "-in",
            ])
            .arg(&pem));
        let field = |name: &str| {
            out.lines()
                .find_map(|l| l.strip_prefix(name))
                .unwrap()
                .replace(':', "")
                .to_lowercase()
        };
        let line = provisioned_line(&lines, &r.identity);
        let mut serial = field("serial=");
        // openssl prints the integer, the record its DER bytes (a leading 00 for a high bit).
        let recorded = line["certificate"]["serial"].as_str().unwrap();
        if recorded.len() == serial.len() + 2 {
            serial = format!("00{serial}");
        }
        assert_eq!(recorded, serial, "{line}");
        assert_eq!(
            line["certificate"]["sha256"],
            field("sha256 Fingerprint="),
            "{line}"
        );
        assert!(line["certificate"]["not_after"].is_string(), "{line}");
        assert!(
            !line.to_string().contains("BEGIN"),
            "a certificate in {line}"
        );
    }
    assert_eq!(
        node["issued"]["certificate"]["sha256"]
            .as_str()
            .unwrap()
            .len(),
        64,
        "{node}"
    );
    let refused = lines
        .iter()
        .find(|l| l["identity"] == "badcsr-1.example.net")
        .unwrap();
    assert_eq!(refused["decision"], "refused");
    assert_eq!(refused["step"], "csr_check");
    assert!(refused.get("certificate").is_none(), "{refused}");
    fleet.shutdown().await;
    bad_csr.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ed25519_records_name_the_server_jwt_by_id_and_expiry() {
    let env = Env::new();
    let fleet = env.fleet(env.ed25519_fleet_config(3)).await;
    let mut bad_nonce = env.fleet_config(1, Mode::Ed25519);
    bad_nonce.identities = Some(vec!["badnonce-1.example.net".into()]);
    bad_nonce.faults.bad_nonce = 1.0;
    let bad_nonce = env.fleet(bad_nonce).await;
    let audit = env.path().join("audit.jsonl");
    let opts = env
        .provisioner(example_helper("helper-ed25519.py"))
        .env("CHORIA_ISSUER", env.signer.public_hex.clone())
        .yaml(&format!("audit_file: {}", audit.display()))
        .features(&["ed25519"]);
    let mut prov = env.start_ready(&opts).await;
    expect_provisioned(&fleet, 3, WAIT, &prov).await;
    prov.assert_provisioned(3.0).await;
    let refused = wait_state(&prov, "badnonce-1.example.net", "refused").await;
    assert_eq!(refused["step"], "ed25519_check", "{refused}");
    assert!(
        refused["cause"]
            .as_str()
            .unwrap()
            .starts_with("could not fetch ed25519 public key: "),
        "{refused}"
    );
    prov.stop_with("TERM").await;
    bad_nonce.shutdown().await;
    let lines = audit_lines(&audit);
    assert!(lines
        .iter()
        .any(|l| l["identity"] == "badnonce-1.example.net" && l["step"] == "ed25519_check"));
    for r in fleet.report() {
        let claims = r.received.unwrap().server_jwt_claims.unwrap();
        let line = provisioned_line(&lines, &r.identity);
        assert_eq!(line["server_jwt"]["id"], claims["jti"], "{line}");
        let exp = claims["exp"].as_i64().unwrap();
        let recorded = chrono_like_parse(line["server_jwt"]["expires"].as_str().unwrap());
        assert_eq!(recorded, exp, "{line}");
        assert!(!line.to_string().contains("eyJ"), "a JWT in {line}");
    }
    fleet.shutdown().await;
}

/// Seconds since the epoch of an RFC 3339 UTC time as the API writes it
/// (`YYYY-MM-DDTHH:MM:SS.mmmZ`).
fn chrono_like_parse(t: &str) -> i64 {
    let n = |r: std::ops::Range<usize>| t[r].parse::<i64>().unwrap();
    let (y, m, d) = (n(0..4), n(5..7), n(8..10));
    let (hh, mm, ss) = (n(11..13), n(14..16), n(17..19));
    // Days from civil (H. Hinnant).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    days * 86_400 + hh * 3600 + mm * 60 + ss
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helper_policy_and_node_faults_show_their_step_and_cause() {
    let env = Env::new();
    let ids: Vec<String> = ["ok-2", "fail-2", "deny-2"]
        .iter()
        .map(|n| format!("{n}.example.net"))
        .collect();
    let mut main = env.fleet_config(ids.len(), Mode::Plain);
    main.identities = Some(ids);
    let main = env.fleet(main).await;
    // Replies that are not JSON.
    let mut garbage = env.fleet_config(1, Mode::Plain);
    garbage.identities = Some(vec!["garbage-2.example.net".into()]);
    garbage.faults.garbage = 1.0;
    let garbage = env.fleet(garbage).await;
    // A node that answers discovery and nothing else.
    let mut silent = env.fleet_config(1, Mode::Plain);
    silent.identities = Some(vec!["silent-2.example.net".into()]);
    silent.faults.drop = 1.0;
    let silent = env.fleet(silent).await;

    let policy = env.path().join("deny.rego");
    std::fs::write(
        &policy,
        "package choria.provisioner\n\n\
         default decision := {\"allow\": true}\n\n\
         decision := {\"allow\": false, \"reason\": \"deny- nodes are not wanted\"} if startswith(input.identity, \"deny-\")\n",
    )
    .unwrap();
    let audit = env.path().join("audit.jsonl");
    let opts = env
        .provisioner(format!("{} by-name", test_helper("scenario.py")))
        .yaml(&format!("rego_policy: {}", policy.display()))
        .yaml(&format!("audit_file: {}", audit.display()));
    let mut prov = env.start_ready(&opts).await;
    let monitor = format!("http://127.0.0.1:{}", prov.port);

    wait_state(&prov, "ok-2.example.net", "provisioned").await;
    let helper = wait_state(&prov, "fail-2.example.net", "failed").await;
    assert_eq!(helper["step"], "helper", "{helper}");
    let cause = helper["cause"].as_str().unwrap();
    assert!(
        cause.starts_with("could not invoke configure helper")
            && cause.contains("cannot reach the CMDB"),
        "the helper's stderr is in the cause: {helper}"
    );
    let denied = wait_state(&prov, "deny-2.example.net", "refused").await;
    assert_eq!(denied["step"], "policy", "{denied}");
    assert_eq!(
        denied["cause"],
        "refused by policy: deny- nodes are not wanted"
    );
    let policy_step = denied["history"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["step"] == "policy")
        .cloned()
        .unwrap();
    assert_eq!(policy_step["ok"], false);
    assert!(denied["history"]
        .as_array()
        .unwrap()
        .iter()
        .all(|e| e["step"] != "helper"));
    let bad = wait_state(&prov, "garbage-2.example.net", "failed").await;
    assert_eq!(bad["step"], "choria_provision#jwt", "{bad}");
    assert!(
        bad["cause"].as_str().unwrap().starts_with(
            "could not fetch and validate JWT: garbage-2.example.net: choria_provision#jwt failed"
        ),
        "{bad}"
    );

    // Three tries of at most 10 s each with back-off in between.
    let timed_out = wait_state(&prov, "silent-2.example.net", "failed").await;
    assert_eq!(timed_out["step"], "choria_provision#jwt", "{timed_out}");
    assert!(
        timed_out["cause"].as_str().unwrap().ends_with("timeout"),
        "{timed_out}"
    );
    let jwt_step = timed_out["history"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["event"] == "step")
        .cloned()
        .unwrap();
    assert_eq!(jwt_step["tries"], 3, "{jwt_step}");
    assert!(
        jwt_step["elapsed_ms"].as_u64().unwrap() >= 30_000,
        "{jwt_step}"
    );

    let (ok_run, out, err) = run_cli(&["nodes", "--state", "refused", "--monitor", &monitor]);
    assert!(ok_run, "{err}");
    assert!(out.contains("deny-2.example.net  refused  policy"), "{out}");
    let (ok_run, out, err) = run_cli(&["node", "fail-2.example.net", "--monitor", &monitor]);
    assert!(ok_run, "{err}");
    assert!(out.contains("cannot reach the CMDB"), "{out}");

    prov.stop_with("TERM").await;
    let lines = audit_lines(&audit);
    let line = |id: &str| {
        lines
            .iter()
            .find(|l| l["identity"] == id)
            .unwrap_or_else(|| panic!("{id}: {lines:?}"))
            .clone()
    };
    assert_eq!(line("fail-2.example.net")["decision"], "failed");
    assert_eq!(line("fail-2.example.net")["step"], "helper");
    assert_eq!(line("deny-2.example.net")["decision"], "refused");
    assert_eq!(line("deny-2.example.net")["step"], "policy");
    assert_eq!(line("garbage-2.example.net")["decision"], "failed");
    assert_eq!(
        line("garbage-2.example.net")["step"],
        "choria_provision#jwt"
    );
    // A node that never answered decided nothing: it is in the minute's summary by name.
    let summary = lines
        .iter()
        .find(|l| l["decision"] == "undecided")
        .unwrap_or_else(|| panic!("no summary: {lines:?}"));
    assert_eq!(summary["count"], 1, "{summary}");
    assert_eq!(summary["step"], "choria_provision#jwt", "{summary}");
    assert_eq!(
        summary["examples"],
        json!(["silent-2.example.net"]),
        "{summary}"
    );
    assert!(lines
        .iter()
        .all(|l| l["identity"] != "silent-2.example.net"));
    main.shutdown().await;
    garbage.shutdown().await;
    silent.shutdown().await;
}
