//! The claims bucket of active-active replicas is shared: whatever a value or a key there holds,
//! reading it back never panics, a replica name read from it is bounded and free of control
//! characters, a sealed reader never accepts what the fuzzer made without the secret, the key
//! made for any identity is one KV key of safe characters, and every replica agrees on one
//! owner among the live set.
#![no_main]

use std::time::Duration;

use provisioner::claims::{node_key, owner};
use provisioner::fleet_lifecycle::seal::Seal;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let now = 1_700_000_000_000;
    let life = Duration::from_secs(30);
    if let Some(v) = Seal::none().read("node.n1", data, now, life) {
        assert!(data.len() <= 1024);
        assert!(v.by.chars().count() <= 128, "{:?}", v.by);
        assert!(!v.by.chars().any(char::is_control), "{:?}", v.by);
    }
    // Without the secret no input verifies (a 128-bit tag is not guessed).
    assert!(Seal::with_secret(b"replicas only")
        .read("node.n1", data, now, life)
        .is_none());
    let text = String::from_utf8_lossy(data);
    let key = node_key(&text);
    assert!(key.starts_with("node.") || key.starts_with("hex."), "{key:?}");
    assert!(
        key.bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'=' | b'.')),
        "{key:?}"
    );
    assert!(key.split('.').all(|l| !l.is_empty()), "{key:?}");
    // A live set from the data: the owner is one of them, whatever their order.
    let mut live: Vec<String> = text.split('\n').take(64).map(str::to_string).collect();
    let first = owner(&live, &text).map(str::to_string);
    live.reverse();
    let again = owner(&live, &text).map(str::to_string);
    assert_eq!(first.is_some(), !live.is_empty());
    if let (Some(a), Some(b)) = (&first, &again) {
        assert!(live.contains(a));
        assert_eq!(a, b, "the owner depends on the order of the live set");
    }
});
