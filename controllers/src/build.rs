//! Pure steps of a VirtualMachine reconcile: choose the Provider, merge the class into the
//! machine shape, resolve the image for the chosen backend, and build the infrastructure
//! machine the controller server-side applies.
//!
//! Nothing here performs I/O; every function is a function of its arguments, so the unit
//! tests below cover the decisions and the reconciler only fetches and writes.

use std::collections::BTreeMap;

use banlieue_api::banlieue::{
    Backend, Provider, ProviderAllocation, VirtualMachine, VirtualMachineClass, VirtualMachineImage,
};
use banlieue_api::common::{Cpu, Disk, NetworkInterface};
use banlieue_api::condition;
use banlieue_api::support::{self, Kind};
use kube::core::{Selector, SelectorExt};
use kube::{Resource, ResourceExt};
use serde_json::{Map, Value, json};
use sha2::Digest;

use crate::provider_use;
use crate::registry::{self, BackendEntry};

/// Field manager of every write the controller makes (server-side apply).
pub const FIELD_MANAGER: &str = "banlieue-controller";
/// Label on an infrastructure machine naming the VirtualMachine that drives it.
pub const VIRTUAL_MACHINE_LABEL: &str = "banlieue.io/virtual-machine";
/// Label on an infrastructure machine naming the Provider it was placed on.
pub const PROVIDER_LABEL: &str = "banlieue.io/provider";
/// Annotation on an infrastructure machine: SHA-256 of the spec fields the controller last
/// applied. A field the controller stops setting (e.g. a removed network) changes it, so the
/// machine is re-applied and the server-side apply removes the field.
pub const APPLIED_SPEC_ANNOTATION: &str = "banlieue.io/applied-spec-sha256";
/// `app.kubernetes.io/managed-by` value on infrastructure machines the controller creates.
pub const MANAGED_BY: &str = "banlieue-controller";
/// The `app.kubernetes.io/managed-by` label key.
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// Finalizer on a VirtualMachine: held until its infrastructure machine is gone.
pub const FINALIZER: &str = banlieue_api::standalone::VIRTUAL_MACHINE_FINALIZER;

