//! Rust → JSON → Rust round trips for every kind with realistic objects (including statuses),
//! and the examples under `examples/`: one per kind, each parsing into its Rust type and
//! passing the in-process validation.

mod kinds;

use std::collections::BTreeMap;

use banlieue_api::banlieue::{
    Backend, Placement, Provider, ProviderAllocation, ProviderSpec, ProviderStatus, VirtualMachine,
    VirtualMachinePhase, VirtualMachineSpec, VirtualMachineStatus,
};
use banlieue_api::common::{
    CloneMode, ContractReference, Cpu, Disk, FailureDomain, Initialization, IpAddressing, IpAddressingMode,
    IpPoolReference, MachineAddress, MachineAddressType, MachineTemplateStatus, NetworkInterface, NodeInfo,
    PowerState, ProvisioningState, ProvisioningStatus, SecretKeyReference, SecretReference, TlsTrust,
};
use banlieue_api::condition::{self, ConditionStatus};
use banlieue_api::infrastructure::{
    ProxmoxCluster, ProxmoxClusterSpec, ProxmoxClusterStatus, ProxmoxMachine, ProxmoxMachineSpec,
    ProxmoxMachineStatus, ProxmoxTemplateSource, VmidRange,
};
use banlieue_api::{crds, validation};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, Time};
use k8s_openapi::jiff::Timestamp;
use kube::Resource;
use pretty_assertions::assert_eq;
use serde::Serialize;
use serde::de::DeserializeOwned;

fn now() -> Time {
    Time(Timestamp::from_second(1_790_000_000).expect("valid"))
}

/// Serializes, checks there is no `null` anywhere, parses back and compares.
fn round_trip<T: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug>(value: &T) -> serde_json::Value {
    let json = serde_json::to_value(value).expect("serializes");
    assert!(!kinds::contains_null(&json), "null serialized: {json:#}");
    let back: T = serde_json::from_value(json.clone()).expect("parses back");
    assert_eq!(&back, value);
    json
}

fn worker_machine() -> ProxmoxMachine {
    let mut m = ProxmoxMachine::new(
        "prod-md-0-7x2kq",
        ProxmoxMachineSpec {
            provider_id: Some("proxmox://6b1f3c51-3b9e-4c1a-9d0e-0f6a2b7c8d9e".into()),
            allowed_nodes: vec!["pve1".into(), "pve2".into()],
            storage: Some("local-lvm".into()),
            clone_mode: Some(CloneMode::Full),
            pool: Some("kubernetes".into()),
            disks: vec![Disk {
                name: "scsi0".into(),
                size_gib: 40,
                storage: None,
            }],
            networks: vec![NetworkInterface {
                vlan: Some(20),
                mtu: Some(9000),
                ipv4: Some(IpAddressing {
                    mode: IpAddressingMode::Pool,
                    pool_ref: Some(IpPoolReference {
                        api_group: "ipam.cluster.x-k8s.io".into(),
                        kind: "InClusterIPPool".into(),
                        name: "nodes".into(),
                    }),
                    ..Default::default()
                }),
                ..NetworkInterface::dhcp("net0", "vmbr0")
            }],
            tags: vec!["kubernetes".into()],
            vmid_range: Some(VmidRange {
                start: 1000,
                end: 1999,
            }),
            ..ProxmoxMachineSpec::new(
                ProxmoxTemplateSource {
                    vmid: Some(9000),
                    ..Default::default()
                },
                Cpu {
                    cores: 4,
                    sockets: Some(1),
                },
                8192,
            )
        },
    );
    m.meta_mut().namespace = Some("prod".into());
    let mut conditions = Vec::new();
    condition::set(
        &mut conditions,
        condition::new_condition(
            condition::READY,
            ConditionStatus::True,
            "Running",
            "",
            Some(2),
            now(),
        ),
    );
    m.status = Some(ProxmoxMachineStatus {
        initialization: Initialization::provisioned(true),
        addresses: vec![
            MachineAddress::new(MachineAddressType::InternalIP, "10.0.20.31"),
            MachineAddress::new(MachineAddressType::Hostname, "prod-md-0-7x2kq"),
        ],
        failure_domain: Some("pve2".into()),
        conditions,
        observed_generation: Some(2),
        vmid: Some(1042),
        node: Some("pve2".into()),
        power_state: Some(PowerState::On),
        provisioning: Some(ProvisioningStatus {
            state: ProvisioningState::Ready,
            task_id: None,
            task_started_at: None,
            message: None,
        }),
    });
    m
}

