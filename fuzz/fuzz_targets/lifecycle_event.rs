//! Lifecycle events in both formats (Choria JSON and CloudEvents).
#![no_main]

use choria_rpc_client::lifecycle::LifecycleEvent;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = LifecycleEvent::parse(data);
});