/// A VirtualMachine that cannot be realised as written: the user (or operator) must change
/// something. Each variant is a condition reason; the message says what to do.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Invalid {
    /// `spec.providerRef` (or the Provider recorded in `status.provider`) does not exist.
    #[error("Provider {0} not found: create it, or point spec.providerRef at an existing Provider")]
    ProviderNotFound(String),
    /// `spec.placement.providerSelector` matches no usable Provider.
    #[error(
        "no Provider matches spec.placement.providerSelector with room left, access from this namespace and an image for its backend: label a Provider or change the selector"
    )]
    NoProviderMatches,
    /// The selector cannot be parsed as a label selector.
    #[error("spec.placement.providerSelector is not a valid label selector: {0}")]
    BadSelector(String),
    /// The Provider's namespaceSelector excludes this VirtualMachine's namespace.
    #[error("Provider {0} does not admit VirtualMachines from this namespace (its spec.namespaceSelector)")]
    NamespaceNotAllowed(String),
    /// No registry entry for the Provider's backend.
    #[error("backend {0} of the Provider is not supported by this controller version")]
    UnsupportedBackend(&'static str),
    /// `spec.classRef` names a missing VirtualMachineClass.
    #[error("VirtualMachineClass {0} not found: create it or fix spec.classRef")]
    ClassNotFound(String),
    /// `spec.imageRef` names a missing VirtualMachineImage.
    #[error("VirtualMachineImage {0} not found: create it or fix spec.imageRef")]
    ImageNotFound(String),
    /// Neither the image nor `spec.source` has a template for the chosen backend.
    #[error(
        "no image source for backend {backend} (Provider {provider}): add a {backend} entry to the image's spec.sources or to spec.source"
    )]
    NoSourceForBackend {
        /// Wire form of the backend.
        backend: &'static str,
        /// The chosen Provider.
        provider: String,
    },
    /// An infrastructure machine of the VirtualMachine's name exists but is not controlled by
    /// it (created by hand, by CAPI, or by an earlier VirtualMachine of the same name).
    #[error(
        "{kind} {name} already exists and is not controlled by this VirtualMachine: delete it or rename the VirtualMachine"
    )]
    MachineConflict {
        /// Kind of the infrastructure machine.
        kind: &'static str,
        /// Its name.
        name: String,
    },
    /// The infra cluster object for the Provider exists but is not controlled by the Provider.
    #[error(
        "{kind} {name} already exists and is not controlled by the Provider: delete it so that the controller can create its own"
    )]
    InfraClusterConflict {
        /// Kind of the infra cluster.
        kind: &'static str,
        /// Its name.
        name: String,
    },
    /// Neither the VirtualMachine nor its class gives CPU and memory.
    #[error("no CPU or memory size: set spec.cpu and spec.memoryMiB, or spec.classRef")]
    NoSize,
    /// The chosen backend's infrastructure kinds are not installed in this cluster.
    #[error(
        "{kind} is not installed in this cluster (Provider {provider}): install its provider, e.g. clusterctl init --infrastructure banlieue-{backend}"
    )]
    KindNotInstalled {
        /// The infrastructure machine kind.
        kind: &'static str,
        /// Wire form of the backend.
        backend: &'static str,
        /// The chosen Provider.
        provider: String,
    },
    /// The Provider named by `spec.providerRef` has no room left for this VirtualMachine in
    /// one of its declared capacities (`spec.capacity`).
    #[error("Provider {provider} is full: {}", full_message(shortfall))]
    ProviderFull {
        /// The Provider.
        provider: String,
        /// The capacity that is exceeded.
        shortfall: provider_use::Shortfall,
    },
    /// The Provider named by `spec.providerRef` limits storage and the VirtualMachine declares
    /// no disk whose size could be counted.
    #[error(
        "Provider {0} limits storage (spec.capacity.storageGiB) and this VirtualMachine declares no disk: list its disks with their sizeGiB (spec.disks, or its class's) so that what it takes can be counted"
    )]
    StorageNotDeclared(String),
    /// The VirtualMachine, its class or its image sets a field the Provider's backend cannot
    /// honour (`banlieue_api::support`); the message names each.
    #[error("{0}")]
    UnsupportedField(String),
    /// The Provider named by `spec.providerRef` is being deleted.
    #[error("Provider {0} is being deleted and takes no new VirtualMachines: choose another Provider")]
    ProviderDeleting(String),
}

impl Invalid {
    /// The condition reason (CamelCase) for this problem.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::ProviderNotFound(_) => "ProviderNotFound",
            Self::NoProviderMatches => "NoProviderMatches",
            Self::BadSelector(_) => "InvalidProviderSelector",
            Self::NamespaceNotAllowed(_) => "NamespaceNotAllowed",
            Self::UnsupportedBackend(_) => "UnsupportedBackend",
            Self::ClassNotFound(_) => "ClassNotFound",
            Self::ImageNotFound(_) => "ImageNotFound",
            Self::NoSourceForBackend { .. } => "NoImageSourceForBackend",
            Self::MachineConflict { .. } => "InfrastructureMachineConflict",
            Self::InfraClusterConflict { .. } => "InfrastructureClusterConflict",
            Self::NoSize => "NoSize",
            Self::KindNotInstalled { .. } => "ProviderKindNotInstalled",
            Self::ProviderFull { .. } => "ProviderFull",
            Self::StorageNotDeclared(_) => "StorageNotDeclared",
            Self::ProviderDeleting(_) => provider_use::REFUSED_PROVIDER_DELETING,
            Self::UnsupportedField(_) => support::UNSUPPORTED_FIELD,
        }
    }
}

