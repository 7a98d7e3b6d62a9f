//! The name rules a CSR is held to, on names chosen by the fuzzer: whatever the names, a CSR that
//! passes can only name the node's own identity (plus names the site's extra pattern allows), has
//! no IP, URI or email names, and no name the deny list refuses.
#![no_main]

use libfuzzer_sys::fuzz_target;
use provision_core::identity::IdentityRule;
use provision_core::policy::{check_csr_names, CsrNames, CsrPolicy, DenyList, ExtraDnsNames};
use std::sync::OnceLock;

fn deny() -> &'static DenyList {
    static DENY: OnceLock<DenyList> = OnceLock::new();
    DENY.get_or_init(|| {
        DenyList::new(&provision_core::config::DEFAULT_CERT_DENY_LIST).expect("the patterns compile")
    })
}

fn extra() -> &'static ExtraDnsNames {
    static EXTRA: OnceLock<ExtraDnsNames> = OnceLock::new();
    EXTRA.get_or_init(|| {
        ExtraDnsNames::new(r"[a-z0-9-]+\.svc\.example\.net")
            .expect("compiles")
            .expect("not empty")
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((mode, rest)) = data.split_first() else {
        return;
    };
    let text = String::from_utf8_lossy(rest);
    let mut parts = text.split('\0');
    let identity = parts.next().unwrap_or_default().to_string();
    let common_name = parts.next().unwrap_or_default().to_string();
    let mut dns_names = Vec::new();
    let mut other_names = Vec::new();
    for (i, p) in parts.enumerate() {
        if mode & 2 != 0 && i % 3 == 2 {
            other_names.push(("URI", p.to_string()));
        } else {
            dns_names.push(p.to_string());
        }
    }
    let names = CsrNames {
        common_name,
        common_names: 1 + usize::from(mode & 4 != 0),
        dns_names,
        other_names,
    };
    let rule = IdentityRule::builtin();
    let policy = CsrPolicy {
        deny: deny(),
        identity_rule: &rule,
        extra_dns: (mode & 1 != 0).then(extra),
    };
    if check_csr_names(&names, &identity, &policy).is_ok() {
        assert_eq!(names.common_name, identity);
        assert_eq!(names.common_names, 1);
        assert!(names.other_names.is_empty());
        assert!(rule.check(&identity).is_ok());
        assert!(deny().matches(&identity).is_none());
        for n in &names.dns_names {
            assert!(
                n.eq_ignore_ascii_case(&identity) || (mode & 1 != 0 && extra().is_match(n)),
                "{n:?}"
            );
            assert!(deny().matches(n).is_none());
        }
    }
});
