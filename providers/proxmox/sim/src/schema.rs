//! The official PVE API schema (`pve-api-schema-9.1.json`), loaded at run time.
//!
//! [`ApiSchema`] answers three questions the way a real PVE node does:
//! - which schema node and method does `METHOD /concrete/path` hit ([`ApiSchema::find`]); an unknown
//!   path or method is [`SchemaError::NotImplemented`] (`501 Method 'GET /x' not implemented`);
//! - are the parameters valid ([`ApiSchema::validate`]): declared names (including indexed `net[n]`),
//!   types, enums, patterns, ranges, lengths, the common named formats and property strings; the
//!   answer is the per-parameter `errors` map of `400 Parameter verification failed.`;
//! - does a response body match the declared `returns` ([`check_returns`]), allowing the Perl typing
//!   PVE really emits (numbers as strings, booleans as 0/1).
//!
//! The schema is test data (AGPL, from pve-docs); it is never compiled into a binary.

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock};

use regex::Regex;
use serde_json::Value;

/// File name of the schema, in this crate's `schema/` folder (AGPL test data, see its README).
pub const SCHEMA_FILE: &str = "pve-api-schema-9.1.json";
/// Environment variable that overrides where the schema is loaded from.
pub const SCHEMA_ENV: &str = "PVE_API_SCHEMA";

/// Error text for a parameter that the schema does not declare.
pub const UNDECLARED: &str =
    "property is not defined in schema and the schema does not allow additional properties";
/// Error text for a required parameter that is missing.
pub const MISSING: &str = "property is missing and it is not optional";

/// Per-parameter error messages, as in PVE's `errors` map.
pub type ParamErrors = BTreeMap<String, String>;

/// Errors from loading the schema or matching a request against it.
#[derive(Debug, thiserror::Error)]
pub enum SchemaError {
    /// The schema file could not be read.
    #[error(
        "cannot read API schema {path} (the repository keeps it in providers/proxmox/sim/schema; \
         {SCHEMA_ENV} names another file)"
    )]
    Read {
        /// The file that was tried.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The schema file is not the JSON tree we expect.
    #[error("API schema {path} is not valid JSON")]
    Parse {
        /// The file that was read.
        path: PathBuf,
        /// The JSON error.
        #[source]
        source: serde_json::Error,
    },
    /// The schema file parsed but has an unexpected shape.
    #[error("API schema {path} has an unexpected shape: {detail}")]
    Shape {
        /// The file that was read.
        path: PathBuf,
        /// What was wrong.
        detail: String,
    },
    /// The path or method is not in the schema: PVE answers `501 Method '{method} {path}' not implemented`.
    #[error("Method '{method} {path}' not implemented")]
    NotImplemented {
        /// HTTP method of the request.
        method: String,
        /// API-relative path of the request (without `/api2/json`).
        path: String,
    },
}

/// One method of one schema node, with the path parameters a concrete request bound.
#[derive(Debug, Clone)]
pub struct Endpoint<'a> {
    /// The schema path template, e.g. `/nodes/{node}/qemu/{vmid}/config`.
    pub template: &'a str,
    /// The HTTP method (upper case).
    pub method: &'a str,
    /// The method's schema object (`name`, `parameters`, `returns`, `permissions`, ...).
    pub info: &'a Value,
    /// Values of the `{param}` segments, percent-decoded.
    pub path_params: BTreeMap<String, String>,
}

impl Endpoint<'_> {
    /// The declared `returns` schema (`{}` when absent).
    pub fn returns(&self) -> &Value {
        static EMPTY: LazyLock<Value> = LazyLock::new(|| Value::Object(Default::default()));
        self.info.get("returns").unwrap_or(&EMPTY)
    }
}

#[derive(Debug, Default)]
struct PathNode {
    template: String,
    literal: HashMap<String, PathNode>,
    param: Option<(String, Box<PathNode>)>,
    methods: HashMap<String, Value>,
}

/// The loaded PVE API schema with an index for path matching and precompiled patterns.
#[derive(Debug)]
pub struct ApiSchema {
    root: PathNode,
    patterns: HashMap<String, Option<Regex>>,
    source: PathBuf,
}

impl ApiSchema {
    /// Loads the schema from the default location (see [`default_schema_path`]).
    pub fn load_default() -> Result<Self, SchemaError> {
        Self::load(&default_schema_path())
    }

    /// Loads the schema from `path`.
    pub fn load(path: &Path) -> Result<Self, SchemaError> {
        let text = std::fs::read(path).map_err(|source| SchemaError::Read {
            path: path.into(),
            source,
        })?;
        let tree: Value = serde_json::from_slice(&text).map_err(|source| SchemaError::Parse {
            path: path.into(),
            source,
        })?;
        Self::from_tree(tree, path)
    }

