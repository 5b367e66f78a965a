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
use banlieue_provider_runtime::metrics::Metrics;
use banlieue_provider_runtime::{logging, manager, shutdown};

use crate::cluster::{self, ClusterBackend, ClusterContext};
use crate::machine::{self, MachineBackend, MachineContext};
use crate::provider_references;
use crate::template::{self, TemplateContext};
use tokio::task::JoinHandle;

/// The controllers [`Provider::spawn`] started.
pub struct Spawned {
    /// Their metrics registry.
    pub metrics: Metrics,
    /// The InfraMachine and InfraCluster controllers' tasks (aborting one stops its controller).
    pub tasks: [JoinHandle<()>; 2],
}

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

    /// The InfraMachine and InfraCluster controllers as tasks of this process, watching
    /// `namespace`, each with its number of concurrent reconciles (machines, clusters; 0:
    /// unbounded): what tests and benches run. No leader election, probes or template controller.
    pub fn spawn(self, client: kube::Client, namespace: &str, concurrency: (u16, u16)) -> Spawned {
        let metrics = Metrics::default();
        let (machines, clusters) = self.contexts(client, &metrics, None);
        let (a, b) = (namespace.to_owned(), namespace.to_owned());
        let pending = std::future::pending;
        let tasks = [
            tokio::spawn(async move { machine::run(machines, Some(&a), concurrency.0, pending()).await }),
            tokio::spawn(async move { cluster::run(clusters, Some(&b), concurrency.1, pending()).await }),
        ];
        Spawned { metrics, tasks }
    }

    /// The machine and cluster controllers' contexts, recording into `metrics`.
    fn contexts(
        self,
        client: kube::Client,
        metrics: &Metrics,
        watch_filter: Option<&String>,
    ) -> (Arc<MachineContext<M>>, Arc<ClusterContext<C>>) {
        let mut machines = MachineContext::new(client.clone(), self.machines, self.name);
        machines.metrics = metrics.clone();
        machines.watch_filter = watch_filter.cloned();
        let mut clusters = ClusterContext::new(client, self.clusters, self.name);
        clusters.metrics = metrics.clone();
        clusters.watch_filter = watch_filter.cloned();
        (Arc::new(machines), Arc::new(clusters))
    }

    /// Runs the four controllers until SIGTERM/SIGINT (or until the Lease is lost: an error).
    pub async fn serve(
        self,
        client: kube::Client,
        runtime: &RuntimeArgs,
    ) -> banlieue_provider_runtime::Result<()> {
        let probes = Arc::new(Probes::default());
        let name = self.name;
        let (machines, clusters) =
            self.contexts(client.clone(), &probes.metrics, runtime.watch_filter.as_ref());
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
        let (namespace, concurrency) = (runtime.namespace.as_deref(), runtime.concurrency);
        let ready = probes.clone();
        manager::run(
            client,
            runtime.manager(name),
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