fn full_message(s: &provider_use::Shortfall) -> String {
    if s.field == "virtualMachines" {
        return format!(
            "{} of its {} VirtualMachines (spec.capacity.virtualMachines) are placed; delete one of them or raise the capacity, and this VirtualMachine is placed then",
            s.used, s.capacity
        );
    }
    format!(
        "its VirtualMachines take {} of its {} (spec.capacity.{}) and this one needs {}; delete or shrink one of them or raise the capacity, and this VirtualMachine is placed then",
        s.used, s.capacity, s.field, s.wanted
    )
}

/// Whether `wanted` fits on `provider` next to what `placed` says its VMs take.
fn room_for(
    provider: &Provider,
    placed: &BTreeMap<String, ProviderAllocation>,
    wanted: &ProviderAllocation,
) -> Result<(), Invalid> {
    let name = provider.name_any();
    let limits_storage = provider
        .spec
        .capacity
        .as_ref()
        .is_some_and(|c| c.storage_gib.is_some());
    if limits_storage && wanted.storage_gib.unwrap_or(0) == 0 {
        return Err(Invalid::StorageNotDeclared(name));
    }
    match provider_use::shortfall(provider, placed.get(&name), wanted) {
        Some(shortfall) => Err(Invalid::ProviderFull {
            provider: name,
            shortfall,
        }),
        None => Ok(()),
    }
}

fn selector(
    sel: &k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector,
) -> Result<Selector, Invalid> {
    Selector::try_from(sel.clone()).map_err(|e| Invalid::BadSelector(e.to_string()))
}

fn admits_namespace(
    provider: &Provider,
    namespace_labels: &BTreeMap<String, String>,
) -> Result<bool, Invalid> {
    provider
        .admits_namespace(namespace_labels)
        .map_err(Invalid::BadSelector)
}

fn provider_ready(provider: &Provider) -> bool {
    provider
        .status
        .as_ref()
        .is_some_and(|s| condition::is_true(&s.conditions, condition::READY))
}

/// Chooses the Provider of `vm` among `providers` (every Provider of the cluster).
///
/// * A VM that already has `status.provider` stays there (a VM is never moved silently).
/// * Otherwise `spec.providerRef` names it; it must not be deleting and must have room for
///   `wanted` (what the VM takes, [`allocation`]) in every capacity it declares.
/// * Otherwise `spec.placement.providerSelector` selects candidates by label; candidates must
///   admit the namespace, not be deleting, have a registered backend, room for `wanted` and a
///   source for their backend (`has_source`). The pick is deterministic: Ready Providers
///   first, then the most free VM slots (undeclared capacity counts as unlimited), then the
///   name.
///
/// `placed` is what the VirtualMachines already placed take of each Provider (not counting
/// `vm`, [`provider_use::placed_totals`]); it must be current for every Provider that
/// declares a capacity.
pub fn choose_provider<'a>(
    vm: &VirtualMachine,
    providers: &'a [Provider],
    namespace_labels: &BTreeMap<String, String>,
    placed: &BTreeMap<String, ProviderAllocation>,
    wanted: &ProviderAllocation,
    has_source: impl Fn(&Provider) -> bool,
) -> Result<&'a Provider, Invalid> {
    let free_slots = |p: &Provider| provider_use::free_slots(p, placed.get(&p.name_any()));
    let find = |name: &str| {
        providers
            .iter()
            .find(|p| p.name_any() == name)
            .ok_or(Invalid::ProviderNotFound(name.to_owned()))
    };
    if let Some(name) = vm.status.as_ref().and_then(|s| s.provider.as_deref()) {
        // Placed: it stays, whatever the Provider's capacity or deletion (so it can be deleted).
        let provider = find(name)?;
        if !admits_namespace(provider, namespace_labels)? {
            return Err(Invalid::NamespaceNotAllowed(name.to_owned()));
        }
        return Ok(provider);
    }
    if let Some(name) = vm.spec.provider_ref.as_ref().map(|r| r.name.as_str()) {
        let provider = find(name)?;
        if !admits_namespace(provider, namespace_labels)? {
            return Err(Invalid::NamespaceNotAllowed(name.to_owned()));
        }
        if provider_use::deleting(provider) {
            return Err(Invalid::ProviderDeleting(name.to_owned()));
        }
        room_for(provider, placed, wanted)?;
        return Ok(provider);
    }
    let Some(sel) = vm
        .spec
        .placement
        .as_ref()
        .and_then(|p| p.provider_selector.as_ref())
    else {
        // The CRD requires one of the two; an object bypassing validation lands here.
        return Err(Invalid::NoProviderMatches);
    };
    let sel = selector(sel)?;
    let mut candidates = Vec::new();
    for p in providers {
        if sel.matches(p.labels())
            && admits_namespace(p, namespace_labels)?
            && !provider_use::deleting(p)
            && registry::lookup(p.spec.backend).is_some()
            && room_for(p, placed, wanted).is_ok()
            && has_source(p)
        {
            candidates.push(p);
        }
    }
    candidates.sort_by(|a, b| {
        provider_ready(b)
            .cmp(&provider_ready(a))
            .then_with(|| {
                free_slots(b)
                    .unwrap_or(u32::MAX)
                    .cmp(&free_slots(a).unwrap_or(u32::MAX))
            })
            .then_with(|| a.name_any().cmp(&b.name_any()))
    });
    candidates.first().copied().ok_or(Invalid::NoProviderMatches)
}

