//! A provider binary's main loop, the same for every hypervisor: the InfraMachine, InfraCluster
//! and InfraMachineTemplate controllers of one backend, and the owner references of its
//! Providers ([`provider_references`]), behind the runtime's manager (`/healthz`,
//! `/readyz`, `/metrics`, optional Lease leader election, graceful shutdown on SIGTERM/SIGINT),
//! all recording into one metrics registry.

use std::marker::PhantomData;
use std::sync::Arc;

use banlieue_api::infrastructure::kinds::{InfraMachine, InfraMachineTemplate};
use banlieue_provider_runtime::flags::RuntimeArgs;
use banlieue_provider_runtime::http::Probes;
use banlieue_provider_runtime::{logging, manager, shutdown};

use crate::cluster::{self, ClusterBackend, ClusterContext};
use crate::machine::{self, MachineBackend, MachineContext};
use crate::provider_references;
use crate::template::{self, TemplateContext};

/// The backends of one provider binary, and its template kind `T`.
pub struct Provider<M, C, T> {
    /// The binary's name (`banlieue-proxmox`): Events' reporter, default Lease name.
    pub name: &'static str,
    /// The machine backend.
    pub machines: M,
    /// The cluster backend.
    pub clusters: C,
    /// The template kind.
    pub templates: PhantomData<T>,
}

impl<M, C, T> Provider<M, C, T>
where
    M: MachineBackend,
    C: ClusterBackend<Cluster = <M::Machine as InfraMachine>::Cluster>,
    T: InfraMachineTemplate,
{
    /// A provider of these backends.
    pub fn new(name: &'static str, machines: M, clusters: C) -> Self {
        Self {
            name,
            machines,
            clusters,
            templates: PhantomData,
        }
    }

    /// A provider binary's `main` after its flags are parsed: logs in the flags' format,
    /// connects to Kubernetes (in-cluster or the kubeconfig) and [`serve`](Self::serve)s.
    pub async fn main(self, runtime: &RuntimeArgs) -> banlieue_provider_runtime::Result<()> {
        logging::init(runtime.log_format);
        let client =
            kube::Client::try_default()
                .await
                .map_err(|source| banlieue_provider_runtime::Error::Kube {
                    context: "connecting to Kubernetes".into(),
                    source,
                })?;
        self.serve(client, runtime).await
    }

    /// Runs the four controllers until SIGTERM/SIGINT (or until the Lease is lost: an error).
    pub async fn serve(
        self,
        client: kube::Client,
        runtime: &RuntimeArgs,
    ) -> banlieue_provider_runtime::Result<()> {
        let probes = Arc::new(Probes::default());
        let mut machines = MachineContext::new(client.clone(), self.machines, self.name);
        machines.metrics = probes.metrics.clone();
        machines.watch_filter.clone_from(&runtime.watch_filter);
        let mut clusters = ClusterContext::new(client.clone(), self.clusters, self.name);
        clusters.metrics = probes.metrics.clone();
        clusters.watch_filter.clone_from(&runtime.watch_filter);
        let templates = Arc::new(TemplateContext {
            client: client.clone(),
            field_manager: M::FIELD_MANAGER,
            metrics: probes.metrics.clone(),
            watch_filter: runtime.watch_filter.clone(),
        });
        let references = Arc::new(provider_references::Context {
            client: client.clone(),
            backend: <M::Machine as InfraMachine>::BACKEND,
            metrics: probes.metrics.clone(),
        });
        let (machines, clusters) = (Arc::new(machines), Arc::new(clusters));
        let (namespace, concurrency) = (runtime.namespace.as_deref(), runtime.concurrency);
        let ready = probes.clone();
        manager::run(
            client,
            runtime.manager(self.name),
            probes,
            shutdown::signal(),
            |stop| async move {
                ready.set_ready(true);
                futures::future::join4(
                    machine::run(machines, namespace, concurrency, stop.clone()),
                    cluster::run(clusters, namespace, concurrency, stop.clone()),
                    template::run::<T>(templates, namespace, stop.clone()),
                    provider_references::run(references, stop),
                )
                .await;
            },
        )
        .await
    }
}
