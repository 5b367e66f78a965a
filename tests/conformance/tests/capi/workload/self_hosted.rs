//! CAPI's self-hosted spec (`e2e/self_hosted.go`) on a workload cluster of real guests: what a
//! user does to make a cluster manage itself.
//!
//! 1. cert-manager's kinds in the workload cluster (the harness then issues the webhooks'
//!    certificates in its place, as on the management cluster) and the managers' images in
//!    every guest's containerd (a user's nodes pull them from a registry; none is reachable);
//! 2. the real `clusterctl init` into the workload cluster from CAPI's release components and
//!    banlieue's: CAPI's three managers and `banlieue-proxmox` run there as Pods, under their
//!    ServiceAccounts, the provider reaching the simulator on the lab bridge;
//! 3. `clusterctl move` of the cluster's namespace into the workload cluster: nothing of it is
//!    left on the management cluster;
//! 4. the managers in the workload cluster scale its workers by one: a Machine, a VM cloned by
//!    the provider's Pod, a guest that joins as a Node;
//! 5. `clusterctl move` back to the management cluster (as the spec does before deleting), whose
//!    managers take the cluster over again.
//!
//! After each step the VMs on the simulator match the Machines one to one ([`Fleet::settled`]).

use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams};
use serde_json::json;

use super::super::{
    ClusterctlTarget, capi, clusterctl, clusterctl_init_into, controller_dir, manager_containers, poll,
    run_clusterctl,
};
use super::{Mode, Workload};

/// How long the managers' Deployments in the workload cluster may take to be Available.
const MANAGERS_AVAILABLE_TIMEOUT: Duration = Duration::from_secs(300);

