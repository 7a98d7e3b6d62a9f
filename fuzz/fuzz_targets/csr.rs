//! Certificate signing requests from `gencsr`: the first byte chooses between the input as PEM
//! text and the input as DER wrapped in PEM, so both the armour and the ASN.1 are explored.
#![no_main]

use base64::Engine as _;
use libfuzzer_sys::fuzz_target;
use provision_core::policy::{validate_csr, CsrPolicy, DenyList};
use std::sync::OnceLock;

fn deny() -> &'static DenyList {
    static DENY: OnceLock<DenyList> = OnceLock::new();
    DENY.get_or_init(|| DenyList::new(&["\\.privileged\\.choria$"]).expect("the pattern compiles"))
}

fuzz_target!(|data: &[u8]| {
    let Some((mode, rest)) = data.split_first() else {
        return;
    };
    let pem = if mode & 1 == 0 {
        match std::str::from_utf8(rest) {
            Ok(t) => t.to_string(),
            Err(_) => return,
        }
    } else {
        let b64 = base64::engine::general_purpose::STANDARD.encode(rest);
        let mut pem = String::from("-----BEGIN CERTIFICATE REQUEST-----\n");
        for chunk in b64.as_bytes().chunks(64) {
            pem.push_str(std::str::from_utf8(chunk).unwrap_or_default());
            pem.push('\n');
        }
        pem.push_str("-----END CERTIFICATE REQUEST-----\n");
        pem
    };
    let _ = validate_csr(&pem, "node-1.example.net", &CsrPolicy::new(deny()));
});
