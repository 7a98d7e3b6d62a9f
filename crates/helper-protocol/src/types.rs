//! The JSON documents exchanged with the helper, shaped like the Go provisioner's `host.Host` and
//! `host.ConfigResponse` (field names, order, `null` and omitted values).

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::gojson::{self, Field, Kind};

/// The reply of the node's `choria_provision#gencsr` action, passed to the helper as `csr`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CsrReply {
    /// The PEM certificate signing request.
    #[serde(default, deserialize_with = "null_default")]
    pub csr: String,
    /// The node's public key as PEM (a PKCS#1 key under a `PUBLIC KEY` label).
    #[serde(default, deserialize_with = "null_default")]
    pub public_key: String,
    /// Where the node keeps its TLS files.
    #[serde(default, deserialize_with = "null_default")]
    pub ssldir: String,
}

/// The reply of the node's `choria_provision#gen25519` action, passed to the helper as
/// `ed25519_pubkey`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ed25519Reply {
    /// The node's ed25519 public key, 64 hex characters.
    #[serde(default, deserialize_with = "null_default")]
    pub public_key: String,
    /// The directory holding the node's configuration.
    #[serde(default, deserialize_with = "null_default")]
    pub directory: String,
    /// The signature over the provisioner's nonce, hex.
    #[serde(default, deserialize_with = "null_default")]
    pub signature: String,
}

/// Claims of a `provisioning.jwt` as the Go tokens package encodes them, in the same key order.
///
/// Keys the Go struct does not know are dropped when decoding, as Go does, so the helper sees
/// exactly what a Go provisioner would show it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ProvisioningClaims {
    /// `cht`: the provisioning token.
    #[serde(rename = "cht", default, deserialize_with = "null_default")]
    pub token: String,
    /// `chs`: whether the node runs with protocol security while provisioning.
    #[serde(rename = "chs", default, deserialize_with = "null_default")]
    pub secure: bool,
    /// `chu`: comma separated broker URLs.
    #[serde(
        rename = "chu",
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub urls: String,
    /// `chsrv`: SRV domain.
    #[serde(
        rename = "chsrv",
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub srv_domain: String,
    /// `chpd`: provisioning by default.
    #[serde(rename = "chpd", default, deserialize_with = "null_default")]
    pub prov_default: bool,
    /// `chrd`: registration data file.
    #[serde(
        rename = "chrd",
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub prov_reg_data: String,
    /// `chf`: facts file.
    #[serde(
        rename = "chf",
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub prov_facts: String,
    /// `chusr`: NATS user for provisioning.
    #[serde(
        rename = "chusr",
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub prov_nats_user: String,
    /// `chpwd`: NATS password for provisioning.
    #[serde(
        rename = "chpwd",
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub prov_nats_pass: String,
    /// `extensions`: free-form data, always present (`null` when absent).
    #[serde(default)]
    pub extensions: Option<serde_json::Map<String, serde_json::Value>>,
    /// `ou`: the organization.
    #[serde(
        rename = "ou",
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub organization_unit: String,
    /// `v2`: protocol version 2.
    #[serde(
        rename = "v2",
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "is_false"
    )]
    pub proto_v2: bool,
    /// `update`: whether `release_update` is allowed.
    #[serde(
        rename = "update",
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "is_false"
    )]
    pub allow_update: bool,
    /// The claims every Choria token carries.
    #[serde(flatten)]
    pub standard: StandardClaims,
}

/// Claims shared by every Choria token (tokens `StandardClaims` with the registered JWT claims).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StandardClaims {
    /// `purpose`, such as `choria_provisioning` or `choria_server`.
    #[serde(default, deserialize_with = "null_default")]
    pub purpose: String,
    /// `tcs`: trust chain signature.
    #[serde(
        rename = "tcs",
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub trust_chain_signature: String,
    /// `public_key`: hex ed25519 public key.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub public_key: String,
    /// `issexp`: expiry of the issuer, Unix seconds.
    #[serde(
        rename = "issexp",
        default,
        deserialize_with = "numeric_date",
        skip_serializing_if = "Option::is_none"
    )]
    pub issuer_expires_at: Option<i64>,
    /// `iss`.
    #[serde(
        rename = "iss",
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub issuer: String,
    /// `sub`.
    #[serde(
        rename = "sub",
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub subject: String,
    /// `aud`: a string or a list when decoding, always a list when encoding (as golang-jwt v5).
    #[serde(
        rename = "aud",
        default,
        deserialize_with = "audience",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub audience: Vec<String>,
    /// `exp`, Unix seconds.
    #[serde(
        rename = "exp",
        default,
        deserialize_with = "numeric_date",
        skip_serializing_if = "Option::is_none"
    )]
    pub expires_at: Option<i64>,
    /// `nbf`, Unix seconds.
    #[serde(
        rename = "nbf",
        default,
        deserialize_with = "numeric_date",
        skip_serializing_if = "Option::is_none"
    )]
    pub not_before: Option<i64>,
    /// `iat`, Unix seconds.
    #[serde(
        rename = "iat",
        default,
        deserialize_with = "numeric_date",
        skip_serializing_if = "Option::is_none"
    )]
    pub issued_at: Option<i64>,
    /// `jti`.
    #[serde(
        rename = "jti",
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub id: String,
}

