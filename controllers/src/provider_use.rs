//! Pure rules of a Provider's use by VirtualMachines: who uses it, how many it holds, whether it
//! may take one more, and what its deletion waits for.
//!
//! A VirtualMachine *is placed* on a Provider once its `status.provider` names it (the
//! controller records that in the same reconcile that creates the infrastructure machine). It
//! *uses* the Provider when it is placed there or its `spec.providerRef` names it (unless the
//! controller refused it because the Provider is being deleted): such a Provider keeps the
//! finalizer [`IN_USE_FINALIZER`] until the last of them is gone, so VMs are never left without
//! the Provider they need to be deleted.

use std::collections::BTreeMap;

use banlieue_api::banlieue::{Provider, ProviderAllocation, VirtualMachine};
use banlieue_api::condition;
use kube::ResourceExt;

/// Finalizer on a Provider that VirtualMachines use.
pub const IN_USE_FINALIZER: &str = "banlieue.io/provider-in-use";

/// Reason of the Provider's `Ready` condition while its deletion waits for VirtualMachines.
pub const DELETION_BLOCKED: &str = "DeletionBlockedByVirtualMachines";

/// The Provider a VirtualMachine is placed on.
pub fn placed_on(vm: &VirtualMachine) -> Option<&str> {
    vm.status.as_ref().and_then(|s| s.provider.as_deref())
}

/// Reason of a VirtualMachine's `Ready` condition when the controller refused to place it on a
/// Provider that is being deleted (see `build::Invalid::ProviderDeleting`).
pub const REFUSED_PROVIDER_DELETING: &str = "ProviderDeleting";

/// Whether `vm` uses Provider `provider`: placed there, or named by `spec.providerRef` and not
/// refused because that Provider is being deleted.
pub fn uses(vm: &VirtualMachine, provider: &str) -> bool {
    if placed_on(vm) == Some(provider) {
        return true;
    }
    let refused = vm.status.as_ref().is_some_and(|s| {
        condition::find(&s.conditions, condition::READY)
            .is_some_and(|c| c.reason == REFUSED_PROVIDER_DELETING)
    });
    vm.spec.provider_ref.as_ref().is_some_and(|r| r.name == provider) && !refused
}

/// `namespace/name` of every VirtualMachine of `vms` that uses `provider`, sorted.
pub fn users<'a>(provider: &str, vms: impl IntoIterator<Item = &'a VirtualMachine>) -> Vec<String> {
    let mut users: Vec<String> = vms
        .into_iter()
        .filter(|vm| uses(vm, provider))
        .map(|vm| format!("{}/{}", vm.namespace().unwrap_or_default(), vm.name_any()))
        .collect();
    users.sort();
    users.dedup();
    users
}

/// What the VirtualMachines placed on each Provider take of it (by Provider name), not counting
/// the VirtualMachine with uid `except` (the one being placed): one VM each, plus what each
/// recorded in `status.allocated` (a VM placed before that was recorded counts as one VM).
pub fn placed_totals<'a>(
    vms: impl IntoIterator<Item = &'a VirtualMachine>,
    except: Option<&str>,
) -> BTreeMap<String, ProviderAllocation> {
    let mut totals: BTreeMap<String, ProviderAllocation> = BTreeMap::new();
    for vm in vms {
        if except.is_some() && vm.metadata.uid.as_deref() == except {
            continue;
        }
        if let Some(provider) = placed_on(vm) {
            let own = vm
                .status
                .as_ref()
                .and_then(|s| s.allocated.clone())
                .unwrap_or_default();
            let total = totals.entry(provider.to_owned()).or_insert_with(empty);
            add(
                total,
                &ProviderAllocation {
                    virtual_machines: Some(1),
                    ..own
                },
            );
        }
    }
    totals
}

/// Nothing allocated (every resource zero).
pub fn empty() -> ProviderAllocation {
    ProviderAllocation {
        vcpus: Some(0),
        memory_mib: Some(0),
        storage_gib: Some(0),
        virtual_machines: Some(0),
    }
}

fn add(total: &mut ProviderAllocation, more: &ProviderAllocation) {
    fn sum<T: Copy + Default + std::ops::Add<Output = T>>(a: Option<T>, b: Option<T>) -> Option<T> {
        Some(a.unwrap_or_default() + b.unwrap_or_default())
    }
    total.vcpus = sum(total.vcpus, more.vcpus);
    total.memory_mib = sum(total.memory_mib, more.memory_mib);
    total.storage_gib = sum(total.storage_gib, more.storage_gib);
    total.virtual_machines = sum(total.virtual_machines, more.virtual_machines);
}

/// A declared capacity of a Provider that one more VirtualMachine would exceed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shortfall {
    /// The field of `spec.capacity` (`virtualMachines`, `vcpus`, `memoryMiB`, `storageGiB`).
    pub field: &'static str,
    /// Its declared value.
    pub capacity: u64,
    /// What the VirtualMachines placed there take of it.
    pub used: u64,
    /// What the VirtualMachine being placed needs (1 for `virtualMachines`).
    pub wanted: u64,
}