impl Workload {
    pub(super) async fn self_hosted(&mut self) -> Result<String> {
        let kubeconfig = self
            .env
            .workload_kubeconfig
            .clone()
            .context("the workload cluster's kubeconfig (quick-start first)")?;
        let workload = self.env.workload()?.clone();
        let proxmox = banlieue_dev::pods::PROXMOX_COMPONENTS;

        banlieue_testenv::install_crds(
            &workload,
            &banlieue_testenv::cert_manager_stub_crds()?,
            Duration::from_secs(60),
        )
        .await
        .context("cert-manager's kinds in the workload cluster")?;
        let images = banlieue_dev::capi_pods::manager_images(
            &[proxmox],
            &controller_dir()?,
            &self.env.mgmt.workdir().join("images"),
        )?;
        let guests = {
            let running = self.env.running.lock().expect("guests lock");
            for guest in running.values() {
                for (reference, tarball) in &images {
                    guest
                        .import_image(reference, tarball)
                        .with_context(|| format!("importing {reference} into guest {}", guest.name()))?;
                }
            }
            running.len()
        };
        self.env.progress(&format!(
            "{} images imported into the {guests} guests",
            images.len()
        ));

        let config = clusterctl_init_into(
            &self.env.mgmt,
            &ClusterctlTarget {
                kubeconfig: &kubeconfig,
                client: workload.clone(),
                repository: self.env.mgmt.workdir().join("clusterctl/self-hosted-repository"),
            },
            &self.env.hv,
            Mode::Pods,
        )
        .await
        .context("clusterctl init into the workload cluster")?;
        let issued = banlieue_dev::certificates::issue_and_inject(&self.env.mgmt, &workload).await?;
        self.env.progress(&format!(
            "clusterctl init into the workload cluster; {} webhook certificates issued",
            issued.certificates.len()
        ));
        let deployments = banlieue_dev::capi_pods::manager_deployments(&[proxmox]);
        let placed = self.wait_managers_available(&workload, &deployments).await?;
        self.env
            .progress(&format!("managers Available in the workload cluster: {placed}"));

        self.clusterctl_move(&config, self.env.mgmt.admin().path(), &kubeconfig)?;
        let management = std::mem::replace(&mut self.env.client, workload.clone());
        let left = self.clusters_in(&management).await?;
        ensure!(
            left == 0,
            "{left} Clusters left on the management cluster after the move"
        );
        let (control_planes, workers) = self.counts();
        self.settle(
            "the moved cluster settled in the workload cluster",
            (control_planes, workers),
            |_| Ok(()),
        )
        .await?;
        self.env.progress("moved into the workload cluster");

        let deployment = self.env.machine_deployment().await?;
        let before = self.env.fleet().await?.machine_names(false);
        self.env
            .api(&capi("MachineDeployment"))
            .patch(
                &deployment,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"replicas": workers + 1}})),
            )
            .await?;
        let fleet = self
            .settle(
                "a worker added by the self-hosted managers",
                (control_planes, workers + 1),
                |_| Ok(()),
            )
            .await?;
        let added: Vec<String> = fleet
            .machines
            .iter()
            .filter(|(name, m)| !m.2 && !before.contains(*name))
            .map(|(name, m)| {
                format!(
                    "{name} (VM {}, Node {})",
                    m.1.as_deref().unwrap_or("?"),
                    m.0.as_deref().unwrap_or("?")
                )
            })
            .collect();
        ensure!(
            added.len() == 1,
            "expected one new worker Machine, found {added:?}"
        );
        self.check_managers_running(&workload, &deployments).await?;
        self.env.scenario.workers = workers + 1;

        self.clusterctl_move(&config, &kubeconfig, self.env.mgmt.admin().path())?;
        self.env.client = management;
        let left = self.clusters_in(&workload).await?;
        ensure!(
            left == 0,
            "{left} Clusters left in the workload cluster after the move back"
        );
        self.settle(
            "the cluster back on the management cluster",
            (control_planes, workers + 1),
            |_| Ok(()),
        )
        .await?;
        Ok(format!(
            "clusterctl init into the workload cluster ({placed}); moved into it, nothing left on the \
             management cluster; its managers added worker {}; moved back, one VM and one guest per Machine",
            added.join(", ")
        ))
    }

    /// How many Clusters `cluster` holds in the scenario's namespace.
    async fn clusters_in(&self, cluster: &kube::Client) -> Result<usize> {
        let clusters = Api::<DynamicObject>::namespaced_with(cluster.clone(), &self.env.ns, &capi("Cluster"));
        Ok(clusters.list(&ListParams::default()).await?.items.len())
    }

    /// `clusterctl move` of the scenario's namespace from `from` to `to` (kubeconfig files).
    fn clusterctl_move(
        &self,
        config: &std::path::Path,
        from: &std::path::Path,
        to: &std::path::Path,
    ) -> Result<()> {
        run_clusterctl(
            clusterctl(&self.env.mgmt)?
                .arg("move")
                .arg(format!("--config={}", config.display()))
                .arg(format!("--kubeconfig={}", from.display()))
                .arg(format!("--to-kubeconfig={}", to.display()))
                .args(["--namespace", &self.env.ns]),
            "clusterctl move",
        )?;
        Ok(())
    }

    /// Waits until every Deployment of `deployments` in `cluster` is Available; returns where
    /// their Pods run ("deployment on node, …").
    async fn wait_managers_available(
        &mut self,
        cluster: &kube::Client,
        deployments: &[(&'static str, &'static str)],
    ) -> Result<String> {
        poll(
            &mut self.procs,
            "the managers' Deployments in the workload cluster to be Available",
            MANAGERS_AVAILABLE_TIMEOUT,
            async || {
                let mut waiting = Vec::new();
                for (namespace, name) in deployments {
                    let available = Api::<Deployment>::namespaced(cluster.clone(), namespace)
                        .get_opt(name)
                        .await?
                        .and_then(|d| d.status)
                        .and_then(|s| s.available_replicas)
                        .unwrap_or(0);
                    if available < 1 {
                        waiting.push(format!(
                            "{namespace}/{name}: {}",
                            pod_states(cluster, namespace).await?
                        ));
                    }
                }
                Ok(if waiting.is_empty() {
                    Ok(())
                } else {
                    Err(waiting.join("; "))
                })
            },
        )
        .await?;
        let mut placed = Vec::new();
        for (namespace, name) in deployments {
            for pod in Api::<Pod>::namespaced(cluster.clone(), namespace)
                .list(&ListParams::default())
                .await?
            {
                let node = pod.spec.and_then(|s| s.node_name).unwrap_or_default();
                placed.push(format!("{name} on {node}"));
            }
        }
        Ok(placed.join(", "))
    }

    /// Fails when a manager's container in `cluster` restarted or ended.
    async fn check_managers_running(
        &self,
        cluster: &kube::Client,
        deployments: &[(&'static str, &'static str)],
    ) -> Result<()> {
        for c in manager_containers(cluster, deployments).await? {
            ensure!(
                c.status.restart_count == 0 && c.status.state.as_ref().is_some_and(|s| s.running.is_some()),
                "{}/{}: container {} of Pod {} restarted {} times, state {:?}",
                c.namespace,
                c.deployment,
                c.status.name,
                c.pod,
                c.status.restart_count,
                c.status.state
            );
        }
        Ok(())
    }
}

/// Each Pod of `namespace` and why it is not ready yet (a waiting container's reason and message).
async fn pod_states(cluster: &kube::Client, namespace: &str) -> Result<String> {
    let pods = Api::<Pod>::namespaced(cluster.clone(), namespace)
        .list(&ListParams::default())
        .await?;
    if pods.items.is_empty() {
        return Ok("no Pod".to_owned());
    }
    Ok(pods
        .items
        .iter()
        .map(|pod| {
            let name = pod.metadata.name.clone().unwrap_or_default();
            let status = pod.status.as_ref();
            let phase = status.and_then(|s| s.phase.clone()).unwrap_or_default();
            let waiting: Vec<String> = status
                .and_then(|s| s.container_statuses.clone())
                .unwrap_or_default()
                .into_iter()
                .filter_map(|c| c.state?.waiting)
                .map(|w| {
                    format!(
                        "{} {}",
                        w.reason.unwrap_or_default(),
                        w.message.unwrap_or_default()
                    )
                })
                .collect();
            format!("{name} {phase} {}", waiting.join(" "))
        })
        .collect::<Vec<_>>()
        .join(", "))
}
