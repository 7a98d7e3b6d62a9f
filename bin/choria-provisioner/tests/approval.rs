//! The approval queue against a real broker: with `approval: manual` a fleet stays in
//! provisioning mode, recorded as pending; `approve --matching` provisions exactly the nodes it
//! names; `reject` puts the node's key fingerprint on the deny list so it is never provisioned;
//! an approval given for one key does not apply to a node presenting another under the same
//! name.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use choria_fleet_sim::Mode;
use common::*;
use test_support::provisioner::Launch;

/// The pending nodes as `nodes --pending --json` lists them: identity and fingerprints.
fn pending(launch: &Launch) -> Vec<(String, Vec<String>)> {
    let config = launch.config.display().to_string();
    let out =
        cli(&["nodes", "--pending", "--json", "--config", &config]).succeeded("nodes --pending");
    let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    v["pending"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| {
            (
                n["identity"].as_str().unwrap().to_string(),
                n["fingerprints"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|f| f.as_str().unwrap().to_string())
                    .collect(),
            )
        })
        .collect()
}

fn configured(fleet: &choria_fleet_sim::SimFleet, id: &str) -> bool {
    actions(fleet, id).iter().any(|a| a.contains("configure"))
}

fn id(n: usize) -> String {
    format!("node-{n:02}.example.net")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manual_approval_holds_the_fleet_until_approved_and_reject_denies_the_key() {
    let env = Env::new();
    let ca = test_ca(env.path());
    let audit = env.path().join("audit.jsonl");
    let p = env
        .pki_provisioner(example_helper("helper-pki.py"), &ca)
        .yaml(&format!(
            "fleet_control: true\napproval: manual\naudit_file: {}\n",
            audit.display()
        ));
    let launch = env.prepare(&p);
    let mut prov = Prov::launch(&launch);
    prov.wait_ready().await;
    prov.expect_log("fleet control: following bucket", Duration::from_secs(30))
        .await;

    // Ten nodes, each with its own key.
    let mut cfg = env.fleet_config(10, Mode::Pki);
    cfg.rsa_keys_pem = Some(test_support::ca::rsa_keys_pem(10).unwrap());
    let fleet = env.fleet(cfg).await;
    assert!(
        wait_until(Duration::from_secs(60), || pending(&launch).len() == 10).await,
        "{:?}\n{}",
        pending(&launch),
        prov.output()
    );
    let held = pending(&launch);
    for (_, fps) in &held {
        assert_eq!(fps.len(), 1, "{held:?}");
        assert!(fps[0].starts_with("sha256:"), "{held:?}");
    }
    assert_eq!(fleet.provisioned(), 0, "provisioned while pending");
    assert_eq!(prov.m("provisioned"), 0.0);
    assert_eq!(prov.m("provision_errors"), 0.0, "pending is not a failure");
    let config = launch.config.display().to_string();
    let listed = cli(&["nodes", "--pending", "--config", &config]).stdout;
    assert!(
        listed.contains("node-01.example.net") && listed.contains("10 nodes waiting"),
        "{listed}"
    );
    let status = cli(&["status", "--config", &config]).stdout;
    assert!(
        status.contains("Pending approval") && status.contains("Operator pause"),
        "{status}"
    );

    // Half approved: exactly those are provisioned, at once (not at the next interval).
    let said = control(&launch, &["approve", "--matching", "^node-0[1-5][.]"]);
    assert!(said.contains("5 nodes approved"), "{said}");
    assert!(said.contains("reached 1 of 1 replica ("), "{said}");
    expect_provisioned(&fleet, 5, Duration::from_secs(30), &prov).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(fleet.provisioned(), 5);
    for n in 1..=10 {
        assert_eq!(configured(&fleet, &id(n)), n <= 5, "{}", id(n));
    }
    prov.expect_output("was approved by");

    // Rejected: its key fingerprint is denied, and it is refused whenever it is found.
    let fp6 = held.iter().find(|(i, _)| *i == id(6)).unwrap().1[0].clone();
    let said = control(&launch, &["reject", &id(6), "--reason", "not ours"]);
    assert!(
        said.contains(&format!("Rejected {}: denied {fp6}", id(6))),
        "{said}"
    );
    let denied = control(&launch, &["deny", "ls"]);
    assert!(
        denied.contains(&fp6) && denied.contains("not ours"),
        "{denied}"
    );
    prov.expect_log(&format!("deny list: {fp6} denied"), Duration::from_secs(5))
        .await;
    env.announce(&[id(6)]).await;
    prov.expect_log(
        &format!("Could not provision {}: on the deny list", id(6)),
        Duration::from_secs(30),
    )
    .await;
    assert!(!configured(&fleet, &id(6)));
    let left: Vec<String> = pending(&launch).into_iter().map(|(i, _)| i).collect();
    assert_eq!(left, vec![id(7), id(8), id(9), id(10)]);

    // The audit trail has each decision: pending, approved, and the rejected node refused.
    let records: Vec<serde_json::Value> = std::fs::read_to_string(&audit)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let has = |id: &str, decision: &str, cause: &str| {
        records.iter().any(|r| {
            r["identity"] == id
                && r["decision"] == decision
                && r["cause"].as_str().unwrap_or("").contains(cause)
        })
    };
    for n in 1..=10 {
        assert!(
            has(&id(n), "pending", "waiting for approval"),
            "{}: {records:?}",
            id(n)
        );
    }
    for n in 1..=5 {
        assert!(
            has(&id(n), "approved", "approved by"),
            "{}: {records:?}",
            id(n)
        );
        assert!(has(&id(n), "provisioned", ""), "{}", id(n));
    }
    assert!(
        has(&id(6), "refused", "rejected while pending approval"),
        "{records:?}"
    );

    // The node goes away; node-07 is approved with the key it had; a server with another key
    // comes up under that name: the approval does not apply, it is pending again.
    fleet.shutdown().await;
    let fp7 = held.iter().find(|(i, _)| *i == id(7)).unwrap().1[0].clone();
    let said = control(&launch, &["approve", &id(7)]);
    assert!(
        said.contains(&format!("Approved {} ({fp7})", id(7))),
        "{said}"
    );
    let mut other = env.fleet_config(1, Mode::Pki);
    other.identities = Some(vec![id(7)]);
    other.rsa_keys_pem = Some(test_support::ca::rsa_keys_pem(1).unwrap());
    let impostor = env.fleet(other).await;
    env.announce(&[id(7)]).await;
    assert!(
        wait_until(Duration::from_secs(30), || {
            pending(&launch)
                .iter()
                .any(|(i, f)| *i == id(7) && !f.contains(&fp7))
        })
        .await,
        "{:?}\n{}",
        pending(&launch),
        prov.output()
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(impostor.provisioned(), 0);
    assert!(!configured(&impostor, &id(7)));
    impostor.shutdown().await;
}
