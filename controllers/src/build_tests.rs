use pretty_assertions::assert_eq;
use rstest::rstest;

use super::*;

fn vm(spec: Value) -> VirtualMachine {
    serde_json::from_value(json!({
        "apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine",
        "metadata": {"name": "web", "namespace": "apps", "uid": "uid-1", "generation": 2},
        "spec": spec,
    }))
    .expect("valid VirtualMachine")
}

fn provider(name: &str, backend: &str, labels: Value, extra: Value) -> Provider {
    let mut spec = json!({"backend": backend, "endpoint": "https://pve.example:8006"});
    if let Value::Object(extra) = extra {
        spec.as_object_mut().expect("object").extend(extra);
    }
    serde_json::from_value(json!({
        "apiVersion": "banlieue.io/v1alpha1", "kind": "Provider",
        "metadata": {"name": name, "labels": labels}, "spec": spec,
    }))
    .expect("valid Provider")
}

fn class() -> VirtualMachineClass {
    serde_json::from_value(json!({
        "apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachineClass",
        "metadata": {"name": "small"},
        "spec": {"cpu": {"cores": 2}, "memoryMiB": 2048,
                 "disks": [{"name": "root", "sizeGiB": 20}, {"name": "data", "sizeGiB": 5, "storage": "slow"}]},
    }))
    .expect("valid class")
}

fn image() -> VirtualMachineImage {
    serde_json::from_value(json!({
        "apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachineImage",
        "metadata": {"name": "ubuntu"},
        "spec": {"sources": [
            {"provider": "pve-b", "proxmox": {"vmid": 9001}},
            {"proxmox": {"vmid": 9000}},
            {"libvirt": {"volume": "ubuntu.qcow2", "pool": "images"}},
        ]},
    }))
    .expect("valid image")
}

fn no_labels() -> BTreeMap<String, String> {
    BTreeMap::new()
}

#[test]
fn builds_a_proxmox_machine_with_neutral_fields_verbatim() {
    let networks = json!([{"name": "net0", "network": "vmbr0", "vlan": 10,
        "ipv4": {"mode": "Static", "addresses": ["192.0.2.10/24"], "gateway": "192.0.2.1"}}]);
    let v = vm(json!({
        "providerRef": {"name": "pve-a"}, "source": {"proxmox": {"vmid": 100}},
        "cpu": {"cores": 4, "sockets": 2}, "memoryMiB": 4096,
        "disks": [{"name": "scsi0", "sizeGiB": 32}], "networks": networks.clone(),
        "placement": {"node": "pve1"},
    }));
    let p = provider(
        "pve-a",
        "proxmox",
        json!({}),
        json!({"defaults": {"storage": "local-lvm", "network": "vmbr9"}}),
    );
    let mut m = desired_machine(&v, &p, None, None).expect("builds");
    let digest = m["metadata"]["annotations"]
        .as_object_mut()
        .and_then(|a| a.remove(APPLIED_SPEC_ANNOTATION))
        .expect("digest annotation");
    assert_eq!(digest.as_str().map(str::len), Some(64));
    assert_eq!(
        m,
        json!({
            "apiVersion": "infrastructure.banlieue.io/v1alpha1",
            "kind": "ProxmoxMachine",
            "metadata": {
                "name": "web", "namespace": "apps", "annotations": {},
                "labels": {"banlieue.io/virtual-machine": "web", "banlieue.io/provider": "pve-a",
                           "app.kubernetes.io/managed-by": "banlieue-controller"},
                "ownerReferences": [{"apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine",
                    "name": "web", "uid": "uid-1", "controller": true, "blockOwnerDeletion": true}],
                "finalizers": ["infrastructure.banlieue.io/proxmox"],
            },
            "spec": {
                "providerRef": {"name": "pve-a"}, "source": {"vmid": 100},
                "cpu": {"cores": 4, "sockets": 2}, "memoryMiB": 4096,
                "disks": [{"name": "scsi0", "sizeGiB": 32}], "networks": networks,
                "storage": "local-lvm", "targetNode": "pve1",
            },
        })
    );
    // The result is a valid ProxmoxMachine.
    let typed: banlieue_api::infrastructure::ProxmoxMachine = serde_json::from_value(m).expect("typed");
    assert_eq!(typed.spec.memory_mib, 4096);
    assert_eq!(typed.spec.provider_id, None);
}

