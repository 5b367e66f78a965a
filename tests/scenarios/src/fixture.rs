//! The objects CAPI's controllers (and a user) would write, on a real kube-apiserver with
//! CAPI's CRDs: a `Cluster` owning the infra cluster, `Machine`s with a bootstrap Secret owning
//! the infra machines; and waiting on what the provider writes back.

use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use banlieue_capi::contract::CLUSTER_NAME_LABEL;
use banlieue_capi::{Cluster, Machine};
use banlieue_testenv::{TestEnv, TestNamespace, crds_from_files};
use k8s_openapi::api::core::v1::{Event, Secret};
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams,
};
use kube::{Api, ResourceExt};
use serde_json::{Value, json};

use crate::provider::{Access, MachineHint, ProviderUnderTest, Template, Vm};

/// Longest wait for any one expected state.
pub const TIMEOUT: Duration = Duration::from_secs(90);
/// Bootstrap data of every machine (non-ASCII on purpose: delivered byte for byte).
pub const USER_DATA: &[u8] = b"#cloud-config\nruncmd:\n- [sh, -c, 'echo \xc3\xa9t\xc3\xa9 > /tmp/x']\n";
/// Name of the Cluster (and its infra cluster) in every scenario.
pub const CLUSTER: &str = "c1";
const GROUP: &str = "infrastructure.banlieue.io";
const POLL: Duration = Duration::from_millis(150);

/// The shared control plane of the test binary: banlieue's CRDs and CAPI's (Cluster, Machine,
/// IPAddressClaim, IPAddress). Provider-specific tests in the same binary use it too.
pub async fn env() -> Result<&'static TestEnv> {
    let dir = banlieue_capi::crds::dir();
    let capi = crds_from_files(
        [
            "cluster.x-k8s.io_clusters.yaml",
            "cluster.x-k8s.io_machines.yaml",
            "ipam.cluster.x-k8s.io_ipaddressclaims.yaml",
            "ipam.cluster.x-k8s.io_ipaddresses.yaml",
        ]
        .map(|f| dir.join(f)),
    )?;
    let mut crds = banlieue_api::crds::all();
    crds.extend(capi);
    Ok(TestEnv::shared_with(|b| b.crds(crds)).await?)
}

/// One scenario: its namespace, the provider under test and the machines created so far.
pub struct Scenario<P: ProviderUnderTest> {
    /// Kubernetes client (bound to this test's runtime).
    pub kube: kube::Client,
    /// Namespace of everything.
    pub ns: String,
    /// The provider.
    pub provider: P,
    machines: Vec<MachineHint>,
    _ns: TestNamespace,
}

impl<P: ProviderUnderTest> Scenario<P> {
    /// A fresh namespace `<provider>-<what>-xxxxx` and the provider's hypervisor double.
    pub async fn new(what: &str) -> Result<Self> {
        let env = env().await?;
        let guard = env.namespace(&format!("{}-{what}", P::NAME)).await?;
        let kube = env.client().await?;
        let ns = guard.name().to_owned();
        let provider = P::setup(kube.clone(), &ns).await?;
        Ok(Self {
            kube,
            ns,
            provider,
            machines: Vec::new(),
            _ns: guard,
        })
    }

    /// A namespaced API of a CAPI or core kind.
    pub fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
    {
        Api::namespaced(self.kube.clone(), &self.ns)
    }

    /// The API of an infra kind of this provider.
    pub fn infra(&self, kind: &str) -> Api<DynamicObject> {
        let gvk = GroupVersionKind::gvk(GROUP, "v1alpha1", kind);
        let ar = ApiResource::from_gvk_with_plural(&gvk, &format!("{}s", kind.to_lowercase()));
        Api::namespaced_with(self.kube.clone(), &self.ns, &ar)
    }

    /// The infra machine API.
    pub fn machines(&self) -> Api<DynamicObject> {
        self.infra(P::MACHINE_KIND)
    }

    /// The machines created so far.
    pub fn hints(&self) -> &[MachineHint] {
        &self.machines
    }

