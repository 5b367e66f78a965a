//! The owner view: a LibvirtMachine's controlling owner — a CAPI `Machine` or a banlieue
//! `VirtualMachine` (standalone mode) — resolved into the few facts provisioning needs, so that
//! everything after the resolution is one code path (the rules are the lead's standalone
//! decision, the same for every provider):
//!
//! | fact | CAPI `Machine` | banlieue `VirtualMachine` |
//! |---|---|---|
//! | bootstrap Secret | `spec.bootstrap.dataSecretName`, key `value` (wait until set) | `spec.userDataSecretRef` (key default `value`); unset = empty user data |
//! | failure domain | `spec.failureDomain` | `spec.placement.failureDomain` |
//! | infra cluster | Cluster `spec.clusterName` → `spec.infrastructureRef`; wait for the Cluster's infrastructure | `banlieue-<spec.providerRef.name>` in the namespace; wait for its `status.initialization.provisioned` |
//! | paused | Cluster `spec.paused` or the `cluster.x-k8s.io/paused` annotation | the annotation |

use banlieue_api::banlieue::VirtualMachine;
use banlieue_api::common::Initialization;
use banlieue_api::infrastructure::{LibvirtCluster, LibvirtMachine};
use banlieue_api::standalone;
use banlieue_capi::bootstrap::BOOTSTRAP_VALUE_KEY;
use banlieue_capi::contract::{self, PauseCause};
use banlieue_capi::{Cluster, Machine};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::{Api, ResourceExt};

use crate::error::{Error, Result};

/// Kind of the infra cluster this provider serves.
pub const INFRA_CLUSTER_KIND: &str = "LibvirtCluster";

/// The controlling owner's kind and name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Owner {
    /// A CAPI `Machine`.
    Machine(String),
    /// A banlieue `VirtualMachine`.
    VirtualMachine(String),
}

/// The controlling owner (`controller: true`) when it is a CAPI Machine or a banlieue
/// VirtualMachine; `None` otherwise (the machine is left alone).
pub fn controlling_owner(meta: &ObjectMeta) -> Option<Owner> {
    let owner = meta
        .owner_references
        .as_deref()?
        .iter()
        .find(|o| o.controller == Some(true))?;
    match (contract::group_of(&owner.api_version), owner.kind.as_str()) {
        (standalone::CAPI_GROUP, standalone::CAPI_MACHINE_KIND) => Some(Owner::Machine(owner.name.clone())),
        (standalone::OWNER_GROUP, standalone::VIRTUAL_MACHINE_KIND) => {
            Some(Owner::VirtualMachine(owner.name.clone()))
        }
        _ => None,
    }
}

/// Where the user data comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BootstrapSource {
    /// A Secret in the machine's namespace and the key holding the data.
    Secret {
        /// Secret name.
        name: String,
        /// Key in `data`.
        key: String,
    },
    /// No user data (the seed still carries meta-data and an empty user-data).
    Empty,
    /// Not known yet.
    Pending,
}

/// The infra cluster and whether it may be used.
#[derive(Clone, Debug, PartialEq)]
pub enum InfraCluster {
    /// Provisioned.
    Ready(Box<LibvirtCluster>),
    /// Exists, not provisioned yet.
    NotProvisioned(Box<LibvirtCluster>),
    /// Not named or not found (message says which).
    Missing(String),
}

impl InfraCluster {
    /// The object, provisioned or not (deletion needs it either way).
    pub fn object(&self) -> Option<&LibvirtCluster> {
        match self {
            Self::Ready(c) | Self::NotProvisioned(c) => Some(c),
            Self::Missing(_) => None,
        }
    }
}