/// Extra abilities of a server token (tokens `ServerPermissions`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerPermissions {
    /// Access to `<collective>.submission.in.>`.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "is_false"
    )]
    pub submission: bool,
    /// Access to Choria Streams.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "is_false"
    )]
    pub streams: bool,
    /// Access to Governors.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "is_false"
    )]
    pub governor: bool,
    /// May listen for service requests.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "is_false"
    )]
    pub service_host: bool,
}

/// Claims of a server token (tokens `ServerClaims`): what the helper may override in
/// `server_claims`, and the body of the server JWT the provisioner issues.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerClaims {
    /// `identity`: the node identity.
    #[serde(default, deserialize_with = "null_default")]
    pub identity: String,
    /// `collectives` (`null` when empty, as Go encodes a nil slice).
    #[serde(
        default,
        deserialize_with = "null_default",
        serialize_with = "nil_slice"
    )]
    pub collectives: Vec<String>,
    /// `permissions`, omitted when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permissions: Option<ServerPermissions>,
    /// `ou`: the organization.
    #[serde(
        rename = "ou",
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub organization_unit: String,
    /// `pub_subjects`: additional subjects the server may publish to.
    #[serde(
        rename = "pub_subjects",
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub additional_publish_subjects: Vec<String>,
    /// The claims every Choria token carries.
    #[serde(flatten)]
    pub standard: StandardClaims,
}

/// What the helper receives on stdin: the Go `host.Host` exported fields, in Go's order.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HelperInput {
    /// The node identity.
    pub identity: String,
    /// The node's CSR, `null` unless the `pki` feature is on.
    pub csr: Option<CsrReply>,
    /// The node's ed25519 key, `null` unless the `ed25519` feature is on.
    pub ed25519_pubkey: Option<Ed25519Reply>,
    /// The inventory as a JSON document inside a string.
    #[serde(rename = "inventory")]
    pub inventory: String,
    /// The verified provisioning token claims, `null` unless the `jwt` feature is on.
    pub jwt: Option<ProvisioningClaims>,
    /// `true` under the provisioner's `dry_run`: the answer is recorded, nothing is done with
    /// it. The key is left out otherwise, so the input is the Go provisioner's byte for byte.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dry_run: bool,
}

/// What the helper writes on stdout (the Go `host.ConfigResponse`).
///
/// Decoding follows Go's `encoding/json`, as the Go provisioner reads a helper's reply: keys in
/// any case (`Defer`, `MSG`, `Server_Claims`, at every level), missing keys and `null` leave
/// the zero value, of two keys naming one field the later counts, unknown keys are ignored.
/// Encoding writes every key, maps and `server_claims` as `null` when absent.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
// The derived code is this type's inherent `serialize`/`deserialize`; the trait
// implementations below put Go's reading in front of it.
#[serde(remote = "Self")]
pub struct HelperReply {
    /// Do not provision now; the node is tried again on a later discovery.
    #[serde(default, deserialize_with = "null_default")]
    pub defer: bool,
    /// Shut the node down; it is not provisioned.
    #[serde(default, deserialize_with = "null_default")]
    pub shutdown: bool,
    /// A message explaining `defer` or `shutdown`.
    #[serde(default, deserialize_with = "null_default")]
    pub msg: String,
    /// A PEM private key to send to the node, encrypted on the way.
    #[serde(default, deserialize_with = "null_default")]
    pub key: String,
    /// The node's signed certificate (PEM).
    #[serde(default, deserialize_with = "null_default")]
    pub certificate: String,
    /// The CA chain (PEM).
    #[serde(default, deserialize_with = "null_default")]
    pub ca: String,
    /// Where the node should keep its TLS files.
    #[serde(default, deserialize_with = "null_default")]
    pub ssldir: String,
    /// Overrides for the server JWT; `exp` is an absolute Unix time.
    #[serde(default)]
    pub server_claims: Option<ServerClaims>,
    /// The node's configuration, string values only.
    #[serde(default)]
    pub configuration: Option<BTreeMap<String, String>>,
    /// Action policy files by name (`*.policy`).
    #[serde(default)]
    pub action_policies: Option<BTreeMap<String, String>>,
    /// Open Policy Agent files by name (`*.rego`).
    #[serde(default)]
    pub opa_policies: Option<BTreeMap<String, String>>,
    /// The version the node should be upgraded to before it is configured.
    #[serde(rename = "upgrade", default, deserialize_with = "null_default")]
    pub upgrade: String,
}

