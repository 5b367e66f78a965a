//! Round-trip tests for the generated CAPI types with objects as CAPI v1.14 stores them.
//!
//! For every fixture in `tests/fixtures/`: YAML → JSON → typed object → JSON must equal the input
//! (maps compare without order), typed → JSON → typed must be equal, and no `null` may appear in
//! the output (CAPI treats a `null` as a wrong JSON type). Since the generated structs ignore
//! unknown fields, the first check also catches a fixture field that the types drop.

use std::path::{Path, PathBuf};

use banlieue_capi::{
    Cluster, IpAddress, IpAddressClaim, KubeadmConfig, KubeadmControlPlane, Machine, MachineDeployment,
    MachineSet,
};
use pretty_assertions::assert_eq;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

fn fixture(name: &str) -> Value {
    let path: PathBuf = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("parse {}: {e}", path.display()))
}

/// JSON paths of every `null` in `value`.
fn nulls(value: &Value, path: &str, out: &mut Vec<String>) {
    match value {
        Value::Null => out.push(path.to_owned()),
        Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                nulls(v, &format!("{path}[{i}]"), out);
            }
        }
        Value::Object(map) => {
            for (k, v) in map {
                nulls(v, &format!("{path}.{k}"), out);
            }
        }
        _ => {}
    }
}

fn assert_no_nulls(value: &Value, what: &str) {
    let mut found = Vec::new();
    nulls(value, "", &mut found);
    assert!(found.is_empty(), "{what} serialized null at {found:?}");
}

/// Runs all round-trip checks for one fixture and returns the typed object for further asserts.
fn round_trip<K>(name: &str) -> K
where
    K: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug,
{
    let input = fixture(name);
    let typed: K = serde_json::from_value(input.clone()).unwrap_or_else(|e| panic!("{name}: decode: {e}"));
    let output = serde_json::to_value(&typed).unwrap();
    assert_eq!(output, input, "{name}: JSON → Rust → JSON changed the object");
    assert_no_nulls(&output, name);

    let again: K = serde_json::from_value(output).unwrap();
    assert_eq!(again, typed, "{name}: Rust → JSON → Rust changed the object");

    // YAML is what users and clusterctl templates use; it must round-trip too.
    let yaml = serde_yaml::to_string(&typed).unwrap();
    let from_yaml: K = serde_yaml::from_str(&yaml).unwrap_or_else(|e| panic!("{name}: YAML decode: {e}"));
    assert_eq!(from_yaml, typed, "{name}: Rust → YAML → Rust changed the object");
    typed
}

#[test]
fn cluster_round_trips() {
    let cluster: Cluster = round_trip("cluster.yaml");
    let status = cluster.status.as_ref().unwrap();
    assert_eq!(status.failure_domains.as_ref().map(Vec::len), Some(3));
    let v1beta1 = status
        .deprecated
        .as_ref()
        .and_then(|d| d.v1beta1.as_ref())
        .unwrap();
    let old = v1beta1.conditions.as_ref().unwrap();
    assert_eq!(
        old[1].severity.as_deref(),
        Some("Warning"),
        "v1beta1 severity must survive"
    );
    assert_eq!(old[0].message, None, "an absent v1beta1 message must stay absent");
    assert!(banlieue_capi::contract::is_infrastructure_provisioned(&cluster));
    assert!(banlieue_capi::contract::is_control_plane_initialized(&cluster));
    assert!(!banlieue_capi::contract::is_paused(
        Some(&cluster),
        &cluster.metadata
    ));
}

#[test]
fn machine_round_trips() {
    let machine: Machine = round_trip("machine.yaml");
    assert_eq!(
        banlieue_capi::contract::bootstrap_data_secret_name(&machine),
        Some("prod-md-0-7b9c4-x2x8q")
    );
    assert_eq!(
        banlieue_capi::contract::cluster_name(&machine.metadata),
        Some("prod")
    );
    assert!(!banlieue_capi::contract::is_control_plane_machine(&machine));
    let infra = banlieue_capi::contract::ContractRef::from(&machine.spec.infrastructure_ref);
    assert_eq!(infra.group_kind(), "ProxmoxMachine.infrastructure.banlieue.io");
    let addresses = machine
        .status
        .as_ref()
        .and_then(|s| s.addresses.as_ref())
        .unwrap();
    assert_eq!(addresses.len(), 3);
}

#[test]
fn machine_deployment_round_trips() {
    let md: MachineDeployment = round_trip("machine_deployment.yaml");
    assert_eq!(md.spec.replicas, Some(2));
    // IntOrString keeps its JSON type: an int stays an int, a percentage stays a string.
    let json = serde_json::to_value(&md).unwrap();
    assert_eq!(
        json["spec"]["rollout"]["strategy"]["rollingUpdate"]["maxSurge"],
        serde_json::json!(1)
    );
    assert_eq!(
        json["spec"]["remediation"]["maxInFlight"],
        serde_json::json!("34%")
    );
}