/// What provisioning needs from the owner.
#[derive(Clone, Debug, PartialEq)]
pub struct OwnerView {
    /// The owner.
    pub owner: Owner,
    /// User data source.
    pub bootstrap: BootstrapSource,
    /// Failure domain asked for.
    pub failure_domain: Option<String>,
    /// The infra cluster.
    pub infra_cluster: InfraCluster,
    /// Why paused, if paused.
    pub paused: Option<PauseCause>,
    /// (`status`, `reason`, `message`) of the `Paused` condition.
    pub paused_condition: (&'static str, &'static str, String),
}

fn infra(lvc: Option<LibvirtCluster>, provisioned: bool, missing: String) -> InfraCluster {
    match lvc {
        None => InfraCluster::Missing(missing),
        Some(c) if provisioned => InfraCluster::Ready(Box::new(c)),
        Some(c) => InfraCluster::NotProvisioned(Box::new(c)),
    }
}

impl OwnerView {
    /// View of a machine owned by a CAPI Machine (`machine` `None` once it is gone).
    pub fn from_machine(
        lm: &LibvirtMachine,
        name: &str,
        machine: Option<&Machine>,
        cluster: Option<&Cluster>,
        lvc: Option<LibvirtCluster>,
    ) -> Self {
        let bootstrap = match machine.and_then(contract::bootstrap_data_secret_name) {
            Some(s) => BootstrapSource::Secret {
                name: s.to_owned(),
                key: BOOTSTRAP_VALUE_KEY.to_owned(),
            },
            None => BootstrapSource::Pending,
        };
        let cluster_name = cluster_name(lm, machine).unwrap_or_default();
        let infra_cluster = match cluster {
            None => InfraCluster::Missing(format!("Cluster {cluster_name:?} not found")),
            Some(c) => infra(
                lvc,
                contract::is_infrastructure_provisioned(c),
                format!("the LibvirtCluster of Cluster {cluster_name:?} not found"),
            ),
        };
        Self {
            owner: Owner::Machine(name.to_owned()),
            bootstrap,
            failure_domain: machine.and_then(|m| m.spec.failure_domain.clone()),
            infra_cluster,
            paused: contract::pause_cause(cluster, &lm.metadata),
            paused_condition: contract::paused_condition_fields(cluster, &lm.metadata, "LibvirtMachine"),
        }
    }

    /// View of a machine owned by a banlieue VirtualMachine (`vm` `None` once it is gone).
    pub fn from_virtual_machine(
        lm: &LibvirtMachine,
        name: &str,
        vm: Option<&VirtualMachine>,
        lvc: Option<LibvirtCluster>,
    ) -> Self {
        let bootstrap = match vm.and_then(|v| v.spec.user_data_secret_ref.as_ref()) {
            Some(r) => BootstrapSource::Secret {
                name: r.name.clone(),
                key: r.key_or_default().to_owned(),
            },
            None if vm.is_some() => BootstrapSource::Empty,
            None => BootstrapSource::Pending,
        };
        let infra_cluster = match standalone_cluster_name(lm) {
            None => InfraCluster::Missing(
                "spec.providerRef is not set: a machine of a VirtualMachine takes its libvirt host from a banlieue Provider".into(),
            ),
            Some(n) => {
                let provisioned = lvc.as_ref().is_some_and(|c| {
                    Initialization::is_provisioned(c.status.as_ref().and_then(|s| s.initialization.as_ref()))
                });
                infra(lvc, provisioned, format!("LibvirtCluster {n:?} not found"))
            }
        };
        Self {
            owner: Owner::VirtualMachine(name.to_owned()),
            bootstrap,
            failure_domain: vm
                .and_then(|v| v.spec.placement.as_ref())
                .and_then(|p| p.failure_domain.clone()),
            infra_cluster,
            paused: contract::pause_cause(None, &lm.metadata),
            paused_condition: contract::paused_condition_fields(None, &lm.metadata, "LibvirtMachine"),
        }
    }
}

