//! The Cluster API core manager built by `tests/controlplane/build.sh` runs against the test
//! control plane (with CAPI's own CRDs) and reconciles a `Cluster`.

use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use banlieue_testenv::{ManagedProcess, TestEnv, bin_dir, crds_from_files, free_port};
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, PostParams};

const CLUSTER_FINALIZER: &str = "cluster.cluster.x-k8s.io";

fn capi_crd_files() -> Result<Vec<PathBuf>> {
    let dir = bin_dir().join("capi-crds");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .with_context(|| format!("reading {} (run tests/controlplane/build.sh)", dir.display()))?
        .map(|entry| entry.map(|e| e.path()))
        .collect::<Result<_, _>>()?;
    files.sort();
    Ok(files)
}

#[tokio::test]
async fn capi_core_manager_reconciles_a_cluster() -> Result<()> {
    let crds = crds_from_files(capi_crd_files()?)?;
    assert!(
        crds.iter()
            .any(|c| c.metadata.name.as_deref() == Some("clusters.cluster.x-k8s.io"))
    );
    let env = TestEnv::shared_with(|builder| builder.crds(crds)).await?;
    if env.is_external() {
        eprintln!("skipped: runs CAPI's manager only against a control plane of its own");
        return Ok(());
    }

    // The manager always serves its webhooks: give it a certificate from the cluster CA.
    let loopback = Ipv4Addr::LOCALHOST;
    let certs = env.workdir().join("capi-webhook-certs");
    std::fs::create_dir_all(&certs)?;
    let pair = env.serving_certificate(&[IpAddr::V4(loopback)], &["localhost"])?;
    std::fs::write(certs.join("tls.crt"), &pair.cert_pem)?;
    std::fs::write(certs.join("tls.key"), &pair.key_pem)?;
    let args = vec![
        format!("--kubeconfig={}", env.admin().path().display()),
        "--leader-elect=false".to_owned(),
        format!("--webhook-port={}", free_port(loopback)?),
        format!("--webhook-cert-dir={}", certs.display()),
        format!("--health-addr={loopback}:{}", free_port(loopback)?),
        "--diagnostics-address=0".to_owned(),
    ];
    let mut manager = ManagedProcess::start(
        "capi-manager",
        &bin_dir().join("capi-manager"),
        &args,
        &env.workdir().join("logs/capi-manager.log"),
    )?;

    let ns = env.namespace("capi").await?;
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("cluster.x-k8s.io", "v1beta2", "Cluster"),
        "clusters",
    );
    let clusters: Api<DynamicObject> = Api::namespaced_with(env.client().await?, &ns, &resource);
    let cluster: DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2",
        "kind": "Cluster",
        "metadata": { "name": "smoke" },
        "spec": { "clusterNetwork": { "serviceDomain": "cluster.local" } },
    }))?;
    clusters.create(&PostParams::default(), &cluster).await?;

    // CAPI's cluster controller adds its finalizer and reports conditions on the first reconcile.
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        manager.check_running()?;
        let current = clusters.get("smoke").await?;
        let finalized = current
            .metadata
            .finalizers
            .unwrap_or_default()
            .iter()
            .any(|f| f == CLUSTER_FINALIZER);
        let conditions = current.data["status"]["conditions"]
            .as_array()
            .map_or(0, Vec::len);
        if finalized && conditions > 0 {
            break;
        }
        if Instant::now() > deadline {
            bail!(
                "capi-manager did not reconcile the Cluster (finalizer: {finalized}, conditions: {conditions}); \
                 last lines of its log:\n{}",
                manager.log_tail(40)
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    manager.check_running()?;
    Ok(())
}
