//! What a request carries: `choria_provision` request data decoded the way go-choria's Go
//! structs decode it (field matching, zero values and Go-worded type errors), with the token
//! check every action starts with.

use std::collections::BTreeMap;

use choria_rpc_client::mcorpc::StatusCode;
use serde_json::{json, Value};

use super::{abort, reply_json, Node, NodeEnv};

/// Go's name for a JSON value's type, as its unmarshal errors word it.
pub(super) fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Go field kinds the provisioning request structs use.
#[derive(Clone, Copy)]
pub(super) enum GoKind {
    Str,
    Int,
    StrMap,
}

/// Request data decoded the way Go's `encoding/json` fills a struct: keys matched exactly,
/// else case-insensitively; unknown keys ignored; `null` leaves the zero value; a type
/// mismatch is an error worded like Go's. The values are borrowed from the request's data,
/// which outlives the action.
pub(super) struct GoData<'a> {
    values: Vec<Option<&'a Value>>,
}

impl<'a> GoData<'a> {
    pub(super) fn parse(
        data: &'a Value,
        go_struct: &str,
        fields: &[(&str, GoKind)],
    ) -> Result<Self, String> {
        let mut values = vec![None; fields.len()];
        let obj = match data {
            Value::Object(m) => m,
            Value::Null => return Ok(GoData { values }),
            other => {
                return Err(format!(
                    "json: cannot unmarshal {} into Go value of type provision.{go_struct}",
                    json_type(other)
                ))
            }
        };
        let mut first_err = None;
        for (key, v) in obj {
            let idx = fields
                .iter()
                .position(|(f, _)| *f == key)
                .or_else(|| fields.iter().position(|(f, _)| f.eq_ignore_ascii_case(key)));
            let Some(idx) = idx else { continue };
            let (name, kind) = fields[idx];
            if v.is_null() {
                continue;
            }
            let err = |t: &str, go: &str| {
                format!("json: cannot unmarshal {t} into Go struct field {go_struct}.{name} of type {go}")
            };
            let valid = match kind {
                GoKind::Str => v
                    .is_string()
                    .then_some(())
                    .ok_or_else(|| err(json_type(v), "string")),
                GoKind::Int => match v {
                    Value::Number(n) if n.is_i64() => Ok(()),
                    Value::Number(n) => Err(err(&format!("number {n}"), "int")),
                    other => Err(err(json_type(other), "int")),
                },
                GoKind::StrMap => match v {
                    Value::Object(m) => m
                        .values()
                        .find(|x| !x.is_string() && !x.is_null())
                        .map_or(Ok(()), |x| Err(err(json_type(x), "string"))),
                    other => Err(err(json_type(other), "map[string]string")),
                },
            };
            match valid {
                Ok(()) => values[idx] = Some(v),
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(GoData { values }),
        }
    }

    pub(super) fn str(&self, i: usize) -> &str {
        self.values
            .get(i)
            .and_then(|v| v.as_ref())
            .and_then(|v| v.as_str())
            .unwrap_or("")
    }

    pub(super) fn int(&self, i: usize) -> i64 {
        self.values
            .get(i)
            .and_then(|v| v.as_ref())
            .and_then(|v| v.as_i64())
            .unwrap_or(0)
    }

    pub(super) fn map(&self, i: usize) -> BTreeMap<String, String> {
        self.values
            .get(i)
            .and_then(|v| v.as_ref())
            .and_then(|v| v.as_object())
            .map(|m| {
                m.iter()
                    .map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_string()))
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// Go's boolean parsing for configuration values.
pub(super) fn config_bool(v: &str) -> bool {
    matches!(
        v.trim().to_ascii_lowercase().as_str(),
        "1" | "yes" | "true" | "y" | "t"
    )
}

impl Node {
    /// Parse `data` and check the token; `Err` carries the failure reply.
    pub(super) fn args<'a>(
        env: &NodeEnv<'_>,
        action: &str,
        data: &'a Value,
        go_struct: &str,
        fields: &[(&str, GoKind)],
    ) -> Result<GoData<'a>, Vec<u8>> {
        let args = GoData::parse(data, go_struct, fields).map_err(|e| {
            reply_json(
                action,
                StatusCode::InvalidData,
                &format!("Could not parse request data for choria_provision#{action}: {e}"),
                json!({}),
            )
        })?;
        // Token is always field 0.
        if args.str(0) != env.token {
            return Err(abort(action, "Incorrect provision token supplied"));
        }
        Ok(args)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const FIELDS: &[(&str, GoKind)] = &[
        ("token", GoKind::Str),
        ("config", GoKind::Str),
        ("splay", GoKind::Int),
        ("action_policies", GoKind::StrMap),
    ];

    fn parse(text: &str) -> Result<(String, String, i64, BTreeMap<String, String>), String> {
        let data = match text {
            "absent" => Value::Null,
            _ => serde_json::from_str(text).unwrap(),
        };
        let d = GoData::parse(&data, "Req", FIELDS)?;
        Ok((d.str(0).into(), d.str(1).into(), d.int(2), d.map(3)))
    }

    #[test]
    fn request_data_is_read_as_go_fills_its_struct() {
        let (token, config, splay, policies) =
            parse(r#"{"token":"t","Config":"a\"b","splay":7,"x":[1],"action_policies":{"p.policy":"body","q.policy":null}}"#).unwrap();
        assert_eq!((token.as_str(), config.as_str(), splay), ("t", "a\"b", 7));
        assert_eq!(policies.get("p.policy").map(String::as_str), Some("body"));
        assert_eq!(policies.get("q.policy").map(String::as_str), Some(""));
        // A key matches its field in any case; null changes nothing.
        let (_, config, ..) = parse(r#"{"CONFIG":"y","config":null}"#).unwrap();
        assert_eq!(config, "y");
        // Absent or null data is every field's zero value.
        for empty in ["absent", "null", "{}"] {
            assert_eq!(
                parse(empty).unwrap(),
                (String::new(), String::new(), 0, BTreeMap::new())
            );
        }
    }

    #[test]
    fn request_data_of_the_wrong_type_is_refused_in_go_s_words() {
        let cases = [
            (r#""x""#, "json: cannot unmarshal string into Go value of type provision.Req"),
            ("[1]", "json: cannot unmarshal array into Go value of type provision.Req"),
            (r#"{"token":5}"#, "json: cannot unmarshal number into Go struct field Req.token of type string"),
            (r#"{"token":{}}"#, "json: cannot unmarshal object into Go struct field Req.token of type string"),
            (r#"{"splay":1.5}"#, "json: cannot unmarshal number 1.5 into Go struct field Req.splay of type int"),
            (r#"{"splay":"1"}"#, "json: cannot unmarshal string into Go struct field Req.splay of type int"),
            (r#"{"splay":true}"#, "json: cannot unmarshal bool into Go struct field Req.splay of type int"),
            (r#"{"action_policies":{"a":"b","c":[2]}}"#, "json: cannot unmarshal array into Go struct field Req.action_policies of type string"),
            (r#"{"action_policies":"a"}"#, "json: cannot unmarshal string into Go struct field Req.action_policies of type map[string]string"),
        ];
        for (text, want) in cases {
            assert_eq!(parse(text).unwrap_err(), want, "{text}");
        }
    }
}
