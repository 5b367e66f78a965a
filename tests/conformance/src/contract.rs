//! The CAPI v1beta2 provider contract (`shared/CAPI-CONTRACT.md`) as data, and the static check
//! of a CRD against it: what CAPI reads from an InfraCluster / InfraMachine / template, at which
//! JSON path, with which type, what must be absent, and whether what CAPI copies into its own
//! objects fits CAPI's own CRD.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde_json::Value;

use crate::report::Outcome;
use crate::schema;

/// CRD label naming the served versions that implement contract v1beta2.
pub const CONTRACT_LABEL: &str = "cluster.x-k8s.io/v1beta2";

/// The contract role a provider kind plays.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// `<X>Cluster`, referenced by a Cluster's `spec.infrastructureRef`.
    InfraCluster,
    /// `<X>Machine`, referenced by a Machine's `spec.infrastructureRef`.
    InfraMachine,
    /// `<X>ClusterTemplate`, for ClusterClass.
    InfraClusterTemplate,
    /// `<X>MachineTemplate`, cloned by MachineSets and control planes.
    InfraMachineTemplate,
}

impl Role {
    /// The role implied by the kind's name (`ProxmoxMachineTemplate` → InfraMachineTemplate).
    pub fn of_kind(kind: &str) -> Option<Self> {
        if kind.ends_with("ClusterTemplate") {
            Some(Self::InfraClusterTemplate)
        } else if kind.ends_with("MachineTemplate") {
            Some(Self::InfraMachineTemplate)
        } else if kind.ends_with("Cluster") {
            Some(Self::InfraCluster)
        } else if kind.ends_with("Machine") {
            Some(Self::InfraMachine)
        } else {
            None
        }
    }

    fn is_template(self) -> bool {
        matches!(self, Self::InfraClusterTemplate | Self::InfraMachineTemplate)
    }
}

/// The JSON shape a field must have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// `type: string`.
    String,
    /// `type: boolean`.
    Bool,
    /// `type: integer`.
    Integer,
    /// `type: object`.
    Object,
    /// `type: array` (a v1beta1-style map here is a reconcile error in CAPI).
    List,
    /// `type: object` with string values.
    StringMap,
    /// `type: object` with int-or-string values (a `ResourceList`).
    QuantityMap,
    /// A `metav1.Condition` list keyed by `type`.
    Conditions,
    /// Must not exist: CAPI reads it with a meaning we must not trigger.
    Absent,
}

/// One field CAPI reads (or must not find).
#[derive(Debug, Clone, Copy)]
pub struct FieldRule {
    /// Dotted path from the object root; `[]` steps into list items.
    pub path: &'static str,
    /// Required shape.
    pub shape: Shape,
    /// Whether the provider must publish it (else: optional, checked when present).
    pub required: bool,
    /// What CAPI does with it.
    pub why: &'static str,
}

const fn rule(path: &'static str, shape: Shape, required: bool, why: &'static str) -> FieldRule {
    FieldRule {
        path,
        shape,
        required,
        why,
    }
}

const MACHINE_RULES: &[FieldRule] = &[
    rule(
        "spec.providerID",
        Shape::String,
        true,
        "copied to Machine spec.providerID, matched against the Node",
    ),
    rule(
        "status.initialization.provisioned",
        Shape::Bool,
        true,
        "→ Machine status.initialization.infrastructureProvisioned",
    ),
    rule(
        "status.addresses",
        Shape::List,
        false,
        "replaces Machine status.addresses",
    ),
    rule(
        "status.addresses[].type",
        Shape::String,
        false,
        "MachineAddress type",
    ),
    rule(
        "status.addresses[].address",
        Shape::String,
        false,
        "MachineAddress address",
    ),
    rule(
        "status.failureDomain",
        Shape::String,
        false,
        "→ Machine status.failureDomain",
    ),
    rule(
        "status.interruptible",
        Shape::Bool,
        false,
        "labels the Node cluster.x-k8s.io/interruptible",
    ),
    rule(
        "status.conditions",
        Shape::Conditions,
        true,
        "Ready is mirrored as the Machine's InfrastructureReady",
    ),
    rule(
        "spec.failureDomain",
        Shape::Absent,
        false,
        "deprecated: if present (even \"\") CAPI overwrites the Machine's",
    ),
    rule(
        "status.v1beta2",
        Shape::Absent,
        false,
        "CAPI reads status.v1beta2.conditions before status.conditions",
    ),
    rule(
        "status.failureReason",
        Shape::Absent,
        false,
        "v1beta1 terminal failure field",
    ),
    rule(
        "status.failureMessage",
        Shape::Absent,
        false,
        "v1beta1 terminal failure field",
    ),
];

