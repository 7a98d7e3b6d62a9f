//! The webhook's version 2 signatures: the framing is one-to-one (two different sets of fields
//! never give the same signed message, whatever dots, newlines or digits they hold, and a
//! request's message is never a reply's), a signature verifies over the very fields it was made
//! for and no others, and no header value, however long or strange, makes a check panic.
//!
//! The input is a sequence of fields, each one length byte and that many bytes (the last one cut
//! short by the end of the input): the timestamp, request id and body of request A, the same of
//! request B, the secret, and a signature header to check.
#![no_main]

use helper_protocol::signature::{
    reply_message, request_message, sign_reply, sign_request, verify_reply, verify_request,
    SignatureError,
};
use libfuzzer_sys::fuzz_target;

/// The fields of `data`: a length byte, then that many bytes, again and again.
fn fields(mut data: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    while let Some((&len, rest)) = data.split_first() {
        let (field, rest) = rest.split_at(usize::from(len).min(rest.len()));
        out.push(field);
        data = rest;
    }
    out
}

fuzz_target!(|data: &[u8]| {
    let f = fields(data);
    let get = |i: usize| f.get(i).copied().unwrap_or_default();
    let a = (get(0), get(1), get(2));
    let b = (get(3), get(4), get(5));
    let secret = get(6);
    let header = get(7);

    // One-to-one: the same message only for the same fields.
    assert_eq!(
        request_message(a.0, a.1, a.2) == request_message(b.0, b.1, b.2),
        a == b
    );
    assert_eq!(
        reply_message(a.1, a.2) == reply_message(b.1, b.2),
        (a.1, a.2) == (b.1, b.2)
    );
    assert_ne!(request_message(a.0, a.1, a.2), reply_message(b.1, b.2));

    // A signature verifies over its own fields only.
    let signed = sign_request(secret, a.0, a.1, a.2);
    assert_eq!(
        verify_request(secret, a.0, a.1, a.2, signed.as_bytes()),
        Ok(())
    );
    assert_eq!(
        verify_request(secret, b.0, b.1, b.2, signed.as_bytes()).is_ok(),
        a == b
    );
    // A request's signature never passes for a reply's, for any id and body.
    assert_eq!(
        verify_reply(secret, b.1, b.2, signed.as_bytes()),
        Err(SignatureError::Mismatch)
    );
    let reply = sign_reply(secret, a.1, a.2);
    assert_eq!(verify_reply(secret, a.1, a.2, reply.as_bytes()), Ok(()));

    // Any header: no panic, and only the signature itself (in either case of hex) passes.
    if verify_request(secret, a.0, a.1, a.2, header).is_ok() {
        assert!(header.eq_ignore_ascii_case(signed.as_bytes()));
    }
    if verify_reply(secret, a.1, a.2, header).is_ok() {
        assert!(header.eq_ignore_ascii_case(reply.as_bytes()));
    }
});
