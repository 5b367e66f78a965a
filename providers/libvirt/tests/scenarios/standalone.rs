//! The standalone harness of the libvirt provider's tests: a libvirt Provider on
//! `test:///default`, its LibvirtCluster and the controllers, and VirtualMachine-owned
//! LibvirtMachines written the way the banlieue controller writes them. Shared by
//! `tests/scenarios.rs` and `tests/secrets.rs`.

#![allow(dead_code)] // each test binary uses a part

use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use banlieue_api::banlieue::{Provider, VirtualMachine};
use banlieue_api::infrastructure::{LibvirtCluster, LibvirtMachine};
use banlieue_api::standalone::infra_cluster_name;
use banlieue_libvirt::connection::VirtConnector;
use banlieue_libvirt::desired::Settings;
use banlieue_libvirt::hypervisor::Hypervisor;
use banlieue_libvirt::machine_controller::FIELD_MANAGER;
use banlieue_libvirt::xml::{self, DomainType};
use banlieue_provider_kit::cluster::{self as kit_cluster, ClusterContext};
use banlieue_provider_kit::machine::{self as kit_machine, MachineContext};
pub use banlieue_provider_runtime::testing::eventually;
use banlieue_testenv::TestEnv;
use k8s_openapi::api::core::v1::Secret;
use kube::api::PostParams;
use kube::{Api, Resource};
use serde_json::json;

pub const URI: &str = "test:///default";
pub const POOL: &str = "default-pool";

pub async fn env() -> Result<&'static TestEnv> {
    banlieue_scenarios::env().await
}

pub fn owner_ref<K: Resource<DynamicType = ()>>(obj: &K) -> serde_json::Value {
    json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "name": obj.meta().name,
        "uid": obj.meta().uid,
        "controller": true,
        "blockOwnerDeletion": true,
    })
}

pub struct Standalone {
    pub client: kube::Client,
    pub ns: String,
    pub provider: String,
    pub connector: VirtConnector,
    /// The controllers' requeue while waiting (default: theirs).
    pub wait_requeue: Option<Duration>,
    pub tasks: Vec<tokio::task::JoinHandle<()>>,
    /// The registry both controllers record into (their `/metrics`).
    pub metrics: banlieue_provider_runtime::metrics::Metrics,
}

impl Drop for Standalone {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl Standalone {
    /// A libvirt Provider on `test:///default`, its standalone LibvirtCluster, a base volume,
    /// and both controllers running.
    pub async fn new(prefix: &str) -> Result<(Self, banlieue_testenv::TestNamespace)> {
        Self::requeueing(prefix, None).await
    }

    /// [`Self::new`] with the controllers' requeue while waiting set to `wait_requeue`.
    pub async fn requeueing(
        prefix: &str,
        wait_requeue: Option<Duration>,
    ) -> Result<(Self, banlieue_testenv::TestNamespace)> {
        let env = env().await?;
        let ns = env.namespace(prefix).await?;
        let client = env.client().await?;
        let connector = VirtConnector::default();
        let hv = connector.get(URI);
        if hv.volume(POOL, "base.qcow2").await?.is_none() {
            let _ = hv
                .create_volume(POOL, &xml::plain_volume_xml("base.qcow2", 1 << 30, "qcow2"))
                .await;
        }
        let provider_name = ns.name().to_owned();
        let provider: Provider = serde_json::from_value(json!({
            "apiVersion": "banlieue.io/v1alpha1", "kind": "Provider",
            "metadata": {"name": provider_name},
            "spec": {"backend": "libvirt", "endpoint": URI},
        }))?;
        let provider = Api::<Provider>::all(client.clone())
            .create(&PostParams::default(), &provider)
            .await?;
        let lvc: LibvirtCluster = serde_json::from_value(json!({
            "apiVersion": "infrastructure.banlieue.io/v1alpha1", "kind": "LibvirtCluster",
            "metadata": {
                "name": infra_cluster_name(&provider_name),
                "ownerReferences": [owner_ref(&provider)],
                "labels": {"banlieue.io/provider": provider_name},
            },
            "spec": {"providerRef": {"name": provider_name}},
        }))?;
        Api::<LibvirtCluster>::namespaced(client.clone(), ns.name())
            .create(&PostParams::default(), &lvc)
            .await?;
        let mut s = Self {
            client: client.clone(),
            ns: ns.name().to_owned(),
            provider: provider_name,
            connector: connector.clone(),
            wait_requeue,
            tasks: Vec::new(),
            metrics: Default::default(),
        };
        s.start_controllers();
        Ok((s, ns))
    }

