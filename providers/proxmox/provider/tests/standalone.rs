//! Standalone mode on the real apiserver (banlieue's CRDs only: Cluster API is NOT installed)
//! with the wire-level Proxmox VE simulator and the real client: a ProxmoxCluster owned by a
//! banlieue `Provider` (as the banlieue controller creates it) and a ProxmoxMachine controlled
//! by a `VirtualMachine` (created here directly; the banlieue controller does not run).
//!
//! Run: `cargo test -p banlieue-proxmox --test standalone` (needs `tests/controlplane/build.sh`).

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use banlieue_api::banlieue::{
    Backend, ImageSource, Provider, ProviderSpec, VirtualMachine, VirtualMachineSpec,
};
use banlieue_api::common::{
    Cpu, PowerState, ProviderReference, SecretKeyReference, SecretReference, TlsTrust,
};
use banlieue_api::condition::VM_UP_TO_DATE;
use banlieue_api::infrastructure::{
    ProxmoxCluster, ProxmoxClusterSpec, ProxmoxMachine, ProxmoxMachineSpec, ProxmoxTemplateSource,
};
use banlieue_api::standalone::infra_cluster_name;
use banlieue_provider_kit::cluster::ClusterContext;
use banlieue_proxmox::cluster_controller::ProxmoxClusters;
use banlieue_proxmox::credentials::ClientConnector;
use banlieue_pve_sim::{SimConfig, SimHandle};
use banlieue_testenv::TestEnv;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Resource, ResourceExt};

const USER_DATA: &str =
    "#cloud-config\nusers:\n- name: ops\n  ssh_authorized_keys: [ssh-ed25519 AAAA ops@example]\n";
const TIMEOUT: Duration = Duration::from_secs(90);
const FINALIZER: &str = banlieue_api::common::Backend::Proxmox.finalizer();

async fn env() -> Result<&'static TestEnv> {
    // Deliberately without CAPI's core CRDs (clusters, machines): standalone mode must not need
    // them. CAPI's IPAM CRDs are there for machines with `mode: Pool` addresses, and the
    // OwnerReferencesPermissionEnforcement admission plugin is on, as in clusters that check
    // who may set `blockOwnerDeletion`.
    let mut crds = banlieue_api::crds::all();
    crds.extend(banlieue_testenv::crds_from_files([
        banlieue_capi::crds::file("ipam.cluster.x-k8s.io_ipaddressclaims.yaml"),
        banlieue_capi::crds::file("ipam.cluster.x-k8s.io_ipaddresses.yaml"),
    ])?);
    Ok(TestEnv::shared_with(|b| {
        b.crds(crds)
            .apiserver_arg("--enable-admission-plugins=OwnerReferencesPermissionEnforcement")
    })
    .await?)
}

/// A client for user `user` holding exactly the provider's ClusterRole rules
/// ([`banlieue_proxmox::rbac::CLUSTER_RULES`]) and nothing else.
async fn least_privilege_client(env: &TestEnv, user: &str) -> Result<kube::Client> {
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, RoleRef, Subject};
    let admin = env.client().await?;
    let meta = kube::api::ObjectMeta {
        name: Some(user.to_owned()),
        ..Default::default()
    };
    Api::<ClusterRole>::all(admin.clone())
        .create(
            &PostParams::default(),
            &ClusterRole {
                metadata: meta.clone(),
                rules: Some(banlieue_proxmox::rbac::policy_rules(
                    banlieue_proxmox::rbac::CLUSTER_RULES,
                )),
                ..Default::default()
            },
        )
        .await?;
    Api::<ClusterRoleBinding>::all(admin)
        .create(
            &PostParams::default(),
            &ClusterRoleBinding {
                metadata: meta,
                role_ref: RoleRef {
                    api_group: Some("rbac.authorization.k8s.io".into()),
                    kind: "ClusterRole".into(),
                    name: user.to_owned(),
                },
                subjects: Some(vec![Subject {
                    kind: "User".into(),
                    api_group: Some("rbac.authorization.k8s.io".into()),
                    name: user.to_owned(),
                    namespace: None,
                }]),
            },
        )
        .await?;
    Ok(env.user_kubeconfig(user, &[])?.client().await?)
}

fn owner_ref<K: Resource<DynamicType = ()>>(obj: &K) -> Result<OwnerReference> {
    Ok(OwnerReference {
        api_version: K::api_version(&()).into_owned(),
        kind: K::kind(&()).into_owned(),
        name: obj.meta().name.clone().context("name")?,
        uid: obj.meta().uid.clone().context("uid")?,
        controller: Some(true),
        block_owner_deletion: Some(true),
    })
}

struct Standalone {
    client: kube::Client,
    /// The identity the provider's controllers run as (`client` unless restricted).
    controller_client: kube::Client,
    ns: String,
    provider: String,
    sim: SimHandle,
    controllers: Vec<tokio::task::JoinHandle<()>>,
}

impl Standalone {
    /// The simulator, its credentials Secret, the Provider, the Provider-owned ProxmoxCluster
    /// (what the banlieue controller would apply) and both provider controllers.
    async fn start(prefix: &str) -> Result<(Self, banlieue_testenv::TestNamespace)> {
        Self::start_as(prefix, false).await
    }

    /// [`Self::start`]; with `least_privilege` the controllers run as a user holding only the
    /// provider's generated ClusterRole rules.
    async fn start_as(
        prefix: &str,
        least_privilege: bool,
    ) -> Result<(Self, banlieue_testenv::TestNamespace)> {
        let env = env().await?;
        let ns = env.namespace(prefix).await?;
        let client = env.client().await?;
        let sim = banlieue_pve_sim::start(SimConfig::fast()).await?;
        let secrets: Api<Secret> = Api::namespaced(client.clone(), ns.name());
        secrets
            .create(
                &PostParams::default(),
                &Secret {
                    metadata: kube::api::ObjectMeta {
                        name: Some("pve-sim".into()),
                        ..Default::default()
                    },
                    string_data: Some(
                        [
                            ("tokenID".to_owned(), sim.token_id()),
                            ("secret".to_owned(), sim.token_secret()),
                        ]
                        .into(),
                    ),
                    ..Default::default()
                },
            )
            .await?;
        let provider_name = format!("sim-{}", ns.name());
        let provider = Api::<Provider>::all(client.clone())
            .create(
                &PostParams::default(),
                &Provider::new(
                    &provider_name,
                    ProviderSpec {
                        backend: Backend::Proxmox,
                        endpoint: sim.url(),
                        credentials_ref: Some(SecretReference {
                            name: "pve-sim".into(),
                            namespace: Some(ns.name().to_owned()),
                        }),
                        tls: Some(TlsTrust {
                            sha256_fingerprint: Some(sim.fingerprint_sha256()),
                            ..Default::default()
                        }),
                        nodes: vec!["pve1".into(), "pve2".into()],
                        ..Default::default()
                    },
                ),
            )
            .await?;
        let mut pxc = ProxmoxCluster::new(
            &infra_cluster_name(&provider_name),
            ProxmoxClusterSpec {
                provider_ref: Some(ProviderReference {
                    name: provider_name.clone(),
                }),
                ..Default::default()
            },
        );
        pxc.metadata.owner_references = Some(vec![owner_ref(&provider)?]);
        Api::<ProxmoxCluster>::namespaced(client.clone(), ns.name())
            .create(&PostParams::default(), &pxc)
            .await?;
        let controller_client = if least_privilege {
            least_privilege_client(env, &format!("banlieue-proxmox-{}", ns.name())).await?
        } else {
            client.clone()
        };
        let mut s = Self {
            client,
            controller_client,
            ns: ns.name().to_owned(),
            provider: provider_name,
            sim,
            controllers: Vec::new(),
        };
        s.start_controllers();
        Ok((s, ns))
    }

