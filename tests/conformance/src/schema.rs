//! Reading CRD `openAPIV3Schema`s as JSON: dotted paths (`status.addresses[].type`) and the
//! "can CAPI store what we publish" comparison between one of our fields and the CAPI field it is
//! copied to.

use serde_json::Value;

/// The schema at `path` below `root`: segments are property names separated by `.`; a segment
/// ending in `[]` steps into the array's `items`. `None` when any step is missing.
pub fn at<'a>(root: &'a Value, path: &str) -> Option<&'a Value> {
    let mut node = root;
    for segment in path.split('.') {
        let (name, into_items) = match segment.strip_suffix("[]") {
            Some(name) => (name, true),
            None => (segment, false),
        };
        node = node.get("properties")?.get(name)?;
        if into_items {
            node = node.get("items")?;
        }
    }
    Some(node)
}

/// The schema's `type`, if it declares one.
pub fn type_of(schema: &Value) -> Option<&str> {
    schema.get("type").and_then(Value::as_str)
}

fn number(schema: &Value, key: &str) -> Option<i64> {
    schema.get(key).and_then(Value::as_i64)
}

/// Problems that would make a value valid in `ours` fail (or be pruned) in `theirs`: a CAPI
/// controller copies the value from our object into its own, and its CRD is the one that
/// validates. Checked: types, string length bounds, enums, integer ranges, `maxItems`, unknown
/// properties, map value types, recursively. Patterns are not compared.
pub fn copy_problems(ours: &Value, theirs: &Value, path: &str) -> Vec<String> {
    let mut problems = Vec::new();
    compare(ours, theirs, path, &mut problems);
    problems
}

fn compare(ours: &Value, theirs: &Value, path: &str, problems: &mut Vec<String>) {
    let (our_type, their_type) = (type_of(ours), type_of(theirs));
    if their_type.is_some() && our_type != their_type {
        problems.push(format!(
            "{path}: type {} here, {} in CAPI",
            our_type.unwrap_or("(none)"),
            their_type.unwrap_or("(none)")
        ));
        return;
    }
    if let Some(max) = number(theirs, "maxLength") {
        match number(ours, "maxLength") {
            None => problems.push(format!("{path}: no maxLength here, CAPI allows at most {max}")),
            Some(m) if m > max => problems.push(format!("{path}: maxLength {m} here, CAPI {max}")),
            Some(_) => {}
        }
    }
    if let Some(min) = number(theirs, "minLength") {
        let m = number(ours, "minLength").unwrap_or(0);
        if m < min {
            problems.push(format!("{path}: minLength {m} here, CAPI needs {min}"));
        }
    }
    if let Some(max) = number(theirs, "maximum") {
        match number(ours, "maximum") {
            Some(m) if m <= max => {}
            m => problems.push(format!("{path}: maximum {m:?} here, CAPI {max}")),
        }
    }
    if let Some(min) = number(theirs, "minimum") {
        match number(ours, "minimum") {
            Some(m) if m >= min => {}
            m => problems.push(format!("{path}: minimum {m:?} here, CAPI {min}")),
        }
    }
    if let Some(max) = number(theirs, "maxItems") {
        match number(ours, "maxItems") {
            Some(m) if m <= max => {}
            m => problems.push(format!("{path}: maxItems {m:?} here, CAPI {max}")),
        }
    }
    if let Some(their_enum) = theirs.get("enum").and_then(Value::as_array) {
        match ours.get("enum").and_then(Value::as_array) {
            None => problems.push(format!("{path}: any value here, CAPI allows only {their_enum:?}")),
            Some(our_enum) => {
                for value in our_enum.iter().filter(|v| !their_enum.contains(v)) {
                    problems.push(format!("{path}: {value} allowed here, not in CAPI's enum"));
                }
            }
        }
    }
    if let (Some(our_items), Some(their_items)) = (ours.get("items"), theirs.get("items")) {
        compare(our_items, their_items, &format!("{path}[]"), problems);
    }
    if let Some(their_props) = theirs.get("properties").and_then(Value::as_object)
        && let Some(our_props) = ours.get("properties").and_then(Value::as_object)
    {
        for (name, our_prop) in our_props {
            match their_props.get(name) {
                None => problems.push(format!("{path}.{name}: not a field in CAPI's schema (pruned)")),
                Some(their_prop) => compare(our_prop, their_prop, &format!("{path}.{name}"), problems),
            }
        }
    }
    if let (Some(ours_ap), Some(theirs_ap)) = (
        ours.get("additionalProperties").filter(|v| v.is_object()),
        theirs.get("additionalProperties").filter(|v| v.is_object()),
    ) {
        compare(ours_ap, theirs_ap, &format!("{path}{{*}}"), problems);
    }
}

