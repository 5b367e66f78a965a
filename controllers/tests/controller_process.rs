//! `banlieue controller` runs as its own process, sharing nothing with the test but the API
//! server: it is started from the built binary with a kubeconfig, drives a VirtualMachine to a
//! ProxmoxMachine, and stops cleanly on SIGTERM.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use banlieue_api::banlieue::{Provider, VirtualMachine};
use banlieue_api::infrastructure::ProxmoxMachine;
use banlieue_testenv::TestEnv;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(30);

/// Kills the child on drop (a failing test must not leak the controller process).
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A minimal HTTP/1.1 GET (5 s timeouts); returns the raw response.
fn http_get(addr: &str, path: &str) -> anyhow::Result<String> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).context("connecting to the metrics endpoint")?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    stream.set_write_timeout(Some(Duration::from_secs(5)))?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut out = String::new();
    stream.read_to_string(&mut out)?;
    Ok(out)
}

#[tokio::test]
async fn controller_subcommand_drives_a_virtual_machine_and_stops_on_sigterm() -> anyhow::Result<()> {
    let env = TestEnv::shared_with(|b| b.crds(banlieue_api::crds::all())).await?;
    let ns = env.namespace("vm-process").await?;
    let client = env.client().await?;
    let provider_name = format!("{ns}-pve");
    let provider: Provider = serde_json::from_value(json!({
        "apiVersion": "banlieue.io/v1alpha1", "kind": "Provider", "metadata": {"name": provider_name},
        "spec": {"backend": "proxmox", "endpoint": "https://pve.example:8006",
                 "credentialsRef": {"name": "pve", "namespace": "banlieue-system"}},
    }))?;
    Api::<Provider>::all(client.clone())
        .create(&PostParams::default(), &provider)
        .await?;

    let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let metrics_addr = format!("127.0.0.1:{port}");
    let mut child = Child(
        Command::new(env!("CARGO_BIN_EXE_banlieue"))
            .args(["controller", "--namespace", &ns, "--metrics-addr", &metrics_addr])
            .args(["--leader-elect", "--leader-election-namespace", &ns])
            .env("KUBECONFIG", env.admin().path())
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .context("starting `banlieue controller`")?,
    );
    assert_ne!(
        child.0.id(),
        std::process::id(),
        "the controller is another process"
    );

    let vm: VirtualMachine = serde_json::from_value(json!({
        "apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine", "metadata": {"name": "proc"},
        "spec": {"providerRef": {"name": provider_name}, "source": {"proxmox": {"vmid": 9000}},
                 "cpu": {"cores": 1}, "memoryMiB": 1024},
    }))?;
    Api::<VirtualMachine>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &vm)
        .await?;
    let machines: Api<ProxmoxMachine> = Api::namespaced(client.clone(), &ns);
    let deadline = Instant::now() + WAIT;
    let pm = loop {
        if let Some(pm) = machines.get_opt("proc").await? {
            break pm;
        }
        if let Some(status) = child.0.try_wait()? {
            bail!("the controller exited early: {status}");
        }
        if Instant::now() > deadline {
            bail!("no ProxmoxMachine after {WAIT:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(pm.spec.memory_mib, 1024);
    // The counter moves just after the apply returns: poll briefly.
    let wanted = "banlieue_controller_writes_total{target=\"infrastructure_machine\"} 1\n";
    let deadline = Instant::now() + Duration::from_secs(5);
    let metrics = loop {
        let metrics = http_get(&metrics_addr, "/metrics")?;
        if metrics.contains(wanted) || Instant::now() > deadline {
            break metrics;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(metrics.starts_with("HTTP/1.1 200"), "{metrics}");
    assert!(metrics.contains(wanted), "{metrics}");
    assert!(
        metrics
            .contains("controller_runtime_reconcile_total{controller=\"virtualmachine\",result=\"success\"}")
    );
    assert!(http_get(&metrics_addr, "/healthz")?.starts_with("HTTP/1.1 200"));
    assert!(http_get(&metrics_addr, "/readyz")?.starts_with("HTTP/1.1 200"));
    let lease = Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(client.clone(), &ns)
        .get("banlieue-controller")
        .await
        .context("the leader-election Lease")?;
    let holder = lease.spec.and_then(|s| s.holder_identity).unwrap_or_default();
    assert!(holder.starts_with("banlieue-controller-"), "holder {holder:?}");

    let status = Command::new("kill")
        .args(["-TERM", &child.0.id().to_string()])
        .status()
        .context("sending SIGTERM")?;
    assert!(status.success());
    let deadline = Instant::now() + WAIT;
    let exit = loop {
        if let Some(exit) = child.0.try_wait()? {
            break exit;
        }
        if Instant::now() > deadline {
            bail!("the controller did not stop within {WAIT:?} of SIGTERM");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(exit.success(), "the controller exits 0 on SIGTERM, got {exit}");
    let lease = Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(client.clone(), &ns)
        .get("banlieue-controller")
        .await?;
    assert_eq!(
        lease.spec.and_then(|s| s.holder_identity),
        None,
        "a clean shutdown releases the Lease"
    );
    Api::<Provider>::all(client)
        .delete(&provider_name, &DeleteParams::default())
        .await?;
    Ok(())
}
