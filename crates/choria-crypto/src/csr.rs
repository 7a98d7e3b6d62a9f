//! Certificate signing requests (PKCS#10): decoding through [`crate::pem::decode`], the
//! self-signature check that proves the sender holds the key, and the names a CA would copy.
//! Deciding whether those names are acceptable is the caller's business.

use der::asn1::ObjectIdentifier;
use der::{Decode as _, Encode as _};
use rsa::pkcs8::DecodePublicKey as _;
use rsa::{Pkcs1v15Sign, RsaPublicKey};
use sha2::{Digest as _, Sha256, Sha384, Sha512};
use x509_cert::ext::pkix::name::GeneralName;
use x509_cert::name::Name;
pub use x509_cert::request::CertReq;
use x509_cert::request::ExtensionReq;

/// Why a CSR was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CsrError {
    /// The CSR could not be decoded.
    #[error("{0}")]
    Parse(String),
    /// Its self-signature does not verify or uses an algorithm that is not accepted.
    #[error("{0}")]
    Signature(String),
}

const OID_CN: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.5.4.3");
const OID_SAN: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.5.29.17");
const OID_SHA1_RSA: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113549.1.1.5");
const OID_SHA256_RSA: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113549.1.1.11");
const OID_SHA384_RSA: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113549.1.1.12");
const OID_SHA512_RSA: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113549.1.1.13");

/// The names found in a CSR.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CsrNames {
    /// The subject common name (the last one when there are several).
    pub common_name: String,
    /// How many common names the subject holds.
    pub common_names: usize,
    /// The DNS subject alternative names.
    pub dns_names: Vec<String>,
    /// Every other subject alternative name, as (kind, value).
    pub other_names: Vec<(&'static str, String)>,
}

/// Decodes a PEM `CERTIFICATE REQUEST`.
pub fn from_pem(text: &str) -> Result<CertReq, CsrError> {
    let der = crate::pem::decode(text, "CERTIFICATE REQUEST").map_err(|e| match e {
        crate::pem::PemError::Label { found, .. } => CsrError::Parse(format!(
            "PEM type label {found:?} is not CERTIFICATE REQUEST"
        )),
        other => CsrError::Parse(other.to_string()),
    })?;
    CertReq::from_der(&der).map_err(|e| CsrError::Parse(e.to_string()))
}

/// The fingerprint of the CSR's public key: `sha256:` and the lower-case hex SHA-256 of its DER
/// `SubjectPublicKeyInfo` (what `openssl req -pubkey -noout | openssl pkey -pubin -outform DER |
/// sha256sum` prints), the same whatever name the CSR carries.
pub fn key_fingerprint(req: &CertReq) -> Result<String, CsrError> {
    use der::Encode;
    use sha2::Digest;
    let der = req
        .info
        .public_key
        .to_der()
        .map_err(|e| CsrError::Parse(e.to_string()))?;
    Ok(format!(
        "sha256:{}",
        hex::encode(sha2::Sha256::digest(&der))
    ))
}

/// The fingerprint of a raw key (an ed25519 public key's 32 bytes): `sha256:` and the lower-case
/// hex SHA-256 of the bytes.
pub fn raw_key_fingerprint(key: &[u8]) -> String {
    use sha2::Digest;
    format!("sha256:{}", hex::encode(sha2::Sha256::digest(key)))
}

/// Verifies the CSR's self-signature with its own RSA key: PKCS#1 v1.5 with SHA-256, SHA-384 or
/// SHA-512. SHA-1 and every other algorithm are refused.
pub fn verify_signature(req: &CertReq) -> Result<(), CsrError> {
    let spki = req
        .info
        .public_key
        .to_der()
        .map_err(|e| CsrError::Parse(e.to_string()))?;
    let key = RsaPublicKey::from_public_key_der(&spki)
        .map_err(|e| CsrError::Signature(format!("unsupported public key: {e}")))?;
    let info = req
        .info
        .to_der()
        .map_err(|e| CsrError::Parse(e.to_string()))?;
    let sig = req
        .signature
        .as_bytes()
        .ok_or_else(|| CsrError::Signature("signature has unused bits".into()))?;
    let oid = req.algorithm.oid;
    let res = if oid == OID_SHA256_RSA {
        key.verify(Pkcs1v15Sign::new::<Sha256>(), &Sha256::digest(&info), sig)
    } else if oid == OID_SHA384_RSA {
        key.verify(Pkcs1v15Sign::new::<Sha384>(), &Sha384::digest(&info), sig)
    } else if oid == OID_SHA512_RSA {
        key.verify(Pkcs1v15Sign::new::<Sha512>(), &Sha512::digest(&info), sig)
    } else if oid == OID_SHA1_RSA {
        return Err(CsrError::Signature(
            "SHA-1 signatures are not accepted".into(),
        ));
    } else {
        return Err(CsrError::Signature(format!(
            "unsupported signature algorithm {oid}"
        )));
    };
    res.map_err(|e| CsrError::Signature(e.to_string()))
}