    /// Builds the index from an already parsed schema tree (the top-level JSON array).
    pub fn from_tree(tree: Value, source: &Path) -> Result<Self, SchemaError> {
        let Value::Array(nodes) = tree else {
            return Err(SchemaError::Shape {
                path: source.into(),
                detail: "top level is not an array".into(),
            });
        };
        let mut root = PathNode {
            template: "/".into(),
            ..Default::default()
        };
        let mut patterns = HashMap::new();
        let mut stack: Vec<Value> = nodes;
        let mut count = 0usize;
        while let Some(mut node) = stack.pop() {
            let Some(path) = node.get("path").and_then(Value::as_str).map(str::to_owned) else {
                return Err(SchemaError::Shape {
                    path: source.into(),
                    detail: "node without path".into(),
                });
            };
            if let Some(Value::Array(children)) = node.get_mut("children").map(Value::take) {
                stack.extend(children);
            }
            let slot = path_slot(&mut root, &path);
            slot.template = path;
            if let Some(Value::Object(info)) = node.get_mut("info").map(Value::take) {
                for (method, spec) in info {
                    collect_patterns(&spec, &mut patterns);
                    slot.methods.insert(method, spec);
                    count += 1;
                }
            }
        }
        if count == 0 {
            return Err(SchemaError::Shape {
                path: source.into(),
                detail: "no methods found".into(),
            });
        }
        Ok(Self {
            root,
            patterns,
            source: source.into(),
        })
    }

    /// Where this schema was loaded from.
    pub fn source(&self) -> &Path {
        &self.source
    }

