//! PEM documents: the armour is decoded first and the DER then parsed from a slice. `der`'s
//! streaming PEM reader loops forever on DER that ends inside a header, and certificates, CSRs
//! and keys reach Choria's programs from nodes, helpers and files anyone may have damaged, so
//! [`decode`] is the one way into DER here.

use der::Decode as _;

/// Why a PEM document was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PemError {
    /// The armour or its base64 is malformed.
    #[error("{0}")]
    Armour(String),
    /// The document holds something else.
    #[error("PEM type label {found:?} is not {expected}")]
    Label {
        /// The document's label.
        found: String,
        /// The label asked for.
        expected: &'static str,
    },
    /// The DER inside does not parse as what was asked for.
    #[error("{0}")]
    Der(String),
}

/// The DER of a single PEM document (surrounding whitespace ignored) whose label is
/// `expected_label`, such as `CERTIFICATE` or `CERTIFICATE REQUEST`.
pub fn decode(text: &str, expected_label: &'static str) -> Result<Vec<u8>, PemError> {
    let (label, der) = der::pem::decode_vec(text.trim().as_bytes())
        .map_err(|e| PemError::Armour(e.to_string()))?;
    if label != expected_label {
        return Err(PemError::Label {
            found: label.to_string(),
            expected: expected_label,
        });
    }
    Ok(der)
}

/// A PEM `CERTIFICATE`, decoded through [`decode`].
pub fn certificate(text: &str) -> Result<x509_cert::Certificate, PemError> {
    let der = decode(text, "CERTIFICATE")?;
    x509_cert::Certificate::from_der(&der).map_err(|e| PemError::Der(e.to_string()))
}

/// The DER SubjectPublicKeyInfo of a certificate.
pub fn certificate_spki_der(cert: &x509_cert::Certificate) -> Result<Vec<u8>, PemError> {
    der::Encode::to_der(&cert.tbs_certificate.subject_public_key_info)
        .map_err(|e| PemError::Der(e.to_string()))
}

/// An RSA private key: `RSA PRIVATE KEY` (PKCS#1) or `PRIVATE KEY` (PKCS#8), decoded through
/// [`decode`].
pub fn rsa_private_key(text: &str) -> Result<rsa::RsaPrivateKey, PemError> {
    use rsa::pkcs1::DecodeRsaPrivateKey as _;
    use rsa::pkcs8::DecodePrivateKey as _;
    match decode(text, "RSA PRIVATE KEY") {
        Ok(der) => {
            rsa::RsaPrivateKey::from_pkcs1_der(&der).map_err(|e| PemError::Der(e.to_string()))
        }
        Err(PemError::Label { found, .. }) if found == "PRIVATE KEY" => {
            let der = decode(text, "PRIVATE KEY")?;
            rsa::RsaPrivateKey::from_pkcs8_der(&der).map_err(|e| PemError::Der(e.to_string()))
        }
        Err(e) => Err(e),
    }
}

/// An RSA public key: `PUBLIC KEY` as a SubjectPublicKeyInfo, or PKCS#1 under that label (as
/// some tools write it), or `RSA PUBLIC KEY`; decoded through [`decode`].
pub fn rsa_public_key(text: &str) -> Result<rsa::RsaPublicKey, PemError> {
    use rsa::pkcs1::DecodeRsaPublicKey as _;
    use rsa::pkcs8::DecodePublicKey as _;
    match decode(text, "PUBLIC KEY") {
        Ok(der) => rsa::RsaPublicKey::from_public_key_der(&der)
            .or_else(|_| rsa::RsaPublicKey::from_pkcs1_der(&der))
            .map_err(|e| PemError::Der(format!("not an RSA public key: {e}"))),
        Err(PemError::Label { found, .. }) if found == "RSA PUBLIC KEY" => {
            let der = decode(text, "RSA PUBLIC KEY")?;
            rsa::RsaPublicKey::from_pkcs1_der(&der).map_err(|e| PemError::Der(e.to_string()))
        }
        Err(e) => Err(e),
    }
}

/// Every PEM block of `text` as (label, DER), for files that hold several keys. Text between
/// blocks is ignored; the DER is not parsed.
pub fn decode_many(text: &str) -> Result<Vec<(String, Vec<u8>)>, PemError> {
    let blocks = ::pem::parse_many(text).map_err(|e| PemError::Armour(e.to_string()))?;
    Ok(blocks
        .into_iter()
        .map(|b| (b.tag().to_string(), b.into_contents()))
        .collect())
}

/// What identifies an issued certificate in a record: never the certificate itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertificateSummary {
    /// The serial number as lower-case hex of its DER integer bytes (as `openssl x509 -serial`
    /// prints it, in lower case).
    pub serial: String,
    /// The SHA-256 of the certificate's DER, lower-case hex (`openssl x509 -fingerprint
    /// -sha256` without the colons).
    pub sha256: String,
    /// `notAfter` in Unix seconds.
    pub not_after: i64,
}

