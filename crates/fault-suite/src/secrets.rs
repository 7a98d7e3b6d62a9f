//! Secrets: a full provisioning at debug level with every secret set to a unique marker.

use std::process::Command;

use anyhow::{ensure, Context, Result};
use serde_json::Value;
use test_support::ca::{KeyFormat, TestCa};
use test_support::metrics::scrape as scrape_all;
use test_support::Mode;

use choria_crypto::jwt;

use crate::harness::{setup, Env, Setup};
use crate::helper_faults::shipped;
use crate::jwt_faults::{signer, unix_now};

pub fn secrets(env: &Env, name: &str) -> Result<String> {
    let dir = env.base.join(name);
    let inputs = dir.join("helper-inputs");
    std::fs::create_dir_all(&inputs)?;
    // A key the helper supplies for every node (sent to the node encrypted), PKCS#1 as helpers
    // built on openssl or cfssl print it; go-choria only takes a key together with a
    // certificate, CA and SSL directory.
    // Its CA has a directory of its own, apart from the run's (made by the demo helper).
    let ca_dir = dir.join("helper-ca");
    std::fs::create_dir_all(&ca_dir)?;
    let ca = TestCa::new(&ca_dir)?;
    let issued = ca.issue_as("helper", "secrets", &[], KeyFormat::Pkcs1)?;
    let (key, cert) = (issued.key, issued.cert);
    let key_pem = std::fs::read_to_string(&key)?;
    let key_marker = key_pem.lines().nth(2).context("short key PEM")?.to_string();
    let helper = dir.join("helper.py");
    test_support::write_executable(
        &helper,
        &shipped("record-and-add-key.py")?
            .replace(
                "@DEMO@",
                &env.bins.join("choria-demo-helper").display().to_string(),
            )
            .replace("@INPUTS@", &inputs.display().to_string())
            .replace("@KEY@", &key.display().to_string())
            .replace("@CERT@", &cert.display().to_string())
            .replace("@CA@", &ca.cert.display().to_string()),
    )?;
    let token = "tok-MARKER-3c9e1f27";
    let broker_pw = "bpw-MARKER-8d41a0c5";
    let node_pw = "npw-MARKER-62f0b9d3";
    let helper_s = helper.display().to_string();
    let audit = dir.join("audit.jsonl");
    let extra = format!(
        "broker_provisioning_password: {broker_pw}\naudit_file: {}\n",
        audit.display()
    );
    let mut run = setup(
        env,
        name,
        Setup {
            mode: Mode::Ed25519,
            helper: Some(&helper_s),
            extra_yaml: &extra,
            ..Setup::default()
        },
    )?;
    run.provisioner.token = token.to_string();
    run.provisioner.args.push("--debug".into());
    let seed = std::fs::read_to_string(&run.files.signer_seed)?
        .trim()
        .to_string();

    // A genuine provisioning JWT carrying the nodes' broker credentials.
    let now = unix_now();
    let claims = serde_json::json!({
        "cht": token, "chs": false, "chu": run.url, "chpd": true,
        "chusr": "nodes", "chpwd": node_pw,
        "extensions": null, "ou": "choria", "purpose": "choria_provisioning",
        "iss": "Choria Tokens Package", "sub": "choria_provisioning",
        "exp": now + 3600, "nbf": now, "iat": now, "jti": "secrets"
    });
    let prov_token = jwt::sign(&claims, &signer(&run.files.signer_seed)?)?;
    let sig = prov_token
        .rsplit('.')
        .next()
        .unwrap_or_default()
        .to_string();
    let prov_jwt = dir.join("provisioning.jwt");
    std::fs::write(&prov_jwt, &prov_token)?;

    let p = run.start_provisioner("provisioner")?;
    let nodes = 8;
    let flags = vec![
        "--provisioning-jwt".to_string(),
        prov_jwt.display().to_string(),
    ];
    let sim = run.start_sim("run", "n", nodes, &flags)?;
    run.wait_provisioned(p, "the fleet", nodes as f64)?;
    let metrics = scrape_all(run.provisioners[p].port);
    // The node history: the status page, the API's list and every node's history.
    let port = run.provisioners[p].port;
    let get = |path: &str| {
        test_support::metrics::http_get(port, path)
            .map(|(_, body)| body)
            .unwrap_or_default()
    };
    let mut history = get("/") + &get("/api/v1/status") + &get("/api/v1/nodes?limit=500");
    let listed: Value = serde_json::from_str(&get("/api/v1/nodes?limit=500")).unwrap_or_default();
    let mut histories = 0;
    for n in listed["nodes"].as_array().into_iter().flatten() {
        let id = n["identity"].as_str().unwrap_or_default();
        history += &get(&format!("/api/v1/nodes/{id}"));
        history += &get(&format!("/nodes/{id}"));
        histories += 1;
    }
    ensure!(histories >= nodes, "only {histories} node histories served");
    let report = sim.finish()?;
    let mut server_sigs = Vec::new();
    for (id, n) in &report {
        ensure!(n.provisioned, "{id} not provisioned: {:?}", n.problems);
        let r = n.received.as_ref().context("nothing received")?;
        ensure!(
            r["certificate_matches_key"] == Value::Bool(true),
            "{id} did not get the helper's key with its certificate"
        );
        ensure!(
            r["key_received"] == Value::Bool(true),
            "{id} did not receive the helper's key"
        );
        let jwt = r["server_jwt"].as_str().unwrap_or_default();
        server_sigs.push(jwt.rsplit('.').next().unwrap_or_default().to_string());
    }
    run.stop_all()?;
    // `check` on the files the provisioner ran with.
    let launch = run
        .provisioner
        .prepare(&run.bins.join("choria-provisioner"), &run.dir)?;
    let check_out = check_output(launch.command_for("check"))?;

    let mut markers: Vec<(&str, String)> = vec![
        ("token", token.to_string()),
        ("broker password", broker_pw.to_string()),
        ("node broker password", node_pw.to_string()),
        ("signing key seed", seed.clone()),
        ("helper-supplied key", key_marker),
        ("provisioning JWT", sig),
    ];
    for s in &server_sigs {
        markers.push(("server JWT", s.clone()));
    }
    let places = [
        (
            "the log",
            std::fs::read_to_string(dir.join("provisioner.log"))?,
        ),
        (
            "stdout/stderr",
            std::fs::read_to_string(dir.join("provisioner.out"))?,
        ),
        ("/metrics", metrics),
        ("check", check_out),
        ("the node history (API and pages)", history),
        ("the audit file", std::fs::read_to_string(&audit)?),
    ];
    for (what, text) in &places {
        for (m, v) in &markers {
            ensure!(!text.contains(v.as_str()), "the {m} appears in {what}");
        }
    }
    // The helper receives the token and the nodes' broker password inside the provisioning
    // claims (`jwt.cht`, `jwt.chpwd`, the Go contract) and nothing else secret.
    let mut seen = 0;
    for e in std::fs::read_dir(&inputs)? {
        let text = std::fs::read_to_string(e?.path())?;
        let mut v: Value = serde_json::from_str(&text).context("helper input")?;
        ensure!(
            v["jwt"]["cht"] == token,
            "the helper did not get the token in jwt.cht"
        );
        v["jwt"]["cht"] = Value::Null;
        v["jwt"]["chpwd"] = Value::Null;
        let rest = v.to_string();
        for (m, val) in &markers {
            ensure!(
                !rest.contains(val.as_str()),
                "the {m} appears in the helper input"
            );
        }
        seen += 1;
    }
    ensure!(seen >= nodes, "only {seen} helper inputs recorded");
    // The audit file still says what each node was given: the server JWT's id and expiry.
    let audit_text = std::fs::read_to_string(&audit)?;
    let jwt_ids = audit_text
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|r| r["decision"] == "provisioned" && r["server_jwt"]["id"].is_string())
        .count();
    ensure!(
        jwt_ids >= nodes,
        "only {jwt_ids} audit records name the server JWT issued"
    );

    // A key file readable by others is reported by `check`.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(
            &run.files.signer_seed,
            std::fs::Permissions::from_mode(0o644),
        )?;
    }
    let out = check_output(launch.command_for("check"))?;
    ensure!(
        out.contains("readable by group or others"),
        "check does not warn about a world-readable signing key: {out}"
    );
    // And so does the daemon at start-up.
    let p = run.start_provisioner("provisioner")?;
    let warned = run.log(p).lines().any(|l| {
        l.contains("\"level\":\"warning\"")
            && l.contains("signer.seed is readable by group or others")
    });
    run.stop_all()?;
    ensure!(
        warned,
        "the daemon does not warn at start-up about a world-readable signing key"
    );
    Ok(format!(
        "{nodes} nodes provisioned at debug level; {} markers absent from log, output, /metrics, check, the node history, the audit file and {seen} helper inputs (token and node password only inside jwt claims); check and start-up warn on a 0644 key",
        markers.len()
    ))
}

/// What `cmd` printed on standard output and error.
fn check_output(mut cmd: Command) -> Result<String> {
    let o = cmd.output()?;
    Ok(format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    ))
}
