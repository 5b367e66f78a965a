//! The validation table: valid and invalid objects per kind, each invalid one with (a substring
//! of) the message the apiserver must return, plus an in-process checker for the structural
//! part of a CRD schema.
//!
//! # File format
//!
//! One YAML file per kind under `api/tests/validation/` (see [`TABLE_DIR`]):
//!
//! ```yaml
//! kind: VirtualMachine          # kind every case's object has
//! bases:                        # named objects cases start from
//!   minimal:
//!     apiVersion: banlieue.io/v1alpha1
//!     kind: VirtualMachine
//!     metadata: {name: vm}
//!     spec: {...}
//! cases:
//!   - name: minimal is valid
//!     base: minimal             # or `object:` with a complete object
//!     valid: true
//!   - name: memory below 128 MiB
//!     base: minimal
//!     patch: {spec: {memoryMiB: 64}}   # RFC 7386 JSON merge patch (null deletes)
//!     valid: false
//!     message: should be greater than or equal to 128
//!   - name: disks never shrink
//!     base: minimal
//!     update: {spec: {disks: [{name: root, sizeGiB: 10}]}}
//!     valid: false
//!     message: a disk may grow but never shrink
//! ```
//!
//! A case with `update` is an update: the object (base ⊕ patch) is created first and must be
//! accepted, then replaced by object ⊕ update, which is what `valid`/`message` describe.
//! Objects carry no namespace: a runner puts namespaced kinds in its own namespace.
//!
//! Runners: `api/tests/validation.rs` runs the table in-process ([`check_structural`] plus the
//! CEL rules through `kube-cel`); `api/tests/apiserver.rs` creates each object on a real
//! kube-apiserver and asserts its accept/reject and that its error message contains `message`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;

/// Directory of the table files, relative to the `api` crate root.
pub const TABLE_DIR: &str = "tests/validation";

/// Errors loading the validation table.
#[derive(Debug, thiserror::Error)]
pub enum TableError {
    /// A file or directory could not be read.
    #[error("reading {path}")]
    Read {
        /// The path.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A file is not a valid table.
    #[error("parsing {path}")]
    Parse {
        /// The path.
        path: PathBuf,
        /// The YAML error.
        #[source]
        source: serde_yaml::Error,
    },
    /// A case is inconsistent (unknown base, neither base nor object, invalid without message…).
    #[error("{path}: case {case:?}: {problem}")]
    Case {
        /// The file.
        path: PathBuf,
        /// Name of the case.
        case: String,
        /// What is wrong.
        problem: String,
    },
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTable {
    kind: String,
    #[serde(default)]
    bases: BTreeMap<String, Value>,
    cases: Vec<RawCase>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCase {
    name: String,
    #[serde(default)]
    base: Option<String>,
    #[serde(default)]
    object: Option<Value>,
    #[serde(default)]
    patch: Option<Value>,
    #[serde(default)]
    update: Option<Value>,
    valid: bool,
    #[serde(default)]
    message: Option<String>,
}

/// One resolved case of the table.
#[derive(Clone, Debug, PartialEq)]
pub struct Case {
    /// File the case comes from.
    pub file: PathBuf,
    /// Kind of the object.
    pub kind: String,
    /// Name of the case, unique within its file.
    pub name: String,
    /// For an update case, the object created first (it must be accepted).
    pub old_object: Option<Value>,
    /// The object to create (or to replace `old_object` with).
    pub object: Value,
    /// Whether the apiserver must accept `object`.
    pub valid: bool,
    /// For invalid cases, a substring of the apiserver's error message.
    pub message: Option<String>,
}

/// Applies an RFC 7386 JSON merge patch to `target`.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(patch) => {
            if !target.is_object() {
                *target = Value::Object(serde_json::Map::new());
            }
            let Value::Object(map) = target else { return };
            for (key, value) in patch {
                if value.is_null() {
                    map.remove(key);
                } else {
                    merge_patch(map.entry(key.clone()).or_insert(Value::Null), value);
                }
            }
        }
        other => *target = other.clone(),
    }
}