#[rstest]
#[case::proxmox("proxmox", "ProxmoxMachine", "storage", json!({"vmid": 9000}))]
#[case::libvirt("libvirt", "LibvirtMachine", "storagePool", json!({"volume": "ubuntu.qcow2", "pool": "images"}))]
fn same_vm_maps_onto_each_backend(
    #[case] backend: &str,
    #[case] kind: &str,
    #[case] storage_field: &str,
    #[case] source: Value,
) {
    let v = vm(
        json!({"providerRef": {"name": "p"}, "classRef": {"name": "small"}, "imageRef": {"name": "ubuntu"}}),
    );
    let p = provider(
        "p",
        backend,
        json!({}),
        json!({"defaults": {"storage": "fast", "network": "lan"}}),
    );
    let m = desired_machine(&v, &p, Some(&class()), Some(&image())).expect("builds");
    assert_eq!(m["kind"], kind);
    assert_eq!(m["spec"]["source"], source);
    assert_eq!(m["spec"][storage_field], "fast");
    assert_eq!(m["spec"]["cpu"], json!({"cores": 2}));
    assert_eq!(m["spec"]["memoryMiB"], 2048);
    assert_eq!(m["spec"]["networks"], json!([{"name": "net0", "network": "lan"}]));
}

#[test]
fn image_entry_restricted_to_a_provider_wins_only_there() {
    let v = vm(json!({"providerRef": {"name": "pve-b"}, "imageRef": {"name": "ubuntu"}}));
    let b = provider("pve-b", "proxmox", json!({}), json!({}));
    let a = provider("pve-a", "proxmox", json!({}), json!({}));
    assert_eq!(image_source(&v, &b, Some(&image())), Some(json!({"vmid": 9001})));
    assert_eq!(image_source(&v, &a, Some(&image())), Some(json!({"vmid": 9000})));
}

#[test]
fn missing_backend_source_is_invalid_with_an_actionable_message() {
    let v = vm(
        json!({"providerRef": {"name": "vc"}, "imageRef": {"name": "ubuntu"}, "cpu": {"cores": 1}, "memoryMiB": 512}),
    );
    let p = provider("vc", "vsphere", json!({}), json!({}));
    let err = desired_machine(&v, &p, None, Some(&image())).expect_err("no vsphere source");
    assert_eq!(err.reason(), "NoImageSourceForBackend");
    assert!(err.to_string().contains("add a vsphere entry"), "{err}");
}

#[test]
fn vm_size_overrides_class_and_disks_merge_by_name() {
    let v = vm(json!({"classRef": {"name": "small"}, "memoryMiB": 8192,
        "disks": [{"name": "root", "sizeGiB": 40}, {"name": "extra", "sizeGiB": 1}]}));
    let (cpu, mem, disks) = sizing(&v, Some(&class())).expect("sized");
    assert_eq!(cpu, Cpu::cores(2));
    assert_eq!(mem, 8192);
    let got: Vec<(&str, u64)> = disks.iter().map(|d| (d.name.as_str(), d.size_gib)).collect();
    assert_eq!(got, vec![("root", 40), ("data", 5), ("extra", 1)]);
    assert_eq!(disks[1].storage.as_deref(), Some("slow"));
    assert_eq!(sizing(&vm(json!({"memoryMiB": 512})), None), Err(Invalid::NoSize));
}