    /// The `Cluster` `c1` and its infra cluster (owned by it, labelled, as CAPI leaves them).
    /// Does not wait.
    pub async fn cluster(&self, access: Access) -> Result<()> {
        let cluster: Cluster = serde_json::from_value(json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
            "metadata": {"name": CLUSTER},
            "spec": {
                "controlPlaneEndpoint": {"host": "10.0.0.100", "port": 6443},
                "infrastructureRef": {"apiGroup": GROUP, "kind": P::CLUSTER_KIND, "name": CLUSTER},
            },
        }))?;
        let cluster = self
            .api::<Cluster>()
            .create(&PostParams::default(), &cluster)
            .await?;
        let spec = self.provider.cluster_spec(access).await?;
        let infra: DynamicObject = serde_json::from_value(json!({
            "apiVersion": format!("{GROUP}/v1alpha1"), "kind": P::CLUSTER_KIND,
            "metadata": {
                "name": CLUSTER,
                "labels": {CLUSTER_NAME_LABEL: CLUSTER},
                "ownerReferences": [{
                    "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster", "name": CLUSTER,
                    "uid": cluster.uid().context("Cluster uid")?,
                    "controller": true, "blockOwnerDeletion": true,
                }],
            },
            "spec": spec,
        }))?;
        self.infra(P::CLUSTER_KIND)
            .create(&PostParams::default(), &infra)
            .await?;
        Ok(())
    }

    /// Waits for the infra cluster to be provisioned, then does what CAPI's Cluster controller
    /// does: copies its failure domains to the Cluster and marks the infrastructure provisioned.
    pub async fn cluster_infrastructure_ready(&self) -> Result<Value> {
        let infra = self
            .wait_infra(
                P::CLUSTER_KIND,
                CLUSTER,
                "provisioned",
                crate::object::provisioned,
            )
            .await?;
        let domains = infra
            .pointer("/status/failureDomains")
            .cloned()
            .unwrap_or_else(|| json!([]));
        // Every backend tells the capacity of its failure domains (the Provider's status shows
        // it).
        for domain in domains.as_array().into_iter().flatten() {
            let cpus = domain
                .pointer("/attributes/banlieue.io~1cpus")
                .and_then(Value::as_str);
            let memory = domain
                .pointer("/attributes/banlieue.io~1memoryMiB")
                .and_then(Value::as_str);
            anyhow::ensure!(
                cpus.and_then(|c| c.parse::<u32>().ok()).is_some_and(|c| c > 0)
                    && memory.and_then(|m| m.parse::<u64>().ok()).is_some_and(|m| m > 0),
                "failure domain without its capacity (banlieue.io/cpus, banlieue.io/memoryMiB): {domain}"
            );
        }
        let status = json!({"status": {
            "initialization": {"infrastructureProvisioned": true},
            "failureDomains": domains,
        }});
        self.api::<Cluster>()
            .patch_status(CLUSTER, &PatchParams::default(), &Patch::Merge(&status))
            .await?;
        Ok(infra)
    }

    /// A provisioned Cluster with valid access and the provider's controllers running.
    pub async fn ready_cluster(&mut self) -> Result<()> {
        self.cluster(Access::Valid).await?;
        self.provider.start();
        self.cluster_infrastructure_ready().await?;
        Ok(())
    }

    /// Bootstrap Secret, `Machine` (in `failure_domain`) and its infra machine (controlled by
    /// the Machine), as CAPI's MachineSet and bootstrap controllers write them. Returns the infra
    /// machine's UID.
    pub async fn machine(
        &mut self,
        name: &str,
        failure_domain: Option<&str>,
        template: Template,
    ) -> Result<String> {
        let spec = self.provider.machine_spec(template);
        self.machine_with_spec(name, failure_domain, spec).await
    }

    /// [`Scenario::machine`] with the infra machine's `spec` given.
    pub async fn machine_with_spec(
        &mut self,
        name: &str,
        failure_domain: Option<&str>,
        infra_spec: Value,
    ) -> Result<String> {
        let secret: Secret = serde_json::from_value(json!({
            "metadata": {"name": format!("{name}-bootstrap"), "labels": {CLUSTER_NAME_LABEL: CLUSTER}},
            "type": "cluster.x-k8s.io/secret",
            "data": {
                "value": k8s_openapi::ByteString(USER_DATA.to_vec()),
                "format": k8s_openapi::ByteString(b"cloud-config".to_vec()),
            },
        }))?;
        self.api::<Secret>()
            .create(&PostParams::default(), &secret)
            .await?;
        let mut spec = json!({
            "clusterName": CLUSTER,
            "bootstrap": {"dataSecretName": format!("{name}-bootstrap")},
            "infrastructureRef": {"apiGroup": GROUP, "kind": P::MACHINE_KIND, "name": name},
        });
        if let Some(fd) = failure_domain {
            spec["failureDomain"] = json!(fd);
        }
        let machine: Machine = serde_json::from_value(json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
            "metadata": {"name": name, "labels": {CLUSTER_NAME_LABEL: CLUSTER}},
            "spec": spec,
        }))?;
        let machine = self
            .api::<Machine>()
            .create(&PostParams::default(), &machine)
            .await?;
        let infra: DynamicObject = serde_json::from_value(json!({
            "apiVersion": format!("{GROUP}/v1alpha1"), "kind": P::MACHINE_KIND,
            "metadata": {
                "name": name,
                "labels": {CLUSTER_NAME_LABEL: CLUSTER},
                "ownerReferences": [{
                    "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine", "name": name,
                    "uid": machine.uid().context("Machine uid")?,
                    "controller": true, "blockOwnerDeletion": true,
                }],
            },
            "spec": infra_spec,
        }))?;
        let infra = self.machines().create(&PostParams::default(), &infra).await?;
        let uid = infra.uid().context("infra machine uid")?;
        self.machines.push(MachineHint {
            name: name.to_owned(),
            uid: uid.clone(),
        });
        Ok(uid)
    }

    /// Deletes the infra machine, as CAPI's Machine controller does once its Machine is being
    /// deleted (it then waits for the infra machine to be gone).
    pub async fn delete_machine(&self, name: &str) -> Result<()> {
        self.machines().delete(name, &DeleteParams::default()).await?;
        Ok(())
    }

    /// The infra object `kind/name` as JSON, if it exists.
    pub async fn get_infra(&self, kind: &str, name: &str) -> Result<Option<Value>> {
        Ok(match self.infra(kind).get_opt(name).await? {
            Some(o) => Some(serde_json::to_value(o)?),
            None => None,
        })
    }

    /// Polls the infra object until `check`, letting guests "boot" meanwhile.
    pub async fn wait_infra(
        &self,
        kind: &str,
        name: &str,
        what: &str,
        check: impl Fn(&Value) -> bool,
    ) -> Result<Value> {
        let deadline = tokio::time::Instant::now() + TIMEOUT;
        loop {
            let obj = self.get_infra(kind, name).await?;
            if let Some(o) = &obj
                && check(o)
            {
                return Ok(obj.unwrap_or_default());
            }
            if tokio::time::Instant::now() > deadline {
                bail!(
                    "timed out waiting for {kind} {name} to be {what}; last status: {:#}",
                    obj.and_then(|o| o.get("status").cloned()).unwrap_or_default()
                );
            }
            self.provider.boot_guests(&self.machines).await?;
            tokio::time::sleep(POLL).await;
        }
    }

    /// [`Scenario::wait_infra`] on an infra machine.
    pub async fn wait_machine(
        &self,
        name: &str,
        what: &str,
        check: impl Fn(&Value) -> bool,
    ) -> Result<Value> {
        self.wait_infra(P::MACHINE_KIND, name, what, check).await
    }

    /// Waits until the infra machine no longer exists (its finalizer removed).
    pub async fn wait_machine_gone(&self, name: &str) -> Result<()> {
        let deadline = tokio::time::Instant::now() + TIMEOUT;
        while let Some(o) = self.get_infra(P::MACHINE_KIND, name).await? {
            if tokio::time::Instant::now() > deadline {
                bail!(
                    "{} {name} was not released; metadata {:#}, status {:#}",
                    P::MACHINE_KIND,
                    o["metadata"],
                    o["status"]
                );
            }
            tokio::time::sleep(POLL).await;
        }
        Ok(())
    }

    /// Every VM of this scenario on the hypervisor.
    pub async fn vms(&self) -> Result<Vec<Vm>> {
        self.provider.vms(&self.machines).await
    }

    /// The VMs that carry `uid` as their owner.
    pub async fn vms_of(&self, uid: &str) -> Result<Vec<Vm>> {
        Ok(self
            .vms()
            .await?
            .into_iter()
            .filter(|v| v.owner_uid.as_deref() == Some(uid))
            .collect())
    }

    /// Reasons of the Events about `name`.
    pub async fn event_texts(&self, name: &str) -> Result<Vec<String>> {
        let events: Api<Event> = self.api();
        Ok(events
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .filter(|e| e.involved_object.name.as_deref() == Some(name))
            .map(|e| {
                format!(
                    "{} {}",
                    e.reason.unwrap_or_default(),
                    e.message.unwrap_or_default()
                )
            })
            .collect())
    }

    /// Patches `metadata` of the infra machine (merge patch).
    pub async fn patch_machine_metadata(&self, name: &str, metadata: Value) -> Result<()> {
        self.machines()
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(&json!({"metadata": metadata})),
            )
            .await?;
        Ok(())
    }

    /// Sets `Cluster.spec.paused`.
    pub async fn pause_cluster(&self, paused: bool) -> Result<()> {
        self.api::<Cluster>()
            .patch(
                CLUSTER,
                &PatchParams::default(),
                &Patch::Merge(&json!({"spec": {"paused": paused}})),
            )
            .await?;
        Ok(())
    }
}

/// Plays a CAPI IPAM provider for claim `claim` of namespace `ns`: the `IPAddress`
/// `address/prefix` via `gateway` in pool `pool` (a `poolRef`), then the claim's
/// `status.addressRef`.
pub async fn allocate_address(
    kube: &kube::Client,
    ns: &str,
    claim: &str,
    pool: &Value,
    (address, prefix, gateway): (&str, u8, &str),
) -> Result<()> {
    let ip: banlieue_capi::IpAddress = serde_json::from_value(json!({
        "apiVersion": "ipam.cluster.x-k8s.io/v1beta2", "kind": "IPAddress",
        "metadata": {"name": claim},
        "spec": {"address": address, "prefix": prefix, "gateway": gateway,
                 "claimRef": {"name": claim}, "poolRef": pool},
    }))?;
    Api::<banlieue_capi::IpAddress>::namespaced(kube.clone(), ns)
        .create(&PostParams::default(), &ip)
        .await?;
    Api::<banlieue_capi::IpAddressClaim>::namespaced(kube.clone(), ns)
        .patch_status(
            claim,
            &PatchParams::default(),
            &Patch::Merge(&json!({"status": {"addressRef": {"name": claim}}})),
        )
        .await?;
    Ok(())
}
