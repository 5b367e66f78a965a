//! Scenario tests: the controllers on a real kube-apiserver (banlieue-testenv) against a real
//! vcsim, in standalone mode (a banlieue Provider + the VSphereCluster the banlieue controller
//! would create, a VirtualMachine owning the VSphereMachine). Each test has its own namespace,
//! Provider, vcsim and controllers (watching only that namespace).

#[path = "../../client/tests/support/vcsim.rs"]
mod vcsim_support;

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result, bail, ensure};
use banlieue_api::banlieue::{Provider, VirtualMachine};
use banlieue_api::infrastructure::{VSphereCluster, VSphereMachine};
use banlieue_api::standalone::infra_cluster_name;
use banlieue_testenv::TestEnv;
use banlieue_vsphere::machine_controller::Context;
use banlieue_vsphere::provision::OWNER_KEY;
use banlieue_vsphere::{cluster_controller, machine_controller};
use banlieue_vsphere_client::vim::ConfigSpec;
use banlieue_vsphere_client::{Client, ClientBuilder, MoRef, TlsVerification, VmPowerState};
use base64::Engine as _;
use k8s_openapi::api::core::v1::{Event, Secret};
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use vcsim_support::{PASSWORD, USER, Vcsim};

const TIMEOUT: Duration = Duration::from_secs(90);
const TEMPLATE: &str = "DC0_C0_RP0_VM0";

async fn env() -> Result<&'static TestEnv> {
    Ok(TestEnv::shared_with(|b| b.crds(banlieue_api::crds::all())).await?)
}

fn sim_client(sim: &Vcsim) -> Result<Client> {
    Ok(ClientBuilder::new(&sim.url, USER, PASSWORD)
        .tls(TlsVerification::CaBundle(sim.ca_pem.clone()))
        .build()?)
}

async fn make_template(c: &Client) -> Result<()> {
    let vm = c
        .find_by_inventory_path(&format!("/DC0/vm/{TEMPLATE}"))
        .await?
        .context("no model VM")?;
    let t = c.power_off(&vm).await?;
    c.wait_task(&t, Duration::from_millis(100), TIMEOUT).await?;
    c.mark_as_template(&vm).await?;
    Ok(())
}

/// A namespace with a credentials Secret, a Provider (pinned thumbprint) and its standalone
/// VSphereCluster, and the controllers running for that namespace.
struct Scenario {
    kube: kube::Client,
    ns: String,
    _ns_guard: banlieue_testenv::TestNamespace,
    provider: String,
    controllers: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Scenario {
    fn drop(&mut self) {
        for c in &self.controllers {
            c.abort();
        }
    }
}

async fn scenario(sim: &Vcsim, prefix: &str, password: &str) -> Result<Scenario> {
    let env = env().await?;
    let ns_guard = env.namespace(prefix).await?;
    let ns = ns_guard.to_string();
    let kube = env.client().await?;
    let provider = format!("{ns}-vc");
    let secrets: Api<Secret> = Api::namespaced(kube.clone(), &ns);
    secrets
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "vc-creds"},
                "stringData": {"username": USER, "password": password},
            }))?,
        )
        .await?;
    let providers: Api<Provider> = Api::all(kube.clone());
    let p = providers
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "banlieue.io/v1alpha1", "kind": "Provider",
                "metadata": {"name": provider},
                "spec": {
                    "backend": "vsphere",
                    "endpoint": sim.url,
                    "credentialsRef": {"name": "vc-creds", "namespace": ns},
                    "tls": {"sha256Fingerprint": sim.thumbprint},
                },
            }))?,
        )
        .await?;
    let clusters: Api<VSphereCluster> = Api::namespaced(kube.clone(), &ns);
    clusters
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "infrastructure.banlieue.io/v1alpha1", "kind": "VSphereCluster",
                "metadata": {
                    "name": infra_cluster_name(&provider),
                    "ownerReferences": [{
                        "apiVersion": "banlieue.io/v1alpha1", "kind": "Provider", "name": provider,
                        "uid": p.uid().unwrap_or_default(), "controller": true,
                    }],
                },
                "spec": {"providerRef": {"name": provider}, "datacenter": "DC0"},
            }))?,
        )
        .await?;
    let ctx = Arc::new(Context::new(kube.clone(), "banlieue-vsphere-test"));
    let controllers = vec![
        tokio::spawn({
            let (ctx, ns) = (ctx.clone(), ns.clone());
            async move { machine_controller::run(ctx, Some(&ns)).await }
        }),
        tokio::spawn({
            let ns = ns.clone();
            async move { cluster_controller::run(ctx, Some(&ns)).await }
        }),
    ];
    Ok(Scenario {
        kube,
        ns,
        _ns_guard: ns_guard,
        provider,
        controllers,
    })
}

