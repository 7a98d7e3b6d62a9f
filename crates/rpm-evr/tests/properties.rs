//! Property tests: the order is a total order consistent with `Eq` and `Hash`, it agrees with
#![allow(clippy::unwrap_used)] // tests fail loudly on purpose
//! an independent model of rpm's segment order, and parsing never panics.

use proptest::prelude::*;
use rpm_evr::{rpmvercmp, Version};
use std::cmp::Ordering;
use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};

/// Short strings over an alphabet that makes ties, leading zeros, tildes and carets common.
fn bare() -> impl Strategy<Value = String> {
    proptest::collection::vec(
        prop_oneof![
            Just("0"),
            Just("00"),
            Just("1"),
            Just("01"),
            Just("9"),
            Just("10"),
            Just("a"),
            Just("b"),
            Just("B"),
            Just("rc"),
            Just("."),
            Just("_"),
            Just("+"),
            Just("~"),
            Just("^"),
        ],
        1..7,
    )
    .prop_map(|parts| parts.concat())
}

/// Valid EVR strings built from `bare` parts.
fn evr() -> impl Strategy<Value = Version> {
    (
        proptest::option::of(prop_oneof![Just("0"), Just("1"), Just("01"), Just("2")]),
        bare(),
        proptest::option::of(bare()),
    )
        .prop_filter_map("rpm rejects '..'", |(e, v, r)| {
            let text = format!(
                "{}{}{}",
                e.map(|e| format!("{e}:")).unwrap_or_default(),
                v,
                r.map(|r| format!("-{r}")).unwrap_or_default()
            );
            Version::parse(&text).ok()
        })
}

fn hash_of<T: Hash>(v: &T) -> u64 {
    let mut h = DefaultHasher::new();
    v.hash(&mut h);
    h.finish()
}

/// An independent model of rpmvercmp: cut into segments, then compare the segment lists
/// lexicographically with the end of the list ranked between `~` and `^`.
fn model(a: &str, b: &str) -> Ordering {
    #[derive(PartialEq, Eq, PartialOrd, Ord, Debug)]
    enum Seg {
        Tilde,
        End,
        Caret,
        Alpha(String),
        Num(usize, String),
    }
    fn segs(s: &str) -> Vec<Seg> {
        let mut out = Vec::new();
        let mut chars = s.chars().peekable();
        while let Some(&c) = chars.peek() {
            if c == '~' || c == '^' {
                chars.next();
                out.push(if c == '~' { Seg::Tilde } else { Seg::Caret });
            } else if c.is_ascii_digit() {
                let mut run = String::new();
                while let Some(&d) = chars.peek().filter(|d| d.is_ascii_digit()) {
                    run.push(d);
                    chars.next();
                }
                let trimmed = run.trim_start_matches('0').to_string();
                out.push(Seg::Num(trimmed.len(), trimmed));
            } else if c.is_ascii_alphabetic() {
                let mut run = String::new();
                while let Some(&d) = chars.peek().filter(|d| d.is_ascii_alphabetic()) {
                    run.push(d);
                    chars.next();
                }
                out.push(Seg::Alpha(run));
            } else {
                chars.next();
            }
        }
        out.push(Seg::End);
        out
    }
    segs(a).cmp(&segs(b))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn rpmvercmp_agrees_with_the_segment_model(a in bare(), b in bare()) {
        prop_assert_eq!(rpmvercmp(&a, &b), model(&a, &b), "{:?} vs {:?}", a, b);
        // Version takes a faster path (it skips the common prefix); it must agree too.
        if let (Ok(x), Ok(y)) = (Version::parse(&a), Version::parse(&b)) {
            prop_assert_eq!(x.cmp(&y), model(&a, &b), "Version {:?} vs {:?}", a, b);
        }
    }

    #[test]
    fn order_is_antisymmetric_and_consistent_with_eq_and_hash(a in evr(), b in evr()) {
        prop_assert_eq!(a.cmp(&b), b.cmp(&a).reverse());
        prop_assert_eq!(a == b, a.cmp(&b) == Ordering::Equal);
        if a == b {
            prop_assert_eq!(hash_of(&a), hash_of(&b));
        }
        prop_assert_eq!(a.cmp(&a), Ordering::Equal);
    }

    #[test]
    fn order_is_transitive(mut v in proptest::collection::vec(evr(), 3)) {
        v.sort();
        prop_assert!(v[0] <= v[1] && v[1] <= v[2] && v[0] <= v[2]);
        // Every ordered triple must be consistent, not just the sorted one.
        for x in &v { for y in &v { for z in &v {
            if x <= y && y <= z { prop_assert!(x <= z, "{:?} <= {:?} <= {:?}", x, y, z); }
        }}}
    }

    #[test]
    fn equal_spellings_hash_the_same(v in evr()) {
        // Re-spell with extra leading zeros and a different separator: same version, same hash.
        let mut respelled = String::new();
        let mut prev = ' ';
        for c in v.as_str().chars() {
            if c.is_ascii_digit() && !prev.is_ascii_digit() {
                respelled.push('0');
            }
            respelled.push(if c == '.' { '_' } else { c });
            prev = c;
        }
        if let Ok(w) = Version::parse(&respelled) {
            prop_assert_eq!(&v, &w);
            prop_assert_eq!(hash_of(&v), hash_of(&w));
        }
    }

    #[test]
    fn parsing_never_panics_and_round_trips(s in any::<String>()) {
        if let Ok(v) = Version::parse(&s) {
            prop_assert_eq!(v.to_string(), s);
        }
    }

    #[test]
    fn parsing_never_panics_on_version_like_noise(s in "[0-9a-z:.~^_+%{}\\- ]{0,12}") {
        match Version::parse(&s) {
            Ok(v) => {
                let again = Version::parse(v.as_str()).unwrap();
                prop_assert_eq!(v.as_str(), again.as_str());
            }
            Err(e) => prop_assert!(!e.to_string().is_empty()),
        }
    }
}
