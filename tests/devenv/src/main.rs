//! `banlieue-dev`: the whole stack on this machine, for trying banlieue with `kubectl`.
//!
//! Starts the stack of [`banlieue_dev::Stack`] (control plane, CRDs, Proxmox VE simulator
//! registered as Provider `pve-sim`), the Proxmox provider and the banlieue controller from their
//! own binaries, writes a kubeconfig to a fixed path, prints how to use it, then reports the
//! progress of every VirtualMachine (phase, Ready reason and message, addresses) until Ctrl-C,
//! when the controllers get SIGTERM and everything stops.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use banlieue_api::banlieue::VirtualMachine;
use banlieue_dev::{CONTROLLERS, Stack, StackConfig};
use clap::Parser;
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};

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
    /// Folder with CAPI's CRDs to install too [default: the repository's api/capi/crds].
    #[arg(long, env = banlieue_capi::crds::DIR_ENV)]
    capi_crds: Option<PathBuf>,
    /// Start, print the summary and stop again (a smoke test of the environment).
    #[arg(long)]
    once: bool,
    /// Do not start the controllers (the Proxmox provider and the banlieue controller).
    #[arg(long)]
    no_controllers: bool,
    /// Do not print VirtualMachine progress.
    #[arg(long)]
    quiet: bool,
    /// Also run Cluster API's core, kubeadm bootstrap and kubeadm control-plane managers (built
    /// by `tests/controlplane/build.sh --capi`), with ClusterTopology on and their admission
    /// webhooks registered, and write `capi.env` beside the kubeconfig: the variables
    /// `clusterctl generate cluster` needs for the simulator.
    #[arg(long)]
    capi: bool,
    /// Run the Proxmox provider and the banlieue controller as Pods on a real node (containerd,
    /// kubelet, kube-proxy; images built here from the binaries beside this one), installed from
    /// their components in clusterctl/dist/ with only their RBAC, instead of host processes.
    /// With --capi, CAPI's managers too: `clusterctl init` installs CAPI's release components
    /// (tests/controlplane/build.sh renders them) and banlieue-proxmox, all run as Pods.
    #[arg(long, conflicts_with = "no_controllers")]
    pods: bool,
}

