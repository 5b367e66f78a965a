//! `banlieue-dev`: the whole stack on this machine, for trying banlieue with `kubectl`.
//!
//! Starts a private etcd + kube-apiserver + kube-controller-manager (built by
//! `tests/controlplane/build.sh`), installs banlieue's and CAPI's CRDs, starts the Proxmox VE
//! simulator on loopback, and registers it: a credentials Secret in `banlieue-system` and a
//! cluster-scoped `Provider` named `pve-sim` that VirtualMachines can reference. It writes a
//! kubeconfig to a fixed path, prints how to use it, and runs until Ctrl-C, when everything stops.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use banlieue_testenv::TestEnv;
use clap::Parser;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::api::{Api, Patch, PatchParams};

const FIELD_MANAGER: &str = "banlieue-dev";
const SYSTEM_NAMESPACE: &str = "banlieue-system";
const PROVIDER_NAME: &str = "pve-sim";

#[derive(Parser, Debug)]
#[command(about = "Run banlieue's local environment: real control plane + Proxmox VE simulator")]
struct Args {
    /// Where to write the admin kubeconfig.
    #[arg(long, default_value = ".work/dev/kubeconfig")]
    kubeconfig: PathBuf,
    /// Simulated Proxmox VE nodes.
    #[arg(long, default_value_t = 3)]
    nodes: usize,
    /// Duration of every simulated PVE task, in milliseconds.
    #[arg(long, default_value_t = 500)]
    task_ms: u64,
    /// Time from a simulated VM's start until its guest agent reports an address, in milliseconds.
    #[arg(long, default_value_t = 2000)]
    agent_ms: u64,
    /// Folder with CAPI's CRDs to install too (skipped when missing).
    #[arg(long, env = "BANLIEUE_CAPI_CRDS", default_value = "../shared/capi/v1.14/crds")]
    capi_crds: PathBuf,
    /// Start, print the summary and stop again (a smoke test of the environment).
    #[arg(long)]
    once: bool,
    /// Do not start the controllers (the Proxmox provider and the banlieue controller).
    #[arg(long)]
    no_controllers: bool,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let started = Instant::now();
    let step = |what: &str| eprintln!("==> [{:>5.1}s] {what}", started.elapsed().as_secs_f64());

    step("starting etcd, kube-apiserver and kube-controller-manager");
    let env = TestEnv::builder()
        .allow_external(false)
        .start()
        .await
        .context("starting the control plane (did `tests/controlplane/build.sh` run?)")?;
    step(&format!(
        "control plane ready at {} in {:.1}s",
        env.server(),
        env.started_in().as_secs_f64()
    ));

    step("installing banlieue CRDs");
    env.install_crds(&banlieue_api::crds::all()).await?;
    let capi = capi_crd_files(&args.capi_crds)?;
    if capi.is_empty() {
        step(&format!(
            "no CAPI CRDs under {} - skipped",
            args.capi_crds.display()
        ));
    } else {
        step(&format!(
            "installing {} CAPI CRDs from {}",
            capi.len(),
            args.capi_crds.display()
        ));
        env.install_crd_files(&capi).await?;
    }

    step("starting the Proxmox VE simulator");
    let sim_config = banlieue_pve_sim::SimConfig {
        nodes: (1..=args.nodes).map(|n| format!("pve{n}")).collect(),
        task_duration: Duration::from_millis(args.task_ms),
        agent_delay: Duration::from_millis(args.agent_ms),
        ..banlieue_pve_sim::SimConfig::default()
    };
    let sim = banlieue_pve_sim::start(sim_config)
        .await
        .context("starting the Proxmox VE simulator")?;

    step(&format!("registering the simulator as Provider {PROVIDER_NAME}"));
    register_simulator(&env, &sim).await?;

    write_kubeconfig(env.admin().path(), &args.kubeconfig)?;
    let kubeconfig = std::fs::canonicalize(&args.kubeconfig)?;
    let mut controllers = Vec::new();
    if !args.no_controllers {
        let logs = kubeconfig.parent().unwrap_or(Path::new(".")).join("logs");
        std::fs::create_dir_all(&logs).with_context(|| format!("creating {}", logs.display()))?;
        for (name, args) in CONTROLLERS {
            step(&format!("starting {name} (log: {}/{name}.log)", logs.display()));
            controllers.push(start_controller(name, args, &kubeconfig, &logs)?);
        }
    }
    println!();
    println!(
        "banlieue local environment is up ({:.1}s).",
        started.elapsed().as_secs_f64()
    );
    println!("  kube-apiserver   {}", env.server());
    println!(
        "  Proxmox VE sim   {}/api2/json  (token {})",
        sim.url(),
        sim.token_id()
    );
    println!("  sim certificate  SHA-256 {}", sim.fingerprint_sha256());
    println!();
    println!("  export KUBECONFIG={}", kubeconfig.display());
    println!("  kubectl get providers.banlieue.io");
    println!("  kubectl apply -f tests/devenv/examples/vm-on-sim.yaml && kubectl get bvm,pxmachine -w");
    println!("  kubectl explain virtualmachines.spec");
    println!();
    if args.once {
        // Long enough for a controller with a bad flag or no API access to fail.
        tokio::time::sleep(Duration::from_secs(2)).await;
    } else {
        println!("Press Ctrl-C to stop everything.");
        tokio::signal::ctrl_c().await?;
        step("stopping");
    }
    for controller in &mut controllers {
        controller.check_running().context("a controller stopped early")?;
        controller.stop();
    }
    sim.shutdown().await;
    drop(env);
    Ok(())
}

