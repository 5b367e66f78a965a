//! banlieue's providers as users run them (Proxmox, and vSphere on vcsim): installed by the real `clusterctl init` from banlieue's
//! local repository onto a control plane with a real node, its image built here and imported into
//! the node, its Deployment becomes a Pod that runs as its own ServiceAccount under the RBAC the
//! components install (no admin credentials anywhere), passes its probes through the Pod network,
//! elects a leader, reaches the Proxmox VE simulator on the host by its address (verified against
//! its CA, delivered by Secret) and provisions a CAPI machine there.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use banlieue_api::infrastructure::ProxmoxMachine;
use banlieue_testenv::TestEnv;
use banlieue_testenv::nodes::Node;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Pod, Secret};
use k8s_openapi::api::rbac::v1::ClusterRole;
use kube::ResourceExt;
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;

/// What `clusterctl init --infrastructure <name>` installs for a provider.
struct ProviderSpec {
    name: &'static str,
    namespace: &'static str,
    deployment: &'static str,
    service_account: &'static str,
    cluster_role: &'static str,
    lease: &'static str,
    image: banlieue_dev::images::Image,
    /// Host folders under /run the node must see (hostPath volumes of the provider's Pod).
    host_run_paths: &'static [&'static str],
}

const PROXMOX: ProviderSpec = ProviderSpec {
    name: "banlieue-proxmox",
    namespace: "banlieue-proxmox-system",
    deployment: "banlieue-proxmox-controller-manager",
    service_account: "banlieue-proxmox-manager",
    cluster_role: "banlieue-proxmox-manager-role",
    lease: "banlieue-proxmox-leader",
    image: banlieue_dev::images::PROXMOX,
    host_run_paths: &[],
};

const VSPHERE: ProviderSpec = ProviderSpec {
    name: "banlieue-vsphere",
    namespace: "banlieue-vsphere-system",
    deployment: "banlieue-vsphere-controller-manager",
    service_account: "banlieue-vsphere-manager",
    cluster_role: "banlieue-vsphere-manager-role",
    lease: "banlieue-vsphere-leader",
    image: banlieue_dev::images::VSPHERE,
    host_run_paths: &[],
};

/// libvirt's socket folder is shared with the node (the Deployment mounts it by hostPath).
const LIBVIRT: ProviderSpec = ProviderSpec {
    name: "banlieue-libvirt",
    namespace: "banlieue-libvirt-system",
    deployment: "banlieue-libvirt-controller-manager",
    service_account: "banlieue-libvirt-manager",
    cluster_role: "banlieue-libvirt-manager-role",
    lease: "banlieue-libvirt-leader",
    image: banlieue_dev::images::LIBVIRT,
    host_run_paths: &["/run/libvirt"],
};

const NS: &str = "workload";

#[path = "../../../providers/vsphere/client/tests/support/vcsim.rs"]
mod vcsim_support;
const TIMEOUT: Duration = Duration::from_secs(180);

/// The namespace [`NS`] with `secrets` (JSON objects) in it.
async fn namespace_with_secrets(client: &kube::Client, secrets: Vec<serde_json::Value>) -> Result<()> {
    let pp = PostParams::default();
    let namespace: Namespace = serde_json::from_value(json!({"metadata": {"name": NS}}))?;
    Api::<Namespace>::all(client.clone())
        .create(&pp, &namespace)
        .await?;
    let api: Api<Secret> = Api::namespaced(client.clone(), NS);
    for secret in secrets {
        api.create(&pp, &serde_json::from_value(secret)?).await?;
    }
    Ok(())
}