impl Scenario {
    /// A VirtualMachine (with user data) and the VSphereMachine it owns.
    async fn machine(&self, name: &str, template: &str) -> Result<()> {
        let secrets: Api<Secret> = Api::namespaced(self.kube.clone(), &self.ns);
        secrets
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({
                    "metadata": {"name": format!("{name}-user-data")},
                    "stringData": {"value": format!("#cloud-config\nhostname: {name}\n")},
                }))?,
            )
            .await?;
        let vms: Api<VirtualMachine> = Api::namespaced(self.kube.clone(), &self.ns);
        let bvm = vms
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({
                    "apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine",
                    "metadata": {"name": name},
                    "spec": {
                        "providerRef": {"name": self.provider},
                        "source": {"vsphere": {"template": template}},
                        "cpu": {"cores": 2},
                        "memoryMiB": 2048,
                        "userDataSecretRef": {"name": format!("{name}-user-data")},
                    },
                }))?,
            )
            .await?;
        let machines: Api<VSphereMachine> = Api::namespaced(self.kube.clone(), &self.ns);
        machines
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({
                    "apiVersion": "infrastructure.banlieue.io/v1alpha1", "kind": "VSphereMachine",
                    "metadata": {
                        "name": name,
                        "ownerReferences": [{
                            "apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine", "name": name,
                            "uid": bvm.uid().unwrap_or_default(), "controller": true,
                        }],
                    },
                    "spec": {
                        "providerRef": {"name": self.provider},
                        "source": {"template": template},
                        "resourcePool": "DC0_C0/Resources",
                        "datastore": "LocalDS_0",
                        "cpu": {"cores": 2},
                        "memoryMiB": 2048,
                    },
                }))?,
            )
            .await?;
        Ok(())
    }

    fn machines(&self) -> Api<VSphereMachine> {
        Api::namespaced(self.kube.clone(), &self.ns)
    }

    /// Polls the machine until `done` says so.
    async fn wait_machine(
        &self,
        name: &str,
        what: &str,
        done: impl Fn(&VSphereMachine) -> bool,
    ) -> Result<VSphereMachine> {
        let deadline = tokio::time::Instant::now() + TIMEOUT;
        loop {
            let m = self.machines().get(name).await?;
            if done(&m) {
                return Ok(m);
            }
            if tokio::time::Instant::now() > deadline {
                bail!("timed out waiting for {what}; last status: {:?}", m.status);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    async fn events(&self, name: &str) -> Result<Vec<String>> {
        let events: Api<Event> = Api::namespaced(self.kube.clone(), &self.ns);
        Ok(events
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .filter(|e| e.involved_object.name.as_deref() == Some(name))
            .filter_map(|e| e.reason)
            .collect())
    }
}

fn ready(m: &VSphereMachine) -> Option<(String, String, String)> {
    let c = m
        .status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready")?;
    Some((c.status.clone(), c.reason.clone(), c.message.clone()))
}

fn state(m: &VSphereMachine) -> Option<String> {
    Some(
        m.status
            .as_ref()?
            .provisioning
            .as_ref()?
            .state
            .as_str()
            .to_owned(),
    )
}

#[tokio::test]
async fn provisions_a_machine_and_deletes_its_vm() -> Result<()> {
    let sim = Vcsim::start(&[])?;
    let vc = sim_client(&sim)?;
    make_template(&vc).await?;
    let s = scenario(&sim, "vs-provision", PASSWORD).await?;
    s.machine("web-1", TEMPLATE).await?;

    // The clone ran: the VM exists, carries the machine's UID and user data, and waits for an IP.
    let m = s
        .wait_machine("web-1", "WaitingForGuest", |m| {
            state(m).as_deref() == Some("WaitingForGuest")
        })
        .await?;
    let vm = MoRef::new(
        "VirtualMachine",
        m.status
            .as_ref()
            .and_then(|s| s.vm_ref.clone())
            .context("no vmRef")?,
    );
    let info = vc.vm_info(&vm).await?.context("VM not in vcsim")?;
    ensure!(info.extra_config.get(OWNER_KEY) == m.uid().as_ref(), "{info:?}");
    let user_data = base64::engine::general_purpose::STANDARD.decode(
        info.extra_config
            .get("guestinfo.userdata")
            .context("no guestinfo.userdata")?,
    )?;
    ensure!(user_data == b"#cloud-config\nhostname: web-1\n");
    ensure!(info.power_state == Some(VmPowerState::PoweredOn), "{info:?}");
    ensure!(
        info.num_cpu == Some(2) && info.memory_mb == Some(2048),
        "{info:?}"
    );
    let (status, reason, _) = ready(&m).context("no Ready")?;
    ensure!(status == "False" && reason == "WaitingForGuest", "{reason}");

    // VMware Tools reports an IP (vcsim: through extraConfig).
    let set_ip = ConfigSpec {
        extra_config: vec![("SET.guest.ipAddress".into(), "192.0.2.15".into())],
        ..ConfigSpec::default()
    };
    vc.wait_task(
        &vc.reconfigure(&vm, &set_ip).await?,
        Duration::from_millis(100),
        TIMEOUT,
    )
    .await?;
    let m = s
        .wait_machine("web-1", "Ready", |m| ready(m).is_some_and(|r| r.0 == "True"))
        .await?;
    let st = m.status.clone().unwrap_or_default();
    ensure!(
        m.spec.provider_id == info.bios_uuid.as_ref().map(|u| format!("vsphere://{u}")),
        "{:?}",
        m.spec.provider_id
    );
    ensure!(st.initialization.and_then(|i| i.provisioned) == Some(true));
    ensure!(
        st.addresses.iter().any(|a| a.address == "192.0.2.15"),
        "{:?}",
        st.addresses
    );
    ensure!(st.node.is_some(), "no node");
    ensure!(st.observed_generation == m.metadata.generation);
    let events = s.events("web-1").await?;
    ensure!(
        events.iter().any(|e| e == "CloneStarted") && events.iter().any(|e| e == "Provisioned"),
        "{events:?}"
    );

    // Deletion powers off and destroys the VM, then releases the object.
    s.machines().delete("web-1", &DeleteParams::default()).await?;
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    while s.machines().get_opt("web-1").await?.is_some() {
        ensure!(
            tokio::time::Instant::now() < deadline,
            "VSphereMachine not released"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    ensure!(vc.vm_info(&vm).await?.is_none(), "VM still in vcsim");
    Ok(())
}

#[tokio::test]
async fn a_missing_template_is_a_clear_condition() -> Result<()> {
    let sim = Vcsim::start(&[])?;
    let s = scenario(&sim, "vs-template", PASSWORD).await?;
    s.machine("bad-1", "no-such-template").await?;
    let m = s
        .wait_machine("bad-1", "TemplateNotFound", |m| {
            ready(m).is_some_and(|r| r.1 == "TemplateNotFound")
        })
        .await?;
    let (status, _, message) = ready(&m).context("no Ready")?;
    ensure!(status == "False");
    ensure!(message.contains("/DC0/vm/no-such-template"), "{message}");
    ensure!(s.events("bad-1").await?.iter().any(|e| e == "TemplateNotFound"));
    Ok(())
}

#[tokio::test]
async fn wrong_credentials_are_a_clear_condition() -> Result<()> {
    let sim = Vcsim::start(&[])?;
    let s = scenario(&sim, "vs-creds", "wrong-password").await?;
    s.machine("m-1", TEMPLATE).await?;
    let clusters: Api<VSphereCluster> = Api::namespaced(s.kube.clone(), &s.ns);
    let name = infra_cluster_name(&s.provider);
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    let cond = loop {
        let c = clusters.get(&name).await?;
        if let Some(cond) = c
            .status
            .as_ref()
            .and_then(|st| st.conditions.iter().find(|c| c.type_ == "Ready"))
        {
            break cond.clone();
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "no Ready condition on the VSphereCluster"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    ensure!(
        cond.status == "False" && cond.reason == "AuthenticationFailed",
        "{cond:?}"
    );
    ensure!(
        !cond.message.contains("wrong-password"),
        "password leaked: {}",
        cond.message
    );
    let m = s
        .wait_machine("m-1", "WaitingForClusterInfrastructure", |m| {
            ready(m).is_some_and(|r| r.1 == "WaitingForClusterInfrastructure")
        })
        .await?;
    ensure!(m.status.and_then(|s| s.vm_ref).is_none(), "a VM was cloned");
    Ok(())
}
