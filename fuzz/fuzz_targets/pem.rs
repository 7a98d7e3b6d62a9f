//! PEM documents through choria-crypto's one decoder, as certificates, CSRs, key files and
//! legacy encrypted keys: armour first, DER from a slice, so truncated DER is an error, never a
//! hang or a panic.
#![no_main]

use choria_crypto::{csr, keyenc, pem};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = pem::decode(text, "CERTIFICATE");
    if let Ok(cert) = pem::certificate(text) {
        let _ = pem::certificate_spki_der(&cert);
    }
    if let Ok(req) = csr::from_pem(text) {
        let _ = csr::verify_signature(&req);
        let _ = csr::names(&req);
    }
    let _ = pem::decode_many(text);
    let _ = keyenc::decrypt_legacy_pem(text, b"fuzz");
});