#[rstest]
#[case::by_ref(json!({"providerRef": {"name": "b"}}), None, Ok("b"))]
#[case::ref_missing(json!({"providerRef": {"name": "zzz"}}), None, Err("ProviderNotFound"))]
#[case::selector_prefers_ready(json!({"placement": {"providerSelector": {"matchLabels": {"zone": "a"}}}}), None, Ok("c"))]
#[case::selector_none(json!({"placement": {"providerSelector": {"matchLabels": {"zone": "q"}}}}), None, Err("NoProviderMatches"))]
#[case::sticky(json!({"placement": {"providerSelector": {"matchLabels": {"zone": "a"}}}}), Some("a"), Ok("a"))]
#[case::sticky_gone(json!({"placement": {"providerSelector": {"matchLabels": {"zone": "a"}}}}), Some("gone"), Err("ProviderNotFound"))]
#[case::expression(json!({"placement": {"providerSelector": {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]}}}), None, Ok("b"))]
fn provider_choice(
    #[case] spec: Value,
    #[case] recorded: Option<&str>,
    #[case] expected: Result<&str, &str>,
) {
    let mut v = vm(spec);
    if let Some(r) = recorded {
        v.status = Some(banlieue_api::banlieue::VirtualMachineStatus {
            provider: Some(r.into()),
            ..Default::default()
        });
    }
    let mut ready = provider("c", "proxmox", json!({"zone": "a"}), json!({}));
    ready.status = serde_json::from_value(json!({"conditions": [{"type": "Ready", "status": "True",
        "reason": "Connected", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}))
    .expect("status");
    let providers = vec![
        provider("a", "proxmox", json!({"zone": "a"}), json!({})),
        provider("b", "libvirt", json!({"zone": "b"}), json!({})),
        ready,
    ];
    let got = choose_provider(
        &v,
        &providers,
        &no_labels(),
        &BTreeMap::new(),
        &small_vm(),
        |_| true,
    )
    .map(|p| p.name_any());
    assert_eq!(got.as_deref().map_err(|e| e.reason()), expected);
}

/// What `n` VirtualMachines of [`small_vm`]'s size take.
fn vms(n: u32) -> ProviderAllocation {
    ProviderAllocation {
        vcpus: Some(n),
        memory_mib: Some(512 * u64::from(n)),
        storage_gib: Some(10 * u64::from(n)),
        virtual_machines: Some(n),
    }
}

/// One VM: 1 vCPU, 512 MiB, a 10 GiB disk.
fn small_vm() -> ProviderAllocation {
    vms(1)
}

#[test]
fn selector_skips_full_providers_and_those_without_a_source_then_sorts_by_room_and_name() {
    let v = vm(json!({"placement": {"providerSelector": {}}}));
    let cap = |n: u32| json!({"capacity": {"virtualMachines": n}});
    let providers = vec![
        provider("a-full", "proxmox", json!({}), cap(1)),
        provider("b-small", "proxmox", json!({}), cap(5)),
        provider("c-none", "vsphere", json!({}), json!({})),
        provider("d-big", "proxmox", json!({}), cap(50)),
        provider("e-big", "proxmox", json!({}), cap(50)),
    ];
    // Placed counts (fresh, not the Providers' status): a-full has its one VM, d-big has room
    // for more than e-big.
    let placed = BTreeMap::from([("a-full".to_owned(), vms(1)), ("e-big".to_owned(), vms(3))]);
    let pick = choose_provider(&v, &providers, &no_labels(), &placed, &small_vm(), |p| {
        p.spec.backend == Backend::Proxmox
    })
    .expect("one fits");
    assert_eq!(pick.name_any(), "d-big");
}

#[test]
fn a_named_provider_that_is_full_or_deleting_takes_no_new_vm_but_keeps_its_own() {
    let named = vm(json!({"providerRef": {"name": "p"}}));
    let providers = vec![provider(
        "p",
        "proxmox",
        json!({}),
        json!({"capacity": {"virtualMachines": 2}}),
    )];
    let placed = |n: u32| BTreeMap::from([("p".to_owned(), vms(n))]);
    assert!(
        choose_provider(&named, &providers, &no_labels(), &placed(1), &small_vm(), |_| {
            true
        })
        .is_ok()
    );
    let err = choose_provider(&named, &providers, &no_labels(), &placed(2), &small_vm(), |_| {
        true
    })
    .expect_err("full");
    assert_eq!(err.reason(), "ProviderFull");
    assert!(err.to_string().contains("2 of its 2 VirtualMachines"), "{err}");

    // Already placed there: stays, full or not.
    let mut own = named.clone();
    own.status = Some(banlieue_api::banlieue::VirtualMachineStatus {
        provider: Some("p".into()),
        ..Default::default()
    });
    assert!(choose_provider(&own, &providers, &no_labels(), &placed(2), &small_vm(), |_| true).is_ok());

    let mut deleting = providers.clone();
    deleting[0].metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
    ));
    let err = choose_provider(&named, &deleting, &no_labels(), &placed(0), &small_vm(), |_| true)
        .expect_err("deleting");
    assert_eq!(err.reason(), "ProviderDeleting");
    assert!(choose_provider(&own, &deleting, &no_labels(), &placed(2), &small_vm(), |_| true).is_ok());
    let selected = vm(json!({"placement": {"providerSelector": {}}}));
    assert_eq!(
        choose_provider(
            &selected,
            &deleting,
            &no_labels(),
            &placed(0),
            &small_vm(),
            |_| true
        )
        .expect_err("no candidate")
        .reason(),
        "NoProviderMatches"
    );
}

