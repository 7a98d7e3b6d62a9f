//! Key material changed under a running provisioner: the ed25519 signing key removed, then
//! back, or rotated; the `jwt_verify_cert` file damaged; the chain issuer's
//! `jwt_signing_token` removed and rotated.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use test_support::Mode;

use choria_crypto::jwt;

use crate::harness::{setup, Env, NodeReport, Run, Setup};
use crate::jwt_faults::signer;

/// The provisioner looks at its key files at most every 0.1 s
/// (`helper_protocol::changed_file::RECHECK`): a file replaced is used from the first node
/// after that, so a fleet started at once could still meet the last look's content.
fn wait_out_recheck() {
    std::thread::sleep(Duration::from_millis(250));
}

pub fn signing_key_removed(env: &Env, name: &str) -> Result<String> {
    let mut run = setup(env, name, Setup::in_mode(Mode::Ed25519))?;
    let p = run.start_provisioner("provisioner")?;
    let key = run.files.signer_seed.clone();
    let away = run.dir.join("signer.seed.away");
    std::fs::rename(&key, &away)?;
    let nodes = 10;
    // The simulator signs provisioning JWTs with the same seed: give it the moved file.
    let flags = vec![
        "--provisioning-signer".to_string(),
        away.display().to_string(),
    ];
    let sim = run.start_sim("fault", "n", nodes, &flags)?;
    let t1 = run.wait_errors(p, "every node to fail without a signing key", nodes as f64)?;
    let report = sim.finish()?;
    run.ensure_all_refused(
        p,
        &report,
        &["configure"],
        &["signer.seed"],
        "the signing key is missing",
    )?;
    std::fs::rename(&away, &key)?;
    let t2 = run.provision_clear_fleet(p, nodes, &[], "once the key is back")?;
    run.stop_all()?;
    Ok(format!(
        "{nodes} nodes refused in {:.1}s with the file named, none configured; provisioned {:.1}s after the key returned",
        t1.as_secs_f64(),
        t2.as_secs_f64()
    ))
}

pub fn signing_key_rotated(env: &Env, name: &str) -> Result<String> {
    let mut run = setup(env, name, Setup::in_mode(Mode::Ed25519))?;
    let p = run.start_provisioner("provisioner")?;
    let nodes = 10;
    let sim = run.start_sim("before", "n", nodes, &[])?;
    run.wait_provisioned(p, "the fleet with the first key", nodes as f64)?;
    let old = sim.finish()?;
    ensure!(
        old.values().all(|n| n.provisioned),
        "first fleet not provisioned"
    );
    // Rotate: a new seed replaces the file in place; the nodes now trust only the new key.
    let newdir = run.dir.join("rotated");
    let new_pub = test_support::stack::init_signer(&run.bins, &newdir)?;
    // The nodes' provisioning JWTs stay signed by the first key (jwt_verify_cert is unchanged);
    // only the server JWT signing key rotates.
    let prov_signer = run.dir.join("provisioning-signer.seed");
    std::fs::copy(&run.files.signer_seed, &prov_signer)?;
    std::fs::copy(newdir.join("signer.seed"), &run.files.signer_seed)?;
    wait_out_recheck();
    let flags = vec![
        "--issuer-public".to_string(),
        new_pub,
        "--provisioning-signer".to_string(),
        prov_signer.display().to_string(),
    ];
    let sim = run.start_sim("after", "m", nodes, &flags)?;
    let t = run.wait_provisioned(p, "the fleet with the rotated key", 2.0 * nodes as f64)?;
    let new = sim.finish()?;
    for (id, n) in &new {
        ensure!(
            n.provisioned,
            "{id} not provisioned after rotation (its JWT must verify with the new key): {:?}",
            n.problems
        );
    }
    run.stop_all()?;
    Ok(format!(
        "a second fleet trusting only the new key provisioned {:.1}s after the file was replaced, no restart",
        t.as_secs_f64()
    ))
}

/// `jwt_verify_cert` names a file that is damaged while running: a certificate whose DER ends
/// inside its first header (which once made the PEM reader spin, pinning every worker).
pub fn verify_cert_damaged(env: &Env, name: &str) -> Result<String> {
    let mut run = setup(env, name, Setup::default())?;
    let file = run.dir.join("verify.pub");
    std::fs::write(&file, &run.files.signer_pub)?;
    run.provisioner.jwt_verify_cert = file.display().to_string();
    let p = run.start_provisioner("provisioner")?;
    std::fs::write(
        &file,
        "-----BEGIN CERTIFICATE-----\nAQ==\n-----END CERTIFICATE-----\n",
    )?;
    let nodes = 10;
    let sim = run.start_sim("fault", "n", nodes, &[])?;
    let t1 = run.wait_errors(
        p,
        "every node to fail on the damaged certificate",
        nodes as f64,
    )?;
    let busy = run.metric(p, "choria_provisioner_busy_workers");
    let report = sim.finish()?;
    run.ensure_all_refused(
        p,
        &report,
        &["configure"],
        &["certificate"],
        "its JWT could not be checked",
    )?;
    std::fs::write(&file, &run.files.signer_pub)?;
    let t2 = run.provision_clear_fleet(p, nodes, &[], "once the file is repaired")?;
    run.stop_all()?;
    Ok(format!(
        "{nodes} nodes refused in {:.1}s naming the certificate, none configured, {busy} workers busy after; provisioned {:.1}s after the file was repaired, no restart",
        t1.as_secs_f64(),
        t2.as_secs_f64()
    ))
}