/// Kubernetes API version ordering (`v1` > `v1beta2` > `v1beta1` > `v1alpha1`), as a sort key;
/// `None` for a name that is not a Kubernetes version.
pub fn version_priority(version: &str) -> Option<(u8, u32, u32)> {
    let rest = version.strip_prefix('v')?;
    let digits_end = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
    let major: u32 = rest[..digits_end].parse().ok()?;
    let tail = &rest[digits_end..];
    if tail.is_empty() {
        return Some((2, major, 0));
    }
    let (stage, minor) = if let Some(m) = tail.strip_prefix("beta") {
        (1, m)
    } else if let Some(m) = tail.strip_prefix("alpha") {
        (0, m)
    } else {
        return None;
    };
    Some((stage, major, minor.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn paths_step_through_properties_and_items() {
        let schema = json!({"properties": {"status": {"properties": {"addresses": {
            "type": "array", "items": {"properties": {"type": {"type": "string"}}}}}}}});
        assert_eq!(
            at(&schema, "status.addresses[].type").and_then(type_of),
            Some("string")
        );
        assert_eq!(at(&schema, "status.addresses").and_then(type_of), Some("array"));
        assert!(at(&schema, "status.failureDomain").is_none());
        assert!(at(&schema, "spec.providerID").is_none());
    }

    #[test]
    fn copy_check_finds_what_capi_would_reject() {
        let theirs = json!({"type": "object", "properties": {
            "host": {"type": "string", "maxLength": 512, "minLength": 1},
            "port": {"type": "integer", "minimum": 1, "maximum": 65535},
            "kind": {"type": "string", "enum": ["A", "B"]}}});
        let fine = json!({"type": "object", "properties": {
            "host": {"type": "string", "maxLength": 253, "minLength": 1},
            "port": {"type": "integer", "minimum": 1, "maximum": 65535},
            "kind": {"type": "string", "enum": ["A"]}}});
        assert_eq!(copy_problems(&fine, &theirs, "ep"), Vec::<String>::new());
        let bad = json!({"type": "object", "properties": {
            "host": {"type": "string"},
            "port": {"type": "string"},
            "kind": {"type": "string", "enum": ["A", "C"]},
            "extra": {"type": "string"}}});
        let problems = copy_problems(&bad, &theirs, "ep");
        assert_eq!(problems.len(), 5, "{problems:#?}");
        assert!(problems.iter().any(|p| p.contains("ep.host: no maxLength")));
        assert!(problems.iter().any(|p| p.contains("ep.host: minLength 0")));
        assert!(
            problems
                .iter()
                .any(|p| p.contains("ep.port: type string here, integer"))
        );
        assert!(problems.iter().any(|p| p.contains("\"C\" allowed here")));
        assert!(problems.iter().any(|p| p.contains("ep.extra: not a field")));
    }

    #[test]
    fn a_map_where_capi_expects_a_list_is_a_type_problem() {
        let theirs = json!({"type": "array", "maxItems": 100, "items": {"type": "object"}});
        let v1beta1_style = json!({"type": "object", "additionalProperties": {"type": "object"}});
        let problems = copy_problems(&v1beta1_style, &theirs, "status.failureDomains");
        assert_eq!(
            problems,
            ["status.failureDomains: type object here, array in CAPI"]
        );
    }

    #[test]
    fn kubernetes_version_order() {
        let mut versions = vec!["v1alpha1", "v1", "v1beta2", "v2alpha1", "v1beta1", "v1alpha2"];
        versions.sort_by_key(|v| version_priority(v));
        assert_eq!(
            versions,
            ["v1alpha1", "v1alpha2", "v2alpha1", "v1beta1", "v1beta2", "v1"]
        );
        assert_eq!(version_priority("latest"), None);
        assert_eq!(version_priority("v1gamma1"), None);
    }
}