impl Serialize for HelperReply {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        HelperReply::serialize(self, s)
    }
}

impl<'de> Deserialize<'de> for HelperReply {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let tree = gojson::Tree::deserialize(d)?;
        let value = gojson::canonical(tree, &REPLY_FIELDS).map_err(serde::de::Error::custom)?;
        HelperReply::deserialize(value).map_err(serde::de::Error::custom)
    }
}

const fn field(name: &'static str, kind: Kind) -> Field {
    Field { name, kind }
}

/// The Go `host.ConfigResponse`, as `encoding/json` decodes it.
const REPLY_FIELDS: [Field; 12] = [
    field("defer", Kind::Bool),
    field("shutdown", Kind::Bool),
    field("msg", Kind::Str),
    field("key", Kind::Str),
    field("certificate", Kind::Str),
    field("ca", Kind::Str),
    field("ssldir", Kind::Str),
    field("server_claims", Kind::Struct(&SERVER_CLAIMS_FIELDS)),
    field("configuration", Kind::StrMap),
    field("action_policies", Kind::StrMap),
    field("opa_policies", Kind::StrMap),
    field("upgrade", Kind::Str),
];

/// The tokens package's `ServerClaims` with the fields of its embedded `StandardClaims` and
/// golang-jwt's `RegisteredClaims`.
const SERVER_CLAIMS_FIELDS: [Field; 16] = [
    field("identity", Kind::Str),
    field("collectives", Kind::StrList),
    field("permissions", Kind::Struct(&SERVER_PERMISSIONS_FIELDS)),
    field("ou", Kind::Str),
    field("pub_subjects", Kind::StrList),
    field("purpose", Kind::Str),
    field("tcs", Kind::Str),
    field("public_key", Kind::Str),
    field("issexp", Kind::Date),
    field("iss", Kind::Str),
    field("sub", Kind::Str),
    field("aud", Kind::Audience),
    field("exp", Kind::Date),
    field("nbf", Kind::Date),
    field("iat", Kind::Date),
    field("jti", Kind::Str),
];

/// The tokens package's `ServerPermissions`.
const SERVER_PERMISSIONS_FIELDS: [Field; 4] = [
    field("submission", Kind::Bool),
    field("streams", Kind::Bool),
    field("governor", Kind::Bool),
    field("service_host", Kind::Bool),
];

fn is_false(b: &bool) -> bool {
    !*b
}

/// Go leaves the zero value in place when it decodes `null`; serde would refuse it.
fn null_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// A nil Go slice encodes as `null`.
fn nil_slice<S: Serializer>(v: &[String], s: S) -> Result<S::Ok, S::Error> {
    if v.is_empty() {
        s.serialize_none()
    } else {
        v.serialize(s)
    }
}

/// golang-jwt's `NumericDate` accepts integers and fractions of seconds.
fn numeric_date<'de, D: Deserializer<'de>>(d: D) -> Result<Option<i64>, D::Error> {
    let v = Option::<f64>::deserialize(d)?;
    Ok(v.map(|f| f.trunc() as i64))
}

