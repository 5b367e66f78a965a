//! Least privilege, proven on the real apiserver: the real `banlieue-proxmox` binary runs as the
//! ServiceAccount of the generated components, bound only to the generated ClusterRole and
//! leader-election Role (`banlieue_proxmox::rbac`), and provisions a CAPI-style machine on the
//! Proxmox VE simulator. With one needed verb removed from the ClusterRole it fails visibly: the
//! apiserver's 403 shows in its log and the machine is not provisioned.
//!
//! The same for the banlieue controller (`banlieue_controllers::rbac`): it creates the
//! ProxmoxMachine of a VirtualMachine under the generated core RBAC, and without `create` on
//! `proxmoxmachines` it logs the 403 and creates nothing.
//!
//! The same for `banlieue-libvirt` (`banlieue_libvirt::rbac`) on libvirt's test driver, with a
//! negative case without `get` on Secrets, and for `banlieue-vsphere` (`banlieue_vsphere::rbac`)
//! on vcsim: each provisions a CAPI-style machine as its generated ServiceAccount.
//!
//! Each case gets a private control plane, so exactly one provider process acts on its objects.
//! Needs `tests/controlplane/build.sh` and the provider binaries next to this test
//! (`cargo build -p banlieue-proxmox -p banlieue-libvirt -p banlieue-vsphere -p banlieue-controllers`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, Result, bail, ensure};
use banlieue_api::banlieue::{Provider, VirtualMachine};
use banlieue_api::infrastructure::{ProxmoxCluster, ProxmoxMachine};
use banlieue_clusterctl::{CORE_NAMESPACE, Infra, PROXMOX_NAMESPACE, components, yaml};
use banlieue_pve_sim::{SimConfig, SimHandle};
use banlieue_testenv::{KubeconfigFile, ManagedProcess, TestEnv, bin_dir, crds_from_files};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{ApiResource, DynamicObject, PostParams};
use kube::{Api, ResourceExt};
use serde_json::{Value, json};

const TIMEOUT: Duration = Duration::from_secs(90);
const NS: &str = "workload";

fn workspace_binary(name: &str) -> Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let dir = exe.parent().and_then(Path::parent).context("target dir")?;
    let path = dir.join(name);
    ensure!(
        path.is_file(),
        "{} is missing: build it first (`cargo build -p banlieue-proxmox`)",
        path.display()
    );
    Ok(path)
}

async fn private_env() -> Result<TestEnv> {
    let capi_dir = bin_dir().join("capi-crds");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&capi_dir)
        .with_context(|| format!("reading {} (run tests/controlplane/build.sh)", capi_dir.display()))?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()?;
    files.sort();
    let mut crds = banlieue_api::crds::all();
    crds.extend(crds_from_files(files)?);
    Ok(TestEnv::builder()
        .crds(crds)
        .allow_external(false)
        .start()
        .await?)
}