#[test]
fn a_vm_takes_its_vcpus_memory_and_declared_disks_with_its_class() {
    let v = vm(
        json!({"classRef": {"name": "small"}, "cpu": {"cores": 3, "sockets": 2},
                      "disks": [{"name": "root", "sizeGiB": 40}, {"name": "logs", "sizeGiB": 7}]}),
    );
    assert_eq!(
        allocation(&v, Some(&class())),
        Ok(ProviderAllocation {
            vcpus: Some(6),
            memory_mib: Some(2048),
            storage_gib: Some(40 + 5 + 7),
            virtual_machines: Some(1),
        })
    );
    assert_eq!(
        allocation(&vm(json!({"memoryMiB": 512})), None),
        Err(Invalid::NoSize)
    );
}

#[test]
fn vcpus_memory_and_storage_capacities_hold_back_a_vm_that_does_not_fit() {
    let named = vm(json!({"providerRef": {"name": "p"}}));
    let limited = |capacity: Value| vec![provider("p", "proxmox", json!({}), json!({"capacity": capacity}))];
    let placed = |n: u32| BTreeMap::from([("p".to_owned(), vms(n))]);
    let choose = |providers: &[Provider], n: u32, wanted: &ProviderAllocation| {
        choose_provider(&named, providers, &no_labels(), &placed(n), wanted, |_| true)
            .map(|p| p.name_any())
            .map_err(|e| (e.reason(), e.to_string()))
    };

    let cpus = limited(json!({"vcpus": 4}));
    assert_eq!(choose(&cpus, 3, &small_vm()), Ok("p".to_owned()));
    let (reason, message) = choose(&cpus, 4, &small_vm()).expect_err("no vCPU left");
    assert_eq!(reason, "ProviderFull");
    assert!(
        message.contains("take 4 of its 4 (spec.capacity.vcpus) and this one needs 1"),
        "{message}"
    );

    let memory = limited(json!({"memoryMiB": 2048}));
    assert!(choose(&memory, 3, &small_vm()).is_ok());
    let big = ProviderAllocation {
        memory_mib: Some(1024),
        ..small_vm()
    };
    let (_, message) = choose(&memory, 3, &big).expect_err("not enough memory");
    assert!(message.contains("spec.capacity.memoryMiB"), "{message}");

    let storage = limited(json!({"storageGiB": 35}));
    assert!(choose(&storage, 2, &small_vm()).is_ok());
    assert!(choose(&storage, 3, &small_vm()).is_err());
    let diskless = ProviderAllocation {
        storage_gib: Some(0),
        ..small_vm()
    };
    let (reason, message) = choose(&storage, 0, &diskless).expect_err("nothing to count");
    assert_eq!(reason, "StorageNotDeclared");
    assert!(message.contains("declares no disk"), "{message}");
    assert!(
        choose(&cpus, 0, &diskless).is_ok(),
        "only a storage limit needs disks"
    );

    // A selector passes over the Provider without room and takes the next one.
    let selected = vm(json!({"placement": {"providerSelector": {}}}));
    let two = vec![
        provider("a", "proxmox", json!({}), json!({"capacity": {"vcpus": 4}})),
        provider("b", "proxmox", json!({}), json!({"capacity": {"vcpus": 40}})),
    ];
    let used = BTreeMap::from([("a".to_owned(), vms(4)), ("b".to_owned(), vms(4))]);
    let pick = choose_provider(&selected, &two, &no_labels(), &used, &small_vm(), |_| true);
    assert_eq!(pick.map(|p| p.name_any()).ok().as_deref(), Some("b"));
}

