//! JSON encoding with Go's `encoding/json` string escaping, so documents match the Go
//! provisioner's byte for byte: `<`, `>` and `&` become `\u003c`, `\u003e` and `\u0026`, and
//! U+2028 and U+2029 are escaped too.

use std::io;

use serde::Serialize;
use serde_json::ser::Formatter;

struct GoFormatter;

impl Formatter for GoFormatter {
    fn write_string_fragment<W: ?Sized + io::Write>(
        &mut self,
        writer: &mut W,
        fragment: &str,
    ) -> io::Result<()> {
        let mut start = 0;
        for (i, c) in fragment.char_indices() {
            let esc = match c {
                '<' => "\\u003c",
                '>' => "\\u003e",
                '&' => "\\u0026",
                '\u{2028}' => "\\u2028",
                '\u{2029}' => "\\u2029",
                _ => continue,
            };
            writer.write_all(&fragment.as_bytes()[start..i])?;
            writer.write_all(esc.as_bytes())?;
            start = i + c.len_utf8();
        }
        writer.write_all(&fragment.as_bytes()[start..])
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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn html_characters_and_line_separators_are_escaped_like_go() {
        let v = serde_json::json!({"a<b": "x & y > z\u{2028}\"q\"\n"});
        assert_eq!(
            to_go_json_string(&v).unwrap(),
            r#"{"a\u003cb":"x \u0026 y \u003e z\u2028\"q\"\n"}"#
        );
    }
}
