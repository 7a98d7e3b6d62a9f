//! The MCollective RPC layer carried inside Choria requests: request bodies
//! (`{agent, action, data}`) and reply bodies (`{action, statuscode, statusmsg, data}`).

use serde::{Deserialize, Serialize};

/// An RPC reply status code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(into = "u8", try_from = "i64")]
pub enum StatusCode {
    /// 0: the action succeeded.
    Ok,
    /// 1: the action aborted (also authorization denials and most provisioning failures).
    Aborted,
    /// 2: the agent has no such action.
    UnknownAction,
    /// 3: required input is missing.
    MissingData,
    /// 4: the input could not be parsed or validated.
    InvalidData,
    /// 5: any other failure.
    UnknownError,
}

impl StatusCode {
    /// The numeric wire value.
    pub fn code(self) -> u8 {
        match self {
            StatusCode::Ok => 0,
            StatusCode::Aborted => 1,
            StatusCode::UnknownAction => 2,
            StatusCode::MissingData => 3,
            StatusCode::InvalidData => 4,
            StatusCode::UnknownError => 5,
        }
    }

    /// The status code for a wire value, if it is one.
    pub fn from_code(code: i64) -> Option<Self> {
        Some(match code {
            0 => StatusCode::Ok,
            1 => StatusCode::Aborted,
            2 => StatusCode::UnknownAction,
            3 => StatusCode::MissingData,
            4 => StatusCode::InvalidData,
            5 => StatusCode::UnknownError,
            _ => return None,
        })
    }
}

impl From<StatusCode> for u8 {
    fn from(c: StatusCode) -> u8 {
        c.code()
    }
}

impl TryFrom<i64> for StatusCode {
    type Error = String;
    fn try_from(v: i64) -> Result<Self, String> {
        StatusCode::from_code(v).ok_or_else(|| format!("unknown statuscode {v}"))
    }
}

/// An RPC request body as a client sends it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RpcRequest {
    /// Agent name.
    pub agent: String,
    /// Action name.
    pub action: String,
    /// Action inputs (an object; `{}` when absent).
    #[serde(default = "empty_object")]
    pub data: serde_json::Value,
}

fn empty_object() -> serde_json::Value {
    serde_json::Value::Object(serde_json::Map::new())
}

fn ok_msg() -> String {
    "OK".to_string()
}

#[derive(Serialize)]
struct RpcRequestRef<'a, T: Serialize> {
    agent: &'a str,
    action: &'a str,
    data: &'a T,
}

/// Encode a request body without building an intermediate JSON value.
pub fn encode_request<T: Serialize>(
    agent: &str,
    action: &str,
    data: &T,
) -> Result<Vec<u8>, serde_json::Error> {
    let r = RpcRequestRef {
        agent,
        action,
        data,
    };
    // The wire's fast writer (sonic-rs: the same bytes as serde_json, escaped a block at a
    // time); what it cannot write (a map with non-string keys), serde_json words.
    sonic_rs::to_vec(&r).or_else(|_| serde_json::to_vec(&r))
}

impl RpcRequest {
    /// Parse a request body (server side). A missing `data` becomes `{}`.
    pub fn parse(body: &[u8]) -> Result<Self, serde_json::Error> {
        let mut r: RpcRequest = serde_json::from_slice(body)?;
        if r.data.is_null() {
            r.data = empty_object();
        }
        Ok(r)
    }
}

/// An RPC reply body.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RpcReply {
    /// The action that replied.
    #[serde(default)]
    pub action: String,
    /// Outcome.
    #[serde(default = "default_status")]
    pub statuscode: StatusCode,
    /// Human readable outcome (`OK` on success).
    #[serde(default = "ok_msg")]
    pub statusmsg: String,
    /// Action outputs (an object; `{}` when absent).
    #[serde(default = "empty_object")]
    pub data: serde_json::Value,
}

fn default_status() -> StatusCode {
    StatusCode::Ok
}

