//! The Choria client configuration (`key = value` lines).
#![no_main]

use choria_rpc_client::config::ChoriaConfig;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = ChoriaConfig::parse_str(text);
    }
});