/// The image source (the machine's `spec.source`) of `vm` on `provider`: from `spec.source`,
/// or the first entry of the VirtualMachineImage for the backend whose `provider` (if any)
/// names `provider`. `None` when there is none for this backend.
pub fn image_source(
    vm: &VirtualMachine,
    provider: &Provider,
    image: Option<&VirtualMachineImage>,
) -> Option<Value> {
    let entry = registry::lookup(provider.spec.backend)?;
    if let Some(source) = &vm.spec.source {
        return serde_json::to_value(source).ok()?.get(entry.image_key).cloned();
    }
    let provider_name = provider.name_any();
    image?.spec.sources.iter().find_map(|s| {
        if s.provider.as_ref().is_some_and(|p| *p != provider_name) {
            return None;
        }
        serde_json::to_value(s).ok()?.get(entry.image_key).cloned()
    })
}

/// CPU, memory and disks of `vm` after merging its class: the VM's own `cpu`, `memoryMiB` and
/// same-named disks win; the class's disks come first (in class order), then the VM's others.
pub fn sizing(
    vm: &VirtualMachine,
    class: Option<&VirtualMachineClass>,
) -> Result<(Cpu, u64, Vec<Disk>), Invalid> {
    let cpu = vm
        .spec
        .cpu
        .clone()
        .or_else(|| class.map(|c| c.spec.cpu.clone()))
        .ok_or(Invalid::NoSize)?;
    let memory = vm
        .spec
        .memory_mib
        .or_else(|| class.map(|c| c.spec.memory_mib))
        .ok_or(Invalid::NoSize)?;
    let mut disks: Vec<Disk> = class
        .map(|c| {
            c.spec
                .disks
                .iter()
                .map(|d| Disk {
                    name: d.name.clone(),
                    size_gib: d.size_gib,
                    storage: d.storage.clone(),
                })
                .collect()
        })
        .unwrap_or_default();
    for disk in &vm.spec.disks {
        match disks.iter_mut().find(|d| d.name == disk.name) {
            Some(existing) => *existing = disk.clone(),
            None => disks.push(disk.clone()),
        }
    }
    Ok((cpu, memory, disks))
}

