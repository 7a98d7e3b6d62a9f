//! The Go provisioner's host tests (server JWT claims, CSR checks, key encryption) as behaviour,
//! plus provisioning JWT verification with every key form.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::*;
use ed25519_dalek::Signer as _;
use provision_core::choria_crypto::keyenc;
use provision_core::helper_protocol::{ServerClaims, ServerPermissions, StandardClaims};
use provision_core::jwt::{self, SigningKey, VerifyingKey};
use provision_core::policy::*;

const ID: &str = "ginkgo.example.net";
const HOUR: Duration = Duration::from_secs(3600);

fn node_pk() -> String {
    hex::encode(
        ed25519_dalek::SigningKey::from_bytes(&[5u8; 32])
            .verifying_key()
            .to_bytes(),
    )
}

fn rsa_signer() -> String {
    testdata("signer-rsa.pem").to_string_lossy().into_owned()
}

fn builtin_rule() -> &'static provision_core::IdentityRule {
    static RULE: std::sync::OnceLock<provision_core::IdentityRule> = std::sync::OnceLock::new();
    RULE.get_or_init(provision_core::IdentityRule::builtin)
}

fn request<'a>(
    cfg: Option<&'a BTreeMap<String, String>>,
    sc: Option<&'a ServerClaims>,
    key: &'a str,
    pk: &'a str,
) -> ServerJwtRequest<'a> {
    ServerJwtRequest {
        identity: ID,
        public_key_hex: pk,
        identity_rule: builtin_rule(),
        configuration: cfg,
        server_claims: sc,
        signing_key: key,
        signing_token: "",
        default_validity: HOUR,
        jti_payload: [0x5a; 16],
        now: now(),
    }
}

/// [`provision_core::policy::issue_server_jwt`] for a request whose `signing_key` and
/// `signing_token` name files (empty: none), read here as the binary's key material reads them.
fn issue_server_jwt(req: &ServerJwtRequest<'_>) -> Result<IssuedServerJwt, PolicyError> {
    let read = |path: &str| -> Result<String, PolicyError> {
        if path.is_empty() {
            return Ok(String::new());
        }
        std::fs::read(path)
            .map(|d| String::from_utf8_lossy(&d).into_owned())
            .map_err(|source| PolicyError::File {
                path: path.to_string(),
                source,
            })
    };
    let (key, token) = (read(req.signing_key)?, read(req.signing_token)?);
    provision_core::policy::issue_server_jwt(&ServerJwtRequest {
        signing_key: &key,
        signing_token: &token,
        ..*req
    })
}

fn verify_rsa(token: &str) -> ServerClaims {
    let pubkey = std::fs::read(testdata("signer-public.pem")).unwrap();
    jwt::verify(
        token,
        &VerifyingKey::from_public_data(&pubkey).unwrap(),
        now(),
    )
    .unwrap()
}

// --- generateServerJWT ---

#[test]
fn server_jwt_needs_a_public_key() {
    let key = rsa_signer();
    let err = issue_server_jwt(&request(None, None, &key, "")).unwrap_err();
    assert_eq!(err.to_string(), "no ed25519 public key set");
}

#[test]
fn server_jwt_needs_a_signing_key() {
    let err = issue_server_jwt(&request(None, None, "", "x")).unwrap_err();
    assert_eq!(
        err.to_string(),
        "no jwt signing key configured using jwt_signing_key"
    );
}

