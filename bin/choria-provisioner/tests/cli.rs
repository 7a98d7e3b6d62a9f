//! The command line: flags, configuration errors as one readable line, `check`, the pid file,
//! signals and exit codes, all through the built binary.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use common::*;

fn provisioner(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        // A backtrace would show up here if an error escaped as a panic or a Debug dump.
        .env("RUST_BACKTRACE", "1")
        .output()
        .unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The run fails with exactly one line on stderr, which is returned.
fn one_line_failure(o: &Output) -> String {
    assert!(!o.status.success(), "expected a failure: {o:?}");
    let err = stderr(o);
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "not one line: {err}");
    assert!(lines[0].starts_with("choria-provisioner: "), "{err}");
    for noise in ["backtrace", "panicked", "Error {", "Os {", "stack"] {
        assert!(!err.contains(noise), "{noise} in {err}");
    }
    lines[0].to_string()
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p.display().to_string()
}

#[test]
fn version_prints_the_crate_version() {
    let o = provisioner(&["--version"]);
    assert!(o.status.success());
    // The bare version, as the Go provisioner prints it.
    assert_eq!(stdout(&o), format!("{}\n", env!("CARGO_PKG_VERSION")));
}

#[test]
fn help_names_every_flag_and_command() {
    let o = provisioner(&["--help"]);
    assert!(o.status.success());
    let out = stdout(&o);
    test_support::assert_contains_all(
        &out,
        &[
            "--config",
            "--choria-config",
            "--pid",
            "--debug",
            "--version",
            "run",
            "check",
        ],
    );
    let o = provisioner(&["check", "--help"]);
    assert!(o.status.success());
    assert!(stdout(&o).contains("--config"));
}

#[test]
fn config_is_required() {
    for args in [&[][..], &["run"][..], &["check"][..]] {
        let o = provisioner(args);
        assert!(!o.status.success(), "{args:?}");
        assert!(stderr(&o).contains("--config"), "{args:?}: {}", stderr(&o));
    }
}

#[test]
fn a_missing_config_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope.yaml").display().to_string();
    for args in [
        vec!["--config", &missing],
        vec!["run", "--config", &missing],
        vec!["check", "--config", &missing],
    ] {
        let o = provisioner(&args);
        assert!(!o.status.success());
        let err = stderr(&o);
        let first = err.lines().next().unwrap_or_default();
        assert!(
            first.contains(&missing) && first.contains("No such file"),
            "{err}"
        );
        assert!(!err.contains("backtrace"), "{err}");
    }
}

#[test]
fn bad_yaml_is_one_line_with_line_and_column() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = write(dir.path(), "c.cfg", "identity = x\n");
    let bad = write(
        dir.path(),
        "bad.yaml",
        "interval: 1m\nfeatures:\n  jwt: [true\ntoken: x\n",
    );
    let line = one_line_failure(&provisioner(&["--config", &bad, "--choria-config", &cfg]));
    assert!(line.contains(&bad), "{line}");
    assert!(line.contains("at line 4 column 6"), "{line}");
    let typed = write(dir.path(), "typed.yaml", "token: x\nworkers: lots\n");
    let line = one_line_failure(&provisioner(&["--config", &typed, "--choria-config", &cfg]));
    assert!(line.contains("at line 2 column 10"), "{line}");
}

#[test]
fn invalid_values_are_one_clear_line_each() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = write(dir.path(), "c.cfg", "identity = x\n");
    for (yaml, expect) in [
        ("interval: 30s\n", "interval \"30s\" is too small"),
        ("interval: 10q\n", "invalid interval duration \"10q\""),
        (
            "features:\n  pki: true\n  ed25519: true\n",
            "can only enable one of the pki or ed25519 features",
        ),
        (
            "lifecycle_component: provision.mode\n",
            "invalid lifecycle component \"provision.mode\"",
        ),
        (
            "lifecycle_component: \"prov>\"\n",
            "invalid lifecycle component",
        ),
    ] {
        let p = write(dir.path(), "p.yaml", yaml);
        let line = one_line_failure(&provisioner(&["--config", &p, "--choria-config", &cfg]));
        assert!(line.contains(expect), "{yaml:?}: {line}");
    }
}