/// The first declared capacity of `provider` that `wanted` (one VirtualMachine's
/// [`ProviderAllocation`]) does not fit in next to `used` (what its placed VMs take), if any.
/// Undeclared capacities are unlimited.
pub fn shortfall(
    provider: &Provider,
    used: Option<&ProviderAllocation>,
    wanted: &ProviderAllocation,
) -> Option<Shortfall> {
    let capacity = provider.spec.capacity.as_ref()?;
    let used = used.cloned().unwrap_or_else(empty);
    let limits = [
        (
            "virtualMachines",
            capacity.virtual_machines.map(u64::from),
            used.virtual_machines.map(u64::from),
            Some(1),
        ),
        (
            "vcpus",
            capacity.vcpus.map(u64::from),
            used.vcpus.map(u64::from),
            wanted.vcpus.map(u64::from),
        ),
        (
            "memoryMiB",
            capacity.memory_mib,
            used.memory_mib,
            wanted.memory_mib,
        ),
        (
            "storageGiB",
            capacity.storage_gib,
            used.storage_gib,
            wanted.storage_gib,
        ),
    ];
    limits.into_iter().find_map(|(field, capacity, used, wanted)| {
        let (capacity, used, wanted) = (capacity?, used.unwrap_or(0), wanted.unwrap_or(0));
        (used.saturating_add(wanted) > capacity).then_some(Shortfall {
            field,
            capacity,
            used,
            wanted,
        })
    })
}

/// Free VM slots of `provider` next to `used`: `None` when it declares no VM capacity
/// (unlimited).
pub fn free_slots(provider: &Provider, used: Option<&ProviderAllocation>) -> Option<u32> {
    let capacity = provider.spec.capacity.as_ref()?.virtual_machines?;
    Some(capacity.saturating_sub(used.and_then(|u| u.virtual_machines).unwrap_or(0)))
}

/// Whether the Provider declares any capacity (placing on it needs a fresh count).
pub fn has_capacity(provider: &Provider) -> bool {
    provider.spec.capacity.as_ref().is_some_and(|c| {
        c.virtual_machines.is_some() || c.vcpus.is_some() || c.memory_mib.is_some() || c.storage_gib.is_some()
    })
}

/// Whether a deletion of the Provider was requested.
pub fn deleting(provider: &Provider) -> bool {
    provider.metadata.deletion_timestamp.is_some()
}

/// The message of a deletion that waits for `users` (at most ten named).
pub fn deletion_blocked_message(users: &[String]) -> String {
    const SHOWN: usize = 10;
    let mut named = users.iter().take(SHOWN).cloned().collect::<Vec<_>>().join(", ");
    if users.len() > SHOWN {
        named.push_str(&format!(" and {} more", users.len() - SHOWN));
    }
    format!(
        "deletion waits for {} VirtualMachine(s) that use this Provider: {named}; delete them \
         (kubectl delete virtualmachine -n <namespace> <name>) and the Provider goes with the last one",
        users.len()
    )
}

#[cfg(test)]
mod tests {
    use banlieue_api::banlieue::{ProviderCapacity, VirtualMachineSpec, VirtualMachineStatus};
    use banlieue_api::common::ProviderReference;
    use pretty_assertions::assert_eq;

    use super::*;

    fn vm(
        ns: &str,
        name: &str,
        uid: &str,
        provider_ref: Option<&str>,
        placed: Option<&str>,
    ) -> VirtualMachine {
        let mut vm = VirtualMachine::new(
            name,
            VirtualMachineSpec {
                provider_ref: provider_ref.map(|p| ProviderReference { name: p.to_owned() }),
                ..VirtualMachineSpec::default()
            },
        );
        vm.metadata.namespace = Some(ns.to_owned());
        vm.metadata.uid = Some(uid.to_owned());
        vm.status = placed.map(|p| VirtualMachineStatus {
            provider: Some(p.to_owned()),
            ..VirtualMachineStatus::default()
        });
        vm
    }

    fn provider(capacity: Option<u32>) -> Provider {
        let mut p = Provider::new("p", Default::default());
        p.spec.capacity = capacity.map(|n| ProviderCapacity {
            virtual_machines: Some(n),
            ..ProviderCapacity::default()
        });
        p
    }

    #[test]
    fn users_are_placed_or_referencing_vms_sorted() {
        let vms = [
            vm("b", "x", "1", Some("p"), None),
            vm("a", "y", "2", None, Some("p")),
            vm("a", "z", "3", Some("q"), Some("q")),
            vm("a", "w", "4", Some("p"), Some("p")),
        ];
        assert_eq!(users("p", &vms), ["a/w", "a/y", "b/x"]);
        assert_eq!(users("q", &vms), ["a/z"]);
        assert!(users("r", &vms).is_empty());
    }