#[test]
fn server_jwt_uses_the_collectives_from_the_configuration() {
    let key = rsa_signer();
    let pk = node_pk();
    let cfg = BTreeMap::from([("collectives".to_string(), "one,two".to_string())]);
    let issued = issue_server_jwt(&request(Some(&cfg), None, &key, &pk)).unwrap();
    let claims = verify_rsa(&issued.token);
    assert_eq!(
        claims.collectives,
        vec!["one".to_string(), "two".to_string()]
    );
    assert_eq!(claims.organization_unit, "choria");
    assert!(claims.permissions.is_none());
    assert!(claims.additional_publish_subjects.is_empty());
    assert_eq!(claims.standard.issuer, "Choria Provisioner");
    assert_eq!(claims.standard.purpose, "choria_server");
    assert_eq!(claims.identity, ID);
    assert_eq!(claims.standard.public_key, pk);
    let until = claims.standard.expires_at.unwrap() - now();
    assert!((3598..=3601).contains(&until), "{until}");
    assert_eq!(
        choria_crypto::ksuid::ksuid_time(&claims.standard.id),
        claims.standard.issued_at
    );
    // Header as the tokens package writes it.
    let header = issued.token.split('.').next().unwrap();
    assert_eq!(header, base64_url(r#"{"alg":"RS256","typ":"JWT"}"#));
}

fn base64_url(s: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s)
}

#[test]
fn server_jwt_collective_defaults_follow_the_security_provider() {
    let key = rsa_signer();
    let pk = node_pk();
    let none = issue_server_jwt(&request(None, None, &key, &pk)).unwrap();
    assert_eq!(none.claims.collectives, vec!["mcollective".to_string()]);
    let cfg = BTreeMap::from([("plugin.security.provider".to_string(), "choria".to_string())]);
    let ch = issue_server_jwt(&request(Some(&cfg), None, &key, &pk)).unwrap();
    assert_eq!(ch.claims.collectives, vec!["choria".to_string()]);
    // Split without trimming, like Go.
    let cfg = BTreeMap::from([("collectives".to_string(), "a, b".to_string())]);
    let sp = issue_server_jwt(&request(Some(&cfg), None, &key, &pk)).unwrap();
    assert_eq!(
        sp.claims.collectives,
        vec!["a".to_string(), " b".to_string()]
    );
}

#[test]
fn server_jwt_uses_the_helper_claims() {
    let key = rsa_signer();
    let pk = node_pk();
    let cfg = BTreeMap::from([("collectives".to_string(), "one".to_string())]);
    let sc = ServerClaims {
        collectives: vec!["x".into(), "y".into()],
        organization_unit: "acme".into(),
        permissions: Some(ServerPermissions {
            streams: true,
            ..Default::default()
        }),
        additional_publish_subjects: vec!["reg.>".into()],
        standard: StandardClaims {
            expires_at: Some(now() + 7200),
            ..Default::default()
        },
        ..Default::default()
    };
    let mut req = request(Some(&cfg), Some(&sc), &key, &pk);
    req.default_validity = Duration::from_secs(365 * 86400);
    let claims = verify_rsa(&issue_server_jwt(&req).unwrap().token);
    assert_eq!(claims.collectives, vec!["x".to_string(), "y".to_string()]);
    assert_eq!(claims.organization_unit, "acme");
    assert!(claims.permissions.unwrap().streams);
    assert_eq!(
        claims.additional_publish_subjects,
        vec!["reg.>".to_string()]
    );
    let until = claims.standard.expires_at.unwrap() - now();
    assert!(
        (7198..=7201).contains(&until),
        "absolute exp honoured: {until}"
    );
}

#[test]
fn server_jwt_short_or_relative_expiry_falls_back_to_the_default() {
    let key = rsa_signer();
    let pk = node_pk();
    for exp in [now() + 600, 157_680_000] {
        let sc = ServerClaims {
            standard: StandardClaims {
                expires_at: Some(exp),
                ..Default::default()
            },
            ..Default::default()
        };
        let mut req = request(None, Some(&sc), &key, &pk);
        req.default_validity = Duration::from_secs(86400 * 365);
        let claims = issue_server_jwt(&req).unwrap().claims;
        let until = claims.standard.expires_at.unwrap() - now();
        assert!(
            (86400 * 365 - 2..=86400 * 365 + 1).contains(&until),
            "{exp}: {until}"
        );
    }
}

#[test]
fn server_jwt_with_ed25519_seed_is_eddsa() {
    let dir = tempfile::tempdir().unwrap();
    let seed = seed_file(dir.path(), [3u8; 32]);
    let pk = node_pk();
    let issued = issue_server_jwt(&request(None, None, &seed, &pk)).unwrap();
    let vk = ed25519_dalek::SigningKey::from_bytes(&[3u8; 32]).verifying_key();
    let _: ServerClaims = jwt::verify(&issued.token, &VerifyingKey::Ed25519(vk), now()).unwrap();
    assert!(issue_server_jwt(&request(None, None, "/nonexistent/key", &pk)).is_err());
}

/// Builds a chain: org issuer -> provisioner client token (with tcs) -> server token.
#[test]
fn server_jwt_carries_chain_issuer_data_reread_for_every_node() {
    let dir = tempfile::tempdir().unwrap();
    let issuer = ed25519_dalek::SigningKey::from_bytes(&[11u8; 32]);
    let prov_seed = [12u8; 32];
    let prov = ed25519_dalek::SigningKey::from_bytes(&prov_seed);
    let seed = seed_file(dir.path(), prov_seed);
    let token_path = dir.path().join("client.jwt");
    let write_signer = |exp: i64| -> (String, String) {
        let jti = choria_crypto::ksuid::ksuid(now());
        let prov_pk = hex::encode(prov.verifying_key().to_bytes());
        let tcs = hex::encode(
            issuer
                .sign(format!("{jti}.{prov_pk}").as_bytes())
                .to_bytes(),
        );
        let claims = StandardClaims {
            purpose: "choria_client_id".into(),
            trust_chain_signature: tcs.clone(),
            public_key: prov_pk,
            issuer: format!("I-{}", hex::encode(issuer.verifying_key().to_bytes())),
            expires_at: Some(exp),
            issued_at: Some(now()),
            id: jti.clone(),
            ..Default::default()
        };
        let t = jwt::sign(&claims, &SigningKey::Ed25519(Box::new(issuer.clone()))).unwrap();
        std::fs::write(&token_path, t).unwrap();
        (jti, tcs)
    };
    let pk = node_pk();
    let tp = token_path.to_string_lossy().into_owned();
    for signer_exp in [now() + 30 * 86400, now() + 2 * 86400] {
        let (jti, signer_tcs) = write_signer(signer_exp);
        let mut req = request(None, None, &seed, &pk);
        req.signing_token = &tp;
        req.default_validity = Duration::from_secs(7 * 86400);
        let issued = issue_server_jwt(&req).unwrap();
        let c: ServerClaims = jwt::verify(
            &issued.token,
            &VerifyingKey::Ed25519(prov.verifying_key()),
            now(),
        )
        .unwrap();
        let prov_pk = hex::encode(prov.verifying_key().to_bytes());
        assert_eq!(c.standard.issuer, format!("C-{jti}.{prov_pk}"));
        assert_eq!(c.standard.issuer_expires_at, Some(signer_exp));
        if signer_exp < now() + 7 * 86400 {
            assert_eq!(
                c.standard.expires_at,
                Some(signer_exp),
                "capped by the signer"
            );
        } else {
            let until = c.standard.expires_at.unwrap() - now();
            assert!((7 * 86400 - 2..=7 * 86400 + 1).contains(&until), "{until}");
        }
        let (first, sig) = c.standard.trust_chain_signature.split_once('.').unwrap();
        assert_eq!(first, signer_tcs);
        let sig = ed25519_dalek::Signature::from_slice(&hex::decode(sig).unwrap()).unwrap();
        prov.verifying_key()
            .verify_strict(format!("{}.{}", c.standard.id, signer_tcs).as_bytes(), &sig)
            .unwrap();
        // The org issuer's signature over the chain issuer.
        let isig = ed25519_dalek::Signature::from_slice(&hex::decode(first).unwrap()).unwrap();
        issuer
            .verifying_key()
            .verify_strict(format!("{jti}.{prov_pk}").as_bytes(), &isig)
            .unwrap();
        assert_eq!(
            choria_crypto::ksuid::ksuid_time(&c.standard.id),
            c.standard.issued_at
        );
    }
}

#[test]
fn signing_token_without_tcs_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let seed = seed_file(dir.path(), [12u8; 32]);
    let t = jwt::sign(
        &StandardClaims {
            id: "x".into(),
            public_key: "ab".into(),
            expires_at: Some(now() + 99),
            ..Default::default()
        },
        &SigningKey::from_ed25519_seed_hex(hex::encode([1u8; 32]).as_bytes()).unwrap(),
    )
    .unwrap();
    let p = dir.path().join("t.jwt");
    std::fs::write(&p, t).unwrap();
    let pk = node_pk();
    let tp = p.to_string_lossy().into_owned();
    let mut req = request(None, None, &seed, &pk);
    req.signing_token = &tp;
    assert_eq!(
        issue_server_jwt(&req).unwrap_err().to_string(),
        "no Trust Chain Signature claim in JWT Signing Token"
    );
}

