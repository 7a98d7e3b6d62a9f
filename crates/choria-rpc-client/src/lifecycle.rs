//! Choria lifecycle events (`startup`, `shutdown`, `provisioned`, `alive`, `upgraded`,
//! `governor`) in both wire formats: the Choria format and CloudEvents v1.0 carrying it.

use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// Prefix of every lifecycle event protocol string.
pub const PROTOCOL_PREFIX: &str = "io.choria.lifecycle.v1.";
/// CloudEvents `source` of lifecycle events.
pub const CLOUDEVENT_SOURCE: &str = "io.choria.lifecycle";

/// Why an event could not be parsed.
#[derive(Debug, thiserror::Error)]
pub enum LifecycleError {
    /// The body is not JSON or lacks required fields.
    #[error("invalid lifecycle event json: {0}")]
    Json(#[from] serde_json::Error),
    /// Neither a Choria-format nor a CloudEvents lifecycle event.
    #[error("unsupported event format")]
    UnsupportedFormat,
}

/// Which wire format an event arrived in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventFormat {
    /// A bare Choria event, `protocol` starting `io.choria.lifecycle`.
    Choria,
    /// A CloudEvents v1.0 envelope whose `data` is the Choria event.
    CloudEvent,
}

/// A lifecycle event, whatever its type.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LifecycleEvent {
    /// `io.choria.lifecycle.v1.<type>`.
    pub protocol: String,
    /// Event id (a v4 UUID with dashes).
    pub id: String,
    /// Identity of the emitting component.
    pub identity: String,
    /// Component (`provision_mode_server`, `server`, `provisioner`...).
    pub component: String,
    /// Unix seconds.
    pub timestamp: i64,
    /// Version (startup, alive and upgraded events).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// New version (upgraded events).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub new_version: Option<String>,
}

/// A parsed event and the format it arrived in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReceivedEvent {
    /// The event.
    pub event: LifecycleEvent,
    /// Its wire format.
    pub format: EventFormat,
}

/// The CloudEvents v1.0 envelope, written from borrowed fields.
#[derive(Serialize)]
struct CloudEventJson<'a> {
    specversion: &'static str,
    id: &'a str,
    source: &'static str,
    #[serde(rename = "type")]
    kind: &'a str,
    subject: &'a str,
    datacontenttype: &'static str,
    time: String,
    data: &'a LifecycleEvent,
}

/// The fields of an event or of its envelope, read in one pass (anyone holding a provisioning
/// JWT can publish events by the million, so no generic JSON tree is built for them). A
/// Choria-format event fills the event fields; a CloudEvent fills `specversion`, `source` and
/// `data`, the Choria event it carries.
#[derive(Deserialize)]
struct WireEvent {
    #[serde(default)]
    protocol: Option<String>,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    identity: Option<String>,
    #[serde(default)]
    component: Option<String>,
    #[serde(default)]
    timestamp: Option<i64>,
    #[serde(default)]
    version: Option<String>,
    #[serde(default)]
    new_version: Option<String>,
    #[serde(default)]
    specversion: Option<String>,
    #[serde(default)]
    source: Option<String>,
    #[serde(default)]
    data: Option<Box<WireEvent>>,
}

impl WireEvent {
    fn is_lifecycle(&self) -> bool {
        self.protocol
            .as_deref()
            .is_some_and(|p| p.starts_with("io.choria.lifecycle"))
    }

    /// The Choria event these fields make, if every required one is there.
    fn into_event(self) -> Result<LifecycleEvent, LifecycleError> {
        let missing = |field: &str| {
            LifecycleError::Json(serde::de::Error::custom(format!("missing field `{field}`")))
        };
        Ok(LifecycleEvent {
            protocol: self.protocol.ok_or_else(|| missing("protocol"))?,
            id: self.id.ok_or_else(|| missing("id"))?,
            identity: self.identity.ok_or_else(|| missing("identity"))?,
            component: self.component.ok_or_else(|| missing("component"))?,
            timestamp: self.timestamp.ok_or_else(|| missing("timestamp"))?,
            version: self.version,
            new_version: self.new_version,
        })
    }
}

impl LifecycleEvent {
    /// A new event of `event_type` stamped now with a fresh id.
    pub fn new(event_type: &str, identity: &str, component: &str) -> Self {
        let timestamp = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
            .unwrap_or(0);
        LifecycleEvent {
            protocol: format!("{PROTOCOL_PREFIX}{event_type}"),
            id: crate::protocol::random_uuid().to_string(),
            identity: identity.to_string(),
            component: component.to_string(),
            timestamp,
            version: None,
            new_version: None,
        }
    }

    /// A `startup` event carrying `version`.
    pub fn startup(identity: &str, component: &str, version: &str) -> Self {
        let mut e = Self::new("startup", identity, component);
        e.version = Some(version.to_string());
        e
    }