const CLUSTER_RULES: &[FieldRule] = &[
    rule(
        "status.initialization.provisioned",
        Shape::Bool,
        true,
        "→ Cluster status.initialization.infrastructureProvisioned",
    ),
    rule(
        "spec.controlPlaneEndpoint",
        Shape::Object,
        false,
        "copied to the Cluster when the Cluster has none",
    ),
    rule(
        "spec.controlPlaneEndpoint.host",
        Shape::String,
        false,
        "APIEndpoint host",
    ),
    rule(
        "spec.controlPlaneEndpoint.port",
        Shape::Integer,
        false,
        "APIEndpoint port",
    ),
    rule(
        "status.failureDomains",
        Shape::List,
        false,
        "copied to the Cluster sorted by name (a map is a reconcile error)",
    ),
    rule(
        "status.failureDomains[].name",
        Shape::String,
        false,
        "failure domain name (list key)",
    ),
    rule(
        "status.failureDomains[].controlPlane",
        Shape::Bool,
        false,
        "usable by control plane machines",
    ),
    rule(
        "status.failureDomains[].attributes",
        Shape::StringMap,
        false,
        "free-form attributes",
    ),
    rule(
        "status.conditions",
        Shape::Conditions,
        true,
        "Ready is mirrored as the Cluster's InfrastructureReady",
    ),
    rule(
        "status.v1beta2",
        Shape::Absent,
        false,
        "CAPI reads status.v1beta2.conditions before status.conditions",
    ),
    rule(
        "status.failureReason",
        Shape::Absent,
        false,
        "v1beta1 terminal failure field",
    ),
    rule(
        "status.failureMessage",
        Shape::Absent,
        false,
        "v1beta1 terminal failure field",
    ),
];

const TEMPLATE_RULES: &[FieldRule] = &[
    rule(
        "spec.template.spec",
        Shape::Object,
        true,
        "cloned verbatim into the new object's spec",
    ),
    rule(
        "spec.template.metadata.labels",
        Shape::StringMap,
        false,
        "cloned onto the new object",
    ),
    rule(
        "spec.template.metadata.annotations",
        Shape::StringMap,
        false,
        "cloned onto the new object",
    ),
];

const MACHINE_TEMPLATE_RULES: &[FieldRule] = &[
    rule(
        "status.capacity",
        Shape::QuantityMap,
        false,
        "cluster-autoscaler scale from zero",
    ),
    rule(
        "status.nodeInfo.architecture",
        Shape::String,
        false,
        "cluster-autoscaler scale from zero",
    ),
    rule(
        "status.nodeInfo.operatingSystem",
        Shape::String,
        false,
        "cluster-autoscaler scale from zero",
    ),
];

/// Field rules for a role.
pub fn rules(role: Role) -> Vec<FieldRule> {
    match role {
        Role::InfraMachine => MACHINE_RULES.to_vec(),
        Role::InfraCluster => CLUSTER_RULES.to_vec(),
        Role::InfraClusterTemplate => TEMPLATE_RULES.to_vec(),
        Role::InfraMachineTemplate => [TEMPLATE_RULES, MACHINE_TEMPLATE_RULES].concat(),
    }
}

/// A field CAPI copies from a provider object into one of its own.
#[derive(Debug, Clone, Copy)]
pub struct CopiedField {
    /// The role of the source object.
    pub role: Role,
    /// Path in the provider object.
    pub from: &'static str,
    /// CAPI's CRD file (under `capi/v1.14/crds/`).
    pub capi_crd: &'static str,
    /// Path in CAPI's object.
    pub to: &'static str,
}

/// Every copy CAPI v1.14 makes from an infrastructure object.
pub const COPIES: &[CopiedField] = &[
    CopiedField {
        role: Role::InfraMachine,
        from: "spec.providerID",
        capi_crd: "cluster.x-k8s.io_machines.yaml",
        to: "spec.providerID",
    },
    CopiedField {
        role: Role::InfraMachine,
        from: "status.addresses",
        capi_crd: "cluster.x-k8s.io_machines.yaml",
        to: "status.addresses",
    },
    CopiedField {
        role: Role::InfraMachine,
        from: "status.failureDomain",
        capi_crd: "cluster.x-k8s.io_machines.yaml",
        to: "status.failureDomain",
    },
    CopiedField {
        role: Role::InfraCluster,
        from: "spec.controlPlaneEndpoint",
        capi_crd: "cluster.x-k8s.io_clusters.yaml",
        to: "spec.controlPlaneEndpoint",
    },
    CopiedField {
        role: Role::InfraCluster,
        from: "status.failureDomains",
        capi_crd: "cluster.x-k8s.io_clusters.yaml",
        to: "status.failureDomains",
    },
];

