//! The committed CRD YAML under `config/crd/` matches the Rust types, and every CRD follows the
//! Cluster API contract and banlieue's CRD conventions.
//!
//! Regenerate the YAML with `BANLIEUE_UPDATE_CRDS=1 cargo test -p banlieue-api --test crds`.

use std::path::PathBuf;

use banlieue_api::crds;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde_json::Value;

fn crd_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../config/crd")
}

#[test]
fn committed_yaml_matches_the_rust_types() {
    let dir = crd_dir();
    let update = std::env::var_os("BANLIEUE_UPDATE_CRDS").is_some_and(|v| v == "1");
    let mut expected_files = Vec::new();
    let mut drifted = Vec::new();
    for crd in crds::all() {
        let file = crds::file_name(&crd);
        let yaml = crds::to_yaml(&crd).expect("CRD renders as YAML");
        let path = dir.join(&file);
        if update {
            std::fs::create_dir_all(&dir).expect("create config/crd");
            std::fs::write(&path, &yaml).expect("write CRD");
        } else if std::fs::read_to_string(&path).ok().as_deref() != Some(yaml.as_str()) {
            drifted.push(file.clone());
        }
        expected_files.push(file);
    }
    let mut stray: Vec<String> = std::fs::read_dir(&dir)
        .expect("config/crd exists")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|f| f.ends_with(".yaml") && !expected_files.contains(f))
        .collect();
    stray.sort();
    assert!(
        drifted.is_empty() && stray.is_empty(),
        "config/crd is out of date (changed: {drifted:?}, stray: {stray:?}); \
         regenerate with BANLIEUE_UPDATE_CRDS=1 cargo test -p banlieue-api --test crds"
    );
}

#[test]
fn snapshots() {
    for crd in crds::all() {
        let name = crd.metadata.name.clone().expect("named");
        insta::assert_yaml_snapshot!(name, crd);
    }
}

/// Kind → plural as Go's flect (used by clusterctl) pluralises it.
const FLECT_PLURALS: &[(&str, &str)] = &[
    ("VirtualMachine", "virtualmachines"),
    ("Provider", "providers"),
    ("VirtualMachineClass", "virtualmachineclasses"),
    ("VirtualMachineImage", "virtualmachineimages"),
    ("ProxmoxCluster", "proxmoxclusters"),
    ("ProxmoxMachine", "proxmoxmachines"),
    ("ProxmoxClusterTemplate", "proxmoxclustertemplates"),
    ("ProxmoxMachineTemplate", "proxmoxmachinetemplates"),
    ("LibvirtCluster", "libvirtclusters"),
    ("LibvirtMachine", "libvirtmachines"),
    ("LibvirtClusterTemplate", "libvirtclustertemplates"),
    ("LibvirtMachineTemplate", "libvirtmachinetemplates"),
    ("VSphereCluster", "vsphereclusters"),
    ("VSphereMachine", "vspheremachines"),
    ("VSphereClusterTemplate", "vsphereclustertemplates"),
    ("VSphereMachineTemplate", "vspheremachinetemplates"),
];

fn schema(crd: &CustomResourceDefinition) -> Value {
    serde_json::to_value(
        crd.spec.versions[0]
            .schema
            .as_ref()
            .and_then(|s| s.open_api_v3_schema.as_ref()),
    )
    .expect("schema serializes")
}

#[test]
fn names_labels_categories_and_scope() {
    let all = crds::all();
    assert_eq!(all.len(), FLECT_PLURALS.len());
    for crd in &all {
        let kind = crd.spec.names.kind.as_str();
        let plural = FLECT_PLURALS
            .iter()
            .find(|(k, _)| *k == kind)
            .map(|(_, p)| *p)
            .expect("known kind");
        assert_eq!(crd.spec.names.plural, plural, "{kind}");
        assert_eq!(
            crd.metadata.name.as_deref(),
            Some(format!("{plural}.{}", crd.spec.group).as_str())
        );
        let labels = crd.metadata.labels.as_ref().expect("labels");
        assert_eq!(
            labels.get("cluster.x-k8s.io/v1beta2").map(String::as_str),
            Some("v1alpha1"),
            "{kind}"
        );
        let categories = crd.spec.names.categories.clone().unwrap_or_default();
        assert!(categories.contains(&"banlieue".to_owned()), "{kind}");
        assert!(
            !crd.spec.names.short_names.clone().unwrap_or_default().is_empty(),
            "{kind}"
        );
        let infra = crd.spec.group == "infrastructure.banlieue.io";
        assert_eq!(categories.contains(&"cluster-api".to_owned()), infra, "{kind}");
        let cluster_scoped = ["Provider", "VirtualMachineClass", "VirtualMachineImage"].contains(&kind);
        assert_eq!(
            crd.spec.scope,
            if cluster_scoped { "Cluster" } else { "Namespaced" },
            "{kind}"
        );
        let columns = crd.spec.versions[0]
            .additional_printer_columns
            .clone()
            .unwrap_or_default();
        assert!(
            columns.iter().any(|c| c.name == "Age"),
            "{kind} has an Age column"
        );
    }
}