// --- validateCSR ---

fn deny_static() -> &'static DenyList {
    static DENY: std::sync::OnceLock<DenyList> = std::sync::OnceLock::new();
    DENY.get_or_init(deny)
}

/// The default deny list with any extra DNS name allowed.
fn permissive() -> CsrPolicy<'static> {
    static ANY: std::sync::OnceLock<ExtraDnsNames> = std::sync::OnceLock::new();
    CsrPolicy {
        extra_dns: Some(ANY.get_or_init(|| ExtraDnsNames::new(".*").unwrap().unwrap())),
        ..CsrPolicy::new(deny_static())
    }
}

fn deny() -> DenyList {
    DenyList::new(&provision_core::config::DEFAULT_CERT_DENY_LIST).unwrap()
}

#[test]
fn csr_missing_is_refused() {
    assert_eq!(
        validate_csr("", ID, &CsrPolicy::new(&deny()))
            .unwrap_err()
            .to_string(),
        "no CSR received"
    );
}

#[test]
fn csr_names_must_match_the_identity() {
    let csr = make_csr("notme.example.net", &[]);
    assert_eq!(
        validate_csr(&csr, ID, &CsrPolicy::new(&deny()))
            .unwrap_err()
            .to_string(),
        "common name \"notme.example.net\" does not match identity ginkgo.example.net"
    );
}

