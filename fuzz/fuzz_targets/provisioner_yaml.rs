//! The provisioner's YAML configuration.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = provisioner::config::Config::from_yaml(text, "fuzz.yaml");
    }
});
