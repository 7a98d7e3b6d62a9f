//! `check` refuses exactly what `run` refuses: the same bad inputs are given to both, as the
//! binary gives them (`check` through [`Report::examine`], `run` through [`Settings::load`]
//! then [`Daemon::builder`]'s preflight, before anything binds or connects), and the verdicts
//! must agree: both accept, or both refuse and `run`'s reasons are among `check`'s problems.
#![allow(clippy::unwrap_used)]

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};

use provisioner::preflight::Report;
use provisioner::{Daemon, Error, Paths, Settings};
use test_support::ca::TestCa;

/// The files of one case, in their own directory.
struct Case {
    dir: tempfile::TempDir,
    yaml: String,
    choria: String,
}

fn write(path: &Path, text: &str, mode: u32) {
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

impl Case {
    /// A usable setup: an executable helper, no features, plain (insecure) Choria.
    fn new() -> Case {
        let dir = tempfile::tempdir().unwrap();
        let helper = dir.path().join("helper.sh");
        write(&helper, "#!/bin/sh\necho '{}'\n", 0o755);
        Case {
            yaml: format!("helper: {}\nchoria_insecure: true\n", helper.display()),
            choria: "identity = p1.example.net\n\
                     plugin.choria.middleware_hosts = nats://127.0.0.1:4222\n"
                .to_string(),
            dir,
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// A file in the case's directory with `text` and `mode`.
    fn file(&self, name: &str, text: &str, mode: u32) -> String {
        let p = self.path(name);
        write(&p, text, mode);
        p.display().to_string()
    }

    fn yaml(mut self, more: &str) -> Case {
        self.yaml.push_str(more);
        self
    }

    fn choria(mut self, more: &str) -> Case {
        self.choria.push_str(more);
        self
    }

    fn paths(&self) -> Paths {
        let yaml = self.path("provisioner.yaml");
        let cfg = self.path("choria.cfg");
        write(&yaml, &self.yaml, 0o600);
        write(&cfg, &self.choria, 0o600);
        Paths::new(yaml, cfg)
    }
}

/// What `check` says: `Ok` or its fatal problems.
fn check(paths: &Paths) -> Result<(), Vec<String>> {
    let report = Report::examine(paths);
    let fatal: Vec<String> = report.fatal().map(str::to_string).collect();
    if fatal.is_empty() {
        Ok(())
    } else {
        Err(fatal)
    }
}

/// What `run` says before it binds or connects: `Ok` or why it refuses.
fn run(paths: &Paths) -> Result<(), Vec<String>> {
    let daemon = Settings::load(paths).and_then(|s| Daemon::builder(s).build());
    match daemon {
        Ok(_) => Ok(()),
        Err(Error::Refused { problems }) => Err(problems),
        Err(e) => Err(vec![provisioner::one_line(&e)]),
    }
}

/// Both verdicts, asserted equal; returns `check`'s problems.
fn verdicts(name: &str, case: &Case) -> Result<(), Vec<String>> {
    let paths = case.paths();
    let checked = check(&paths);
    let ran = run(&paths);
    match (&checked, &ran) {
        (Ok(()), Ok(())) => {}
        (Err(from_check), Err(from_run)) => {
            for reason in from_run {
                assert!(
                    from_check
                        .iter()
                        .any(|c| c.contains(reason.as_str()) || reason.contains(c.as_str())),
                    "{name}: run refuses with {reason:?}, which check does not list: {from_check:?}"
                );
            }
        }
        _ => panic!("{name}: check says {checked:?} but run says {ran:?}"),
    }
    checked
}

fn refused(name: &str, case: Case, want: &str) {
    match verdicts(name, &case) {
        Ok(()) => panic!("{name}: accepted, but it should be refused for {want:?}"),
        Err(problems) => assert!(
            problems.iter().any(|p| p.contains(want)),
            "{name}: {want:?} not among {problems:?}"
        ),
    }
}

#[test]
fn a_usable_setup_is_accepted_by_both() {
    let case = Case::new();
    assert_eq!(verdicts("usable", &case), Ok(()));
    // World-readable key material is a warning, not a refusal, for both.
    let case = Case::new();
    let seed = case.file("signer.seed", &"ab".repeat(32), 0o644);
    let case = case.yaml(&format!(
        "jwt_signing_key: {seed}\nfeatures: {{ed25519: true}}\n"
    ));
    let case = {
        let verify = case.file("verify.hex", &"cd".repeat(32), 0o644);
        case.yaml(&format!("jwt_verify_cert: {verify}\n"))
    };
    assert_eq!(verdicts("readable seed", &case), Ok(()));
    let report = Report::examine(&case.paths());
    assert!(
        report
            .warnings()
            .any(|w| w.contains("readable by group or others")),
        "{:?}",
        report.warnings().collect::<Vec<_>>()
    );
}

#[test]
fn token_and_audit_files_are_refused_by_both() {
    refused(
        "missing monitor_token_file",
        Case::new().yaml("monitor_token_file: /nonexistent/token\n"),
        "monitor_token_file",
    );
    let case = Case::new();
    let empty = case.file("token", "\n  \n", 0o600);
    refused(
        "empty monitor_token_file",
        case.yaml(&format!("monitor_token_file: {empty}\n")),
        "is empty",
    );
    let case = Case::new();
    let dir = case.path("token-dir");
    std::fs::create_dir(&dir).unwrap();
    refused(
        "unreadable monitor_token_file (a directory)",
        case.yaml(&format!("monitor_token_file: {}\n", dir.display())),
        "monitor_token_file",
    );
    refused(
        "audit_file in a missing directory",
        Case::new().yaml("audit_file: /nonexistent/dir/audit.log\n"),
        "does not exist",
    );
}

#[test]
fn signing_and_verification_keys_are_refused_by_both() {
    let ed = |seed: Option<(&str, u32)>, token: Option<&str>| {
        let case = Case::new();
        let verify = case.file("verify.hex", &"cd".repeat(32), 0o600);
        let mut yaml = format!("features: {{ed25519: true}}\njwt_verify_cert: {verify}\n");
        match seed {
            Some((text, mode)) => {
                let p = case.file("signer.seed", text, mode);
                yaml.push_str(&format!("jwt_signing_key: {p}\n"));
            }
            None => yaml.push_str("jwt_signing_key: /nonexistent/signer.seed\n"),
        }
        if let Some(t) = token {
            let p = case.file("signer.jwt", t, 0o600);
            yaml.push_str(&format!("jwt_signing_token: {p}\n"));
        }
        case.yaml(&yaml)
    };
    refused("missing seed", ed(None, None), "jwt_signing_key");
    refused("empty seed", ed(Some(("", 0o600)), None), "jwt_signing_key");
    refused(
        "malformed seed",
        ed(Some(("not a seed", 0o600)), None),
        "jwt_signing_key",
    );
    refused(
        "malformed token",
        ed(Some((&"ab".repeat(32), 0o600)), Some("not a jwt")),
        "jwt_signing_token",
    );
    refused(
        "no signing key at all",
        Case::new().yaml("features: {ed25519: true}\n"),
        "needs jwt_signing_key",
    );
    let case = Case::new();
    let bad = case.file("verify.pem", "-----BEGIN PUBLIC KEY-----\nnope\n", 0o600);
    refused(
        "malformed jwt_verify_cert",
        case.yaml(&format!(
            "features: {{jwt: true}}\njwt_verify_cert: {bad}\n"
        )),
        "jwt_verify_cert",
    );
}

#[test]
fn helpers_and_policies_are_refused_by_both() {
    refused(
        "missing helper",
        Case::new().yaml("helper: /nonexistent/helper\n"),
        "helper",
    );
    let case = Case::new();
    let plain = case.file("plain.sh", "#!/bin/sh\n", 0o644);
    refused(
        "helper not executable",
        case.yaml(&format!("helper: {plain}\n")),
        "not an executable file",
    );
    let case = Case::new();
    let secret = case.file("secret", "s3cret\n", 0o644);
    refused(
        "world-readable webhook secret",
        case.yaml(&format!(
            "helper: http://127.0.0.1:9/\nhelper_secret_file: {secret}\n"
        )),
        "helper_secret_file",
    );
    refused(
        "missing webhook secret",
        Case::new().yaml("helper: http://127.0.0.1:9/\nhelper_secret_file: /nonexistent\n"),
        "helper_secret_file",
    );
    let case = Case::new();
    let policy = case.file(
        "policy.rego",
        "package choria.provisioner\nthis is not rego\n",
        0o600,
    );
    refused(
        "rego syntax error",
        case.yaml(&format!("rego_policy: {policy}\n")),
        "policy.rego",
    );
}

#[test]
fn every_fatal_configuration_error_is_refused_by_both() {
    for (name, yaml, want) in [
        ("interval too small", "interval: 10s\n", "too small"),
        ("bad duration", "interval: 10\n", "interval"),
        (
            "pki and ed25519",
            "features: {pki: true, ed25519: true}\n",
            "pki or ed25519",
        ),
        (
            "identity pattern",
            "identity_pattern: '('\n",
            "identity_pattern",
        ),
        (
            "csr names",
            "csr_extra_dns_names: '('\n",
            "csr_extra_dns_names",
        ),
        ("deny list", "cert_deny_list: ['(']\n", "cert_deny_list"),
        (
            "lifecycle component",
            "lifecycle_component: a.b\n",
            "lifecycle",
        ),
        (
            "both HA modes",
            "active_active: true\nleader_election: true\n",
            "active_active",
        ),
        ("claim lifetime", "claim_lifetime: 1s\n", "claim_lifetime"),
        (
            "monitor address",
            "monitor_address: nowhere\n",
            "monitor_address",
        ),
        ("audit stream", "audit_stream: a.b\n", "audit_stream"),
        (
            "reply signature mode",
            "helper: http://127.0.0.1:9/\nhelper_reply_signature: always\n",
            "helper_reply_signature",
        ),
        (
            "reply signature without a secret",
            "helper: http://127.0.0.1:9/\nhelper_reply_signature: required\n",
            "helper_secret_file is not set",
        ),
        ("syntax", "features: [\n", "could not be parsed"),
        ("wrong type", "workers: many\n", "workers"),
    ] {
        refused(name, Case::new().yaml(yaml), want);
    }
    // An empty helper is no helper.
    let mut case = Case::new();
    case.yaml = "choria_insecure: true\n".into();
    refused("no helper", case, "no helper is configured");
}

#[test]
fn missing_files_and_choria_security_are_refused_by_both() {
    let case = Case::new();
    let mut paths = case.paths();
    paths.config = Some(case.path("nonexistent.yaml"));
    let (c, r) = (check(&paths), run(&paths));
    assert!(c.is_err() && r.is_err(), "{c:?} {r:?}");
    let mut paths = case.paths();
    paths.choria_config = Some(case.path("nonexistent.cfg"));
    let (c, r) = (check(&paths), run(&paths));
    assert!(c.is_err() && r.is_err(), "{c:?} {r:?}");

    refused(
        "bad broker url",
        Case::new().choria("plugin.choria.middleware_hosts = nats://b.example.net:x\n"),
        "b.example.net:x",
    );
    // The file security provider, with a certificate, key and CA from the test CA.
    let secure = |name: &str, edit: &dyn Fn(&Case, &mut [String; 3])| {
        let mut case = Case::new();
        case.yaml = case.yaml.replace("choria_insecure: true\n", "");
        let ca = TestCa::new(case.dir.path()).unwrap();
        let issued = ca.issue("p1.example.net", &["p1.example.net"]).unwrap();
        let mut files = [
            issued.cert.display().to_string(),
            issued.key.display().to_string(),
            ca.cert.display().to_string(),
        ];
        edit(&case, &mut files);
        let case = case.choria(&format!(
            "plugin.security.provider = file\n\
             plugin.security.file.certificate = {}\n\
             plugin.security.file.key = {}\n\
             plugin.security.file.ca = {}\n",
            files[0], files[1], files[2]
        ));
        (name.to_string(), case)
    };
    let (name, case) = secure("file provider", &|_, _| {});
    assert_eq!(verdicts(&name, &case), Ok(()));
    let (name, case) = secure("missing certificate", &|_, f| {
        f[0] = "/nonexistent/cert.pem".into()
    });
    refused(&name, case, "does not exist");
    let (name, case) = secure("certificate without PEM", &|c, f| {
        f[0] = c.file("junk.pem", "junk", 0o600)
    });
    refused(&name, case, "holds no PEM data");
    let (name, case) = secure("empty key", &|c, f| f[1] = c.file("empty.pem", "", 0o600));
    refused(&name, case, "plugin.security.file.key");
    let (name, case) = secure("missing CA", &|_, f| f[2] = "/nonexistent/ca.pem".into());
    refused(&name, case, "plugin.security.file.ca");
}

#[test]
fn check_prints_the_reply_signature_mode_and_warns_when_it_has_no_effect() {
    let case = Case::new();
    let secret = case.file("secret", "s3cret\n", 0o600);
    let hook = format!("helper: http://127.0.0.1:9/p\nhelper_secret_file: {secret}\n");
    let case = case.yaml(&hook);
    let plan = Report::examine(&case.paths()).plan();
    assert!(
        plan.contains(
            "helper: http://127.0.0.1:9/p (webhook; requests signed (signature versions 2 and 1), \
             signed replies checked and unsigned ones accepted (helper_reply_signature optional))"
        ),
        "{plan}"
    );
    let case = case.yaml("helper_reply_signature: required\n");
    assert_eq!(verdicts("required", &case), Ok(()));
    let plan = Report::examine(&case.paths()).plan();
    assert!(
        plan.contains("replies must be signed (helper_reply_signature required)"),
        "{plan}"
    );
    // With a command the key does nothing: a warning, not a refusal.
    let case = Case::new().yaml("helper_reply_signature: required\n");
    assert_eq!(verdicts("command", &case), Ok(()));
    let report = Report::examine(&case.paths());
    assert!(
        report
            .warnings()
            .any(|w| w.contains("helper_reply_signature has no effect")),
        "{:?}",
        report.warnings().collect::<Vec<_>>()
    );
}
