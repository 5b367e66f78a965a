//! Multi-document YAML rendering.

use serde_json::Value;

use crate::{Error, Result};

/// A header comment and the documents, each introduced by `---`.
pub fn render(header: &str, docs: &[Value]) -> Result<String> {
    let mut out = String::new();
    for line in header.lines() {
        out.push_str(if line.is_empty() { "#" } else { "# " });
        out.push_str(line);
        out.push('\n');
    }
    for doc in docs {
        // Quoted for YAML 1.1: clusterctl reads `- On` in an enum as `true`.
        let text = banlieue_api::yaml::to_string(doc).map_err(|source| Error::Yaml {
            what: describe(doc),
            source,
        })?;
        out.push_str("---\n");
        out.push_str(&text);
    }
    Ok(out)
}

/// Parses a multi-document YAML stream, skipping empty documents.
pub fn parse(text: &str, what: &str) -> Result<Vec<Value>> {
    let mut docs = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(text) {
        let value = serde_yaml::Value::deserialize_from(doc, what)?;
        if value.is_null() {
            continue;
        }
        let json = serde_json::to_value(&value).map_err(|e| Error::Invalid(format!("{what}: {e}")))?;
        docs.push(json);
    }
    Ok(docs)
}

/// `Kind namespace/name` of a document, for messages.
pub fn describe(doc: &Value) -> String {
    let kind = doc["kind"].as_str().unwrap_or("?");
    let name = doc["metadata"]["name"].as_str().unwrap_or("?");
    match doc["metadata"]["namespace"].as_str() {
        Some(ns) => format!("{kind} {ns}/{name}"),
        None => format!("{kind} {name}"),
    }
}

trait DeserializeFrom: Sized {
    fn deserialize_from(doc: serde_yaml::Deserializer<'_>, what: &str) -> Result<Self>;
}

impl DeserializeFrom for serde_yaml::Value {
    fn deserialize_from(doc: serde_yaml::Deserializer<'_>, what: &str) -> Result<Self> {
        serde::Deserialize::deserialize(doc).map_err(|source| Error::Yaml {
            what: what.to_owned(),
            source,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_and_parses_back() {
        let docs = vec![
            serde_json::json!({"kind": "Namespace", "metadata": {"name": "a"}}),
            serde_json::json!({"kind": "Secret", "metadata": {"name": "s", "namespace": "a"}, "stringData": {"k": "${V:=x}"}}),
        ];
        let text = render("line one\n\nline three", &docs).unwrap();
        assert!(text.starts_with("# line one\n#\n# line three\n---\n"), "{text}");
        assert_eq!(parse(&text, "test").unwrap(), docs);
        assert_eq!(describe(&docs[1]), "Secret a/s");
        assert_eq!(describe(&docs[0]), "Namespace a");
    }
}
