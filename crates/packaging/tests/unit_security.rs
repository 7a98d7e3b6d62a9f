//! The packaged unit keeps its sandbox: it names a service account (never root), and
//! `systemd-analyze security --offline=true packaging/choria-provisioner.service` rates it at
//! most 1.0. The score is checked where systemd-analyze (systemd 250 or newer) is installed; the
//! test says so when it is not.

use std::path::PathBuf;

use packaging::unit_security;

fn unit() -> PathBuf {
    test_support::workspace_root().join("packaging/choria-provisioner.service")
}

fn systemd_analyze() -> Option<PathBuf> {
    packaging::host::which("systemd-analyze").ok()
}

#[test]
fn the_unit_runs_as_its_service_account() {
    let text = std::fs::read_to_string(unit()).expect("the packaged unit is readable");
    let user = unit_security::service_user(&text).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(user, "choria-provisioner");
}

#[test]
fn a_root_unit_is_refused() {
    let text = std::fs::read_to_string(unit()).expect("the packaged unit is readable");
    for root in ["User=root", "User=0", "User="] {
        let changed = text.replace("User=choria-provisioner", root);
        assert!(
            unit_security::service_user(&changed).is_err(),
            "{root} should be refused"
        );
    }
    let dynamic = text.replace("User=choria-provisioner", "DynamicUser=yes");
    assert!(unit_security::service_user(&dynamic).is_ok());
}

#[test]
fn the_overall_exposure_is_read_from_the_report() {
    let report = "✗ PrivateNetwork= ... 0.5\n\n→ Overall exposure level for x.service: 1.0 OK 🙂\n";
    assert_eq!(unit_security::overall_tenths(report), Some(10));
    let report = "→ Overall exposure level for x.service: 9.6 UNSAFE 😨\n";
    assert_eq!(unit_security::overall_tenths(report), Some(96));
    assert_eq!(unit_security::overall_tenths("nothing"), None);
}

#[test]
fn systemd_analyze_rates_the_unit_at_most_1_0() {
    let Some(analyze) = systemd_analyze() else {
        eprintln!("skipped: systemd-analyze is not installed, the unit's exposure is not scored");
        return;
    };
    let scored = unit_security::exposure(&analyze, &unit()).unwrap_or_else(|e| panic!("{e}"));
    let (tenths, report) = match scored {
        Ok(r) => r,
        Err(why) => {
            eprintln!("skipped: {why}");
            return;
        }
    };
    assert!(
        tenths <= unit_security::MAX_EXPOSURE_TENTHS,
        "systemd-analyze security rates packaging/choria-provisioner.service {}, above {}:\n{report}",
        unit_security::format_tenths(tenths),
        unit_security::format_tenths(unit_security::MAX_EXPOSURE_TENTHS)
    );
}

#[test]
fn a_looser_unit_would_be_caught() {
    let Some(analyze) = systemd_analyze() else {
        eprintln!("skipped: systemd-analyze is not installed");
        return;
    };
    // The unit as it was before this check: root, netlink, no PrivateUsers= and the wider
    // system call set. The test must see it above the limit.
    let text = std::fs::read_to_string(unit()).expect("the packaged unit is readable");
    let looser = text
        .replace("User=choria-provisioner", "User=root")
        .replace("PrivateUsers=yes", "PrivateUsers=no")
        .replace("SystemCallFilter=~@privileged @resources\n", "");
    let dir = std::env::temp_dir().join(format!("unit-security-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temporary directory");
    let file = dir.join("choria-provisioner.service");
    std::fs::write(&file, looser).expect("write the looser unit");
    let scored = unit_security::exposure(&analyze, &file);
    let _ = std::fs::remove_dir_all(&dir);
    match scored.unwrap_or_else(|e| panic!("{e}")) {
        Ok((tenths, report)) => assert!(
            tenths > unit_security::MAX_EXPOSURE_TENTHS,
            "a root unit without PrivateUsers= should score above 1.0:\n{report}"
        ),
        Err(why) => eprintln!("skipped: {why}"),
    }
}
