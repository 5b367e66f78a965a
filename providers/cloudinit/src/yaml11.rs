//! YAML that reads the same in YAML 1.1 and 1.2: what cloud-init's parser (PyYAML, YAML 1.1)
//! must not retype.
//!
//! A YAML 1.2 emitter (serde_yaml) leaves `yes`, `on`, `n`, `2024-01-01`, `1_000` and
//! `52:54:00:12:34:56` unquoted; YAML 1.1 reads them as a boolean, a date, an integer and a
//! base-60 integer. So a machine named `on` got the hostname `True`, and a libvirt MAC
//! (`52:54:00:…`) an integer in `match.macaddress`. Here a string is written plain only when it
//! starts with a letter, holds only letters, digits, `-`, `_` and `.`, and is not one of YAML
//! 1.1's boolean or null words; every other string is double-quoted, with every character a
//! YAML 1.1 reader would reject or fold escaped. Checked against the real cloud-init's YAML loader
//! with random strings (`tests/yaml11_real.rs`).

use serde::Serialize;
use serde_json::Value;

/// YAML 1.1's boolean and null words (any case): `y|Y|yes|Yes|YES|n|…|on|off|true|false|null`.
const RETYPED_WORDS: [&str; 10] = ["y", "n", "yes", "no", "on", "off", "true", "false", "null", "~"];

fn plain_is_safe(s: &str) -> bool {
    let mut chars = s.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && !RETYPED_WORDS.contains(&s.to_ascii_lowercase().as_str())
}

fn scalar(s: &str) -> String {
    if plain_is_safe(s) {
        s.to_owned()
    } else {
        double_quoted(s)
    }
}

/// `s` as a YAML double-quoted scalar. Besides `"` and `\`, escaped: what YAML 1.1 readers reject
/// in a stream (C0 and C1 controls, DEL, U+FFFE, U+FFFF) and what they fold as a line break
/// inside quotes (LF, CR, NEL, U+2028, U+2029), and a byte-order mark.
fn double_quoted(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            '\u{0}'..='\u{1f}'
            | '\u{7f}'..='\u{9f}'
            | '\u{2028}'
            | '\u{2029}'
            | '\u{feff}'
            | '\u{fffe}'
            | '\u{ffff}' => {
                out.push_str(&format!("\\u{:04x}", u32::from(c)));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn is_block(value: &Value) -> bool {
    match value {
        Value::Object(m) => !m.is_empty(),
        Value::Array(a) => !a.is_empty(),
        _ => false,
    }
}

fn inline(value: &Value) -> String {
    match value {
        Value::String(s) => scalar(s),
        Value::Object(_) => "{}".to_owned(),
        Value::Array(_) => "[]".to_owned(),
        other => other.to_string(),
    }
}

/// Writes `value` as block YAML; `indent` is the column of its keys or dashes. A map that is a
/// list item starts on the item's line (after its `- `).
fn write(out: &mut String, value: &Value, indent: usize) {
    match value {
        Value::Object(map) => {
            for (i, (key, item)) in map.iter().enumerate() {
                if i > 0 || !out.ends_with("- ") {
                    out.push_str(&" ".repeat(indent));
                }
                out.push_str(&scalar(key));
                out.push(':');
                if is_block(item) {
                    out.push('\n');
                    write(out, item, indent + 2);
                } else {
                    out.push(' ');
                    out.push_str(&inline(item));
                    out.push('\n');
                }
            }
        }
        Value::Array(items) => {
            for item in items {
                out.push_str(&" ".repeat(indent));
                match item {
                    Value::Object(_) if is_block(item) => {
                        out.push_str("- ");
                        write(out, item, indent + 2);
                    }
                    Value::Array(_) if is_block(item) => {
                        out.push_str("-\n");
                        write(out, item, indent + 2);
                    }
                    other => {
                        out.push_str("- ");
                        out.push_str(&inline(other));
                        out.push('\n');
                    }
                }
            }
        }
        other => {
            out.push_str(&inline(other));
            out.push('\n');
        }
    }
}

/// `value` as block YAML that YAML 1.1 and 1.2 parsers read alike (see the module docs).
pub fn to_string<T: Serialize>(value: &T) -> Result<String, serde_json::Error> {
    let value = serde_json::to_value(value)?;
    let mut out = String::new();
    write(&mut out, &value, 0);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde_json::json;

    use super::*;

    #[test]
    fn words_yaml_1_1_would_retype_are_quoted_and_plain_words_are_not() {
        for retyped in [
            "yes",
            "No",
            "ON",
            "off",
            "y",
            "n",
            "true",
            "null",
            "~",
            "2024-01-01",
            "0123",
            "1e3",
            "1_000",
            "52:54:00:12:34:56",
            "12:30",
            "bc:24:11:00:00:01",
            "+1",
            ".inf",
            "",
            " worker",
            "a b",
            "#x",
            "a: b",
        ] {
            assert_eq!(
                to_string(&BTreeMap::from([("k", retyped)])).unwrap(),
                format!("k: {}\n", double_quoted(retyped)),
                "{retyped:?}"
            );
        }
        for plain in ["worker-0", "eth0", "net0", "uid.1", "yesterday", "Node_1"] {
            assert_eq!(
                to_string(&BTreeMap::from([("k", plain)])).unwrap(),
                format!("k: {plain}\n")
            );
        }
    }

    #[test]
    fn nested_maps_lists_and_scalars_are_block_yaml() {
        let value = json!({
            "version": 2,
            "ethernets": {"on": {"dhcp4": true, "addresses": ["10.0.0.5/24"], "routes": [{"to": "default", "via": "10.0.0.1"}], "mtu": 1450}},
            "empty": [],
            "none": {},
            "nested": [[1, 2], "x"],
        });
        let yaml = to_string(&value).unwrap();
        assert_eq!(
            yaml,
            "empty: []\n\
             ethernets:\n  \"on\":\n    addresses:\n      - \"10.0.0.5/24\"\n    dhcp4: true\n    mtu: 1450\n    routes:\n      - to: default\n        via: \"10.0.0.1\"\n\
             nested:\n  -\n    - 1\n    - 2\n  - x\n\
             none: {}\n\
             version: 2\n"
        );
        let back: Value = serde_yaml::from_str(&yaml).unwrap();
        assert_eq!(back, value);
    }
}
