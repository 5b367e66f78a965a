//! The owner view: an InfraMachine's controlling owner — a CAPI `Machine` or a banlieue
//! `VirtualMachine` (standalone mode) — resolved into the few facts provisioning needs, so that
//! everything after the resolution is one code path, the same for every hypervisor.
//!
//! | fact | CAPI `Machine` | banlieue `VirtualMachine` |
//! |---|---|---|
//! | bootstrap Secret | `spec.bootstrap.dataSecretName`, key `value` (wait until set) | `spec.userDataSecretRef` (`name`, `key` default `value`); unset = no user data |
//! | failure domain | `spec.failureDomain` | `spec.placement.failureDomain` |
//! | infra cluster | Cluster `spec.clusterName` → `spec.infrastructureRef` (of this provider's kind); wait for `status.initialization.infrastructureProvisioned` | `banlieue-<machine spec.providerRef.name>` in the machine's namespace; wait for its `status.initialization.provisioned` |
//! | paused | Cluster `spec.paused` or the `cluster.x-k8s.io/paused` annotation | the annotation |
//!
//! The decisions are pure ([`controlling_owner`], [`OwnerView::from_machine`],
//! [`OwnerView::from_virtual_machine`]); [`resolve`] only fetches the objects they read.

use banlieue_api::banlieue::VirtualMachine;
use banlieue_api::common::Initialization;
use banlieue_api::infrastructure::kinds::{ContractStatus, InfraCluster as InfraClusterKind, InfraMachine};
use banlieue_api::standalone;
use banlieue_capi::bootstrap::BOOTSTRAP_VALUE_KEY;
use banlieue_capi::contract::{self, PauseCause};
use banlieue_capi::{Cluster, Machine};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Resource, ResourceExt};

use crate::error::{Error, Result};

/// Which kind of object controls the machine, and its name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Owner {
    /// A CAPI `Machine` (`cluster.x-k8s.io`).
    Machine(String),
    /// A banlieue `VirtualMachine` (`banlieue.io`).
    VirtualMachine(String),
}

