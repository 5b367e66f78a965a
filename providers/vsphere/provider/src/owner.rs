//! The owner view: a VSphereMachine's controlling owner — a CAPI `Machine` or a banlieue
//! `VirtualMachine` (standalone mode) — resolved into the facts provisioning needs, so that
//! everything after it is one code path.

use banlieue_api::banlieue::VirtualMachine;
use banlieue_api::common::Initialization;
use banlieue_api::infrastructure::{VSphereCluster, VSphereMachine};
use banlieue_api::standalone;
use banlieue_capi::bootstrap::BOOTSTRAP_VALUE_KEY;
use banlieue_capi::contract;
use banlieue_capi::{Cluster, Machine};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::{Api, ResourceExt};

use crate::error::{Error, Result};

/// The controlling owner.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Owner {
    /// A CAPI `Machine`.
    Machine(String),
    /// A banlieue `VirtualMachine`.
    VirtualMachine(String),
}

/// The controlling owner (`controller: true`) if it is a CAPI Machine or a banlieue
/// VirtualMachine; `None` otherwise (such a machine is left alone).
pub fn controlling_owner(meta: &ObjectMeta) -> Option<Owner> {
    let o = meta
        .owner_references
        .as_deref()?
        .iter()
        .find(|o| o.controller == Some(true))?;
    match (contract::group_of(&o.api_version), o.kind.as_str()) {
        (standalone::CAPI_GROUP, standalone::CAPI_MACHINE_KIND) => Some(Owner::Machine(o.name.clone())),
        (standalone::OWNER_GROUP, standalone::VIRTUAL_MACHINE_KIND) => {
            Some(Owner::VirtualMachine(o.name.clone()))
        }
        _ => None,
    }
}

/// Where the user data comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Bootstrap {
    /// A Secret in the machine's namespace and its key.
    Secret {
        /// Secret name.
        name: String,
        /// Key.
        key: String,
    },
    /// No user data (a VirtualMachine without `userDataSecretRef`).
    Empty,
    /// Not known yet (CAPI bootstrap provider has not set `dataSecretName`).
    Pending,
}

/// What provisioning needs from the owner.
#[derive(Clone, Debug, PartialEq)]
pub struct OwnerView {
    /// The owner.
    pub owner: Owner,
    /// User data source.
    pub bootstrap: Bootstrap,
    /// Requested failure domain.
    pub failure_domain: Option<String>,
    /// The infra cluster, if it exists.
    pub cluster: Option<VSphereCluster>,
    /// Whether the infra cluster is provisioned (else: wait), with the reason when not.
    pub waiting_for_cluster: Option<String>,
    /// `Paused` condition: (status, reason, message).
    pub paused: (&'static str, &'static str, String),
}

impl OwnerView {
    /// Whether reconciling must stop (paused).
    pub fn is_paused(&self) -> bool {
        self.paused.0 == "True"
    }
}

fn provisioned(c: Option<&VSphereCluster>) -> bool {
    c.is_some_and(|c| {
        Initialization::is_provisioned(c.status.as_ref().and_then(|s| s.initialization.as_ref()))
    })
}

