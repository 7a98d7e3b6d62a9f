//! `rego_policy` end to end: a real nats-server, the provisioner binary, a recording helper and a
//! simulated fleet. Denied nodes never reach the helper and never see `configure` or
//! `restart`; allowed ones are provisioned; an edit while the daemon runs takes effect and a
//! broken edit keeps the last good policy. Also `check` on a policy with a syntax error and
//! `policy eval` on a recorded input.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::time::Duration;

use choria_fleet_sim::Mode;
use common::*;

const WAIT: Duration = Duration::from_secs(60);

fn write_policy(path: &Path, text: &str) {
    // Written aside and renamed, so the reloader never reads half a file.
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

fn deny_listed(denied: &[String]) -> String {
    let set = denied
        .iter()
        .map(|d| format!("{d:?}"))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "package choria.provisioner\n\n\
         refused := {{{set}}}\n\n\
         default decision := {{\"allow\": true}}\n\n\
         decision := {{\"allow\": false, \"reason\": \"on the refused list\"}} if input.identity in refused\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn denied_nodes_never_reach_the_helper_and_allowed_ones_are_provisioned() {
    let env = Env::new();
    let log = env.path().join("helper.log");
    let record = env.path().join("inputs");
    let fleet = env.fleet(env.fleet_config(6, Mode::Plain)).await;
    let ids = fleet.identities();
    let denied: Vec<String> = ids.iter().step_by(2).cloned().collect();
    let allowed: Vec<String> = ids.iter().skip(1).step_by(2).cloned().collect();
    let policy = env.path().join("admit.rego");
    write_policy(&policy, &deny_listed(&denied));

    let opts = env
        .provisioner(format!("{} configure", test_helper("scenario.py")))
        .env("HELPER_LOG", log.display().to_string())
        .yaml(&format!(
            "rego_policy: {}\nrecord_helper_inputs: {}",
            policy.display(),
            record.display()
        ));
    let mut prov = env.start_ready(&opts).await;

    assert!(
        fleet.wait_provisioned(allowed.len(), WAIT).await,
        "{}",
        prov.output()
    );
    prov.expect_metric("policy_denied", denied.len() as f64, WAIT)
        .await;
    // Give the denied nodes' cycles every chance to go wrong before looking.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(prov.m("policy_denied"), denied.len() as f64);
    assert_eq!(prov.m("provisioned"), allowed.len() as f64);

    let calls = lines(&log);
    for d in &denied {
        let acts = actions(&fleet, d);
        assert!(
            !acts.iter().any(|a| a == "configure" || a == "restart"),
            "{d} saw {acts:?}"
        );
        assert!(
            !calls.iter().any(|l| l.starts_with(&format!("{d} "))),
            "the helper ran for {d}: {calls:?}"
        );
    }
    for a in &allowed {
        let acts = actions(&fleet, a);
        assert!(acts.iter().any(|x| x == "configure"), "{a}: {acts:?}");
        assert!(calls.iter().any(|l| l.starts_with(&format!("{a} "))));
    }
    let out = prov.output();
    assert!(
        out.contains("Refused by policy: on the refused list"),
        "{out}"
    );

    // Every node's input was recorded, without the token, and policy eval agrees with the
    // daemon on a recorded input.
    let recorded = record.join(format!("{}.json", denied[0]));
    let text = std::fs::read_to_string(&recorded).expect("input recorded");
    assert!(!text.contains(TOKEN), "the token was recorded");
    let yaml = env.prepare(&opts).config;
    let stdout = policy_eval(&yaml, &recorded, &["--explain"])
        .succeeded("policy eval")
        .stdout;
    assert!(stdout.contains("decision: deny"), "{stdout}");
    assert!(stdout.contains("reason: on the refused list"), "{stdout}");
    assert!(stdout.contains("rule refused = "), "{stdout}");
    let ok = record.join(format!("{}.json", allowed[0]));
    assert!(policy_eval(&yaml, &ok, &[])
        .stdout
        .contains("decision: allow"));

    finish(&mut prov, fleet).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edit_takes_effect_and_a_broken_edit_keeps_the_old_policy() {
    let env = Env::new();
    let log = env.path().join("helper.log");
    let dir = env.path().join("policies");
    std::fs::create_dir(&dir).unwrap();
    let policy = dir.join("admit.rego");
    write_policy(
        &policy,
        "package choria.provisioner\n\ndecision := {\"allow\": false, \"reason\": \"closed for now\"}\n",
    );
    let fleet = env.fleet(env.fleet_config(3, Mode::Plain)).await;
    let opts = env
        .provisioner(format!("{} configure", test_helper("scenario.py")))
        .env("HELPER_LOG", log.display().to_string())
        .yaml(&format!("rego_policy: {}", dir.display()));
    let mut prov = env.start_ready(&opts).await;
    prov.expect_metric("policy_denied", 3.0, WAIT).await;

    // A broken edit: logged, and the policy last loaded still refuses everyone.
    write_policy(
        &policy,
        "package choria.provisioner\n\ndecision := {\"allow\": true\n",
    );
    prov.expect_log("Keeping the previous rego_policy", WAIT)
        .await;
    env.announce(&fleet.identities()).await;
    prov.expect_metric("policy_denied", 6.0, WAIT).await;
    assert_eq!(fleet.stats().configured, 0);
    assert!(lines(&log).is_empty(), "the helper ran: {:?}", lines(&log));

    // A good edit takes effect without a restart.
    write_policy(
        &policy,
        "package choria.provisioner\n\ndecision := {\"allow\": true}\n",
    );
    prov.expect_log("Reloaded rego_policy", WAIT).await;
    env.announce(&fleet.identities()).await;
    expect_provisioned(&fleet, 3, WAIT, &prov).await;
    assert_eq!(prov.m("policy_denied"), 6.0);
    finish(&mut prov, fleet).await;
}

#[test]
fn check_names_the_file_and_line_of_a_syntax_error() {
    let env = Env::new();
    let policy = env.path().join("broken.rego");
    std::fs::write(
        &policy,
        "package choria.provisioner\n\ndefault decision := {\"allow\": false}\ndecision := {\"allow\": true if\n",
    )
    .unwrap();
    let opts = env
        .plain()
        .yaml(&format!("rego_policy: {}", policy.display()));
    let launch = env.prepare(&opts);
    let ran = check_files(&launch.config, &launch.choria_config);
    let out = ran.text();
    assert!(!ran.ok, "{out}");
    assert!(out.contains("broken.rego:4:"), "file and line named: {out}");
}