/// How long a controller gets to stop after SIGTERM.
const STOP_GRACE: Duration = Duration::from_secs(10);

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let started = Instant::now();
    let step = move |what: &str| eprintln!("==> [{:>5.1}s] {what}", started.elapsed().as_secs_f64());

    let config = StackConfig {
        sim: banlieue_dev::sim_config(
            args.nodes,
            Duration::from_millis(args.task_ms),
            Duration::from_millis(args.agent_ms),
        ),
        // With --pods --capi, `clusterctl init` installs CAPI's CRDs with its components.
        capi_crds: (!(args.pods && args.capi))
            .then(|| args.capi_crds.clone().unwrap_or_else(banlieue_capi::crds::dir)),
        node_network: args.pods,
    };
    let stack = Stack::start(config, step).await?;
    banlieue_dev::write_kubeconfig(stack.env.admin().path(), &args.kubeconfig)?;
    let kubeconfig = std::fs::canonicalize(&args.kubeconfig)?;
    let logs = kubeconfig.parent().unwrap_or(Path::new(".")).join("logs");
    let mut controllers = Vec::new();
    let mut node = None;
    if args.pods && args.capi {
        node = Some(
            banlieue_dev::capi_pods::install_management(
                &stack.env,
                &stack.sim,
                &banlieue_dev::binary_dir()?,
                step,
            )
            .await?,
        );
    } else if args.pods {
        node = Some(
            banlieue_dev::pods::install(&stack.env, &stack.sim, &banlieue_dev::binary_dir()?, step).await?,
        );
    } else if !args.no_controllers {
        let bin_dir = banlieue_dev::binary_dir()?;
        for (name, flags) in CONTROLLERS {
            step(&format!("starting {name} (log: {}/{name}.log)", logs.display()));
            controllers.push((
                name,
                banlieue_dev::start_controller(&bin_dir, name, flags, &kubeconfig, &logs)?,
            ));
        }
    }
    let mut capi_managers = Vec::new();
    let mut capi_env = None;
    if args.capi {
        if !args.pods {
            capi_managers = banlieue_dev::capi::start_all(&stack.env, &logs, true, step).await?;
        }
        let path = kubeconfig.with_file_name(banlieue_dev::capi::ENV_FILE);
        let text = banlieue_dev::capi::clusterctl_variables(&kubeconfig, &stack.sim)?;
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
        step(&format!(
            "wrote the clusterctl variables for the simulator to {}",
            path.display()
        ));
        capi_env = Some(path);
    }
    let sim = &stack.sim;
    println!();
    println!(
        "banlieue local environment is up ({:.1}s).",
        started.elapsed().as_secs_f64()
    );
    println!("  kube-apiserver   {}", stack.env.server());
    println!(
        "  Proxmox VE sim   {}/api2/json  (token {})",
        sim.url(),
        sim.token_id()
    );
    println!("  sim certificate  SHA-256 {}", sim.fingerprint_sha256());
    println!();
    if node.is_some() {
        println!(
            "  managers as Pods on node {}: kubectl get pods -A -o wide",
            banlieue_dev::pods::NODE_NAME
        );
    }
    println!("  export KUBECONFIG={}", kubeconfig.display());
    println!("  kubectl get providers.banlieue.io");
    println!("  kubectl apply -f tests/devenv/examples/vm-on-sim.yaml && kubectl get bvm,pxmachine -w");
    println!("  kubectl wait --for=condition=Ready virtualmachine/hello --timeout=2m");
    println!("  kubectl explain virtualmachines.spec");
    println!();
    if let Some(path) = &capi_env {
        println!("  Cluster API (core, kubeadm bootstrap and control plane managers, ClusterTopology on):");
        println!("  source {}", path.display());
        println!("  clusterctl generate cluster demo --config ~/.cluster-api/banlieue/clusterctl.yaml \\");
        println!(
            "    --infrastructure banlieue-proxmox:v0.1.0 --kubernetes-version v1.33.1 | kubectl apply -f -"
        );
        println!("  (README \"Trying Cluster API locally\": clusterctl and its local repository first)");
        println!();
    }
    if args.once {
        // Long enough for a controller with a bad flag or no API access to fail.
        tokio::time::sleep(Duration::from_secs(2)).await;
    } else {
        println!("Press Ctrl-C to stop everything.");
        let client = stack.env.client().await?;
        tokio::select! {
            r = tokio::signal::ctrl_c() => r.context("waiting for Ctrl-C")?,
            () = report_progress(client, step), if !args.quiet => {}
        }
        step("stopping");
    }
    let mut early = None;
    for running in &mut capi_managers {
        if let Err(e) = running.process.check_running() {
            early.get_or_insert(e);
        }
    }
    drop(capi_managers);
    for (name, controller) in &mut controllers {
        if let Err(e) = controller.check_running() {
            early.get_or_insert(e);
            continue;
        }
        let clean = banlieue_dev::terminate(controller, STOP_GRACE);
        step(&format!(
            "{name} {}",
            if clean {
                "stopped"
            } else {
                "did not stop on SIGTERM: killed"
            }
        ));
    }
    drop(node);
    stack.stop().await;
    if let Some(e) = early {
        return Err(e).context("a controller stopped early");
    }
    Ok(())
}

/// One line per VirtualMachine state a user cares about.
fn summary(vm: &VirtualMachine) -> String {
    let Some(status) = &vm.status else {
        return "created (no status yet)".to_owned();
    };
    let phase = status.phase.map_or_else(|| "-".to_owned(), |p| format!("{p:?}"));
    let ready = banlieue_api::condition::find(&status.conditions, banlieue_api::condition::READY)
        .map(|c| {
            if c.message.is_empty() {
                format!("Ready={} {}", c.status, c.reason)
            } else {
                format!("Ready={} {}: {}", c.status, c.reason, c.message)
            }
        })
        .unwrap_or_default();
    let ips: Vec<&str> = status.addresses.iter().map(|a| a.address.as_str()).collect();
    if ips.is_empty() {
        format!("{phase}, {ready}")
    } else {
        format!("{phase}, {ready}, addresses {}", ips.join(" "))
    }
}

/// Prints every change of a VirtualMachine's summary (polling once a second; reads only).
async fn report_progress(client: Client, step: impl Fn(&str)) {
    let vms: Api<VirtualMachine> = Api::all(client);
    let mut last: BTreeMap<String, String> = BTreeMap::new();
    loop {
        if let Ok(list) = vms.list(&ListParams::default()).await {
            let mut seen = BTreeMap::new();
            for vm in &list.items {
                let key = format!("{}/{}", vm.namespace().unwrap_or_default(), vm.name_any());
                let now = summary(vm);
                if last.get(&key) != Some(&now) {
                    step(&format!("VirtualMachine {key}: {now}"));
                }
                seen.insert(key, now);
            }
            for gone in last.keys().filter(|k| !seen.contains_key(*k)) {
                step(&format!("VirtualMachine {gone}: deleted"));
            }
            last = seen;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}