    /// Finds the schema node and method for a request. `path` is API-relative (`/nodes/pve1/status`),
    /// raw (segments are percent-decoded here, after splitting on `/`).
    pub fn find<'a>(&'a self, method: &str, path: &str) -> Result<Endpoint<'a>, SchemaError> {
        let not_impl = || SchemaError::NotImplemented {
            method: method.to_owned(),
            path: decode_path_for_message(path),
        };
        let mut node = &self.root;
        let mut params = BTreeMap::new();
        for raw in path.split('/').filter(|s| !s.is_empty()) {
            let seg = percent_encoding::percent_decode_str(raw).decode_utf8_lossy();
            if let Some(next) = node.literal.get(seg.as_ref()) {
                node = next;
            } else if let Some((name, next)) = &node.param {
                params.insert(name.clone(), seg.into_owned());
                node = next;
            } else {
                return Err(not_impl());
            }
        }
        let (method_key, info) = node.methods.get_key_value(method).ok_or_else(not_impl)?;
        Ok(Endpoint {
            template: &node.template,
            method: method_key,
            info,
            path_params: params,
        })
    }

    /// All `(method, template)` pairs in the schema, sorted.
    pub fn endpoints(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        let mut stack = vec![&self.root];
        while let Some(node) = stack.pop() {
            for m in node.methods.keys() {
                out.push((m.clone(), node.template.clone()));
            }
            stack.extend(node.literal.values());
            if let Some((_, next)) = &node.param {
                stack.push(next);
            }
        }
        out.sort();
        out
    }

    /// Validates request parameters (path parameters merged in) against the method's declared
    /// `parameters`, like PVE's `JSONSchema::validate`. Returns the `errors` map on failure.
    pub fn validate(&self, info: &Value, params: &BTreeMap<String, Value>) -> Result<(), ParamErrors> {
        let mut errors = ParamErrors::new();
        let spec = info.get("parameters");
        let props = spec.and_then(|p| p.get("properties")).and_then(Value::as_object);
        let additional = spec
            .and_then(|p| p.get("additionalProperties"))
            .map(truthy)
            .unwrap_or(false);
        for (name, value) in params {
            match props.and_then(|p| lookup_property(p, name)) {
                Some(schema) => {
                    if let Err(msg) = self.check_value(value, schema, name) {
                        errors.insert(name.clone(), msg);
                    } else if let Some(req) = schema.get("requires").and_then(Value::as_str)
                        && !params.contains_key(req)
                    {
                        errors.insert(name.clone(), format!("parameter '{name}' requires '{req}'"));
                    }
                }
                None if additional => {}
                None => {
                    errors.insert(name.clone(), UNDECLARED.to_owned());
                }
            }
        }
        if let Some(props) = props {
            for (name, schema) in props {
                if name.ends_with("[n]") || params.contains_key(name) || is_optional(schema) {
                    continue;
                }
                errors.insert(name.clone(), MISSING.to_owned());
            }
        }
        if errors.is_empty() { Ok(()) } else { Err(errors) }
    }

    /// Checks one value against one property schema; `Err` carries PVE's message for that parameter.
    pub fn check_value(&self, value: &Value, schema: &Value, name: &str) -> Result<(), String> {
        let ty = schema.get("type").and_then(Value::as_str).unwrap_or("string");
        let text = match ty {
            "integer" => {
                let n = as_integer(value).ok_or_else(|| type_error(ty, value))?;
                check_range(n as f64, schema)?;
                n.to_string()
            }
            "number" => {
                let n = as_number(value).ok_or_else(|| type_error(ty, value))?;
                check_range(n, schema)?;
                n.to_string()
            }
            "boolean" => {
                as_bool(value).ok_or_else(|| type_error(ty, value))?;
                return Ok(());
            }
            "string" => match value {
                Value::String(s) => s.clone(),
                Value::Number(n) => n.to_string(),
                Value::Bool(b) => u8::from(*b).to_string(),
                _ => return Err(type_error(ty, value)),
            },
            // Arrays and objects only come as JSON bodies; PVE checks their items loosely too.
            _ => return Ok(()),
        };
        if let Some(max) = num_field(schema, "maxLength")
            && text.chars().count() as f64 > max
        {
            return Err(format!("value may only be {max} characters long"));
        }
        if let Some(min) = num_field(schema, "minLength")
            && (text.chars().count() as f64) < min
        {
            return Err(format!("value must be at least {min} characters long"));
        }
        if let Some(Value::Array(options)) = schema.get("enum")
            && !options
                .iter()
                .any(|o| scalar_text(o).as_deref() == Some(text.as_str()))
        {
            let list: Vec<String> = options.iter().filter_map(scalar_text).collect();
            return Err(format!(
                "value '{text}' does not have a value in the enumeration '{}'",
                list.join(", ")
            ));
        }
        if let Some(pattern) = schema.get("pattern").and_then(Value::as_str)
            && let Some(Some(re)) = self.patterns.get(pattern)
            && !re.is_match(&text)
        {
            return Err("value does not match the regex pattern".to_owned());
        }
        match schema.get("format") {
            Some(Value::String(format)) => check_named_format(format, &text, name),
            Some(Value::Object(fields)) => self.check_property_string(fields, &text, name),
            _ => Ok(()),
        }
    }

    /// Checks a property string (`virtio,bridge=vmbr0,tag=5`) against an inline format object.
    fn check_property_string(
        &self,
        fields: &serde_json::Map<String, Value>,
        text: &str,
        name: &str,
    ) -> Result<(), String> {
        let parsed = parse_property_string(fields, text);
        let mut errors = ParamErrors::new();
        match parsed {
            Err(msg) => return Err(format!("invalid format - {msg}\n")),
            Ok(map) => {
                for (key, value) in &map {
                    match fields.get(key) {
                        Some(schema) => {
                            if let Err(msg) = self.check_value(&Value::String(value.clone()), schema, key) {
                                errors.insert(format!("{name}.{key}"), msg);
                            }
                        }
                        None => {
                            errors.insert(format!("{name}.{key}"), UNDECLARED.to_owned());
                        }
                    }
                }
                for (key, schema) in fields {
                    if schema.get("alias").is_none() && !is_optional(schema) && !map.contains_key(key) {
                        errors.insert(format!("{name}.{key}"), MISSING.to_owned());
                    }
                }
            }
        }
        if errors.is_empty() {
            return Ok(());
        }
        let mut msg = "invalid format - format error\n".to_owned();
        for (k, v) in errors {
            msg.push_str(&format!("{k}: {v}\n"));
        }
        Err(msg)
    }
}

/// Parses a property string with an inline format (handles `default_key`, `alias` and `keyAlias`).
/// Returns the canonical key → value map.
pub fn parse_property_string(
    fields: &serde_json::Map<String, Value>,
    text: &str,
) -> Result<BTreeMap<String, String>, String> {
    let default_key = fields
        .iter()
        .find(|(_, s)| s.get("default_key").map(truthy).unwrap_or(false))
        .map(|(k, _)| k.clone());
    let mut out = BTreeMap::new();
    for part in text.split(',').filter(|p| !p.is_empty()) {
        let (key, value) = match part.split_once('=') {
            Some((k, v)) => (k.to_owned(), v.to_owned()),
            None => match &default_key {
                Some(dk) if !out.contains_key(dk) => (dk.clone(), part.to_owned()),
                _ => {
                    return Err(String::from(
                        "value without key, but schema does not define a default key\n",
                    ));
                }
            },
        };
        let (key, value) = match fields.get(&key) {
            Some(s) if s.get("keyAlias").is_some() => {
                let target = s
                    .get("keyAlias")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned();
                let alias = s
                    .get("alias")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned();
                out.insert(target, key);
                (alias, value)
            }
            Some(s) if s.get("alias").is_some() => (
                s.get("alias")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned(),
                value,
            ),
            _ => (key, value),
        };
        if out.insert(key.clone(), value).is_some() {
            return Err(String::from(
                "duplicate key in comma-separated list property: {key}\n",
            ));
        }
    }
    Ok(out)
}