/// What `vm` takes of its Provider's capacity: one VM, `cores × sockets` vCPUs, its memory and
/// the sizes of its disks (class included, [`sizing`]).
pub fn allocation(
    vm: &VirtualMachine,
    class: Option<&VirtualMachineClass>,
) -> Result<ProviderAllocation, Invalid> {
    let (cpu, memory_mib, disks) = sizing(vm, class)?;
    Ok(ProviderAllocation {
        vcpus: Some(cpu.cores.saturating_mul(cpu.sockets.unwrap_or(1))),
        memory_mib: Some(memory_mib),
        storage_gib: Some(disks.iter().map(|d| d.size_gib).sum()),
        virtual_machines: Some(1),
    })
}

/// Refuses what `backend` cannot honour of the VirtualMachine, its class and its image (the
/// declarations of `banlieue_api::support`), before any infrastructure machine is made.
pub fn unsupported_fields(
    vm: &VirtualMachine,
    backend: Backend,
    provider: &str,
    class: Option<&VirtualMachineClass>,
    image: Option<&VirtualMachineImage>,
) -> Result<(), Invalid> {
    let mut found = Vec::new();
    let mut check = |kind: Kind, name: String, spec: Value| {
        let refusals = support::refusals(&support::fields(kind, backend), &spec);
        if !refusals.is_empty() {
            let kind = kind.name(backend);
            found.push(support::refusal_message(
                &format!("{kind} {name}"),
                backend.as_str(),
                &refusals,
            ));
        }
    };
    check(Kind::VirtualMachine, vm.name_any(), to_value(&vm.spec));
    if let Some(class) = class {
        check(Kind::VirtualMachineClass, class.name_any(), to_value(&class.spec));
    }
    if let Some(image) = image {
        check(Kind::VirtualMachineImage, image.name_any(), to_value(&image.spec));
    }
    if found.is_empty() {
        return Ok(());
    }
    Err(Invalid::UnsupportedField(format!(
        "{} (Provider {provider})",
        found.join("; ")
    )))
}

fn to_value<T: serde::Serialize>(v: &T) -> Value {
    // The banlieue-api types serialize infallibly (plain structs, string-keyed maps).
    serde_json::to_value(v).unwrap_or(Value::Null)
}