#[test]
fn proxmox_machine_round_trips_in_the_capi_shape() {
    let json = round_trip(&worker_machine());
    assert_eq!(json["apiVersion"], "infrastructure.banlieue.io/v1alpha1");
    assert_eq!(
        json["status"]["initialization"],
        serde_json::json!({"provisioned": true})
    );
    assert_eq!(
        json["status"]["addresses"][0],
        serde_json::json!({"type": "InternalIP", "address": "10.0.20.31"})
    );
    assert_eq!(json["spec"]["memoryMiB"], 8192);
    assert_eq!(json["spec"]["disks"][0]["sizeGiB"], 40);
    assert!(json["spec"].get("failureDomain").is_none());
}

#[test]
fn unprovisioned_status_omits_initialization() {
    let mut m = worker_machine();
    let status = m.status.as_mut().expect("status");
    status.initialization = Initialization::provisioned(false);
    status.provisioning = Some(ProvisioningStatus {
        state: ProvisioningState::Cloning,
        task_id: Some("UPID:pve2:000A1B2C:0F1E2D3C:65F0A1B2:qmclone:9000:root@pam!capi:".into()),
        task_started_at: Some(now()),
        message: Some("cloning template 9000".into()),
    });
    let json = round_trip(&m);
    assert!(json["status"].get("initialization").is_none(), "{json:#}");
    assert_eq!(json["status"]["provisioning"]["state"], "Cloning");
    assert!(!Initialization::is_provisioned(
        m.status.as_ref().and_then(|s| s.initialization.as_ref())
    ));
}

#[test]
fn proxmox_cluster_round_trips_with_failure_domains_as_a_list() {
    let mut c = ProxmoxCluster::new(
        "prod",
        ProxmoxClusterSpec {
            control_plane_endpoint: Some(banlieue_api::common::ApiEndpoint {
                host: "10.0.20.10".into(),
                port: 6443,
            }),
            endpoint: Some("https://pve.example.com:8006".into()),
            credentials_ref: Some(SecretReference {
                name: "pve-credentials".into(),
                namespace: None,
            }),
            tls: Some(TlsTrust {
                insecure_skip_verify: Some(true),
                ..Default::default()
            }),
            allowed_nodes: vec!["pve1".into(), "pve2".into()],
            ..Default::default()
        },
    );
    c.status = Some(ProxmoxClusterStatus {
        initialization: Initialization::provisioned(true),
        failure_domains: ["pve1", "pve2"]
            .map(|n| FailureDomain {
                name: n.into(),
                control_plane: Some(true),
                attributes: None,
            })
            .to_vec(),
        conditions: vec![],
        observed_generation: Some(1),
        version: Some("9.1.2".into()),
    });
    let json = round_trip(&c);
    assert_eq!(
        json["status"]["failureDomains"][1],
        serde_json::json!({"name": "pve2", "controlPlane": true})
    );
}