/// The default schema location: `$PVE_API_SCHEMA`, else `schema/pve-api-schema-9.1.json` of
/// this crate (the repository's copy; nothing outside the repository is read).
pub fn default_schema_path() -> PathBuf {
    std::env::var_os(SCHEMA_ENV).map_or_else(
        || {
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("schema")
                .join(SCHEMA_FILE)
        },
        PathBuf::from,
    )
}

/// Loads the default schema once per process and shares it.
pub fn shared_default() -> Result<Arc<ApiSchema>, Arc<SchemaError>> {
    static CELL: LazyLock<Result<Arc<ApiSchema>, Arc<SchemaError>>> =
        LazyLock::new(|| ApiSchema::load_default().map(Arc::new).map_err(Arc::new));
    CELL.clone()
}

/// Checks a response `data` value against a declared `returns` schema. Perl typing is accepted
/// (integers/numbers as numeric strings, booleans as 0/1). Returns a list of mismatches, each
/// prefixed with the JSON path (`data.foo[0].bar`).
pub fn check_returns(returns: &Value, data: &Value) -> Vec<String> {
    let mut out = Vec::new();
    check_returns_at(returns, data, "data", &mut out);
    out
}

fn check_returns_at(schema: &Value, data: &Value, at: &str, out: &mut Vec<String>) {
    let types: Vec<&str> = match schema.get("type") {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
        _ => return,
    };
    if data.is_null() && (types.contains(&"null") || schema.get("optional").map(truthy).unwrap_or(false)) {
        return;
    }
    let ok = types.iter().any(|t| match *t {
        "null" => data.is_null(),
        "integer" => as_integer(data).is_some(),
        "number" => as_number(data).is_some(),
        "boolean" => as_bool(data).is_some(),
        "string" => data.is_string() || data.is_number(),
        "array" => data.is_array(),
        "object" => data.is_object(),
        "any" => true,
        _ => true,
    });
    if !ok {
        out.push(format!("{at}: expected {}, got {data}", types.join("|")));
        return;
    }
    if let (Some(Value::Array(options)), Some(s)) = (schema.get("enum"), data.as_str())
        && !options.iter().any(|o| o.as_str() == Some(s))
    {
        out.push(format!(
            "{at}: '{s}' is not one of {}",
            Value::Array(options.clone())
        ));
    }
    match data {
        Value::Array(items) => {
            if let Some(item_schema) = schema.get("items") {
                for (i, item) in items.iter().enumerate() {
                    check_returns_at(item_schema, item, &format!("{at}[{i}]"), out);
                }
            }
        }
        Value::Object(map) => {
            if let Some(Value::Object(props)) = schema.get("properties") {
                for (key, prop) in props {
                    match map.get(key) {
                        Some(v) => check_returns_at(prop, v, &format!("{at}.{key}"), out),
                        None if !is_optional(prop) => out.push(format!("{at}.{key}: missing")),
                        None => {}
                    }
                }
                if schema.get("additionalProperties").is_some_and(|a| !truthy(a)) {
                    for key in map.keys().filter(|k| !props.contains_key(*k)) {
                        out.push(format!("{at}.{key}: not declared"));
                    }
                }
            }
        }
        _ => {}
    }
}

fn path_slot<'a>(root: &'a mut PathNode, path: &str) -> &'a mut PathNode {
    let mut node = root;
    for seg in path.split('/').filter(|s| !s.is_empty()) {
        node = if let Some(name) = seg.strip_prefix('{').and_then(|s| s.strip_suffix('}')) {
            let slot = node
                .param
                .get_or_insert_with(|| (name.to_owned(), Box::default()));
            &mut slot.1
        } else {
            node.literal.entry(seg.to_owned()).or_default()
        };
    }
    node
}

fn collect_patterns(value: &Value, out: &mut HashMap<String, Option<Regex>>) {
    match value {
        Value::Object(map) => {
            if let Some(Value::String(p)) = map.get("pattern")
                && !out.contains_key(p)
            {
                // Perl anchors nothing by default, but PVE's checker wraps patterns in ^(...)$.
                out.insert(p.clone(), Regex::new(&format!("^(?:{p})$")).ok());
            }
            map.values().for_each(|v| collect_patterns(v, out));
        }
        Value::Array(items) => items.iter().for_each(|v| collect_patterns(v, out)),
        _ => {}
    }
}