    pub fn start_controllers(&mut self) {
        let settings = Settings {
            domain_type: DomainType::Qemu,
            ..Settings::default()
        };
        let backends = banlieue_libvirt::provider(self.connector.clone(), settings);
        let mut mctx = MachineContext::new(self.client.clone(), backends.machines, "banlieue-libvirt-test");
        let mut cctx = ClusterContext::new(self.client.clone(), backends.clusters, FIELD_MANAGER);
        if let Some(requeue) = self.wait_requeue {
            mctx.wait_requeue = requeue;
            cctx.retry = requeue;
        }
        mctx.metrics = self.metrics.clone();
        cctx.metrics = self.metrics.clone();
        let (mctx, cctx) = (Arc::new(mctx), Arc::new(cctx));
        let (ns1, ns2) = (self.ns.clone(), self.ns.clone());
        self.tasks.push(tokio::spawn(async move {
            kit_machine::run(mctx, Some(&ns1), 4, std::future::pending()).await;
        }));
        self.tasks.push(tokio::spawn(async move {
            kit_cluster::run(cctx, Some(&ns2), 2, std::future::pending()).await;
        }));
    }

    /// The Provider the harness created.
    pub async fn provider_object(&self) -> Result<Provider> {
        Ok(Api::<Provider>::all(self.client.clone())
            .get(&self.provider)
            .await?)
    }

    pub fn api<K>(&self) -> Api<K>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
    {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    /// A VirtualMachine with user data and its LibvirtMachine, as the banlieue controller
    /// creates them.
    pub async fn machine(&self, name: &str, user_data: &str) -> Result<LibvirtMachine> {
        self.user_data_secret(name, user_data).await?;
        self.machine_without_user_data(name).await
    }

    /// The user-data Secret of the VirtualMachine `name` (`<name>-user-data`, key `userdata`).
    pub async fn user_data_secret(&self, name: &str, user_data: &str) -> Result<Secret> {
        let secret = Secret {
            metadata: kube::api::ObjectMeta {
                name: Some(format!("{name}-user-data")),
                ..Default::default()
            },
            string_data: Some([("userdata".to_owned(), user_data.to_owned())].into()),
            ..Default::default()
        };
        Ok(self
            .api::<Secret>()
            .create(&PostParams::default(), &secret)
            .await?)
    }

    /// [`Self::machine`] before its user-data Secret exists.
    pub async fn machine_without_user_data(&self, name: &str) -> Result<LibvirtMachine> {
        self.machine_from(name, json!({"volume": "base.qcow2", "pool": POOL}))
            .await
    }

    /// [`Self::machine_without_user_data`] cloned from `source` (a `LibvirtVolumeSource`).
    pub async fn machine_from(&self, name: &str, source: serde_json::Value) -> Result<LibvirtMachine> {
        let vm: VirtualMachine = serde_json::from_value(json!({
            "apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine",
            "metadata": {"name": name},
            "spec": {
                "providerRef": {"name": self.provider},
                "source": {"libvirt": source},
                "cpu": {"cores": 1}, "memoryMiB": 256,
                "userDataSecretRef": {"name": format!("{name}-user-data"), "key": "userdata"},
            },
        }))?;
        let vm = self
            .api::<VirtualMachine>()
            .create(&PostParams::default(), &vm)
            .await?;
        let lm: LibvirtMachine = serde_json::from_value(json!({
            "apiVersion": "infrastructure.banlieue.io/v1alpha1", "kind": "LibvirtMachine",
            "metadata": {"name": name, "ownerReferences": [owner_ref(&vm)]},
            "spec": {
                "providerRef": {"name": self.provider},
                "source": source,
                "cpu": {"cores": 1}, "memoryMiB": 256,
                "disks": [{"name": "root", "sizeGiB": 2}],
            },
        }))?;
        Ok(self
            .api::<LibvirtMachine>()
            .create(&PostParams::default(), &lm)
            .await?)
    }

    pub async fn provisioned(&self, name: &str) -> Result<LibvirtMachine> {
        let api = self.api::<LibvirtMachine>();
        eventually(&format!("{name} provisioned"), || async {
            let lm = api.get(name).await?;
            let done = lm
                .status
                .as_ref()
                .and_then(|s| s.initialization.as_ref())
                .and_then(|i| i.provisioned)
                .unwrap_or(false);
            Ok(done.then_some(lm))
        })
        .await
    }
}