/// golang-jwt's `ClaimStrings` accepts a single string or a list of strings.
fn audience<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(String),
        Many(Vec<String>),
    }
    Ok(match Option::<OneOrMany>::deserialize(d)? {
        None => Vec::new(),
        Some(OneOrMany::One(s)) => vec![s],
        Some(OneOrMany::Many(v)) => v,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn input_with_features_off_matches_go_encoding() {
        let input = HelperInput {
            identity: "n1.example.net".into(),
            inventory: "{\"version\":\"0.30.0\"}".into(),
            ..Default::default()
        };
        assert_eq!(
            serde_json::to_string(&input).unwrap(),
            r#"{"identity":"n1.example.net","csr":null,"ed25519_pubkey":null,"inventory":"{\"version\":\"0.30.0\"}","jwt":null}"#
        );
    }

    #[test]
    fn input_with_every_feature_matches_the_documented_shape() {
        let input = HelperInput {
            identity: "n1".into(),
            csr: Some(CsrReply {
                csr: "C".into(),
                public_key: "P".into(),
                ssldir: "/s".into(),
            }),
            ed25519_pubkey: Some(Ed25519Reply {
                public_key: "k".into(),
                directory: "/d".into(),
                signature: "s".into(),
            }),
            inventory: "{\"a\":\"<&>\"}".into(),
            jwt: Some(ProvisioningClaims {
                token: "t".into(),
                ..Default::default()
            }),
            dry_run: false,
        };
        assert_eq!(
            crate::to_go_json_string(&input).unwrap(),
            r#"{"identity":"n1","csr":{"csr":"C","public_key":"P","ssldir":"/s"},"ed25519_pubkey":{"public_key":"k","directory":"/d","signature":"s"},"inventory":"{\"a\":\"\u003c\u0026\u003e\"}","jwt":{"cht":"t","chs":false,"chpd":false,"extensions":null,"purpose":""}}"#
        );
    }

    #[test]
    fn provisioning_claims_keep_go_order_and_omissions() {
        let c = ProvisioningClaims {
            token: "s3cret".into(),
            urls: "nats://127.0.0.1:4222".into(),
            prov_default: true,
            organization_unit: "choria".into(),
            standard: StandardClaims {
                purpose: "choria_provisioning".into(),
                issuer: "Choria Tokens Package".into(),
                subject: "choria_provisioning".into(),
                expires_at: Some(1749536000),
                not_before: Some(1718000000),
                issued_at: Some(1718000000),
                id: "abc".into(),
                ..Default::default()
            },
            ..Default::default()
        };
        assert_eq!(
            serde_json::to_string(&c).unwrap(),
            r#"{"cht":"s3cret","chs":false,"chu":"nats://127.0.0.1:4222","chpd":true,"extensions":null,"ou":"choria","purpose":"choria_provisioning","iss":"Choria Tokens Package","sub":"choria_provisioning","exp":1749536000,"nbf":1718000000,"iat":1718000000,"jti":"abc"}"#
        );
    }

    #[test]
    fn claims_decode_drops_unknown_keys_and_accepts_single_audience() {
        let c: ProvisioningClaims = serde_json::from_str(
            r#"{"cht":"t","chs":true,"aud":"x","unknown":1,"exp":12.7,"extensions":{"a":1}}"#,
        )
        .unwrap();
        assert_eq!(c.standard.audience, vec!["x".to_string()]);
        assert_eq!(c.standard.expires_at, Some(12));
        let out = serde_json::to_string(&c).unwrap();
        assert!(!out.contains("unknown"));
        assert!(out.contains(r#""aud":["x"]"#));
    }

    #[test]
    fn reply_decodes_nulls_and_missing_keys_as_zero_values() {
        let r: HelperReply = serde_json::from_str(
            r#"{"defer":null,"msg":null,"configuration":{"a":"b"},"extra":[1]}"#,
        )
        .unwrap();
        assert!(!r.defer);
        assert_eq!(r.msg, "");
        assert_eq!(r.configuration.unwrap()["a"], "b");
        assert!(r.server_claims.is_none());
    }

    /// Each row: a reply, and what the Go provisioner's `encoding/json` made of it (observed
    /// with the Go `host.ConfigResponse` and tokens v0.0.4), as our encoding of the result.
    #[test]
    fn reply_is_decoded_as_go_decodes_it() {
        let rows: &[(&str, &str)] = &[
            // Keys in any case, map keys kept as written.
            (
                r#"{"Defer": true, "MSG": "x", "Configuration": {"A": "b"}}"#,
                r#"{"defer":true,"msg":"x","configuration":{"A":"b"}}"#,
            ),
            // Unicode simple folding: the long s is an s.
            (
                "{\"\u{17f}hutdown\": true, \"Key\": \"k\", \"upgradE\": \"1.2\"}",
                r#"{"shutdown":true,"key":"k","upgrade":"1.2"}"#,
            ),
            // Of two keys naming one field the later counts; null keeps a string.
            (r#"{"msg":"a","Msg":"b"}"#, r#"{"msg":"b"}"#),
            (r#"{"Msg":"b","msg":null}"#, r#"{"msg":"b"}"#),
            // A struct given twice is merged, at every level in any case.
            (
                r#"{"server_claims":{"identity":"n1"},"Server_Claims":{"OU":"x","Permissions":{"Streams":true}}}"#,
                r#"{"server_claims":{"identity":"n1","permissions":{"streams":true},"ou":"x"}}"#,
            ),
            // null clears a pointer and a map.
            (
                r#"{"server_claims":{"ou":"x"},"SERVER_CLAIMS":null}"#,
                r#"{}"#,
            ),
            (
                r#"{"configuration":{"a":"1"},"configuration":null}"#,
                r#"{}"#,
            ),
            // A map given twice is merged; a null entry is the empty string.
            (
                r#"{"configuration":{"a":"1"},"Configuration":{"b":"2","a":null}}"#,
                r#"{"configuration":{"a":"","b":"2"}}"#,
            ),
            // NumericDate takes a string holding a number; ClaimStrings ignores null.
            (
                r#"{"server_claims":{"EXP":"1700000000.5"}}"#,
                r#"{"server_claims":{"exp":1700000000}}"#,
            ),
            (
                r#"{"server_claims":{"aud":"x","Aud":null}}"#,
                r#"{"server_claims":{"aud":["x"]}}"#,
            ),
            (
                r#"{"server_claims":{"Collectives":["a",null]}}"#,
                r#"{"server_claims":{"collectives":["a",""]}}"#,
            ),
        ];
        for (reply, want) in rows {
            let got: HelperReply = serde_json::from_str(reply).unwrap();
            let want: HelperReply =
                HelperReply::deserialize(&mut serde_json::Deserializer::from_str(want)).unwrap();
            assert_eq!(got, want, "{reply}");
        }
    }

    #[test]
    fn reply_with_a_wrong_type_is_refused_as_go_refuses_it() {
        // Go reports the first value of a wrong type even when a later key gives a good one.
        for reply in [
            r#"{"defer":"yes","Defer":true}"#,
            r#"{"configuration":{"a":1},"Configuration":{"a":"2"}}"#,
            r#"{"server_claims":{"aud":5}}"#,
            r#"{"server_claims":{"exp":"soon"}}"#,
            r#"{"Server_Claims":7}"#,
        ] {
            assert!(
                serde_json::from_str::<HelperReply>(reply).is_err(),
                "{reply} decoded"
            );
        }
        // The message names the field and the kinds, never the value (a reply carries keys).
        let err = serde_json::from_str::<HelperReply>(
            r#"{"Configuration":{"a":"1"},"configuration":{"b":["-----BEGIN PRIVATE KEY-----"]}}"#,
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("configuration.b: expected a string, found an array"),
            "{err}"
        );
        assert!(!err.contains("PRIVATE"), "{err}");
        // A bare null decodes to an empty reply in Go, so the node would be configured with
        // nothing; it is refused here as the helper fault it is.
        assert!(serde_json::from_str::<HelperReply>("null").is_err());
        assert!(serde_json::from_str::<HelperReply>("[]").is_err());
    }

    #[test]
    fn a_reply_encodes_and_decodes_to_itself() {
        let r: HelperReply = serde_json::from_str(
            r#"{"DEFER":false,"Msg":"m","Server_Claims":{"Identity":"n1","EXP":5,"aud":"a"},"OPA_Policies":{"x.rego":"p"}}"#,
        )
        .unwrap();
        let text = serde_json::to_string(&r).unwrap();
        assert!(
            text.contains(r#""server_claims":{"identity":"n1""#),
            "{text}"
        );
        assert_eq!(serde_json::from_str::<HelperReply>(&text).unwrap(), r);
    }

    #[test]
    fn reply_refuses_non_string_configuration_values() {
        assert!(serde_json::from_str::<HelperReply>(r#"{"configuration":{"a":1}}"#).is_err());
    }

    #[test]
    fn empty_reply_encodes_every_key_like_go() {
        assert_eq!(
            serde_json::to_string(&HelperReply::default()).unwrap(),
            r#"{"defer":false,"shutdown":false,"msg":"","key":"","certificate":"","ca":"","ssldir":"","server_claims":null,"configuration":null,"action_policies":null,"opa_policies":null,"upgrade":""}"#
        );
    }

    #[test]
    fn server_claims_encode_like_the_tokens_package() {
        let c = ServerClaims {
            identity: "n1".into(),
            collectives: vec!["choria".into()],
            organization_unit: "choria".into(),
            standard: StandardClaims {
                purpose: "choria_server".into(),
                public_key: "ab".into(),
                issuer: "Choria Provisioner".into(),
                expires_at: Some(2),
                not_before: Some(1),
                issued_at: Some(1),
                id: "k".into(),
                ..Default::default()
            },
            ..Default::default()
        };
        assert_eq!(
            serde_json::to_string(&c).unwrap(),
            r#"{"identity":"n1","collectives":["choria"],"ou":"choria","purpose":"choria_server","public_key":"ab","iss":"Choria Provisioner","exp":2,"nbf":1,"iat":1,"jti":"k"}"#
        );
    }
}