/// A usable setup: configuration, Choria configuration and the sample helper.
fn good_setup(dir: &Path) -> (String, String) {
    let signer = Signer::new(dir);
    let yaml = write(
        dir,
        "good.yaml",
        &format!(
            "helper: {}\ntoken: x\nworkers: 7\nwork_queue_size: 900\ninterval: 5m\nchoria_insecure: true\nsite: lab\n\
             jwt_verify_cert: {}\nfeatures:\n  jwt: true\n",
            example_helper("helper-plain.py"),
            signer.public_hex
        ),
    );
    let cfg = write(
        dir,
        "c.cfg",
        "identity = prov1.example.net\nplugin.choria.middleware_hosts = nats://broker.example.net:4222\n",
    );
    (yaml, cfg)
}

/// `plugin.d/choria.cfg` beside the Choria configuration is merged as go-choria merges it, and
/// keys go-choria would act on but the provisioner ignores are named.
#[test]
fn check_reads_plugin_d_and_names_the_go_choria_keys_it_ignores() {
    let dir = tempfile::tempdir().unwrap();
    let (yaml, cfg) = good_setup(dir.path());
    let d = dir.path().join("plugin.d");
    std::fs::create_dir(&d).unwrap();
    write(
        &d,
        "choria.cfg",
        "middleware_hosts = nats://from-plugin-d.example.net:4222\n",
    );
    let mut text = std::fs::read_to_string(&cfg).unwrap();
    text.push_str(
        "plugin.security.cipher_suites = TLS_AES_128_GCM_SHA256\n\
         plugin.choria.security.request_signer.url = https://aaa.example.net/sign\n",
    );
    std::fs::write(&cfg, text).unwrap();
    let o = provisioner(&["check", "--config", &yaml, "--choria-config", &cfg]);
    let out = stdout(&o);
    assert!(o.status.success(), "{out}{}", stderr(&o));
    assert!(out.contains("from-plugin-d.example.net:4222"), "{out}");
    assert!(!out.contains("broker.example.net:4222"), "{out}");
    assert!(
        out.contains(&format!("(with {})", d.join("choria.cfg").display())),
        "{out}"
    );
    let warning = out
        .lines()
        .find(|l| l.starts_with("warning:") && l.contains("go-choria reads"))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(
        warning
            .contains("plugin.choria.security.request_signer.url, plugin.security.cipher_suites"),
        "{warning}"
    );
}

/// The packaged placeholder token and a `jwt_verify_cert` file that does not exist are each
/// refused with what is wrong, not passed or misread.
#[test]
fn check_refuses_the_placeholder_token_and_names_a_missing_verify_cert_file() {
    let dir = tempfile::tempdir().unwrap();
    let (yaml, cfg) = good_setup(dir.path());
    let base = std::fs::read_to_string(&yaml).unwrap();
    let placeholder = write(
        dir.path(),
        "placeholder.yaml",
        &base.replace("token: x\n", "token: \"change me\"\n"),
    );
    let o = provisioner(&["check", "--config", &placeholder, "--choria-config", &cfg]);
    assert!(!o.status.success());
    assert!(
        stdout(&o)
            .lines()
            .any(|l| l.starts_with("problem: token is the packaged placeholder")),
        "{}",
        stdout(&o)
    );
    let missing = dir.path().join("no-such-signer.pem");
    let lines: Vec<&str> = base
        .lines()
        .filter(|l| !l.starts_with("jwt_verify_cert"))
        .collect();
    let no_file = write(
        dir.path(),
        "nofile.yaml",
        &format!(
            "{}\njwt_verify_cert: {}\n",
            lines.join("\n"),
            missing.display()
        ),
    );
    let o = provisioner(&["check", "--config", &no_file, "--choria-config", &cfg]);
    assert!(!o.status.success());
    let problem = stdout(&o)
        .lines()
        .find(|l| l.starts_with("problem: jwt_verify_cert"))
        .unwrap_or_else(|| panic!("{}", stdout(&o)))
        .to_string();
    assert!(
        problem.contains(&missing.display().to_string()) && problem.contains("No such file"),
        "{problem}"
    );
    assert!(!problem.contains("hex"), "{problem}");
}