#[test]
fn namespace_selector_is_honoured() {
    let v = vm(json!({"providerRef": {"name": "team"}}));
    let providers = vec![provider(
        "team",
        "proxmox",
        json!({}),
        json!({"namespaceSelector": {"matchLabels": {"team": "x"}}}),
    )];
    let none = BTreeMap::new();
    let err = choose_provider(&v, &providers, &no_labels(), &none, &small_vm(), |_| true)
        .expect_err("not admitted");
    assert_eq!(err.reason(), "NamespaceNotAllowed");
    let labels = BTreeMap::from([("team".to_owned(), "x".to_owned())]);
    assert!(choose_provider(&v, &providers, &labels, &none, &small_vm(), |_| true).is_ok());
}

#[rstest]
#[case::equal(json!({"a": 1}), json!({"a": 1}), true)]
#[case::server_added_keys(json!({"a": {"b": 1, "c": 2}, "status": {}}), json!({"a": {"b": 1}}), true)]
#[case::changed_value(json!({"a": {"b": 1}}), json!({"a": {"b": 2}}), false)]
#[case::missing_key(json!({}), json!({"a": 1}), false)]
#[case::array_element_defaults(json!({"l": [{"n": "x", "d": 1}]}), json!({"l": [{"n": "x"}]}), true)]
#[case::array_shrunk(json!({"l": [1, 2]}), json!({"l": [1]}), false)]
#[case::int_float(json!({"m": 4096}), json!({"m": 4096.0}), true)]
fn contains_table(#[case] existing: Value, #[case] desired: Value, #[case] expected: bool) {
    assert_eq!(contains(&existing, &desired), expected);
}

#[rstest]
#[case::the_same(json!(["infrastructure.banlieue.io/proxmox"]), true)]
#[case::beside_others(json!(["example.com/backup", "infrastructure.banlieue.io/proxmox"]), true)]
#[case::taken_off(json!(["example.com/backup"]), false)]
#[case::none(json!(null), false)]
fn a_machine_holds_the_providers_finalizer_among_any_others(#[case] finalizers: Value, #[case] holds: bool) {
    let p = provider("p", "proxmox", json!({}), json!({}));
    let desired = desired_machine(
        &vm(json!({"providerRef": {"name": "p"}, "source": {"proxmox": {"vmid": 100}}, "cpu": {"cores": 1}, "memoryMiB": 512})),
        &p,
        None,
        None,
    )
    .expect("builds");
    let mut existing = desired.clone();
    existing["metadata"]["finalizers"] = finalizers;
    assert_eq!(machine_holds(&existing, &desired), holds);
    existing["spec"]["memoryMiB"] = json!(1024);
    assert!(
        !machine_holds(&existing, &desired),
        "a changed spec is still a change"
    );
}

#[test]
fn controller_owner_is_recognised_by_uid_and_flag() {
    let refs = json!([{"uid": "u1", "controller": true}, {"uid": "u2"}]);
    assert!(controlled_by(Some(&refs), "u1"));
    assert!(!controlled_by(Some(&refs), "u2"));
    assert!(!controlled_by(None, "u1"));
}