/// The CAPI Cluster of a CAPI-owned machine: the Machine's `spec.clusterName`, else the
/// `cluster.x-k8s.io/cluster-name` label.
pub fn cluster_name(lm: &LibvirtMachine, machine: Option<&Machine>) -> Option<String> {
    machine
        .map(|m| m.spec.cluster_name.clone())
        .filter(|n| !n.is_empty())
        .or_else(|| contract::cluster_name(&lm.metadata).map(str::to_owned))
}

/// The standalone infra cluster of a VirtualMachine-owned machine.
pub fn standalone_cluster_name(lm: &LibvirtMachine) -> Option<String> {
    lm.spec
        .provider_ref
        .as_ref()
        .map(|p| standalone::infra_cluster_name(&p.name))
}

/// Fetches what the view reads and builds it.
pub async fn resolve(client: &kube::Client, lm: &LibvirtMachine, owner: Owner) -> Result<OwnerView> {
    let namespace = lm.namespace().unwrap_or_default();
    let clusters = Api::<LibvirtCluster>::namespaced(client.clone(), &namespace);
    match owner {
        Owner::Machine(name) => {
            let machine = Api::<Machine>::namespaced(client.clone(), &namespace)
                .get_opt(&name)
                .await
                .map_err(|e| Error::kube("reading the owner Machine", e))?;
            let cluster = match cluster_name(lm, machine.as_ref()) {
                Some(c) => Api::<Cluster>::namespaced(client.clone(), &namespace)
                    .get_opt(&c)
                    .await
                    .map_err(|e| Error::kube("reading the Cluster", e))?,
                None => None,
            };
            let infra_name = cluster
                .as_ref()
                .and_then(|c| c.spec.infrastructure_ref.as_ref())
                .filter(|r| r.kind == INFRA_CLUSTER_KIND && r.api_group == banlieue_api::INFRASTRUCTURE_GROUP)
                .map(|r| r.name.clone());
            let lvc = match infra_name {
                Some(n) => clusters
                    .get_opt(&n)
                    .await
                    .map_err(|e| Error::kube("reading the LibvirtCluster", e))?,
                None => None,
            };
            Ok(OwnerView::from_machine(
                lm,
                &name,
                machine.as_ref(),
                cluster.as_ref(),
                lvc,
            ))
        }
        Owner::VirtualMachine(name) => {
            let vm = Api::<VirtualMachine>::namespaced(client.clone(), &namespace)
                .get_opt(&name)
                .await
                .map_err(|e| Error::kube("reading the owner VirtualMachine", e))?;
            let lvc = match standalone_cluster_name(lm) {
                Some(n) => clusters
                    .get_opt(&n)
                    .await
                    .map_err(|e| Error::kube("reading the standalone LibvirtCluster", e))?,
                None => None,
            };
            Ok(OwnerView::from_virtual_machine(lm, &name, vm.as_ref(), lvc))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
    use pretty_assertions::assert_eq;
    use rstest::rstest;

    fn meta(api_version: &str, kind: &str, controller: Option<bool>) -> ObjectMeta {
        ObjectMeta {
            owner_references: Some(vec![OwnerReference {
                api_version: api_version.into(),
                kind: kind.into(),
                name: "o".into(),
                uid: "u".into(),
                controller,
                block_owner_deletion: None,
            }]),
            ..Default::default()
        }
    }

    #[rstest]
    #[case::capi("cluster.x-k8s.io/v1beta2", "Machine", Some(true), Some(Owner::Machine("o".into())))]
    #[case::vm("banlieue.io/v1alpha1", "VirtualMachine", Some(true), Some(Owner::VirtualMachine("o".into())))]
    #[case::not_controller("banlieue.io/v1alpha1", "VirtualMachine", Some(false), None)]
    #[case::other_group("kubevirt.io/v1", "VirtualMachine", Some(true), None)]
    #[case::machine_set("cluster.x-k8s.io/v1beta2", "MachineSet", Some(true), None)]
    fn the_controlling_owner_decides(
        #[case] api_version: &str,
        #[case] kind: &str,
        #[case] controller: Option<bool>,
        #[case] want: Option<Owner>,
    ) {
        assert_eq!(controlling_owner(&meta(api_version, kind, controller)), want);
    }

    fn machine(provider: Option<&str>) -> LibvirtMachine {
        let mut spec = serde_json::json!({
            "source": {"volume": "b", "pool": "p"}, "cpu": {"cores": 1}, "memoryMiB": 256
        });
        if let Some(p) = provider {
            spec["providerRef"] = serde_json::json!({"name": p});
        }
        LibvirtMachine::new("m", serde_json::from_value(spec).unwrap())
    }

    fn vm(user_data: Option<(&str, Option<&str>)>, fd: Option<&str>) -> VirtualMachine {
        let mut spec = serde_json::json!({});
        if let Some((name, key)) = user_data {
            spec["userDataSecretRef"] = serde_json::json!({"name": name, "key": key});
        }
        if let Some(fd) = fd {
            spec["placement"] = serde_json::json!({"failureDomain": fd});
        }
        VirtualMachine::new("vm", serde_json::from_value(spec).unwrap())
    }

    fn cluster(provisioned: bool) -> LibvirtCluster {
        let mut c = LibvirtCluster::new("banlieue-lab", Default::default());
        c.status = Some(banlieue_api::infrastructure::LibvirtClusterStatus {
            initialization: Initialization::provisioned(provisioned),
            ..Default::default()
        });
        c
    }

    #[test]
    fn a_virtual_machine_gives_its_secret_key_failure_domain_and_standalone_cluster() {
        let lm = machine(Some("lab"));
        assert_eq!(standalone_cluster_name(&lm).as_deref(), Some("banlieue-lab"));
        let v = OwnerView::from_virtual_machine(
            &lm,
            "vm",
            Some(&vm(Some(("ud", Some("k"))), Some("h2"))),
            Some(cluster(true)),
        );
        assert_eq!(
            v.bootstrap,
            BootstrapSource::Secret {
                name: "ud".into(),
                key: "k".into()
            }
        );
        assert_eq!(v.failure_domain.as_deref(), Some("h2"));
        assert!(matches!(v.infra_cluster, InfraCluster::Ready(_)));
        assert_eq!(v.paused, None);
    }

    #[test]
    fn a_virtual_machine_without_user_data_gets_an_empty_seed_and_waits_for_its_cluster() {
        let lm = machine(Some("lab"));
        let v = OwnerView::from_virtual_machine(&lm, "vm", Some(&vm(None, None)), Some(cluster(false)));
        assert_eq!(v.bootstrap, BootstrapSource::Empty);
        assert!(matches!(v.infra_cluster, InfraCluster::NotProvisioned(_)));
        let v = OwnerView::from_virtual_machine(&machine(None), "vm", Some(&vm(None, None)), None);
        assert!(matches!(v.infra_cluster, InfraCluster::Missing(m) if m.contains("providerRef")));
        let v = OwnerView::from_virtual_machine(&lm, "vm", None, None);
        assert_eq!(v.bootstrap, BootstrapSource::Pending);
    }

    #[test]
    fn the_pause_annotation_pauses_a_standalone_machine() {
        let mut lm = machine(Some("lab"));
        lm.metadata.annotations = Some([(contract::PAUSED_ANNOTATION.to_owned(), String::new())].into());
        let v = OwnerView::from_virtual_machine(&lm, "vm", Some(&vm(None, None)), Some(cluster(true)));
        assert!(v.paused.is_some());
        assert_eq!(v.paused_condition.0, "True");
    }

    #[test]
    fn a_capi_machine_waits_for_its_bootstrap_data_and_cluster() {
        let lm = machine(None);
        let v = OwnerView::from_machine(&lm, "m", None, None, None);
        assert_eq!(v.bootstrap, BootstrapSource::Pending);
        assert!(matches!(v.infra_cluster, InfraCluster::Missing(_)));
    }
}