#[test]
fn check_on_a_good_setup_prints_the_plan() {
    let dir = tempfile::tempdir().unwrap();
    let (yaml, cfg) = good_setup(dir.path());
    let o = provisioner(&["check", "--config", &yaml, "--choria-config", &cfg]);
    let out = stdout(&o);
    assert!(o.status.success(), "{out}{}", stderr(&o));
    test_support::assert_contains_all(
        &out,
        &[
            "features: jwt on pki off ed25519 off upgrades off",
            "workers: 7 (queue 900, threads 1)",
            "interval: 5m",
            "security: file",
            "helper-plain.py",
            "site: lab",
            "identity: prov1.example.net",
            "brokers: nats://broker.example.net:4222",
            "ok: the configuration is usable",
            "node history: up to 10000 nodes, each kept 1h after its last change",
            "monitor token: not set",
            "audit file: none (audit_file unset)",
            "audit stream: none (audit_stream unset)",
        ],
    );
    assert!(!out.contains("problem:"), "{out}");
}

/// `check` prints what active-active needs on the broker (the bucket and the `nats` command that
/// creates it) and that Go provisioners stay on leader election; both modes at once is refused.
#[test]
fn check_explains_active_active_and_refuses_it_beside_leader_election() {
    let dir = tempfile::tempdir().unwrap();
    let (yaml, cfg) = good_setup(dir.path());
    let base = std::fs::read_to_string(&yaml).unwrap();
    let aa = write(
        dir.path(),
        "aa.yaml",
        &format!("{base}active_active: true\nclaim_lifetime: 45s\n"),
    );
    let o = provisioner(&["check", "--config", &aa, "--choria-config", &cfg]);
    let out = stdout(&o);
    assert!(o.status.success(), "{out}{}", stderr(&o));
    test_support::assert_contains_all(
        &out,
        &[
            "active-active: on",
            "CHORIA_PROVISIONER_CLAIMS (claim lifetime 45s)",
            "nats kv add CHORIA_PROVISIONER_CLAIMS --history 1 --ttl 45s --replicas 3 --storage file",
            "a deployment with Go provisioners stays on leader_election",
        ],
    );
    let both = write(
        dir.path(),
        "both.yaml",
        &format!("{base}active_active: true\nleader_election: true\n"),
    );
    let o = provisioner(&["check", "--config", &both, "--choria-config", &cfg]);
    assert!(!o.status.success());
    let out = stdout(&o);
    assert!(
        out.lines().any(|l| l.starts_with("problem:")
            && l.contains("active_active and leader_election cannot both be on")),
        "{out}"
    );
}

#[test]
fn check_prints_the_node_history_the_token_file_and_the_audit_trail_never_the_token() {
    let dir = tempfile::tempdir().unwrap();
    let (yaml, cfg) = good_setup(dir.path());
    let secret = "tok-3d9f6a0c1b7e";
    let token = write(dir.path(), "monitor.token", &format!("{secret}\n"));
    let audit = dir.path().join("audit.jsonl");
    let mut text = std::fs::read_to_string(&yaml).unwrap();
    text.push_str(&format!(
        "node_history_size: 250\nnode_history_max_age: 2h\nmonitor_token_file: {token}\n\
         audit_file: {}\naudit_stream: PROVISIONER_AUDIT\n",
        audit.display()
    ));
    std::fs::write(&yaml, text).unwrap();
    let o = provisioner(&["check", "--config", &yaml, "--choria-config", &cfg]);
    let out = stdout(&o);
    assert!(o.status.success(), "{out}{}", stderr(&o));
    test_support::assert_contains_all(
        &out,
        &[
            "node history: up to 250 nodes, each kept 2h after its last change".to_string(),
            format!("monitor token: set, read from {token}"),
            format!(
                "audit file: {} (one JSON line per decision",
                audit.display()
            ),
            "audit stream: PROVISIONER_AUDIT (subject choria.provisioner.audit".to_string(),
        ],
    );
    assert!(!out.contains(secret), "the token is printed:\n{out}");
    assert!(!stderr(&o).contains(secret), "the token is printed");
}