#[test]
fn csr_bad_common_names_are_denied() {
    for name in [
        "bob.choria",
        "bob.mcollective",
        "bob.privileged.choria",
        "bob.privileged.mcollective",
    ] {
        let csr = make_csr(name, &[]);
        let err = validate_csr(&csr, name, &CsrPolicy::new(&deny()))
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with(&format!("{name} matches denied certificate pattern")),
            "{err}"
        );
    }
}

#[test]
fn csr_bad_dns_names_are_denied() {
    for name in [
        "bob.choria",
        "bob.mcollective",
        "bob.privileged.choria",
        "bob.privileged.mcollective",
    ] {
        let csr = make_csr(ID, &["something.something", name, "something.else"]);
        let policy = permissive();
        let err = validate_csr(&csr, ID, &policy).unwrap_err().to_string();
        assert!(
            err.starts_with(&format!("{name} matches denied certificate pattern")),
            "{err}"
        );
    }
}

#[test]
fn csr_valid_names_pass() {
    let csr = make_csr(ID, &["something.something", "something.else"]);
    let extra = ExtraDnsNames::new(r"something\.[a-z]+").unwrap().unwrap();
    let policy = CsrPolicy {
        extra_dns: Some(&extra),
        ..CsrPolicy::new(deny_static())
    };
    let names = validate_csr(&csr, ID, &policy).unwrap();
    assert_eq!(
        names.dns_names,
        vec![
            "something.something".to_string(),
            "something.else".to_string()
        ]
    );
}

#[test]
fn csr_slash_delimited_patterns_are_regular_expressions() {
    let d = DenyList::new(&["/^ginkgo\\./"]).unwrap();
    let csr = make_csr(ID, &[]);
    assert!(validate_csr(&csr, ID, &CsrPolicy::new(&d))
        .unwrap_err()
        .to_string()
        .contains("denied"));
}