    /// The event type: the part of `protocol` after `io.choria.lifecycle.v1.`.
    pub fn event_type(&self) -> &str {
        self.protocol
            .strip_prefix(PROTOCOL_PREFIX)
            .unwrap_or(&self.protocol)
    }

    /// `choria.lifecycle.event.<type>.<component>`, where the event is published.
    pub fn subject(&self) -> String {
        format!(
            "choria.lifecycle.event.{}.{}",
            self.event_type(),
            self.component
        )
    }

    /// Choria-format JSON.
    pub fn to_choria_json(&self) -> Result<Vec<u8>, serde_json::Error> {
        serde_json::to_vec(self)
    }

    /// CloudEvents v1.0 JSON carrying the Choria event as `data`.
    pub fn to_cloudevent_json(&self) -> Result<Vec<u8>, serde_json::Error> {
        serde_json::to_vec(&CloudEventJson {
            specversion: "1.0",
            id: &self.id,
            source: CLOUDEVENT_SOURCE,
            kind: &self.protocol,
            subject: &self.identity,
            datacontenttype: "application/json",
            time: rfc3339(self.timestamp),
            data: self,
        })
    }

    /// Parse an event in either format, as go-choria's generic reader does.
    pub fn parse(body: &[u8]) -> Result<ReceivedEvent, LifecycleError> {
        let wire: WireEvent = serde_json::from_slice(body)?;
        if wire.is_lifecycle() {
            return Ok(ReceivedEvent {
                event: wire.into_event()?,
                format: EventFormat::Choria,
            });
        }
        let is_cloud = wire.specversion.as_deref() == Some("1.0")
            && wire.source.as_deref() == Some(CLOUDEVENT_SOURCE);
        let data = match wire.data {
            Some(d) if is_cloud && d.is_lifecycle() => d,
            _ => return Err(LifecycleError::UnsupportedFormat),
        };
        Ok(ReceivedEvent {
            event: data.into_event()?,
            format: EventFormat::CloudEvent,
        })
    }
}

/// Unix seconds as an RFC 3339 UTC timestamp (`2024-06-10T06:13:20Z`).
fn rfc3339(secs: i64) -> String {
    chrono::DateTime::from_timestamp(secs, 0)
        .unwrap_or_default()
        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_matches_known_instants() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(1_718_000_000), "2024-06-10T06:13:20Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
    }

    #[test]
    fn startup_event_round_trips_in_both_formats() {
        let e = LifecycleEvent::startup("p.example.net", "provisioner", "1.2.3");
        assert_eq!(e.subject(), "choria.lifecycle.event.startup.provisioner");
        let c = LifecycleEvent::parse(&e.to_choria_json().unwrap()).unwrap();
        assert_eq!(c.format, EventFormat::Choria);
        assert_eq!(c.event, e);
        let ce = LifecycleEvent::parse(&e.to_cloudevent_json().unwrap()).unwrap();
        assert_eq!(ce.format, EventFormat::CloudEvent);
        assert_eq!(ce.event, e);
    }

    #[test]
    fn old_style_and_foreign_events_are_rejected() {
        let old = br#"{"protocol":"choria:lifecycle:startup:1","id":"x","identity":"n","component":"c","timestamp":1}"#;
        assert!(matches!(
            LifecycleEvent::parse(old),
            Err(LifecycleError::UnsupportedFormat)
        ));
        assert!(LifecycleEvent::parse(b"not json").is_err());
        let other_ce = br#"{"specversion":"1.0","source":"elsewhere","data":{}}"#;
        assert!(LifecycleEvent::parse(other_ce).is_err());
        // A lifecycle event missing a required field, bare or carried, is refused.
        let no_identity = br#"{"protocol":"io.choria.lifecycle.v1.startup","id":"x","component":"c","timestamp":1}"#;
        assert!(matches!(
            LifecycleEvent::parse(no_identity),
            Err(LifecycleError::Json(e)) if e.to_string().contains("identity")
        ));
        let carried = br#"{"specversion":"1.0","source":"io.choria.lifecycle","data":{"protocol":"io.choria.lifecycle.v1.startup","identity":"n","component":"c","timestamp":1}}"#;
        assert!(matches!(
            LifecycleEvent::parse(carried),
            Err(LifecycleError::Json(e)) if e.to_string().contains("`id`")
        ));
        // A CloudEvent whose data is not a lifecycle event, and a wrongly typed field.
        let not_lifecycle =
            br#"{"specversion":"1.0","source":"io.choria.lifecycle","data":{"protocol":"other"}}"#;
        assert!(matches!(
            LifecycleEvent::parse(not_lifecycle),
            Err(LifecycleError::UnsupportedFormat)
        ));
        let typed = br#"{"protocol":"io.choria.lifecycle.v1.startup","id":"x","identity":"n","component":"c","timestamp":"1"}"#;
        assert!(LifecycleEvent::parse(typed).is_err());
    }
}