/// The infrastructure machine that realises `vm` on `provider`, as the object the controller
/// server-side applies: `apiVersion`, `kind`, `metadata` (same name and namespace as the VM,
/// labels, an ownerReference with `controller: true`) and `spec` (only the fields the
/// controller owns; never `providerID`, which the provider sets).
pub fn desired_machine(
    vm: &VirtualMachine,
    provider: &Provider,
    class: Option<&VirtualMachineClass>,
    image: Option<&VirtualMachineImage>,
) -> Result<Value, Invalid> {
    let entry: &BackendEntry = registry::lookup(provider.spec.backend)
        .ok_or(Invalid::UnsupportedBackend(provider.spec.backend.as_str()))?;
    let provider_name = provider.name_any();
    let source = image_source(vm, provider, image).ok_or_else(|| Invalid::NoSourceForBackend {
        backend: provider.spec.backend.as_str(),
        provider: provider_name.clone(),
    })?;
    unsupported_fields(vm, provider.spec.backend, &provider_name, class, image)?;
    let (cpu, memory, disks) = sizing(vm, class)?;
    let defaults = provider
        .spec
        .defaults
        .as_ref()
        .map(to_value)
        .unwrap_or(Value::Null);

    let mut spec = Map::new();
    spec.insert("providerRef".into(), json!({ "name": provider_name }));
    spec.insert("source".into(), source);
    spec.insert("cpu".into(), to_value(&cpu));
    spec.insert("memoryMiB".into(), json!(memory));
    if !disks.is_empty() {
        spec.insert("disks".into(), to_value(&disks));
    }
    let networks = if vm.spec.networks.is_empty() {
        defaults
            .get("network")
            .and_then(Value::as_str)
            .map(|n| vec![NetworkInterface::dhcp(entry.default_interface, n)])
            .unwrap_or_default()
    } else {
        vm.spec.networks.clone()
    };
    if !networks.is_empty() {
        spec.insert("networks".into(), to_value(&networks));
    }
    for (from, to) in entry.defaults {
        if let Some(v) = defaults.get(*from).filter(|v| !v.is_null()) {
            spec.insert((*to).into(), v.clone());
        }
    }
    if let (Some(field), Some(node)) = (
        entry.node_field,
        vm.spec.placement.as_ref().and_then(|p| p.node.as_ref()),
    ) {
        spec.insert(field.into(), json!(node));
    }
    if let (Some(field), Some(power)) = (entry.power_state_field, vm.spec.power_state) {
        spec.insert(field.into(), to_value(&power));
    }
    // Every backend's machine has spec.restartPolicy (the same enum); unset is Manual on both
    // sides, so an unset policy is not written (the applied spec of existing VMs stays the same).
    if let Some(policy) = vm.spec.restart_policy {
        spec.insert("restartPolicy".into(), to_value(&policy));
    }
    // Every backend's machine has spec.readinessChecks (the same struct).
    if let Some(checks) = &vm.spec.readiness_checks {
        spec.insert("readinessChecks".into(), to_value(checks));
    }
    if let (Some(field), Some(bus)) = (
        entry.seed_drive_bus_field,
        image.and_then(|i| i.spec.seed_drive_bus),
    ) {
        spec.insert(field.into(), to_value(&bus));
    }
    if let (Some(field), Some(firmware)) = (entry.firmware_field, image.and_then(|i| i.spec.firmware)) {
        spec.insert(field.into(), to_value(&firmware));
    }

    let vm_name = vm.name_any();
    let spec = Value::Object(spec);
    let digest = spec_digest(&spec);
    Ok(json!({
        "apiVersion": entry.api_version(),
        "kind": entry.kind,
        "metadata": {
            "name": vm_name,
            "namespace": vm.namespace(),
            "annotations": { APPLIED_SPEC_ANNOTATION: digest },
            "labels": {
                VIRTUAL_MACHINE_LABEL: vm_name,
                PROVIDER_LABEL: provider_name,
                MANAGED_BY_LABEL: MANAGED_BY,
            },
            "ownerReferences": [{
                "apiVersion": VirtualMachine::api_version(&()),
                "kind": VirtualMachine::kind(&()),
                "name": vm_name,
                "uid": vm.uid(),
                "controller": true,
                "blockOwnerDeletion": true,
            }],
            // The provider's own finalizer, written with the machine: the provider finds it
            // there and has nothing to add (one write fewer per VM).
            "finalizers": [entry.backend.finalizer()],
        },
        "spec": spec,
    }))
}

/// The [`APPLIED_SPEC_ANNOTATION`] value of a desired machine spec.
fn spec_digest(spec: &Value) -> String {
    hex::encode(sha2::Sha256::digest(spec.to_string().as_bytes()))
}

/// Keeps what the Provider's defaults gave a machine whose VM exists (`spec.providerID` set):
/// the fields the defaults fill (storage, pools, folders) act only when the VM is created, so a
/// later change of the Provider's defaults is for VMs created after it, not a change every
/// existing machine would report as `RecreateRequired`. What the VirtualMachine itself asks
/// still reaches its machine.
pub fn keep_created_defaults(desired: &mut Value, existing: &Value, entry: &BackendEntry) {
    let Some(existing_spec) = existing.get("spec").filter(|s| s.get("providerID").is_some()) else {
        return;
    };
    let Some(spec) = desired.get_mut("spec").and_then(Value::as_object_mut) else {
        return;
    };
    // (Not the default network: an empty `spec.networks` may also be the VM's own interfaces
    // removed, which must reach the machine.)
    for field in entry.defaults.iter().map(|(_, to)| *to) {
        match existing_spec.get(field) {
            Some(value) => {
                spec.insert(field.to_owned(), value.clone());
            }
            None => {
                spec.remove(field);
            }
        }
    }
    let digest = spec_digest(&Value::Object(spec.clone()));
    desired["metadata"]["annotations"][APPLIED_SPEC_ANNOTATION] = json!(digest);
}

