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

/// Every PEM block of `text` as (label, DER), for files that hold several keys. Text between
/// blocks is ignored; the DER is not parsed.
pub fn decode_many(text: &str) -> Result<Vec<(String, Vec<u8>)>, PemError> {
    let blocks = ::pem::parse_many(text).map_err(|e| PemError::Armour(e.to_string()))?;
    Ok(blocks
        .into_iter()
        .map(|b| (b.tag().to_string(), b.into_contents()))
        .collect())
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
/// is the end of the signature, so the document still parses but no longer verifies. For tests
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
        // reader spin; run on a thread so a regression fails instead of hanging the suite.
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
