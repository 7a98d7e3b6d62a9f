//! Conformance with rpm itself: every case in `testdata/*.tsv` was answered by a real rpm.
#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

use rpm_evr::{compare_evr, rpmvercmp, Version};
use std::cmp::Ordering;
use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};

/// One line of a table: two inputs and rpm's answer.
struct Case {
    line: usize,
    a: String,
    b: String,
    expected: Ordering,
}

fn load(name: &str) -> Vec<Case> {
    let path = format!("{}/testdata/{name}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap();
    let cases: Vec<Case> = text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.starts_with('#'))
        .map(|(n, l)| {
            let mut f = l.split('\t');
            let (a, b, e) = (f.next().unwrap(), f.next().unwrap(), f.next().unwrap());
            let expected = match e {
                "-1" => Ordering::Less,
                "0" => Ordering::Equal,
                "1" => Ordering::Greater,
                other => panic!("{path}:{}: bad expectation {other:?}", n + 1),
            };
            Case {
                line: n + 1,
                a: a.into(),
                b: b.into(),
                expected,
            }
        })
        .collect();
    assert!(
        cases.len() > 1000,
        "{path} holds only {} cases",
        cases.len()
    );
    cases
}

fn hash_of(v: &Version) -> u64 {
    let mut h = DefaultHasher::new();
    v.hash(&mut h);
    h.finish()
}

#[test]
fn rpmvercmp_matches_rpm_on_every_bare_version_case() {
    let failures: Vec<String> = load("vercmp.tsv")
        .iter()
        .filter_map(|c| {
            let got = rpmvercmp(&c.a, &c.b);
            (got != c.expected).then(|| {
                format!(
                    "line {}: {:?} vs {:?}: rpm {:?}, got {got:?}",
                    c.line, c.a, c.b, c.expected
                )
            })
        })
        .collect();
    assert!(
        failures.is_empty(),
        "{} disagreements:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn version_order_matches_rpm_where_the_bare_case_is_a_valid_version() {
    let mut checked = 0;
    for c in load("vercmp.tsv") {
        let (Ok(a), Ok(b)) = (Version::parse(&c.a), Version::parse(&c.b)) else {
            continue;
        };
        assert_ordered(&c, &a, &b);
        checked += 1;
    }
    assert!(checked > 1000, "only {checked} cases were valid versions");
}

/// `a` and `b` compare as rpm says they do in case `c`.
fn assert_ordered(c: &Case, a: &Version, b: &Version) {
    assert_eq!(
        a.cmp(b),
        c.expected,
        "line {}: {:?} vs {:?}",
        c.line,
        c.a,
        c.b
    );
}

#[test]
fn version_order_eq_and_hash_match_rpm_on_every_evr_case() {
    for c in load("evr.tsv") {
        let a = Version::parse(&c.a).unwrap_or_else(|e| panic!("line {}: {e}", c.line));
        let b = Version::parse(&c.b).unwrap_or_else(|e| panic!("line {}: {e}", c.line));
        assert_ordered(&c, &a, &b);
        assert_eq!(b.cmp(&a), c.expected.reverse(), "line {}: reversed", c.line);
        assert_eq!(
            compare_evr(&c.a, &c.b).unwrap(),
            c.expected,
            "line {}: compare_evr",
            c.line
        );
        assert_eq!(a == b, c.expected == Ordering::Equal, "line {}: eq", c.line);
        if a == b {
            assert_eq!(
                hash_of(&a),
                hash_of(&b),
                "line {}: equal versions hash apart",
                c.line
            );
        }
        assert_eq!(a.to_string(), c.a, "line {}: display round trip", c.line);
    }
}

#[test]
fn the_table_holds_rpms_own_test_suite_cases() {
    // A few cases of rpm's tests/rpmvercmp.at, checked here by hand so that a regenerated table
    // cannot silently lose them.
    let cases = load("vercmp.tsv");
    let find = |a: &str, b: &str| {
        cases
            .iter()
            .find(|c| c.a == a && c.b == b)
            .map(|c| c.expected)
    };
    assert_eq!(find("1.0^git1", "1.01"), Some(Ordering::Less));
    assert_eq!(find("1.0~rc1^git1", "1.0~rc1"), Some(Ordering::Greater));
    assert_eq!(find("10.0001", "10.1"), Some(Ordering::Equal));
    assert_eq!(find("1b.fc17", "1.fc17"), Some(Ordering::Less));
}
