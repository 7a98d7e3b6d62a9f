//! The helper's stdout: decoded as the provisioner does, re-encoded, and its upgrade target
//! read as an RPM version.
#![no_main]

use helper_protocol::HelperReply;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(reply) = serde_json::from_slice::<HelperReply>(data) else {
        return;
    };
    let text = serde_json::to_vec(&reply).expect("a decoded reply encodes");
    let again: HelperReply = serde_json::from_slice(&text).expect("an encoded reply decodes");
    assert_eq!(again, reply);
});
