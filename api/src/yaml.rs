//! YAML that means the same to Go's YAML 1.1 readers as to ours.
//!
//! `serde_yaml` writes YAML 1.2, where `On`, `Off`, `yes`, `no`, `y`, `n` are plain strings and
//! need no quotes. `kubectl`, `clusterctl` and every tool built on `sigs.k8s.io/yaml` read YAML
//! 1.1, where those words are booleans: an unquoted `- On` in a CRD's `enum` arrives at the
//! apiserver as `true`, and the CRD then rejects `powerState: On`. [`to_string`] quotes them.

use serde::Serialize;

/// The plain scalars YAML 1.1 reads as booleans and YAML 1.2 as strings. (`true`/`false` are
/// booleans in both: `serde_yaml` quotes such strings itself, and a plain `true` it writes is a
/// real boolean.)
const YAML11_BOOLEANS: [&str; 16] = [
    "y", "Y", "yes", "Yes", "YES", "n", "N", "no", "No", "NO", "on", "On", "ON", "off", "Off", "OFF",
];

/// Serializes `value` to YAML (one document, no leading `---`) in which no string reads as a
/// boolean to a YAML 1.1 parser.
pub fn to_string<T: Serialize + ?Sized>(value: &T) -> Result<String, serde_yaml::Error> {
    serde_yaml::to_string(value).map(|text| quote_yaml11_booleans(&text))
}

/// Quotes the plain scalars of a block-style YAML text (as `serde_yaml` writes it) that YAML 1.1
/// reads as booleans: mapping keys, mapping values and sequence items. Lines inside block
/// scalars (`|`, `>`) are content and stay as they are.
pub fn quote_yaml11_booleans(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    // Column of the key (or `-`) that opened a block scalar; deeper lines belong to it.
    let mut block_scalar_parent: Option<usize> = None;
    for line in text.split_inclusive('\n') {
        let body = line.trim_end_matches('\n');
        let indent = body.len() - body.trim_start().len();
        if let Some(parent) = block_scalar_parent {
            if body.trim().is_empty() || indent > parent {
                out.push_str(line);
                continue;
            }
            block_scalar_parent = None;
        }
        // Skip the `- ` markers, remembering the column of the last one.
        let mut column = indent;
        let mut last_dash = None;
        while body[column..].starts_with("- ") {
            last_dash = Some(column);
            column += 2;
            column += body[column..].len() - body[column..].trim_start().len();
        }
        let rest = &body[column..];
        out.push_str(&body[..column]);
        let value = match split_key(rest) {
            Some((key, value)) => {
                push_scalar(&mut out, key);
                out.push_str(": ");
                if opens_block_scalar(value) {
                    block_scalar_parent = Some(column);
                }
                value
            }
            None => {
                if opens_block_scalar(rest) {
                    block_scalar_parent = Some(last_dash.unwrap_or(indent));
                }
                rest
            }
        };
        push_scalar(&mut out, value);
        out.push_str(&line[body.len()..]);
    }
    out
}

/// Appends `scalar`, quoted if YAML 1.1 would read it as a boolean.
fn push_scalar(out: &mut String, scalar: &str) {
    if YAML11_BOOLEANS.contains(&scalar) {
        out.push('\'');
        out.push_str(scalar);
        out.push('\'');
    } else {
        out.push_str(scalar);
    }
}

/// `key: value` → `(key, value)` for a plain or quoted key; `None` when the line is no mapping
/// entry with an inline value. (A quoted key with escaped quotes is not split: it is never a
/// boolean word, and its value is then left as it is.)
fn split_key(text: &str) -> Option<(&str, &str)> {
    let end_of_key = if let Some(quote @ ('\'' | '"')) = text.chars().next() {
        text[1..].find(quote)? + 2
    } else {
        text.find(": ")?
    };
    let value = text[end_of_key..].strip_prefix(": ")?;
    Some((&text[..end_of_key], value))
}

/// Whether a value starts a block scalar (`|`, `|-`, `>+`, `|2`, …).
fn opens_block_scalar(value: &str) -> bool {
    let mut chars = value.chars();
    matches!(chars.next(), Some('|' | '>')) && chars.all(|c| matches!(c, '-' | '+') || c.is_ascii_digit())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn yaml11_booleans_are_quoted_in_values_and_items() {
        let doc = json!({
            "enum": ["On", "Off", "PoweringOn"],
            "power": "Off",
            "answer": "yes",
            "y": "n",
            "nested": [{"state": "on", "other": "Online"}],
            "text": "On\nOff\n",
            "flag": true,
            "word": "true",
        });
        let text = to_string(&doc).unwrap();
        assert!(text.contains("- 'On'\n- 'Off'\n- PoweringOn\n"), "{text}");
        assert!(text.contains("power: 'Off'\n"), "{text}");
        assert!(text.contains("answer: 'yes'\n"), "{text}");
        assert!(text.contains("'y': 'n'\n"), "keys are quoted too: {text}");
        assert!(
            text.contains("- state: 'on'\n") || text.contains("state: 'on'\n"),
            "{text}"
        );
        assert!(text.contains("other: Online\n"), "{text}");
        assert!(text.contains("flag: true\n"), "a real boolean stays one: {text}");
        assert!(text.contains("word: 'true'\n"), "{text}");
        // Block scalar content is text, not scalars.
        assert!(text.contains("text: |\n  On\n  Off\n"), "{text}");
        // The result still means the same to a YAML 1.2 reader.
        let back: serde_json::Value = serde_yaml::from_str(&text).unwrap();
        assert_eq!(back, doc);
    }

    #[test]
    fn a_block_scalar_in_a_sequence_item_ends_at_its_siblings() {
        let doc = json!([{"text": "line one\nline two\n", "state": "On"}]);
        let text = to_string(&doc).unwrap();
        assert!(text.contains("state: 'On'"), "{text}");
        let back: serde_json::Value = serde_yaml::from_str(&text).unwrap();
        assert_eq!(back, doc);
        let bare = "- |\n  On\n- On\n";
        assert_eq!(quote_yaml11_booleans(bare), "- |\n  On\n- 'On'\n");
    }

    #[test]
    fn other_lines_are_unchanged() {
        let text = "a:\n  b: c\n- d\n'on': x\nkey: 'already'\n";
        assert_eq!(quote_yaml11_booleans(text), text);
    }
}