fn lookup_property<'a>(props: &'a serde_json::Map<String, Value>, name: &str) -> Option<&'a Value> {
    if let Some(s) = props.get(name) {
        return Some(s);
    }
    let stem = name.trim_end_matches(|c: char| c.is_ascii_digit());
    let index = &name[stem.len()..];
    if stem.is_empty() || index.is_empty() || (index.len() > 1 && index.starts_with('0')) || index.len() > 3 {
        return None;
    }
    props.get(&format!("{stem}[n]"))
}

fn decode_path_for_message(path: &str) -> String {
    let p = percent_encoding::percent_decode_str(path).decode_utf8_lossy();
    if p.is_empty() {
        "/".to_owned()
    } else {
        p.into_owned()
    }
}

/// True for Perl-true schema flags (`1`, `true`, `"1"`).
fn truthy(v: &Value) -> bool {
    match v {
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64().is_some_and(|f| f != 0.0),
        Value::String(s) => !s.is_empty() && s != "0",
        _ => false,
    }
}

fn is_optional(schema: &Value) -> bool {
    schema.get("optional").map(truthy).unwrap_or(false)
}

fn num_field(schema: &Value, key: &str) -> Option<f64> {
    match schema.get(key)? {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => s.parse().ok(),
        _ => None,
    }
}

fn check_range(n: f64, schema: &Value) -> Result<(), String> {
    if let Some(min) = num_field(schema, "minimum")
        && n < min
    {
        return Err(format!("value must have a minimum value of {min}"));
    }
    if let Some(max) = num_field(schema, "maximum")
        && n > max
    {
        return Err(format!("value must have a maximum value of {max}"));
    }
    Ok(())
}

fn scalar_text(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

fn type_error(ty: &str, value: &Value) -> String {
    let shown = match value {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    format!("type check ('{ty}') failed - got '{shown}'")
}

/// An integer as PVE accepts it: a JSON integer or a decimal string.
pub fn as_integer(v: &Value) -> Option<i64> {
    static INT: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"^[+-]?\d+$").expect("static regex"));
    match v {
        Value::Number(n) => n
            .as_i64()
            .or_else(|| n.as_f64().filter(|f| f.fract() == 0.0).map(|f| f as i64)),
        Value::String(s) if INT.is_match(s) => s.parse().ok(),
        _ => None,
    }
}

/// A number as PVE accepts it: a JSON number or a decimal string.
pub fn as_number(v: &Value) -> Option<f64> {
    static NUM: LazyLock<Regex> =
        LazyLock::new(|| Regex::new(r"^[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?$").expect("static regex"));
    match v {
        Value::Number(n) => n.as_f64(),
        Value::String(s) if NUM.is_match(s) => s.parse().ok(),
        _ => None,
    }
}

/// A boolean as PVE accepts it: JSON `true`/`false`, `0`/`1` as number or string. The string
/// `"true"` is rejected (see WIRE.md).
pub fn as_bool(v: &Value) -> Option<bool> {
    match v {
        Value::Bool(b) => Some(*b),
        Value::Number(n) => match n.as_i64() {
            Some(0) => Some(false),
            Some(1) => Some(true),
            _ => None,
        },
        Value::String(s) => match s.as_str() {
            "0" => Some(false),
            "1" => Some(true),
            _ => None,
        },
        _ => None,
    }
}

fn re(pattern: &str) -> Regex {
    Regex::new(pattern).expect("static regex")
}

static VMID: LazyLock<Regex> = LazyLock::new(|| re(r"^[1-9][0-9]{2,8}$"));
static NODE: LazyLock<Regex> = LazyLock::new(|| re(r"^(?i:[a-z0-9](?:[a-z0-9\-]*[a-z0-9])?)$"));
static STORAGE_ID: LazyLock<Regex> = LazyLock::new(|| re(r"^(?i:[a-z][a-z0-9\-_.]*[a-z0-9])$"));
static CONFIG_ID: LazyLock<Regex> = LazyLock::new(|| re(r"^(?i:[a-z][a-z0-9_\-]+)$"));
static POOL_ID: LazyLock<Regex> = LazyLock::new(|| re(r"^[A-Za-z0-9.\-_]+(?:/[A-Za-z0-9.\-_]+){0,2}$"));
static DNS_NAME: LazyLock<Regex> = LazyLock::new(|| {
    re(r"^(?:(?:[a-zA-Z0-9](?:[a-zA-Z0-9\-]*[a-zA-Z0-9])?)\.)*(?:[A-Za-z0-9](?:[A-Za-z0-9\-]*[A-Za-z0-9])?)$")
});
static MAC: LazyLock<Regex> = LazyLock::new(|| re(r"^(?i:[a-f0-9][02468ace](?::[a-f0-9]{2}){5})$"));
/// The tag pattern from WIRE.md.
pub static TAG: LazyLock<Regex> = LazyLock::new(|| re(r"^(?i:[a-z0-9_][a-z0-9_\-+.]*)$"));
static URLENCODED: LazyLock<Regex> = LazyLock::new(|| re(r"^[-%a-zA-Z0-9_.!~*'()]*$"));
static VOLUME_ID: LazyLock<Regex> = LazyLock::new(|| re(r"^(?i:[a-z][a-z0-9\-_.]*[a-z0-9]):.+$"));
static UUID: LazyLock<Regex> =
    LazyLock::new(|| re(r"^[a-fA-F0-9]{8}(?:-[a-fA-F0-9]{4}){3}-[a-fA-F0-9]{12}$"));