impl RpcReply {
    /// A successful reply with `data`.
    pub fn ok(action: impl Into<String>, data: serde_json::Value) -> Self {
        RpcReply {
            action: action.into(),
            statuscode: StatusCode::Ok,
            statusmsg: ok_msg(),
            data,
        }
    }

    /// A failed reply with `{}` data.
    pub fn error(action: impl Into<String>, code: StatusCode, msg: impl Into<String>) -> Self {
        RpcReply {
            action: action.into(),
            statuscode: code,
            statusmsg: msg.into(),
            data: empty_object(),
        }
    }

    /// Parse a reply body (client side).
    pub fn parse(body: &[u8]) -> Result<Self, serde_json::Error> {
        let mut r: RpcReply = serde_json::from_slice(body)?;
        if r.data.is_null() {
            r.data = empty_object();
        }
        Ok(r)
    }

    /// Encode the reply body (server side).
    pub fn to_vec(&self) -> Result<Vec<u8>, serde_json::Error> {
        serde_json::to_vec(self)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn request_bodies_are_the_bytes_serde_json_writes() {
        let values = [
            serde_json::json!({}),
            serde_json::json!({
                "config": r#"{"plugin.choria.x":"C:\\p \"q\" <a>&b","n":null}"#,
                "token": "s3cret\u{0}\u{1f}\u{7f}\u{2028}é😀",
                "numbers": [0, -1, u64::MAX, i64::MIN, 0.1, -0.0, 1e21, 1.5e-300, 5e-324, 1e15],
                "nested": {"a": [true, false, null, {"b": []}]},
            }),
        ];
        for data in &values {
            let fast = encode_request("choria_provision", "configure", data).unwrap();
            let reference = serde_json::to_vec(&RpcRequestRef {
                agent: "choria_provision",
                action: "configure",
                data,
            })
            .unwrap();
            assert_eq!(
                String::from_utf8(fast).unwrap(),
                String::from_utf8(reference).unwrap()
            );
        }
        // Keys serde_json writes as strings, and keys it refuses in its own words.
        let numbered: std::collections::BTreeMap<u32, &str> = [(7, "x")].into();
        assert_eq!(
            encode_request("a", "b", &numbered).unwrap(),
            br#"{"agent":"a","action":"b","data":{"7":"x"}}"#
        );
        let tupled: std::collections::BTreeMap<(u8, u8), u8> = [((1, 2), 3)].into();
        let e = encode_request("a", "b", &tupled).unwrap_err().to_string();
        assert!(e.contains("key must be a string"), "{e}");
    }

    #[test]
    fn reply_defaults_apply_when_keys_are_missing() {
        let r = RpcReply::parse(br#"{"action":"jwt"}"#).unwrap();
        assert_eq!(r.statuscode, StatusCode::Ok);
        assert_eq!(r.statusmsg, "OK");
        assert_eq!(r.data, serde_json::json!({}));
    }

    #[test]
    fn status_codes_round_trip_as_numbers() {
        for code in 0..=5 {
            let body =
                format!(r#"{{"action":"a","statuscode":{code},"statusmsg":"m","data":{{}}}}"#);
            let r = RpcReply::parse(body.as_bytes()).unwrap();
            assert_eq!(i64::from(r.statuscode.code()), code);
            let again: serde_json::Value = serde_json::from_slice(&r.to_vec().unwrap()).unwrap();
            assert_eq!(again["statuscode"], code);
        }
        assert!(RpcReply::parse(br#"{"statuscode":9}"#).is_err());
    }

    #[test]
    fn request_body_is_agent_action_data_in_order() {
        let b = encode_request("rpcutil", "inventory", &serde_json::json!({})).unwrap();
        assert_eq!(b, br#"{"agent":"rpcutil","action":"inventory","data":{}}"#);
        let r = RpcRequest::parse(br#"{"agent":"a","action":"b"}"#).unwrap();
        assert_eq!(r.data, serde_json::json!({}));
    }
}
