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
/// mismatch is an error worded like Go's.
pub(super) struct GoData {
    values: Vec<Option<Value>>,
}

impl GoData {
    pub(super) fn parse(
        data: &Value,
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
                Ok(()) => values[idx] = Some(v.clone()),
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
    pub(super) fn args(
        env: &NodeEnv<'_>,
        action: &str,
        data: &Value,
        go_struct: &str,
        fields: &[(&str, GoKind)],
    ) -> Result<GoData, Vec<u8>> {
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