/// Splits a PVE list value (`a,b;c d`) into its non-empty items.
pub fn split_list(text: &str) -> impl Iterator<Item = &str> {
    text.split([',', ';', ' ', '\0']).filter(|s| !s.is_empty())
}

/// Checks the named formats the simulator knows; unknown formats pass.
fn check_named_format(format: &str, v: &str, name: &str) -> Result<(), String> {
    let fail = |m: String| Err(m);
    match format {
        "pve-vmid" if !VMID.is_match(v) => fail("value does not look like a valid VM ID".into()),
        "pve-node" if !NODE.is_match(v) => fail("value does not look like a valid node name".into()),
        "pve-storage-id" if !STORAGE_ID.is_match(v) => {
            fail(format!("storage ID '{v}' contains illegal characters"))
        }
        "pve-configid" if !CONFIG_ID.is_match(v) => fail(format!("invalid configuration ID '{v}'")),
        "pve-configid-list" => match split_list(v).find(|id| !CONFIG_ID.is_match(id)) {
            Some(bad) => fail(format!("invalid configuration ID '{bad}'")),
            None => Ok(()),
        },
        "pve-poolid" if !POOL_ID.is_match(v) => fail(format!("pool name '{v}' contains illegal characters")),
        "dns-name" if !DNS_NAME.is_match(v) => fail("value does not look like a valid DNS name".into()),
        "mac-addr" if !MAC.is_match(v) => fail("value does not look like a valid unicast MAC address".into()),
        "pve-tag-list" => match split_list(v).find(|t| !TAG.is_match(t)) {
            Some(bad) => fail(format!("invalid tag '{bad}'")),
            None => Ok(()),
        },
        "urlencoded" if !URLENCODED.is_match(v) => fail(format!("invalid urlencoded string: {v}")),
        "pve-volume-id" if !VOLUME_ID.is_match(v) => fail(format!("unable to parse volume ID '{v}'")),
        "ip" if v.parse::<IpAddr>().is_err() => {
            fail(format!("value '{v}' does not look like a valid IP address"))
        }
        "ipv4" if v.parse::<Ipv4Addr>().is_err() => fail(String::from(
            "value '{v}' does not look like a valid IPv4 address",
        )),
        "ipv6" if v.parse::<Ipv6Addr>().is_err() => fail(String::from(
            "value '{v}' does not look like a valid IPv6 address",
        )),
        "CIDR" if parse_cidr(v).is_none() => {
            fail(String::from("value does not look like a valid CIDR network"))
        }
        "pve-qm-ipconfig" => check_keyed(v, name, &["ip", "gw", "ip6", "gw6"], |k, val| match k {
            "ip" if val != "dhcp" && !matches!(parse_cidr(val), Some((IpAddr::V4(_), _))) => Some(
                String::from("value does not look like a valid IPv4 network configuration"),
            ),
            "gw" if val.parse::<Ipv4Addr>().is_err() => Some(String::from(
                "value '{val}' does not look like a valid IPv4 address",
            )),
            "ip6"
                if val != "dhcp" && val != "auto" && !matches!(parse_cidr(val), Some((IpAddr::V6(_), _))) =>
            {
                Some(String::from(
                    "value does not look like a valid IPv6 network configuration",
                ))
            }
            "gw6" if val.parse::<Ipv6Addr>().is_err() => Some(String::from(
                "value '{val}' does not look like a valid IPv6 address",
            )),
            _ => None,
        }),
        "pve-qm-smbios1" => check_keyed(
            v,
            name,
            &[
                "base64",
                "family",
                "manufacturer",
                "product",
                "serial",
                "sku",
                "uuid",
                "version",
            ],
            |k, val| match k {
                "uuid" if !UUID.is_match(val) => {
                    Some(format!("value '{val}' does not look like a valid UUID"))
                }
                "base64" if val != "0" && val != "1" => {
                    Some(format!("type check ('boolean') failed - got '{val}'"))
                }
                _ => None,
            },
        ),
        _ => Ok(()),
    }
}