/// The machine's controlling owner (`controller: true`) when it is a CAPI Machine or a banlieue
/// VirtualMachine; `None` for anything else (such a machine is left alone).
pub fn controlling_owner(meta: &ObjectMeta) -> Option<Owner> {
    let owner = meta
        .owner_references
        .as_deref()?
        .iter()
        .find(|o| o.controller == Some(true))?;
    let group = contract::group_of(&owner.api_version);
    match (group, owner.kind.as_str()) {
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
    /// A Secret in the machine's namespace, and the key holding the data.
    Secret {
        /// Secret name.
        name: String,
        /// Key in `data`.
        key: String,
    },
    /// The owner asks for no user data: the seed carries meta-data and network-config only
    /// (and an empty `user-data`, which NoCloud requires to exist).
    Empty,
    /// Not known yet (a CAPI Machine whose bootstrap provider has not set `dataSecretName`).
    Pending,
}

/// Whether the infra cluster is usable, and if not, why (for the `Ready` condition).
#[derive(Clone, Debug, PartialEq)]
pub enum InfraCluster<C> {
    /// Provisioned: its endpoint, credentials and allowed nodes may be used.
    Ready(Box<C>),
    /// Exists but is not provisioned yet (`WaitingForClusterInfrastructure`).
    NotProvisioned(Box<C>),
    /// The owner names no infra cluster, or it does not exist (`WaitingForCluster`).
    Missing(String),
}

impl<C: Resource<DynamicType = ()>> InfraCluster<C> {
    /// The provisioned infra cluster, or why a machine must wait for it.
    pub fn usable(&self) -> std::result::Result<&C, String> {
        match self {
            Self::Ready(c) => Ok(c),
            Self::NotProvisioned(c) => Err(format!(
                "{} {:?} is not provisioned yet",
                C::kind(&()),
                c.meta().name.as_deref().unwrap_or_default()
            )),
            Self::Missing(why) => Err(why.clone()),
        }
    }
}

impl<C> InfraCluster<C> {
    /// The infra cluster, provisioned or not (deletion needs it either way).
    pub fn object(&self) -> Option<&C> {
        match self {
            Self::Ready(c) | Self::NotProvisioned(c) => Some(c),
            Self::Missing(_) => None,
        }
    }
}

/// Everything provisioning needs from the machine's owner.
#[derive(Clone, Debug, PartialEq)]
pub struct OwnerView<C> {
    /// The controlling owner.
    pub owner: Owner,
    /// Whether the owner object itself still exists.
    pub owner_exists: bool,
    /// The user data's source.
    pub bootstrap: BootstrapSource,
    /// Failure domain the owner asks for.
    pub failure_domain: Option<String>,
    /// The infra cluster and its readiness.
    pub infra_cluster: InfraCluster<C>,
    /// Why the machine is paused, if it is.
    pub paused: Option<PauseCause>,
    /// `status`, `reason`, `message` of the `Paused` condition.
    pub paused_condition: (&'static str, &'static str, String),
}

fn infra_cluster<C>(found: Option<C>, provisioned: bool, missing: String) -> InfraCluster<C> {
    match found {
        None => InfraCluster::Missing(missing),
        Some(c) if provisioned => InfraCluster::Ready(Box::new(c)),
        Some(c) => InfraCluster::NotProvisioned(Box::new(c)),
    }
}

impl<C: InfraClusterKind> OwnerView<C> {
    /// The view for a machine owned by a CAPI Machine (`machine` = `None` when it is gone).
    /// `cluster` is the machine's Cluster and `infra` the infra cluster it references.
    pub fn from_machine<M: InfraMachine<Cluster = C>>(
        pm: &M,
        name: &str,
        machine: Option<&Machine>,
        cluster: Option<&Cluster>,
        infra: Option<C>,
    ) -> Self {
        let kind = M::kind(&());
        let bootstrap = match machine.and_then(contract::bootstrap_data_secret_name) {
            Some(secret) => BootstrapSource::Secret {
                name: secret.to_owned(),
                key: BOOTSTRAP_VALUE_KEY.to_owned(),
            },
            None => BootstrapSource::Pending,
        };
        let cluster_name = cluster_name(pm, machine).unwrap_or_default();
        let infra = match cluster {
            None => InfraCluster::Missing(format!("Cluster {cluster_name:?} not found")),
            Some(c) => infra_cluster(
                infra,
                contract::is_infrastructure_provisioned(c),
                format!("the {} of Cluster {cluster_name:?} not found", C::kind(&())),
            ),
        };
        Self {
            owner: Owner::Machine(name.to_owned()),
            owner_exists: machine.is_some(),
            bootstrap,
            failure_domain: machine.and_then(|m| m.spec.failure_domain.clone()),
            infra_cluster: infra,
            paused: contract::pause_cause(cluster, pm.meta()),
            paused_condition: contract::paused_condition_fields(cluster, pm.meta(), &kind),
        }
    }

    /// The view for a machine owned by a banlieue VirtualMachine (`vm` = `None` when it is
    /// gone). `infra` is the infra cluster named [`standalone::infra_cluster_name`] of the
    /// machine's `spec.providerRef`.
    pub fn from_virtual_machine<M: InfraMachine<Cluster = C>>(
        pm: &M,
        name: &str,
        vm: Option<&VirtualMachine>,
        infra: Option<C>,
    ) -> Self {
        let kind = M::kind(&());
        let bootstrap = match vm.and_then(|v| v.spec.user_data_secret_ref.as_ref()) {
            Some(r) => BootstrapSource::Secret {
                name: r.name.clone(),
                key: r.key_or_default().to_owned(),
            },
            None if vm.is_some() => BootstrapSource::Empty,
            None => BootstrapSource::Pending,
        };
        let infra = match standalone_cluster_name(pm) {
            None => InfraCluster::Missing(
                "spec.providerRef is not set: a machine of a VirtualMachine takes its hypervisor from a banlieue Provider".to_owned(),
            ),
            Some(cluster) => {
                let ready = infra.as_ref().is_some_and(provisioned);
                infra_cluster(infra, ready, format!("{} {cluster:?} not found", C::kind(&())))
            }
        };
        Self {
            owner: Owner::VirtualMachine(name.to_owned()),
            owner_exists: vm.is_some(),
            bootstrap,
            failure_domain: vm
                .and_then(|v| v.spec.placement.as_ref())
                .and_then(|p| p.failure_domain.clone()),
            infra_cluster: infra,
            paused: contract::pause_cause(None, pm.meta()),
            paused_condition: contract::paused_condition_fields(None, pm.meta(), &kind),
        }
    }
}

/// The CAPI Cluster name of a CAPI-owned machine: the Machine's `spec.clusterName`, else the
/// machine's `cluster.x-k8s.io/cluster-name` label (the Machine may be gone during deletion).
pub fn cluster_name(pm: &impl InfraMachine, machine: Option<&Machine>) -> Option<String> {
    machine
        .map(|m| m.spec.cluster_name.clone())
        .filter(|n| !n.is_empty())
        .or_else(|| contract::cluster_name(pm.meta()).map(str::to_owned))
}

/// The standalone infra cluster of a VirtualMachine-owned machine: named after its
/// `spec.providerRef`.
pub fn standalone_cluster_name(pm: &impl InfraMachine) -> Option<String> {
    pm.provider_ref().map(|p| standalone::infra_cluster_name(&p.name))
}

/// The machine controller's caches of the VirtualMachines and infra clusters it watches: a
/// reconcile reads its owner VirtualMachine and its infra cluster there, and from the API server
/// only when they are not there (the cache not filled yet, an object just created). A cached
/// object may lag a change by the watch's delay; the change itself then wakes the machine again.
#[derive(Clone)]
pub struct OwnerCaches<C: InfraClusterKind> {
    /// The VirtualMachines.
    pub virtual_machines: Store<VirtualMachine>,
    /// The infra clusters.
    pub clusters: Store<C>,
}

/// `name` in `namespace` from `cache` when it is there and `settled` there, else from `api`.
async fn cached_or_read<K>(
    cache: Option<&Store<K>>,
    api: &Api<K>,
    namespace: &str,
    name: &str,
    settled: impl Fn(&K) -> bool,
) -> kube::Result<Option<K>>
where
    K: Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let cached = cache.and_then(|c| c.get(&ObjectRef::new(name).within(namespace)));
    if let Some(found) = cached.filter(|found| settled(found)) {
        return Ok(Some((*found).clone()));
    }
    api.get_opt(name).await
}

