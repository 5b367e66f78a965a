//! Runs the validation table (`tests/validation/*.yaml`) in-process: the structural schema
//! checks of `banlieue_api::validation::check_structural` plus the CRDs' CEL rules evaluated
//! by `kube-cel`. The same table runs against a real kube-apiserver elsewhere.
//!
//! A kind's admission policy (`banlieue_api::policies`) is evaluated as the CEL rule it enforces
//! on a plain update.
//!
//! Known differences from the apiserver: kube-cel correlates `oldSelf` in lists by index (the
//! apiserver by list-map key), so update cases keep list order; metadata is not validated.

mod kinds;

use banlieue_api::{crds, validation};
use serde_json::Value;

/// A kind's schema with its CEL rules compiled once.
struct Kind {
    schema: Value,
    compiled: kube_cel::CompiledSchema,
}

fn errors_for(cel: &kube_cel::Validator, kind: &Kind, object: &Value, old: Option<&Value>) -> Vec<String> {
    let mut errors: Vec<String> = validation::check_structural(&kind.schema, object)
        .iter()
        .map(ToString::to_string)
        .collect();
    if let Err(failed) = cel.validate_compiled(&kind.compiled, object, old) {
        errors.extend(failed.iter().map(|e| format!("{}: {}", e.field_path, e.message)));
    }
    errors
}

#[test]
fn table_covers_every_kind() {
    let cases = validation::load().expect("table loads");
    for crd in crds::all() {
        let kind = &crd.spec.names.kind;
        assert!(
            cases.iter().any(|c| &c.kind == kind && c.valid),
            "no valid case for {kind}"
        );
    }
    let invalid = cases.iter().filter(|c| !c.valid).count();
    assert!(
        invalid >= 60,
        "expected a substantial table of invalid cases, found {invalid}"
    );
}

/// Every CEL rule of every CRD is exercised: some invalid case expects (part of) its message.
#[test]
fn every_cel_rule_has_an_invalid_case() {
    fn messages(schema: &Value, out: &mut std::collections::BTreeSet<String>) {
        if let Some(rules) = schema.get("x-kubernetes-validations").and_then(Value::as_array) {
            out.extend(
                rules
                    .iter()
                    .filter_map(|r| r["message"].as_str().map(str::to_owned)),
            );
        }
        match schema {
            Value::Object(map) => map.values().for_each(|v| messages(v, out)),
            Value::Array(items) => items.iter().for_each(|v| messages(v, out)),
            _ => {}
        }
    }
    let mut all = std::collections::BTreeSet::new();
    for crd in crds::all() {
        messages(&crds::schema_of(&crd.spec.names.kind).expect("schema"), &mut all);
    }
    let cases = validation::load().expect("table loads");
    let expected: Vec<&str> = cases
        .iter()
        .filter(|c| !c.valid)
        .filter_map(|c| c.message.as_deref())
        .collect();
    let untested: Vec<&String> = all
        .iter()
        .filter(|m| !expected.iter().any(|e| m.contains(e)))
        .collect();
    assert!(
        untested.is_empty(),
        "CEL rules without an invalid case: {untested:#?}"
    );
    assert!(all.len() >= 30, "found only {} distinct rule messages", all.len());
}

#[test]
fn table_holds_in_process() {
    let cases = validation::load().expect("table loads");
    let cel = kube_cel::Validator::new();
    let mut kinds_seen: std::collections::BTreeMap<String, Kind> = Default::default();
    let mut failures = Vec::new();
    for case in &cases {
        let id = format!("{}: {}", case.kind, case.name);
        if !kinds_seen.contains_key(&case.kind) {
            let Some(mut schema) = crds::schema_of(&case.kind) else {
                failures.push(format!("{id}: no CRD for kind"));
                continue;
            };
            // A kind's admission policy holds on a plain update as the rule it enforces would.
            if let Some(template) = banlieue_api::policies::immutable_template(&case.kind) {
                let rules = &mut schema["properties"]["spec"]["x-kubernetes-validations"];
                let rule = serde_json::json!({
                    "rule": banlieue_api::policies::ImmutableTemplate::RULE,
                    "message": template.message(),
                });
                match rules.as_array_mut() {
                    Some(list) => list.push(rule),
                    None => *rules = serde_json::json!([rule]),
                }
            }
            let compiled = kube_cel::compile_schema(&schema);
            kinds_seen.insert(case.kind.clone(), Kind { schema, compiled });
        }
        let kind = &kinds_seen[&case.kind];
        if let Some(old) = &case.old_object {
            let errors = errors_for(&cel, kind, old, None);
            if !errors.is_empty() {
                failures.push(format!(
                    "{id}: the object to update is itself rejected: {errors:?}"
                ));
                continue;
            }
        }
        let errors = errors_for(&cel, kind, &case.object, case.old_object.as_ref());
        match (case.valid, &case.message) {
            (true, _) if !errors.is_empty() => failures.push(format!("{id}: expected valid, got {errors:?}")),
            (true, _) => {
                if let Err(e) = kinds::through_rust(&case.kind, &case.object) {
                    failures.push(format!(
                        "{id}: valid object does not parse into the Rust type: {e}"
                    ));
                }
            }
            (false, Some(message)) if !errors.iter().any(|e| e.contains(message.as_str())) => {
                failures.push(format!(
                    "{id}: expected an error containing {message:?}, got {errors:?}"
                ));
            }
            _ => {}
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}