/// One checked statement about one CRD.
#[derive(Debug, Clone, PartialEq)]
pub struct Finding {
    /// What was checked (`spec.providerID is string`).
    pub check: String,
    /// Result.
    pub outcome: Outcome,
}

fn finding(check: impl Into<String>, outcome: Outcome) -> Finding {
    Finding {
        check: check.into(),
        outcome,
    }
}

/// The `openAPIV3Schema` of the version CAPI uses (the highest one in the contract label), as
/// JSON; falls back to the storage version.
pub fn contract_schema(crd: &CustomResourceDefinition) -> Option<Value> {
    let wanted = contract_versions(crd)
        .into_iter()
        .max_by_key(|v| schema::version_priority(v));
    let version = crd
        .spec
        .versions
        .iter()
        .find(|v| Some(&v.name) == wanted.as_ref())
        .or_else(|| crd.spec.versions.iter().find(|v| v.storage))?;
    serde_json::to_value(version.schema.as_ref()?.open_api_v3_schema.as_ref()?).ok()
}

fn contract_versions(crd: &CustomResourceDefinition) -> Vec<String> {
    crd.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(CONTRACT_LABEL))
        .map(|v| v.split('_').map(str::to_owned).collect())
        .unwrap_or_default()
}

/// The CRD-level checks: name, scope, list kind, status subresource, contract label.
pub fn check_crd_shape(crd: &CustomResourceDefinition, role: Role) -> Vec<Finding> {
    let names = &crd.spec.names;
    let mut out = Vec::new();
    let expected = format!("{}.{}", names.plural, crd.spec.group);
    let name = crd.metadata.name.clone().unwrap_or_default();
    out.push(finding(
        "CRD name is <plural>.<group> (clusterctl refuses others)",
        if name == expected {
            Outcome::pass(&name)
        } else {
            Outcome::fail(format!("{name} != {expected}"))
        },
    ));
    out.push(finding(
        "namespaced",
        if crd.spec.scope == "Namespaced" {
            Outcome::pass("")
        } else {
            Outcome::fail(format!("scope {}", crd.spec.scope))
        },
    ));
    let list_kind = names
        .list_kind
        .clone()
        .unwrap_or_else(|| format!("{}List", names.kind));
    out.push(finding(
        "list kind is <Kind>List",
        if list_kind == format!("{}List", names.kind) {
            Outcome::pass(&list_kind)
        } else {
            Outcome::fail(list_kind)
        },
    ));
    if !role.is_template() {
        let all_have_status = crd
            .spec
            .versions
            .iter()
            .all(|v| v.subresources.as_ref().is_some_and(|s| s.status.is_some()));
        out.push(finding(
            "status subresource",
            if all_have_status {
                Outcome::pass("")
            } else {
                Outcome::fail("a served version has no status subresource")
            },
        ));
    }
    let versions = contract_versions(crd);
    let outcome = if versions.is_empty() {
        Outcome::fail(format!("no label {CONTRACT_LABEL}"))
    } else if let Some(unknown) = versions
        .iter()
        .find(|v| !crd.spec.versions.iter().any(|s| &&s.name == v && s.served))
    {
        Outcome::fail(format!("label names {unknown}, which is not a served version"))
    } else {
        let highest = versions.iter().max_by_key(|v| schema::version_priority(v));
        Outcome::pass(format!(
            "{CONTRACT_LABEL}: {} (CAPI uses {})",
            versions.join("_"),
            highest.map_or("?", String::as_str)
        ))
    };
    out.push(finding("contract label names served versions", outcome));
    out
}

/// The field rules of `role` against `schema` (an `openAPIV3Schema` as JSON).
pub fn check_fields(schema_root: &Value, role: Role) -> Vec<Finding> {
    rules(role)
        .into_iter()
        .map(|rule| {
            let found = schema::at(schema_root, rule.path);
            let label = match rule.shape {
                Shape::Absent => format!("{} absent ({})", rule.path, rule.why),
                shape => format!("{} is {shape:?} ({})", rule.path, rule.why),
            };
            let outcome = match (found, rule.shape) {
                (None, Shape::Absent) => Outcome::pass("absent"),
                (Some(_), Shape::Absent) => Outcome::fail("present"),
                (None, _) if rule.required => Outcome::fail("missing"),
                (None, _) => Outcome::skip("optional, not published"),
                (Some(node), shape) => match shape_problem(node, shape) {
                    None => Outcome::pass(describe(node)),
                    Some(problem) => Outcome::fail(problem),
                },
            };
            finding(label, outcome)
        })
        .collect()
}

