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

    /// The `data` of a successful reply read straight into `O`, without the
    /// [`serde_json::Value`] that [`RpcReply::parse`] builds: `None` unless the body parses, its
    /// status is OK and `O` reads from its `data` (absent or `null` data reads as `{}`). Where it
    /// answers, it answers what [`RpcReply::parse`] and reading `O` from the value would; a
    /// failed status, a repeated key inside `data` (which the value keeps the last of) and every
    /// error are left to that path, so they end exactly as they did.
    pub fn parse_ok_as<O: serde::de::DeserializeOwned>(body: &[u8]) -> Option<O> {
        /// The fields of [`RpcReply`] with their types checked, `data` left unread.
        #[derive(Deserialize)]
        struct Head<'a> {
            #[serde(rename = "action", default)]
            _action: String,
            #[serde(default = "default_status")]
            statuscode: StatusCode,
            #[serde(rename = "statusmsg", default)]
            _statusmsg: String,
            #[serde(default, borrow)]
            data: Option<&'a serde_json::value::RawValue>,
        }
        let head: Head<'_> = serde_json::from_slice(body).ok()?;
        if head.statuscode != StatusCode::Ok {
            return None;
        }
        serde_json::from_str(head.data.map_or("{}", |d| d.get())).ok()
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

    /// The typed fast path answers exactly what the value path answers, or leaves the reply to it.
    #[test]
    fn replies_read_as_a_type_agree_with_the_value_path() {
        #[derive(Debug, PartialEq, Deserialize)]
        struct Out {
            #[serde(default)]
            message: String,
            #[serde(default)]
            n: f64,
        }
        let value_path = |body: &[u8]| -> Option<Out> {
            let r = RpcReply::parse(body).ok()?;
            if r.statuscode != StatusCode::Ok {
                return None;
            }
            Out::deserialize(&r.data).ok()
        };
        let bodies: &[&[u8]] = &[
            br#"{"action":"restart","statuscode":0,"statusmsg":"OK","data":{"message":"ok \u00e9\n"}}"#,
            br#"{"statuscode":0,"data":{"message":"x","n":1,"other":[1,{"a":null}]}}"#,
            br#"{"statuscode":0,"data":{"n":-0.0}}"#,
            br#"{"statuscode":0,"data":{"n":1e400}}"#,
            br#"{"statuscode":0,"data":{"n":18446744073709551616}}"#,
            br#"{"statuscode":0,"data":null}"#,
            br#"{"statuscode":0}"#,
            br#"{}"#,
            br#"{"statuscode":0,"data":[]}"#,
            br#"{"statuscode":0,"data":"text"}"#,
            br#"{"statuscode":1,"statusmsg":"no","data":{"message":"x"}}"#,
            br#"{"statuscode":4,"data":{}}"#,
            br#"{"statuscode":9,"data":{}}"#,
            br#"{"statuscode":"0","data":{}}"#,
            br#"{"action":5,"statuscode":0,"data":{"message":"x"}}"#,
            br#"{"statusmsg":null,"statuscode":0,"data":{"message":"x"}}"#,
            br#"{"statuscode":0,"data":{"message":"first","message":"last"}}"#,
            br#"{"statuscode":0,"statuscode":0,"data":{}}"#,
            br#"{"statuscode":0,"data":{"message":5}}"#,
            br#"{"statuscode":0,"data":{"message":"x"}} trailing"#,
            br#"{"statuscode":0,"data":{"message":"\ud800"}}"#,
            b"{\"statuscode\":0,\"data\":{\"message\":\"\xff\"}}",
            br#"[]"#,
            b"",
        ];
        for body in bodies {
            let want = value_path(body);
            let got = RpcReply::parse_ok_as::<Out>(body);
            if got.is_some() {
                assert_eq!(got, want, "{}", String::from_utf8_lossy(body));
            }
        }
        // The path answers the common replies itself.
        assert_eq!(
            RpcReply::parse_ok_as::<Out>(bodies[0]).map(|o| o.message),
            Some("ok \u{e9}\n".to_string())
        );
        assert!(RpcReply::parse_ok_as::<Out>(bodies[5]).is_some());
        // A repeated key inside data is left to the value path, which keeps the last.
        assert!(RpcReply::parse_ok_as::<Out>(bodies[16]).is_none());
        assert_eq!(value_path(bodies[16]).unwrap().message, "last");
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
