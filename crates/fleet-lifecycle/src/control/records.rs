//! What the fleet control bucket holds, and how a record read from it is judged: the pause,
//! deny entries and their matchers, pending nodes and approvals, each sealed, bounded and bound
//! to its key.

use super::*;

/// The operator's pause, as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PauseRecord {
    /// Who paused (the operator's identity in the Choria configuration).
    pub by: String,
    /// Why.
    pub reason: String,
    /// When (Unix seconds).
    pub at: i64,
    /// The HMAC tag (empty without a secret).
    #[serde(default)]
    pub tag: String,
}

/// One deny entry, as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DenyRecord {
    /// The entry as given: an identity, `/REGEX/` or `sha256:HEX`.
    pub entry: String,
    /// Why.
    pub reason: String,
    /// Who added it.
    pub by: String,
    /// When (Unix seconds).
    pub at: i64,
    /// When it stops applying (Unix seconds), if ever.
    #[serde(default)]
    pub expires: Option<i64>,
    /// The HMAC tag (empty without a secret).
    #[serde(default)]
    pub tag: String,
}

/// A node waiting for an operator's approval, as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingRecord {
    /// The node's identity.
    pub identity: String,
    /// The fingerprints of the keys it presented (`sha256:HEX`), as the deny list takes them.
    pub fingerprints: Vec<String>,
    /// Why it waits: `approval: manual` or the policy's reason.
    pub reason: String,
    /// A few facts from its inventory, each value shortened (by the approval queue).
    #[serde(default)]
    pub facts: std::collections::BTreeMap<String, String>,
    /// When it was first seen waiting (Unix seconds).
    pub first_seen: i64,
    /// When it was last seen (Unix seconds), written at most once per `interval`.
    pub last_seen: i64,
    /// When the entry stops applying (Unix seconds): the node is recorded anew when next seen.
    pub expires: i64,
    /// The replica that recorded it.
    pub by: String,
    /// The HMAC tag (empty without a secret).
    #[serde(default)]
    pub tag: String,
}

/// An operator's approval, as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApprovalRecord {
    /// The node's identity.
    pub identity: String,
    /// The fingerprints of the keys it presented when pending: only these are approved.
    pub fingerprints: Vec<String>,
    /// Who approved it.
    pub by: String,
    /// When (Unix seconds).
    pub at: i64,
    /// When the approval stops applying (Unix seconds).
    pub expires: i64,
    /// Why (may be empty).
    #[serde(default)]
    pub reason: String,
    /// The HMAC tag (empty without a secret).
    #[serde(default)]
    pub tag: String,
}

/// Which pending nodes an `approve` or `reject` acts on.
#[derive(Debug, Clone)]
pub enum Selector {
    /// One identity.
    Identity(String),
    /// Every pending identity the regular expression matches.
    Matching(regex::Regex),
}

impl Selector {
    /// `ID`, or with `matching` a regular expression of identities.
    pub fn new(text: &str, matching: bool) -> Result<Selector, ControlError> {
        if !matching {
            return Ok(Selector::Identity(text.to_string()));
        }
        regex::RegexBuilder::new(text)
            .size_limit(1 << 20)
            .build()
            .map(Selector::Matching)
            .map_err(|e| ControlError::InvalidEntry {
                entry: escaped(text).to_string(),
                reason: format!("not a regular expression: {e}"),
            })
    }

    pub(super) fn selects(&self, identity: &str) -> bool {
        match self {
            Selector::Identity(i) => i == identity,
            Selector::Matching(re) => re.is_match(identity),
        }
    }
}

/// The same set of fingerprints, in any order.
pub fn same_keys(a: &[String], b: &[String]) -> bool {
    let mut a: Vec<&String> = a.iter().collect();
    let mut b: Vec<&String> = b.iter().collect();
    a.sort();
    b.sort();
    a == b
}

impl DenyRecord {
    /// Whether the entry applies at `now` (Unix seconds).
    pub fn active(&self, now: i64) -> bool {
        self.expires.is_none_or(|e| now < e)
    }
}

/// What a deny entry matches.
#[derive(Debug, Clone)]
pub(super) enum Matcher {
    Identity(String),
    Pattern(regex::Regex),
    Key(String),
}