/// A chain issuer for an Organization Issuer network: a new ed25519 signer in `dir`
/// (`signer.seed`, `signer.pub`) and its client JWT `provisioner.jwt`, issued by the org issuer
/// whose seed is `org_seed`, with the trust chain signature over `<jti>.<public key>` that
/// servers check.
pub fn make_chain_issuer(run: &Run, org_seed: &Path, dir: &Path, jti: &str) -> Result<()> {
    let chain_pub = test_support::stack::init_signer(&run.bins, dir)?;
    let org_pub = &run.files.signer_pub;
    let org = signer(org_seed)?;
    let tcs = org
        .sign_bytes(format!("{jti}.{chain_pub}").as_bytes())?
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<String>();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs();
    let claims = serde_json::json!({
        "callerid": "up=provisioner",
        "purpose": "choria_client_id",
        "public_key": chain_pub,
        "tcs": tcs,
        "iss": format!("I-{org_pub}"),
        "jti": jti,
        "iat": now,
        "nbf": now,
        "exp": now + 3600,
    });
    std::fs::write(dir.join("provisioner.jwt"), jwt::sign(&claims, &org)?)?;
    Ok(())
}

/// Every node of `report` provisioned with a server JWT issued through the chain issuer `jti`.
pub fn check_chain_jwts(report: &BTreeMap<String, NodeReport>, jti: &str) -> Result<()> {
    for (id, n) in report {
        ensure!(n.provisioned, "{id} not provisioned: {:?}", n.problems);
        let r = n.received.as_ref().context("nothing received")?;
        let iss = r["server_jwt_claims"]["iss"].as_str().unwrap_or_default();
        ensure!(
            iss.starts_with(&format!("C-{jti}.")),
            "{id}: server JWT issuer {iss:?}, expected the chain issuer {jti}"
        );
        ensure!(
            r["server_jwt_trust"] == "chain",
            "{id}: server JWT not verified through the chain: {}",
            r["server_jwt_trust"]
        );
    }
    Ok(())
}

pub fn signing_token_rotated(env: &Env, name: &str) -> Result<String> {
    let mut run = setup(env, name, Setup::in_mode(Mode::Ed25519))?;
    // The run's signer is the Organization Issuer the nodes trust; the provisioner signs with a
    // chain issuer of its own, as in a real Organization Issuer network.
    let org_seed = run.dir.join("org-issuer.seed");
    std::fs::copy(&run.files.signer_seed, &org_seed)?;
    let chain = run.dir.join("chain");
    make_chain_issuer(&run, &org_seed, &chain, "chainone")?;
    run.provisioner.jwt_signing_key = Some(chain.join("signer.seed"));
    run.provisioner.extra_yaml += &format!(
        "jwt_signing_token: {}\n",
        chain.join("provisioner.jwt").display()
    );
    let p = run.start_provisioner("provisioner")?;
    let nodes = 10;
    let sim = run.start_sim("first", "a", nodes, &[])?;
    run.wait_provisioned(p, "the fleet with the first chain issuer", nodes as f64)?;
    check_chain_jwts(&sim.finish()?, "chainone")?;

    // The token file disappears: every node fails with the file named, nothing configured.
    let token = chain.join("provisioner.jwt");
    std::fs::remove_file(&token)?;
    let sim = run.start_sim("removed", "b", nodes, &[])?;
    let t1 = run.wait_errors(
        p,
        "every node to fail without the signing token",
        nodes as f64,
    )?;
    let report = sim.finish()?;
    run.ensure_all_refused(
        p,
        &report,
        &["configure"],
        &["provisioner.jwt"],
        "the signing token is missing",
    )?;

    // Another chain issuer's seed and token replace the files: used from the next node on.
    let next = run.dir.join("chain-two");
    make_chain_issuer(&run, &org_seed, &next, "chaintwo")?;
    std::fs::copy(next.join("signer.seed"), chain.join("signer.seed"))?;
    std::fs::copy(next.join("provisioner.jwt"), &token)?;
    wait_out_recheck();
    let sim = run.start_sim("rotated", "b", nodes, &[])?;
    let t2 = run.wait_provisioned(
        p,
        "the fleet with the second chain issuer",
        2.0 * nodes as f64,
    )?;
    check_chain_jwts(&sim.finish()?, "chaintwo")?;
    run.stop_all()?;
    Ok(format!(
        "{nodes} nodes issued through chain issuer one; with the token removed {nodes} refused in {:.1}s naming the file, none configured; after rotation to chain issuer two {nodes} provisioned {:.1}s later with JWTs through it, no restart",
        t1.as_secs_f64(),
        t2.as_secs_f64()
    ))
}
