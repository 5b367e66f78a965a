//! Every spec field of every CRD has one decision per backend (`banlieue_api::support`), the
//! docs' table is what the declarations say, and every refusal refuses.
//!
//! Regenerate `docs/field-support.md` with
//! `BANLIEUE_UPDATE_DOCS=1 cargo test -p banlieue-api --test support`.

use std::collections::BTreeSet;
use std::path::PathBuf;

use banlieue_api::banlieue::Backend;
use banlieue_api::crds;
use banlieue_api::support::{self, BACKENDS, Field, Kind, Refused, Support};
use serde_json::{Map, Value, json};

/// The `spec` schema of the CRD of `kind` (the kind's name).
fn spec_schema(kind: &str) -> Value {
    let crd = crds::all()
        .into_iter()
        .find(|c| c.spec.names.kind == kind)
        .unwrap_or_else(|| panic!("no CRD of kind {kind}"));
    let schema = crd.spec.versions[0]
        .schema
        .as_ref()
        .and_then(|s| s.open_api_v3_schema.as_ref())
        .expect("schema");
    serde_json::to_value(schema).expect("schema as JSON")["properties"]["spec"].clone()
}

fn declared(fields: &[Field]) -> BTreeSet<String> {
    fields.iter().map(|f| f.path.clone()).collect()
}

fn assert_same(what: &str, schema: &Value, fields: &[Field]) {
    let leaves: BTreeSet<String> = support::leaf_paths(schema).into_iter().collect();
    let paths = declared(fields);
    assert_eq!(paths.len(), fields.len(), "{what}: a field is declared twice");
    let missing: Vec<_> = leaves.difference(&paths).collect();
    let stray: Vec<_> = paths.difference(&leaves).collect();
    assert!(
        missing.is_empty() && stray.is_empty(),
        "{what}: fields without a decision {missing:?}; declared fields the schema does not have \
         {stray:?} (declare each in api/src/support/fields.rs)"
    );
}

#[test]
fn every_field_of_every_kind_has_a_decision_on_every_backend() {
    for backend in BACKENDS {
        for kind in Kind::ALL {
            let name = kind.name(backend);
            let fields = support::fields(kind, backend);
            assert_same(
                &format!("{name} on {}", backend.as_str()),
                &spec_schema(name),
                &fields,
            );
            if matches!(kind, Kind::Machine | Kind::Cluster) {
                let template = format!("{name}Template");
                let inner = spec_schema(&template)["properties"]["template"]["properties"]["spec"].clone();
                assert_same(&template, &inner, &fields);
            }
        }
    }
}

#[test]
fn the_docs_table_is_what_the_declarations_say() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/field-support.md");
    let table = support::markdown();
    if std::env::var_os("BANLIEUE_UPDATE_DOCS").is_some_and(|v| v == "1") {
        std::fs::write(&path, &table).expect("write docs/field-support.md");
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == table,
        "docs/field-support.md is out of date; regenerate with \
         BANLIEUE_UPDATE_DOCS=1 cargo test -p banlieue-api --test support"
    );
}

/// A sparse spec holding `value` at `path` (one element per list).
fn spec_with(path: &str, value: Value) -> Value {
    fn set(node: &mut Map<String, Value>, segments: &[&str], value: Value) {
        let (first, rest) = segments.split_first().expect("a segment");
        let (name, list) = match first.strip_suffix("[]") {
            Some(name) => (name, true),
            None => (*first, false),
        };
        if rest.is_empty() {
            let value = if list { json!([value]) } else { value };
            node.insert(name.to_owned(), value);
            return;
        }
        let mut child = Map::new();
        set(&mut child, rest, value);
        let child = Value::Object(child);
        node.insert(name.to_owned(), if list { json!([child]) } else { child });
    }
    let mut root = Map::new();
    let segments: Vec<&str> = path.split('.').collect();
    set(&mut root, &segments, value);
    Value::Object(root)
}

#[test]
fn every_refused_field_is_refused_with_its_name_and_a_reason() {
    let mut checked = 0;
    for backend in BACKENDS {
        for kind in Kind::ALL {
            let fields = support::fields(kind, backend);
            for field in &fields {
                let Support::Refused { values, why } = field.support else {
                    continue;
                };
                let value = match values {
                    Refused::Any => json!("set"),
                    Refused::Values(list) => json!(list[0]),
                };
                let refusals = support::refusals(&fields, &spec_with(&field.path, value));
                let expected = format!("spec.{}", field.path.replace("[]", "[0]"));
                assert!(
                    refusals
                        .iter()
                        .any(|r| r.field == expected && r.why == why && !why.is_empty()),
                    "{} on {}: {expected} not refused: {refusals:?}",
                    kind.name(backend),
                    backend.as_str()
                );
                checked += 1;
            }
        }
    }
    assert!(checked >= 3, "only {checked} refusals checked");
}

#[test]
fn an_honoured_value_of_a_refused_field_passes() {
    let fields = support::fields(Kind::VirtualMachineImage, Backend::Libvirt);
    assert!(support::refusals(&fields, &json!({"osType": "Linux"})).is_empty());
    assert_eq!(
        support::refusals(&fields, &json!({"osType": "Windows"}))[0].field,
        "spec.osType"
    );
}

#[test]
fn every_admission_refusal_is_a_cel_rule_of_the_kind() {
    fn messages(schema: &Value, out: &mut BTreeSet<String>) {
        if let Some(rules) = schema.get("x-kubernetes-validations").and_then(Value::as_array) {
            out.extend(
                rules
                    .iter()
                    .filter_map(|r| r["message"].as_str().map(str::to_owned)),
            );
        }
        for key in ["properties", "items"] {
            match schema.get(key) {
                Some(Value::Object(map)) if key == "properties" => {
                    map.values().for_each(|s| messages(s, out))
                }
                Some(items) if key == "items" => messages(items, out),
                _ => {}
            }
        }
    }
    for backend in BACKENDS {
        for kind in Kind::ALL {
            let name = kind.name(backend);
            let mut rules = BTreeSet::new();
            messages(&spec_schema(name), &mut rules);
            for field in support::fields(kind, backend) {
                if let Support::RefusedAtAdmission(message) = field.support {
                    assert!(
                        rules.contains(message),
                        "{name} on {}: {} says it is refused by the rule {message:?}, which the CRD lacks",
                        backend.as_str(),
                        field.path
                    );
                }
            }
        }
    }
}