#[test]
fn removing_an_owned_field_is_seen_as_a_change() {
    let p = provider("p", "proxmox", json!({}), json!({}));
    let base = json!({"providerRef": {"name": "p"}, "source": {"proxmox": {"vmid": 100}}, "cpu": {"cores": 1}, "memoryMiB": 512});
    let mut with_net = base.clone();
    with_net["networks"] = json!([{"name": "net0", "network": "vmbr0"}]);
    let applied = desired_machine(&vm(with_net), &p, None, None).expect("builds");
    let without = desired_machine(&vm(base), &p, None, None).expect("builds");
    // Same object with the network: nothing to send.
    assert!(contains(&applied, &applied));
    // The network was removed from the VM: the machine must be re-applied.
    assert!(!contains(&applied, &without));
}

#[test]
fn power_state_is_copied_only_when_the_vm_sets_it() {
    let p = provider("p", "proxmox", json!({}), json!({}));
    let base = json!({"providerRef": {"name": "p"}, "source": {"proxmox": {"vmid": 100}}, "cpu": {"cores": 1}, "memoryMiB": 512});
    let unset = desired_machine(&vm(base.clone()), &p, None, None).expect("builds");
    assert_eq!(
        unset["spec"].get("powerState"),
        None,
        "unset: the provider's default (On)"
    );
    let mut off = base;
    off["powerState"] = json!("Off");
    let m = desired_machine(&vm(off), &p, None, None).expect("builds");
    assert_eq!(m["spec"]["powerState"], "Off");
    let typed: banlieue_api::infrastructure::ProxmoxMachine = serde_json::from_value(m).expect("typed");
    assert_eq!(
        typed.spec.power_state,
        Some(banlieue_api::common::PowerState::Off)
    );
}

#[rstest]
#[case::proxmox("proxmox", "ProxmoxCluster")]
#[case::libvirt("libvirt", "LibvirtCluster")]
#[case::vsphere("vsphere", "VSphereCluster")]
fn infra_cluster_per_provider_and_namespace(#[case] backend: &str, #[case] kind: &str) {
    let mut p = provider("pve-a", backend, json!({}), json!({}));
    p.metadata.uid = Some("provider-uid".into());
    let c = desired_cluster(&p, "apps").expect("builds");
    assert_eq!(
        c,
        json!({
            "apiVersion": "infrastructure.banlieue.io/v1alpha1",
            "kind": kind,
            "metadata": {
                "name": "banlieue-pve-a", "namespace": "apps",
                "labels": {"banlieue.io/provider": "pve-a", "app.kubernetes.io/managed-by": "banlieue-controller"},
                "ownerReferences": [{"apiVersion": "banlieue.io/v1alpha1", "kind": "Provider",
                    "name": "pve-a", "uid": "provider-uid", "controller": true, "blockOwnerDeletion": true}],
            },
            "spec": {"providerRef": {"name": "pve-a"}},
        })
    );
    // Long Provider names still give a valid object name.
    let long = provider(&"p".repeat(200), backend, json!({}), json!({}));
    let name = desired_cluster(&long, "apps").expect("builds")["metadata"]["name"].clone();
    assert!(name.as_str().is_some_and(|n| n.len() <= 63), "{name}");
}

#[test]
fn the_typed_proxmox_cluster_accepts_the_desired_object() {
    let p = provider("pve-a", "proxmox", json!({}), json!({}));
    let c = desired_cluster(&p, "apps").expect("builds");
    let typed: banlieue_api::infrastructure::ProxmoxCluster = serde_json::from_value(c).expect("typed");
    assert_eq!(typed.spec.provider_ref.map(|r| r.name).as_deref(), Some("pve-a"));
    assert_eq!(typed.spec.endpoint, None);
}

#[rstest::rstest]
#[case::proxmox("proxmox", json!({"proxmox": {"vmid": 100}}))]
#[case::libvirt("libvirt", json!({"libvirt": {"pool": "default", "volume": "base.qcow2"}}))]
#[case::vsphere("vsphere", json!({"vsphere": {"template": "ubuntu"}}))]
fn restart_policy_is_copied_only_when_the_vm_sets_it(
    #[case] backend: &str,
    #[case] source: serde_json::Value,
) {
    let p = provider("p", backend, json!({}), json!({}));
    let base = json!({"providerRef": {"name": "p"}, "source": source, "cpu": {"cores": 1}, "memoryMiB": 512});
    let unset = desired_machine(&vm(base.clone()), &p, None, None).expect("builds");
    assert_eq!(
        unset["spec"].get("restartPolicy"),
        None,
        "unset: Manual on both sides, and the applied spec of existing VMs does not change"
    );
    let mut automatic = base;
    automatic["restartPolicy"] = json!("Automatic");
    let m = desired_machine(&vm(automatic), &p, None, None).expect("builds");
    assert_eq!(m["spec"]["restartPolicy"], "Automatic", "{backend}");
}