#[test]
fn check_on_a_broken_setup_lists_every_problem() {
    let dir = tempfile::tempdir().unwrap();
    let helper = write(dir.path(), "helper.sh", "#!/bin/sh\necho {}\n"); // not executable
    let yaml = write(
        dir.path(),
        "bad.yaml",
        &format!(
            "helper: {helper}\ntoken: x\ninterval: 30s\nlifecycle_component: a.b\n\
             jwt_verify_cert: {}/missing.pem\nfeatures:\n  jwt: true\n",
            dir.path().display()
        ),
    );
    let cfg = write(dir.path(), "c.cfg", "identity = prov1\n");
    let o = provisioner(&["check", "--config", &yaml, "--choria-config", &cfg]);
    assert!(!o.status.success());
    let out = stdout(&o);
    let problems: Vec<&str> = out.lines().filter(|l| l.starts_with("problem:")).collect();
    for want in [
        "interval \"30s\" is too small",
        "invalid lifecycle component \"a.b\"",
        "is not an executable file",
        "jwt_verify_cert",
        "the puppet security provider",
    ] {
        assert!(
            problems.iter().any(|p| p.contains(want)),
            "{want:?} not reported:\n{out}"
        );
    }
    let err = stderr(&o);
    assert!(
        err.trim()
            .ends_with(&format!("{} problem(s) found", problems.len())),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_keys_are_warned_by_name() {
    let env = Env::new();
    let opts = env
        .plain()
        .yaml("feature:\n  pki: true\nbroker_port: 4222\nworkerz: 3");
    let mut prov = env.start_ready(&opts).await;
    let out = prov.output();
    for key in ["\"feature\"", "\"workerz\""] {
        assert!(
            out.contains(&format!("unknown configuration key {key}")),
            "{key}: {out}"
        );
    }
    assert!(out.contains("\"broker_port\" is accepted for compatibility but has no effect"));
    prov.stop_with("TERM").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pid_file_is_written_at_start_and_removed_on_exit() {
    let env = Env::new();
    let pid_file = env.path().join("run/provisioner.pid");
    std::fs::create_dir(env.path().join("run")).unwrap();
    let mut opts = env.plain();
    opts.pid_file = Some(pid_file.clone());
    let mut prov = env.start_ready(&opts).await;
    let text = std::fs::read_to_string(&pid_file).unwrap();
    assert_eq!(text.trim(), prov.pid().to_string());
    prov.stop_with("TERM").await;
    assert!(!pid_file.exists(), "pid file left behind");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_and_sigint_exit_cleanly() {
    let env = Env::new();
    for sig in ["TERM", "INT"] {
        let mut prov = env.start_ready(&env.plain()).await;
        prov.stop_with(sig).await;
        let out = prov.output();
        assert!(out.contains(&format!("received SIG{sig}")), "{out}");
        assert!(out.contains("stopped"), "{out}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signal_while_still_connecting_exits_cleanly() {
    // No broker listens on this port: the provisioner keeps trying to connect until stopped.
    let dir = tempfile::tempdir().unwrap();
    let yaml = write(
        dir.path(),
        "p.yaml",
        &format!(
            "helper: {}\ntoken: x\nchoria_insecure: true\nfeatures:\n  jwt: false\nloglevel: info\n",
            example_helper("helper-plain.py")
        ),
    );
    let cfg = write(
        dir.path(),
        "c.cfg",
        &format!(
            "identity = p1\nplugin.choria.middleware_hosts = nats://127.0.0.1:{}\n",
            test_support::free_port()
        ),
    );
    let mut prov = Prov::launch(&Launch::new(
        "unconnected",
        Path::new(BIN),
        Path::new(&yaml),
        Path::new(&cfg),
        &dir.path().join("unconnected.out"),
    ));
    prov.expect_log("starting using configuration file", Duration::from_secs(20))
        .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    prov.stop_with("TERM").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn debug_flag_wins_over_the_configured_level() {
    let env = Env::new();
    let mut opts = env.plain();
    opts.loglevel = "warn".into();
    let mut quiet = env.start(&opts);
    // Nothing below warn is logged, so the metrics listener, not a log line, says it is up.
    assert!(
        wait_until(Duration::from_secs(20), || quiet
            .get("/readyz")
            .is_some_and(|(s, _)| s == 200))
        .await
    );
    quiet.stop_with("TERM").await;
    assert!(!quiet.output().contains("INFO"), "{}", quiet.output());

    let mut opts = opts.for_identity("provisioner2");
    opts.args = vec!["--debug".into(), "run".into()];
    let mut loud = env.start_ready(&opts).await;
    loud.stop_with("TERM").await;
    loud.expect_output("DEBUG");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_monitor_port_in_use_is_one_line_and_a_failure() {
    let env = Env::new();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let opts = env.plain();
    let Launch {
        config: yaml,
        choria_config: cfg,
        ..
    } = env.prepare(&opts);
    let text = std::fs::read_to_string(&yaml).unwrap();
    let text = text
        .lines()
        .map(|l| {
            if l.starts_with("monitor_port:") {
                format!("monitor_port: {port}")
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    std::fs::write(&yaml, text).unwrap();
    let o = Command::new(BIN)
        .arg("--config")
        .arg(&yaml)
        .arg("--choria-config")
        .arg(&cfg)
        .env("RUST_BACKTRACE", "1")
        .output()
        .unwrap();
    let line = one_line_failure(&o);
    assert!(line.contains(&port.to_string()), "{line}");
    drop(taken);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signal_as_soon_as_the_pid_file_exists_is_a_clean_stop() {
    let env = Env::new();
    let pid_file = env.path().join("early.pid");
    let mut opts = env.plain();
    opts.pid_file = Some(pid_file.clone());
    let mut prov = env.start(&opts);
    // Whoever reads the pid file may signal at once: the handlers are in place by then.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !pid_file.exists() {
        assert!(std::time::Instant::now() < deadline, "no pid file");
        std::thread::sleep(Duration::from_millis(1));
    }
    prov.stop_with("TERM").await;
    assert!(!pid_file.exists());
}

#[test]
fn run_flags_before_a_command_name_apply_to_run_and_check_and_are_refused_elsewhere() {
    let dir = tempfile::tempdir().unwrap();
    let (yaml, cfg) = good_setup(dir.path());
    // `--config a.yaml check` checks a.yaml.
    let o = provisioner(&["--config", &yaml, "--choria-config", &cfg, "check"]);
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
    assert!(
        stdout(&o).contains(&format!("provisioner configuration {yaml}")),
        "{}",
        stdout(&o)
    );
    // Before a command that would ignore them, they are refused.
    let o = provisioner(&["--config", &yaml, "status"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("apply to run and check only"),
        "{}",
        stderr(&o)
    );
    // Without --config anywhere, the flag is named as missing.
    let o = provisioner(&["check"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("--config <FILE>"), "{}", stderr(&o));
    // Global --debug may come first, as with the Go tool.
    let o = provisioner(&[
        "--debug",
        "check",
        "--config",
        &yaml,
        "--choria-config",
        &cfg,
    ]);
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
}

#[test]
fn check_reads_every_key_an_ed25519_setup_names() {
    let dir = tempfile::tempdir().unwrap();
    let signer = Signer::new(dir.path());
    let token = write(dir.path(), "signer.jwt", "not a jwt\n");
    let yaml = write(
        dir.path(),
        "ed.yaml",
        &format!(
            "helper: {}\ntoken: x\nchoria_insecure: true\njwt_verify_cert: {}\n\
             jwt_signing_key: {}/missing.seed\njwt_signing_token: {token}\n\
             features:\n  ed25519: true\n",
            example_helper("helper-ed25519.py"),
            signer.public_hex,
            dir.path().display()
        ),
    );
    let cfg = write(
        dir.path(),
        "c.cfg",
        "identity = p1\nplugin.choria.middleware_hosts = nats://127.0.0.1:4222\n",
    );
    let o = provisioner(&["check", "--config", &yaml, "--choria-config", &cfg]);
    assert!(!o.status.success());
    let out = stdout(&o);
    assert!(out.contains("features: jwt on pki off ed25519 on"), "{out}");
    let problems: Vec<&str> = out.lines().filter(|l| l.starts_with("problem:")).collect();
    assert_eq!(problems.len(), 2, "{out}");
    assert!(problems[0].contains("jwt_signing_key") && problems[0].contains("missing.seed"));
    assert!(problems[1].contains("jwt_signing_token"), "{out}");

    // With the real seed and no token file the same setup is usable.
    let yaml = write(
        dir.path(),
        "ed.yaml",
        &format!(
            "helper: {}\ntoken: x\nchoria_insecure: true\njwt_verify_cert: {}\n\
             jwt_signing_key: {}\nfeatures:\n  ed25519: true\n",
            example_helper("helper-ed25519.py"),
            signer.public_hex,
            signer.seed_file.display()
        ),
    );
    let o = provisioner(&["check", "--config", &yaml, "--choria-config", &cfg]);
    assert!(o.status.success(), "{}", stdout(&o));
}

#[test]
fn an_unwritable_logfile_is_one_line_and_a_failure() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("no/such/dir/provisioner.log");
    let yaml = write(
        dir.path(),
        "p.yaml",
        &format!("helper: /bin/true\ntoken: x\nlogfile: {}\n", log.display()),
    );
    let cfg = write(dir.path(), "c.cfg", "identity = p1\n");
    let line = one_line_failure(&provisioner(&["--config", &yaml, "--choria-config", &cfg]));
    assert!(line.contains("cannot open log file"), "{line}");
    assert!(line.contains(&log.display().to_string()), "{line}");
}

#[test]
fn run_refuses_to_start_on_every_problem_check_reports() {
    let dir = tempfile::tempdir().unwrap();
    let helper = write(dir.path(), "helper.sh", "#!/bin/sh\necho {}\n"); // not executable
    let yaml = write(
        dir.path(),
        "p.yaml",
        &format!(
            "helper: {helper}\ntoken: x\nchoria_insecure: true\n\
             jwt_verify_cert: {}/missing.pem\nfeatures:\n  jwt: true\n",
            dir.path().display()
        ),
    );
    // Nothing listens there: the daemon must refuse before it tries the broker.
    let cfg = write(
        dir.path(),
        "c.cfg",
        "identity = p1\nplugin.choria.middleware_hosts = nats://127.0.0.1:1\n",
    );
    let checked = provisioner(&["check", "--config", &yaml, "--choria-config", &cfg]);
    assert!(!checked.status.success());
    let out = stdout(&checked);
    let problems: Vec<&str> = out
        .lines()
        .filter_map(|l| l.strip_prefix("problem: "))
        .collect();
    assert_eq!(problems.len(), 2, "{out}");
    assert!(problems[0].contains("is not an executable file"), "{out}");
    assert!(problems[1].contains("jwt_verify_cert"), "{out}");

    for args in [
        vec!["--config", &yaml, "--choria-config", &cfg],
        vec!["run", "--config", &yaml, "--choria-config", &cfg],
    ] {
        let start = std::time::Instant::now();
        let line = one_line_failure(&provisioner(&args));
        assert!(
            line.contains("refusing to start, 2 problem(s) found"),
            "{line}"
        );
        for p in &problems {
            assert!(line.contains(p), "{p:?} missing from {line}");
        }
        assert!(start.elapsed() < Duration::from_secs(10), "{line}");
    }

    // Fixed, check passes and the daemon gets past its preflight to the broker.
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&helper, std::fs::Permissions::from_mode(0o755)).unwrap();
    let signer = Signer::new(dir.path());
    let yaml = write(
        dir.path(),
        "p.yaml",
        &format!(
            "helper: {helper}\ntoken: x\nchoria_insecure: true\n\
             jwt_verify_cert: {}\nfeatures:\n  jwt: true\n",
            signer.public_hex
        ),
    );
    let checked = provisioner(&["check", "--config", &yaml, "--choria-config", &cfg]);
    assert!(checked.status.success(), "{}", stdout(&checked));
    // The first connection is retried for ever, as go-choria does: the daemon keeps trying
    // 127.0.0.1:1 and does not refuse to start.
    struct Killed(std::process::Child);
    impl Drop for Killed {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let out = dir.path().join("run.out");
    let mut child = Killed(
        Command::new(BIN)
            .args(["--config", &yaml, "--choria-config", &cfg])
            .stdout(std::fs::File::create(&out).unwrap())
            .stderr(std::fs::File::create(dir.path().join("run.err")).unwrap())
            .spawn()
            .unwrap(),
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let text = loop {
        let text = std::fs::read_to_string(&out).unwrap_or_default()
            + &std::fs::read_to_string(dir.path().join("run.err")).unwrap_or_default();
        if text.contains("Initial connection to the Broker failed")
            || std::time::Instant::now() > deadline
        {
            break text;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(!text.contains("refusing to start"), "{text}");
    assert!(text.contains("127.0.0.1:1"), "{text}");
    assert!(
        text.contains("Initial connection to the Broker failed"),
        "{text}"
    );
    assert!(child.0.try_wait().unwrap().is_none(), "exited:\n{text}");
}

/// The binary with `args`, `set` in its environment and `unset` removed from it.
fn provisioner_env(args: &[&str], set: &[(&str, &str)], unset: &[&str]) -> Output {
    let mut cmd = Command::new(BIN);
    cmd.args(args).env("RUST_BACKTRACE", "1");
    for (k, v) in set {
        cmd.env(k, v);
    }
    for k in unset {
        cmd.env_remove(k);
    }
    cmd.output().unwrap()
}

/// A provisioner configuration that leaves TLS and signing on (no `choria_insecure`), so the
/// Choria security provider is used.
fn secure_yaml(dir: &Path) -> String {
    let signer = Signer::new(dir);
    write(
        dir,
        "secure.yaml",
        &format!(
            "helper: {}\ntoken: x\njwt_verify_cert: {}\nfeatures:\n  jwt: true\n",
            example_helper("helper-plain.py"),
            signer.public_hex
        ),
    )
}

/// `check`'s output holds no Rust `Debug` form and no line twice.
fn assert_words_once(out: &str) {
    // Debug forms of an enum, an Option, a Result, a struct or a quoted string in a call.
    for debug in [
        "Other(",
        "Some(",
        "Ok(",
        "Err(",
        "Pkcs11",
        "CertManager",
        "(\"",
        " { ",
        "Error {",
    ] {
        assert!(!out.contains(debug), "{debug:?} in:\n{out}");
    }
    let mut seen = std::collections::BTreeSet::new();
    for line in out.lines().filter(|l| !l.trim().is_empty()) {
        assert!(seen.insert(line), "printed twice: {line:?}\n{out}");
    }
}

fn running_as_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find(|l| l.starts_with("Uid:"))
        .and_then(|l| l.split_whitespace().nth(2).map(|u| u == "0"))
        .unwrap()
}

/// The smallest Choria configuration there is selects go-choria's default provider, puppet:
/// `check` shows its ssldir, certname and files, and names each missing file once, in words.
#[test]
fn check_with_only_brokers_and_identity_uses_the_puppet_provider_and_says_each_problem_once() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = secure_yaml(dir.path());
    let cfg = write(
        dir.path(),
        "choria.cfg",
        "plugin.choria.middleware_hosts = nats://broker.example.net:4222\nidentity = prov1.example.net\n",
    );
    let home = dir.path().join("home");
    let user = "cli-check-8f3a";
    let o = provisioner_env(
        &["check", "--config", &yaml, "--choria-config", &cfg],
        &[("USER", user), ("HOME", &home.display().to_string())],
        &["MCOLLECTIVE_CERTNAME"],
    );
    assert!(!o.status.success());
    let out = stdout(&o);
    assert_words_once(&out);
    let ssldir = if running_as_root() {
        std::path::PathBuf::from("/etc/puppetlabs/puppet/ssl")
    } else {
        home.join(".puppetlabs/etc/puppet/ssl")
    };
    let certname = format!("{user}.mcollective");
    let cert = ssldir.join(format!("certs/{certname}.pem"));
    test_support::assert_contains_all(
        &out,
        &[
            "security: puppet".to_string(),
            format!("caller: choria={certname}"),
            format!("certname: {certname} (USER, as <USER>.mcollective)"),
            format!("ssldir: {}", ssldir.display()),
            format!("certificate: {}", cert.display()),
        ],
    );
    let problems: Vec<&str> = out.lines().filter(|l| l.starts_with("problem:")).collect();
    assert_eq!(problems.len(), 3, "certificate, key and CA:\n{out}");
    assert!(
        problems[0].contains(&format!(
            "the puppet provider's certificate {} does not exist",
            cert.display()
        )),
        "{out}"
    );
    assert!(problems[1].contains(&format!("private_keys/{certname}.pem does not exist")));
    assert!(problems[2].contains("certs/ca.pem does not exist"), "{out}");
    assert!(
        stderr(&o).trim().ends_with("3 problem(s) found"),
        "{}",
        stderr(&o)
    );
}

/// Without `MCOLLECTIVE_CERTNAME` or `USER` the puppet provider cannot name its certificate:
/// one problem saying what to set, and the caller is not guessed.
#[test]
fn without_a_certname_the_puppet_provider_says_what_to_set_once() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = secure_yaml(dir.path());
    let cfg = write(
        dir.path(),
        "choria.cfg",
        "identity = prov1.example.net\nplugin.choria.middleware_hosts = nats://b.example.net:4222\n\
         plugin.security.provider = puppet\nplugin.choria.ssldir = /nonexistent/ssl\n",
    );
    let o = provisioner_env(
        &["check", "--config", &yaml, "--choria-config", &cfg],
        &[],
        &["USER", "MCOLLECTIVE_CERTNAME"],
    );
    assert!(!o.status.success());
    let out = stdout(&o);
    assert_words_once(&out);
    assert!(out.contains("caller: unknown"), "{out}");
    let problems: Vec<&str> = out.lines().filter(|l| l.starts_with("problem:")).collect();
    assert_eq!(problems.len(), 1, "{out}");
    assert!(
        problems[0].contains("set MCOLLECTIVE_CERTNAME") && problems[0].contains("USER"),
        "{out}"
    );
}

/// pkcs11, certmanager and names go-choria does not know are one problem each, in words,
/// saying what to use instead; the daemon refuses to start with the same words.
#[test]
fn unsupported_providers_are_one_problem_naming_what_to_use_and_stop_the_daemon() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = secure_yaml(dir.path());
    for (provider, wants) in [
        (
            "pkcs11",
            vec![
                "the pkcs11 security provider is not supported",
                "plugin.security.provider = file",
                "plugin.security.file.key",
            ],
        ),
        (
            "certmanager",
            vec![
                "the certmanager security provider is not supported",
                "plugin.security.provider = file",
                "plugin.security.file.certificate",
            ],
        ),
        (
            "vault",
            vec![
                "security provider vault is unknown",
                "puppet (the default), file and choria",
            ],
        ),
    ] {
        // Nothing listens there: the daemon must refuse before it tries the broker.
        let cfg = write(
            dir.path(),
            "choria.cfg",
            &format!(
                "identity = p1\nplugin.choria.middleware_hosts = nats://127.0.0.1:1\n\
                 plugin.security.provider = {provider}\n"
            ),
        );
        let o = provisioner(&["check", "--config", &yaml, "--choria-config", &cfg]);
        assert!(!o.status.success(), "{provider}");
        let out = stdout(&o);
        assert_words_once(&out);
        assert!(out.contains(&format!("security: {provider}\n")), "{out}");
        let problems: Vec<&str> = out
            .lines()
            .filter_map(|l| l.strip_prefix("problem: "))
            .collect();
        assert_eq!(problems.len(), 1, "{out}");
        for want in &wants {
            assert!(problems[0].contains(want), "{want:?} missing:\n{out}");
        }
        let line = one_line_failure(&provisioner(&["--config", &yaml, "--choria-config", &cfg]));
        assert!(
            line.contains("refusing to start, 1 problem(s) found"),
            "{line}"
        );
        assert!(line.contains(problems[0]), "{line}");
    }
}

/// Regression: `check` said `ok` for a missing `monitor_token_file` and an `audit_file` in a
/// missing directory, which `run` refused (a restart loop under the unit right after a clean
/// check). Both now come from one preflight.
#[test]
fn check_refuses_a_missing_token_file_and_audit_directory_as_run_does() {
    let dir = tempfile::tempdir().unwrap();
    let (yaml, cfg) = good_setup(dir.path());
    let text = std::fs::read_to_string(&yaml).unwrap();
    let yaml = write(
        dir.path(),
        "status.yaml",
        &format!(
            "{text}monitor_token_file: {0}/missing.token\naudit_file: {0}/missing/audit.log\n",
            dir.path().display()
        ),
    );
    let checked = provisioner(&["check", "--config", &yaml, "--choria-config", &cfg]);
    assert!(!checked.status.success(), "{}", stdout(&checked));
    let out = stdout(&checked);
    assert!(!out.contains("ok: the configuration is usable"), "{out}");
    let problems: Vec<&str> = out
        .lines()
        .filter_map(|l| l.strip_prefix("problem: "))
        .collect();
    assert_eq!(problems.len(), 2, "{out}");
    assert!(
        problems.iter().any(|p| p.contains("monitor_token_file")),
        "{out}"
    );
    assert!(
        problems.iter().any(|p| p.contains("does not exist")),
        "{out}"
    );
    let line = one_line_failure(&provisioner(&[
        "run",
        "--config",
        &yaml,
        "--choria-config",
        &cfg,
    ]));
    assert!(
        line.contains("refusing to start, 2 problem(s) found"),
        "{line}"
    );
    for p in &problems {
        assert!(line.contains(p), "{p:?} missing from {line}");
    }
}