#[test]
fn infrastructure_kinds_follow_the_capi_v1beta2_contract() {
    for crd in crds::all()
        .iter()
        .filter(|c| c.spec.group == "infrastructure.banlieue.io")
    {
        let kind = crd.spec.names.kind.as_str();
        let s = schema(crd);
        let spec = &s["properties"]["spec"]["properties"];
        let status = &s["properties"]["status"]["properties"];
        let has_status = crd.spec.versions[0]
            .subresources
            .as_ref()
            .and_then(|r| r.status.as_ref())
            .is_some();
        if kind.ends_with("Template") {
            let template = &spec["template"]["properties"];
            assert!(template["spec"].is_object(), "{kind}: spec.template.spec");
            assert!(
                template["metadata"]["properties"]["labels"].is_object(),
                "{kind}: spec.template.metadata"
            );
            continue;
        }
        assert!(has_status, "{kind} has a status subresource");
        assert_eq!(
            status["initialization"]["properties"]["provisioned"]["type"], "boolean",
            "{kind}"
        );
        assert_eq!(status["conditions"]["x-kubernetes-list-type"], "map", "{kind}");
        assert_eq!(
            status["conditions"]["x-kubernetes-list-map-keys"],
            serde_json::json!(["type"]),
            "{kind}"
        );
        assert!(status.get("v1beta2").is_none(), "{kind}: no status.v1beta2");
        if kind.ends_with("Machine") {
            assert_eq!(spec["providerID"]["type"], "string", "{kind}");
            assert_eq!(spec["providerID"]["maxLength"], 512, "{kind}");
            assert!(
                spec.get("failureDomain").is_none(),
                "{kind}: spec.failureDomain must not exist"
            );
            assert_eq!(status["failureDomain"]["type"], "string", "{kind}");
            let address = &status["addresses"]["items"]["properties"];
            assert_eq!(
                address["type"]["enum"],
                serde_json::json!([
                    "Hostname",
                    "ExternalIP",
                    "InternalIP",
                    "ExternalDNS",
                    "InternalDNS"
                ])
            );
            assert_eq!(
                status["provisioning"]["properties"]["taskId"]["type"], "string",
                "{kind}"
            );
        } else {
            let endpoint = &spec["controlPlaneEndpoint"]["properties"];
            assert_eq!(endpoint["host"]["type"], "string", "{kind}");
            assert_eq!(endpoint["port"]["maximum"], 65535.0, "{kind}");
            assert_eq!(
                status["failureDomains"]["type"], "array",
                "{kind}: failureDomains is a list"
            );
            let fd = &status["failureDomains"]["items"]["properties"];
            assert!(fd["name"].is_object() && fd["controlPlane"].is_object() && fd["attributes"].is_object());
        }
    }
}

/// Every property of every schema has a description (they are `kubectl explain` text).
#[test]
fn every_field_is_documented() {
    fn walk(kind: &str, path: &str, schema: &Value, missing: &mut Vec<String>) {
        if let Some(props) = schema.get("properties").and_then(Value::as_object) {
            for (name, prop) in props {
                let p = format!("{path}.{name}");
                let documented = prop
                    .get("description")
                    .and_then(Value::as_str)
                    .is_some_and(|d| !d.is_empty());
                if !documented && !matches!(name.as_str(), "apiVersion" | "kind" | "metadata") {
                    missing.push(format!("{kind}{p}"));
                }
                walk(kind, &p, prop, missing);
            }
        }
        if let Some(items) = schema.get("items") {
            walk(kind, &format!("{path}[]"), items, missing);
        }
    }
    let mut missing = Vec::new();
    for crd in crds::all() {
        walk(&crd.spec.names.kind, "", &schema(&crd), &mut missing);
    }
    assert!(missing.is_empty(), "undocumented fields: {missing:#?}");
}