/// Name of the infra cluster object of `provider` in every namespace (see
/// [`banlieue_api::standalone::infra_cluster_name`]).
pub fn infra_cluster_name(provider: &str) -> String {
    banlieue_api::standalone::infra_cluster_name(provider)
}

/// The infra cluster object through which the provider of `provider`'s backend learns endpoint,
/// credentials, TLS trust and nodes for machines in `namespace`, as the controller server-side
/// applies it: named [`infra_cluster_name`], labelled, owned by the (cluster-scoped) Provider
/// with `controller: true`, and with nothing in `spec` but `providerRef` (the provider owns
/// everything else, including `status`).
pub fn desired_cluster(provider: &Provider, namespace: &str) -> Result<Value, Invalid> {
    let entry = entry_for(provider.spec.backend)?;
    let name = provider.name_any();
    Ok(json!({
        "apiVersion": entry.api_version(),
        "kind": entry.cluster_kind,
        "metadata": {
            "name": infra_cluster_name(&name),
            "namespace": namespace,
            "labels": {
                PROVIDER_LABEL: name,
                MANAGED_BY_LABEL: MANAGED_BY,
            },
            "ownerReferences": [{
                "apiVersion": Provider::api_version(&()),
                "kind": Provider::kind(&()),
                "name": name,
                "uid": provider.uid(),
                "controller": true,
                "blockOwnerDeletion": true,
            }],
        },
        "spec": { "providerRef": { "name": name } },
    }))
}

/// The backend of a Provider as its registry entry, or why it cannot be used.
pub fn entry_for(backend: Backend) -> Result<&'static BackendEntry, Invalid> {
    registry::lookup(backend).ok_or(Invalid::UnsupportedBackend(backend.as_str()))
}

/// Whether the machine `existing` already holds everything the `desired` one sets ([`contains`]),
/// with `metadata.finalizers` read as a set: finalizers others hold may stand beside the
/// provider's.
pub fn machine_holds(existing: &Value, desired: &Value) -> bool {
    let finalizers = |v: &Value| -> Vec<Value> {
        v.pointer("/metadata/finalizers")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    };
    let held = finalizers(existing);
    if !finalizers(desired).iter().all(|f| held.contains(f)) {
        return false;
    }
    let mut desired = desired.clone();
    if let Some(metadata) = desired.get_mut("metadata").and_then(Value::as_object_mut) {
        metadata.remove("finalizers");
    }
    contains(existing, &desired)
}

/// Whether `existing` already holds everything in `desired`: every key of an object in
/// `desired` has an equal value in `existing` (which may have more keys, e.g. apiserver
/// defaults, the provider's `providerID`, or its status), arrays element by element and of equal
/// length. When it does, a server-side apply would change nothing and is not sent.
pub fn contains(existing: &Value, desired: &Value) -> bool {
    match (existing, desired) {
        (Value::Object(e), Value::Object(d)) => d
            .iter()
            .all(|(k, dv)| e.get(k).is_some_and(|ev| contains(ev, dv))),
        (Value::Array(e), Value::Array(d)) => {
            e.len() == d.len() && e.iter().zip(d).all(|(ev, dv)| contains(ev, dv))
        }
        (Value::Number(e), Value::Number(d)) => e.as_f64() == d.as_f64(),
        _ => existing == desired,
    }
}

/// Whether the object with these `ownerReferences` (JSON) is controlled by the object with `uid`.
pub fn controlled_by(owner_references: Option<&Value>, uid: &str) -> bool {
    owner_references.and_then(Value::as_array).is_some_and(|refs| {
        refs.iter().any(|r| {
            r.get("uid").and_then(Value::as_str) == Some(uid)
                && r.get("controller") == Some(&Value::Bool(true))
        })
    })
}

#[cfg(test)]
#[path = "build_tests.rs"]
mod tests;
