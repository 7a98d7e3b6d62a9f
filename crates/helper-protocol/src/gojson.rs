//! JSON as Go's `encoding/json` writes and reads it.
//!
//! Writing: Go's string escaping, so documents match the Go provisioner's byte for byte: `<`,
//! `>` and `&` become `\u003c`, `\u003e` and `\u0026`, and U+2028 and U+2029 are escaped too.
//!
//! Reading (the helper's reply, decoded by the Go provisioner with `encoding/json`): a key
//! names a field whatever its case, compared with Unicode simple case folding (an exact match
//! first); the keys of an object are applied in order, so of two keys naming one field the later
//! counts; `null` leaves a boolean or a string as it was and clears a pointer, a map or a list;
//! an object given again for a struct or a map is merged into it; a `null` entry of a map or
//! list of strings is the empty string; unknown keys are ignored. [`canonical`] rewrites a
//! document into the one exact spelling the derived decoders expect, with those rules applied.

use std::collections::BTreeMap;
use std::fmt;
use std::io;

use serde::de::{self, Deserialize, MapAccess, SeqAccess, Visitor};
use serde::Serialize;
use serde_json::ser::Formatter;
use serde_json::{Map, Number, Value};

struct GoFormatter;

impl Formatter for GoFormatter {
    fn write_string_fragment<W: ?Sized + io::Write>(
        &mut self,
        writer: &mut W,
        fragment: &str,
    ) -> io::Result<()> {
        // Scanned as bytes: `<`, `>`, `&`, and 0xE2, the first byte of U+2028 and U+2029 (and
        // of other characters, which are written as they are).
        let bytes = fragment.as_bytes();
        let (mut start, mut from) = (0, 0);
        while let Some(off) = bytes[from..]
            .iter()
            .position(|b| matches!(b, b'<' | b'>' | b'&' | 0xE2))
        {
            let at = from + off;
            let (esc, len) = match bytes[at] {
                b'<' => ("\\u003c", 1),
                b'>' => ("\\u003e", 1),
                b'&' => ("\\u0026", 1),
                _ => match bytes.get(at + 1..at + 3) {
                    Some([0x80, 0xA8]) => ("\\u2028", 3),
                    Some([0x80, 0xA9]) => ("\\u2029", 3),
                    _ => {
                        from = at + 1;
                        continue;
                    }
                },
            };
            writer.write_all(&bytes[start..at])?;
            writer.write_all(esc.as_bytes())?;
            start = at + len;
            from = start;
        }
        writer.write_all(&bytes[start..])
    }
}

/// Encodes `value` as compact JSON escaped the way Go's `json.Marshal` escapes it.
pub fn to_go_json<T: Serialize + ?Sized>(value: &T) -> serde_json::Result<Vec<u8>> {
    let mut out = Vec::with_capacity(512);
    let mut ser = serde_json::Serializer::with_formatter(&mut out, GoFormatter);
    value.serialize(&mut ser)?;
    Ok(out)
}

/// [`to_go_json`] as a `String`.
pub fn to_go_json_string<T: Serialize + ?Sized>(value: &T) -> serde_json::Result<String> {
    // The encoder only writes UTF-8.
    to_go_json(value).map(|v| String::from_utf8_lossy(&v).into_owned())
}

/// A JSON document with every key of every object kept, duplicates included, in order.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Tree {
    Null,
    Bool(bool),
    Number(Number),
    String(String),
    Array(Vec<Tree>),
    Object(Vec<(String, Tree)>),
}

impl<'de> Deserialize<'de> for Tree {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Tree, D::Error> {
        d.deserialize_any(TreeVisitor)
    }
}

struct TreeVisitor;

impl<'de> Visitor<'de> for TreeVisitor {
    type Value = Tree;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_unit<E: de::Error>(self) -> Result<Tree, E> {
        Ok(Tree::Null)
    }

    fn visit_none<E: de::Error>(self) -> Result<Tree, E> {
        Ok(Tree::Null)
    }

