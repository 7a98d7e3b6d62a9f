//! Key material read from operators' files: `jwt_verify_cert` (an RSA certificate or public key
//! in PEM, or a hex ed25519 key) and `jwt_signing_key` (a hex ed25519 seed or an RSA private
//! key). A damaged file must be an error, never a hang or a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use choria_crypto::jwt::{SigningKey, VerifyingKey};

fuzz_target!(|data: &[u8]| {
    let _ = VerifyingKey::from_public_data(data);
    let _ = SigningKey::from_key_data(data);
});