/// Checks a `key=value,...` string with a fixed key set (formats defined in Perl, not in the schema).
fn check_keyed(
    v: &str,
    name: &str,
    keys: &[&str],
    check: impl Fn(&str, &str) -> Option<String>,
) -> Result<(), String> {
    let mut errors = ParamErrors::new();
    for part in v.split(',').filter(|p| !p.is_empty()) {
        let Some((k, val)) = part.split_once('=') else {
            return Err(
                "invalid format - value without key, but schema does not define a default key\n".into(),
            );
        };
        if !keys.contains(&k) {
            errors.insert(format!("{name}.{k}"), UNDECLARED.to_owned());
        } else if let Some(msg) = check(k, val) {
            errors.insert(format!("{name}.{k}"), msg);
        }
    }
    if errors.is_empty() {
        return Ok(());
    }
    let mut msg = "invalid format - format error\n".to_owned();
    for (k, e) in errors {
        msg.push_str(&format!("{k}: {e}\n"));
    }
    Err(msg)
}

/// Parses `addr/prefix`.
pub fn parse_cidr(v: &str) -> Option<(IpAddr, u8)> {
    let (addr, prefix) = v.split_once('/')?;
    let addr: IpAddr = addr.parse().ok()?;
    let prefix: u8 = prefix.parse().ok()?;
    let max = if addr.is_ipv4() { 32 } else { 128 };
    (prefix <= max).then_some((addr, prefix))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;
    use serde_json::json;

    fn schema() -> Arc<ApiSchema> {
        shared_default().expect("schema loads")
    }

    fn params(pairs: &[(&str, Value)]) -> BTreeMap<String, Value> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), v.clone())).collect()
    }

    #[rstest]
    #[case("GET", "/version", "/version")]
    #[case("GET", "/nodes/pve1/qemu/100/config", "/nodes/{node}/qemu/{vmid}/config")]
    #[case("POST", "/nodes/pve1/qemu/100/clone", "/nodes/{node}/qemu/{vmid}/clone")]
    #[case(
        "DELETE",
        "/nodes/pve1/storage/local/content/local%3Aiso%2Fseed.iso",
        "/nodes/{node}/storage/{storage}/content/{volume}"
    )]
    #[case(
        "GET",
        "/nodes/pve1/tasks/UPID:pve1:0000:x/status",
        "/nodes/{node}/tasks/{upid}/status"
    )]
    fn finds_endpoints(#[case] method: &str, #[case] path: &str, #[case] template: &str) {
        let s = schema();
        let ep = s.find(method, path).expect("endpoint exists");
        assert_eq!(ep.template, template);
    }

    #[test]
    fn decodes_path_params() {
        let s = schema();
        let ep = s
            .find(
                "DELETE",
                "/nodes/pve1/storage/local/content/local%3Aiso%2Fseed.iso",
            )
            .unwrap();
        assert_eq!(ep.path_params["volume"], "local:iso/seed.iso");
        assert_eq!(ep.path_params["node"], "pve1");
    }

    #[rstest]
    #[case("GET", "/nope")]
    #[case("PUT", "/version")]
    #[case("GET", "/nodes/pve1/qemu/100/nosuch")]
    fn unknown_is_not_implemented(#[case] method: &str, #[case] path: &str) {
        let err = schema().find(method, path).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!("Method '{method} {path}' not implemented")
        );
    }

    #[rstest]
    #[case::undeclared(&[("node", json!("pve1")), ("vmid", json!("100")), ("bogus", json!("1"))], "bogus", UNDECLARED)]
    #[case::bad_int(&[("node", json!("pve1")), ("vmid", json!("abc"))], "vmid", "type check ('integer') failed - got 'abc'")]
    #[case::too_small(&[("node", json!("pve1")), ("vmid", json!("99"))], "vmid", "value must have a minimum value of 100")]
    #[case::bool_true_string(&[("node", json!("pve1")), ("vmid", json!(100)), ("onboot", json!("true"))], "onboot", "type check ('boolean') failed - got 'true'")]
    #[case::bad_enum(&[("node", json!("pve1")), ("vmid", json!(100)), ("ostype", json!("beos"))], "ostype", "value 'beos' does not have a value in the enumeration 'other, wxp, w2k, w2k3, w2k8, wvista, win7, win8, win10, win11, l24, l26, solaris'")]
    #[case::bad_node(&[("node", json!("-x")), ("vmid", json!(100))], "node", "value does not look like a valid node name")]
    #[case::bad_tag(&[("node", json!("pve1")), ("vmid", json!(100)), ("tags", json!("ok;Bad!"))], "tags", "invalid tag 'Bad!'")]
    #[case::long_description(&[("node", json!("pve1")), ("vmid", json!(100)), ("description", json!("x".repeat(8193)))], "description", "value may only be 8192 characters long")]
    #[case::net_unknown_key(&[("node", json!("pve1")), ("vmid", json!(100)), ("net0", json!("virtio,bridge=vmbr0,colour=red"))], "net0", "invalid format - format error\nnet0.colour: property is not defined in schema and the schema does not allow additional properties\n")]
    #[case::net_bad_tag(&[("node", json!("pve1")), ("vmid", json!(100)), ("net0", json!("virtio,bridge=vmbr0,tag=x"))], "net0", "invalid format - format error\nnet0.tag: type check ('integer') failed - got 'x'\n")]
    #[case::ipconfig(&[("node", json!("pve1")), ("vmid", json!(100)), ("ipconfig0", json!("ip=10.0.0.300/24"))], "ipconfig0", "invalid format - format error\nipconfig0.ip: value does not look like a valid IPv4 network configuration\n")]
    #[case::sshkeys(&[("node", json!("pve1")), ("vmid", json!(100)), ("sshkeys", json!("ssh-ed25519 AAAA"))], "sshkeys", "invalid urlencoded string: ssh-ed25519 AAAA")]
    #[case::index_out_of_range(&[("node", json!("pve1")), ("vmid", json!(100)), ("net0001", json!("virtio"))], "net0001", UNDECLARED)]
    fn config_post_errors(#[case] given: &[(&str, Value)], #[case] key: &str, #[case] msg: &str) {
        let s = schema();
        let ep = s.find("POST", "/nodes/pve1/qemu/100/config").unwrap();
        let errors = s.validate(ep.info, &params(given)).unwrap_err();
        assert_eq!(
            errors.get(key).map(String::as_str),
            Some(msg),
            "errors: {errors:?}"
        );
        assert_eq!(errors.len(), 1, "errors: {errors:?}");
    }

    #[test]
    fn valid_config_post_passes() {
        let s = schema();
        let ep = s.find("POST", "/nodes/pve1/qemu/100/config").unwrap();
        let given = params(&[
            ("node", json!("pve1")),
            ("vmid", json!("100")),
            ("net0", json!("virtio=BC:24:11:00:00:01,bridge=vmbr0,tag=5")),
            ("net1", json!("virtio,bridge=vmbr1")),
            ("ipconfig0", json!("ip=10.0.0.5/24,gw=10.0.0.1")),
            ("memory", json!("4096")),
            ("cores", json!(2)),
            ("onboot", json!(true)),
            ("agent", json!("1")),
            ("tags", json!("a;b,c")),
            ("sshkeys", json!("ssh-ed25519%20AAAA%2B%2F%3D%0A")),
            ("scsi0", json!("local-lvm:32")),
        ]);
        assert_eq!(s.validate(ep.info, &given), Ok(()));
    }

    #[test]
    fn missing_required_is_reported() {
        let s = schema();
        let ep = s.find("POST", "/nodes/pve1/qemu/100/clone").unwrap();
        let errors = s
            .validate(ep.info, &params(&[("node", json!("pve1")), ("vmid", json!(100))]))
            .unwrap_err();
        assert_eq!(errors.get("newid").map(String::as_str), Some(MISSING));
    }

    #[test]
    fn returns_checker_accepts_perl_typing_and_rejects_wrong_shapes() {
        let s = schema();
        let nextid = s.find("GET", "/cluster/nextid").unwrap();
        assert!(check_returns(nextid.returns(), &json!("100")).is_empty());
        assert!(!check_returns(nextid.returns(), &json!("abc")).is_empty());
        let status = s.find("GET", "/nodes/pve1/tasks/x/status").unwrap();
        let problems = check_returns(status.returns(), &json!({"status": "done"}));
        assert!(
            problems.iter().any(|p| p.starts_with("data.status: 'done'")),
            "{problems:?}"
        );
        assert!(problems.iter().any(|p| p == "data.upid: missing"), "{problems:?}");
    }

    #[test]
    fn property_string_aliases() {
        let s = schema();
        let ep = s.find("POST", "/nodes/pve1/qemu/100/config").unwrap();
        let net = &ep.info["parameters"]["properties"]["net[n]"]["format"];
        let parsed =
            parse_property_string(net.as_object().unwrap(), "virtio=BC:24:11:00:00:01,bridge=vmbr0").unwrap();
        assert_eq!(parsed["model"], "virtio");
        assert_eq!(parsed["macaddr"], "BC:24:11:00:00:01");
        assert_eq!(parsed["bridge"], "vmbr0");
    }
}