#[test]
fn csr_with_a_broken_self_signature_is_refused() {
    use der::{Decode, Encode};
    let csr = make_csr(ID, &[]);
    let p = pem::parse(&csr).unwrap();
    let mut req = x509_cert::request::CertReq::from_der(p.contents()).unwrap();
    // Claim a different subject under the original signature.
    req.info.subject = std::str::FromStr::from_str("CN=ginkgo.example.net,O=forged").unwrap();
    let forged = pem::encode(&pem::Pem::new("CERTIFICATE REQUEST", req.to_der().unwrap()));
    let err = validate_csr(&forged, ID, &CsrPolicy::new(&deny())).unwrap_err();
    assert!(matches!(err, PolicyError::CsrSignature(_)), "{err}");
    assert!(validate_csr(
        "-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n",
        ID,
        &CsrPolicy::new(&deny())
    )
    .is_err());
}

// --- encryptPrivateKey ---

#[test]
fn private_key_is_encrypted_so_the_go_server_can_decrypt_it() {
    assert_eq!(
        keyenc::encrypt_private_key("", "aa")
            .unwrap_err()
            .to_string(),
        "no key to encrypt"
    );
    let node_key = std::fs::read_to_string(testdata("node-rsa.pem")).unwrap();
    let der = pem::parse(&node_key).unwrap().contents().to_vec();
    let server_public = "88a9a0ed27dc93c29466ea2bef99e078342b27e7a1d789fc35a9131f86c3a022";
    let enc = keyenc::encrypt_private_key(&node_key, server_public).unwrap();
    let mut lines = enc.pem.lines();
    assert_eq!(lines.next(), Some("-----BEGIN RSA PRIVATE KEY-----"));
    assert_eq!(lines.next(), Some("Proc-Type: 4,ENCRYPTED"));
    let dek = lines.next().unwrap();
    assert!(
        dek.starts_with("DEK-Info: AES-256-CBC,") && dek.len() == 22 + 32,
        "{dek}"
    );
    assert_eq!(lines.next(), Some(""));
    assert!(enc.pem.lines().all(|l| l.len() <= 64));
    let server_private: [u8; 32] =
        hex::decode("67e4a9b3934a3030470ed7a30f89eeaf7dab7b492aa9ee02fb864d690b7e6eeb")
            .unwrap()
            .try_into()
            .unwrap();
    let clear = keyenc::decrypt_private_key(&enc.pem, &server_private, &enc.ecdh_public).unwrap();
    assert_eq!(clear, der);
    // A different node cannot read it.
    assert!(keyenc::decrypt_private_key(&enc.pem, &[1u8; 32], &enc.ecdh_public).is_err());
}

#[test]
fn go_vector_encryption_decrypts_with_the_shared_secret() {
    let prov_private: [u8; 32] =
        hex::decode("3e150feab1f2c709af9afa28e626f258dbf1b683d3bc35225a9b0489de485870")
            .unwrap()
            .try_into()
            .unwrap();
    let node_key = std::fs::read_to_string(testdata("node-rsa.pem")).unwrap();
    let enc = keyenc::encrypt_private_key_with(
        &node_key,
        "88a9a0ed27dc93c29466ea2bef99e078342b27e7a1d789fc35a9131f86c3a022",
        &prov_private,
        &[7u8; 16],
    )
    .unwrap();
    assert_eq!(
        enc.ecdh_public,
        "c25fab933b16b2a4589e2c2d297669b818c82881f2f9bfd08cb8fd298924a41b"
    );
    let shared =
        hex::decode("53a4887b448755a3f0a0618b289eb2369ec4b2461d44890abdfa3084ef080c55").unwrap();
    assert_eq!(
        keyenc::decrypt_legacy_pem(&enc.pem, &shared).unwrap(),
        pem::parse(&node_key).unwrap().contents()
    );
}