fn describe(node: &Value) -> String {
    let mut text = schema::type_of(node).unwrap_or("(untyped)").to_owned();
    for key in ["maxLength", "minimum", "maximum", "maxItems"] {
        if let Some(v) = node.get(key) {
            text.push_str(&format!(", {key} {v}"));
        }
    }
    if let Some(values) = node.get("enum").and_then(Value::as_array) {
        text.push_str(&format!(", enum of {}", values.len()));
    }
    text
}

fn shape_problem(node: &Value, shape: Shape) -> Option<String> {
    let ty = schema::type_of(node);
    let want = |expected: &str| (ty != Some(expected)).then(|| format!("type {ty:?}, want {expected}"));
    match shape {
        Shape::String => want("string"),
        Shape::Bool => want("boolean"),
        Shape::Integer => want("integer"),
        Shape::Object => want("object"),
        Shape::List => want("array"),
        Shape::StringMap => want("object").or_else(|| {
            let values = node.get("additionalProperties").and_then(schema::type_of);
            (values != Some("string")).then(|| format!("map values {values:?}, want string"))
        }),
        Shape::QuantityMap => want("object").or_else(|| {
            let int_or_string = node
                .get("additionalProperties")
                .and_then(|v| v.get("x-kubernetes-int-or-string"))
                .and_then(Value::as_bool);
            (int_or_string != Some(true)).then(|| "map values are not int-or-string quantities".to_owned())
        }),
        Shape::Conditions => want("array").or_else(|| conditions_problem(node)),
        Shape::Absent => Some("present".to_owned()),
    }
}

fn conditions_problem(node: &Value) -> Option<String> {
    if node.get("x-kubernetes-list-type").and_then(Value::as_str) != Some("map") {
        return Some("not x-kubernetes-list-type: map".into());
    }
    if node.get("x-kubernetes-list-map-keys") != Some(&serde_json::json!(["type"])) {
        return Some("list-map keys are not [type]".into());
    }
    let items = node.get("items")?;
    for (field, ty) in [
        ("type", "string"),
        ("status", "string"),
        ("reason", "string"),
        ("message", "string"),
        ("lastTransitionTime", "string"),
        ("observedGeneration", "integer"),
    ] {
        let found = items
            .get("properties")
            .and_then(|p| p.get(field))
            .and_then(schema::type_of);
        if found != Some(ty) {
            return Some(format!("condition field {field}: {found:?}, want {ty}"));
        }
    }
    None
}

/// For a template kind: `spec.template.spec` has exactly the fields of the object kind's `spec`
/// (CAPI clones it verbatim), each with the same type.
pub fn check_template_mirrors(template_schema: &Value, object_schema: &Value, object_kind: &str) -> Finding {
    let label = format!("spec.template.spec mirrors {object_kind}.spec (cloned verbatim)");
    let (Some(template), Some(object)) = (
        schema::at(template_schema, "spec.template.spec").and_then(|s| s.get("properties")),
        schema::at(object_schema, "spec").and_then(|s| s.get("properties")),
    ) else {
        return finding(label, Outcome::fail("a spec without properties"));
    };
    let (Some(template), Some(object)) = (template.as_object(), object.as_object()) else {
        return finding(label, Outcome::fail("properties are not objects"));
    };
    let mut problems = Vec::new();
    for (name, prop) in object {
        match template.get(name) {
            None => problems.push(format!("{name} missing in the template")),
            Some(t) if schema::type_of(t) != schema::type_of(prop) => {
                problems.push(format!("{name}: type differs"));
            }
            Some(_) => {}
        }
    }
    for name in template.keys().filter(|n| !object.contains_key(*n)) {
        problems.push(format!(
            "{name} only in the template (would be pruned or rejected)"
        ));
    }
    let outcome = if problems.is_empty() {
        Outcome::pass(format!("{} fields", object.len()))
    } else {
        Outcome::fail(problems.join("; "))
    };
    finding(label, outcome)
}