#[test]
fn virtual_machine_and_provider_round_trip() {
    let mut vm = VirtualMachine::new(
        "web-1",
        VirtualMachineSpec {
            class_ref: Some(banlieue_api::common::LocalObjectReference { name: "small".into() }),
            image_ref: Some(banlieue_api::common::LocalObjectReference {
                name: "ubuntu-24.04".into(),
            }),
            user_data_secret_ref: Some(SecretKeyReference {
                name: "web-1-user-data".into(),
                key: None,
            }),
            power_state: Some(PowerState::On),
            placement: Some(Placement {
                provider_selector: Some(LabelSelector {
                    match_labels: Some(BTreeMap::from([("zone".into(), "a".into())])),
                    ..Default::default()
                }),
                failure_domain: Some("pve1".into()),
                node: None,
            }),
            ..Default::default()
        },
    );
    vm.status = Some(VirtualMachineStatus {
        phase: Some(VirtualMachinePhase::Running),
        conditions: vec![condition::new_condition(
            condition::INFRASTRUCTURE_READY,
            ConditionStatus::True,
            "Running",
            "",
            Some(1),
            now(),
        )],
        observed_generation: Some(1),
        provider_id: Some("proxmox://6b1f3c51-3b9e-4c1a-9d0e-0f6a2b7c8d9e".into()),
        addresses: vec![MachineAddress::new(MachineAddressType::InternalIP, "10.0.20.40")],
        infrastructure_ref: Some(ContractReference {
            api_group: "infrastructure.banlieue.io".into(),
            kind: "ProxmoxMachine".into(),
            name: "web-1".into(),
        }),
        power_state: Some(PowerState::On),
        provider: Some("pve-zone-a".into()),
        node: Some("pve1".into()),
        failure_domain: Some("pve1".into()),
        allocated: Some(banlieue_api::banlieue::ProviderAllocation {
            vcpus: Some(2),
            memory_mib: Some(4096),
            storage_gib: Some(40),
            virtual_machines: Some(1),
        }),
    });
    let json = round_trip(&vm);
    assert_eq!(json["status"]["allocated"]["memoryMiB"], 4096);
    assert_eq!(
        json["status"]["conditions"][0]["lastTransitionTime"],
        "2026-09-21T14:13:20Z"
    );
    assert_eq!(
        json["spec"]["userDataSecretRef"],
        serde_json::json!({"name": "web-1-user-data"})
    );

    let mut p = Provider::new(
        "pve-zone-a",
        ProviderSpec {
            backend: Backend::Proxmox,
            endpoint: "https://pve-a.example.com:8006".into(),
            credentials_ref: Some(SecretReference {
                name: "pve-zone-a".into(),
                namespace: Some("banlieue-system".into()),
            }),
            nodes: vec!["pve1".into()],
            ..Default::default()
        },
    );
    p.status = Some(ProviderStatus {
        version: Some("9.1.1".into()),
        allocated: Some(ProviderAllocation {
            vcpus: Some(4),
            virtual_machines: Some(1),
            ..Default::default()
        }),
        ..Default::default()
    });
    let json = round_trip(&p);
    assert_eq!(json["spec"]["backend"], "proxmox");
    assert!(json["metadata"].get("namespace").is_none());
}

#[test]
fn machine_template_status_round_trips() {
    let status = MachineTemplateStatus {
        capacity: BTreeMap::from([
            ("cpu".into(), Quantity("4".into())),
            ("memory".into(), Quantity("8Gi".into())),
        ]),
        node_info: Some(NodeInfo {
            architecture: Some("amd64".into()),
            operating_system: Some("linux".into()),
        }),
    };
    let json = round_trip(&status);
    assert_eq!(json["capacity"]["memory"], "8Gi");
}

fn examples() -> Vec<(String, serde_json::Value)> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    let mut out = Vec::new();
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("examples/ exists")
        .filter_map(|e| e.ok())
        .collect();
    files.sort_by_key(|e| e.file_name());
    for entry in files {
        let path = entry.path();
        if path.extension().is_none_or(|e| e != "yaml") {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("readable");
        let value: serde_json::Value = serde_yaml::from_str(&text).expect("YAML");
        out.push((
            path.file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned(),
            value,
        ));
    }
    out
}

#[test]
fn every_kind_has_examples_that_parse_round_trip_and_validate() {
    let cel = kube_cel::Validator::new();
    let examples = examples();
    for crd in crds::all() {
        let kind = crd.spec.names.kind;
        let found: Vec<_> = examples
            .iter()
            .filter(|(_, v)| v["kind"] == kind.as_str())
            .collect();
        assert!(!found.is_empty(), "an example of {kind}");
        for (file, value) in found {
            let back = kinds::through_rust(&kind, value).unwrap_or_else(|e| panic!("{file}: {e}"));
            assert_eq!(&back, value, "{file} changes when parsed and serialized again");
            let schema = crds::schema_of(&kind).expect("schema");
            let structural = validation::check_structural(&schema, value);
            assert!(structural.is_empty(), "{file}: {structural:?}");
            assert!(
                cel.validate(&schema, value, None).is_ok(),
                "{file}: CEL rules reject it"
            );
        }
    }
}
