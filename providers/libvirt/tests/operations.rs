//! The `banlieue-libvirt` binary's operations on the real apiserver: `/healthz`, `/readyz`,
//! `/metrics` with controller-runtime names, and Lease leader election between two processes
//! (one leads, the other takes over after SIGTERM).
#![cfg(feature = "libvirt")]

use std::path::{Path, PathBuf};

use banlieue_provider_runtime::testing;
use banlieue_testenv::TestEnv;

#[tokio::test]
async fn two_processes_one_leader_probes_and_metrics() -> anyhow::Result<()> {
    let mut crds = banlieue_api::crds::all();
    crds.extend(banlieue_testenv::crds_from_files([
        banlieue_capi::crds::file("cluster.x-k8s.io_clusters.yaml"),
        banlieue_capi::crds::file("cluster.x-k8s.io_machines.yaml"),
    ])?);
    let env = TestEnv::shared_with(|b| b.crds(crds)).await?;
    let ns = env.namespace("lv-ops").await?;
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
    let files: Vec<PathBuf> = ["libvirtcluster.yaml", "libvirtmachine.yaml"]
        .iter()
        .map(|f| examples.join(f))
        .collect();
    // Objects without an owner: the controllers reconcile them (and leave them alone).
    let trigger = async { testing::apply_in_namespace(env.kubectl(), &ns, &files) };
    let ops = testing::Operations {
        bin: Path::new(env!("CARGO_BIN_EXE_banlieue-libvirt")),
        component: "banlieue-libvirt",
        kubeconfig: env.admin().path(),
        namespace: &ns,
        extra: &["--domain-type", "qemu"],
        controllers: &["libvirtmachine", "libvirtcluster"],
    };
    testing::check_operations(ops, env.client().await?, trigger).await
}
