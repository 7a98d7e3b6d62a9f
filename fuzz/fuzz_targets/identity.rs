//! Node identities from startup events and discovery replies: the validator never panics, what
//! it accepts can never be a NATS wildcard, break a subject, carry a certificate name list or
//! forge a log line, whatever pattern a site sets; and the log form of any text is one bounded
//! line.
#![no_main]

use libfuzzer_sys::fuzz_target;
use provision_core::identity::{escaped, IdentityRule, LOG_TEXT_LIMIT, MAX_IDENTITY_LEN};
use std::sync::OnceLock;

fn rules() -> &'static [IdentityRule; 2] {
    static RULES: OnceLock<[IdentityRule; 2]> = OnceLock::new();
    RULES.get_or_init(|| {
        [
            IdentityRule::builtin(),
            IdentityRule::with_pattern(".*").expect("the pattern compiles"),
        ]
    })
}

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    for rule in rules() {
        if rule.check(&text).is_ok() {
            assert!(!text.is_empty() && text.len() <= MAX_IDENTITY_LEN);
            assert!(text.bytes().all(|b| b.is_ascii_graphic()), "{text:?}");
            for c in ['*', '>', ',', '/', '\\', '"', ':', '=', ' '] {
                assert!(!text.contains(c), "{text:?}");
            }
            assert!(text.split('.').all(|l| !l.is_empty()), "{text:?}");
        }
    }
    let shown = escaped(&text).to_string();
    assert!(!shown.chars().any(|c| c.is_control()), "{shown:?}");
    assert!(shown.chars().count() <= LOG_TEXT_LIMIT * 10 + 32);
});