/// The common names of a subject, as text; `None` for one that is not a string.
pub fn common_names(subject: &Name) -> Vec<Option<String>> {
    subject
        .0
        .iter()
        .flat_map(|rdn| rdn.0.iter())
        .filter(|atv| atv.oid == OID_CN)
        .map(|atv| any_string(&atv.value))
        .collect()
}

/// The names of a CSR: the subject's common names and every subject alternative name of its
/// extension request.
pub fn names(req: &CertReq) -> Result<CsrNames, CsrError> {
    let mut common_name = String::new();
    let mut common_names = 0;
    for cn in self::common_names(&req.info.subject) {
        common_names += 1;
        common_name = cn.ok_or_else(|| CsrError::Parse("common name is not a string".into()))?;
    }
    let mut dns_names = Vec::new();
    let mut other_names = Vec::new();
    for attr in req.info.attributes.iter() {
        if attr.oid != <ExtensionReq as der::oid::AssociatedOid>::OID {
            continue;
        }
        for v in attr.values.iter() {
            let exts: ExtensionReq = v
                .decode_as()
                .map_err(|e| CsrError::Parse(format!("bad extension request: {e}")))?;
            for ext in exts.0.iter().filter(|e| e.extn_id == OID_SAN) {
                let san = x509_cert::ext::pkix::SubjectAltName::from_der(ext.extn_value.as_bytes())
                    .map_err(|e| CsrError::Parse(format!("bad subject alternative names: {e}")))?;
                for gn in san.0 {
                    match gn {
                        GeneralName::DnsName(n) => dns_names.push(n.to_string()),
                        GeneralName::IpAddress(ip) => {
                            other_names.push(("IP", hex::encode(ip.as_bytes())))
                        }
                        GeneralName::UniformResourceIdentifier(u) => {
                            other_names.push(("URI", u.to_string()))
                        }
                        GeneralName::Rfc822Name(m) => other_names.push(("email", m.to_string())),
                        GeneralName::DirectoryName(_) => {
                            other_names.push(("DirName", String::new()))
                        }
                        GeneralName::OtherName(o) => {
                            other_names.push(("otherName", o.type_id.to_string()))
                        }
                        GeneralName::RegisteredId(o) => other_names.push(("RID", o.to_string())),
                        GeneralName::EdiPartyName(_) => {
                            other_names.push(("ediPartyName", String::new()))
                        }
                    }
                }
            }
        }
    }
    Ok(CsrNames {
        common_name,
        common_names,
        dns_names,
        other_names,
    })
}

/// A directory string (UTF8String, PrintableString, IA5String or TeletexString) as text.
pub fn any_string(v: &der::Any) -> Option<String> {
    use der::asn1::{Ia5StringRef, PrintableStringRef, TeletexStringRef, Utf8StringRef};
    if let Ok(s) = v.decode_as::<Utf8StringRef<'_>>() {
        return Some(s.to_string());
    }
    if let Ok(s) = v.decode_as::<PrintableStringRef<'_>>() {
        return Some(s.to_string());
    }
    if let Ok(s) = v.decode_as::<Ia5StringRef<'_>>() {
        return Some(s.to_string());
    }
    if let Ok(s) = v.decode_as::<TeletexStringRef<'_>>() {
        return Some(s.to_string());
    }
    None
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::str::FromStr as _;

    fn name(s: &str) -> Name {
        Name::from_str(s).unwrap()
    }

    #[test]
    fn common_names_are_read_from_every_rdn() {
        let one = [Some("n1.example.net".to_string())];
        assert_eq!(common_names(&name("CN=n1.example.net")), one);
        assert_eq!(
            common_names(&name("CN=n1.example.net,O=Example,OU=web")),
            one
        );
        assert!(common_names(&name("O=Example")).is_empty());
        assert_eq!(
            common_names(&name("CN=a.example.net,CN=admin.mcollective")).len(),
            2
        );
        assert_eq!(
            common_names(&name("CN=a.example.net+O=x")),
            [Some("a.example.net".to_string())]
        );
    }

    #[test]
    fn a_truncated_or_mislabelled_csr_is_an_error_not_a_hang() {
        let truncated = der::pem::encode_string(
            "CERTIFICATE REQUEST",
            der::pem::LineEnding::LF,
            &[0x30, 0x82],
        )
        .unwrap();
        let refused = crate::returns_within_5s(move || from_pem(&truncated).is_err());
        assert!(refused);
        assert_eq!(
            from_pem(&crate::pem::encode("CERTIFICATE", vec![0u8]))
                .unwrap_err()
                .to_string(),
            "PEM type label \"CERTIFICATE\" is not CERTIFICATE REQUEST"
        );
    }
}