/// A CAPI machine on the simulator, which the provider verifies against its CA, delivered by
/// Secret; its certificate names the address Pods reach it at (the host's on the node bridge).
async fn workload(client: &kube::Client, sim: &banlieue_pve_sim::SimHandle) -> Result<()> {
    namespace_with_secrets(
        client,
        vec![json!({"metadata": {"name": "pve-ca"}, "stringData": {"ca.crt": sim.ca_pem()}})],
    )
    .await?;
    banlieue_dev::fixtures::capi_proxmox_machine(
        client,
        NS,
        sim,
        json!({"caBundleRef": {"kind": "Secret", "name": "pve-ca"}}),
    )
    .await
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

/// Waits until the infrastructure cluster `c1` of `kind` (as `fixtures::capi_cluster` creates
/// it in [`NS`]) reports `status.initialization.provisioned`.
async fn wait_infrastructure_cluster_provisioned(client: &kube::Client, kind: &str) -> Result<()> {
    let resource = banlieue_dev::fixtures::infrastructure_resource(kind);
    let clusters: Api<kube::api::DynamicObject> = Api::namespaced_with(client.clone(), NS, &resource);
    wait_for(&format!("the {kind} provisioned by the Pod"), || {
        let clusters = clusters.clone();
        async move {
            let cluster = clusters.get("c1").await?;
            let status = &cluster.data["status"];
            let provisioned = status["initialization"]["provisioned"] == true;
            Ok((provisioned.then_some(()), format!("{status}")))
        }
    })
    .await
}

/// A control plane that real nodes can join.
async fn node_env() -> Result<TestEnv> {
    Ok(TestEnv::builder()
        .allow_external(false)
        .node_network(true)
        .start()
        .await?)
}

/// A provider installed by `clusterctl init` and Available as a Pod on a real node.
struct ProviderPod {
    env: TestEnv,
    node: Node,
    client: kube::Client,
    pod: Pod,
    provider: &'static ProviderSpec,
    _dir: tempfile::TempDir,
}

impl ProviderPod {
    /// Installs the provider; with `remove_rule` (resource, verb), that verb is taken out of its
    /// ClusterRole before the node (and so the Pod) starts.
    async fn install(
        env: TestEnv,
        provider: &'static ProviderSpec,
        variables: &[(&str, String)],
        remove_rule: Option<(&str, &str)>,
    ) -> Result<Self> {
        let dir = tempfile::tempdir()?;
        banlieue_dev::clusterctl::init(&env, dir.path(), provider.name, variables, &[])?;
        let client = env.client().await?;
        if let Some((resource, verb)) = remove_rule {
            remove_from_cluster_role(&client, provider.cluster_role, resource, verb).await?;
        }
        let options = banlieue_testenv::nodes::NodeOptions {
            host_run_paths: provider.host_run_paths.iter().map(Into::into).collect(),
        };
        let node = Node::start_with(&env, 0, "node-a", &options).await?;
        let image = provider.image;
        let tarball = image.build(&banlieue_dev::binary_dir()?, dir.path())?;
        node.import(image.reference, &tarball)?;

        // The Deployment's Pod is Available: started from the imported image, probes answered.
        let deployments: Api<Deployment> = Api::namespaced(client.clone(), provider.namespace);
        let pods: Api<Pod> = Api::namespaced(client.clone(), provider.namespace);
        let node_log = node.dir().join("node.log");
        wait_for("the provider Deployment Available", || {
            let deployments = deployments.clone();
            let pods = pods.clone();
            let node_log = node_log.clone();
            async move {
                let deployment = deployments.get(provider.deployment).await?;
                let available = deployment.status.as_ref().and_then(|s| s.available_replicas) == Some(1);
                let pod_states: Vec<String> = pods
                    .list(&ListParams::default())
                    .await?
                    .items
                    .iter()
                    .map(|p| {
                        let status = p.status.clone().unwrap_or_default();
                        format!(
                            "{}: phase {:?}, reason {:?}, message {:?}, containers {:?}",
                            p.name_any(),
                            status.phase,
                            status.reason,
                            status.message,
                            status.container_statuses
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
            client,
            pod,
            provider,
            _dir: dir,
        })
    }

    fn logs(&self) -> Result<String> {
        let output = self
            .env
            .kubectl()
            .args(["logs", "-n", self.provider.namespace, &self.pod.name_any()])
            .output()?;
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }

    /// Runs as its ServiceAccount on the node, holds the leader Lease, was never denied.
    async fn check_identity_lease_and_rbac(&self) -> Result<()> {
        let spec = self.pod.spec.as_ref().context("pod spec")?;
        ensure!(
            spec.service_account_name.as_deref() == Some(self.provider.service_account),
            "{spec:?}"
        );
        ensure!(spec.node_name.as_deref() == Some(self.node.name()), "{spec:?}");
        let lease = Api::<Lease>::namespaced(self.client.clone(), self.provider.namespace)
            .get(self.provider.lease)
            .await?;
        let holder = lease.spec.and_then(|s| s.holder_identity).unwrap_or_default();
        ensure!(
            holder.contains(&self.pod.name_any()),
            "leader {holder:?} is not the Pod {}",
            self.pod.name_any()
        );
        let logs = self.logs()?;
        ensure!(
            !logs.contains("Forbidden") && !logs.contains("forbidden"),
            "denied under its RBAC:\n{logs}"
        );
        Ok(())
    }
}

/// Takes `verb` on `resource` out of the provider's installed ClusterRole.
async fn remove_from_cluster_role(
    client: &kube::Client,
    name: &str,
    resource: &str,
    verb: &str,
) -> Result<()> {
    let roles: Api<ClusterRole> = Api::all(client.clone());
    let mut role = roles.get(name).await?;
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
    roles.replace(name, &PostParams::default(), &role).await?;
    Ok(())
}

/// The Proxmox simulator on the host's bridge address, where Pods reach it.
async fn pve_sim(env: &TestEnv) -> Result<banlieue_pve_sim::SimHandle> {
    Ok(banlieue_pve_sim::start(banlieue_pve_sim::SimConfig {
        nodes: vec!["pve1".into()],
        bind_address: env.node_network().context("node network")?.gateway(),
        ..banlieue_pve_sim::SimConfig::fast()
    })
    .await?)
}

fn pve_credentials(sim: &banlieue_pve_sim::SimHandle) -> Vec<(&'static str, String)> {
    vec![
        ("PROXMOX_TOKEN", sim.token_id()),
        ("PROXMOX_SECRET", sim.token_secret()),
        ("PROXMOX_URL", sim.url()),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxmox_provider_runs_as_a_pod_under_its_installed_rbac() -> Result<()> {
    let env = node_env().await?;
    let sim = pve_sim(&env).await?;
    let installed = ProviderPod::install(env, &PROXMOX, &pve_credentials(&sim), None).await?;

    // It provisions a machine on the simulator with only its RBAC.
    workload(&installed.client, &sim).await?;
    let machines: Api<ProxmoxMachine> = Api::namespaced(installed.client.clone(), NS);
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
    installed.check_identity_lease_and_rbac().await?;
    drop(installed);
    sim.shutdown().await;
    Ok(())
}

/// The Pod's requests are held to the installed RBAC (not an admin's): without `get` on Secrets
/// in its ClusterRole it is denied reading the credentials and provisions nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_get_on_secrets_in_its_role_the_provider_pod_is_denied() -> Result<()> {
    let env = node_env().await?;
    let sim = pve_sim(&env).await?;
    let installed =
        ProviderPod::install(env, &PROXMOX, &pve_credentials(&sim), Some(("secrets", "get"))).await?;
    workload(&installed.client, &sim).await?;
    // The apiserver's denial, as it appears (JSON-escaped) in the provider's log.
    let denial = "cannot get resource \\\"secrets\\\"";
    wait_for("a 403 on secrets in the Pod's log", || {
        let logs = installed.logs();
        async move {
            let logs = logs?;
            let tail: String = logs.lines().rev().take(3).collect::<Vec<_>>().join("\n");
            Ok((logs.contains(denial).then_some(()), tail))
        }
    })
    .await?;
    let machine = Api::<ProxmoxMachine>::namespaced(installed.client.clone(), NS)
        .get("m1")
        .await?;
    ensure!(
        machine.spec.provider_id.is_none(),
        "provisioned without get on secrets: {:?}",
        machine.status
    );
    drop(installed);
    sim.shutdown().await;
    Ok(())
}

/// The vSphere provider as a Pod: vcsim on the host's bridge address, its CA delivered by Secret;
/// the VSphereCluster is provisioned with only the installed RBAC.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_vsphere_provider_runs_as_a_pod_under_its_installed_rbac() -> Result<()> {
    let env = node_env().await?;
    let gateway = env.node_network().context("node network")?.gateway();
    let vcsim = vcsim_support::Vcsim::start_on(gateway, &[])?;
    let variables = [
        ("VSPHERE_USERNAME", vcsim_support::USER.to_owned()),
        ("VSPHERE_PASSWORD", vcsim_support::PASSWORD.to_owned()),
        ("VSPHERE_SERVER", vcsim.url.clone()),
    ];
    let installed = ProviderPod::install(env, &VSPHERE, &variables, None).await?;
    let client = installed.client.clone();
    namespace_with_secrets(
        &client,
        vec![
            json!({"metadata": {"name": "vc"},
                   "stringData": {"username": vcsim_support::USER, "password": vcsim_support::PASSWORD}}),
            json!({"metadata": {"name": "vc-ca"}, "stringData": {"ca.crt": vcsim.ca_pem}}),
        ],
    )
    .await?;
    banlieue_dev::fixtures::capi_cluster(
        &client,
        NS,
        "VSphereCluster",
        json!({
            "controlPlaneEndpoint": {"host": "10.0.0.100", "port": 6443},
            "server": vcsim.url,
            "credentialsRef": {"name": "vc"},
            "tls": {"caBundleRef": {"kind": "Secret", "name": "vc-ca"}},
            "datacenter": "DC0",
        }),
    )
    .await?;
    wait_infrastructure_cluster_provisioned(&client, "VSphereCluster").await?;
    installed.check_identity_lease_and_rbac().await?;
    Ok(())
}

/// The group that libvirtd's read-write socket admits without polkit, when libvirtd runs with
/// `providers/libvirt/ci/libvirtd.conf` (group `libvirt`, mode 0770); `None` (the test is
/// skipped, except under CI) otherwise.
fn libvirt_socket_gid() -> Result<Option<u32>> {
    use std::os::unix::fs::MetadataExt as _;
    let socket = Path::new("/run/libvirt/libvirt-sock");
    let group = std::fs::read_to_string("/etc/group")?
        .lines()
        .find_map(|line| line.strip_prefix("libvirt:x:"))
        .and_then(|rest| rest.split(':').next())
        .and_then(|gid| gid.parse::<u32>().ok());
    let why = match (std::fs::metadata(socket), group) {
        (Ok(meta), Some(gid)) if meta.gid() == gid && meta.mode() & 0o060 == 0o060 => {
            return Ok(Some(gid));
        }
        (Ok(meta), Some(gid)) => format!(
            "{} is group {} mode {:o}, not group libvirt ({gid}) read-write",
            socket.display(),
            meta.gid(),
            meta.mode() & 0o777
        ),
        (Err(e), _) => format!("{}: {e}", socket.display()),
        (_, None) => "no group libvirt (package libvirt-daemon-system)".to_owned(),
    };
    ensure!(
        std::env::var_os("CI").is_none(),
        "under CI libvirtd must admit group libvirt (providers/libvirt/ci/start-libvirtd.sh): {why}"
    );
    eprintln!(
        "SKIPPED: {why}; (re)start libvirtd with providers/libvirt/ci/start-libvirtd.sh (its libvirtd.conf)"
    );
    Ok(None)
}

/// The libvirt provider as a Pod, wired to the host's libvirtd as its components document: the
/// socket folder by hostPath, the socket's group as the Pod's supplemental group
/// (`LIBVIRT_SOCKET_GID`), libvirtd admitting that group without polkit. As uid 65532 it connects
/// to `qemu:///system` and provisions a LibvirtCluster with only its installed RBAC.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_libvirt_provider_runs_as_a_pod_and_reaches_the_hosts_libvirtd() -> Result<()> {
    let Some(gid) = libvirt_socket_gid()? else {
        return Ok(());
    };
    let env = node_env().await?;
    let installed =
        ProviderPod::install(env, &LIBVIRT, &[("LIBVIRT_SOCKET_GID", gid.to_string())], None).await?;
    let client = installed.client.clone();
    namespace_with_secrets(&client, Vec::new()).await?;
    banlieue_dev::fixtures::capi_cluster(
        &client,
        NS,
        "LibvirtCluster",
        json!({
            "controlPlaneEndpoint": {"host": "10.0.0.100", "port": 6443},
            "uri": "qemu:///system",
        }),
    )
    .await?;
    wait_infrastructure_cluster_provisioned(&client, "LibvirtCluster").await?;
    installed.check_identity_lease_and_rbac().await?;
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

/// CAPI's own managers as Pods: CAPI's release components (rendered from the pinned module's
/// `config/` by tests/controlplane/build.sh) installed by `clusterctl init` with banlieue's
/// Proxmox provider, their certificates issued as cert-manager would (see
/// `banlieue_dev::certificates`), each manager's image built from the pinned module. Every
/// manager runs as its own ServiceAccount; the API server calls CAPI's webhooks in their Pods
/// (the Cluster and Machine are admitted by them); CAPI's Machine controller, under the RBAC its
/// components install plus what banlieue's components aggregate into it, reads the
/// ProxmoxMachine and copies its providerID.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capi_managers_run_as_pods_from_their_release_components() -> Result<()> {
    use banlieue_dev::capi_pods::RELEASE_MANAGERS;
    let capi = CapiInPods::install(None).await?;
    for manager in &RELEASE_MANAGERS {
        let pods: Api<Pod> = Api::namespaced(capi.client.clone(), manager.namespace);
        let pod = pods
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .next()
            .with_context(|| format!("no Pod in {}", manager.namespace))?;
        let spec = pod.spec.as_ref().context("pod spec")?;
        ensure!(
            spec.service_account_name.as_deref() == Some(manager.service_account),
            "{} runs as {:?}",
            manager.deployment,
            spec.service_account_name
        );
        ensure!(spec.node_name.as_deref() == Some(capi.node.name()), "{spec:?}");
        // It elected itself leader (`--leader-elect` in CAPI's Deployment).
        let pod_name = pod.name_any();
        let lease = wait_for(&format!("{} holding its Lease", manager.deployment), || {
            let leases: Api<Lease> = Api::namespaced(capi.client.clone(), manager.namespace);
            let pod_name = pod_name.clone();
            async move {
                let lease = leases.get_opt(manager.lease).await?;
                let holder = lease
                    .as_ref()
                    .and_then(|l| l.spec.as_ref())
                    .and_then(|s| s.holder_identity.clone())
                    .unwrap_or_default();
                Ok((holder.contains(&pod_name).then_some(holder.clone()), holder))
            }
        })
        .await?;
        eprintln!("{} leads as {lease}", manager.deployment);
    }

    // Admitted by CAPI's webhooks in their Pods, provisioned by the provider's Pod, and the
    // providerID copied to the Machine by CAPI's Machine controller in its Pod.
    workload(&capi.client, &capi.sim).await?;
    let provider_id = wait_for(
        "the Machine's providerID, set by CAPI's Machine controller",
        || capi.machine_provider_id(),
    )
    .await?;
    ensure!(provider_id.starts_with("proxmox://"), "{provider_id}");
    for manager in &RELEASE_MANAGERS {
        let logs = capi.logs(manager.namespace, manager.deployment)?;
        let denied: Vec<&str> = logs.lines().filter(|l| l.contains("forbidden")).take(3).collect();
        ensure!(
            denied.is_empty(),
            "{} was denied: {denied:#?}",
            manager.deployment
        );
    }
    capi.stop().await;
    Ok(())
}

/// CAPI's core manager reads banlieue's kinds only through the ClusterRole that banlieue's
/// components label `cluster.x-k8s.io/aggregate-to-manager` (aggregated into CAPI's
/// `capi-aggregated-manager-role`): without it, CAPI's Machine controller is denied the
/// ProxmoxMachine and the Machine never gets its providerID, though the provider provisions it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_banlieues_aggregated_role_capi_is_denied_the_proxmox_machine() -> Result<()> {
    let capi = CapiInPods::install(Some("banlieue-proxmox-capi-aggregated-role")).await?;
    workload(&capi.client, &capi.sim).await?;
    let core = &banlieue_dev::capi_pods::RELEASE_MANAGERS[0];
    let denial = "proxmoxmachines.infrastructure.banlieue.io is forbidden";
    wait_for("CAPI's core manager denied ProxmoxMachines", || {
        let logs = capi.logs(core.namespace, core.deployment);
        async move {
            let logs = logs?;
            let tail: String = logs.lines().rev().take(3).collect::<Vec<_>>().join("\n");
            Ok((logs.contains(denial).then_some(()), tail))
        }
    })
    .await?;
    let machines: Api<ProxmoxMachine> = Api::namespaced(capi.client.clone(), NS);
    wait_for("the ProxmoxMachine provisioned by the provider's Pod", || {
        let machines = machines.clone();
        async move {
            let machine = machines.get("m1").await?;
            Ok((machine.spec.provider_id.clone(), format!("{:?}", machine.status)))
        }
    })
    .await?;
    let (provider_id, status) = capi.machine_provider_id().await?;
    ensure!(
        provider_id.is_none(),
        "CAPI copied the providerID without the aggregated role: {status}"
    );
    capi.stop().await;
    Ok(())
}

/// CAPI's three managers and the Proxmox provider as Pods on a real node: CAPI's release
/// components (rendered from the pinned module's `config/` by tests/controlplane/build.sh)
/// installed by `clusterctl init` with banlieue-proxmox, their certificates issued as
/// cert-manager would (`banlieue_dev::certificates`), each image built here.
struct CapiInPods {
    env: TestEnv,
    sim: banlieue_pve_sim::SimHandle,
    node: Node,
    client: kube::Client,
    _dir: tempfile::TempDir,
}

impl CapiInPods {
    /// Installs everything; with `delete_cluster_role`, that ClusterRole is deleted after
    /// `clusterctl init`, before any manager starts.
    async fn install(delete_cluster_role: Option<&str>) -> Result<Self> {
        let env = node_env().await?;
        let sim = pve_sim(&env).await?;
        let dir = tempfile::tempdir()?;
        let components = banlieue_dev::capi_pods::components_dir();
        let started = Instant::now();
        banlieue_dev::clusterctl::init(
            &env,
            dir.path(),
            PROXMOX.name,
            &pve_credentials(&sim),
            &["--capi-components".as_ref(), components.as_os_str()],
        )?;
        eprintln!("clusterctl init: {:.1}s", started.elapsed().as_secs_f64());
        let client = env.client().await?;
        if let Some(role) = delete_cluster_role {
            Api::<ClusterRole>::all(client.clone())
                .delete(role, &Default::default())
                .await
                .with_context(|| format!("deleting ClusterRole {role}"))?;
        }
        let node = banlieue_dev::capi_pods::run_installed(
            &env,
            "node-a",
            &[banlieue_dev::pods::PROXMOX_COMPONENTS],
            &banlieue_dev::binary_dir()?,
            |step| eprintln!("{step}"),
        )
        .await?;
        Ok(Self {
            env,
            sim,
            node,
            client,
            _dir: dir,
        })
    }

    /// The log of a manager's Deployment.
    fn logs(&self, namespace: &str, deployment: &str) -> Result<String> {
        let output = self
            .env
            .kubectl()
            .args(["logs", "-n", namespace, &format!("deployment/{deployment}")])
            .output()?;
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }

    /// The CAPI Machine `m1`'s providerID, and its status.
    async fn machine_provider_id(&self) -> Result<(Option<String>, String)> {
        let machines: Api<kube::api::DynamicObject> = Api::namespaced_with(
            self.client.clone(),
            NS,
            &kube::api::ApiResource::from_gvk(&kube::api::GroupVersionKind::gvk(
                "cluster.x-k8s.io",
                "v1beta2",
                "Machine",
            )),
        );
        let machine = machines.get("m1").await?;
        let id = machine.data["spec"]["providerID"].as_str().map(str::to_owned);
        Ok((id, format!("{}", machine.data["status"])))
    }

    async fn stop(self) {
        drop(self.node);
        self.sim.shutdown().await;
    }
}
