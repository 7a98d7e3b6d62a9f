//! Webhook faults: the helper is a webhook (`choria-demo-helper serve`) that is down while a
//! fleet waits, then comes back. Every node fails in the helper without being configured (its
//! connection refused, tried again with the RPCs' backoff, then given up), and once the webhook
//! listens every node is provisioned.

use anyhow::{ensure, Result};
use test_support::metrics::{metric_sum, scrape as scrape_all};
use test_support::webhook::WebhookPlan;

use crate::harness::{setup, Env, Setup};

pub fn webhook_down(env: &Env, name: &str) -> Result<String> {
    let dir = env.base.join(name);
    // The port is chosen and the secret written now; nothing listens on it yet.
    let plan = WebhookPlan::new(&dir)?;
    let extra = plan.extra_yaml();
    let mut run = setup(
        env,
        name,
        Setup {
            helper: Some(&plan.url),
            extra_yaml: &extra,
            ..Setup::default()
        },
    )?;
    let p = run.start_provisioner("provisioner")?;
    let nodes = 6;
    let sim = run.start_sim("down", "n", nodes, &[])?;
    let t1 = run.wait_all_failed(p, "every node to fail in the webhook", nodes)?;
    let metrics = scrape_all(run.provisioners[p].port);
    let report = sim.finish()?;
    run.ensure_all_refused(
        p,
        &report,
        &["configure", "restart"],
        &["cannot connect to webhook"],
        "the webhook was down",
    )?;
    let helper_errors = metric_sum(&metrics, "choria_provisioner_helper_errors");
    ensure!(
        helper_errors >= nodes as f64,
        "helper_errors is {helper_errors}, expected at least {nodes}"
    );
    // A refused connection is tried again (nothing was sent) before the node fails.
    let retries = run
        .log(p)
        .lines()
        .filter(|l| l.contains("helper try 1/"))
        .count();
    ensure!(
        retries >= nodes,
        "only {retries} refused connections were tried again"
    );

    let _webhook = plan.start(&run.bins, &run.files, &run.url, &dir.join("webhook.log"))?;
    let t2 = run.provision_clear_fleet(p, nodes, &[], "once the webhook is back")?;
    run.stop_all()?;
    Ok(format!(
        "{nodes} nodes failed in {:.1}s with the webhook down, none configured, \
         helper_errors={helper_errors}, {retries} refused connections tried again; \
         provisioned {:.1}s after it came back",
        t1.as_secs_f64(),
        t2.as_secs_f64()
    ))
}
