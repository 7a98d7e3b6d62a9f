//! RPC reply bodies and the typed data of every provisioning action, plus the nonce signature
//! check applied to `gen25519` replies, alone and in a batch (which must answer the same).
#![no_main]

use choria_rpc_client::agents::{GencsrOutput, Gen25519Output, JwtOutput, MessageOutput};
use choria_rpc_client::mcorpc::{RpcReply, RpcRequest};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = RpcRequest::parse(data);
    let Ok(reply) = RpcReply::parse(data) else {
        return;
    };
    let _ = reply.to_vec();
    let d = reply.data;
    let _ = serde_json::from_value::<JwtOutput>(d.clone());
    let _ = serde_json::from_value::<GencsrOutput>(d.clone());
    let _ = serde_json::from_value::<MessageOutput>(d.clone());
    if let Ok(g) = serde_json::from_value::<Gen25519Output>(d) {
        let nonce = "0123456789abcdef";
        let single =
            choria_crypto::nonce::verify_nonce_signature(nonce, &g.public_key, &g.signature);
        let _ = provision_core::policy::verify_nonce_signature(nonce, &g.public_key, &g.signature);
        let proof = choria_crypto::nonce::NonceProof {
            nonce,
            public_key_hex: &g.public_key,
            signature_hex: &g.signature,
        };
        let batch = choria_crypto::nonce::verify_nonce_signatures(&[proof, proof]);
        assert_eq!(batch, vec![single, single], "a batch answers as a single check");
    }
});