#[test]
fn a_field_the_backend_cannot_honour_is_refused_naming_it_and_the_backend() {
    let spec = json!({
        "providerRef": {"name": "lab"}, "source": {"libvirt": {"volume": "u.qcow2", "pool": "images"}},
        "cpu": {"cores": 1}, "memoryMiB": 512, "placement": {"node": "host-a"},
    });
    let p = provider("lab", "libvirt", json!({}), json!({"endpoint": "qemu:///system"}));
    let err = desired_machine(&vm(spec.clone()), &p, None, None).expect_err("no node on libvirt");
    assert_eq!(err.reason(), "UnsupportedField");
    let message = err.to_string();
    assert!(
        message.contains("spec.placement.node")
            && message.contains("the libvirt provider")
            && message.contains("Provider lab"),
        "{message}"
    );
    // The same placement is honoured where the backend has nodes.
    let mut on_proxmox = spec;
    on_proxmox["source"] = json!({"proxmox": {"vmid": 100}});
    on_proxmox["providerRef"] = json!({"name": "pve"});
    let pve = provider("pve", "proxmox", json!({}), json!({}));
    let m = desired_machine(&vm(on_proxmox), &pve, None, None).expect("proxmox pins to a node");
    assert_eq!(m["spec"]["targetNode"], "host-a");
}

#[test]
fn a_refused_field_of_the_vm_or_its_image_is_named_with_its_kind() {
    let v = vm(json!({
        "providerRef": {"name": "vc"}, "source": {"vsphere": {"template": "t"}},
        "cpu": {"cores": 1}, "memoryMiB": 512,
        "networks": [{"name": "eth0", "network": "VM Network", "vlan": 7}],
    }));
    let vc = provider("vc", "vsphere", json!({}), json!({}));
    let err = desired_machine(&v, &vc, None, None).expect_err("a VLAN is the port group's");
    assert!(
        err.to_string().contains("VirtualMachine web") && err.to_string().contains("spec.networks[0].vlan"),
        "{err}"
    );
    let mut windows = image();
    windows.spec.os_type = Some(banlieue_api::banlieue::OsType::Windows);
    let v = vm(
        json!({"providerRef": {"name": "pve"}, "imageRef": {"name": "ubuntu"}, "cpu": {"cores": 1}, "memoryMiB": 512}),
    );
    let pve = provider("pve", "proxmox", json!({}), json!({}));
    let err = desired_machine(&v, &pve, None, Some(&windows)).expect_err("no cloudbase-init");
    assert!(
        err.to_string().contains("VirtualMachineImage ubuntu") && err.to_string().contains("spec.osType"),
        "{err}"
    );
}