/// Parses a deny entry: `sha256:` and 64 hex digits, `/REGEX/`, or an identity.
pub(super) fn matcher(entry: &str) -> Result<Matcher, ControlError> {
    let invalid = |reason: String| ControlError::InvalidEntry {
        entry: escaped(entry).to_string(),
        reason,
    };
    if entry.is_empty() || entry.len() > MAX_ENTRY {
        return Err(invalid(format!("it must be 1 to {MAX_ENTRY} bytes")));
    }
    if entry.chars().any(char::is_control) {
        return Err(invalid("it has control characters".into()));
    }
    if let Some(hex) = entry.strip_prefix("sha256:") {
        if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(invalid(
                "a key fingerprint is sha256: and 64 hexadecimal digits".into(),
            ));
        }
        return Ok(Matcher::Key(format!("sha256:{}", hex.to_ascii_lowercase())));
    }
    if entry.len() >= 2 && entry.starts_with('/') && entry.ends_with('/') {
        let re = regex::RegexBuilder::new(&entry[1..entry.len() - 1])
            .size_limit(1 << 20)
            .build()
            .map_err(|e| invalid(format!("not a regular expression: {e}")))?;
        return Ok(Matcher::Pattern(re));
    }
    Ok(Matcher::Identity(entry.to_string()))
}

/// Checks a deny entry as `deny add` takes it.
pub fn check_entry(entry: &str) -> Result<(), ControlError> {
    matcher(entry).map(|_| ())
}

pub(super) fn deny_key(entry: &str) -> String {
    format!("{DENY_PREFIX}{}", hex::encode(entry.as_bytes()))
}

/// At most [`MAX_ENTRY`] bytes of `text`, control characters removed.
pub(super) fn bounded(text: &str) -> String {
    bounded_to(text, MAX_ENTRY)
}

/// A record read from the bucket under `key`: at most [`MAX_RECORD`] bytes of JSON, bound to
/// its key (`key_of` names the key the record belongs under) and sealed (`tag` is its tag,
/// which the seal covers empty).
pub(super) fn decode_sealed<T: serde::de::DeserializeOwned + Serialize>(
    seal: &Seal,
    key: &str,
    bytes: &[u8],
    key_of: impl FnOnce(&T) -> String,
    tag: fn(&mut T) -> &mut String,
) -> Option<T> {
    if bytes.len() > MAX_RECORD {
        return None;
    }
    let mut rec: T = serde_json::from_slice(bytes).ok()?;
    if key_of(&rec) != key {
        return None;
    }
    let sealed = std::mem::take(tag(&mut rec));
    let bare = serde_json::to_vec(&rec).ok()?;
    if !seal.verify_record(key, &bare, &sealed) {
        return None;
    }
    *tag(&mut rec) = sealed;
    Some(rec)
}

pub(super) fn decode_pause(seal: &Seal, bytes: &[u8]) -> Option<PauseRecord> {
    decode_sealed(
        seal,
        PAUSE_KEY,
        bytes,
        |_: &PauseRecord| PAUSE_KEY.to_string(),
        |r| &mut r.tag,
    )
}

pub(super) fn pending_key(identity: &str) -> String {
    format!("{PENDING_PREFIX}{}", hex::encode(identity.as_bytes()))
}

pub(super) fn approved_key(identity: &str) -> String {
    format!("{APPROVED_PREFIX}{}", hex::encode(identity.as_bytes()))
}

pub(super) fn decode_pending(seal: &Seal, key: &str, bytes: &[u8]) -> Option<PendingRecord> {
    decode_sealed(
        seal,
        key,
        bytes,
        |r: &PendingRecord| pending_key(&r.identity),
        |r| &mut r.tag,
    )
}

pub(super) fn decode_approval(seal: &Seal, key: &str, bytes: &[u8]) -> Option<ApprovalRecord> {
    decode_sealed(
        seal,
        key,
        bytes,
        |r: &ApprovalRecord| approved_key(&r.identity),
        |r| &mut r.tag,
    )
}

pub(super) fn decode_deny(seal: &Seal, key: &str, bytes: &[u8]) -> Option<(DenyRecord, Matcher)> {
    let rec = decode_sealed(
        seal,
        key,
        bytes,
        |r: &DenyRecord| deny_key(&r.entry),
        |r| &mut r.tag,
    )
    .filter(|r| r.reason.len() <= MAX_ENTRY)?;
    let m = matcher(&rec.entry).ok()?;
    Some((rec, m))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_checked() {
        assert!(check_entry("sha256:12").is_err());
        assert!(check_entry("/(/").is_err());
        assert!(check_entry("").is_err());
        assert!(check_entry("a\nb").is_err());
        assert!(check_entry(&"x".repeat(MAX_ENTRY + 1)).is_err());
        assert!(check_entry("n1.example.net").is_ok());
    }
}
