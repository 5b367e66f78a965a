//! Real nodes: a control plane with a node network, one node (containerd, runc, CNI, kubelet in
//! its own namespaces), a Pod from a locally built image scheduled there, started, probed and
//! logged; `kubectl logs` and `kubectl exec` reach it through the kubelet, and a ClusterIP Service
//! leads to it (kube-proxy). Dropping the node
//! leaves no process, cgroup, network namespace or route behind.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use banlieue_testenv::TestEnv;
use banlieue_testenv::nodes::Node;
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::api::{Api, PostParams};

const POD_TIMEOUT: Duration = Duration::from_secs(120);

fn pod(name: &str, node: &str) -> Result<Pod> {
    Ok(serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "containers": [{
                "name": "main",
                "image": "docker.io/library/busybox:testenv",
                "imagePullPolicy": "Never",
                "command": ["sh", "-c", "echo hello from a real node; exec httpd -f -p 8080 -h /etc"],
                "ports": [{"containerPort": 8080}],
                "readinessProbe": {"httpGet": {"path": "/hostname", "port": 8080}, "periodSeconds": 1},
            }],
            "terminationGracePeriodSeconds": 1,
        }
    }))?)
}

fn kubectl(env: &TestEnv, args: &[&str]) -> Result<String> {
    let mut command = env.kubectl();
    command.args(args);
    let output = banlieue_testenv::run_with_timeout(&mut command, Duration::from_secs(60))?;
    ensure!(
        output.status.success(),
        "kubectl {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(String::from_utf8(output.stdout)?)
}

/// Processes whose command line mentions `needle`.
fn processes_mentioning(needle: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        if let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) {
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            if cmdline.contains(needle) {
                found.push(format!("{}: {cmdline}", entry.file_name().to_string_lossy()));
            }
        }
    }
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_runs_on_a_real_node_and_the_node_leaves_nothing_behind() -> Result<()> {
    let env = TestEnv::builder()
        .allow_external(false)
        .node_network(true)
        .start()
        .await?;
    let started = Instant::now();
    let node = Node::start(&env, 0, "node-a").await?;
    eprintln!("node Ready in {:.1}s", started.elapsed().as_secs_f64());
    let dir = node.dir().to_owned();

    let ns = env.namespace("nodes").await?;
    let pods: Api<Pod> = Api::namespaced(env.client().await?, ns.name());
    pods.create(&PostParams::default(), &pod("hello", node.name())?)
        .await?;
    let deadline = Instant::now() + POD_TIMEOUT;
    loop {
        let pod = pods.get("hello").await?;
        let status = pod.status.unwrap_or_default();
        let ready = status
            .conditions
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True");
        if ready {
            ensure!(
                status
                    .pod_ip
                    .as_deref()
                    .is_some_and(|ip| ip.starts_with("10.202.")),
                "the Pod's address is not from the node's range: {:?}",
                status.pod_ip
            );
            break;
        }
        if Instant::now() > deadline {
            bail!(
                "Pod not Ready after {POD_TIMEOUT:?}: {:?}\n--- node log\n{}",
                status.container_statuses,
                std::fs::read_to_string(dir.join("node.log")).unwrap_or_default()
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // The node's processes are counted: kubelet and containerd alone hold tens of MiB.
    let resident = node.resident_memory_bytes()?;
    eprintln!("node resident memory: {} MiB", resident >> 20);
    ensure!(
        resident > 30 << 20,
        "the node's resident memory is {resident} bytes: its processes were not found"
    );
    let logs = kubectl(&env, &["logs", "-n", ns.name(), "hello"])?;
    ensure!(logs.contains("hello from a real node"), "kubectl logs: {logs:?}");
    let hostname = kubectl(
        &env,
        &["exec", "-n", ns.name(), "hello", "--", "cat", "/etc/hostname"],
    )?;
    ensure!(hostname.trim() == "hello", "kubectl exec: {hostname:?}");
    // A ClusterIP Service leads to the Pod (kube-proxy in the node), from a Pod (hairpin).
    let services: Api<Service> = Api::namespaced(env.client().await?, ns.name());
    let service: Service = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "hello"},
        "spec": {"selector": {"app": "hello"}, "ports": [{"port": 80, "targetPort": 8080}]},
    }))?;
    let service = services.create(&PostParams::default(), &service).await?;
    let cluster_ip = service.spec.and_then(|s| s.cluster_ip).context("a ClusterIP")?;
    let url = format!("http://{cluster_ip}/hostname");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let through_service = kubectl(
            &env,
            &["exec", "-n", ns.name(), "hello", "--", "wget", "-qO-", &url],
        );
        match through_service {
            Ok(text) if text.trim() == "hello" => break,
            other if Instant::now() > deadline => bail!(
                "{url} from the Pod: {other:?}\n--- kube-proxy\n{}",
                std::fs::read_to_string(dir.join("kube-proxy.log")).unwrap_or_default()
            ),
            _ => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }

    // Cleanup: the node's processes, cgroups, network namespace and route go with it.
    let network_state = std::fs::read_dir(banlieue_testenv::nodes::STATE_DIR)?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.join("node-0").is_dir())
        .context("the node's state folder")?;
    let recorded = |key: &str| std::fs::read_to_string(network_state.join("node-0").join(key));
    let (cgroup, netns, route) = (recorded("cgroup")?, recorded("netns")?, recorded("route")?);
    let veth = recorded("veth")?;
    ensure!(
        !processes_mentioning(&dir.display().to_string()).is_empty(),
        "no process of the node was found while it runs"
    );
    drop(node);
    let left = processes_mentioning(&dir.display().to_string());
    ensure!(left.is_empty(), "processes left: {left:#?}");
    for hierarchy in ["memory", "cpu", "pids", "systemd"] {
        let path = Path::new("/sys/fs/cgroup").join(hierarchy).join(&cgroup);
        ensure!(!path.exists(), "cgroup left: {}", path.display());
    }
    let namespaces = std::process::Command::new("ip")
        .args(["netns", "list"])
        .output()?;
    ensure!(
        !String::from_utf8_lossy(&namespaces.stdout).contains(&netns),
        "network namespace {netns} left"
    );
    let links = std::process::Command::new("ip").args(["-br", "link"]).output()?;
    ensure!(
        !String::from_utf8_lossy(&links.stdout).contains(&format!("{veth}@")),
        "link {veth} left"
    );
    let routes = std::process::Command::new("ip").args(["route"]).output()?;
    ensure!(
        !String::from_utf8_lossy(&routes.stdout).contains(route.trim_end_matches("/24")),
        "route {route} left"
    );
    // The bridge and the state folder go with the control plane.
    let bridge = std::fs::read_to_string(network_state.join("bridge"))?;
    drop(ns);
    drop(env);
    let links = std::process::Command::new("ip").args(["-br", "link"]).output()?;
    ensure!(
        !String::from_utf8_lossy(&links.stdout).contains(&format!("{} ", bridge.trim())),
        "bridge {bridge} left"
    );
    ensure!(!network_state.exists(), "{} left", network_state.display());
    Ok(())
}
