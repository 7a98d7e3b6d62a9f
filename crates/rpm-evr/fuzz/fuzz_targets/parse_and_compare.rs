//! Fuzzes parsing and comparison: nothing may panic, and the order must stay consistent.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rpm_evr::{compare_evr, rpmvercmp, Version};
use std::cmp::Ordering;
use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};

fn hash_of(v: &Version) -> u64 {
    let mut h = DefaultHasher::new();
    v.hash(&mut h);
    h.finish()
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    // Split the input in two at the first newline so both sides of a comparison are fuzzed.
    let (a, b) = text.split_once('\n').unwrap_or((text, ""));

    let ab = rpmvercmp(a, b);
    assert_eq!(rpmvercmp(b, a), ab.reverse(), "rpmvercmp({a:?}, {b:?}) is not antisymmetric");
    assert_eq!(rpmvercmp(a, a), Ordering::Equal);

    let (va, vb) = (Version::parse(a), Version::parse(b));
    if let Ok(v) = &va {
        assert_eq!(v.to_string(), a, "display does not round-trip");
    }
    match (&va, &vb) {
        (Ok(x), Ok(y)) => {
            let ord = x.cmp(y);
            assert_eq!(y.cmp(x), ord.reverse());
            assert_eq!(x == y, ord == Ordering::Equal);
            if x == y {
                assert_eq!(hash_of(x), hash_of(y), "{a:?} == {b:?} but they hash apart");
            }
            assert_eq!(compare_evr(a, b).ok(), Some(ord));
            // Without epoch and release, Version's prefix-skipping path must match rpmvercmp.
            if !a.contains([':', '-']) && !b.contains([':', '-']) {
                assert_eq!(ord, ab, "Version and rpmvercmp disagree on {a:?} vs {b:?}");
            }
        }
        _ => assert!(compare_evr(a, b).is_err()),
    }
});
