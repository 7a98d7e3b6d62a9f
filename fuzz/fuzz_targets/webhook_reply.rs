//! A webhook's answer on its way to being used: whatever its status, signature headers and body,
//! judging it ([`judge_answer`], what the client does once the answer is read) and decoding it
//! never panic; an answer that passes is a 2xx with a body whose signature, when one is given or
//! required, is the secret's over this request's id and these very bytes; a refusal's message
//! is bounded and free of control characters.
//!
//! The input: a status byte pair, a flags byte (bit 0: signatures required; bit 1: a secret;
//! bit 2: the fuzzer's signature is replaced by the right one for this body; bit 3: the body is
//! altered after signing; bit 4: two signature headers), then length-prefixed fields as in
//! `webhook_signature` (the secret, the request id, the signature header) and the body.
#![no_main]

use helper_protocol::signature::{sign_reply, verify_reply, ReplySignature};
use helper_protocol::webhook::{judge_answer, Answer, Expected};
use helper_protocol::{decode_reply, HelperError};
use libfuzzer_sys::fuzz_target;

/// One length byte and that many bytes, cut short by the end; the rest after it.
fn field(data: &[u8]) -> (&[u8], &[u8]) {
    match data.split_first() {
        Some((&len, rest)) => rest.split_at(usize::from(len).min(rest.len())),
        None => (&[], &[]),
    }
}

fuzz_target!(|data: &[u8]| {
    let [s0, s1, flags, rest @ ..] = data else {
        return;
    };
    // 100 to 599, every class of HTTP status.
    let status = 100 + u16::from_be_bytes([*s0, *s1]) % 500;
    let required = flags & 1 != 0;
    let (secret, rest) = field(rest);
    let secret = (flags & 2 != 0).then_some(secret);
    let (request_id, rest) = field(rest);
    let (header, body) = field(rest);
    let mode = if required {
        ReplySignature::Required
    } else {
        ReplySignature::Optional
    };
    let right = secret.map(|k| sign_reply(k, request_id, body));
    let mut sent = body.to_vec();
    let header = match &right {
        Some(s) if flags & 4 != 0 => s.as_bytes(),
        _ => header,
    };
    if flags & 8 != 0 {
        sent.push(b' ');
    }
    let twice = [header, header];
    let signatures: &[&[u8]] = if flags & 16 != 0 {
        &twice
    } else if header.is_empty() && flags & 4 == 0 {
        &[]
    } else {
        &twice[..1]
    };
    let expected = Expected {
        helper: "https://helper.example.net/p",
        request_id,
        secret,
        reply_signature: mode,
    };
    let verdict = judge_answer(
        &expected,
        &Answer {
            status,
            signatures,
            body: &sent,
        },
    );
    match verdict {
        Ok(()) => {
            assert!((200..300).contains(&status));
            assert!(!sent.is_empty());
            if let Some(k) = secret {
                // Passing with a signature means the right one for the bytes used.
                if let [one] = signatures {
                    assert_eq!(verify_reply(k, request_id, &sent, one), Ok(()));
                } else {
                    assert!(signatures.is_empty() && !required);
                }
            } else {
                assert!(!required);
            }
            let _ = decode_reply(&sent, expected.helper);
        }
        Err(HelperError::Status { msg, .. }) => {
            assert!(!(200..300).contains(&status));
            // At most 512 bytes, one escaped character past them and "...".
            assert!(msg.len() <= 512 + 16, "{} bytes", msg.len());
            assert!(!msg.chars().any(char::is_control), "{msg:?}");
        }
        Err(HelperError::ReplySignature { reason, .. }) => {
            assert!(secret.is_some() || required);
            assert!(reason.len() < 200 && !reason.chars().any(char::is_control));
        }
        Err(HelperError::EmptyOutput { .. }) => assert!(sent.is_empty()),
        Err(other) => panic!("unexpected error {other}"),
    }
});
