//! Reply transports as the provisioner receives them from nodes (v1 and v2).
#![no_main]

use choria_rpc_client::protocol::parse_reply;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(reply) = parse_reply(data) {
        // The body goes on to the RPC reply parser, as in the client.
        let _ = choria_rpc_client::mcorpc::RpcReply::parse(&reply.body);
    }
});