#[test]
fn encrypted_key_loads_in_openssl_with_the_raw_shared_secret() {
    let Ok(v) = std::process::Command::new("openssl")
        .arg("version")
        .output()
    else {
        eprintln!("openssl not installed, skipping the interoperability check");
        return;
    };
    assert!(v.status.success());
    let server_private = [21u8; 32];
    let server_public = hex::encode(choria_crypto::x25519::public_key(&server_private));
    // OpenSSL reads a password file up to the first newline, so pick a provisioner key whose
    // shared secret holds neither a newline nor a NUL.
    let (own, shared) = (1u8..=255)
        .map(|i| {
            (
                [i; 32],
                choria_crypto::x25519::shared_secret(
                    &server_private,
                    &choria_crypto::x25519::public_key(&[i; 32]),
                ),
            )
        })
        .find(|(_, s)| !s.contains(&b'\n') && !s.contains(&b'\r') && !s.contains(&0))
        .unwrap();
    let node_key = std::fs::read_to_string(testdata("node-rsa.pem")).unwrap();
    let enc =
        keyenc::encrypt_private_key_with(&node_key, &server_public, &own, &[3u8; 16]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("enc.pem");
    std::fs::write(&key, &enc.pem).unwrap();
    let pass = dir.path().join("pass");
    std::fs::write(&pass, shared).unwrap();
    let check = || {
        let mut openssl = std::process::Command::new("openssl");
        openssl
            .args(["rsa", "-check", "-noout", "-in"])
            .arg(&key)
            .arg("-passin")
            .arg(format!("file:{}", pass.display()));
        test_support::stack::run(&mut openssl)
    };
    check().unwrap();
    std::fs::write(&pass, [1u8; 32]).unwrap();
    assert!(check().is_err(), "a wrong password must not load");
}

// --- provisioning JWT ---

fn rsa_prov_jwt(exp: i64) -> String {
    let key =
        SigningKey::from_key_data(&std::fs::read(testdata("signer-rsa.pem")).unwrap()).unwrap();
    let claims = serde_json::json!({"cht": "s3cret", "chs": false, "chu": "nats://x:4222", "purpose": "choria_provisioning", "exp": exp});
    jwt::sign(&claims, &key).unwrap()
}

#[test]
fn provisioning_jwt_rs256_with_public_key_certificate_or_pkcs8_signer() {
    let t = rsa_prov_jwt(now() + 60);
    for f in ["signer-public.pem", "signer-cert.pem"] {
        let data = std::fs::read(testdata(f)).unwrap();
        let c = validate_provisioning_jwt(&t, "x", Some(&data), now()).unwrap();
        assert_eq!(c.token, "s3cret");
        assert_eq!(c.organization_unit, "choria", "empty ou becomes choria");
    }
    let other = std::fs::read(testdata("other-public.pem")).unwrap();
    assert!(validate_provisioning_jwt(&t, "x", Some(&other), now()).is_err());
    let expired = rsa_prov_jwt(now() - 1);
    let data = std::fs::read(testdata("signer-public.pem")).unwrap();
    assert!(matches!(
        validate_provisioning_jwt(&expired, "x", Some(&data), now()),
        Err(PolicyError::Jwt(jwt::JwtError::Expired))
    ));
    let k8 =
        SigningKey::from_key_data(&std::fs::read(testdata("signer-pkcs8.pem")).unwrap()).unwrap();
    let t8 = jwt::sign(&serde_json::json!({"purpose": "choria_provisioning"}), &k8).unwrap();
    assert!(validate_provisioning_jwt(&t8, "x", Some(&data), now()).is_ok());
}

#[test]
fn provisioning_jwt_eddsa_with_hex_key_or_file() {
    let t = provisioning_jwt(&prov_signer(), now() + 60, "choria_provisioning");
    let hexkey = prov_signer_hex();
    assert!(validate_provisioning_jwt(&t, &hexkey, None, now()).is_ok());
    assert!(validate_provisioning_jwt(&t, &hexkey, Some(hexkey.as_bytes()), now()).is_ok());
    // An RSA key cannot verify an EdDSA token (algorithm confusion).
    let rsa = std::fs::read(testdata("signer-public.pem")).unwrap();
    assert!(matches!(
        validate_provisioning_jwt(&t, "x", Some(&rsa), now()),
        Err(PolicyError::Jwt(jwt::JwtError::AlgorithmMismatch { .. }))
    ));
    assert!(matches!(
        validate_provisioning_jwt(&t, "", None, now()),
        Err(PolicyError::NoVerifyCert)
    ));
    assert!(validate_provisioning_jwt(&t, "not-hex", None, now()).is_err());
}

#[test]
fn provisioning_jwt_with_trust_chain_needs_a_live_chain_issuer() {
    let key = SigningKey::Ed25519(Box::new(prov_signer()));
    let hexkey = prov_signer_hex();
    let mk = |iss: &str, issexp: Option<i64>| {
        let mut c =
            serde_json::json!({"purpose": "choria_provisioning", "tcs": "abcd", "iss": iss});
        if let Some(e) = issexp {
            c["issexp"] = e.into();
        }
        jwt::sign(&c, &key).unwrap()
    };
    assert!(
        validate_provisioning_jwt(&mk("C-x.y", Some(now() + 60)), &hexkey, None, now()).is_ok()
    );
    assert!(
        validate_provisioning_jwt(&mk("C-x.y", Some(now() - 60)), &hexkey, None, now()).is_err()
    );
    assert!(validate_provisioning_jwt(&mk("C-x.y", None), &hexkey, None, now()).is_err());
    assert!(
        validate_provisioning_jwt(&mk("I-abc", Some(now() + 60)), &hexkey, None, now()).is_err()
    );
}

#[test]
fn nonce_signature_checks() {
    let k = ed25519_dalek::SigningKey::from_bytes(&[5u8; 32]);
    let pk = hex::encode(k.verifying_key().to_bytes());
    let sig = hex::encode(k.sign(b"abc123").to_bytes());
    assert!(verify_nonce_signature("abc123", &pk, &sig).is_ok());
    assert_eq!(
        verify_nonce_signature("other", &pk, &sig)
            .unwrap_err()
            .to_string(),
        "invalid nonce signature"
    );
    assert_eq!(
        verify_nonce_signature("abc123", "", &sig)
            .unwrap_err()
            .to_string(),
        "no public key received"
    );
    assert_eq!(
        verify_nonce_signature("abc123", &pk, "")
            .unwrap_err()
            .to_string(),
        "no signature received"
    );
    assert!(verify_nonce_signature("abc123", "zz", &sig).is_err());
    assert!(verify_nonce_signature("abc123", &pk[..62], &sig).is_err());
    assert!(verify_nonce_signature("abc123", &pk, &sig[..100]).is_err());
}

/// A CSR whose DER ends inside its first header (here the single byte 0x01) made the PEM reader
/// of the `der` crate loop forever, pinning a worker at full CPU; found by the `csr` fuzz target.
#[test]
fn truncated_csr_is_refused_promptly() {
    let res = test_support::returns_within("validate_csr", Duration::from_secs(10), || {
        let pem = "-----BEGIN CERTIFICATE REQUEST-----\nAQ==\n-----END CERTIFICATE REQUEST-----\n";
        validate_csr(pem, ID, &CsrPolicy::new(&deny())).map_err(|e| e.to_string())
    });
    let err = res.unwrap_err();
    assert!(err.starts_with("could not parse CSR"), "{err}");
}

#[test]
fn truncated_verification_certificate_is_refused_promptly() {
    // `jwt_verify_cert` is an operator's file; a damaged one must be an error at start-up, not
    // a start-up that never finishes.
    let res = test_support::returns_within("from_public_data", Duration::from_secs(10), || {
        let pem = b"-----BEGIN CERTIFICATE-----\nAQ==\n-----END CERTIFICATE-----\n";
        VerifyingKey::from_public_data(pem)
            .map(|_| ())
            .map_err(|e| e.to_string())
    });
    let err = res.unwrap_err();
    assert!(err.contains("could not parse certificate"), "{err}");
}

// --- names bound to the identity ---

fn san_dns(n: &str) -> x509_cert::ext::pkix::name::GeneralName {
    x509_cert::ext::pkix::name::GeneralName::DnsName(der::asn1::Ia5String::new(n).unwrap())
}

#[test]
fn csr_dns_names_other_than_the_identity_are_refused_by_default() {
    let csr = make_csr(ID, &[ID, "victim.example.net"]);
    let err = validate_csr(&csr, ID, &CsrPolicy::new(&deny())).unwrap_err();
    assert!(
        matches!(&err, PolicyError::ExtraDnsName { name, .. } if name == "victim.example.net"),
        "{err}"
    );
    // The identity itself as a SAN (what go-choria's servers ask for) passes.
    assert!(validate_csr(&make_csr(ID, &[ID]), ID, &CsrPolicy::new(&deny())).is_ok());
}

#[test]
fn csr_ip_uri_and_email_names_are_refused() {
    use x509_cert::ext::pkix::name::GeneralName;
    let policy = permissive();
    let cases: Vec<(GeneralName, &str)> = vec![
        (
            GeneralName::IpAddress(der::asn1::OctetString::new(vec![10, 0, 0, 1]).unwrap()),
            "IP",
        ),
        (
            GeneralName::UniformResourceIdentifier(
                der::asn1::Ia5String::new("spiffe://example.net/admin").unwrap(),
            ),
            "URI",
        ),
        (
            GeneralName::Rfc822Name(der::asn1::Ia5String::new("root@example.net").unwrap()),
            "email",
        ),
    ];
    for (san, want) in cases {
        let csr = make_csr_with(&format!("CN={ID}"), vec![san_dns(ID), san]);
        let err = validate_csr(&csr, ID, &policy).unwrap_err();
        assert!(
            matches!(&err, PolicyError::SanKind { kind, .. } if *kind == want),
            "{want}: {err}"
        );
    }
}

#[test]
fn csr_for_a_privileged_san_smuggling_identity_is_refused() {
    // The identity an attacker announces; the CSR's CN equals it, so a bare CN == identity
    // check passes and the default deny list (patterns ending in `$`) did not match.
    let evil = "evil.example.net,DNS:admin.privileged.mcollective,DNS:x";
    let csr = make_csr_with(
        "CN=evil.example.net\\,DNS:admin.privileged.mcollective\\,DNS:x",
        vec![],
    );
    let err = validate_csr(&csr, evil, &CsrPolicy::new(&deny())).unwrap_err();
    assert!(
        matches!(
            &err,
            PolicyError::InvalidName {
                why: provision_core::IdentityError::ForbiddenChar(','),
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn csr_wildcard_and_wildcard_sans_are_refused_even_with_a_permissive_extra_pattern() {
    let policy = permissive();
    let csr = make_csr(ID, &["*.example.net"]);
    let err = validate_csr(&csr, ID, &policy).unwrap_err();
    assert!(matches!(&err, PolicyError::InvalidName { .. }), "{err}");
    let csr = make_csr("*.example.net", &[]);
    let err = validate_csr(&csr, "*.example.net", &policy).unwrap_err();
    assert!(matches!(&err, PolicyError::InvalidName { .. }), "{err}");
}

#[test]
fn csr_with_two_common_names_is_refused() {
    let csr = make_csr_with(&format!("CN={ID},CN=victim.example.net"), vec![]);
    let err = validate_csr(&csr, ID, &CsrPolicy::new(&deny())).unwrap_err();
    assert!(matches!(&err, PolicyError::CommonNames(2)), "{err}");
}

#[test]
fn no_server_jwt_is_signed_for_an_invalid_identity() {
    let pk = node_pk();
    let key = rsa_signer();
    for bad in [">", "*", "a\nb", "evil.example.net,DNS:x"] {
        let mut req = request(None, None, &key, &pk);
        req.identity = bad;
        let err = issue_server_jwt(&req).unwrap_err();
        assert!(
            matches!(&err, PolicyError::InvalidName { .. }),
            "{bad}: {err}"
        );
        assert!(
            !err.to_string().contains('\n'),
            "the message is escaped: {err}"
        );
    }
}