#[test]
fn a_created_machine_keeps_what_the_providers_defaults_gave_it() {
    let v = vm(
        json!({"providerRef": {"name": "p"}, "source": {"proxmox": {"vmid": 100}}, "cpu": {"cores": 2}, "memoryMiB": 1024}),
    );
    let entry = entry_for(Backend::Proxmox).expect("proxmox");
    let p = provider(
        "p",
        "proxmox",
        json!({}),
        json!({"defaults": {"storage": "slow", "network": "vmbr9", "resourcePool": "new"}}),
    );
    let mut desired = desired_machine(&v, &p, None, None).expect("builds");
    let existing = json!({"spec": {
        "providerID": "proxmox://c/100", "storage": "fast",
        "networks": [{"name": "net0", "network": "vmbr0"}], "cpu": {"cores": 1},
    }});
    keep_created_defaults(&mut desired, &existing, entry);
    assert_eq!(
        desired["spec"]["storage"], "fast",
        "the default at creation stays"
    );
    assert_eq!(
        desired["spec"]["networks"],
        json!([{"name": "net0", "network": "vmbr9"}]),
        "networks are the VM's business (its own removed ones must go)"
    );
    assert_eq!(desired["spec"].get("pool"), None, "no pool at creation: none now");
    assert_eq!(
        desired["spec"]["cpu"],
        json!({"cores": 2}),
        "the VM's own ask still reaches it"
    );
    assert_eq!(
        desired["metadata"]["annotations"][APPLIED_SPEC_ANNOTATION],
        json!(spec_digest(&desired["spec"])),
        "the digest describes the spec sent"
    );
    // Not created yet (no providerID): the defaults as they are now.
    let mut fresh = desired_machine(&v, &p, None, None).expect("builds");
    keep_created_defaults(&mut fresh, &json!({"spec": {"storage": "fast"}}), entry);
    assert_eq!(fresh["spec"]["storage"], "slow");
}

/// An image's `firmware` reaches every backend's machine, its `seedDriveBus` those of the
/// backends that attach a seed drive (Proxmox, libvirt), not vSphere's (guestinfo, no drive);
/// unset, the machine has neither.
#[rstest]
#[case::proxmox("proxmox", Some("SCSI"))]
#[case::libvirt("libvirt", Some("SCSI"))]
#[case::vsphere("vsphere", None)]
fn the_images_seed_drive_bus_and_firmware_reach_the_machine(
    #[case] backend: &str,
    #[case] expected: Option<&str>,
) {
    let with_vsphere = |bus: Value| -> VirtualMachineImage {
        serde_json::from_value(json!({
            "apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachineImage",
            "metadata": {"name": "ubuntu"},
            "spec": {"seedDriveBus": bus, "sources": [
                {"proxmox": {"vmid": 9000}},
                {"libvirt": {"volume": "ubuntu.qcow2", "pool": "images"}},
                {"vsphere": {"template": "ubuntu"}},
            ]},
        }))
        .expect("valid image")
    };
    let mut arm = with_vsphere(json!("SCSI"));
    arm.spec.firmware = Some(banlieue_api::common::Firmware::UEFI);
    let v = vm(
        json!({"providerRef": {"name": "p"}, "imageRef": {"name": "ubuntu"}, "cpu": {"cores": 1}, "memoryMiB": 512}),
    );
    let p = provider("p", backend, json!({}), json!({}));
    let machine = desired_machine(&v, &p, None, Some(&arm)).expect("builds");
    assert_eq!(machine["spec"]["seedDriveBus"].as_str(), expected, "{machine}");
    assert_eq!(machine["spec"]["firmware"].as_str(), Some("UEFI"), "{machine}");
    let plain = desired_machine(&v, &p, None, Some(&with_vsphere(Value::Null))).expect("builds");
    assert!(plain["spec"].get("seedDriveBus").is_none(), "{plain}");
    assert!(plain["spec"].get("firmware").is_none(), "{plain}");
}

/// The VM's readiness checks reach its machine on every backend (the same struct there).
#[rstest]
#[case::proxmox("proxmox")]
#[case::libvirt("libvirt")]
#[case::vsphere("vsphere")]
fn the_vms_readiness_checks_reach_the_machine(#[case] backend: &str) {
    let source = match backend {
        "proxmox" => json!({"proxmox": {"vmid": 9000}}),
        "libvirt" => json!({"libvirt": {"volume": "v", "pool": "p"}}),
        _ => json!({"vsphere": {"template": "t"}}),
    };
    let v = vm(
        json!({"providerRef": {"name": "p"}, "source": source, "cpu": {"cores": 1}, "memoryMiB": 512,
                      "readinessChecks": {"skipCloudInit": true}}),
    );
    let p = provider("p", backend, json!({}), json!({}));
    let machine = desired_machine(&v, &p, None, None).expect("builds");
    assert_eq!(
        machine["spec"]["readinessChecks"],
        json!({"skipCloudInit": true}),
        "{machine}"
    );
}