    #[test]
    fn a_vm_refused_because_the_provider_is_deleting_does_not_hold_it() {
        let mut refused = vm("a", "late", "9", Some("p"), None);
        refused.status = Some(VirtualMachineStatus {
            conditions: vec![condition::new_condition(
                condition::READY,
                condition::ConditionStatus::False,
                REFUSED_PROVIDER_DELETING,
                "",
                None,
                k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
                ),
            )],
            ..VirtualMachineStatus::default()
        });
        assert!(!uses(&refused, "p"));
        assert!(uses(&vm("a", "new", "8", Some("p"), None), "p"));
    }

    #[test]
    fn totals_count_placed_vms_with_what_they_recorded_and_not_the_one_being_placed() {
        let mut sized = vm("a", "z", "3", Some("p"), Some("p"));
        if let Some(status) = sized.status.as_mut() {
            status.allocated = Some(ProviderAllocation {
                vcpus: Some(4),
                memory_mib: Some(2048),
                storage_gib: Some(20),
                virtual_machines: Some(1),
            });
        }
        let vms = [
            vm("a", "x", "1", Some("p"), None),
            vm("a", "y", "2", None, Some("p")),
            sized,
        ];
        let all = placed_totals(&vms, None);
        assert_eq!(
            all.get("p"),
            Some(&ProviderAllocation {
                vcpus: Some(4),
                memory_mib: Some(2048),
                storage_gib: Some(20),
                virtual_machines: Some(2),
            })
        );
        let without_sized = placed_totals(&vms, Some("3"));
        assert_eq!(
            without_sized.get("p"),
            Some(&ProviderAllocation {
                virtual_machines: Some(1),
                ..empty()
            })
        );
        assert_eq!(placed_totals(&vms, Some("1")).get("p"), all.get("p"));
    }

    fn used(vms: u32, vcpus: u32, memory_mib: u64, storage_gib: u64) -> ProviderAllocation {
        ProviderAllocation {
            vcpus: Some(vcpus),
            memory_mib: Some(memory_mib),
            storage_gib: Some(storage_gib),
            virtual_machines: Some(vms),
        }
    }

    #[test]
    fn free_slots_follow_the_declared_capacity() {
        assert_eq!(free_slots(&provider(None), Some(&used(10, 0, 0, 0))), None);
        assert_eq!(free_slots(&provider(Some(2)), Some(&used(1, 0, 0, 0))), Some(1));
        assert_eq!(free_slots(&provider(Some(2)), Some(&used(2, 0, 0, 0))), Some(0));
        assert_eq!(free_slots(&provider(Some(2)), Some(&used(5, 0, 0, 0))), Some(0));
        assert_eq!(free_slots(&provider(Some(0)), None), Some(0));
        assert!(has_capacity(&provider(Some(0))));
        assert!(!has_capacity(&provider(None)));
    }

    #[test]
    fn a_vm_fits_only_where_every_declared_capacity_has_room_for_it() {
        let mut p = provider(None);
        p.spec.capacity = Some(ProviderCapacity {
            vcpus: Some(8),
            memory_mib: Some(8192),
            storage_gib: Some(100),
            virtual_machines: None,
        });
        assert!(has_capacity(&p));
        let wanted = used(1, 2, 2048, 30);
        assert_eq!(shortfall(&p, None, &wanted), None);
        assert_eq!(
            shortfall(&p, Some(&used(3, 6, 6144, 70)), &wanted),
            None,
            "exactly full fits"
        );
        assert_eq!(
            shortfall(&p, Some(&used(3, 7, 1024, 10)), &wanted),
            Some(Shortfall {
                field: "vcpus",
                capacity: 8,
                used: 7,
                wanted: 2
            })
        );
        assert_eq!(
            shortfall(&p, Some(&used(3, 0, 7000, 10)), &wanted).map(|s| s.field),
            Some("memoryMiB")
        );
        assert_eq!(
            shortfall(&p, Some(&used(3, 0, 0, 71)), &wanted).map(|s| s.field),
            Some("storageGiB")
        );
        // Undeclared capacities are unlimited; the VM count is checked first.
        assert_eq!(
            shortfall(&provider(None), Some(&used(99, 99, 99, 99)), &wanted),
            None
        );
        assert_eq!(
            shortfall(&provider(Some(1)), Some(&used(1, 0, 0, 0)), &wanted).map(|s| s.field),
            Some("virtualMachines")
        );
    }

    #[test]
    fn the_blocked_message_names_the_users_and_what_to_do() {
        let users: Vec<String> = (0..12).map(|i| format!("ns/vm{i:02}")).collect();
        let message = deletion_blocked_message(&users);
        assert!(
            message.starts_with("deletion waits for 12 VirtualMachine(s)"),
            "{message}"
        );
        assert!(
            message.contains("ns/vm00") && message.contains("ns/vm09"),
            "{message}"
        );
        assert!(!message.contains("ns/vm10"), "{message}");
        assert!(message.contains("and 2 more"), "{message}");
        assert!(message.contains("kubectl delete virtualmachine"), "{message}");
    }
}
