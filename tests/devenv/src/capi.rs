//! Cluster API's own managers in the local environment (`banlieue-dev --capi`).
//!
//! CAPI's core, kubeadm bootstrap and kubeadm control-plane managers (built from CAPI's Go
//! module by `tests/controlplane/build.sh --capi`) run as processes beside the control plane, with
//! the `ClusterTopology` feature gate on (ClusterClass and managed topologies). Their admission
//! webhooks are registered too: each manager serves them on a loopback port with a certificate
//! from the control plane's CA, and CAPI's own webhook configurations (`api/capi/webhooks/`) are
//! registered pointing at that port, so `kubectl apply` of a generated cluster is defaulted and
//! validated as on a real management cluster.

use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use banlieue_capi::webhooks::Manager;
use banlieue_testenv::{ManagedProcess, TestEnv, free_port};
use base64::Engine;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};

/// The feature gates every CAPI manager gets: ClusterClass and managed topologies on.
pub const FEATURE_GATES: &str = "ClusterTopology=true";

/// How long a manager gets to start serving its webhooks.
const SERVING_TIMEOUT: Duration = Duration::from_secs(60);

/// Starts of a manager whose free ports were taken by someone else in the meantime.
const START_ATTEMPTS: u32 = 3;

/// The file, beside the kubeconfig, of the variables `clusterctl generate cluster` needs for the
/// simulator (a shell script of `export`s).
pub const ENV_FILE: &str = "capi.env";

/// The VMID of the simulator's template (see `banlieue_pve_sim::TemplateSpec::ubuntu`).
pub const SIM_TEMPLATE_VMID: u32 = 9000;

/// The `export`s a user sources before `clusterctl generate cluster … --infrastructure
/// banlieue-proxmox`: the kubeconfig, the simulator's URL, certificate fingerprint, template and
/// credentials Secret (the one the environment registered), and a control-plane endpoint on
/// loopback on which nothing listens (the simulated guests run no Kubernetes, so nothing would).
pub fn clusterctl_variables(kubeconfig: &Path, sim: &banlieue_pve_sim::SimHandle) -> anyhow::Result<String> {
    let endpoint_port = free_port(Ipv4Addr::LOCALHOST)?;
    let vars = [
        ("KUBECONFIG", kubeconfig.display().to_string()),
        ("PROXMOX_URL", sim.url()),
        ("PROXMOX_TLS_FINGERPRINT", sim.fingerprint_sha256()),
        ("PROXMOX_TEMPLATE_VMID", SIM_TEMPLATE_VMID.to_string()),
        ("PROXMOX_CREDENTIALS_SECRET", crate::PROVIDER_NAME.to_owned()),
        (
            "PROXMOX_CREDENTIALS_NAMESPACE",
            crate::SYSTEM_NAMESPACE.to_owned(),
        ),
        ("CONTROL_PLANE_ENDPOINT_IP", Ipv4Addr::LOCALHOST.to_string()),
        ("CONTROL_PLANE_ENDPOINT_PORT", endpoint_port.to_string()),
        ("CONTROL_PLANE_MACHINE_COUNT", "1".to_owned()),
        ("WORKER_MACHINE_COUNT", "1".to_owned()),
    ];
    let mut text = String::from(
        "# Written by banlieue-dev --capi: what `clusterctl generate cluster --infrastructure \
         banlieue-proxmox` needs for\n# the Proxmox VE simulator of this environment (README \
         \"Trying Cluster API locally\"). Source it.\n",
    );
    for (name, value) in vars {
        ensure!(
            !value.contains('\''),
            "{name} has a quote, which capi.env cannot hold: {value}"
        );
        text.push_str(&format!("export {name}='{value}'\n"));
    }
    Ok(text)
}

/// The binary of `manager` in the control plane's bin folder.
pub fn binary_name(manager: Manager) -> &'static str {
    match manager {
        Manager::Core => "capi-manager",
        Manager::KubeadmBootstrap => "capi-kubeadm-bootstrap-manager",
        Manager::KubeadmControlPlane => "capi-kubeadm-control-plane-manager",
    }
}

/// A running CAPI manager.
pub struct CapiManager {
    /// Which one.
    pub manager: Manager,
    /// Its process (stopped on drop).
    pub process: ManagedProcess,
    /// The loopback port of its webhook server.
    pub webhook_port: u16,
}

