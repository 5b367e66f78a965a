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

/// VirtualMachines placed per Provider name, not counting the VirtualMachine with uid `except`
/// (the one being placed).
pub fn placed_counts<'a>(
    vms: impl IntoIterator<Item = &'a VirtualMachine>,
    except: Option<&str>,
) -> BTreeMap<String, u32> {
    let mut counts = BTreeMap::new();
    for vm in vms {
        if except.is_some() && vm.metadata.uid.as_deref() == except {
            continue;
        }
        if let Some(provider) = placed_on(vm) {
            *counts.entry(provider.to_owned()).or_insert(0u32) += 1;
        }
    }
    counts
}

/// Free VM slots of `provider` given `placed` VirtualMachines on it: `None` when it declares no
/// VM capacity (unlimited).
pub fn free_slots(provider: &Provider, placed: u32) -> Option<u32> {
    let capacity = provider.spec.capacity.as_ref()?.virtual_machines?;
    Some(capacity.saturating_sub(placed))
}

/// Whether the Provider declares a VM capacity (placing on it needs a fresh count).
pub fn has_vm_capacity(provider: &Provider) -> bool {
    provider
        .spec
        .capacity
        .as_ref()
        .is_some_and(|c| c.virtual_machines.is_some())
}

/// Whether a deletion of the Provider was requested.
pub fn deleting(provider: &Provider) -> bool {
    provider.metadata.deletion_timestamp.is_some()
}

/// `status.allocated` for `placed` VirtualMachines (only the count is known to the controller).
pub fn allocation(placed: u32) -> ProviderAllocation {
    ProviderAllocation {
        virtual_machines: Some(placed),
        ..ProviderAllocation::default()
    }
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
    fn counts_only_placed_vms_and_not_the_one_being_placed() {
        let vms = [
            vm("a", "x", "1", Some("p"), None),
            vm("a", "y", "2", None, Some("p")),
            vm("a", "z", "3", Some("p"), Some("p")),
        ];
        assert_eq!(placed_counts(&vms, None).get("p"), Some(&2));
        assert_eq!(placed_counts(&vms, Some("3")).get("p"), Some(&1));
        assert_eq!(placed_counts(&vms, Some("1")).get("p"), Some(&2));
    }

    #[test]
    fn free_slots_follow_the_declared_capacity() {
        assert_eq!(free_slots(&provider(None), 10), None);
        assert_eq!(free_slots(&provider(Some(2)), 1), Some(1));
        assert_eq!(free_slots(&provider(Some(2)), 2), Some(0));
        assert_eq!(free_slots(&provider(Some(2)), 5), Some(0));
        assert_eq!(free_slots(&provider(Some(0)), 0), Some(0));
        assert!(has_vm_capacity(&provider(Some(0))));
        assert!(!has_vm_capacity(&provider(None)));
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
