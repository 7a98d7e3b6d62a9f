//! Property: whatever the features and wherever a check fails, a node is never configured after
//! a failed check, and a node whose checks all pass is configured.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;

use common::*;
use proptest::prelude::*;
use provision_core::rpc::{Action, RpcErrorKind};
use provision_core::{Features, Host, Outcome};

#[derive(Debug, Clone, Copy)]
enum Fault {
    None,
    JwtWrongSigner,
    JwtExpired,
    JwtWrongPurpose,
    NonceBad,
    PublicKeyShort,
    CsrWrongName,
    CsrDenied,
    CsrUnsigned,
    HelperFails,
    HelperDefers,
    KeyWithoutExchange,
    EmptyConfiguration,
    RpcFails(Action),
    PausedAt(Action),
}

impl Fault {
    /// Whether the fault is on a path the features take.
    fn applies(self, pki: bool, jwt: bool, ed: bool) -> bool {
        match self {
            Fault::None => false,
            Fault::JwtWrongSigner | Fault::JwtExpired | Fault::JwtWrongPurpose => jwt,
            Fault::NonceBad | Fault::PublicKeyShort => ed,
            Fault::CsrWrongName | Fault::CsrDenied | Fault::CsrUnsigned => pki,
            Fault::KeyWithoutExchange => !jwt,
            Fault::RpcFails(a) | Fault::PausedAt(a) => match a {
                Action::Jwt => jwt,
                Action::Gen25519 => ed,
                Action::Gencsr => pki,
                _ => true,
            },
            _ => true,
        }
    }
}

fn fault() -> impl Strategy<Value = Fault> {
    let actions = prop_oneof![
        Just(Action::Jwt),
        Just(Action::Gen25519),
        Just(Action::Inventory),
        Just(Action::Gencsr),
    ];
    prop_oneof![
        Just(Fault::None),
        Just(Fault::JwtWrongSigner),
        Just(Fault::JwtExpired),
        Just(Fault::JwtWrongPurpose),
        Just(Fault::NonceBad),
        Just(Fault::PublicKeyShort),
        Just(Fault::CsrWrongName),
        Just(Fault::CsrDenied),
        Just(Fault::CsrUnsigned),
        Just(Fault::HelperFails),
        Just(Fault::HelperDefers),
        Just(Fault::KeyWithoutExchange),
        Just(Fault::EmptyConfiguration),
        actions.clone().prop_map(Fault::RpcFails),
        actions.prop_map(Fault::PausedAt),
    ]
}

fn run_case(pki: bool, jwt: bool, ed: bool, fault: Fault) -> (bool, Option<Outcome>) {
    let node = FakeNode::new();
    let mut reply = good_reply();
    let mut helper_fails = false;
    {
        let mut s = node.state.lock().unwrap();
        s.csr.csr = make_csr("n1.example.net", &[]);
        match fault {
            Fault::JwtWrongSigner => {
                s.jwt = provisioning_jwt(
                    &ed25519_dalek::SigningKey::from_bytes(&[1; 32]),
                    now() + 60,
                    "choria_provisioning",
                )
            }
            Fault::JwtExpired => {
                s.jwt = provisioning_jwt(&prov_signer(), now() - 60, "choria_provisioning")
            }
            Fault::JwtWrongPurpose => {
                s.jwt = provisioning_jwt(&prov_signer(), now() + 60, "choria_server")
            }
            Fault::NonceBad => s.bad_nonce = true,
            Fault::PublicKeyShort => s.short_key = true,
            Fault::CsrWrongName => s.csr.csr = make_csr("n2.example.net", &[]),
            Fault::CsrDenied => s.csr.csr = make_csr("n1.example.net", &["x.privileged.choria"]),
            Fault::CsrUnsigned => {
                s.csr.csr =
                    "-----BEGIN CERTIFICATE REQUEST-----\nMAA=\n-----END CERTIFICATE REQUEST-----\n"
                        .into()
            }
            Fault::HelperFails => helper_fails = true,
            Fault::HelperDefers => reply.defer = true,
            Fault::KeyWithoutExchange => {
                reply.key = pem::encode(&pem::Pem::new("RSA PRIVATE KEY", vec![1, 2, 3]))
            }
            Fault::EmptyConfiguration => reply.configuration = None,
            Fault::RpcFails(a) => {
                s.failures.insert(
                    a.label(),
                    std::iter::repeat_n(RpcErrorKind::Timeout, 10).collect(),
                );
            }
            Fault::None | Fault::PausedAt(_) => {}
        }
    }
    let helper = if helper_fails {
        FakeHelper::failing()
    } else {
        FakeHelper::replying(reply)
    };
    let config = features(Features::NONE.with_pki(pki).with_jwt(jwt).with_ed25519(ed));
    let p = provisioner(config, &node, &helper, &CountingObserver::default());
    if let Fault::PausedAt(a) = fault {
        node.state.lock().unwrap().pause_on = Some((a, p.pause_state().clone()));
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let out = rt.block_on(p.provision(&mut Host::new(
        Arc::from("n1.example.net"),
        tokio::time::Instant::now(),
    )));
    (node.configured().is_some(), out.ok())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn no_node_is_configured_after_a_failed_check(pki in any::<bool>(), jwt in any::<bool>(), ed in any::<bool>(), fault in fault()) {
        // pki and ed25519 are exclusive; ed25519 turns jwt on.
        let ed = ed && !pki;
        let jwt = jwt || ed;
        let (configured, outcome) = run_case(pki, jwt, ed, fault);
        if fault.applies(pki, jwt, ed) {
            prop_assert!(!configured, "{fault:?} with pki={pki} jwt={jwt} ed={ed} still configured");
            prop_assert!(outcome.is_none(), "{fault:?}: {outcome:?}");
        } else {
            prop_assert!(configured, "{fault:?} with pki={pki} jwt={jwt} ed={ed} was not configured");
            prop_assert_eq!(outcome, Some(Outcome::Provisioned));
        }
    }
}
