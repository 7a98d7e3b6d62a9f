//! Request transports as a server receives them (v1 and v2): parse, then verify and check
//! freshness, none of which may panic whatever the bytes.
#![no_main]

use choria_rpc_client::protocol::ServerRequest;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(req) = ServerRequest::parse(data) {
        let _ = req.verify();
        let _ = req.is_fresh(std::time::SystemTime::now());
        let _ = req.payload_lossy();
    }
});