/// The serial, SHA-256 fingerprint and expiry of the first `CERTIFICATE` in `text` (a helper
/// may send the certificate followed by its chain).
pub fn certificate_summary(text: &str) -> Result<CertificateSummary, PemError> {
    use sha2::Digest as _;
    let der = match decode(text, "CERTIFICATE") {
        Ok(der) => der,
        Err(first) => decode_many(text)?
            .into_iter()
            .find(|(label, _)| label == "CERTIFICATE")
            .map(|(_, der)| der)
            .ok_or(first)?,
    };
    let cert = x509_cert::Certificate::from_der(&der).map_err(|e| PemError::Der(e.to_string()))?;
    let tbs = &cert.tbs_certificate;
    let not_after =
        i64::try_from(tbs.validity.not_after.to_unix_duration().as_secs()).unwrap_or(i64::MAX);
    Ok(CertificateSummary {
        serial: hex::encode(tbs.serial_number.as_bytes()),
        sha256: hex::encode(sha2::Sha256::digest(&der)),
        not_after,
    })
}

/// `der` in a PEM block labelled `label`, as Go's `pem.Encode` writes it: 64-column base64
/// lines, `\n` line endings, a final newline.
pub fn encode(label: &str, der: impl Into<Vec<u8>>) -> String {
    ::pem::encode_config(
        &::pem::Pem::new(label, der),
        ::pem::EncodeConfig::new().set_line_ending(::pem::LineEnding::LF),
    )
}

/// The same PEM document with the last byte of its DER flipped: for a CSR or a certificate that
/// is the end of the signature, so the document still parses but does not verify. For tests
/// and fault injection.
pub fn break_signature(text: &str) -> Option<String> {
    let (label, mut der) = der::pem::decode_vec(text.as_bytes()).ok()?;
    let last = der.last_mut()?;
    *last ^= 0x01;
    der::pem::encode_string(label, der::pem::LineEnding::LF, &der).ok()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_truncated_document_is_an_error_not_a_hang() {
        // DER that stops inside its first header, the input that once made der's streaming PEM
        // reader spin; run on a thread so a regression fails rather than hangs the suite.
        for label in ["CERTIFICATE", "CERTIFICATE REQUEST"] {
            let truncated =
                der::pem::encode_string(label, der::pem::LineEnding::LF, &[0x30, 0x82]).unwrap();
            let refused = crate::returns_within_5s(move || certificate(&truncated).is_err());
            assert!(refused, "{label}");
        }
    }

    #[test]
    fn the_label_must_be_the_one_asked_for() {
        let text = encode("PUBLIC KEY", vec![0u8]);
        assert_eq!(
            decode(&text, "CERTIFICATE").unwrap_err().to_string(),
            "PEM type label \"PUBLIC KEY\" is not CERTIFICATE"
        );
        assert_eq!(
            decode(&format!("\n {text}\n"), "PUBLIC KEY").unwrap(),
            [0u8]
        );
        assert!(matches!(
            decode("not pem", "PUBLIC KEY"),
            Err(PemError::Armour(_))
        ));
    }

    /// Made with `openssl req -x509 ... -set_serial 0x1f2e3d4c5b6a`; the expected figures are
    /// what `openssl x509 -noout -serial -fingerprint -sha256 -enddate` printed for it.
    const CERT: &str = "-----BEGIN CERTIFICATE-----
MIIBeDCCAR+gAwIBAgIGHy49TFtqMAoGCCqGSM49BAMCMBkxFzAVBgNVBAMMDmZw
LmV4YW1wbGUubmV0MB4XDTI2MTIwMTEwMjYzNFoXDTM2MTEyODEwMjYzNFowGTEX
MBUGA1UEAwwOZnAuZXhhbXBsZS5uZXQwWTATBgcqhkjOPQIBBggqhkjOPQMBBwNC
AAShEbSjwKGGl68z7rA/iBygWbXX2o8AaTsn1QWQSF1Ls3asiL+TkzAkP2RZmekB
d5N5DmU8jsd63eVwzAxt/tRgo1MwUTAdBgNVHQ4EFgQUTzDJC/5e5k5BkKGYSYOB
TH66TxIwHwYDVR0jBBgwFoAUTzDJC/5e5k5BkKGYSYOBTH66TxIwDwYDVR0TAQH/
BAUwAwEB/zAKBggqhkjOPQQDAgNHADBEAiB3zcv6zBg50h+43JPeQzOJKXEGH1LR
/iWIvhRTYWQ3jAIgTSuRIcTUyOurDWzzj7IzWwO3YWfK1p8pxZ/41Zcz7lk=
-----END CERTIFICATE-----
";

    #[test]
    fn a_certificate_is_summarised_as_openssl_prints_it() {
        let want = CertificateSummary {
            serial: "1f2e3d4c5b6a".into(),
            sha256: "9c958a8cb3f9ec0371e424c58f5c6c44ed5abeafeed16fc713156c1b980e6b4d".into(),
            not_after: 2111480794,
        };
        assert_eq!(certificate_summary(CERT).unwrap(), want);
        // The certificate first, then its chain: the first one is summarised.
        let chain = format!("{CERT}{CERT}");
        assert_eq!(certificate_summary(&chain).unwrap(), want);
        assert!(certificate_summary("not a certificate").is_err());
        assert!(certificate_summary(&encode("PUBLIC KEY", vec![0u8])).is_err());
    }

    #[test]
    fn encoding_is_go_style() {
        let text = encode("X", vec![0u8; 60]);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "-----BEGIN X-----");
        assert_eq!(lines[1].len(), 64);
        assert_eq!(lines.last(), Some(&"-----END X-----"));
        assert!(text.ends_with("-----\n") && !text.contains('\r'));
        let broken = break_signature(&text).unwrap();
        assert_ne!(broken, text);
        assert_eq!(decode(&broken, "X").unwrap()[59], 1);
    }
}