/// Starts CAPI's three managers on `env` (logs in `logs/<binary>.log`, earlier starts' kept)
/// and, when `register_webhooks`, registers each one's admission webhooks once it serves them.
pub async fn start_all(
    env: &TestEnv,
    logs: &Path,
    register_webhooks: bool,
    progress: impl Fn(&str),
) -> anyhow::Result<Vec<CapiManager>> {
    let client = env.client().await?;
    let ca = env.ca_pem()?;
    let mut managers = Vec::new();
    for manager in Manager::ALL {
        let name = binary_name(manager);
        progress(&format!(
            "starting {name} ({FEATURE_GATES}; log: {}/{name}.log)",
            logs.display()
        ));
        let running = start_manager(env, manager, logs).await?;
        if register_webhooks {
            let count = register(&client, manager, running.webhook_port, &ca).await?;
            progress(&format!(
                "registered {count} admission webhooks of {name} (https://127.0.0.1:{})",
                running.webhook_port
            ));
        }
        managers.push(running);
    }
    Ok(managers)
}

/// Starts `manager` with the admin kubeconfig of `env`, its webhook server on a free loopback
/// port with a certificate from the cluster CA, and waits until it serves. Ports are picked free
/// but bound a moment later (the webhook server listens on all addresses), so a manager that
/// stops on start-up with `address already in use` is started again with new ports.
pub async fn start_manager(env: &TestEnv, manager: Manager, logs: &Path) -> anyhow::Result<CapiManager> {
    let name = binary_name(manager);
    let binary = banlieue_testenv::bin_dir().join(name);
    ensure!(
        binary.is_file(),
        "{} is missing: build CAPI's managers with `tests/controlplane/build.sh --capi` \
         (`tests/dev.sh --capi` does)",
        binary.display()
    );
    let loopback = Ipv4Addr::LOCALHOST;
    let certs = env.workdir().join(format!("{name}-certs"));
    std::fs::create_dir_all(&certs).with_context(|| format!("creating {}", certs.display()))?;
    let pair = env.serving_certificate(&[IpAddr::V4(loopback)], &["localhost"])?;
    std::fs::write(certs.join("tls.crt"), &pair.cert_pem)?;
    std::fs::write(certs.join("tls.key"), &pair.key_pem)?;
    std::fs::create_dir_all(logs).with_context(|| format!("creating {}", logs.display()))?;
    let log = logs.join(format!("{name}.log"));
    for attempt in 1..=START_ATTEMPTS {
        crate::rotate_log(&log, crate::KEPT_LOGS)?;
        let webhook_port = free_port(loopback)?;
        let args = vec![
            format!("--kubeconfig={}", env.admin().path().display()),
            "--leader-elect=false".to_owned(),
            format!("--feature-gates={FEATURE_GATES}"),
            format!("--webhook-port={webhook_port}"),
            format!("--webhook-cert-dir={}", certs.display()),
            format!("--health-addr={loopback}:{}", free_port(loopback)?),
            "--diagnostics-address=0".to_owned(),
        ];
        let mut process = ManagedProcess::start(name, &binary, &args, &log)?;
        match wait_serving(&mut process).await {
            Ok(()) => {
                return Ok(CapiManager {
                    manager,
                    process,
                    webhook_port,
                });
            }
            Err(tail) if attempt < START_ATTEMPTS && tail.contains("address already in use") => {}
            Err(tail) => bail!(
                "{name} did not start serving its webhooks (log {}):\n{tail}",
                log.display()
            ),
        }
    }
    unreachable!("the last attempt returns")
}