/// Fetches the owner and its infra cluster and builds the view.
pub async fn resolve(kube: &kube::Client, vm: &VSphereMachine, owner: Owner) -> Result<OwnerView> {
    let ns = vm.namespace().unwrap_or_default();
    let clusters: Api<VSphereCluster> = Api::namespaced(kube.clone(), &ns);
    let get = |what: &'static str| move |e| Error::kube(format!("reading the {what}"), e);
    match &owner {
        Owner::Machine(name) => {
            let machine = Api::<Machine>::namespaced(kube.clone(), &ns)
                .get_opt(name)
                .await
                .map_err(get("Machine"))?;
            let cluster_name = machine
                .as_ref()
                .map(|m| m.spec.cluster_name.clone())
                .or_else(|| contract::cluster_name(&vm.metadata).map(str::to_owned))
                .unwrap_or_default();
            let cluster = Api::<Cluster>::namespaced(kube.clone(), &ns)
                .get_opt(&cluster_name)
                .await
                .map_err(get("Cluster"))?;
            let infra_name = cluster
                .as_ref()
                .and_then(|c| c.spec.infrastructure_ref.as_ref())
                .map(|r| r.name.clone());
            let vsc = match &infra_name {
                Some(n) => clusters.get_opt(n).await.map_err(get("VSphereCluster"))?,
                None => None,
            };
            let waiting = match &cluster {
                None => Some(format!("Cluster {cluster_name:?} not found")),
                Some(c) if !contract::is_infrastructure_provisioned(c) => Some(format!(
                    "the infrastructure of Cluster {cluster_name:?} is not provisioned yet"
                )),
                Some(_) if vsc.is_none() => Some(format!(
                    "the VSphereCluster of Cluster {cluster_name:?} not found"
                )),
                Some(_) => None,
            };
            Ok(OwnerView {
                bootstrap: match machine.as_ref().and_then(contract::bootstrap_data_secret_name) {
                    Some(s) => Bootstrap::Secret {
                        name: s.to_owned(),
                        key: BOOTSTRAP_VALUE_KEY.to_owned(),
                    },
                    None => Bootstrap::Pending,
                },
                failure_domain: machine.as_ref().and_then(|m| m.spec.failure_domain.clone()),
                paused: contract::paused_condition_fields(cluster.as_ref(), &vm.metadata, "VSphereMachine"),
                cluster: vsc,
                waiting_for_cluster: waiting,
                owner,
            })
        }
        Owner::VirtualMachine(name) => {
            let bvm = Api::<VirtualMachine>::namespaced(kube.clone(), &ns)
                .get_opt(name)
                .await
                .map_err(get("VirtualMachine"))?;
            let (vsc, waiting) = match &vm.spec.provider_ref {
                None => (
                    None,
                    Some("spec.providerRef is not set: a machine of a VirtualMachine takes its vCenter from a banlieue Provider".to_owned()),
                ),
                Some(p) => {
                    let infra = standalone::infra_cluster_name(&p.name);
                    let vsc = clusters.get_opt(&infra).await.map_err(get("VSphereCluster"))?;
                    let waiting = (!provisioned(vsc.as_ref()))
                        .then(|| format!("VSphereCluster {infra:?} (of Provider {:?}) is not provisioned yet", p.name));
                    (vsc, waiting)
                }
            };
            Ok(OwnerView {
                bootstrap: match bvm.as_ref().and_then(|v| v.spec.user_data_secret_ref.as_ref()) {
                    Some(r) => Bootstrap::Secret {
                        name: r.name.clone(),
                        key: r.key_or_default().to_owned(),
                    },
                    None if bvm.is_some() => Bootstrap::Empty,
                    None => Bootstrap::Pending,
                },
                failure_domain: bvm
                    .as_ref()
                    .and_then(|v| v.spec.placement.as_ref())
                    .and_then(|p| p.failure_domain.clone()),
                paused: contract::paused_condition_fields(None, &vm.metadata, "VSphereMachine"),
                cluster: vsc,
                waiting_for_cluster: waiting,
                owner,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    fn meta(api_version: &str, kind: &str, controller: bool) -> ObjectMeta {
        ObjectMeta {
            owner_references: Some(vec![OwnerReference {
                api_version: api_version.into(),
                kind: kind.into(),
                name: "o".into(),
                uid: "u".into(),
                controller: Some(controller),
                ..OwnerReference::default()
            }]),
            ..ObjectMeta::default()
        }
    }

    #[test]
    fn only_machines_and_virtual_machines_control() {
        assert_eq!(
            controlling_owner(&meta("cluster.x-k8s.io/v1beta2", "Machine", true)),
            Some(Owner::Machine("o".into()))
        );
        assert_eq!(
            controlling_owner(&meta("banlieue.io/v1alpha1", "VirtualMachine", true)),
            Some(Owner::VirtualMachine("o".into()))
        );
        assert_eq!(
            controlling_owner(&meta("cluster.x-k8s.io/v1beta2", "Machine", false)),
            None
        );
        assert_eq!(controlling_owner(&meta("apps/v1", "ReplicaSet", true)), None);
        assert_eq!(controlling_owner(&ObjectMeta::default()), None);
    }
}
