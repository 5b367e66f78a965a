//! The Proxmox provider as users run it: installed by the real `clusterctl init` from banlieue's
//! local repository onto a control plane with a real node, its image built here and imported into
//! the node, its Deployment becomes a Pod that runs as its own ServiceAccount under the RBAC the
//! components install (no admin credentials anywhere), passes its probes through the Pod network,
//! elects a leader, reaches the Proxmox VE simulator on the host by its address (verified against
//! its CA, delivered by Secret) and provisions a CAPI machine there.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use banlieue_api::infrastructure::{ProxmoxCluster, ProxmoxMachine};
use banlieue_capi::{Cluster, Machine};
use banlieue_testenv::TestEnv;
use banlieue_testenv::nodes::Node;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Pod, Secret};
use k8s_openapi::api::rbac::v1::ClusterRole;
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

const PROVIDER_NAMESPACE: &str = "banlieue-proxmox-system";
const DEPLOYMENT: &str = "banlieue-proxmox-controller-manager";
const SERVICE_ACCOUNT: &str = "banlieue-proxmox-manager";
const CLUSTER_ROLE: &str = "banlieue-proxmox-manager-role";
const NS: &str = "workload";
const TIMEOUT: Duration = Duration::from_secs(180);

/// `clusterctl init` of the Proxmox provider from the local repository (offline configuration).
fn clusterctl_init(env: &TestEnv, dir: &Path, sim: &banlieue_pve_sim::SimHandle) -> Result<()> {
    let repository = dir.join("repository");
    let status = Command::new(banlieue_dev::binary_dir()?.join("banlieue-clusterctl"))
        .arg("repository")
        .arg(&repository)
        .output()
        .context("running banlieue-clusterctl (cargo test --workspace builds it)")?;
    ensure!(
        status.status.success(),
        "banlieue-clusterctl repository: {status:?}"
    );
    let home = dir.join("home");
    std::fs::create_dir_all(&home)?;
    let output = Command::new(banlieue_testenv::bin_dir().join("clusterctl"))
        .arg("init")
        .arg(format!(
            "--config={}",
            repository.join("clusterctl-offline.yaml").display()
        ))
        .arg(format!("--kubeconfig={}", env.admin().path().display()))
        .args(["--infrastructure", "banlieue-proxmox"])
        .env("HOME", &home)
        .env("XDG_CONFIG_HOME", home.join(".config"))
        .env("CLUSTERCTL_DISABLE_VERSIONCHECK", "true")
        .env("PROXMOX_TOKEN", sim.token_id())
        .env("PROXMOX_SECRET", sim.token_secret())
        .output()
        .context("running clusterctl")?;
    ensure!(
        output.status.success(),
        "clusterctl init: {}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(())
}

/// Credentials, a CAPI Cluster (infrastructure provisioned as CAPI would mark it) with its
/// ProxmoxCluster on the simulator, and a Machine with bootstrap data and its ProxmoxMachine.
async fn workload(client: &kube::Client, sim: &banlieue_pve_sim::SimHandle) -> Result<()> {
    let pp = PostParams::default();
    let namespace: Namespace = serde_json::from_value(json!({"metadata": {"name": NS}}))?;
    Api::<Namespace>::all(client.clone())
        .create(&pp, &namespace)
        .await?;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NS);
    for secret in [
        json!({"metadata": {"name": "pve"},
               "stringData": {"tokenID": sim.token_id(), "secret": sim.token_secret()}}),
        json!({"metadata": {"name": "pve-ca"}, "stringData": {"ca.crt": sim.ca_pem()}}),
        json!({"metadata": {"name": "m1-bootstrap"}, "type": "cluster.x-k8s.io/secret",
               "stringData": {"value": "#cloud-config\nruncmd: [[echo, hi]]\n", "format": "cloud-config"}}),
    ] {
        secrets.create(&pp, &serde_json::from_value(secret)?).await?;
    }
    let clusters: Api<Cluster> = Api::namespaced(client.clone(), NS);
    let cluster = clusters
        .create(
            &pp,
            &serde_json::from_value(json!({
                "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
                "metadata": {"name": "c1"},
                "spec": {"infrastructureRef": {
                    "apiGroup": "infrastructure.banlieue.io", "kind": "ProxmoxCluster", "name": "c1"}},
            }))?,
        )
        .await?;
    clusters
        .patch_status(
            "c1",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"initialization": {"infrastructureProvisioned": true}}})),
        )
        .await?;
    let owner = |kind: &str, uid: String| {
        json!([{"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": kind, "name": if kind == "Cluster" {"c1"} else {"m1"},
                "uid": uid, "controller": true, "blockOwnerDeletion": true}])
    };
    Api::<ProxmoxCluster>::namespaced(client.clone(), NS)
        .create(
            &pp,
            &serde_json::from_value(json!({
                "apiVersion": "infrastructure.banlieue.io/v1alpha1", "kind": "ProxmoxCluster",
                "metadata": {"name": "c1", "ownerReferences": owner("Cluster", cluster.uid().context("uid")?)},
                "spec": {
                    "controlPlaneEndpoint": {"host": "10.0.0.100", "port": 6443},
                    "endpoint": sim.url(),
                    "credentialsRef": {"name": "pve"},
                    // The simulator's CA, delivered by Secret; its certificate names the
                    // address Pods reach it at (the host's on the node bridge).
                    "tls": {"caBundleRef": {"kind": "Secret", "name": "pve-ca"}},
                },
            }))?,
        )
        .await?;
    let machine = Api::<Machine>::namespaced(client.clone(), NS)
        .create(
            &pp,
            &serde_json::from_value(json!({
                "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
                "metadata": {"name": "m1", "labels": {"cluster.x-k8s.io/cluster-name": "c1"}},
                "spec": {
                    "clusterName": "c1",
                    "bootstrap": {"dataSecretName": "m1-bootstrap"},
                    "infrastructureRef": {
                        "apiGroup": "infrastructure.banlieue.io", "kind": "ProxmoxMachine", "name": "m1"},
                },
            }))?,
        )
        .await?;
    Api::<ProxmoxMachine>::namespaced(client.clone(), NS)
        .create(
            &pp,
            &serde_json::from_value(json!({
                "apiVersion": "infrastructure.banlieue.io/v1alpha1", "kind": "ProxmoxMachine",
                "metadata": {
                    "name": "m1",
                    "labels": {"cluster.x-k8s.io/cluster-name": "c1"},
                    "ownerReferences": owner("Machine", machine.uid().context("uid")?),
                },
                "spec": {"source": {"vmid": 9000}, "cpu": {"cores": 2}, "memoryMiB": 2048},
            }))?,
        )
        .await?;
    Ok(())
}