/// Waits until the manager logs that its webhook server serves; the log's tail when it stops
/// or does not within [`SERVING_TIMEOUT`].
async fn wait_serving(process: &mut ManagedProcess) -> Result<(), String> {
    let deadline = Instant::now() + SERVING_TIMEOUT;
    loop {
        if process.check_running().is_err() {
            return Err(process.log_tail(10));
        }
        if process.log_tail(400).contains("Serving webhook server") {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!(
                "not serving after {}s:\n{}",
                SERVING_TIMEOUT.as_secs(),
                process.log_tail(10)
            ));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Registers `manager`'s webhook configurations, served at `https://127.0.0.1:<port>`, trusting
/// `ca_pem` (server-side apply: starting again replaces the port). Returns how many webhooks.
pub async fn register(
    client: &kube::Client,
    manager: Manager,
    port: u16,
    ca_pem: &str,
) -> anyhow::Result<usize> {
    let apply = PatchParams::apply(crate::FIELD_MANAGER).force();
    let mut count = 0;
    for doc in webhook_configurations(manager, port, ca_pem)? {
        let name = doc["metadata"]["name"].as_str().unwrap_or_default().to_owned();
        count += doc["webhooks"].as_array().map_or(0, Vec::len);
        let context = || format!("registering {name}");
        match doc["kind"].as_str() {
            Some("MutatingWebhookConfiguration") => {
                let typed: MutatingWebhookConfiguration =
                    serde_json::from_value(doc).with_context(context)?;
                Api::<MutatingWebhookConfiguration>::all(client.clone())
                    .patch(&name, &apply, &Patch::Apply(&typed))
                    .await
                    .with_context(context)?;
            }
            Some("ValidatingWebhookConfiguration") => {
                let typed: ValidatingWebhookConfiguration =
                    serde_json::from_value(doc).with_context(context)?;
                Api::<ValidatingWebhookConfiguration>::all(client.clone())
                    .patch(&name, &apply, &Patch::Apply(&typed))
                    .await
                    .with_context(context)?;
            }
            other => bail!(
                "{name}: unexpected kind {other:?} in {}",
                banlieue_capi::webhooks::file(manager).display()
            ),
        }
    }
    Ok(count)
}

/// CAPI's webhook configurations of `manager` as this environment registers them: named as
/// CAPI's releases name them (`capi-…`), every webhook's Service replaced by
/// `https://127.0.0.1:<port><its path>` with `ca_pem` as the CA bundle.
pub fn webhook_configurations(manager: Manager, port: u16, ca_pem: &str) -> anyhow::Result<Vec<Value>> {
    let path = banlieue_capi::webhooks::file(manager);
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let ca_bundle = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    let mut docs = Vec::new();
    for document in serde_yaml::Deserializer::from_str(&text) {
        let mut doc: Value = serde::Deserialize::deserialize(document)
            .with_context(|| format!("parsing {}", path.display()))?;
        if doc.is_null() {
            continue;
        }
        let name = doc["metadata"]["name"]
            .as_str()
            .with_context(|| format!("{}: a configuration without a name", path.display()))?
            .to_owned();
        doc["metadata"] = json!({"name": format!("{}-{name}", manager.name_prefix())});
        let Some(webhooks) = doc["webhooks"].as_array_mut() else {
            bail!("{}: {name} has no webhooks", path.display());
        };
        for webhook in webhooks {
            let service_path = webhook["clientConfig"]["service"]["path"]
                .as_str()
                .with_context(|| format!("{}: a webhook of {name} without a service path", path.display()))?
                .to_owned();
            webhook["clientConfig"] = json!({
                "url": format!("https://127.0.0.1:{port}{service_path}"),
                "caBundle": ca_bundle,
            });
        }
        docs.push(doc);
    }
    Ok(docs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_webhook_points_at_the_loopback_port_with_the_ca() {
        let docs = webhook_configurations(Manager::Core, 9443, "PEM").unwrap();
        let names: Vec<&str> = docs
            .iter()
            .filter_map(|d| d["metadata"]["name"].as_str())
            .collect();
        assert_eq!(
            names,
            [
                "capi-mutating-webhook-configuration",
                "capi-validating-webhook-configuration"
            ]
        );
        let mut paths = Vec::new();
        for doc in &docs {
            for webhook in doc["webhooks"].as_array().unwrap() {
                let config = &webhook["clientConfig"];
                assert!(config.get("service").is_none(), "{config}");
                assert_eq!(config["caBundle"], "UEVN");
                let url = config["url"].as_str().unwrap();
                paths.push(url.strip_prefix("https://127.0.0.1:9443/").unwrap().to_owned());
            }
        }
        assert!(paths.contains(&"mutate-cluster-x-k8s-io-v1beta2-machinedeployment".to_owned()));
        assert!(paths.contains(&"validate-cluster-x-k8s-io-v1beta2-clusterclass".to_owned()));
        let typed: Vec<MutatingWebhookConfiguration> = docs
            .iter()
            .filter(|d| d["kind"] == "MutatingWebhookConfiguration")
            .map(|d| serde_json::from_value(d.clone()).unwrap())
            .collect();
        assert_eq!(typed.len(), 1);
    }

    #[test]
    fn the_kubeadm_managers_get_their_release_names() {
        for (manager, prefix) in [
            (Manager::KubeadmBootstrap, "capi-kubeadm-bootstrap-"),
            (Manager::KubeadmControlPlane, "capi-kubeadm-control-plane-"),
        ] {
            let docs = webhook_configurations(manager, 1, "x").unwrap();
            assert!(!docs.is_empty());
            for doc in docs {
                assert!(
                    doc["metadata"]["name"].as_str().unwrap().starts_with(prefix),
                    "{doc}"
                );
            }
        }
    }
}