/// Whether a cached infra cluster may stand for the live one: once provisioned. One not
/// provisioned yet in the cache may have just become so (the watch lags): it is read live, so a
/// machine created right after its cluster does not wait (and write that it waits) for nothing.
fn provisioned<C: InfraClusterKind>(cluster: &C) -> bool {
    Initialization::is_provisioned(cluster.status().and_then(ContractStatus::initialization))
}

/// Fetches what the view of `owner` reads and builds it (the VirtualMachine and the infra cluster
/// from `caches` when there).
pub async fn resolve<M: InfraMachine>(
    client: &kube::Client,
    pm: &M,
    owner: Owner,
    caches: Option<&OwnerCaches<M::Cluster>>,
) -> Result<OwnerView<M::Cluster>> {
    let namespace = pm.namespace().unwrap_or_default();
    let clusters = Api::<M::Cluster>::namespaced(client.clone(), &namespace);
    let cached_clusters = caches.map(|c| &c.clusters);
    let cluster_kind = M::Cluster::kind(&());
    match owner {
        Owner::Machine(name) => {
            let machine = Api::<Machine>::namespaced(client.clone(), &namespace)
                .get_opt(&name)
                .await
                .map_err(|e| Error::kube("reading the owner Machine", e))?;
            let cluster = match cluster_name(pm, machine.as_ref()) {
                Some(c) => Api::<Cluster>::namespaced(client.clone(), &namespace)
                    .get_opt(&c)
                    .await
                    .map_err(|e| Error::kube("reading the Cluster", e))?,
                None => None,
            };
            let infra_name = cluster
                .as_ref()
                .and_then(|c| c.spec.infrastructure_ref.as_ref())
                .filter(|r| r.kind == cluster_kind && r.api_group == banlieue_api::INFRASTRUCTURE_GROUP)
                .map(|r| r.name.clone());
            let infra = match infra_name {
                Some(n) => cached_or_read(cached_clusters, &clusters, &namespace, &n, provisioned)
                    .await
                    .map_err(|e| Error::kube(format!("reading the {cluster_kind}"), e))?,
                None => None,
            };
            Ok(OwnerView::from_machine(
                pm,
                &name,
                machine.as_ref(),
                cluster.as_ref(),
                infra,
            ))
        }
        Owner::VirtualMachine(name) => {
            let vms = Api::<VirtualMachine>::namespaced(client.clone(), &namespace);
            let vm = cached_or_read(
                caches.map(|c| &c.virtual_machines),
                &vms,
                &namespace,
                &name,
                |_| true,
            )
            .await
            .map_err(|e| Error::kube("reading the owner VirtualMachine", e))?;
            let infra = match standalone_cluster_name(pm) {
                Some(n) => cached_or_read(cached_clusters, &clusters, &namespace, &n, provisioned)
                    .await
                    .map_err(|e| Error::kube(format!("reading the standalone {cluster_kind}"), e))?,
                None => None,
            };
            Ok(OwnerView::from_virtual_machine(pm, &name, vm.as_ref(), infra))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use banlieue_api::banlieue::{Placement, VirtualMachineSpec};
    use banlieue_api::common::{Cpu, ProviderReference, SecretKeyReference};
    use banlieue_api::infrastructure::{
        ProxmoxCluster, ProxmoxClusterStatus, ProxmoxMachine, ProxmoxMachineSpec, ProxmoxTemplateSource,
    };
    use banlieue_capi::generated::cluster::{ClusterSpec, ClusterStatus, ClusterStatusInitialization};
    use banlieue_capi::generated::machine::{MachineBootstrap, MachineSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
    use pretty_assertions::assert_eq;
    use rstest::rstest;

    fn owner_ref(api_version: &str, kind: &str, name: &str, controller: Option<bool>) -> OwnerReference {
        OwnerReference {
            api_version: api_version.into(),
            kind: kind.into(),
            name: name.into(),
            uid: "u".into(),
            controller,
            block_owner_deletion: None,
        }
    }

    fn meta(refs: Vec<OwnerReference>) -> ObjectMeta {
        ObjectMeta {
            owner_references: Some(refs),
            ..Default::default()
        }
    }

    #[rstest]
    #[case::capi_machine("cluster.x-k8s.io/v1beta2", "Machine", Some(true), Some(Owner::Machine("m".into())))]
    #[case::capi_machine_other_version("cluster.x-k8s.io/v1beta1", "Machine", Some(true), Some(Owner::Machine("m".into())))]
    #[case::virtual_machine("banlieue.io/v1alpha1", "VirtualMachine", Some(true), Some(Owner::VirtualMachine("m".into())))]
    #[case::not_controller("banlieue.io/v1alpha1", "VirtualMachine", Some(false), None)]
    #[case::controller_unset("cluster.x-k8s.io/v1beta2", "Machine", None, None)]
    #[case::other_kind("cluster.x-k8s.io/v1beta2", "MachineSet", Some(true), None)]
    #[case::same_kind_other_group("example.com/v1", "VirtualMachine", Some(true), None)]
    #[case::kubevirt_vm("kubevirt.io/v1", "VirtualMachine", Some(true), None)]
    fn the_controlling_owner_decides(
        #[case] api_version: &str,
        #[case] kind: &str,
        #[case] controller: Option<bool>,
        #[case] want: Option<Owner>,
    ) {
        assert_eq!(
            controlling_owner(&meta(vec![owner_ref(api_version, kind, "m", controller)])),
            want
        );
    }

    #[test]
    fn a_non_controlling_owner_does_not_hide_the_controller() {
        let refs = vec![
            owner_ref("banlieue.io/v1alpha1", "Provider", "p", Some(false)),
            owner_ref("banlieue.io/v1alpha1", "VirtualMachine", "vm", Some(true)),
        ];
        assert_eq!(
            controlling_owner(&meta(refs)),
            Some(Owner::VirtualMachine("vm".into()))
        );
        assert_eq!(controlling_owner(&ObjectMeta::default()), None);
    }

    fn pm(provider: Option<&str>, paused: bool) -> ProxmoxMachine {
        let mut pm = ProxmoxMachine::new(
            "pm",
            ProxmoxMachineSpec {
                provider_ref: provider.map(|p| ProviderReference { name: p.into() }),
                ..ProxmoxMachineSpec::new(
                    ProxmoxTemplateSource {
                        vmid: Some(9000),
                        ..Default::default()
                    },
                    Cpu::cores(1),
                    512,
                )
            },
        );
        pm.metadata.namespace = Some("ns".into());
        if paused {
            pm.metadata.annotations = Some([(contract::PAUSED_ANNOTATION.to_owned(), String::new())].into());
        }
        pm
    }

    fn pxc(name: &str, provisioned: bool) -> ProxmoxCluster {
        let mut c = ProxmoxCluster::new(name, Default::default());
        c.status = Some(ProxmoxClusterStatus {
            initialization: Initialization::provisioned(provisioned),
            ..Default::default()
        });
        c
    }

    fn vm(user_data: Option<SecretKeyReference>, failure_domain: Option<&str>) -> VirtualMachine {
        VirtualMachine::new(
            "web",
            VirtualMachineSpec {
                user_data_secret_ref: user_data,
                placement: failure_domain.map(|fd| Placement {
                    failure_domain: Some(fd.into()),
                    ..Default::default()
                }),
                ..Default::default()
            },
        )
    }

    #[test]
    fn a_virtual_machine_gives_its_user_data_secret_and_key() {
        let v = vm(
            Some(SecretKeyReference {
                name: "web-cloud-init".into(),
                key: Some("userdata".into()),
            }),
            Some("pve2"),
        );
        let view = OwnerView::from_virtual_machine(
            &pm(Some("pve-a"), false),
            "web",
            Some(&v),
            Some(pxc("banlieue-pve-a", true)),
        );
        assert_eq!(view.owner, Owner::VirtualMachine("web".into()));
        assert_eq!(
            view.bootstrap,
            BootstrapSource::Secret {
                name: "web-cloud-init".into(),
                key: "userdata".into()
            }
        );
        assert_eq!(view.failure_domain.as_deref(), Some("pve2"));
        assert!(matches!(view.infra_cluster, InfraCluster::Ready(ref c) if c.name_any() == "banlieue-pve-a"));
        assert_eq!(view.paused, None);
        assert_eq!(view.paused_condition.0, "False");
    }

    #[test]
    fn a_virtual_machine_without_user_data_gets_an_empty_seed_and_the_default_key_is_value() {
        let view = OwnerView::from_virtual_machine(
            &pm(Some("pve-a"), false),
            "web",
            Some(&vm(None, None)),
            Some(pxc("banlieue-pve-a", true)),
        );
        assert_eq!(view.bootstrap, BootstrapSource::Empty);
        assert_eq!(view.failure_domain, None);
        let keyless = vm(
            Some(SecretKeyReference {
                name: "s".into(),
                key: None,
            }),
            None,
        );
        let view = OwnerView::from_virtual_machine(&pm(Some("pve-a"), false), "web", Some(&keyless), None);
        assert_eq!(
            view.bootstrap,
            BootstrapSource::Secret {
                name: "s".into(),
                key: "value".into()
            }
        );
    }

    #[test]
    fn a_virtual_machine_waits_for_its_standalone_cluster() {
        let machine = pm(Some("pve-a"), false);
        let v = vm(None, None);
        let missing = OwnerView::from_virtual_machine(&machine, "web", Some(&v), None);
        assert_eq!(
            missing.infra_cluster,
            InfraCluster::Missing("ProxmoxCluster \"banlieue-pve-a\" not found".into())
        );
        let not_yet =
            OwnerView::from_virtual_machine(&machine, "web", Some(&v), Some(pxc("banlieue-pve-a", false)));
        assert!(matches!(not_yet.infra_cluster, InfraCluster::NotProvisioned(_)));
        let no_provider = OwnerView::from_virtual_machine(&pm(None, false), "web", Some(&v), None);
        assert!(
            matches!(&no_provider.infra_cluster, InfraCluster::Missing(m) if m.contains("spec.providerRef")),
            "{:?}",
            no_provider.infra_cluster
        );
    }

    #[test]
    fn a_virtual_machine_is_paused_only_by_the_annotation() {
        let view = OwnerView::from_virtual_machine(
            &pm(Some("pve-a"), true),
            "web",
            Some(&vm(None, None)),
            Some(pxc("banlieue-pve-a", true)),
        );
        assert!(view.paused.is_some_and(|p| p.annotation && !p.cluster_paused));
        assert_eq!(view.paused_condition.0, "True");
        // A VirtualMachine that is gone (deletion): the user data is unknown, not empty.
        let gone = OwnerView::from_virtual_machine(&pm(Some("pve-a"), false), "web", None, None);
        assert!(!gone.owner_exists);
        assert_eq!(gone.bootstrap, BootstrapSource::Pending);
    }

    fn capi_machine(secret: Option<&str>, failure_domain: Option<&str>) -> Machine {
        Machine::new(
            "m1",
            MachineSpec {
                cluster_name: "c1".into(),
                bootstrap: MachineBootstrap {
                    data_secret_name: secret.map(str::to_owned),
                    ..Default::default()
                },
                failure_domain: failure_domain.map(str::to_owned),
                ..Default::default()
            },
        )
    }

    fn capi_cluster(provisioned: bool, paused: bool) -> Cluster {
        let mut c = Cluster::new(
            "c1",
            ClusterSpec {
                paused: Some(paused),
                ..Default::default()
            },
        );
        c.status = Some(ClusterStatus {
            initialization: Some(ClusterStatusInitialization {
                infrastructure_provisioned: Some(provisioned),
                ..Default::default()
            }),
            ..Default::default()
        });
        c
    }

    #[test]
    fn a_capi_machine_gives_its_bootstrap_secret_failure_domain_and_cluster() {
        let m = capi_machine(Some("m1-bootstrap"), Some("pve3"));
        let c = capi_cluster(true, false);
        let view =
            OwnerView::from_machine(&pm(None, false), "m1", Some(&m), Some(&c), Some(pxc("c1", false)));
        assert_eq!(view.owner, Owner::Machine("m1".into()));
        assert_eq!(
            view.bootstrap,
            BootstrapSource::Secret {
                name: "m1-bootstrap".into(),
                key: "value".into()
            }
        );
        assert_eq!(view.failure_domain.as_deref(), Some("pve3"));
        // Readiness comes from the CAPI Cluster, not the ProxmoxCluster's own status.
        assert!(matches!(view.infra_cluster, InfraCluster::Ready(_)));
        let waiting = OwnerView::from_machine(
            &pm(None, false),
            "m1",
            Some(&capi_machine(None, None)),
            Some(&capi_cluster(false, false)),
            Some(pxc("c1", true)),
        );
        assert_eq!(waiting.bootstrap, BootstrapSource::Pending);
        assert!(matches!(waiting.infra_cluster, InfraCluster::NotProvisioned(_)));
    }

    #[test]
    fn a_capi_machine_is_paused_by_its_cluster() {
        let m = capi_machine(Some("s"), None);
        let view = OwnerView::from_machine(
            &pm(None, false),
            "m1",
            Some(&m),
            Some(&capi_cluster(true, true)),
            Some(pxc("c1", true)),
        );
        assert!(view.paused.is_some_and(|p| p.cluster_paused));
        let no_cluster = OwnerView::from_machine(&pm(None, false), "m1", Some(&m), None, None);
        assert_eq!(
            no_cluster.infra_cluster,
            InfraCluster::Missing("Cluster \"c1\" not found".into())
        );
    }
}