#[test]
fn kubeadm_control_plane_round_trips() {
    let kcp: KubeadmControlPlane = round_trip("kubeadm_control_plane.yaml");
    assert_eq!(kcp.spec.replicas, Some(3));
    let infra =
        banlieue_capi::contract::ContractRef::from(&kcp.spec.machine_template.spec.infrastructure_ref);
    assert_eq!(infra.kind, "ProxmoxMachineTemplate");
}

#[test]
fn ip_address_claim_round_trips() {
    let claim: IpAddressClaim = round_trip("ip_address_claim.yaml");
    let address = claim
        .status
        .as_ref()
        .and_then(|s| s.address_ref.as_ref())
        .map(|r| r.name.as_str());
    assert_eq!(address, Some("prod-md-0-7b9c4-x2x8q-net0-inet"));
    assert_eq!(banlieue_capi::ipam::allocated_address_name(&claim), address);
    assert!(
        banlieue_capi::contract::owner_machine(&claim.metadata).is_none(),
        "owned by the InfraMachine"
    );
}

#[test]
fn ip_address_round_trips() {
    let ip: IpAddress = round_trip("ip_address.yaml");
    assert_eq!((ip.spec.address.as_str(), ip.spec.prefix), ("192.0.2.31", 24));
    assert_eq!(ip.spec.gateway.as_deref(), Some("192.0.2.1"));
    let allocation = banlieue_capi::ipam::parse_allocation(&ip).unwrap();
    assert_eq!(allocation.prefix, 24);
    assert!(allocation.address.is_ipv4() && allocation.gateway.is_some_and(|g| g.is_ipv4()));
}

#[test]
fn topology_cluster_round_trips_with_free_form_variables() {
    let cluster: Cluster = round_trip("cluster_topology.yaml");
    let topology = cluster.spec.topology.as_ref().unwrap();
    let vars: Vec<_> = topology
        .variables
        .as_ref()
        .unwrap()
        .iter()
        .map(|v| (v.name.as_str(), &v.value))
        .collect();
    assert_eq!(
        vars[0],
        (
            "controlPlaneEndpoint",
            &serde_json::json!({"host": "192.0.2.50", "port": 6443})
        )
    );
    assert_eq!(vars[2], ("cpuOvercommit", &serde_json::json!(1.5)));
    // Paused by both the spec and the annotation; the contract helper reports both causes.
    let cause = banlieue_capi::contract::pause_cause(Some(&cluster), &cluster.metadata).unwrap();
    assert!(cause.cluster_paused && cause.annotation);
}

#[test]
fn kubeadm_config_round_trips_and_keeps_an_empty_taint_list() {
    let config: KubeadmConfig = round_trip("kubeadm_config.yaml");
    // `taints: []` means "no taints" to kubeadm, unlike an absent list (default taints): keep it.
    let taints = config
        .spec
        .join_configuration
        .as_ref()
        .and_then(|j| j.node_registration.as_ref());
    assert_eq!(taints.and_then(|n| n.taints.as_ref()).map(Vec::len), Some(0));
    let owner = banlieue_capi::contract::owner_machine(&config.metadata).map(|o| o.name.as_str());
    assert_eq!(owner, Some("prod-md-0-7b9c4-x2x8q"));
}

#[test]
fn machine_set_round_trips() {
    let ms: MachineSet = round_trip("machine_set.yaml");
    assert_eq!(ms.status.as_ref().and_then(|s| s.ready_replicas), Some(1));
}

#[test]
fn default_objects_serialize_without_nulls() {
    fn check<K: Serialize>(obj: &K, what: &str) {
        let json = serde_json::to_value(obj).unwrap();
        assert_no_nulls(&json, what);
    }
    check(&Cluster::new("c", Default::default()), "Cluster");
    check(&Machine::new("m", Default::default()), "Machine");
    check(
        &MachineDeployment::new("md", Default::default()),
        "MachineDeployment",
    );
    check(
        &KubeadmControlPlane::new("kcp", Default::default()),
        "KubeadmControlPlane",
    );
    check(&IpAddressClaim::new("c", Default::default()), "IPAddressClaim");
    check(&IpAddress::new("a", Default::default()), "IPAddress");
    check(&KubeadmConfig::new("k", Default::default()), "KubeadmConfig");
    check(&MachineSet::new("ms", Default::default()), "MachineSet");
}

#[test]
fn a_default_cluster_serializes_only_what_is_set() {
    let json = serde_json::to_value(Cluster::new("c", Default::default())).unwrap();
    assert_eq!(
        json,
        serde_json::json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2",
            "kind": "Cluster",
            "metadata": {"name": "c"},
            "spec": {},
        })
    );
}

#[test]
fn the_nulls_check_itself_finds_nulls() {
    let mut found = Vec::new();
    nulls(
        &serde_json::json!({"a": [1, {"b": null}], "c": null}),
        "",
        &mut found,
    );
    found.sort();
    assert_eq!(found, vec![".a[1].b".to_owned(), ".c".to_owned()]);
}