/// Every CEL rule compiles, carries a message, and is bounded: kube-cel's (coarse) cost
/// analysis flags nothing. The real apiserver's estimator is stricter and runs when the CRDs
/// are installed.
#[test]
fn every_cel_rule_compiles_and_has_a_message() {
    /// (rule, message, kube-cel's cost warnings for the rule at its schema node)
    type Found = (String, Option<String>, Vec<String>);
    fn rules(schema: &Value, out: &mut Vec<Found>) {
        if let Some(list) = schema.get("x-kubernetes-validations").and_then(Value::as_array) {
            let node = kube_cel::compile_schema(schema);
            for r in list {
                let rule = r["rule"].as_str().unwrap_or_default().to_owned();
                let warnings = kube_cel::estimate_rule_cost(&rule, &node)
                    .into_iter()
                    .map(|w| w.message)
                    .collect();
                out.push((
                    rule,
                    r.get("message").and_then(Value::as_str).map(str::to_owned),
                    warnings,
                ));
            }
        }
        for key in ["properties", "additionalProperties"] {
            if let Some(children) = schema.get(key).and_then(Value::as_object) {
                for child in children.values() {
                    rules(child, out);
                }
            }
        }
        if let Some(items) = schema.get("items") {
            rules(items, out);
        }
    }
    let mut total = 0;
    for crd in crds::all() {
        let kind = crd.spec.names.kind.clone();
        let s = schema(&crd);
        let compiled = kube_cel::compile_schema(&s);
        assert!(
            !compiled.has_errors(),
            "{kind}: {:?}",
            compiled.compilation_errors()
        );
        let mut found = Vec::new();
        rules(&s, &mut found);
        for (rule, message, cost_warnings) in &found {
            assert!(
                message.as_deref().is_some_and(|m| m.len() > 10),
                "{kind}: rule {rule:?} has no message"
            );
            assert!(
                cost_warnings.is_empty(),
                "{kind}: rule {rule:?}: {cost_warnings:?}"
            );
        }
        total += found.len();
    }
    assert!(
        total >= 30,
        "expected the CRDs to carry their CEL rules, found {total}"
    );
}

/// Strips what may legitimately differ between two uses of one shape: descriptions (kind-specific
/// wording) and `nullable` (optional in a VirtualMachine, required in a machine).
fn shape(schema: &Value) -> Value {
    match schema {
        Value::Object(map) => Value::Object(
            map.iter()
                .filter(|(k, _)| !matches!(k.as_str(), "description" | "nullable"))
                .map(|(k, v)| (k.clone(), shape(v)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(shape).collect()),
        other => other.clone(),
    }
}

/// The neutral machine shape (cpu, memoryMiB, disks, networks) is the same schema in the
/// VirtualMachine and in every infrastructure machine and machine template, so the banlieue
/// controller can map one onto the other field by field.
#[test]
fn neutral_machine_shape_is_identical_across_kinds() {
    let spec_of = |kind: &str| crds::schema_of(kind).expect("known kind")["properties"]["spec"].clone();
    let vm = spec_of("VirtualMachine");
    let mut checked = 0;
    for kind in ["ProxmoxMachine", "LibvirtMachine", "VSphereMachine"] {
        let machine = spec_of(kind);
        let template =
            spec_of(&format!("{kind}Template"))["properties"]["template"]["properties"]["spec"].clone();
        for field in ["cpu", "memoryMiB", "disks", "networks"] {
            let neutral = shape(&vm["properties"][field]);
            assert!(
                neutral.is_object() && neutral != Value::Object(Default::default()),
                "{field}"
            );
            assert_eq!(
                shape(&machine["properties"][field]),
                neutral,
                "{kind}.spec.{field}"
            );
            assert_eq!(
                shape(&template["properties"][field]),
                neutral,
                "{kind}Template ... spec.{field}"
            );
            checked += 1;
        }
        for field in ["providerRef", "readinessChecks", "providerID"] {
            assert_eq!(
                shape(&machine["properties"][field]),
                shape(&spec_of("ProxmoxMachine")["properties"][field]),
                "{kind}.spec.{field}"
            );
        }
        let required = machine["required"].as_array().cloned().unwrap_or_default();
        for field in ["cpu", "memoryMiB", "source"] {
            assert!(
                required.contains(&Value::from(field)),
                "{kind}.spec.{field} is required"
            );
        }
    }
    assert_eq!(checked, 12);
}

/// `kubectl get vm` shows why a VirtualMachine is not ready: Ready and Reason columns from the
/// Ready condition, and its message with `-o wide`.
#[test]
fn virtual_machine_columns_show_ready_and_reason() {
    let crd = crds::by_kind("VirtualMachine").expect("VirtualMachine CRD");
    let columns = crd.spec.versions[0]
        .additional_printer_columns
        .clone()
        .unwrap_or_default();
    let column = |name: &str| {
        columns
            .iter()
            .find(|c| c.name == name)
            .map(|c| (c.json_path.as_str(), c.priority.unwrap_or(0)))
    };
    assert_eq!(
        column("Ready"),
        Some((".status.conditions[?(@.type==\"Ready\")].status", 0))
    );
    assert_eq!(
        column("Reason"),
        Some((".status.conditions[?(@.type==\"Ready\")].reason", 0))
    );
    assert_eq!(
        column("Message"),
        Some((".status.conditions[?(@.type==\"Ready\")].message", 1))
    );
}