/// Parses one table file's contents; `path` is only used in errors and [`Case::file`].
pub fn parse_table(path: &Path, yaml: &str) -> Result<Vec<Case>, TableError> {
    let raw: RawTable = serde_yaml::from_str(yaml).map_err(|source| TableError::Parse {
        path: path.to_owned(),
        source,
    })?;
    let problem = |case: &str, problem: &str| TableError::Case {
        path: path.to_owned(),
        case: case.to_owned(),
        problem: problem.to_owned(),
    };
    let mut seen = std::collections::BTreeSet::new();
    let mut cases = Vec::with_capacity(raw.cases.len());
    for c in raw.cases {
        if !seen.insert(c.name.clone()) {
            return Err(problem(&c.name, "duplicate case name"));
        }
        let mut object = match (&c.base, c.object) {
            (Some(base), None) => raw
                .bases
                .get(base)
                .cloned()
                .ok_or_else(|| problem(&c.name, &format!("unknown base {base:?}")))?,
            (None, Some(object)) => object,
            _ => return Err(problem(&c.name, "set exactly one of base or object")),
        };
        if let Some(patch) = &c.patch {
            merge_patch(&mut object, patch);
        }
        if object.get("kind").and_then(Value::as_str) != Some(raw.kind.as_str()) {
            return Err(problem(&c.name, &format!("object kind is not {}", raw.kind)));
        }
        if !c.valid && c.message.as_deref().is_none_or(str::is_empty) {
            return Err(problem(
                &c.name,
                "an invalid case needs the message the apiserver must return",
            ));
        }
        let (old_object, object) = match &c.update {
            Some(update) => {
                let mut new = object.clone();
                merge_patch(&mut new, update);
                (Some(object), new)
            }
            None => (None, object),
        };
        cases.push(Case {
            file: path.to_owned(),
            kind: raw.kind.clone(),
            name: c.name,
            old_object,
            object,
            valid: c.valid,
            message: c.message,
        });
    }
    Ok(cases)
}

/// Loads every `*.yaml` table in `dir`, files in name order.
pub fn load_dir(dir: &Path) -> Result<Vec<Case>, TableError> {
    let read_err = |source| TableError::Read {
        path: dir.to_owned(),
        source,
    };
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(read_err)?
        .map(|entry| entry.map(|e| e.path()))
        .collect::<Result<_, _>>()
        .map_err(read_err)?;
    files.retain(|p| p.extension().is_some_and(|e| e == "yaml"));
    files.sort();
    let mut cases = Vec::new();
    for file in files {
        let yaml = std::fs::read_to_string(&file).map_err(|source| TableError::Read {
            path: file.clone(),
            source,
        })?;
        cases.extend(parse_table(&file, &yaml)?);
    }
    Ok(cases)
}

/// Loads the table shipped with this crate (`<crate>/tests/validation`).
pub fn load() -> Result<Vec<Case>, TableError> {
    load_dir(&Path::new(env!("CARGO_MANIFEST_DIR")).join(TABLE_DIR))
}

/// A structural-schema violation, worded like the apiserver's so the table's `message`
/// substrings hold for both.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// JSON path of the offending field, e.g. `spec.disks[0].sizeGiB`.
    pub path: String,
    /// The message, e.g. `Required value`.
    pub message: String,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.path, self.message)
    }
}

/// Checks `value` against the structural part of an OpenAPI v3 CRD schema: `type`,
/// `required`, `enum`, `pattern`, `minLength`/`maxLength`, `minimum`/`maximum`,
/// `minItems`/`maxItems`, `nullable`, and uniqueness in `x-kubernetes-list-type` `map`/`set`
/// lists. Unknown fields are not errors (the apiserver prunes them). CEL rules are not
/// evaluated here.
pub fn check_structural(schema: &Value, value: &Value) -> Vec<Violation> {
    let mut out = Vec::new();
    walk(schema, value, "", &mut out);
    out
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_owned()
    } else {
        format!("{path}.{key}")
    }
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn fmt_num(n: f64) -> String {
    if n.fract() == 0.0 && n.abs() < 1e15 {
        format!("{}", n as i64)
    } else {
        n.to_string()
    }
}

