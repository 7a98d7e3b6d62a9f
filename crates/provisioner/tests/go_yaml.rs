//! The provisioner YAML read as the Go provisioner reads it: a table of what Go's decoder
//! (`ghodss/yaml` v1.0.0 over `gopkg.in/yaml.v2` v2.4.0, then `encoding/json` into its
//! `config.Config`) makes of a file, one row per case, each with Go's outcome as observed, and
//! ours: the same, or a stated difference that only ever lets a file Go refuses load.

#![allow(clippy::unwrap_used)]

use provisioner::config::{Config, ConfigError, ConfigWarning};

/// What the Go provisioner's loader does with a file.
enum Go {
    /// Loads it; these settings come out (`key`, value as [`setting`] shows it).
    Reads(&'static [(&'static str, &'static str)]),
    /// Refuses it with this error.
    Refuses(&'static str),
    /// Crashes (a nil pointer dereference).
    Panics,
}

/// What we do.
enum Ours {
    /// As Go: the same settings, or a refusal.
    AsGo,
    /// Go refuses or crashes; we load it with these settings, for the reason given.
    Reads(&'static [(&'static str, &'static str)], &'static str),
    /// Go reads a value none of whose uses can work; we refuse it (the message holds this).
    Refuses(&'static str, &'static str),
}

struct Row {
    yaml: &'static str,
    go: Go,
    ours: Ours,
}

const fn row(yaml: &'static str, go: Go, ours: Ours) -> Row {
    Row { yaml, go, ours }
}

use Go::{Panics, Reads, Refuses};
use Ours::AsGo;

const QUOTED_MEANING: &str =
    "the value's meaning is plain; the quotes or the type are the only fault";

const TABLE: &[Row] = &[
    // YAML 1.1 booleans, and what is not one.
    row("leader_election: yes", Reads(&[("leader_election", "true")]), AsGo),
    row("leader_election: Yes", Reads(&[("leader_election", "true")]), AsGo),
    row("leader_election: YES", Reads(&[("leader_election", "true")]), AsGo),
    row("leader_election: y", Reads(&[("leader_election", "true")]), AsGo),
    row("leader_election: Y", Reads(&[("leader_election", "true")]), AsGo),
    row("leader_election: on", Reads(&[("leader_election", "true")]), AsGo),
    row("leader_election: On", Reads(&[("leader_election", "true")]), AsGo),
    row("leader_election: ON", Reads(&[("leader_election", "true")]), AsGo),
    row("leader_election: true", Reads(&[("leader_election", "true")]), AsGo),
    row("leader_election: True", Reads(&[("leader_election", "true")]), AsGo),
    row("leader_election: TRUE", Reads(&[("leader_election", "true")]), AsGo),
    row("choria_insecure: n", Reads(&[("choria_insecure", "false")]), AsGo),
    row("choria_insecure: N", Reads(&[("choria_insecure", "false")]), AsGo),
    row("choria_insecure: no", Reads(&[("choria_insecure", "false")]), AsGo),
    row("choria_insecure: No", Reads(&[("choria_insecure", "false")]), AsGo),
    row("choria_insecure: NO", Reads(&[("choria_insecure", "false")]), AsGo),
    row("choria_insecure: off", Reads(&[("choria_insecure", "false")]), AsGo),
    row("choria_insecure: Off", Reads(&[("choria_insecure", "false")]), AsGo),
    row("choria_insecure: OFF", Reads(&[("choria_insecure", "false")]), AsGo),
    row("choria_insecure: false", Reads(&[("choria_insecure", "false")]), AsGo),
    row("choria_insecure: False", Reads(&[("choria_insecure", "false")]), AsGo),
    row("choria_insecure: FALSE", Reads(&[("choria_insecure", "false")]), AsGo),
    row("upgrades_optional: Y\nleader_election: ON\nchoria_insecure: n", Reads(&[("upgrades_optional", "true"), ("leader_election", "true"), ("choria_insecure", "false")]), AsGo),
    row("leader_election: tRUE", Refuses("json: cannot unmarshal string into Go struct field Config.leader_election of type bool"), AsGo),
    row("leader_election: oN", Refuses("json: cannot unmarshal string into Go struct field Config.leader_election of type bool"), AsGo),
    row("leader_election: 1", Refuses("json: cannot unmarshal number into Go struct field Config.leader_election of type bool"), AsGo),
    row("leader_election: maybe", Refuses("json: cannot unmarshal string into Go struct field Config.leader_election of type bool"), AsGo),
    row("leader_election: \"yes\"", Refuses("json: cannot unmarshal string into Go struct field Config.leader_election of type bool"), Ours::Reads(&[("leader_election", "true")], QUOTED_MEANING)),
    row("leader_election: !!bool yes", Reads(&[("leader_election", "true")]), AsGo),
    row("leader_election: ~", Reads(&[("leader_election", "false")]), AsGo),
    row("leader_election:", Reads(&[("leader_election", "false")]), AsGo),
    row("features:\n  JWT: yes\n  Upgrades: on", Reads(&[("features.jwt", "true"), ("features.upgrades", "true"), ("features.pki", "false")]), AsGo),
    // Keys in any case, as encoding/json matches them.
    row("Helper: /bin/x", Reads(&[("helper", "/bin/x")]), AsGo),
    row("HELPER: /bin/x", Reads(&[("helper", "/bin/x")]), AsGo),
    row("hElPeR: /bin/x", Reads(&[("helper", "/bin/x")]), AsGo),
    row("Leader_Election: yes\nFeatures:\n  PKI: true", Reads(&[("leader_election", "true"), ("features.pki", "true")]), AsGo),
    row("\"helper\": x", Reads(&[("helper", "x")]), AsGo),
    row("{helper: x, Site: lon}", Reads(&[("helper", "x"), ("site", "lon")]), AsGo),
    // Unicode simple folding: the long s is an s, the Kelvin sign a k; nothing else non-ASCII.
    row("\u{17f}ite: long-s", Reads(&[("site", "long-s")]), AsGo),
    row("wor\u{212a}ers: 3", Reads(&[("workers", "3")]), AsGo),
    row("s\u{131}te: dotless", Reads(&[("site", "")]), AsGo),
    row("S\u{130}TE: dotted", Reads(&[("site", "")]), AsGo),
    // Two spellings of one key: all are applied in byte order of the key, the last counts.
    row("Helper: a\nhelper: b", Reads(&[("helper", "b")]), AsGo),
    row("helper: a\nHelper: b", Reads(&[("helper", "a")]), AsGo),
    row("helper: a\nHELPER: b", Reads(&[("helper", "a")]), AsGo),
    row("\u{17f}ite: long-s\nsite: plain", Reads(&[("site", "long-s")]), AsGo),
    row("helper: ~\nHelper: x", Reads(&[("helper", "x")]), AsGo),
    row("helper: a\nHelper: ~", Reads(&[("helper", "a")]), AsGo),
    row("Features: {pki: true}\nfeatures: {upgrades: true}", Reads(&[("features.pki", "true"), ("features.upgrades", "true")]), AsGo),
    row("cert_deny_list: [a]\nCert_Deny_List: ~", Reads(&[("cert_deny_list", "a")]), AsGo),
    row("Cert_Deny_List: [a]\ncert_deny_list: ~", Reads(&[("cert_deny_list", DEFAULT_DENY)]), AsGo),
    // The same key twice: the last one counts, an earlier bad value is never looked at.
    row("helper: a\nhelper: b", Reads(&[("helper", "b")]), AsGo),
    row("workers: many\nworkers: 3", Reads(&[("workers", "3")]), AsGo),
    row("features: {pki: true}\nfeatures: {jwt: true}", Reads(&[("features.pki", "false"), ("features.jwt", "true")]), AsGo),
    // Keys Go's struct has no tag for are ignored.
    row("Insecure: true", Reads(&[("choria_insecure", "false")]), AsGo),
    row("Mutex: x\nFile: y\nIntervalDuration: 5", Reads(&[("interval", "60s")]), AsGo),
    // Integers: YAML 1.1 forms, then through JSON into Go's int.
    row("workers: 010", Reads(&[("workers", "8")]), AsGo),
    row("workers: 08", Reads(&[("workers", "8")]), AsGo),
    row("workers: 0x10", Reads(&[("workers", "16")]), AsGo),
    row("workers: 0o10", Reads(&[("workers", "8")]), AsGo),
    row("workers: 0b11", Reads(&[("workers", "3")]), AsGo),
    row("workers: 1_0", Reads(&[("workers", "10")]), AsGo),
    row("workers: +4", Reads(&[("workers", "4")]), AsGo),
    row("workers: 1e1", Reads(&[("workers", "10")]), AsGo),
    row("workers: 1e3", Reads(&[("workers", "1000")]), AsGo),
    row("workers: 4.0", Reads(&[("workers", "4")]), AsGo),
    row("workers: !!int \"010\"", Reads(&[("workers", "8")]), AsGo),
    row("workers: 4.5", Refuses("json: cannot unmarshal number 4.5 into Go struct field Config.workers of type int"), AsGo),
    row("workers: 1e21", Refuses("json: cannot unmarshal number 1e+21 into Go struct field Config.workers of type int"), AsGo),
    row("workers: 0x", Refuses("json: cannot unmarshal string into Go struct field Config.workers of type int"), AsGo),
    row("workers: many", Refuses("json: cannot unmarshal string into Go struct field Config.workers of type int"), AsGo),
    row("workers: \"4\"", Refuses("json: cannot unmarshal string into Go struct field Config.workers of type int"), Ours::Reads(&[("workers", "4")], QUOTED_MEANING)),
    row("workers: -1", Reads(&[("workers", "-1")]), Ours::Refuses("expected a whole number from 0 to 4294967295", "Go starts no worker at all and provisions nothing")),
    row("workers: 99999999999", Reads(&[("workers", "99999999999")]), Ours::Refuses("expected a whole number from 0 to 4294967295", "Go tries to start that many workers")),
    row("monitor_port: 70000", Reads(&[("monitor_port", "70000")]), Ours::Refuses("expected a whole number from 0 to 65535", "no port has that number; Go's listener fails")),
    // Text: any string; Go refuses numbers and booleans, which we read as written.
    row("token: 2001-12-14", Reads(&[("token", "2001-12-14")]), AsGo),
    row("token: !!str 5", Reads(&[("token", "5")]), AsGo),
    row("helper: |\n  /bin/x --a", Reads(&[("helper", "/bin/x --a")]), AsGo),
    row("token: \"12345\"", Reads(&[("token", "12345")]), AsGo),
    row("token: 12345", Refuses("json: cannot unmarshal number into Go struct field Config.token of type string"), Ours::Reads(&[("token", "12345")], QUOTED_MEANING)),
    row("token: 0x1F", Refuses("json: cannot unmarshal number into Go struct field Config.token of type string"), Ours::Reads(&[("token", "0x1F")], "read as written, not as the number Go's YAML makes of it")),
    row("token: 1.5", Refuses("json: cannot unmarshal number into Go struct field Config.token of type string"), Ours::Reads(&[("token", "1.5")], QUOTED_MEANING)),
    row("site: NO", Refuses("json: cannot unmarshal bool into Go struct field Config.site of type string"), Ours::Reads(&[("site", "NO")], "a country code is not a boolean")),
    row("interval: 300", Refuses("json: cannot unmarshal number into Go struct field Config.interval of type string"), Ours::Refuses("invalid interval duration \"300\"", "refused as a duration without a unit instead")),
    row("helper:", Reads(&[("helper", "")]), AsGo),
    // Lists.
    row("cert_deny_list: [a, ~]", Reads(&[("cert_deny_list", "a,")]), AsGo),
    row("cert_deny_list: x", Refuses("json: cannot unmarshal string into Go struct field Config.cert_deny_list of type []string"), AsGo),
    row("cert_deny_list: [yes]", Refuses("json: cannot unmarshal bool into Go struct field Config.cert_deny_list of type string"), Ours::Reads(&[("cert_deny_list", "yes")], QUOTED_MEANING)),
    row("features: true", Refuses("json: cannot unmarshal bool into Go struct field Config.features of type struct"), AsGo),
    // Anchors, aliases, merge keys, documents.
    row("h: &h /bin/x\nhelper: *h", Reads(&[("helper", "/bin/x")]), AsGo),
    row("base: &b\n  helper: x\n<<: *b", Reads(&[("helper", "x")]), AsGo),
    row("base: &b {helper: x}\nhelper: y\n<<: *b", Reads(&[("helper", "x")]), AsGo),
    row("<<: {helper: merged}\nhelper: own", Reads(&[("helper", "own")]), AsGo),
    row("a: &a {helper: from-a}\nb: &b {helper: from-b}\n<<: [*a, *b]", Reads(&[("helper", "from-a")]), AsGo),
    row("interval: 5m\n---\ninterval: 10m", Reads(&[("interval", "300s")]), AsGo),
    // Whole files.
    row("", Panics, Ours::Reads(&[("interval", "60s"), ("helper", "")], "an empty file is every default")),
    row("~", Panics, Ours::Reads(&[("interval", "60s")], "an empty file is every default")),
    row("- a", Refuses("json: cannot unmarshal array into Go value of type config.Config (in package config)"), AsGo),
    row("helper: [x", Refuses("yaml: line 1: did not find expected ',' or ']'"), AsGo),
    row("unknown: .nan", Refuses("json: unsupported value: NaN"), Ours::Reads(&[("helper", "")], "a key naming nothing is warned about, whatever its value")),
    row("~: x", Refuses("Unsupported map key of type: %!s(<nil>)"), Ours::Reads(&[("helper", "")], "a key naming nothing is warned about, whatever its value")),
];

const DEFAULT_DENY: &str =
    "\\.privileged.mcollective$,\\.privileged.choria$,\\.mcollective$,\\.choria$";

/// A setting as the rows write it.
fn setting(c: &Config, key: &str) -> String {
    match key {
        "workers" => c.workers.to_string(),
        "monitor_port" => c.monitor_port.to_string(),
        "helper" => c.helper.clone(),
        "token" => c.provision.token().to_string(),
        "site" => c.site.clone(),
        "interval" => format!("{}s", c.provision.interval().as_secs()),
        "leader_election" => c.leader_election.to_string(),
        "choria_insecure" => c.choria_insecure.to_string(),
        "upgrades_optional" => c.provision.upgrades_optional().to_string(),
        "features.pki" => c.provision.features().pki.to_string(),
        "features.jwt" => c.provision.features().jwt.to_string(),
        "features.upgrades" => c.provision.features().upgrades.to_string(),
        "cert_deny_list" => c
            .provision
            .deny_list()
            .patterns()
            .collect::<Vec<_>>()
            .join(","),
        other => panic!("the table names an unknown setting {other}"),
    }
}

fn load(yaml: &str) -> Result<Config, ConfigError> {
    Config::from_yaml(yaml, "/etc/choria-provisioner/choria-provisioner.yaml").map(|l| l.config)
}

fn assert_reads(yaml: &str, want: &[(&str, &str)], why: &str) {
    let c = load(yaml).unwrap_or_else(|e| panic!("{yaml:?} ({why}) is refused: {e}"));
    for (key, value) in want {
        assert_eq!(setting(&c, key), *value, "{key} of {yaml:?} ({why})");
    }
}

#[test]
fn every_row_reads_as_the_go_provisioner_or_as_stated() {
    for r in TABLE {
        match (&r.go, &r.ours) {
            (Reads(want), Ours::AsGo) => assert_reads(r.yaml, want, "as Go"),
            (Refuses(go), Ours::AsGo) => assert!(
                load(r.yaml).is_err(),
                "{:?} loads, but Go refuses it ({go})",
                r.yaml
            ),
            (Panics, Ours::AsGo) => panic!("{:?}: nothing can match a crash", r.yaml),
            (Reads(_), Ours::Reads(..)) => panic!("{:?}: a difference needs Go to refuse", r.yaml),
            (_, Ours::Reads(want, why)) => assert_reads(r.yaml, want, why),
            (Reads(_), Ours::Refuses(msg, why)) => {
                let err = load(r.yaml).err().unwrap_or_else(|| {
                    panic!("{:?} loads, but is refused here because {why}", r.yaml)
                });
                assert!(err.to_string().contains(msg), "{:?}: {err}", r.yaml);
            }
            (_, Ours::Refuses(msg, _)) => {
                let err = load(r.yaml).err().unwrap();
                assert!(err.to_string().contains(msg), "{:?}: {err}", r.yaml);
            }
        }
    }
}

#[test]
fn a_wrong_row_would_fail() {
    // The table's check can fail: a setting that differs, and a refusal that loads.
    let c = load("Helper: a\nhelper: b").unwrap();
    assert_ne!(setting(&c, "helper"), "a");
    assert!(load("leader_election: maybe").is_err());
    assert!(load("leader_election: yes").is_ok());
}

#[test]
fn type_errors_keep_file_line_column_key_and_value() {
    let err = load("helper: x\nleader_election: maybe\n").unwrap_err();
    match &err {
        ConfigError::Syntax { line, column, .. } => {
            assert_eq!((*line, *column), (2, 18), "{err}");
        }
        other => panic!("unexpected {other:?}"),
    }
    let text = err.to_string();
    test_support::assert_contains_all(
        &text,
        &[
            "/etc/choria-provisioner/choria-provisioner.yaml",
            "leader_election",
            "\"maybe\"",
            "yes/no",
        ],
    );
    // Under a differently spelt key the value is still located and named.
    let text = load("Workers: -3\n").unwrap_err().to_string();
    assert!(text.contains("line 1 column 10"), "{text}");
    assert!(text.contains("-3"), "{text}");
}

#[test]
fn keys_go_ignores_are_warned_about_and_repeated_keys_are_named() {
    let l = Config::from_yaml(
        "Helper: a\nhelper: b\nhelpr: c\nfeatures:\n  PKI: true\n  pkj: true\nInsecure: true\n",
        "p.yaml",
    )
    .unwrap();
    assert_eq!(
        l.warnings,
        vec![
            ConfigWarning::UnknownKey("helpr".into()),
            ConfigWarning::UnknownKey("Insecure".into()),
            ConfigWarning::UnknownKey("features.pkj".into()),
            ConfigWarning::RepeatedKey {
                key: "helper".into(),
                written: vec!["Helper".into(), "helper".into()],
                used: "helper".into(),
                merged: false,
            },
        ]
    );
    assert!(l.warnings[3].to_string().contains("\"helper\" counts"));
    // A mapping under two spellings is merged, and the warning says so.
    let l = Config::from_yaml(
        "Features: {pki: true}
features: {jwt: true}
",
        "p.yaml",
    )
    .unwrap();
    assert!(l.config.provision.features().pki && l.config.provision.features().jwt);
    assert_eq!(l.warnings.len(), 1, "{:?}", l.warnings);
    assert!(
        l.warnings[0]
            .to_string()
            .contains("the mappings are merged"),
        "{}",
        l.warnings[0]
    );
    // The same spelling twice: the last replaces the first.
    let l = Config::from_yaml(
        "features: {pki: true}
features: {jwt: true}
",
        "p.yaml",
    )
    .unwrap();
    assert!(!l.config.provision.features().pki && l.config.provision.features().jwt);
    assert!(
        l.warnings[0]
            .to_string()
            .contains("the last \"features\" counts"),
        "{}",
        l.warnings[0]
    );
    // A key brought in by a merge and given again is the usual way of overriding: no warning.
    let l = Config::from_yaml("base: &b {helper: x}\n<<: *b\nhelper: y\n", "p.yaml").unwrap();
    assert_eq!(l.config.helper, "y");
    assert_eq!(l.warnings, vec![ConfigWarning::UnknownKey("base".into())]);
    // A second document is named.
    let l = Config::from_yaml("helper: x\n---\nhelper: y\n", "p.yaml").unwrap();
    assert_eq!(l.warnings, vec![ConfigWarning::ExtraDocuments]);
    assert_eq!(l.config.helper, "x");
}

#[test]
fn a_go_deployment_file_loads_unchanged() {
    // A file as Go sites write them: capitalised keys, YAML 1.1 booleans, an octal-looking
    // number, a merge key.
    let yaml = "\
defaults: &defaults
  Interval: 5m
  Site: lon
<<: *defaults
Workers: 4
Helper: /etc/choria-provisioner/helper.rb
Token: s3cret
Leader_Election: yes
Choria_Insecure: no
Monitor_Port: 8080
Features:
  JWT: yes
  PKI: on
Cert_Deny_List:
  - '\\.evil$'
";
    let l = Config::from_yaml(yaml, "p.yaml").unwrap();
    let c = &l.config;
    assert_eq!(c.workers, 4);
    assert_eq!(c.provision.interval().as_secs(), 300);
    assert_eq!(c.site, "lon");
    assert_eq!(c.helper, "/etc/choria-provisioner/helper.rb");
    assert_eq!(c.provision.token(), "s3cret");
    assert!(c.leader_election && !c.choria_insecure);
    assert_eq!(c.monitor_port, 8080);
    assert!(
        c.provision.features().jwt && c.provision.features().pki && !c.provision.features().ed25519
    );
    assert_eq!(
        c.provision.deny_list().patterns().collect::<Vec<_>>(),
        vec!["\\.evil$"]
    );
    assert_eq!(
        l.warnings,
        vec![ConfigWarning::UnknownKey("defaults".into())]
    );
}

mod generated {
    use super::*;
    use proptest::prelude::*;

    const KEYS: &[&str] = &[
        "helper",
        "Helper",
        "HELPER",
        "workers",
        "Workers",
        "leader_election",
        "features",
        "Features",
        "pki",
        "PKI",
        "cert_deny_list",
        "<<",
        "\u{17f}ite",
        "unknown",
        "~",
        "\"helper\"",
        "interval",
        "monitor_port",
    ];
    const VALUES: &[&str] = &[
        "yes",
        "No",
        "ON",
        "~",
        "",
        "010",
        "0x1F",
        "1e3",
        "4.5",
        "-1",
        "\"yes\"",
        "[a, ~]",
        "{pki: true}",
        "&a {helper: x}",
        "*a",
        "[*a]",
        "'quoted'",
        "1_000",
        ".nan",
        "!!str x",
        "|\n  block",
        "[",
        "5m",
        "99999999999999999999999",
    ];

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// Whatever mix of keys, spellings and values: an error or a configuration, never a
        /// panic, and the same result every time.
        #[test]
        fn any_mix_loads_or_is_refused_the_same_way_each_time(
            lines in proptest::collection::vec((0..KEYS.len(), 0..VALUES.len(), 0..3usize), 0..12)
        ) {
            let mut yaml = String::new();
            for (k, v, indent) in lines {
                yaml.push_str(&"  ".repeat(indent.min(1)));
                yaml.push_str(KEYS[k]);
                yaml.push_str(": ");
                yaml.push_str(VALUES[v]);
                yaml.push('\n');
            }
            let first = Config::from_yaml(&yaml, "gen.yaml");
            let second = Config::from_yaml(&yaml, "gen.yaml");
            match (first, second) {
                (Ok(a), Ok(b)) => {
                    prop_assert_eq!(format!("{:?}", a.config), format!("{:?}", b.config));
                    prop_assert_eq!(a.warnings, b.warnings);
                }
                (Err(a), Err(b)) => prop_assert_eq!(a.to_string(), b.to_string()),
                (a, b) => prop_assert!(false, "{yaml:?}: {a:?} then {b:?}"),
            }
        }
    }
}
