//! Parsing: what is accepted, what rpm rejects, and the error messages.
#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

use rpm_evr::{ParseErrorKind, Version};

fn kind(s: &str) -> ParseErrorKind {
    Version::parse(s).unwrap_err().kind().clone()
}

#[test]
fn rejects_what_rpm_rejects() {
    assert_eq!(kind(""), ParseErrorKind::Empty);
    assert_eq!(
        kind("1.0 "),
        ParseErrorKind::InvalidChar { ch: ' ', offset: 3 }
    );
    assert_eq!(
        kind("1.0/2"),
        ParseErrorKind::InvalidChar { ch: '/', offset: 3 }
    );
    assert_eq!(
        kind("1.α"),
        ParseErrorKind::InvalidChar {
            ch: 'α', offset: 2
        }
    );
    assert_eq!(
        kind("1.0\0"),
        ParseErrorKind::InvalidChar {
            ch: '\0',
            offset: 3
        }
    );
    assert_eq!(kind("1..0"), ParseErrorKind::DoubleDot { offset: 1 });
    assert_eq!(kind("1:2:3"), ParseErrorKind::MultipleColons);
    assert_eq!(kind("1.0-2-3"), ParseErrorKind::MultipleHyphens);
    assert_eq!(kind("a:1.0"), ParseErrorKind::InvalidEpoch);
    assert_eq!(kind("1.0-1:2"), ParseErrorKind::InvalidEpoch);
    assert_eq!(
        kind(" 1:1.0"),
        ParseErrorKind::InvalidChar { ch: ' ', offset: 0 }
    );
    assert_eq!(kind("4294967296:1"), ParseErrorKind::EpochOverflow);
    assert_eq!(kind("1:"), ParseErrorKind::EmptyVersion);
    assert_eq!(kind("-1"), ParseErrorKind::EmptyVersion);
    assert_eq!(kind("1:-1"), ParseErrorKind::EmptyVersion);
    assert_eq!(kind("1.0-"), ParseErrorKind::EmptyRelease);
}

#[test]
fn accepts_what_rpm_accepts() {
    for s in [
        "1",
        "1.0",
        "0:1.0-1",
        ":1.0",
        "4294967295:1",
        "1.0~rc1^git2+x_y",
        "%{v}",
        "1.0-.",
        "0001:1",
    ] {
        let v = Version::parse(s).unwrap_or_else(|e| panic!("{s}: {e}"));
        assert_eq!(v.to_string(), s);
        assert_eq!(v.as_str(), s);
    }
    assert_eq!(Version::parse("0001:1").unwrap().epoch(), 1);
}

#[test]
fn error_messages_name_the_input_and_the_problem() {
    let err = Version::parse("1.0-2-3").unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid rpm version \"1.0-2-3\": more than one '-'"
    );
    assert_eq!(err.input(), "1.0-2-3");
    let err = Version::new(Some(1), "2", Some("")).unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid rpm version \"\": empty release after '-'"
    );
    let err = Version::new(None, "1:2", None).unwrap_err();
    assert_eq!(
        err.kind(),
        &ParseErrorKind::InvalidChar { ch: ':', offset: 1 }
    );
}

#[test]
fn new_builds_the_same_version_as_parse() {
    let built = Version::new(Some(3), "1.2", Some("4.el9")).unwrap();
    let parsed = Version::parse("3:1.2-4.el9").unwrap();
    assert_eq!(built, parsed);
    assert_eq!(built.as_str(), parsed.as_str());
    assert_eq!(
        (built.epoch(), built.version(), built.release()),
        (3, "1.2", Some("4.el9"))
    );
    let bare = Version::new(None, "1.2", None).unwrap();
    assert_eq!(
        (bare.as_str(), bare.has_explicit_epoch(), bare.release()),
        ("1.2", false, None)
    );
}

#[test]
fn try_from_string_and_from_str_agree() {
    let a = Version::try_from(String::from("1:2-3")).unwrap();
    let b: Version = "1:2-3".parse().unwrap();
    assert_eq!(a.as_str(), b.as_str());
    assert!(Version::try_from(String::from("1 2")).is_err());
}

#[test]
fn equality_ignores_spelling_but_display_keeps_it() {
    let a = Version::parse("0:1.00-01").unwrap();
    let b = Version::parse("1.0-1").unwrap();
    assert_eq!(a, b);
    assert_eq!(a.to_string(), "0:1.00-01");
    assert_eq!(format!("{a:?}"), "Version(\"0:1.00-01\")");
}

#[cfg(feature = "serde")]
#[test]
fn serde_uses_the_string_form() {
    let v = Version::parse("1:2.0-3").unwrap();
    assert_eq!(serde_json::to_string(&v).unwrap(), "\"1:2.0-3\"");
    let back: Version = serde_json::from_str("\"1:2.0-3\"").unwrap();
    assert_eq!(back.as_str(), "1:2.0-3");
    let err = serde_json::from_str::<Version>("\"1..0\"").unwrap_err();
    assert!(err.to_string().contains("\"..\" at byte 1"), "{err}");
}

#[test]
fn compare_evr_agrees_with_parsed_versions_and_reports_the_bad_side() {
    use rpm_evr::compare_evr;
    for (a, b) in [
        ("1:1.0-1", "2.0"),
        ("1.0", "1.0-1"),
        ("1.0~rc1", "1.0"),
        ("1.00-1", "1.0-1"),
    ] {
        let parsed = Version::parse(a).unwrap().cmp(&Version::parse(b).unwrap());
        assert_eq!(compare_evr(a, b).unwrap(), parsed, "{a} vs {b}");
    }
    assert_eq!(compare_evr("1.0", "1 0").unwrap_err().input(), "1 0");
    assert_eq!(
        compare_evr("-1", "1.0").unwrap_err().kind(),
        &ParseErrorKind::EmptyVersion
    );
}