fn walk(schema: &Value, value: &Value, path: &str, out: &mut Vec<Violation>) {
    let mut push = |message: String| {
        out.push(Violation {
            path: path.to_owned(),
            message,
        })
    };
    if value.is_null() {
        if schema.get("nullable").and_then(Value::as_bool) != Some(true) {
            push(format!(
                "Invalid value: \"null\": {path} in body must be of type object: \"null\""
            ));
        }
        return;
    }
    if let Some(expected) = schema.get("type").and_then(Value::as_str) {
        let actual = type_name(value);
        let ok = actual == expected || (expected == "number" && actual == "integer");
        if !ok {
            push(format!(
                "Invalid value: \"{actual}\": {path} in body must be of type {expected}: \"{actual}\""
            ));
            return;
        }
    }
    if let Some(allowed) = schema.get("enum").and_then(Value::as_array)
        && !allowed.contains(value)
    {
        let list: Vec<String> = allowed.iter().map(|v| v.to_string()).collect();
        push(format!(
            "Unsupported value: {value}: supported values: {}",
            list.join(", ")
        ));
    }
    match value {
        Value::String(s) => {
            let len = s.chars().count() as u64;
            if let Some(max) = schema.get("maxLength").and_then(Value::as_u64)
                && len > max
            {
                push(format!("Too long: may not be more than {max} bytes"));
            }
            if let Some(min) = schema.get("minLength").and_then(Value::as_u64)
                && len < min
            {
                push(format!(
                    "Invalid value: \"{s}\": {path} in body should be at least {min} chars long"
                ));
            }
            if let Some(pattern) = schema.get("pattern").and_then(Value::as_str) {
                match regex::Regex::new(pattern) {
                    Ok(re) if re.is_match(s) => {}
                    Ok(_) => push(format!(
                        "Invalid value: \"{s}\": {path} in body should match '{pattern}'"
                    )),
                    Err(e) => push(format!("schema pattern {pattern:?} does not compile: {e}")),
                }
            }
        }
        Value::Number(n) => {
            let x = n.as_f64().unwrap_or(f64::NAN);
            if let Some(min) = schema.get("minimum").and_then(Value::as_f64)
                && x < min
            {
                push(format!(
                    "Invalid value: {n}: {path} in body should be greater than or equal to {}",
                    fmt_num(min)
                ));
            }
            if let Some(max) = schema.get("maximum").and_then(Value::as_f64)
                && x > max
            {
                push(format!(
                    "Invalid value: {n}: {path} in body should be less than or equal to {}",
                    fmt_num(max)
                ));
            }
        }
        Value::Array(items) => {
            if let Some(max) = schema.get("maxItems").and_then(Value::as_u64)
                && items.len() as u64 > max
            {
                push(format!(
                    "Too many: {}: must have at most {max} items",
                    items.len()
                ));
            }
            if let Some(min) = schema.get("minItems").and_then(Value::as_u64)
                && (items.len() as u64) < min
            {
                push(format!(
                    "Invalid value: {}: {path} in body should have at least {min} items",
                    items.len()
                ));
            }
            match schema.get("x-kubernetes-list-type").and_then(Value::as_str) {
                Some("set") => {
                    for (i, item) in items.iter().enumerate() {
                        if items[..i].contains(item) {
                            out.push(Violation {
                                path: format!("{path}[{i}]"),
                                message: format!("Duplicate value: {item}"),
                            });
                        }
                    }
                }
                Some("map") => {
                    let keys: Vec<&str> = schema
                        .get("x-kubernetes-list-map-keys")
                        .and_then(Value::as_array)
                        .map(|k| k.iter().filter_map(Value::as_str).collect())
                        .unwrap_or_default();
                    let key_of =
                        |item: &Value| keys.iter().map(|k| item.get(*k).cloned()).collect::<Vec<_>>();
                    for (i, item) in items.iter().enumerate() {
                        let key = key_of(item);
                        if items[..i].iter().any(|other| key_of(other) == key) {
                            let shown: Vec<String> = key
                                .iter()
                                .map(|k| k.as_ref().map_or("null".into(), Value::to_string))
                                .collect();
                            out.push(Violation {
                                path: format!("{path}[{i}]"),
                                message: format!("Duplicate value: map[{}]", shown.join(" ")),
                            });
                        }
                    }
                }
                _ => {}
            }
            if let Some(item_schema) = schema.get("items") {
                for (i, item) in items.iter().enumerate() {
                    walk(item_schema, item, &format!("{path}[{i}]"), out);
                }
            }
        }
        Value::Object(map) => {
            if let Some(required) = schema.get("required").and_then(Value::as_array) {
                for key in required.iter().filter_map(Value::as_str) {
                    if !map.contains_key(key) {
                        out.push(Violation {
                            path: join(path, key),
                            message: "Required value".into(),
                        });
                    }
                }
            }
            let properties = schema.get("properties").and_then(Value::as_object);
            for (key, child) in map {
                if let Some(child_schema) = properties.and_then(|p| p.get(key)) {
                    walk(child_schema, child, &join(path, key), out);
                } else if let Some(additional) = schema.get("additionalProperties").filter(|a| a.is_object())
                {
                    walk(additional, child, &join(path, key), out);
                }
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn merge_patch_follows_rfc_7386() {
        let mut doc = json!({"a": {"b": 1, "c": 2}, "d": [1, 2]});
        merge_patch(&mut doc, &json!({"a": {"b": null, "e": 3}, "d": [3]}));
        assert_eq!(doc, json!({"a": {"c": 2, "e": 3}, "d": [3]}));
    }

    #[test]
    fn structural_checks_word_messages_like_the_apiserver() {
        let schema = json!({
            "type": "object",
            "required": ["n", "s"],
            "properties": {
                "n": {"type": "integer", "minimum": 128.0, "maximum": 1024.0},
                "s": {"type": "string", "maxLength": 3, "pattern": "^[a-z]+$"},
                "e": {"type": "string", "enum": ["On", "Off"]},
                "l": {"type": "array", "maxItems": 1, "x-kubernetes-list-type": "map",
                      "x-kubernetes-list-map-keys": ["name"], "items": {"type": "object"}}
            }
        });
        let found = check_structural(
            &schema,
            &json!({"n": 64, "s": "ABCD", "e": "Maybe",
            "l": [{"name": "a"}, {"name": "a"}]}),
        );
        let text: Vec<String> = found.iter().map(ToString::to_string).collect();
        let has = |needle: &str| text.iter().any(|t| t.contains(needle));
        assert!(
            has("n: Invalid value: 64: n in body should be greater than or equal to 128"),
            "{text:?}"
        );
        assert!(has("s: Too long: may not be more than 3 bytes"), "{text:?}");
        assert!(has("should match '^[a-z]+$'"), "{text:?}");
        assert!(has("e: Unsupported value: \"Maybe\""), "{text:?}");
        assert!(has("l: Too many: 2: must have at most 1 items"), "{text:?}");
        assert!(has("l[1]: Duplicate value"), "{text:?}");
        assert!(
            check_structural(&schema, &json!({"s": "ab"}))
                .iter()
                .any(|v| v.path == "n")
        );
        assert!(check_structural(&schema, &json!({"n": 200, "s": "ab", "e": "On"})).is_empty());
    }

    #[test]
    fn tables_resolve_bases_patches_and_updates() {
        let yaml = r#"
kind: Thing
bases:
  b: {kind: Thing, spec: {x: 1, y: 2}}
cases:
  - {name: plain, base: b, valid: true}
  - {name: patched, base: b, patch: {spec: {y: null}}, valid: false, message: Required value}
  - {name: updated, base: b, update: {spec: {x: 0}}, valid: false, message: shrink}
"#;
        let cases = parse_table(Path::new("t.yaml"), yaml).expect("parses");
        assert_eq!(
            cases[0].object,
            json!({"kind": "Thing", "spec": {"x": 1, "y": 2}})
        );
        assert_eq!(cases[1].object, json!({"kind": "Thing", "spec": {"x": 1}}));
        assert_eq!(
            cases[2].old_object,
            Some(json!({"kind": "Thing", "spec": {"x": 1, "y": 2}}))
        );
        assert_eq!(
            cases[2].object,
            json!({"kind": "Thing", "spec": {"x": 0, "y": 2}})
        );
    }

    #[test]
    fn tables_reject_inconsistent_cases() {
        let no_message = "kind: T\ncases:\n  - {name: a, object: {kind: T}, valid: false}\n";
        assert!(matches!(
            parse_table(Path::new("t"), no_message),
            Err(TableError::Case { .. })
        ));
        let unknown_base = "kind: T\ncases:\n  - {name: a, base: nope, valid: true}\n";
        assert!(matches!(
            parse_table(Path::new("t"), unknown_base),
            Err(TableError::Case { .. })
        ));
        let wrong_kind = "kind: T\ncases:\n  - {name: a, object: {kind: U}, valid: true}\n";
        assert!(matches!(
            parse_table(Path::new("t"), wrong_kind),
            Err(TableError::Case { .. })
        ));
        let dup = "kind: T\ncases:\n  - {name: a, object: {kind: T}, valid: true}\n  - {name: a, object: {kind: T}, valid: true}\n";
        assert!(matches!(
            parse_table(Path::new("t"), dup),
            Err(TableError::Case { .. })
        ));
    }
}