/// For every [`COPIES`] entry of `role`: the value fits CAPI's field (see
/// [`schema::copy_problems`]). `capi_schema(file)` returns the `openAPIV3Schema` of CAPI's
/// v1beta2 version in that CRD file.
pub fn check_copies(
    schema_root: &Value,
    role: Role,
    capi_schema: &dyn Fn(&str) -> Option<Value>,
) -> Vec<Finding> {
    COPIES
        .iter()
        .filter(|c| c.role == role)
        .map(|copy| {
            let target = copy.capi_crd.trim_end_matches(".yaml");
            let label = format!("{} fits CAPI {target} {}", copy.from, copy.to);
            let outcome = match (
                schema::at(schema_root, copy.from),
                capi_schema(copy.capi_crd)
                    .as_ref()
                    .and_then(|s| schema::at(s, copy.to).cloned()),
            ) {
                (None, _) => Outcome::skip("not published"),
                (_, None) => Outcome::fail(format!("{} not found in CAPI's CRD", copy.to)),
                (Some(ours), Some(theirs)) => {
                    let problems = schema::copy_problems(ours, &theirs, copy.from);
                    if problems.is_empty() {
                        Outcome::pass("")
                    } else {
                        Outcome::fail(problems.join("; "))
                    }
                }
            };
            finding(label, outcome)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn conditions() -> Value {
        json!({"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"],
            "items": {"properties": {
                "type": {"type": "string"}, "status": {"type": "string"}, "reason": {"type": "string"},
                "message": {"type": "string"}, "lastTransitionTime": {"type": "string"},
                "observedGeneration": {"type": "integer"}}}})
    }

    fn failures(findings: &[Finding]) -> Vec<String> {
        findings
            .iter()
            .filter(|f| f.outcome.is_fail())
            .map(|f| f.check.clone())
            .collect()
    }

    #[test]
    fn roles_from_kind_names() {
        assert_eq!(
            Role::of_kind("ProxmoxMachineTemplate"),
            Some(Role::InfraMachineTemplate)
        );
        assert_eq!(
            Role::of_kind("VSphereClusterTemplate"),
            Some(Role::InfraClusterTemplate)
        );
        assert_eq!(Role::of_kind("LibvirtCluster"), Some(Role::InfraCluster));
        assert_eq!(Role::of_kind("ProxmoxMachine"), Some(Role::InfraMachine));
        assert_eq!(Role::of_kind("VirtualMachineImage"), None);
    }

    #[test]
    fn a_conforming_machine_schema_passes() {
        let schema = json!({"properties": {
            "spec": {"properties": {"providerID": {"type": "string"}}},
            "status": {"properties": {
                "initialization": {"properties": {"provisioned": {"type": "boolean"}}},
                "conditions": conditions()}}}});
        assert_eq!(
            failures(&check_fields(&schema, Role::InfraMachine)),
            Vec::<String>::new()
        );
    }

    #[test]
    fn v1beta1_leftovers_and_wrong_types_fail() {
        let schema = json!({"properties": {
            "spec": {"properties": {"providerID": {"type": "string"}, "failureDomain": {"type": "string"}}},
            "status": {"properties": {
                "ready": {"type": "boolean"},
                "failureDomain": {"type": "object"},
                "conditions": {"type": "array", "items": {}}}}}});
        let failed = failures(&check_fields(&schema, Role::InfraMachine));
        assert_eq!(failed.len(), 4, "{failed:#?}");
        assert!(failed[0].starts_with("status.initialization.provisioned"));
        assert!(failed[1].starts_with("status.failureDomain is String"));
        assert!(failed[2].starts_with("status.conditions"));
        assert!(failed[3].starts_with("spec.failureDomain absent"));
    }

    #[test]
    fn failure_domains_as_a_map_fail() {
        let schema = json!({"properties": {"status": {"properties": {
            "initialization": {"properties": {"provisioned": {"type": "boolean"}}},
            "conditions": conditions(),
            "failureDomains": {"type": "object", "additionalProperties": {"type": "object"}}}}}});
        let failed = failures(&check_fields(&schema, Role::InfraCluster));
        assert_eq!(failed.len(), 1, "{failed:#?}");
        assert!(failed[0].starts_with("status.failureDomains is List"));
    }

    #[test]
    fn template_mirror_finds_missing_and_extra_fields() {
        let object = json!({"properties": {"spec": {"properties": {
            "a": {"type": "string"}, "b": {"type": "integer"}}}}});
        let same = json!({"properties": {"spec": {"properties": {"template": {"properties": {"spec": {
            "properties": {"a": {"type": "string"}, "b": {"type": "integer"}}}}}}}}});
        assert!(!check_template_mirrors(&same, &object, "X").outcome.is_fail());
        let off = json!({"properties": {"spec": {"properties": {"template": {"properties": {"spec": {
            "properties": {"a": {"type": "integer"}, "c": {"type": "integer"}}}}}}}}});
        let finding = check_template_mirrors(&off, &object, "X");
        let Outcome::Fail(detail) = finding.outcome else {
            panic!("expected a failure")
        };
        assert_eq!(
            detail,
            "a: type differs; b missing in the template; c only in the template (would be pruned or rejected)"
        );
    }
}