/// Polls `check` every half second until it gives `Some`, for at most [`TIMEOUT`].
async fn wait_for<T, Fut>(what: &str, mut check: impl FnMut() -> Fut) -> Result<T>
where
    Fut: std::future::Future<Output = Result<(Option<T>, String)>>,
{
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let (found, state) = check().await?;
        if let Some(found) = found {
            return Ok(found);
        }
        if Instant::now() > deadline {
            bail!("{what}: not after {TIMEOUT:?}; last state: {state}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The Proxmox provider installed by `clusterctl init` and Available as a Pod on a real node.
struct ProviderPod {
    env: TestEnv,
    node: Node,
    sim: banlieue_pve_sim::SimHandle,
    client: kube::Client,
    pod: Pod,
    _dir: tempfile::TempDir,
}

impl ProviderPod {
    /// Installs the provider; with `remove_rule` (resource, verb), that verb is taken out of its
    /// ClusterRole before the node (and so the Pod) starts.
    async fn install(remove_rule: Option<(&str, &str)>) -> Result<Self> {
        let env = TestEnv::builder()
            .allow_external(false)
            .node_network(true)
            .start()
            .await?;
        let gateway = env.node_network().context("node network")?.gateway();
        let dir = tempfile::tempdir()?;
        let sim = banlieue_pve_sim::start(banlieue_pve_sim::SimConfig {
            nodes: vec!["pve1".into()],
            bind_address: gateway,
            ..banlieue_pve_sim::SimConfig::fast()
        })
        .await?;
        clusterctl_init(&env, dir.path(), &sim)?;
        let client = env.client().await?;
        if let Some((resource, verb)) = remove_rule {
            remove_from_cluster_role(&client, resource, verb).await?;
        }
        let node = Node::start(&env, 0, "node-a").await?;
        let image = banlieue_dev::images::PROXMOX;
        let tarball = image.build(&banlieue_dev::binary_dir()?, dir.path())?;
        node.import(image.reference, &tarball)?;

        // The Deployment's Pod is Available: started from the imported image, probes answered.
        let deployments: Api<Deployment> = Api::namespaced(client.clone(), PROVIDER_NAMESPACE);
        let pods: Api<Pod> = Api::namespaced(client.clone(), PROVIDER_NAMESPACE);
        let node_log = node.dir().join("node.log");
        wait_for("the provider Deployment Available", || {
            let deployments = deployments.clone();
            let pods = pods.clone();
            let node_log = node_log.clone();
            async move {
                let deployment = deployments.get(DEPLOYMENT).await?;
                let available = deployment.status.as_ref().and_then(|s| s.available_replicas) == Some(1);
                let pod_states: Vec<String> = pods
                    .list(&ListParams::default())
                    .await?
                    .items
                    .iter()
                    .map(|p| {
                        format!(
                            "{}: {:?}",
                            p.name_any(),
                            p.status.as_ref().map(|s| &s.container_statuses)
                        )
                    })
                    .collect();
                let tail = std::fs::read_to_string(&node_log).unwrap_or_default();
                let tail: Vec<&str> = tail.lines().rev().take(5).collect();
                Ok((
                    available.then_some(()),
                    format!("{pod_states:?} node log tail: {tail:?}"),
                ))
            }
        })
        .await?;
        let pod = pods
            .list(&ListParams::default().labels("control-plane=controller-manager"))
            .await?
            .items
            .into_iter()
            .next()
            .context("the provider's Pod")?;
        Ok(Self {
            env,
            node,
            sim,
            client,
            pod,
            _dir: dir,
        })
    }

    fn logs(&self) -> Result<String> {
        let output = self
            .env
            .kubectl()
            .args(["logs", "-n", PROVIDER_NAMESPACE, &self.pod.name_any()])
            .output()?;
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }

    async fn stop(self) {
        drop(self.node);
        self.sim.shutdown().await;
    }
}

/// Takes `verb` on `resource` out of the provider's installed ClusterRole.
async fn remove_from_cluster_role(client: &kube::Client, resource: &str, verb: &str) -> Result<()> {
    let roles: Api<ClusterRole> = Api::all(client.clone());
    let mut role = roles.get(CLUSTER_ROLE).await?;
    let mut rules = Vec::new();
    for rule in role.rules.take().unwrap_or_default() {
        let resources = rule.resources.clone().unwrap_or_default();
        if !resources.iter().any(|r| r == resource) {
            rules.push(rule);
            continue;
        }
        let others: Vec<String> = resources.iter().filter(|r| *r != resource).cloned().collect();
        if !others.is_empty() {
            let mut kept = rule.clone();
            kept.resources = Some(others);
            rules.push(kept);
        }
        let verbs: Vec<String> = rule.verbs.iter().filter(|v| *v != verb).cloned().collect();
        if !verbs.is_empty() {
            let mut reduced = rule.clone();
            reduced.resources = Some(vec![resource.to_owned()]);
            reduced.verbs = verbs;
            rules.push(reduced);
        }
    }
    role.rules = Some(rules);
    roles.replace(CLUSTER_ROLE, &PostParams::default(), &role).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxmox_provider_runs_as_a_pod_under_its_installed_rbac() -> Result<()> {
    let installed = ProviderPod::install(None).await?;
    let (client, pod) = (installed.client.clone(), installed.pod.clone());
    let spec = pod.spec.as_ref().context("pod spec")?;
    assert_eq!(spec.service_account_name.as_deref(), Some(SERVICE_ACCOUNT));
    assert_eq!(spec.node_name.as_deref(), Some(installed.node.name()));

    // It elects a leader and provisions a machine on the simulator with only its RBAC.
    workload(&client, &installed.sim).await?;
    let machines: Api<ProxmoxMachine> = Api::namespaced(client.clone(), NS);
    let provider_id = wait_for("the ProxmoxMachine provisioned by the Pod", || {
        let machines = machines.clone();
        async move {
            let machine = machines.get("m1").await?;
            let id = machine.spec.provider_id.clone();
            Ok((id, format!("{:?}", machine.status)))
        }
    })
    .await?;
    ensure!(provider_id.starts_with("proxmox://"), "{provider_id}");
    let lease = Api::<Lease>::namespaced(client.clone(), PROVIDER_NAMESPACE)
        .get("banlieue-proxmox-leader")
        .await?;
    let holder = lease.spec.and_then(|s| s.holder_identity).unwrap_or_default();
    ensure!(
        holder.contains(&pod.name_any()),
        "leader {holder:?} is not the Pod {}",
        pod.name_any()
    );
    let logs = installed.logs()?;
    ensure!(
        !logs.contains("Forbidden") && !logs.contains("forbidden"),
        "denied under its RBAC:\n{logs}"
    );
    installed.stop().await;
    Ok(())
}

/// The Pod's requests are held to the installed RBAC (not an admin's): without `get` on Secrets
/// in its ClusterRole it is denied reading the credentials and provisions nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_get_on_secrets_in_its_role_the_provider_pod_is_denied() -> Result<()> {
    let installed = ProviderPod::install(Some(("secrets", "get"))).await?;
    workload(&installed.client, &installed.sim).await?;
    // The apiserver's denial, as it appears (JSON-escaped) in the provider's log.
    let denial = "cannot get resource \\\"secrets\\\"";
    let installed = wait_for("a 403 on secrets in the Pod's log", || {
        let logs = installed.logs();
        async move {
            let logs = logs?;
            let tail: String = logs.lines().rev().take(3).collect::<Vec<_>>().join("\n");
            Ok((logs.contains(denial).then_some(()), tail))
        }
    })
    .await
    .map(|()| installed)?;
    let machine = Api::<ProxmoxMachine>::namespaced(installed.client.clone(), NS)
        .get("m1")
        .await?;
    ensure!(
        machine.spec.provider_id.is_none(),
        "provisioned without get on secrets: {:?}",
        machine.status
    );
    installed.stop().await;
    Ok(())
}

/// `banlieue-dev --pods`: the Proxmox provider and the banlieue controller as Pods on a real
/// node, installed from their components as they are; the README's example VirtualMachine reaches
/// Ready through them and is deleted again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dev_environment_with_pods_serves_the_example_virtual_machine() -> Result<()> {
    let config = banlieue_dev::StackConfig {
        sim: banlieue_dev::sim_config(1, Duration::from_millis(20), Duration::from_millis(200)),
        capi_crds: Some(banlieue_capi::crds::dir()),
        node_network: true,
    };
    let stack = banlieue_dev::Stack::start(config, |step| eprintln!("{step}")).await?;
    let node = banlieue_dev::pods::install(&stack.env, &stack.sim, &banlieue_dev::binary_dir()?, |step| {
        eprintln!("{step}")
    })
    .await?;
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/vm-on-sim.yaml");
    let mut apply = stack.env.kubectl();
    apply.args(["apply", "-f"]).arg(&example);
    let output = banlieue_testenv::run_with_timeout(&mut apply, Duration::from_secs(60))?;
    ensure!(output.status.success(), "kubectl apply: {output:?}");
    let mut wait = stack.env.kubectl();
    wait.args([
        "wait",
        "--for=condition=Ready",
        "virtualmachine/hello",
        "--timeout=180s",
    ]);
    let output = banlieue_testenv::run_with_timeout(&mut wait, Duration::from_secs(200))?;
    ensure!(
        output.status.success(),
        "the example VirtualMachine is not Ready: {}\nnode log: {}",
        String::from_utf8_lossy(&output.stderr),
        node.dir().join("node.log").display()
    );
    let mut delete = stack.env.kubectl();
    delete.args(["delete", "virtualmachine", "hello", "--timeout=120s"]);
    let output = banlieue_testenv::run_with_timeout(&mut delete, Duration::from_secs(140))?;
    ensure!(output.status.success(), "kubectl delete: {output:?}");
    ensure!(
        stack.sim.vms().iter().all(|vm| vm.template),
        "the VM is still on the simulator"
    );
    drop(node);
    stack.stop().await;
    Ok(())
}
