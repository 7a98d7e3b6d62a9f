//! Tests of `preflight`.
#![allow(clippy::unwrap_used)]

use super::*;

fn write(dir: &Path, name: &str, text: &str, mode: u32) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
    p
}

fn args(config: &Path, choria: &Path) -> Paths {
    Paths::new(config, choria)
}

/// Whenever both files load, `check` finds exactly what the daemon's preflight finds.
#[test]
fn check_and_run_find_the_same_problems() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let helper = write(d, "helper.sh", "#!/bin/sh\necho {}\n", 0o644);
    let seed = write(d, "signer.seed", "not a seed", 0o644);
    let token = write(d, "signer.jwt", "not a jwt", 0o600);
    let yaml = write(
        d,
        "p.yaml",
        &format!(
            "helper: {}\nchoria_insecure: true\njwt_verify_cert: {}/nope.pem\n\
                 jwt_signing_key: {}\njwt_signing_token: {}\nworkerz: 3\n\
                 features:\n  ed25519: true\n  upgrades: true\n",
            helper.display(),
            d.display(),
            seed.display(),
            token.display()
        ),
        0o600,
    );
    let cfg = write(
        d,
        "c.cfg",
        "identity = p1\nplugin.choria.middleware_hosts = nats://b.example.net:x\n",
        0o600,
    );
    let checked = Report::examine(&args(&yaml, &cfg));
    let settings = Settings::load(&args(&yaml, &cfg)).unwrap();
    let mut from_check = checked.problems.clone();
    let mut from_run = problems(&settings);
    match refuse(&settings) {
        Err(crate::Error::Refused { problems }) => {
            assert_eq!(problems, checked.fatal().collect::<Vec<_>>())
        }
        other => panic!("{other:?}"),
    }
    from_check.sort_by(|a, b| format!("{a:?}").cmp(&format!("{b:?}")));
    from_run.sort_by(|a, b| format!("{a:?}").cmp(&format!("{b:?}")));
    assert_eq!(from_check, from_run);
    let fatal: Vec<_> = from_run.iter().filter_map(Problem::fatal).collect();
    for want in [
        "is not an executable file",
        "jwt_verify_cert",
        "jwt_signing_key",
        "jwt_signing_token",
        "b.example.net:x",
    ] {
        assert!(
            fatal.iter().any(|t| t.contains(want)),
            "{want:?} not fatal: {from_run:?}"
        );
    }
    let warnings: Vec<_> = from_run.iter().filter_map(Problem::warning).collect();
    for want in [
        "workerz",
        "no token is set",
        "upgrades_repository",
        "readable by group or others",
    ] {
        assert!(
            warnings.iter().any(|t| t.contains(want)),
            "{want:?} not a warning: {from_run:?}"
        );
    }
}