/// The RBAC part of generated components (Namespace, ServiceAccount, the ClusterRole
/// `cluster_role` and its binding, leader-election Role and binding), optionally with `verb`
/// removed for `resource` in the ClusterRole.
fn rbac_documents(all: Vec<Value>, cluster_role: &str, without: Option<(&str, &str)>) -> Vec<Value> {
    let mut docs: Vec<Value> = all
        .into_iter()
        .filter(|d| {
            matches!(
                d["kind"].as_str(),
                Some("Namespace" | "ServiceAccount" | "ClusterRoleBinding" | "Role" | "RoleBinding")
            ) || d["metadata"]["name"] == cluster_role
        })
        .collect();
    if let Some((resource, verb)) = without {
        for doc in &mut docs {
            if doc["metadata"]["name"] != cluster_role {
                continue;
            }
            let rules = doc["rules"].as_array().cloned().unwrap_or_default();
            let mut out = Vec::new();
            for rule in rules {
                let resources: Vec<Value> = rule["resources"].as_array().cloned().unwrap_or_default();
                if !resources.iter().any(|r| r == resource) {
                    out.push(rule);
                    continue;
                }
                let others: Vec<Value> = resources.into_iter().filter(|r| r != resource).collect();
                if !others.is_empty() {
                    let mut kept = rule.clone();
                    kept["resources"] = json!(others);
                    out.push(kept);
                }
                let verbs: Vec<Value> = rule["verbs"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default()
                    .into_iter()
                    .filter(|v| v != verb)
                    .collect();
                if !verbs.is_empty() {
                    let mut reduced = rule.clone();
                    reduced["resources"] = json!([resource]);
                    reduced["verbs"] = json!(verbs);
                    out.push(reduced);
                }
            }
            doc["rules"] = json!(out);
        }
    }
    docs
}

async fn apply_rbac(env: &TestEnv, docs: &[Value], namespace: &str, account: &str) -> Result<KubeconfigFile> {
    let file = env.workdir().join("rbac.yaml");
    std::fs::write(&file, yaml::render("generated RBAC under test", docs)?)?;
    let output = banlieue_testenv::run_with_timeout(
        env.kubectl().args(["apply", "--server-side", "-f"]).arg(&file),
        Duration::from_secs(60),
    )?;
    ensure!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(env.service_account_kubeconfig(namespace, account).await?)
}

/// Credentials, a CAPI Cluster whose infrastructure is provisioned with its ProxmoxCluster on
/// the simulator (TLS pinned by fingerprint), and a Machine with its bootstrap Secret and
/// ProxmoxMachine, as CAPI would write them.
async fn workload(client: &kube::Client, sim: &SimHandle) -> Result<()> {
    banlieue_dev::fixtures::capi_proxmox_machine(
        client,
        NS,
        sim,
        json!({"sha256Fingerprint": sim.fingerprint_sha256()}),
    )
    .await
}

/// Starts `banlieue-proxmox` with the ServiceAccount's kubeconfig and the Deployment's flags.
fn start_provider(env: &TestEnv, kubeconfig: &KubeconfigFile) -> Result<ManagedProcess> {
    let binary = workspace_binary("banlieue-proxmox")?;
    let args = vec![
        format!("KUBECONFIG={}", kubeconfig.path().display()),
        format!("POD_NAMESPACE={PROXMOX_NAMESPACE}"),
        "RUST_LOG=info".to_owned(),
        binary.display().to_string(),
        "--leader-elect".to_owned(),
        "--metrics-bind-address=127.0.0.1:0".to_owned(),
        "--health-probe-bind-address=127.0.0.1:0".to_owned(),
        "--concurrency=4".to_owned(),
    ];
    Ok(ManagedProcess::start(
        "banlieue-proxmox",
        Path::new("/usr/bin/env"),
        &args,
        &env.workdir().join("logs/banlieue-proxmox.log"),
    )?)
}

fn provisioned(pm: &ProxmoxMachine) -> bool {
    pm.spec.provider_id.is_some()
        && pm
            .status
            .as_ref()
            .and_then(|s| s.initialization.as_ref())
            .and_then(|i| i.provisioned)
            == Some(true)
}

struct Case {
    env: TestEnv,
    sim: SimHandle,
    provider: ManagedProcess,
    client: kube::Client,
}

async fn start_case(without: Option<(&str, &str)>) -> Result<Case> {
    let env = private_env().await?;
    let client = env.client().await?;
    let docs = rbac_documents(
        components::proxmox_components(),
        components::PROXMOX_CLUSTER_ROLE,
        without,
    );
    let kubeconfig = apply_rbac(
        &env,
        &docs,
        PROXMOX_NAMESPACE,
        components::PROXMOX_SERVICE_ACCOUNT,
    )
    .await?;
    Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": NS}}))?,
        )
        .await?;
    let sim = banlieue_pve_sim::start(SimConfig::fast()).await?;
    workload(&client, &sim).await?;
    let provider = start_provider(&env, &kubeconfig)?;
    Ok(Case {
        env,
        sim,
        provider,
        client,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_provider_provisions_a_machine_with_only_the_generated_rbac() -> Result<()> {
    let mut case = start_case(None).await?;
    let machines: Api<ProxmoxMachine> = Api::namespaced(case.client.clone(), NS);
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    let pm = loop {
        case.provider.check_running()?;
        let pm = machines.get("m1").await?;
        if provisioned(&pm) {
            break pm;
        }
        if tokio::time::Instant::now() > deadline {
            bail!(
                "not provisioned under the generated RBAC: {:#?}\nprovider log:\n{}",
                pm.status,
                case.provider.log_tail(60)
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let vms: Vec<_> = case.sim.vms().into_iter().filter(|v| !v.template).collect();
    assert_eq!(vms.len(), 1, "exactly one VM on the simulator");
    assert!(
        pm.spec
            .provider_id
            .as_deref()
            .is_some_and(|p| p.starts_with("proxmox://"))
    );
    // The cluster became ready under the same identity, and the Lease is held by the provider.
    let clusters: Api<ProxmoxCluster> = Api::namespaced(case.client.clone(), NS);
    loop {
        let pxc = clusters.get("c1").await?;
        let ready = pxc
            .status
            .as_ref()
            .and_then(|s| s.initialization.as_ref())
            .and_then(|i| i.provisioned);
        if ready == Some(true) {
            break;
        }
        if tokio::time::Instant::now() > deadline {
            bail!(
                "ProxmoxCluster not provisioned: {:#?}\nprovider log:\n{}",
                pxc.status,
                case.provider.log_tail(60)
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The credentials Secret in the cluster's namespace was labelled for clusterctl move,
    // under the same identity (the patch it needs is in the generated role).
    let secret = Api::<k8s_openapi::api::core::v1::Secret>::namespaced(case.client.clone(), NS)
        .get("pve")
        .await?;
    assert_eq!(
        secret
            .labels()
            .get("clusterctl.cluster.x-k8s.io/move")
            .map(String::as_str),
        Some(""),
        "{:?}\nprovider log:\n{}",
        secret.labels(),
        case.provider.log_tail(40)
    );
    let lease =
        Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(case.client.clone(), PROXMOX_NAMESPACE)
            .get("banlieue-proxmox-leader")
            .await?;
    assert!(lease.spec.and_then(|s| s.holder_identity).is_some());
    let log = std::fs::read_to_string(case.provider.log())?;
    assert!(
        !log.contains("forbidden") && !log.contains("Forbidden"),
        "a request was denied under the generated RBAC:\n{log}"
    );
    case.provider.stop();
    case.sim.shutdown().await;
    drop(case.env);
    Ok(())
}

/// Removes `verb` on `resource` from the generated ClusterRole and waits for the 403 in the
/// provider's log; the machine must not be provisioned.
async fn fails_without(resource: &str, verb: &str) -> Result<()> {
    let mut case = start_case(Some((resource, verb))).await?;
    // The apiserver's denial, as it appears (JSON-escaped) in the provider's log.
    let denial = format!("cannot {verb} resource \\\"{resource}\\\"");
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    loop {
        case.provider.check_running()?;
        let log = std::fs::read_to_string(case.provider.log())?;
        if log.contains(&denial) {
            break;
        }
        if tokio::time::Instant::now() > deadline {
            bail!(
                "no 403 ({denial}) in the provider log without {verb} {resource}:\n{}",
                case.provider.log_tail(60)
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let pm = Api::<ProxmoxMachine>::namespaced(case.client.clone(), NS)
        .get("m1")
        .await?;
    assert!(
        !provisioned(&pm),
        "provisioned without {verb} {resource}: {:#?}",
        pm.status
    );
    case.provider.stop();
    case.sim.shutdown().await;
    drop(case.env);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_get_on_secrets_the_provider_fails_with_403() -> Result<()> {
    fails_without("secrets", "get").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_patch_on_machine_status_the_provider_fails_with_403() -> Result<()> {
    fails_without("proxmoxmachines/status", "patch").await
}

// --- the banlieue controller under the generated core RBAC ------------------------------------

/// Starts `banlieue controller` with the ServiceAccount's kubeconfig and the core Deployment's
/// flags.
fn start_controller(env: &TestEnv, kubeconfig: &KubeconfigFile) -> Result<ManagedProcess> {
    let binary = workspace_binary("banlieue")?;
    let args = vec![
        format!("KUBECONFIG={}", kubeconfig.path().display()),
        format!("POD_NAMESPACE={CORE_NAMESPACE}"),
        "RUST_LOG=info".to_owned(),
        binary.display().to_string(),
        "controller".to_owned(),
        "--leader-elect".to_owned(),
        "--metrics-addr=127.0.0.1:0".to_owned(),
    ];
    Ok(ManagedProcess::start(
        "banlieue",
        Path::new("/usr/bin/env"),
        &args,
        &env.workdir().join("logs/banlieue.log"),
    )?)
}

/// A Provider (no hypervisor needed: the controller never talks to one) and a VirtualMachine on
/// it, created by the admin; then the controller under the generated core RBAC.
async fn start_controller_case(
    without: Option<(&str, &str)>,
) -> Result<(TestEnv, ManagedProcess, kube::Client)> {
    let env = private_env().await?;
    let client = env.client().await?;
    let docs = rbac_documents(
        components::core_components(),
        components::CORE_CLUSTER_ROLE,
        without,
    );
    let kubeconfig = apply_rbac(&env, &docs, CORE_NAMESPACE, components::CORE_SERVICE_ACCOUNT).await?;
    let pp = PostParams::default();
    Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
        .create(&pp, &serde_json::from_value(json!({"metadata": {"name": NS}}))?)
        .await?;
    Api::<Provider>::all(client.clone())
        .create(
            &pp,
            &serde_json::from_value(json!({
                "apiVersion": "banlieue.io/v1alpha1", "kind": "Provider",
                "metadata": {"name": "pve"},
                "spec": {
                    "backend": "proxmox",
                    "endpoint": "https://pve.example.invalid:8006",
                    "credentialsRef": {"name": "pve", "namespace": CORE_NAMESPACE},
                    "nodes": ["pve1"],
                },
            }))?,
        )
        .await?;
    Api::<VirtualMachine>::namespaced(client.clone(), NS)
        .create(
            &pp,
            &serde_json::from_value(json!({
                "apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine",
                "metadata": {"name": "vm1"},
                "spec": {
                    "providerRef": {"name": "pve"},
                    "source": {"proxmox": {"vmid": 9000}},
                    "cpu": {"cores": 2},
                    "memoryMiB": 2048,
                },
            }))?,
        )
        .await?;
    let controller = start_controller(&env, &kubeconfig)?;
    Ok((env, controller, client))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_controller_builds_the_machine_with_only_the_generated_rbac() -> Result<()> {
    let (env, mut controller, client) = start_controller_case(None).await?;
    let machines: Api<ProxmoxMachine> = Api::namespaced(client.clone(), NS);
    let vms: Api<VirtualMachine> = Api::namespaced(client.clone(), NS);
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    loop {
        controller.check_running()?;
        let machine = machines.get_opt("vm1").await?;
        let vm = vms.get("vm1").await?;
        // The machine exists and the VM's status names its Provider (a status patch went through).
        let recorded = vm.status.as_ref().and_then(|s| s.provider.as_deref()) == Some("pve");
        if machine.is_some() && recorded {
            break;
        }
        if tokio::time::Instant::now() > deadline {
            bail!(
                "no ProxmoxMachine / VM status under the generated RBAC: {:#?}\ncontroller log:\n{}",
                vm.status,
                controller.log_tail(60)
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The Lease in the controller's namespace is held.
    let lease = Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(client, CORE_NAMESPACE)
        .get("banlieue-controller")
        .await?;
    assert!(lease.spec.and_then(|s| s.holder_identity).is_some());
    let log = std::fs::read_to_string(controller.log())?;
    assert!(
        !log.contains("forbidden") && !log.contains("Forbidden"),
        "a request was denied under the generated RBAC:\n{log}"
    );
    controller.stop();
    drop(env);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_create_on_proxmoxmachines_the_controller_fails_with_403() -> Result<()> {
    let (env, mut controller, client) = start_controller_case(Some(("proxmoxmachines", "create"))).await?;
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    loop {
        controller.check_running()?;
        let log = std::fs::read_to_string(controller.log())?;
        if log
            .lines()
            .any(|l| l.contains("cannot create resource") && l.contains("proxmoxmachines"))
        {
            break;
        }
        if tokio::time::Instant::now() > deadline {
            bail!(
                "no 403 for creating proxmoxmachines in the controller log:\n{}",
                controller.log_tail(60)
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let machine = Api::<ProxmoxMachine>::namespaced(client, NS)
        .get_opt("vm1")
        .await?;
    assert!(machine.is_none(), "created without the create verb");
    controller.stop();
    drop(env);
    Ok(())
}

// --- both, standalone: VirtualMachine → controller → ProxmoxMachine → provider → pve-sim --------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controller_and_provider_serve_a_virtual_machine_with_only_the_generated_rbac() -> Result<()> {
    let env = private_env().await?;
    let client = env.client().await?;
    let provider_docs = rbac_documents(
        components::proxmox_components(),
        components::PROXMOX_CLUSTER_ROLE,
        None,
    );
    let provider_kubeconfig = apply_rbac(
        &env,
        &provider_docs,
        PROXMOX_NAMESPACE,
        components::PROXMOX_SERVICE_ACCOUNT,
    )
    .await?;
    let core_docs = rbac_documents(components::core_components(), components::CORE_CLUSTER_ROLE, None);
    let controller_kubeconfig =
        apply_rbac(&env, &core_docs, CORE_NAMESPACE, components::CORE_SERVICE_ACCOUNT).await?;

    let sim = banlieue_pve_sim::start(SimConfig::fast()).await?;
    let pp = PostParams::default();
    Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
        .create(&pp, &serde_json::from_value(json!({"metadata": {"name": NS}}))?)
        .await?;
    Api::<Secret>::namespaced(client.clone(), CORE_NAMESPACE)
        .create(
            &pp,
            &serde_json::from_value(json!({
                "metadata": {"name": "pve"},
                "stringData": {"tokenID": sim.token_id(), "secret": sim.token_secret()},
            }))?,
        )
        .await?;
    Api::<Provider>::all(client.clone())
        .create(
            &pp,
            &serde_json::from_value(json!({
                "apiVersion": "banlieue.io/v1alpha1", "kind": "Provider",
                "metadata": {"name": "pve"},
                "spec": {
                    "backend": "proxmox",
                    "endpoint": sim.url(),
                    "credentialsRef": {"name": "pve", "namespace": CORE_NAMESPACE},
                    "tls": {"sha256Fingerprint": sim.fingerprint_sha256()},
                    "nodes": ["pve1", "pve2"],
                },
            }))?,
        )
        .await?;
    Api::<VirtualMachine>::namespaced(client.clone(), NS)
        .create(
            &pp,
            &serde_json::from_value(json!({
                "apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine",
                "metadata": {"name": "vm1"},
                "spec": {
                    "providerRef": {"name": "pve"},
                    "source": {"proxmox": {"vmid": 9000}},
                    "cpu": {"cores": 2},
                    "memoryMiB": 2048,
                },
            }))?,
        )
        .await?;
    let mut controller = start_controller(&env, &controller_kubeconfig)?;
    let mut provider = start_provider(&env, &provider_kubeconfig)?;

    let machines: Api<ProxmoxMachine> = Api::namespaced(client.clone(), NS);
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    loop {
        controller.check_running()?;
        provider.check_running()?;
        let pm = machines.get_opt("vm1").await?;
        if pm.as_ref().is_some_and(provisioned) {
            break;
        }
        if tokio::time::Instant::now() > deadline {
            bail!(
                "the VirtualMachine's machine was not provisioned under the generated RBAC: {:#?}\n\
                 controller log:\n{}\nprovider log:\n{}",
                pm.map(|p| p.status),
                controller.log_tail(40),
                provider.log_tail(40)
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let vms: Vec<_> = sim.vms().into_iter().filter(|v| !v.template).collect();
    assert_eq!(vms.len(), 1, "exactly one VM on the simulator");
    for process in [&controller, &provider] {
        let log = std::fs::read_to_string(process.log())?;
        assert!(
            !log.contains("forbidden") && !log.contains("Forbidden"),
            "a request was denied under the generated RBAC:\n{log}"
        );
    }
    controller.stop();
    provider.stop();
    sim.shutdown().await;
    drop(env);
    Ok(())
}

// --- banlieue-libvirt and banlieue-vsphere under their generated RBAC ---------------------------

/// The kinds of `infra`'s infrastructure cluster and machine, for dynamic API access.
fn infra_resources(infra: Infra) -> (ApiResource, ApiResource) {
    let resource = |kind: &str| {
        banlieue_dev::fixtures::infrastructure_resource(&format!("{}{kind}", infra.kind_prefix()))
    };
    (resource("Cluster"), resource("Machine"))
}

/// A CAPI Cluster `c1` (infrastructure provisioned) with its infrastructure cluster (`cluster_spec`)
/// owned by it, and a Machine `m1` with its bootstrap Secret and infrastructure machine
/// (`machine_spec`), as CAPI would write them. Returns the infrastructure machine's UID.
async fn capi_workload(
    client: &kube::Client,
    infra: Infra,
    cluster_spec: Value,
    machine_spec: Value,
) -> Result<String> {
    let (cluster_ar, machine_ar) = infra_resources(infra);
    banlieue_dev::fixtures::capi_cluster(client, NS, &cluster_ar.kind, cluster_spec).await?;
    banlieue_dev::fixtures::capi_machine(client, NS, &machine_ar.kind, machine_spec).await
}

/// Starts `infra`'s binary with the ServiceAccount's kubeconfig and the Deployment's flags
/// (addresses on loopback, `extra` appended).
fn start_infra(
    env: &TestEnv,
    infra: Infra,
    kubeconfig: &KubeconfigFile,
    extra: &[&str],
) -> Result<ManagedProcess> {
    let name = infra.name();
    let binary = workspace_binary(&name)?;
    let mut args = vec![
        format!("KUBECONFIG={}", kubeconfig.path().display()),
        format!("POD_NAMESPACE={}", infra.namespace()),
        "RUST_LOG=info".to_owned(),
        binary.display().to_string(),
        "--leader-elect".to_owned(),
        "--metrics-bind-address=127.0.0.1:0".to_owned(),
        "--health-probe-bind-address=127.0.0.1:0".to_owned(),
        "--concurrency=2".to_owned(),
    ];
    args.extend(extra.iter().map(|a| (*a).to_owned()));
    Ok(ManagedProcess::start(
        &name,
        Path::new("/usr/bin/env"),
        &args,
        &env.workdir().join(format!("logs/{name}.log")),
    )?)
}

/// A private control plane with `infra`'s generated RBAC (optionally without `verb` on
/// `resource`), the workload namespace, and the ServiceAccount's kubeconfig.
async fn infra_case(
    infra: Infra,
    without: Option<(&str, &str)>,
) -> Result<(TestEnv, kube::Client, KubeconfigFile)> {
    let env = private_env().await?;
    let client = env.client().await?;
    let docs = rbac_documents(
        components::infra_components(infra),
        &components::cluster_role(infra),
        without,
    );
    let kubeconfig = apply_rbac(
        &env,
        &docs,
        &infra.namespace(),
        &components::service_account(infra),
    )
    .await?;
    Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": NS}}))?,
        )
        .await?;
    Ok((env, client, kubeconfig))
}

/// `spec.providerID` and `status.initialization.provisioned` of a dynamic infra object.
fn dyn_provisioned(obj: &DynamicObject) -> (Option<String>, bool) {
    let id = obj.data["spec"]["providerID"].as_str().map(str::to_owned);
    let provisioned = obj.data["status"]["initialization"]["provisioned"] == true;
    (id, provisioned)
}

/// Waits until `m1` of `infra` has a providerID and is provisioned, and its infra cluster `c1`
/// is provisioned; fails early if the provider exits.
async fn wait_provisioned(
    client: &kube::Client,
    infra: Infra,
    provider: &mut ManagedProcess,
) -> Result<String> {
    let (cluster_ar, machine_ar) = infra_resources(infra);
    let machines = Api::<DynamicObject>::namespaced_with(client.clone(), NS, &machine_ar);
    let clusters = Api::<DynamicObject>::namespaced_with(client.clone(), NS, &cluster_ar);
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    loop {
        provider.check_running()?;
        let m = machines.get("m1").await?;
        let c = clusters.get("c1").await?;
        if let ((Some(id), true), (_, true)) = (dyn_provisioned(&m), dyn_provisioned(&c)) {
            return Ok(id);
        }
        if tokio::time::Instant::now() > deadline {
            bail!(
                "{infra:?}: not provisioned under the generated RBAC: machine {}\ncluster {}\nprovider log:\n{}",
                m.data["status"],
                c.data["status"],
                provider.log_tail(60)
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The Lease is held and no request of the provider was denied.
async fn assert_lease_and_no_denial(
    client: &kube::Client,
    infra: Infra,
    provider: &ManagedProcess,
) -> Result<()> {
    let lease =
        Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(client.clone(), &infra.namespace())
            .get(&format!("{}-leader", infra.name()))
            .await?;
    assert!(lease.spec.and_then(|s| s.holder_identity).is_some());
    let log = std::fs::read_to_string(provider.log())?;
    assert!(
        !log.contains("forbidden") && !log.contains("Forbidden"),
        "a request of {} was denied under the generated RBAC:\n{log}",
        infra.name()
    );
    Ok(())
}

/// libvirt's test driver with the `default` network and a pool holding a base volume, from a
/// node file (`test:///<file>`
/// is per process, so the provider's own connection sees the same pool and volume).
fn libvirt_test_node(env: &TestEnv) -> Result<String> {
    let file = env.workdir().join("libvirt-node.xml");
    std::fs::write(
        &file,
        "<node>\n  <network>\n    <name>default</name>\n    <bridge name='virbr0'/>\n    \
         <ip address='192.168.122.1' netmask='255.255.255.0'>\n      \
         <dhcp><range start='192.168.122.2' end='192.168.122.254'/></dhcp>\n    </ip>\n  </network>\n  \
         <pool type='dir'>\n    <name>default-pool</name>\n    <target><path>/default-pool</path></target>\n    \
         <volume type='file'>\n      <name>base.qcow2</name>\n      <capacity unit='GiB'>1</capacity>\n      \
         <target><path>/default-pool/base.qcow2</path><format type='qcow2'/></target>\n    </volume>\n  </pool>\n</node>\n",
    )?;
    Ok(format!("test://{}", file.display()))
}

async fn start_libvirt_case(
    without: Option<(&str, &str)>,
) -> Result<(TestEnv, kube::Client, ManagedProcess, String)> {
    let (env, client, kubeconfig) = infra_case(Infra::Libvirt, without).await?;
    let uri = libvirt_test_node(&env)?;
    let uid = capi_workload(
        &client,
        Infra::Libvirt,
        json!({"controlPlaneEndpoint": {"host": "10.0.0.100", "port": 6443}, "uri": uri}),
        json!({"source": {"volume": "base.qcow2", "pool": "default-pool"}, "cpu": {"cores": 1}, "memoryMiB": 256}),
    )
    .await?;
    let provider = start_infra(&env, Infra::Libvirt, &kubeconfig, &["--domain-type=qemu"])?;
    Ok((env, client, provider, uid))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_libvirt_provider_provisions_a_machine_with_only_the_generated_rbac() -> Result<()> {
    let (env, client, mut provider, uid) = start_libvirt_case(None).await?;
    let provider_id = wait_provisioned(&client, Infra::Libvirt, &mut provider).await?;
    assert_eq!(provider_id, format!("libvirt://localhost/{uid}"));
    assert_lease_and_no_denial(&client, Infra::Libvirt, &provider).await?;
    provider.stop();
    drop(env);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_get_on_secrets_the_libvirt_provider_fails_with_403() -> Result<()> {
    let (env, client, mut provider, _) = start_libvirt_case(Some(("secrets", "get"))).await?;
    let denial = "cannot get resource \\\"secrets\\\"";
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    loop {
        provider.check_running()?;
        if std::fs::read_to_string(provider.log())?.contains(denial) {
            break;
        }
        if tokio::time::Instant::now() > deadline {
            bail!(
                "no 403 ({denial}) in the provider log:\n{}",
                provider.log_tail(60)
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (_, machine_ar) = infra_resources(Infra::Libvirt);
    let m = Api::<DynamicObject>::namespaced_with(client.clone(), NS, &machine_ar)
        .get("m1")
        .await?;
    assert_eq!(
        dyn_provisioned(&m),
        (None, false),
        "provisioned without reading the bootstrap Secret"
    );
    provider.stop();
    drop(env);
    Ok(())
}

#[path = "../../providers/vsphere/client/tests/support/vcsim.rs"]
mod vcsim_support;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_vsphere_provider_provisions_a_machine_with_only_the_generated_rbac() -> Result<()> {
    use banlieue_vsphere_client::MoRef;
    use banlieue_vsphere_client::vim::ConfigSpec;
    const TEMPLATE: &str = "DC0_C0_RP0_VM0";

    let sim = vcsim_support::Vcsim::start(&[])?;
    let vc = sim.client()?;
    sim.make_template(&vc, TEMPLATE).await?;

    let (env, client, kubeconfig) = infra_case(Infra::Vsphere, None).await?;
    Api::<Secret>::namespaced(client.clone(), NS)
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "vc"},
                "stringData": {"username": vcsim_support::USER, "password": vcsim_support::PASSWORD},
            }))?,
        )
        .await?;
    capi_workload(
        &client,
        Infra::Vsphere,
        json!({
            "controlPlaneEndpoint": {"host": "10.0.0.100", "port": 6443},
            "server": sim.host, "credentialsRef": {"name": "vc"},
            "tls": {"sha256Fingerprint": sim.thumbprint}, "datacenter": "DC0",
        }),
        json!({
            "source": {"template": TEMPLATE}, "resourcePool": "DC0_C0/Resources", "datastore": "LocalDS_0",
            "cpu": {"cores": 1}, "memoryMiB": 1024,
        }),
    )
    .await?;
    let mut provider = start_infra(&env, Infra::Vsphere, &kubeconfig, &[])?;

    // The clone is powered on and waits for its guest; vcsim reports a guest IP once told to.
    let (_, machine_ar) = infra_resources(Infra::Vsphere);
    let machines = Api::<DynamicObject>::namespaced_with(client.clone(), NS, &machine_ar);
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    let vm_ref = loop {
        provider.check_running()?;
        let m = machines.get("m1").await?;
        if let Some(r) = m.data["status"]["vmRef"].as_str() {
            break r.to_owned();
        }
        if tokio::time::Instant::now() > deadline {
            bail!(
                "no VM cloned under the generated RBAC: {}\nprovider log:\n{}",
                m.data["status"],
                provider.log_tail(60)
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let vm = MoRef::new("VirtualMachine", vm_ref);
    let set_ip = ConfigSpec {
        extra_config: vec![("SET.guest.ipAddress".into(), "192.0.2.77".into())],
        ..ConfigSpec::default()
    };
    vc.wait_task(
        &vc.reconfigure(&vm, &set_ip).await?,
        Duration::from_millis(100),
        TIMEOUT,
    )
    .await?;
    let provider_id = wait_provisioned(&client, Infra::Vsphere, &mut provider).await?;
    let info = vc.vm_info(&vm).await?.context("the clone is in vcsim")?;
    assert_eq!(
        Some(provider_id),
        info.bios_uuid.map(|u| format!("vsphere://{u}"))
    );
    assert_lease_and_no_denial(&client, Infra::Vsphere, &provider).await?;
    provider.stop();
    drop(env);
    Ok(())
}
