//! The standalone-mode harness of the vSphere scenario tests (shared by `scenarios.rs` and
//! `secrets.rs`): a namespace with a credentials Secret, a Provider and its VSphereCluster, the
//! controllers for that namespace, and VirtualMachine-owned VSphereMachines.
#![allow(dead_code)]

use std::time::Duration;

use anyhow::{Result, bail};
use banlieue_api::banlieue::{Provider, VirtualMachine};
use banlieue_api::infrastructure::{VSphereCluster, VSphereMachine};
use banlieue_api::standalone::infra_cluster_name;
use banlieue_testenv::TestEnv;
use k8s_openapi::api::core::v1::{Event, Secret};
use kube::api::{ListParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;

use crate::vcsim_support::{USER, Vcsim};

pub(crate) const TIMEOUT: Duration = Duration::from_secs(90);
pub(crate) const TEMPLATE: &str = "DC0_C0_RP0_VM0";

pub(crate) async fn env() -> Result<&'static TestEnv> {
    banlieue_scenarios::env().await
}

/// A namespace with a credentials Secret, a Provider (pinned thumbprint) and its standalone
/// VSphereCluster, and the controllers running for that namespace.
pub(crate) struct Scenario {
    pub(crate) kube: kube::Client,
    pub(crate) ns: String,
    pub(crate) _ns_guard: banlieue_testenv::TestNamespace,
    pub(crate) provider: String,
    pub(crate) controllers: Vec<tokio::task::JoinHandle<()>>,
    /// The controllers' metrics registry (their `/metrics`).
    #[allow(dead_code, reason = "read by the secrets test binary only")]
    pub(crate) metrics: banlieue_provider_runtime::metrics::Metrics,
}

impl Drop for Scenario {
    fn drop(&mut self) {
        for c in &self.controllers {
            c.abort();
        }
    }
}

pub(crate) async fn scenario(sim: &Vcsim, prefix: &str, password: &str) -> Result<Scenario> {
    scenario_as(sim, prefix, USER, password).await
}

/// [`scenario`] with the provider logging in as `user`.
pub(crate) async fn scenario_as(sim: &Vcsim, prefix: &str, user: &str, password: &str) -> Result<Scenario> {
    let env = env().await?;
    let ns_guard = env.namespace(prefix).await?;
    let ns = ns_guard.to_string();
    let kube = env.client().await?;
    let provider = format!("{ns}-vc");
    let secrets: Api<Secret> = Api::namespaced(kube.clone(), &ns);
    secrets
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "vc-creds"},
                "stringData": {"username": user, "password": password},
            }))?,
        )
        .await?;
    let providers: Api<Provider> = Api::all(kube.clone());
    let p = providers
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "banlieue.io/v1alpha1", "kind": "Provider",
                "metadata": {"name": provider},
                "spec": {
                    "backend": "vsphere",
                    "endpoint": sim.url,
                    "credentialsRef": {"name": "vc-creds", "namespace": ns},
                    "tls": {"sha256Fingerprint": sim.thumbprint},
                },
            }))?,
        )
        .await?;
    let clusters: Api<VSphereCluster> = Api::namespaced(kube.clone(), &ns);
    clusters
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "infrastructure.banlieue.io/v1alpha1", "kind": "VSphereCluster",
                "metadata": {
                    "name": infra_cluster_name(&provider),
                    "ownerReferences": [{
                        "apiVersion": "banlieue.io/v1alpha1", "kind": "Provider", "name": provider,
                        "uid": p.uid().unwrap_or_default(), "controller": true,
                    }],
                },
                "spec": {"providerRef": {"name": provider}, "datacenter": "DC0"},
            }))?,
        )
        .await?;
    let spawned = banlieue_vsphere::provider("banlieue-vsphere-test").spawn(kube.clone(), &ns, (0, 0));
    let (metrics, controllers) = (spawned.metrics, spawned.tasks.into());
    Ok(Scenario {
        kube,
        ns,
        _ns_guard: ns_guard,
        provider,
        controllers,
        metrics,
    })
}

impl Scenario {
    /// A VirtualMachine (with user data) and the VSphereMachine it owns.
    pub(crate) async fn machine(&self, name: &str, template: &str) -> Result<()> {
        self.machine_with(name, template, json!({})).await
    }

    /// Like [`Scenario::machine`], with extra annotations on the VSphereMachine.
    pub(crate) async fn machine_with(
        &self,
        name: &str,
        template: &str,
        annotations: serde_json::Value,
    ) -> Result<()> {
        let secrets: Api<Secret> = Api::namespaced(self.kube.clone(), &self.ns);
        secrets
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({
                    "metadata": {"name": format!("{name}-user-data")},
                    "stringData": {"value": format!("#cloud-config\nhostname: {name}\n")},
                }))?,
            )
            .await?;
        let vms: Api<VirtualMachine> = Api::namespaced(self.kube.clone(), &self.ns);
        let bvm = vms
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({
                    "apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine",
                    "metadata": {"name": name},
                    "spec": {
                        "providerRef": {"name": self.provider},
                        "source": {"vsphere": {"template": template}},
                        "cpu": {"cores": 2},
                        "memoryMiB": 2048,
                        "userDataSecretRef": {"name": format!("{name}-user-data")},
                    },
                }))?,
            )
            .await?;
        let machines: Api<VSphereMachine> = Api::namespaced(self.kube.clone(), &self.ns);
        machines
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({
                    "apiVersion": "infrastructure.banlieue.io/v1alpha1", "kind": "VSphereMachine",
                    "metadata": {
                        "name": name,
                        "annotations": annotations,
                        "ownerReferences": [{
                            "apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine", "name": name,
                            "uid": bvm.uid().unwrap_or_default(), "controller": true,
                        }],
                    },
                    "spec": {
                        "providerRef": {"name": self.provider},
                        "source": {"template": template},
                        "resourcePool": "DC0_C0/Resources",
                        "datastore": "LocalDS_0",
                        "cpu": {"cores": 2},
                        "memoryMiB": 2048,
                    },
                }))?,
            )
            .await?;
        Ok(())
    }

    pub(crate) fn machines(&self) -> Api<VSphereMachine> {
        Api::namespaced(self.kube.clone(), &self.ns)
    }

    /// Polls the machine until `done` says so.
    pub(crate) async fn wait_machine(
        &self,
        name: &str,
        what: &str,
        done: impl Fn(&VSphereMachine) -> bool,
    ) -> Result<VSphereMachine> {
        let deadline = tokio::time::Instant::now() + TIMEOUT;
        loop {
            let m = self.machines().get(name).await?;
            if done(&m) {
                return Ok(m);
            }
            if tokio::time::Instant::now() > deadline {
                bail!("timed out waiting for {what}; last status: {:?}", m.status);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    pub(crate) async fn events(&self, name: &str) -> Result<Vec<String>> {
        let events: Api<Event> = Api::namespaced(self.kube.clone(), &self.ns);
        Ok(events
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .filter(|e| e.involved_object.name.as_deref() == Some(name))
            .filter_map(|e| e.reason)
            .collect())
    }
}

pub(crate) fn ready(m: &VSphereMachine) -> Option<(String, String, String)> {
    let c = m
        .status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready")?;
    Some((c.status.clone(), c.reason.clone(), c.message.clone()))
}

pub(crate) fn state(m: &VSphereMachine) -> Option<String> {
    Some(
        m.status
            .as_ref()?
            .provisioning
            .as_ref()?
            .state
            .as_str()
            .to_owned(),
    )
}
