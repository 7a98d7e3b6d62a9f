//! Provisioning JWTs served by nodes and server JWT claims: verified against an RSA and an
//! ed25519 key (so `alg` confusion is exercised both ways), and decoded without verification.
#![no_main]

use helper_protocol::{ProvisioningClaims, ServerClaims};
use libfuzzer_sys::fuzz_target;
use choria_crypto::jwt::{self, VerifyingKey};
use provision_core::policy;
use std::sync::OnceLock;

fn keys() -> &'static [VerifyingKey; 2] {
    static KEYS: OnceLock<[VerifyingKey; 2]> = OnceLock::new();
    KEYS.get_or_init(|| {
        [
            VerifyingKey::from_public_data(include_bytes!(
                "../../crates/provision-core/testdata/signer-public.pem"
            ))
            .expect("the RSA test key loads"),
            VerifyingKey::from_ed25519_hex(
                b"3b6a27bcceb6a42d62a3a8d02a6f0d73653215771de243a63ac048a18b59da29",
            )
            .expect("the ed25519 test key loads"),
        ]
    })
}

fuzz_target!(|data: &[u8]| {
    let Ok(token) = std::str::from_utf8(data) else {
        return;
    };
    for key in keys() {
        let _ = jwt::verify::<serde_json::Value>(token, key, 1_700_000_000);
        let _ = policy::validate_provisioning_jwt_with_key(token, key, 1_700_000_000);
    }
    let _ = jwt::decode_unverified::<ProvisioningClaims>(token);
    let _ = jwt::decode_unverified::<ServerClaims>(token);
});