    fn visit_some<D: de::Deserializer<'de>>(self, d: D) -> Result<Tree, D::Error> {
        d.deserialize_any(self)
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Tree, E> {
        Ok(Tree::Bool(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Tree, E> {
        Ok(Tree::Number(v.into()))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Tree, E> {
        Ok(Tree::Number(v.into()))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Tree, E> {
        Number::from_f64(v)
            .map(Tree::Number)
            .ok_or_else(|| E::invalid_value(de::Unexpected::Float(v), &self))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Tree, E> {
        Ok(Tree::String(v.to_string()))
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<Tree, E> {
        Ok(Tree::String(v))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Tree, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(Tree::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Tree, A::Error> {
        let mut entries = Vec::new();
        while let Some((k, v)) = map.next_entry::<String, Tree>()? {
            entries.push((k, v));
        }
        Ok(Tree::Object(entries))
    }
}

/// The Go type of a field, as far as decoding it goes.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Kind {
    /// `bool`.
    Bool,
    /// `string`.
    Str,
    /// `[]string`.
    StrList,
    /// `map[string]string`.
    StrMap,
    /// A pointer to a struct with these fields (embedded structs' fields included).
    Struct(&'static [Field]),
    /// golang-jwt's `*NumericDate`: a number, or a string holding one.
    Date,
    /// golang-jwt's `ClaimStrings`: a string or a list of strings; `null` leaves it alone.
    Audience,
}

/// A field of a Go struct: its `json` tag and its type.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Field {
    pub(crate) name: &'static str,
    pub(crate) kind: Kind,
}

/// What a field holds after some of the document has been applied.
enum Slot {
    Set(Value),
    Struct(Builder),
    Map(Map<String, Value>),
}

#[derive(Default)]
struct Builder(BTreeMap<&'static str, Slot>);

/// The kind of JSON value `t` is, for messages (never the value: a reply holds keys).
fn found(t: &Tree) -> &'static str {
    match t {
        Tree::Null => "null",
        Tree::Bool(_) => "a boolean",
        Tree::Number(_) => "a number",
        Tree::String(_) => "a string",
        Tree::Array(_) => "an array",
        Tree::Object(_) => "an object",
    }
}

fn wrong(path: &str, expected: &str, t: &Tree) -> String {
    format!("{path}: expected {expected}, found {}", found(t))
}

impl Builder {
    /// Applies an object's entries in order. A value of the wrong type is an error even when a
    /// later key gives a good one, as Go reports it.
    fn apply(
        &mut self,
        schema: &'static [Field],
        prefix: &str,
        entries: Vec<(String, Tree)>,
    ) -> Result<(), String> {
        for (key, tree) in entries {
            if let Some(field) = field_for(schema, &key) {
                self.apply_field(field, prefix, tree)?;
            }
        }
        Ok(())
    }

    fn apply_field(
        &mut self,
        field: &'static Field,
        prefix: &str,
        tree: Tree,
    ) -> Result<(), String> {
        let path = format!("{prefix}{}", field.name);
        let slot = self.0.remove(field.name);
        let next = match (field.kind, tree) {
            // null keeps a boolean, a string and a ClaimStrings as they were.
            (Kind::Bool | Kind::Str | Kind::Audience, Tree::Null) => slot,
            // ... and clears pointers, maps and slices.
            (_, Tree::Null) => Some(Slot::Set(Value::Null)),
            (Kind::Bool, Tree::Bool(b)) => Some(Slot::Set(Value::Bool(b))),
            (Kind::Bool, t) => return Err(wrong(&path, "a boolean", &t)),
            (Kind::Str, Tree::String(s)) => Some(Slot::Set(Value::String(s))),
            (Kind::Str, t) => return Err(wrong(&path, "a string", &t)),
            (Kind::StrList, Tree::Array(items)) => {
                let mut values = Vec::with_capacity(items.len());
                for (i, t) in items.into_iter().enumerate() {
                    values.push(match t {
                        Tree::String(s) => Value::String(s),
                        Tree::Null => Value::String(String::new()),
                        t => return Err(wrong(&format!("{path}[{i}]"), "a string", &t)),
                    });
                }
                Some(Slot::Set(Value::Array(values)))
            }
            (Kind::StrList, t) => return Err(wrong(&path, "an array of strings", &t)),
            (Kind::StrMap, Tree::Object(entries)) => {
                let mut map = match slot {
                    Some(Slot::Map(m)) => m,
                    _ => Map::new(),
                };
                for (k, v) in entries {
                    let v = match v {
                        Tree::String(s) => s,
                        Tree::Null => String::new(),
                        t => return Err(wrong(&format!("{path}.{k}"), "a string", &t)),
                    };
                    map.insert(k, Value::String(v));
                }
                Some(Slot::Map(map))
            }
            (Kind::StrMap, t) => return Err(wrong(&path, "an object of strings", &t)),
            (Kind::Struct(schema), Tree::Object(entries)) => {
                let mut b = match slot {
                    Some(Slot::Struct(b)) => b,
                    _ => Builder::default(),
                };
                b.apply(schema, &format!("{path}."), entries)?;
                Some(Slot::Struct(b))
            }
            (Kind::Struct(_), t) => return Err(wrong(&path, "an object", &t)),
            (Kind::Date, Tree::Number(n)) => Some(Slot::Set(Value::Number(n))),
            (Kind::Date, Tree::String(s)) => match serde_json::from_str::<Number>(&s) {
                Ok(n) => Some(Slot::Set(Value::Number(n))),
                Err(_) => {
                    return Err(format!(
                        "{path}: expected a number of seconds, found a string holding none"
                    ))
                }
            },
            (Kind::Date, t) => return Err(wrong(&path, "a number of seconds", &t)),
            (Kind::Audience, Tree::String(s)) => Some(Slot::Set(Value::String(s))),
            (Kind::Audience, Tree::Array(items)) => {
                let mut values = Vec::with_capacity(items.len());
                for (i, t) in items.into_iter().enumerate() {
                    match t {
                        Tree::String(s) => values.push(Value::String(s)),
                        t => return Err(wrong(&format!("{path}[{i}]"), "a string", &t)),
                    }
                }
                Some(Slot::Set(Value::Array(values)))
            }
            (Kind::Audience, t) => return Err(wrong(&path, "a string or an array of strings", &t)),
        };
        if let Some(next) = next {
            self.0.insert(field.name, next);
        }
        Ok(())
    }

    fn into_value(self) -> Value {
        Value::Object(
            self.0
                .into_iter()
                .map(|(name, slot)| {
                    let v = match slot {
                        Slot::Set(v) => v,
                        Slot::Struct(b) => b.into_value(),
                        Slot::Map(m) => Value::Object(m),
                    };
                    (name.to_string(), v)
                })
                .collect(),
        )
    }
}

/// The field `key` names: the one whose tag equals it, else the first one it folds to.
fn field_for(schema: &'static [Field], key: &str) -> Option<&'static Field> {
    schema
        .iter()
        .find(|f| f.name == key)
        .or_else(|| schema.iter().find(|f| folds_to(key, f.name)))
}

/// Whether `key` equals `name` under Unicode simple case folding, as `encoding/json` compares
/// a key with a field's tag. Tags are ASCII; the only non-ASCII characters folding to an ASCII
/// letter are U+017F (long s) and U+212A (Kelvin sign).
pub(crate) fn folds_to(key: &str, name: &str) -> bool {
    fn fold(c: char) -> char {
        match c {
            '\u{17f}' => 's',
            '\u{212a}' => 'k',
            c => c.to_ascii_lowercase(),
        }
    }
    key.chars().map(fold).eq(name.chars().map(fold))
}

/// `tree` decoded against the Go struct `schema` as `encoding/json` would, written back with
/// each field under its exact tag, once. Refused, with the field and the kinds of value
/// expected and found (never the value itself): a document that is not an object (Go refuses
/// every one but `null`, which it reads as an empty reply), and the first value of a wrong type.
pub(crate) fn canonical(tree: Tree, schema: &'static [Field]) -> Result<Value, String> {
    match tree {
        Tree::Object(entries) => {
            let mut b = Builder::default();
            b.apply(schema, "", entries)?;
            Ok(b.into_value())
        }
        t => Err(format!("expected a JSON object, found {}", found(&t))),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn keys_fold_as_encoding_json_compares_them() {
        assert!(folds_to("Defer", "defer"));
        assert!(folds_to("MSG", "msg"));
        assert!(folds_to("\u{17f}sldir", "ssldir"));
        assert!(folds_to("\u{212a}ey", "key"));
        assert!(!folds_to("msgs", "msg"));
        assert!(!folds_to("m\u{131}g", "mig"));
    }

    #[test]
    fn a_tree_keeps_every_key_in_order() {
        let t: Tree = serde_json::from_str(r#"{"a":1,"A":[true,null],"a":"x"}"#).unwrap();
        assert_eq!(
            t,
            Tree::Object(vec![
                ("a".into(), Tree::Number(1.into())),
                ("A".into(), Tree::Array(vec![Tree::Bool(true), Tree::Null])),
                ("a".into(), Tree::String("x".into())),
            ])
        );
    }

    #[test]
    fn go_escapes_only_its_five_characters_among_their_neighbours() {
        // The characters Go escapes, beside others that share their first UTF-8 byte (0xE2),
        // at the ends of strings and next to each other.
        let alphabet = [
            "<", ">", "&", "\u{2028}", "\u{2029}", "\u{2027}", "\u{202a}", "€", "\u{2000}", "a",
            "é", "😀", "\"", "\\", "\n",
        ];
        let escaped = |c: &str| match c {
            "<" => "\\u003c".to_string(),
            ">" => "\\u003e".to_string(),
            "&" => "\\u0026".to_string(),
            "\u{2028}" => "\\u2028".to_string(),
            "\u{2029}" => "\\u2029".to_string(),
            other => {
                let json = serde_json::to_string(other).unwrap();
                json[1..json.len() - 1].to_string()
            }
        };
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        for len in 0..400 {
            let picks: Vec<&str> = (0..len % 13)
                .map(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    alphabet[(seed % alphabet.len() as u64) as usize]
                })
                .collect();
            let text: String = picks.concat();
            let want: String = picks.iter().map(|c| escaped(c)).collect();
            assert_eq!(
                to_go_json_string(&text).unwrap(),
                format!("\"{want}\""),
                "{text:?}"
            );
        }
    }

    #[test]
    fn html_characters_and_line_separators_are_escaped_like_go() {
        let v = serde_json::json!({"a<b": "x & y > z\u{2028}\"q\"\n"});
        assert_eq!(
            to_go_json_string(&v).unwrap(),
            r#"{"a\u003cb":"x \u0026 y \u003e z\u2028\"q\"\n"}"#
        );
    }
}