/// The controllers the environment runs, by binary name (built next to `banlieue-dev`) and flags.
const CONTROLLERS: [(&str, &[&str]); 2] = [
    (
        "banlieue-proxmox",
        &[
            "--metrics-bind-address=127.0.0.1:0",
            "--health-probe-bind-address=127.0.0.1:0",
            "--log-format=text",
        ],
    ),
    ("banlieue", &["controller", "--metrics-addr=127.0.0.1:0"]),
];

/// Starts a controller binary from the folder of this executable with `KUBECONFIG` set; it dies
/// with this process.
fn start_controller(
    name: &str,
    args: &[&str],
    kubeconfig: &Path,
    logs: &Path,
) -> anyhow::Result<banlieue_testenv::ManagedProcess> {
    let dir = std::env::current_exe()?
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default();
    let binary = dir.join(name);
    anyhow::ensure!(
        binary.is_file(),
        "{} is missing: build it with `cargo build -p banlieue-controllers -p banlieue-proxmox` \
         (tests/dev.sh does), or pass --no-controllers",
        binary.display()
    );
    let mut argv = vec![
        format!("KUBECONFIG={}", kubeconfig.display()),
        binary.display().to_string(),
    ];
    argv.extend(args.iter().map(|a| a.to_string()));
    let process = banlieue_testenv::ManagedProcess::start(
        name,
        Path::new("/usr/bin/env"),
        &argv,
        &logs.join(format!("{name}.log")),
    )?;
    Ok(process)
}

fn capi_crd_files(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(Vec::new());
    };
    let mut files = Vec::new();
    for entry in entries {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "yaml") {
            files.push(path);
        }
    }
    files.sort();
    Ok(files)
}

async fn register_simulator(env: &TestEnv, sim: &banlieue_pve_sim::SimHandle) -> anyhow::Result<()> {
    let client = env.client().await?;
    let apply = PatchParams::apply(FIELD_MANAGER).force();
    let namespace: Namespace = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": SYSTEM_NAMESPACE}
    }))?;
    Api::<Namespace>::all(client.clone())
        .patch(SYSTEM_NAMESPACE, &apply, &Patch::Apply(&namespace))
        .await?;

    let secret: Secret = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": PROVIDER_NAME, "namespace": SYSTEM_NAMESPACE},
        "stringData": {"tokenID": sim.token_id(), "secret": sim.token_secret()}
    }))?;
    Api::<Secret>::namespaced(client.clone(), SYSTEM_NAMESPACE)
        .patch(PROVIDER_NAME, &apply, &Patch::Apply(&secret))
        .await
        .context("applying the simulator's credentials Secret")?;

    let provider: banlieue_api::banlieue::Provider = serde_json::from_value(serde_json::json!({
        "apiVersion": "banlieue.io/v1alpha1", "kind": "Provider",
        "metadata": {"name": PROVIDER_NAME, "labels": {"banlieue.io/simulated": "true"}},
        "spec": {
            "backend": "proxmox",
            "endpoint": sim.url(),
            "credentialsRef": {"name": PROVIDER_NAME, "namespace": SYSTEM_NAMESPACE},
            "tls": {"sha256Fingerprint": sim.fingerprint_sha256()},
            "defaults": {"storage": "local-lvm", "network": "vmbr0", "resourcePool": "banlieue"},
            "nodes": sim.config().nodes,
        }
    }))
    .context("building the Provider object")?;
    Api::<banlieue_api::banlieue::Provider>::all(client)
        .patch(PROVIDER_NAME, &apply, &Patch::Apply(&provider))
        .await
        .context("applying the simulator's Provider")?;
    Ok(())
}

fn write_kubeconfig(from: &Path, to: &Path) -> anyhow::Result<()> {
    if let Some(parent) = to.parent() {
        std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    }
    std::fs::copy(from, to).with_context(|| format!("writing {}", to.display()))?;
    Ok(())
}