    fn start_controllers(&mut self) {
        let provider = banlieue_proxmox::provider("banlieue-proxmox-test", "local");
        let spawned = provider.spawn(self.controller_client.clone(), &self.ns, (4, 2));
        self.controllers.extend(spawned.tasks);
    }

    fn api<K>(&self) -> Api<K>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
    {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    /// A VirtualMachine (as a user writes it) and its ProxmoxMachine (as the banlieue
    /// controller would create it: controlled by the VM, `spec.providerRef` set).
    async fn virtual_machine(&self, name: &str, user_data: Option<&str>) -> Result<()> {
        self.virtual_machine_powered(name, user_data, None).await
    }

    /// [`Self::virtual_machine`] with `spec.powerState` set on both objects.
    async fn virtual_machine_powered(
        &self,
        name: &str,
        user_data: Option<&str>,
        power_state: Option<PowerState>,
    ) -> Result<()> {
        self.virtual_machine_with(name, user_data, power_state, |_| {})
            .await
    }

    /// [`Self::virtual_machine_powered`], with `edit` applied to the ProxmoxMachine's spec.
    async fn virtual_machine_with(
        &self,
        name: &str,
        user_data: Option<&str>,
        power_state: Option<PowerState>,
        edit: impl FnOnce(&mut ProxmoxMachineSpec),
    ) -> Result<()> {
        if let Some(data) = user_data {
            self.user_data_secret(name, data).await?;
        }
        self.create_virtual_machine(name, user_data.is_some(), power_state, edit)
            .await
    }

    /// The Secret `<name>-user-data` (key `userdata`) a VirtualMachine `name` refers to.
    async fn user_data_secret(&self, name: &str, data: &str) -> Result<()> {
        self.api::<Secret>()
            .create(
                &PostParams::default(),
                &Secret {
                    metadata: kube::api::ObjectMeta {
                        name: Some(format!("{name}-user-data")),
                        ..Default::default()
                    },
                    string_data: Some([("userdata".to_owned(), data.to_owned())].into()),
                    ..Default::default()
                },
            )
            .await?;
        Ok(())
    }

    /// The VirtualMachine and its ProxmoxMachine; with `user_data`, the VM refers to
    /// [`Self::user_data_secret`] (whether or not it exists).
    async fn create_virtual_machine(
        &self,
        name: &str,
        user_data: bool,
        power_state: Option<PowerState>,
        edit: impl FnOnce(&mut ProxmoxMachineSpec),
    ) -> Result<()> {
        let user_data_secret_ref = user_data.then(|| SecretKeyReference {
            name: format!("{name}-user-data"),
            key: Some("userdata".into()),
        });
        let source = ProxmoxTemplateSource {
            vmid: Some(9000),
            ..Default::default()
        };
        let vm = self
            .api::<VirtualMachine>()
            .create(
                &PostParams::default(),
                &VirtualMachine::new(
                    name,
                    VirtualMachineSpec {
                        provider_ref: Some(ProviderReference {
                            name: self.provider.clone(),
                        }),
                        source: Some(ImageSource {
                            proxmox: Some(source.clone()),
                            ..Default::default()
                        }),
                        cpu: Some(Cpu::cores(2)),
                        memory_mib: Some(2048),
                        user_data_secret_ref,
                        power_state,
                        ..Default::default()
                    },
                ),
            )
            .await?;
        let mut spec = ProxmoxMachineSpec {
            power_state,
            ..machine_spec(&self.provider, source)
        };
        edit(&mut spec);
        let mut pm = ProxmoxMachine::new(name, spec);
        pm.metadata.owner_references = Some(vec![owner_ref(&vm)?]);
        self.api::<ProxmoxMachine>()
            .create(&PostParams::default(), &pm)
            .await?;
        Ok(())
    }

    async fn wait_for(
        &self,
        name: &str,
        what: &str,
        check: impl Fn(&ProxmoxMachine) -> bool,
    ) -> Result<ProxmoxMachine> {
        let deadline = tokio::time::Instant::now() + TIMEOUT;
        loop {
            if let Some(pm) = self.api::<ProxmoxMachine>().get_opt(name).await?
                && check(&pm)
            {
                return Ok(pm);
            }
            if tokio::time::Instant::now() > deadline {
                let pm = self.api::<ProxmoxMachine>().get_opt(name).await?;
                bail!(
                    "timed out waiting for {name} to be {what}: {:#?}",
                    pm.map(|p| p.status)
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn patch_spec(&self, name: &str, spec: serde_json::Value) -> Result<i64> {
        let pm = self
            .api::<ProxmoxMachine>()
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(&serde_json::json!({ "spec": spec })),
            )
            .await?;
        pm.metadata.generation.context("generation")
    }
}

fn machine_spec(provider: &str, source: ProxmoxTemplateSource) -> ProxmoxMachineSpec {
    ProxmoxMachineSpec {
        provider_ref: Some(ProviderReference {
            name: provider.to_owned(),
        }),
        ..ProxmoxMachineSpec::new(source, Cpu::cores(2), 2048)
    }
}

fn condition<'a>(pm: &'a ProxmoxMachine, type_: &str) -> Option<&'a banlieue_api::condition::Condition> {
    pm.status
        .as_ref()
        .and_then(|s| banlieue_api::condition::find(&s.conditions, type_))
}

fn provisioned(pm: &ProxmoxMachine) -> bool {
    pm.status
        .as_ref()
        .and_then(|s| s.initialization.as_ref())
        .and_then(|i| i.provisioned)
        .unwrap_or(false)
        && pm.spec.provider_id.is_some()
        && pm.status.as_ref().is_some_and(|s| s.addresses.len() >= 2)
}

/// Up to date with generation `g`: the VM matches the spec the user last wrote.
fn up_to_date(g: i64) -> impl Fn(&ProxmoxMachine) -> bool {
    move |pm| {
        pm.status.as_ref().and_then(|s| s.observed_generation) == Some(g)
            && condition(pm, VM_UP_TO_DATE).is_some_and(|c| c.status == "True")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_virtual_machine_is_provisioned_powered_resized_and_deleted_without_capi() -> Result<()> {
    let (s, _ns) = Standalone::start("pxm-standalone").await?;

    // A machine no VirtualMachine or CAPI Machine controls is left alone.
    let mut orphan = ProxmoxMachine::new(
        "orphan",
        machine_spec(
            &s.provider,
            ProxmoxTemplateSource {
                vmid: Some(9000),
                ..Default::default()
            },
        ),
    );
    orphan.metadata.labels = Some([("test".to_owned(), "orphan".to_owned())].into());
    s.api::<ProxmoxMachine>()
        .create(&PostParams::default(), &orphan)
        .await?;

    // The Provider-owned ProxmoxCluster is provisioned from the Provider's settings.
    let pxc_name = infra_cluster_name(&s.provider);
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    let pxc = loop {
        let pxc = s.api::<ProxmoxCluster>().get(&pxc_name).await?;
        if pxc
            .status
            .as_ref()
            .and_then(|st| st.initialization.as_ref())
            .and_then(|i| i.provisioned)
            == Some(true)
        {
            break pxc;
        }
        if tokio::time::Instant::now() > deadline {
            bail!(
                "the standalone ProxmoxCluster was not provisioned: {:#?}",
                pxc.status
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let status = pxc.status.clone().context("status")?;
    let domains: Vec<&str> = status.failure_domains.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(
        domains,
        ["pve1", "pve2"],
        "failure domains are the Provider's nodes"
    );
    assert!(pxc.finalizers().iter().any(|f| f == FINALIZER));
    // An Event for the cluster's Ready transition (published right after the status write).
    let events = Api::<k8s_openapi::api::events::v1::Event>::namespaced(s.client.clone(), &s.ns);
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    while !events.list(&Default::default()).await?.items.iter().any(|e| {
        e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(pxc_name.as_str())
            && e.reason.as_deref() == Some("Provisioned")
    }) {
        if tokio::time::Instant::now() > deadline {
            bail!("no Provisioned Event for the ProxmoxCluster");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Provisioned with providerID and addresses; the seed carried the VM's user data.
    s.virtual_machine("web", Some(USER_DATA)).await?;
    let pm = s.wait_for("web", "provisioned", provisioned).await?;
    let vmid = pm.status.as_ref().and_then(|st| st.vmid).context("vmid")?;
    let seed = s.sim.seed(vmid).context("the VM booted with a seed")?;
    assert_eq!(seed.user_data.as_deref(), Some(USER_DATA));
    assert!(seed.meta_data.unwrap_or_default().contains("web"));
    assert_eq!(
        pm.status.as_ref().and_then(|st| st.power_state),
        Some(PowerState::On)
    );
    assert!(pm.finalizers().iter().any(|f| f == FINALIZER));
    let node = pm
        .status
        .as_ref()
        .and_then(|st| st.node.clone())
        .context("node")?;
    assert!(
        ["pve1", "pve2"].contains(&node.as_str()),
        "placed on a Provider node: {node}"
    );

    // Power off.
    let g = s
        .patch_spec("web", serde_json::json!({"powerState": "Off"}))
        .await?;
    let pm = s
        .wait_for("web", "powered off", |pm| {
            up_to_date(g)(pm) && pm.status.as_ref().and_then(|st| st.power_state) == Some(PowerState::Off)
        })
        .await?;
    assert!(
        !s.sim.vm(vmid).context("vm")?.running,
        "the simulator VM is stopped"
    );
    assert_eq!(pm.status.as_ref().and_then(|st| st.vmid), Some(vmid), "same VM");
    // Still provisioned, but not Ready while off, and the message says why.
    assert!(provisioned(&pm), "stays provisioned");
    let ready = condition(&pm, "Ready").context("Ready")?;
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", "PoweredOff")
    );
    assert_eq!(
        ready.message,
        format!("VM {vmid} is powered off because spec.powerState is Off; set it to On to start the VM")
    );

    // Memory and CPU while off: applied, the VM stays off.
    let g = s
        .patch_spec("web", serde_json::json!({"memoryMiB": 3072, "cpu": {"cores": 3}}))
        .await?;
    s.wait_for("web", "reconfigured", up_to_date(g)).await?;
    let vm = s.sim.vm(vmid).context("vm")?;
    assert_eq!(vm.config.get("memory").map(String::as_str), Some("3072"));
    assert_eq!(vm.config.get("cores").map(String::as_str), Some("3"));
    assert!(!vm.running);

    // Power on and grow memory at once: applied, then started.
    let g = s
        .patch_spec("web", serde_json::json!({"powerState": "On", "memoryMiB": 4096}))
        .await?;
    s.wait_for("web", "running with 4 GiB", |pm| {
        up_to_date(g)(pm) && pm.status.as_ref().and_then(|st| st.power_state) == Some(PowerState::On)
    })
    .await?;
    let vm = s.sim.vm(vmid).context("vm")?;
    assert_eq!(vm.config.get("memory").map(String::as_str), Some("4096"));
    assert!(vm.running);
    s.wait_for("web", "Ready again", |pm| {
        condition(pm, "Ready").is_some_and(|c| c.status == "True" && c.reason == "Provisioned")
    })
    .await?;
    let vms: Vec<_> = s.sim.vms().into_iter().filter(|v| !v.template).collect();
    assert_eq!(vms.len(), 1, "reconfigured in place, never re-cloned");

    // The orphan was never touched.
    let orphan = s.api::<ProxmoxMachine>().get("orphan").await?;
    assert!(
        orphan.status.is_none(),
        "no status on a machine without a controlling owner"
    );
    assert!(orphan.finalizers().is_empty(), "no finalizer on it either");

    // The standalone ProxmoxCluster is deleted first (as in a namespace deletion): it stays
    // until its machines are gone, since they need its settings to delete their VMs.
    s.api::<ProxmoxCluster>()
        .delete(&pxc_name, &DeleteParams::default())
        .await?;
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    loop {
        let pxc = s.api::<ProxmoxCluster>().get(&pxc_name).await?;
        let ready = pxc
            .status
            .as_ref()
            .and_then(|st| banlieue_api::condition::find(&st.conditions, "Ready").cloned());
        if ready.as_ref().is_some_and(|r| r.reason == "WaitingForMachines") {
            assert!(ready.is_some_and(|r| r.message.contains("web")));
            break;
        }
        if tokio::time::Instant::now() > deadline {
            bail!(
                "the ProxmoxCluster did not wait for its machines: {:#?}",
                pxc.status
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Delete: the VM is gone from the simulator, then the machine, then the cluster.
    for name in ["web", "orphan"] {
        s.api::<ProxmoxMachine>()
            .delete(name, &DeleteParams::default())
            .await?;
    }
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    while s.api::<ProxmoxMachine>().get_opt("web").await?.is_some()
        || s.api::<ProxmoxCluster>().get_opt(&pxc_name).await?.is_some()
    {
        if tokio::time::Instant::now() > deadline {
            bail!("web or its ProxmoxCluster was not deleted");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(s.sim.vm(vmid).is_none(), "the VM is deleted on Proxmox");
    assert!(s.sim.vms().iter().all(|v| v.template), "nothing orphaned");

    for c in &s.controllers {
        c.abort();
    }
    Api::<Provider>::all(s.client.clone())
        .delete(&s.provider, &DeleteParams::default())
        .await?;
    s.sim.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_virtual_machine_without_user_data_gets_meta_data_and_network_config_only() -> Result<()> {
    let (s, _ns) = Standalone::start("pxm-nouserdata").await?;
    s.virtual_machine("plain", None).await?;
    let pm = s.wait_for("plain", "provisioned", provisioned).await?;
    let vmid = pm.status.as_ref().and_then(|st| st.vmid).context("vmid")?;
    let seed = s.sim.seed(vmid).context("seed")?;
    assert_eq!(
        seed.user_data.as_deref().unwrap_or_default(),
        "",
        "no user data (NoCloud needs the file to exist; it is empty)"
    );
    assert!(seed.meta_data.unwrap_or_default().contains("plain"));
    assert!(seed.network_config.is_some());
    for c in &s.controllers {
        c.abort();
    }
    Api::<Provider>::all(s.client.clone())
        .delete(&s.provider, &DeleteParams::default())
        .await?;
    s.sim.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_virtual_machine_created_powered_off_is_provisioned_without_booting() -> Result<()> {
    let (s, _ns) = Standalone::start("pxm-createdoff").await?;
    s.virtual_machine_powered("cold", Some(USER_DATA), Some(PowerState::Off))
        .await?;
    let pm = s
        .wait_for("cold", "provisioned powered off", |pm| {
            pm.spec.provider_id.is_some()
                && pm
                    .status
                    .as_ref()
                    .and_then(|st| st.initialization.as_ref())
                    .and_then(|i| i.provisioned)
                    == Some(true)
        })
        .await?;
    let status = pm.status.clone().context("status")?;
    let vmid = status.vmid.context("vmid")?;
    assert_eq!(status.power_state, Some(PowerState::Off));
    let hostname_only: Vec<&str> = status.addresses.iter().map(|a| a.address.as_str()).collect();
    assert_eq!(
        hostname_only,
        ["cold"],
        "DHCP and never booted: the hostname only"
    );
    let ready = condition(&pm, "Ready").context("Ready")?;
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", "PoweredOff")
    );
    assert!(
        ready.message.contains(&format!("VM {vmid} is powered off")),
        "{}",
        ready.message
    );
    assert!(!s.sim.vm(vmid).context("vm")?.running);
    assert!(
        !s.sim
            .tasks()
            .iter()
            .any(|t| t.kind == "qmstart" && t.id == vmid.to_string()),
        "the VM was never started"
    );
    // The seed waits attached for the first boot; starting the VM delivers the user data.
    let g = s
        .patch_spec("cold", serde_json::json!({"powerState": "On"}))
        .await?;
    let pm = s
        .wait_for("cold", "running and Ready", |pm| {
            up_to_date(g)(pm) && provisioned(pm) && condition(pm, "Ready").is_some_and(|c| c.status == "True")
        })
        .await?;
    let seed = s.sim.seed(vmid).context("the VM booted with a seed")?;
    assert_eq!(seed.user_data.as_deref(), Some(USER_DATA));
    assert_eq!(
        pm.status.as_ref().and_then(|st| st.power_state),
        Some(PowerState::On)
    );
    for c in &s.controllers {
        c.abort();
    }
    Api::<Provider>::all(s.client.clone())
        .delete(&s.provider, &DeleteParams::default())
        .await?;
    s.sim.shutdown().await;
    Ok(())
}

/// Least privilege for CAPI IPAM, on the real apiserver: both controllers run as a user holding
/// only [`banlieue_proxmox::rbac::CLUSTER_RULES`] (with OwnerReferencesPermissionEnforcement on);
/// a machine with a `mode: Pool` address claims it, waits for the (emulated) IPAM provider and
/// is provisioned with the address in its seed. A missing verb stalls it with a 403.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ipam_pool_address_is_claimed_under_the_generated_rbac() -> Result<()> {
    use banlieue_capi::IpAddressClaim;
    let (s, _ns) = Standalone::start_as("pxm-ipam-rbac", true).await?;
    s.virtual_machine_with("addr", None, None, |spec| {
        spec.networks = vec![
            serde_json::from_value(serde_json::json!({
                "name": "net0", "network": "vmbr0",
                "ipv4": {"mode": "Pool", "poolRef": {
                    "apiGroup": "ipam.cluster.x-k8s.io", "kind": "InClusterIPPool", "name": "nodes"}}
            }))
            .expect("network"),
        ];
    })
    .await?;
    let waiting = s
        .wait_for("addr", "waiting for its address", |pm| {
            condition(pm, "Ready").is_some_and(|c| c.reason == "WaitingForIPAddress")
        })
        .await?;
    let claim = s.api::<IpAddressClaim>().get("addr-net0-ipv4").await?;
    assert_eq!(claim.spec.pool_ref.name, "nodes");
    assert!(
        claim
            .owner_references()
            .iter()
            .any(|o| o.kind == "ProxmoxMachine" && Some(&o.uid) == waiting.uid().as_ref()),
        "owned by the machine"
    );
    // The IPAM provider answers (as the admin).
    banlieue_scenarios::fixture::allocate_address(
        &s.client,
        &s.ns,
        "addr-net0-ipv4",
        &serde_json::json!({"apiGroup": "ipam.cluster.x-k8s.io", "kind": "InClusterIPPool", "name": "nodes"}),
        ("10.10.0.7", 24, "10.10.0.1"),
    )
    .await?;
    let pm = s.wait_for("addr", "provisioned", provisioned).await?;
    let vmid = pm.status.as_ref().and_then(|st| st.vmid).context("vmid")?;
    let seed = s.sim.seed(vmid).context("seed")?;
    let network = seed.network_config.unwrap_or_default();
    assert!(network.contains("10.10.0.7/24"), "{network}");
    // Deleted under the same identity.
    s.api::<ProxmoxMachine>()
        .delete("addr", &DeleteParams::default())
        .await?;
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    while s.api::<ProxmoxMachine>().get_opt("addr").await?.is_some() {
        if tokio::time::Instant::now() > deadline {
            bail!("addr was not deleted");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(s.sim.vm(vmid).is_none(), "the VM is deleted on Proxmox");
    for c in &s.controllers {
        c.abort();
    }
    Api::<Provider>::all(s.client.clone())
        .delete(&s.provider, &DeleteParams::default())
        .await?;
    s.sim.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_of_another_backend_is_reported_on_the_cluster() -> Result<()> {
    let env = env().await?;
    let ns = env.namespace("pxm-mismatch").await?;
    let client = env.client().await?;
    let name = format!("lv-{}", ns.name());
    let provider = Api::<Provider>::all(client.clone())
        .create(
            &PostParams::default(),
            &Provider::new(
                &name,
                ProviderSpec {
                    backend: Backend::Libvirt,
                    endpoint: "qemu+ssh://root@host.invalid/system".into(),
                    ..Default::default()
                },
            ),
        )
        .await?;
    let mut pxc = ProxmoxCluster::new(
        &infra_cluster_name(&name),
        ProxmoxClusterSpec {
            provider_ref: Some(ProviderReference { name: name.clone() }),
            ..Default::default()
        },
    );
    pxc.metadata.owner_references = Some(vec![owner_ref(&provider)?]);
    let pxcs: Api<ProxmoxCluster> = Api::namespaced(client.clone(), ns.name());
    pxcs.create(&PostParams::default(), &pxc).await?;
    let clusters = ProxmoxClusters {
        connector: ClientConnector::default(),
    };
    let ctx = Arc::new(ClusterContext::new(
        client.clone(),
        clusters,
        "banlieue-proxmox-test",
    ));
    let ns_name = ns.name().to_owned();
    let controller = tokio::spawn(async move {
        banlieue_provider_kit::cluster::run(ctx, Some(&ns_name), 2, std::future::pending()).await;
    });
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    loop {
        let pxc = pxcs.get(&infra_cluster_name(&name)).await?;
        let ready = pxc
            .status
            .as_ref()
            .and_then(|st| banlieue_api::condition::find(&st.conditions, "Ready").cloned());
        if let Some(ready) = ready
            && ready.reason == "ProviderBackendMismatch"
        {
            assert_eq!(ready.status, "False");
            assert!(ready.message.contains("libvirt"), "{}", ready.message);
            assert!(
                pxc.status
                    .as_ref()
                    .and_then(|st| st.initialization.as_ref())
                    .is_none(),
                "not provisioned"
            );
            break;
        }
        if tokio::time::Instant::now() > deadline {
            bail!("no ProviderBackendMismatch condition: {:#?}", pxc.status);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    controller.abort();
    Api::<Provider>::all(client)
        .delete(&name, &DeleteParams::default())
        .await?;
    Ok(())
}

/// Runs the cluster controller on `ns` until the `Ready` condition of the ProxmoxCluster `name`
/// satisfies `done` (`what` names it for the timeout); returns the condition.
async fn wait_for_cluster_ready(
    client: &kube::Client,
    ns: &str,
    name: &str,
    what: &str,
    done: impl Fn(&banlieue_api::condition::Condition) -> bool,
) -> Result<banlieue_api::condition::Condition> {
    let clusters = ProxmoxClusters {
        connector: ClientConnector::default(),
    };
    let ctx = Arc::new(ClusterContext::new(
        client.clone(),
        clusters,
        "banlieue-proxmox-test",
    ));
    let ns_name = ns.to_owned();
    let controller = tokio::spawn(async move {
        banlieue_provider_kit::cluster::run(ctx, Some(&ns_name), 2, std::future::pending()).await;
    });
    let pxcs: Api<ProxmoxCluster> = Api::namespaced(client.clone(), ns);
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    let found = loop {
        let pxc = pxcs.get(name).await?;
        if let Some(ready) = cluster_condition(&pxc, "Ready").filter(|c| done(c)) {
            break Ok(ready);
        }
        if tokio::time::Instant::now() > deadline {
            break Err(anyhow::anyhow!("no Ready condition {what}: {:#?}", pxc.status));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    controller.abort();
    found
}

/// Tenancy: a ProxmoxCluster may not borrow another team's Secret by naming its namespace in
/// credentialsRef; it is refused with a reason that says how access is granted. Once the
/// Secret's owner allows the namespace, the Secret still goes nowhere until the owner also lists
/// the endpoints it may be sent to (the tenant chooses the endpoint); then it is used. A tenant
/// who then edits the endpoint to a host of theirs is refused, and that host receives nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_uses_a_secret_of_another_namespace_only_where_the_secret_allows_it() -> Result<()> {
    let env = env().await?;
    let (ns, other) = (
        env.namespace("pxm-tenant").await?,
        env.namespace("pxm-owner").await?,
    );
    let client = env.client().await?;
    let secret: Secret = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "pve-token"},
        "stringData": {"tokenID": "root@pam!banlieue", "secret": "not-for-the-tenant"},
    }))?;
    let secrets = Api::<Secret>::namespaced(client.clone(), other.name());
    secrets.create(&PostParams::default(), &secret).await?;
    // Owned as the standalone path owns its clusters (a CAPI Cluster would do the same).
    let owner_name = format!("owner-{}", ns.name());
    let owner = Api::<Provider>::all(client.clone())
        .create(
            &PostParams::default(),
            &Provider::new(
                &owner_name,
                ProviderSpec {
                    backend: Backend::Proxmox,
                    endpoint: "https://pve.owner.invalid:8006".into(),
                    credentials_ref: Some(SecretReference {
                        name: "pve-token".into(),
                        namespace: Some(ns.name().to_owned()),
                    }),
                    ..Default::default()
                },
            ),
        )
        .await?;
    let allowed_endpoint = "https://pve.tenant.invalid:8006";
    let mut pxc = ProxmoxCluster::new(
        "borrower",
        ProxmoxClusterSpec {
            endpoint: Some(allowed_endpoint.into()),
            credentials_ref: Some(SecretReference {
                name: "pve-token".into(),
                namespace: Some(other.name().to_owned()),
            }),
            ..Default::default()
        },
    );
    pxc.metadata.owner_references = Some(vec![owner_ref(&owner)?]);
    let pxcs = Api::<ProxmoxCluster>::namespaced(client.clone(), ns.name());
    pxcs.create(&PostParams::default(), &pxc).await?;
    let reason_is = |reason: &'static str| move |c: &banlieue_api::condition::Condition| c.reason == reason;
    let refused = wait_for_cluster_ready(
        &client,
        ns.name(),
        "borrower",
        "namespace forbidden",
        reason_is("CredentialsNamespaceForbidden"),
    )
    .await;
    let annotate = |key: &str, value: String| {
        let secrets = secrets.clone();
        let patch = serde_json::json!({"metadata": {"annotations": {key: value}}});
        async move {
            secrets
                .patch("pve-token", &PatchParams::default(), &Patch::Merge(&patch))
                .await
        }
    };
    let poke = |n: u32| serde_json::json!({"metadata": {"annotations": {"test/poke": n.to_string()}}});
    // The owner allows the tenant's namespace, not yet an endpoint.
    annotate(
        banlieue_api::ALLOWED_NAMESPACES_ANNOTATION,
        format!("team-x,{}", ns.name()),
    )
    .await?;
    pxcs.patch("borrower", &PatchParams::default(), &Patch::Merge(&poke(1)))
        .await?;
    let unlisted = wait_for_cluster_ready(
        &client,
        ns.name(),
        "borrower",
        "endpoint forbidden",
        reason_is("CredentialsEndpointForbidden"),
    )
    .await;
    // The owner lists the endpoint: the Secret is used (the endpoint is unreachable, which is
    // the next thing the cluster says).
    annotate(
        banlieue_api::ALLOWED_ENDPOINTS_ANNOTATION,
        allowed_endpoint.to_owned(),
    )
    .await?;
    pxcs.patch("borrower", &PatchParams::default(), &Patch::Merge(&poke(2)))
        .await?;
    let allowed = wait_for_cluster_ready(&client, ns.name(), "borrower", "allowed", |c| {
        !c.reason.starts_with("Credentials")
    })
    .await;
    // The tenant points the cluster at a host of theirs.
    let hostile = std::net::TcpListener::bind("127.0.0.1:0")?;
    hostile.set_nonblocking(true)?;
    let hostile_endpoint = format!("https://{}", hostile.local_addr()?);
    pxcs.patch(
        "borrower",
        &PatchParams::default(),
        &Patch::Merge(&serde_json::json!({"spec": {"endpoint": hostile_endpoint}})),
    )
    .await?;
    let exfiltration = wait_for_cluster_ready(
        &client,
        ns.name(),
        "borrower",
        "hostile endpoint forbidden",
        reason_is("CredentialsEndpointForbidden"),
    )
    .await;
    let contacted = hostile.accept().map(|(_, peer)| peer);
    Api::<Provider>::all(client.clone())
        .delete(&owner_name, &DeleteParams::default())
        .await?;

    let refused = refused?;
    assert_eq!(refused.status, "False");
    let message = refused.message;
    assert!(
        message.contains(&format!("{}/pve-token", other.name())),
        "{message}"
    );
    assert!(
        message.contains(banlieue_api::ALLOWED_NAMESPACES_ANNOTATION),
        "{message}"
    );
    assert!(!message.contains("not-for-the-tenant"), "{message}");
    let unlisted = unlisted?.message;
    assert!(
        unlisted.contains(banlieue_api::ALLOWED_ENDPOINTS_ANNOTATION) && unlisted.contains(allowed_endpoint),
        "{unlisted}"
    );
    let allowed = allowed?;
    assert!(
        !matches!(
            allowed.reason.as_str(),
            "CredentialsNotFound" | "CredentialsInvalid"
        ),
        "{allowed:?}"
    );
    let exfiltration = exfiltration?.message;
    assert!(exfiltration.contains(&hostile_endpoint), "{exfiltration}");
    assert!(
        contacted.is_err(),
        "the tenant's endpoint was contacted by {contacted:?}"
    );
    Ok(())
}

/// Tenancy: a Provider with a namespaceSelector serves infra clusters only in the namespaces
/// it selects, as it serves VirtualMachines; one elsewhere is refused with a reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_serves_only_the_namespaces_it_selects() -> Result<()> {
    let env = env().await?;
    let ns = env.namespace("pxm-unselected").await?;
    let client = env.client().await?;
    let name = format!("pve-{}", ns.name());
    let provider: Provider = serde_json::from_value(serde_json::json!({
        "apiVersion": "banlieue.io/v1alpha1",
        "kind": "Provider",
        "metadata": {"name": name},
        "spec": {
            "backend": "proxmox",
            "endpoint": "https://pve.shared.invalid:8006",
            "credentialsRef": {"name": "pve-token", "namespace": "banlieue-system"},
            "namespaceSelector": {"matchLabels": {"banlieue.io/team": "platform"}},
        },
    }))?;
    let provider = Api::<Provider>::all(client.clone())
        .create(&PostParams::default(), &provider)
        .await?;
    let mut pxc = ProxmoxCluster::new(
        "borrower",
        ProxmoxClusterSpec {
            provider_ref: Some(ProviderReference { name: name.clone() }),
            ..Default::default()
        },
    );
    pxc.metadata.owner_references = Some(vec![owner_ref(&provider)?]);
    Api::<ProxmoxCluster>::namespaced(client.clone(), ns.name())
        .create(&PostParams::default(), &pxc)
        .await?;
    let not_allowed = |c: &banlieue_api::condition::Condition| c.reason == "ProviderNotAllowedInNamespace";
    let message = wait_for_cluster_ready(&client, ns.name(), "borrower", "not allowed", not_allowed)
        .await
        .map(|c| c.message);
    Api::<Provider>::all(client)
        .delete(&name, &DeleteParams::default())
        .await?;
    let message = message?;
    assert!(message.contains("namespaceSelector"), "{message}");
    Ok(())
}

fn cluster_condition(pxc: &ProxmoxCluster, type_: &str) -> Option<banlieue_api::condition::Condition> {
    pxc.status
        .as_ref()
        .and_then(|st| banlieue_api::condition::find(&st.conditions, type_).cloned())
}

impl Standalone {
    /// Waits up to `timeout` for the ProxmoxCluster's `ProxmoxConnected` condition to satisfy
    /// `check`, and returns it.
    async fn wait_connected(
        &self,
        timeout: Duration,
        what: &str,
        check: impl Fn(&banlieue_api::condition::Condition) -> bool,
    ) -> Result<banlieue_api::condition::Condition> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let pxc = self
                .api::<ProxmoxCluster>()
                .get(&infra_cluster_name(&self.provider))
                .await?;
            if let Some(c) = cluster_condition(&pxc, "ProxmoxConnected")
                && check(&c)
            {
                return Ok(c);
            }
            if tokio::time::Instant::now() > deadline {
                bail!("ProxmoxCluster not {what} within {timeout:?}: {:#?}", pxc.status);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn patch_provider(&self, spec: serde_json::Value) -> Result<()> {
        Api::<Provider>::all(self.client.clone())
            .patch(
                &self.provider,
                &PatchParams::default(),
                &Patch::Merge(&serde_json::json!({ "spec": spec })),
            )
            .await?;
        Ok(())
    }

    async fn stop(self) -> Result<()> {
        for c in &self.controllers {
            c.abort();
        }
        Api::<Provider>::all(self.client.clone())
            .delete(&self.provider, &DeleteParams::default())
            .await?;
        self.sim.shutdown().await;
        Ok(())
    }
}

/// Issue 14: a TLS failure names its cause (both fingerprints), and a credentials Secret
/// created after the fact is noticed within seconds (the Secret watch; the resync is 5
/// minutes), under exactly the generated RBAC rules.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_failures_say_why_and_a_late_credentials_secret_is_noticed_within_seconds() -> Result<()> {
    let (s, _ns) = Standalone::start_as("pxm-late-secret", true).await?;
    s.wait_connected(TIMEOUT, "connected", |c| c.status == "True")
        .await?;

    let wrong = "AB:".repeat(31) + "AB";
    s.patch_provider(serde_json::json!({"tls": {"sha256Fingerprint": wrong}}))
        .await?;
    let c = s
        .wait_connected(TIMEOUT, "TLSVerificationFailed", |c| {
            c.reason == "TLSVerificationFailed"
        })
        .await?;
    assert_eq!(c.status, "False");
    let message = c.message.to_uppercase();
    assert!(message.contains(&wrong), "expected fingerprint: {}", c.message);
    assert!(
        message.contains(&s.sim.fingerprint_sha256().to_uppercase()),
        "presented fingerprint {}: {}",
        s.sim.fingerprint_sha256(),
        c.message
    );
    assert!(!c.message.contains(&s.sim.token_secret()), "{}", c.message);

    // Back to the right fingerprint, but credentials from a Secret that does not exist yet.
    s.patch_provider(serde_json::json!({
        "tls": {"sha256Fingerprint": s.sim.fingerprint_sha256()},
        "credentialsRef": {"name": "pve-late", "namespace": s.ns},
    }))
    .await?;
    let c = s
        .wait_connected(TIMEOUT, "CredentialsNotFound", |c| {
            c.reason == "CredentialsNotFound"
        })
        .await?;
    assert!(c.message.contains("pve-late"), "{}", c.message);
    s.api::<Secret>()
        .create(
            &PostParams::default(),
            &Secret {
                metadata: kube::api::ObjectMeta {
                    name: Some("pve-late".into()),
                    ..Default::default()
                },
                string_data: Some(
                    [
                        ("tokenID".to_owned(), s.sim.token_id()),
                        ("secret".to_owned(), s.sim.token_secret()),
                    ]
                    .into(),
                ),
                ..Default::default()
            },
        )
        .await?;
    s.wait_connected(
        Duration::from_secs(15),
        "connected after the Secret appeared",
        |c| c.status == "True",
    )
    .await?;
    s.stop().await
}

/// Issue 14: inputs before side effects. A machine whose user-data Secret is missing says so
/// and clones nothing; once the Secret appears it is provisioned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_user_data_secret_blocks_the_clone_until_it_appears() -> Result<()> {
    let (s, _ns) = Standalone::start_as("pxm-late-userdata", true).await?;
    let vms_before = s.sim.vms().len();
    s.create_virtual_machine("late", true, None, |_| {}).await?;
    let pm = s
        .wait_for("late", "waiting for its user data", |pm| {
            condition(pm, "Ready").is_some_and(|c| c.reason == "UserDataSecretNotFound")
        })
        .await?;
    let ready = condition(&pm, "Ready").context("Ready")?;
    assert_eq!(ready.status, "False");
    assert!(
        ready.message.contains(&format!("{}/late-user-data", s.ns)) && ready.message.contains("userdata"),
        "{}",
        ready.message
    );
    // Give a wrongly ordered controller time to clone, then check nothing was.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(s.sim.vms().len(), vms_before, "no VM cloned: {:?}", s.sim.vms());
    let pm = s.api::<ProxmoxMachine>().get("late").await?;
    assert!(
        pm.status.as_ref().and_then(|st| st.vmid).is_none(),
        "{:?}",
        pm.status
    );

    s.user_data_secret("late", USER_DATA).await?;
    let pm = s.wait_for("late", "provisioned", provisioned).await?;
    let vmid = pm.status.as_ref().and_then(|st| st.vmid).context("vmid")?;
    let seed = s.sim.seed(vmid).context("seed")?;
    assert_eq!(seed.user_data.as_deref(), Some(USER_DATA));
    s.stop().await
}

/// The tags of the simulator's VM named `name`.
fn vm_tags(s: &Standalone, name: &str) -> Vec<String> {
    s.sim
        .vms()
        .into_iter()
        .find(|v| !v.template && v.config.get("name").map(String::as_str) == Some(name))
        .and_then(|v| v.config.get("tags").cloned())
        .map(|t| t.split(';').map(str::to_owned).collect())
        .unwrap_or_default()
}

/// Waits until the VM `tagged` has `want` and `control-plane`, and not `gone`; its tags.
async fn wait_tags(s: &Standalone, want: &str, gone: Option<&str>) -> Result<Vec<String>> {
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    loop {
        let tags = vm_tags(s, "tagged");
        if tags.iter().any(|t| t == want)
            && tags.iter().any(|t| t == "control-plane")
            && gone.is_none_or(|g| !tags.iter().any(|t| t == g))
        {
            return Ok(tags);
        }
        if tokio::time::Instant::now() > deadline {
            bail!("VM tags {tags:?}: want {want} and control-plane, not {gone:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_labels_a_machine_lists_become_vm_tags_and_follow_their_values() -> Result<()> {
    let (s, _ns) = Standalone::start("pxm-label-tags").await?;
    s.virtual_machine_with("tagged", Some("#cloud-config\n"), None, |spec| {
        spec.tags_from_labels = vec![
            "cluster.x-k8s.io/cluster-name".into(),
            "node-role.kubernetes.io/control-plane".into(),
        ];
    })
    .await?;
    let label = |value: &str| {
        serde_json::json!({"metadata": {"labels": {
            "cluster.x-k8s.io/cluster-name": value,
            "node-role.kubernetes.io/control-plane": "",
            "not-listed": "x",
        }}})
    };
    s.api::<ProxmoxMachine>()
        .patch("tagged", &PatchParams::default(), &Patch::Merge(&label("prod")))
        .await?;
    s.wait_for("tagged", "provisioned", provisioned).await?;
    let tags = wait_tags(&s, "cluster-name.prod", None).await?;
    assert!(!tags.iter().any(|t| t.starts_with("not-listed")), "{tags:?}");
    s.api::<ProxmoxMachine>()
        .patch(
            "tagged",
            &PatchParams::default(),
            &Patch::Merge(&label("staging")),
        )
        .await?;
    wait_tags(&s, "cluster-name.staging", Some("cluster-name.prod")).await?;
    Ok(())
}

/// `kind/name/uid` of each owner.
fn owners(meta: &kube::api::ObjectMeta) -> Vec<String> {
    meta.owner_references
        .iter()
        .flatten()
        .map(|r| format!("{}/{}/{}", r.kind, r.name, r.uid))
        .collect()
}

/// `clusterctl move` takes a Provider's Secret along only if the Provider owns it: the provider
/// (under its generated role) gives each Provider of its backend labelled for move an owner
/// reference on its credentials Secret and CA bundle, lets go when the label goes, moves it when
/// the reference changes, writes nothing when nothing changed, and takes it off before the
/// Provider is deleted, so the garbage collector (running here) deletes neither. A Provider of
/// another backend, or not labelled, is not touched.
/// Its own API server: the controller looks at every Provider, those of the other tests too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_owns_what_it_names_for_clusterctl_move_and_lets_go_before_deletion() -> Result<()> {
    use banlieue_api::banlieue::{MOVE_LABEL, OWNED_REFERENCES_ANNOTATION, REFERENCES_FINALIZER};
    use banlieue_api::common::{CaBundleKind, CaBundleReference};
    use banlieue_provider_kit::provider_references;
    use banlieue_provider_runtime::testing::eventually;
    use k8s_openapi::api::core::v1::ConfigMap;

    let env = TestEnv::builder().crds(banlieue_api::crds::all()).start().await?;
    let ns = env.namespace("references").await?;
    let ns = ns.name();
    let client = env.client().await?;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    for name in ["token-a", "token-b"] {
        let secret: Secret = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name}, "stringData": {"tokenID": "t@pve!x", "secret": "s"}
        }))?;
        secrets.create(&PostParams::default(), &secret).await?;
    }
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    let ca: ConfigMap = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "ca"}, "data": {"ca.crt": "-----BEGIN CERTIFICATE-----"}
    }))?;
    config_maps.create(&PostParams::default(), &ca).await?;
    let providers: Api<Provider> = Api::all(client.clone());
    let spec = |backend, secret: &str| ProviderSpec {
        backend,
        endpoint: "https://pve.example.com:8006".into(),
        credentials_ref: Some(SecretReference {
            name: secret.into(),
            namespace: Some(ns.to_owned()),
        }),
        tls: Some(TlsTrust {
            ca_bundle_ref: Some(CaBundleReference {
                kind: CaBundleKind::ConfigMap,
                name: "ca".into(),
                namespace: Some(ns.to_owned()),
                key: None,
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    // Opted into clusterctl move (and one of another backend); one not opted in.
    let labelled = |mut p: Provider| {
        p.metadata.labels = Some([(MOVE_LABEL.to_owned(), String::new())].into());
        p
    };
    let pve = providers
        .create(
            &PostParams::default(),
            &labelled(Provider::new("pve", spec(Backend::Proxmox, "token-a"))),
        )
        .await?;
    let pve_uid = pve.uid().context("uid")?;
    let other = providers
        .create(
            &PostParams::default(),
            &labelled(Provider::new("other", spec(Backend::Vsphere, "token-b"))),
        )
        .await?;
    let stays = providers
        .create(
            &PostParams::default(),
            &Provider::new("stays", spec(Backend::Proxmox, "token-b")),
        )
        .await?;

    let controller_client = least_privilege_client(&env, "banlieue-proxmox-references").await?;
    let controller = tokio::spawn(provider_references::run(
        Arc::new(provider_references::Context {
            client: controller_client,
            backend: Backend::Proxmox,
            metrics: Default::default(),
        }),
        std::future::pending(),
    ));
    let pve_owner = format!("Provider/pve/{pve_uid}");

    // Owned, recorded, held.
    let p = eventually("Provider pve owns its Secret and CA bundle", || async {
        let (a, c, p) = (
            secrets.get("token-a").await?,
            config_maps.get("ca").await?,
            providers.get("pve").await?,
        );
        Ok((owners(&a.metadata) == [pve_owner.clone()]
            && owners(&c.metadata) == [pve_owner.clone()]
            && p.finalizers().contains(&REFERENCES_FINALIZER.to_owned()))
        .then_some(p))
    })
    .await?;
    assert_eq!(
        p.annotations()
            .get(OWNED_REFERENCES_ANNOTATION)
            .map(String::as_str),
        Some(format!("Secret {ns}/token-a, ConfigMap {ns}/ca").as_str())
    );

    // A change that names nothing new writes nothing (the label triggers a reconcile).
    let labelled = providers
        .patch(
            "pve",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"labels": {"team": "a"}}})),
        )
        .await?;
    let before = (
        labelled.resource_version(),
        secrets.get("token-a").await?.resource_version(),
        config_maps.get("ca").await?.resource_version(),
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = (
        providers.get("pve").await?.resource_version(),
        secrets.get("token-a").await?.resource_version(),
        config_maps.get("ca").await?.resource_version(),
    );
    assert_eq!(before, after, "a no-op reconcile wrote");
    for (name, why) in [
        ("other", "of another backend"),
        ("stays", "not labelled for move"),
    ] {
        let now = providers.get(name).await?;
        assert!(
            now.finalizers().is_empty() && now.annotations().get(OWNED_REFERENCES_ANNOTATION).is_none(),
            "the Provider {why} was touched: {:?}",
            now.metadata
        );
    }
    assert!(
        secrets.get("token-b").await?.metadata.owner_references.is_none(),
        "the Secret of Providers that must not own it was given an owner"
    );

    // The label removed: everything is let go, the finalizer too; put back: owned again.
    for labelled in [false, true] {
        let label = if labelled {
            serde_json::json!("")
        } else {
            serde_json::Value::Null
        };
        providers
            .patch(
                "pve",
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({"metadata": {"labels": {MOVE_LABEL: label}}})),
            )
            .await?;
        eventually(
            &format!("labelled for move = {labelled}: owned and held alike"),
            || async {
                let (a, p) = (secrets.get("token-a").await?, providers.get("pve").await?);
                let owned = owners(&a.metadata) == [pve_owner.clone()];
                let held = p.finalizers().contains(&REFERENCES_FINALIZER.to_owned());
                Ok((owned == labelled && held == labelled).then_some(()))
            },
        )
        .await?;
    }

    // The reference moves to another Secret: the first one is let go.
    providers
        .patch(
            "pve",
            &PatchParams::default(),
            &Patch::Merge(
                serde_json::json!({"spec": {"credentialsRef": {"name": "token-b", "namespace": ns}}}),
            ),
        )
        .await?;
    eventually("the changed credentialsRef followed", || async {
        let (a, b, p) = (
            secrets.get("token-a").await?,
            secrets.get("token-b").await?,
            providers.get("pve").await?,
        );
        Ok((owners(&a.metadata).is_empty()
            && owners(&b.metadata) == [pve_owner.clone()]
            && p.annotations()
                .get(OWNED_REFERENCES_ANNOTATION)
                .map(String::as_str)
                == Some(format!("Secret {ns}/token-b, ConfigMap {ns}/ca").as_str()))
        .then_some(()))
    })
    .await?;

    // Deleted: its owner references go first, then the Provider; both objects stay.
    providers.delete("pve", &DeleteParams::default()).await?;
    eventually("Provider pve released for deletion", || async {
        Ok(providers.get_opt("pve").await?.is_none().then_some(()))
    })
    .await?;
    // Give the garbage collector time to act on anything left.
    tokio::time::sleep(Duration::from_secs(3)).await;
    for (what, meta) in [
        ("Secret token-a", secrets.get("token-a").await?.metadata),
        ("Secret token-b", secrets.get("token-b").await?.metadata),
        ("ConfigMap ca", config_maps.get("ca").await?.metadata),
    ] {
        assert!(
            meta.owner_references.is_none_or(|r| r.is_empty()),
            "{what} still names the deleted Provider"
        );
    }
    drop((other, stays));
    controller.abort();
    Ok(())
}
