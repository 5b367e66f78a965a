//! Scenario tests on the real control plane harness (etcd + kube-apiserver +
//! kube-controller-manager) with CAPI's CRDs, driven by CAPI-shaped Cluster/Machine objects.
//!
//! The CAPI-style scenarios shared by every provider (`banlieue-scenarios`: provision, scale,
//! delete, pause, bad template, bad credentials, crash/restart) run against the wire-level
//! simulator through the real client (`scenarios/pve_sim.rs`). The Proxmox-specific scenarios
//! below use the in-memory `FakePve`.
//!
//! Run: `cargo test -p banlieue-proxmox --test scenarios` (needs `tests/controlplane/build.sh`).

#[path = "scenarios/pve_sim.rs"]
mod pve_sim;

banlieue_scenarios::scenario_tests!(
    pve_sim::PveSim: provision,
    scale,
    delete,
    pause,
    bad_template,
    bad_credentials,
    crash_restart,
    outage,
    address_modes,
    few_writes,
    creation_only_change,
);

// One workload cluster spread over two Proxmox VE endpoints, each a failure domain: the same
// scenarios, every machine on the endpoint its Machine names.
banlieue_scenarios::scenario_tests!(
    mod spread_scenarios;
    pve_sim::PveSpread: provision,
    delete,
    crash_restart,
    outage,
    bad_credentials,
);

/// A spread cluster publishes one failure domain per endpoint; a machine without a failure
/// domain goes to the endpoint with the most free memory on an allowed node, keeps it in
/// `status.failureDomain`, and is deleted there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_machine_without_failure_domain_goes_to_the_roomiest_endpoint() -> Result<()> {
    use banlieue_scenarios::{Scenario, object};
    let mut s = Scenario::<pve_sim::PveSpread>::new("roomiest").await?;
    s.ready_cluster().await?;
    let cluster = s
        .get_infra("ProxmoxCluster", banlieue_scenarios::fixture::CLUSTER)
        .await?
        .context("cluster")?;
    let domains: Vec<&str> = cluster
        .pointer("/status/failureDomains")
        .and_then(|d| d.as_array())
        .context("status.failureDomains")?
        .iter()
        .filter_map(|d| d["name"].as_str())
        .collect();
    anyhow::ensure!(
        domains == ["site-a", "site-b"],
        "published failure domains, by name: {domains:?}"
    );
    // Each endpoint allows one node. A running VM on site-b's (the endpoint listed first)
    // sends the next machine to site-a; two on site-a's send the one after to site-b.
    for (name, failure_domain, want) in [
        ("m1", Some("site-b"), "site-b"),
        ("m2", None, "site-a"),
        ("m3", Some("site-a"), "site-a"),
        ("m4", None, "site-b"),
    ] {
        let uid = s
            .machine(name, failure_domain, banlieue_scenarios::Template::Valid)
            .await?;
        let m = s
            .wait_machine(name, "provisioned", object::fully_provisioned)
            .await?;
        anyhow::ensure!(
            object::failure_domain(&m) == Some(want),
            "{name}: status.failureDomain {:?}, want {want}",
            object::failure_domain(&m)
        );
        let vms = s.vms_of(&uid).await?;
        anyhow::ensure!(
            vms.len() == 1 && vms[0].failure_domain.as_deref() == Some(want),
            "{name}'s VMs: {vms:?}"
        );
    }
    for name in ["m1", "m2", "m3", "m4"] {
        s.delete_machine(name).await?;
    }
    for name in ["m1", "m2", "m3", "m4"] {
        s.wait_machine_gone(name).await?;
    }
    anyhow::ensure!(s.vms().await?.is_empty(), "left behind: {:?}", s.vms().await?);
    Ok(())
}

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use banlieue_api::common::{ApiEndpoint, Cpu, SecretReference};
use banlieue_api::infrastructure::{
    ProxmoxCluster, ProxmoxClusterSpec, ProxmoxMachine, ProxmoxMachineSpec, ProxmoxTemplateSource,
};
use banlieue_capi::contract::{CLUSTER_NAME_LABEL, ContractRef};
use banlieue_capi::generated::cluster::ClusterSpec;
use banlieue_capi::generated::machine::{MachineBootstrap, MachineSpec};
use banlieue_capi::{Cluster, Machine};
use banlieue_cloudinit::SeedFiles;
use banlieue_provider_kit::cluster::ClusterContext;
use banlieue_provider_runtime::leader::LeaderElector;
use banlieue_proxmox::cluster_controller::ProxmoxClusters;
use banlieue_proxmox::desired;
use banlieue_proxmox::fake::FakeConnector;
use banlieue_proxmox::fake::FakePve;
use banlieue_proxmox::machine_controller::{self, ProxmoxMachines};
use banlieue_testenv::TestEnv;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Resource, ResourceExt};

const USER_DATA: &[u8] = b"#cloud-config\nruncmd:\n- [sh, -c, 'echo \xc3\xa9t\xc3\xa9 > /tmp/x']\n";
const TIMEOUT: Duration = Duration::from_secs(60);
const FINALIZER: &str = banlieue_api::common::Backend::Proxmox.finalizer();

async fn env() -> Result<&'static TestEnv> {
    banlieue_scenarios::env().await
}

struct Scenario {
    client: kube::Client,
    ns: String,
    pve: FakePve,
    /// The registry every controller of the scenario records into (their `/metrics`).
    metrics: banlieue_provider_runtime::metrics::Metrics,
}

impl Scenario {
    async fn new(prefix: &str) -> Result<(Self, banlieue_testenv::TestNamespace)> {
        let env = env().await?;
        let ns = env.namespace(prefix).await?;
        let client = env.client().await?;
        let scenario = Self {
            client,
            ns: ns.name().to_owned(),
            pve: FakePve::new(3),
            metrics: Default::default(),
        };
        scenario.cluster("c1").await?;
        Ok((scenario, ns))
    }

    fn api<K>(&self) -> Api<K>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
    {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    /// Starts a controller; returns its task (abort it to "kill" the controller).
    fn start_controller(&self) -> tokio::task::JoinHandle<()> {
        let mut ctx = banlieue_provider_kit::machine::MachineContext::new(
            self.client.clone(),
            ProxmoxMachines {
                connector: FakeConnector(self.pve.clone()),
                reservations: Default::default(),
                seed_storage: "local".into(),
            },
            "banlieue-proxmox-test",
        );
        ctx.metrics = self.metrics.clone();
        let ctx = Arc::new(ctx);
        let ns = self.ns.clone();
        tokio::spawn(async move {
            banlieue_provider_kit::machine::run(ctx, Some(&ns), 4, std::future::pending()).await;
        })
    }

    async fn cluster(&self, name: &str) -> Result<()> {
        let secret = Secret {
            metadata: kube::api::ObjectMeta {
                name: Some("pve-credentials".into()),
                ..Default::default()
            },
            string_data: Some(
                [
                    ("tokenID".to_owned(), "root@pam!banlieue".to_owned()),
                    (
                        "secret".to_owned(),
                        "00000000-1111-2222-3333-444444444444".to_owned(),
                    ),
                ]
                .into(),
            ),
            ..Default::default()
        };
        self.api::<Secret>()
            .create(&PostParams::default(), &secret)
            .await?;
        let pxc = ProxmoxCluster::new(
            name,
            ProxmoxClusterSpec {
                control_plane_endpoint: Some(ApiEndpoint {
                    host: "10.0.0.100".into(),
                    port: 6443,
                }),
                endpoint: Some("https://pve.invalid:8006".into()),
                credentials_ref: Some(SecretReference {
                    name: "pve-credentials".into(),
                    namespace: None,
                }),
                ..Default::default()
            },
        );
        self.api::<ProxmoxCluster>()
            .create(&PostParams::default(), &pxc)
            .await?;
        let cluster = Cluster::new(
            name,
            ClusterSpec {
                infrastructure_ref: Some(
                    ContractRef::new("infrastructure.banlieue.io", "ProxmoxCluster", name).into(),
                ),
                ..Default::default()
            },
        );
        self.api::<Cluster>()
            .create(&PostParams::default(), &cluster)
            .await?;
        let status = serde_json::json!({"status": {"initialization": {"infrastructureProvisioned": true}}});
        self.api::<Cluster>()
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
            .await?;
        Ok(())
    }

    /// Creates bootstrap Secret, Machine and its ProxmoxMachine (owned by the Machine), as
    /// CAPI's MachineSet and bootstrap controllers would.
    async fn machine(&self, name: &str, failure_domain: Option<&str>) -> Result<()> {
        let secret = Secret {
            metadata: kube::api::ObjectMeta {
                name: Some(format!("{name}-bootstrap")),
                ..Default::default()
            },
            type_: Some("cluster.x-k8s.io/secret".into()),
            data: Some([("value".to_owned(), ByteString(USER_DATA.to_vec()))].into()),
            ..Default::default()
        };
        self.api::<Secret>()
            .create(&PostParams::default(), &secret)
            .await?;
        let mut machine = Machine::new(
            name,
            MachineSpec {
                cluster_name: "c1".into(),
                bootstrap: MachineBootstrap {
                    data_secret_name: Some(format!("{name}-bootstrap")),
                    ..Default::default()
                },
                infrastructure_ref: ContractRef::new("infrastructure.banlieue.io", "ProxmoxMachine", name)
                    .into(),
                failure_domain: failure_domain.map(str::to_owned),
                ..Default::default()
            },
        );
        machine.metadata.labels = Some([(CLUSTER_NAME_LABEL.to_owned(), "c1".to_owned())].into());
        let machine = self
            .api::<Machine>()
            .create(&PostParams::default(), &machine)
            .await?;
        let mut pm = ProxmoxMachine::new(
            name,
            ProxmoxMachineSpec::new(
                ProxmoxTemplateSource {
                    vmid: Some(9000),
                    ..Default::default()
                },
                Cpu::cores(2),
                2048,
            ),
        );
        pm.metadata.labels = Some([(CLUSTER_NAME_LABEL.to_owned(), "c1".to_owned())].into());
        pm.metadata.owner_references = Some(vec![OwnerReference {
            api_version: "cluster.x-k8s.io/v1beta2".into(),
            kind: "Machine".into(),
            name: name.into(),
            uid: machine.uid().context("machine uid")?,
            controller: Some(true),
            block_owner_deletion: Some(true),
        }]);
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

    /// What `clusterctl move` does to a source object: annotated for the move, then deleted.
    async fn delete_for_move(&self, name: &str) -> Result<()> {
        let annotate = serde_json::json!({"metadata": {"annotations": {
            banlieue_capi::contract::DELETE_FOR_MOVE_ANNOTATION: ""}}});
        let machines = self.api::<ProxmoxMachine>();
        machines
            .patch(name, &PatchParams::default(), &Patch::Merge(&annotate))
            .await?;
        machines.delete(name, &DeleteParams::default()).await?;
        Ok(())
    }

    async fn wait_gone(&self, name: &str) -> Result<()> {
        let deadline = tokio::time::Instant::now() + TIMEOUT;
        while self.api::<ProxmoxMachine>().get_opt(name).await?.is_some() {
            if tokio::time::Instant::now() > deadline {
                bail!("{name} was not deleted");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(())
    }
}

fn provisioned(pm: &ProxmoxMachine) -> bool {
    pm.status
        .as_ref()
        .and_then(|s| s.initialization.as_ref())
        .and_then(|i| i.provisioned)
        .unwrap_or(false)
        && pm.spec.provider_id.is_some()
}

fn condition<'a>(pm: &'a ProxmoxMachine, type_: &str) -> Option<&'a banlieue_api::condition::Condition> {
    pm.status
        .as_ref()
        .and_then(|s| banlieue_api::condition::find(&s.conditions, type_))
}

/// What the shared suite cannot see: the Proxmox conventions of providerID (the VM's SMBIOS
/// uuid) and of the seed ISO's volume id, and the seed volume's removal with the VM.
#[tokio::test]
async fn provider_id_and_seed_volume_follow_proxmox_conventions() -> Result<()> {
    let (s, _ns) = Scenario::new("pxm-conv").await?;
    let controller = s.start_controller();
    s.machine("m1", Some("pve2")).await?;
    let pm = s.wait_for("m1", "provisioned", provisioned).await?;

    let (vmid, _) = s.pve.vms().into_iter().next().context("vm")?;
    let status = pm.status.clone().context("status")?;
    assert_eq!(status.vmid, Some(vmid));
    assert_eq!(
        pm.spec.provider_id.as_deref(),
        Some(format!("proxmox://0000aaaa-0000-0000-0000-{vmid:012}").as_str())
    );
    assert!(pm.finalizers().iter().any(|f| f == FINALIZER));
    let uploads = s.pve.uploads();
    assert_eq!(uploads.len(), 1);
    let files = SeedFiles::from_iso(&uploads[0].2)?;
    assert_eq!(files.user_data.as_deref(), Some(USER_DATA));
    assert_eq!(
        uploads[0].1,
        desired::seed_volid("local", &pm.uid().unwrap_or_default())
    );

    s.api::<ProxmoxMachine>()
        .delete("m1", &DeleteParams::default())
        .await?;
    s.wait_gone("m1").await?;
    assert!(s.pve.vms().is_empty(), "the VM is deleted with the machine");
    assert!(s.pve.volumes().is_empty(), "no seed ISO left behind");
    controller.abort();
    Ok(())
}

/// At the most verbose log level (the provider's, the Kubernetes client's, the HTTP stack's), a
/// machine's whole life leaves no credential and no bootstrap data in a log line, an Event, a
/// status or a metric (names, labels and values of the provider's `/metrics`): neither as
/// written nor base64-encoded.
#[tokio::test]
async fn no_secret_value_reaches_a_log_line_an_event_a_status_or_a_metric() -> Result<()> {
    use banlieue_scenarios::leaks::{VerboseLogs, assert_no_secret};
    use k8s_openapi::api::core::v1::Event;
    let logs = VerboseLogs::capture();
    let (s, _ns) = Scenario::new("pxm-secrets").await?;
    let clusters = s.start_cluster_controller();
    let controller = s.start_controller();
    s.machine("m1", Some("pve2")).await?;
    s.wait_for("m1", "provisioned", provisioned).await?;
    let machine = s.api::<ProxmoxMachine>().get("m1").await?;
    let cluster = s.api::<ProxmoxCluster>().get("c1").await?;
    s.api::<ProxmoxMachine>()
        .delete("m1", &DeleteParams::default())
        .await?;
    s.wait_gone("m1").await?;
    controller.abort();
    clusters.abort();
    let logs = logs.text();
    assert!(
        logs.contains("reconcil") && logs.lines().count() > 100,
        "the verbose logs were captured ({} lines)",
        logs.lines().count()
    );
    let events = s.api::<Event>().list(&Default::default()).await?;
    let outputs = [
        ("logs", logs),
        ("events", serde_json::to_string(&events.items)?),
        ("machine status", serde_json::to_string(&machine.status)?),
        ("cluster status", serde_json::to_string(&cluster.status)?),
        ("metrics", s.metrics.render()),
    ];
    assert!(
        outputs[4].1.contains("proxmoxmachine"),
        "the metrics were recorded: {}",
        outputs[4].1
    );
    assert_no_secret(
        &outputs,
        &[
            "00000000-1111-2222-3333-444444444444",
            "été > /tmp/x",
            std::str::from_utf8(USER_DATA)?,
        ],
    );
    Ok(())
}

#[tokio::test]
async fn a_machine_without_owner_is_left_alone() -> Result<()> {
    let (s, _ns) = Scenario::new("pxm-orphan").await?;
    let controller = s.start_controller();
    s.machine("m1", None).await?;
    // A second ProxmoxMachine that no Machine owns (CAPI has not linked it yet).
    let mut orphan = s.api::<ProxmoxMachine>().get("m1").await?;
    orphan.metadata = kube::api::ObjectMeta {
        name: Some("orphan".into()),
        ..Default::default()
    };
    orphan.status = None;
    s.api::<ProxmoxMachine>()
        .create(&PostParams::default(), &orphan)
        .await?;
    s.wait_for("m1", "provisioned", provisioned).await?;
    let orphan = s.api::<ProxmoxMachine>().get("orphan").await?;
    assert!(orphan.status.is_none(), "no status on an unowned machine");
    assert!(
        orphan.finalizers().is_empty(),
        "no finalizer on an unowned machine"
    );
    assert_eq!(s.pve.vms().len(), 1);
    controller.abort();
    Ok(())
}

impl Scenario {
    fn start_cluster_controller(&self) -> tokio::task::JoinHandle<()> {
        let clusters = ProxmoxClusters {
            connector: FakeConnector(self.pve.clone()),
        };
        let mut ctx = ClusterContext::new(self.client.clone(), clusters, "banlieue-proxmox-test");
        ctx.metrics = self.metrics.clone();
        let ctx = Arc::new(ctx);
        let ns = self.ns.clone();
        tokio::spawn(async move {
            banlieue_provider_kit::cluster::run(ctx, Some(&ns), 2, std::future::pending()).await;
        })
    }

    /// A Cluster and its ProxmoxCluster (owned by it, as CAPI sets it), using `secret`.
    async fn owned_cluster(&self, name: &str, secret: &str) -> Result<()> {
        let cluster = Cluster::new(
            name,
            ClusterSpec {
                infrastructure_ref: Some(
                    ContractRef::new("infrastructure.banlieue.io", "ProxmoxCluster", name).into(),
                ),
                ..Default::default()
            },
        );
        let cluster = self
            .api::<Cluster>()
            .create(&PostParams::default(), &cluster)
            .await?;
        let mut pxc = ProxmoxCluster::new(
            name,
            ProxmoxClusterSpec {
                control_plane_endpoint: Some(ApiEndpoint {
                    host: "10.0.0.100".into(),
                    port: 6443,
                }),
                endpoint: Some("https://pve.invalid:8006".into()),
                credentials_ref: Some(SecretReference {
                    name: secret.into(),
                    namespace: None,
                }),
                allowed_nodes: vec!["pve3".into(), "pve1".into()],
                ..Default::default()
            },
        );
        pxc.metadata.owner_references = Some(vec![OwnerReference {
            api_version: "cluster.x-k8s.io/v1beta2".into(),
            kind: "Cluster".into(),
            name: name.into(),
            uid: cluster.uid().context("cluster uid")?,
            ..Default::default()
        }]);
        self.api::<ProxmoxCluster>()
            .create(&PostParams::default(), &pxc)
            .await?;
        Ok(())
    }

    async fn wait_cluster(
        &self,
        name: &str,
        check: impl Fn(&ProxmoxCluster) -> bool,
    ) -> Result<ProxmoxCluster> {
        let deadline = tokio::time::Instant::now() + TIMEOUT;
        loop {
            let pxc = self.api::<ProxmoxCluster>().get(name).await?;
            if check(&pxc) {
                return Ok(pxc);
            }
            if tokio::time::Instant::now() > deadline {
                bail!("timed out waiting for ProxmoxCluster {name}: {:#?}", pxc.status);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

fn cluster_condition<'a>(
    pxc: &'a ProxmoxCluster,
    type_: &str,
) -> Option<&'a banlieue_api::condition::Condition> {
    pxc.status
        .as_ref()
        .and_then(|s| banlieue_api::condition::find(&s.conditions, type_))
}

#[tokio::test]
async fn proxmox_cluster_checks_connectivity_and_publishes_failure_domains() -> Result<()> {
    let (s, _ns) = Scenario::new("pxc-ok").await?;
    s.owned_cluster("c2", "pve-credentials").await?;
    let controller = s.start_cluster_controller();
    let pxc = s
        .wait_cluster("c2", |p| {
            p.status
                .as_ref()
                .is_some_and(|st| st.initialization.as_ref().and_then(|i| i.provisioned) == Some(true))
        })
        .await?;
    let status = pxc.status.clone().context("status")?;
    let names: Vec<&str> = status.failure_domains.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, ["pve1", "pve3"], "allowed nodes, sorted");
    assert_eq!(
        cluster_condition(&pxc, "Ready").map(|c| c.status.as_str()),
        Some("True")
    );
    assert_eq!(
        cluster_condition(&pxc, "ProxmoxConnected").map(|c| c.status.as_str()),
        Some("True")
    );
    assert!(pxc.finalizers().iter().any(|f| f == FINALIZER));
    // Status as CAPI reads it: failureDomains a list, no nulls.
    let raw = serde_json::to_value(&status)?;
    assert!(raw["failureDomains"].is_array());
    assert!(!raw.to_string().contains("null"), "{raw}");
    controller.abort();
    Ok(())
}

/// A connection that does not verify the server's certificate works, says so in the condition
/// and is announced by one Warning Event, not one per reconcile.
#[tokio::test]
async fn a_connection_without_tls_verification_is_shown_and_warned_about_once() -> Result<()> {
    use banlieue_api::condition::CONNECTED_WITHOUT_TLS_VERIFICATION;
    use k8s_openapi::api::core::v1::Event;
    let (s, _ns) = Scenario::new("pxc-insecure").await?;
    s.owned_cluster("c5", "pve-credentials").await?;
    s.api::<ProxmoxCluster>()
        .patch(
            "c5",
            &PatchParams::default(),
            &Patch::Merge(&serde_json::json!({"spec": {"tls": {"insecureSkipVerify": true}}})),
        )
        .await?;
    let controller = s.start_cluster_controller();
    let insecure = |p: &ProxmoxCluster| {
        cluster_condition(p, "ProxmoxConnected")
            .is_some_and(|c| c.reason == CONNECTED_WITHOUT_TLS_VERIFICATION)
    };
    let pxc = s.wait_cluster("c5", insecure).await?;
    let connected = cluster_condition(&pxc, "ProxmoxConnected").context("condition")?;
    assert_eq!(connected.status, "True");
    assert!(
        connected.message.contains("tls.insecureSkipVerify"),
        "{}",
        connected.message
    );
    assert_eq!(
        cluster_condition(&pxc, "Ready").map(|c| c.status.as_str()),
        Some("True")
    );
    // Another reconcile (a label change) writes nothing and warns no more.
    s.api::<ProxmoxCluster>()
        .patch(
            "c5",
            &PatchParams::default(),
            &Patch::Merge(&serde_json::json!({"metadata": {"labels": {"touched": "yes"}}})),
        )
        .await?;
    let warnings = || async {
        let events = s.api::<Event>().list(&Default::default()).await?;
        Ok::<_, anyhow::Error>(
            events
                .items
                .into_iter()
                .filter(|e| {
                    e.involved_object.name.as_deref() == Some("c5")
                        && e.reason.as_deref() == Some(CONNECTED_WITHOUT_TLS_VERIFICATION)
                })
                .collect::<Vec<_>>(),
        )
    };
    let mut found = Vec::new();
    for _ in 0..100 {
        found = warnings().await?;
        if !found.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let found_after = warnings().await?;
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found_after.len(), 1, "{found_after:?}");
    assert_eq!(found_after[0].type_.as_deref(), Some("Warning"));
    assert_eq!(
        found_after[0].count.unwrap_or(1),
        1,
        "warned once: {:?}",
        found_after[0]
    );
    controller.abort();
    Ok(())
}

#[tokio::test]
async fn proxmox_cluster_reports_bad_credentials_and_auth_failures() -> Result<()> {
    let (s, _ns) = Scenario::new("pxc-bad").await?;
    let incomplete = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some("incomplete".into()),
            ..Default::default()
        },
        string_data: Some([("tokenID".to_owned(), "root@pam!x".to_owned())].into()),
        ..Default::default()
    };
    s.api::<Secret>()
        .create(&PostParams::default(), &incomplete)
        .await?;
    s.owned_cluster("c3", "incomplete").await?;
    s.pve.fail_next(
        "version",
        banlieue_proxmox::fake::api_error(401, "authentication failure"),
    );
    s.owned_cluster("c4", "pve-credentials").await?;
    let controller = s.start_cluster_controller();
    let connected_false =
        |p: &ProxmoxCluster| cluster_condition(p, "ProxmoxConnected").is_some_and(|c| c.status == "False");
    let c3 = s.wait_cluster("c3", connected_false).await?;
    let c = cluster_condition(&c3, "ProxmoxConnected").context("condition")?;
    assert_eq!(c.reason, "CredentialsInvalid");
    assert!(c.message.contains("secret"), "{}", c.message);
    assert_eq!(
        cluster_condition(&c3, "Ready").map(|c| c.status.as_str()),
        Some("False")
    );
    let c4 = s
        .wait_cluster("c4", |p| cluster_condition(p, "ProxmoxConnected").is_some())
        .await?;
    // The injected 401 hits whichever cluster is checked first; c4 either failed with it or
    // (if c3's check came first) connected.
    let reason = cluster_condition(&c4, "ProxmoxConnected").map(|c| c.reason.clone());
    assert!(
        matches!(reason.as_deref(), Some("AuthenticationFailed" | "Connected")),
        "{reason:?}"
    );
    controller.abort();
    Ok(())
}

#[tokio::test]
async fn leader_election_has_one_holder_and_hands_over() -> Result<()> {
    let (s, _ns) = Scenario::new("pxm-leader").await?;
    let mut a = LeaderElector::new(s.client.clone(), &s.ns, "lease", "a");
    let mut b = LeaderElector::new(s.client.clone(), &s.ns, "lease", "b");
    a.lease_duration = Duration::from_secs(2);
    b.lease_duration = Duration::from_secs(2);
    assert!(a.try_acquire_or_renew().await?);
    assert!(!b.try_acquire_or_renew().await?, "a holds the lease");
    assert!(a.try_acquire_or_renew().await?, "a renews");
    // a stops renewing: b takes over after expiry.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(b.try_acquire_or_renew().await?, "expired lease taken over");
    assert!(!a.try_acquire_or_renew().await?);
    b.release().await?;
    assert!(a.try_acquire_or_renew().await?, "released lease taken at once");
    let lease = Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(s.client.clone(), &s.ns)
        .get("lease")
        .await?;
    let spec = lease.spec.context("spec")?;
    assert_eq!(spec.holder_identity.as_deref(), Some("a"));
    assert_eq!(spec.lease_transitions, Some(2));
    Ok(())
}

#[tokio::test]
async fn pausing_the_cluster_is_reported_on_a_provisioned_machine_at_once() -> Result<()> {
    let (s, _ns) = Scenario::new("pxm-cpause").await?;
    let controller = s.start_controller();
    s.machine("m1", None).await?;
    s.wait_for("m1", "provisioned", provisioned).await?;
    let pause = serde_json::json!({"spec": {"paused": true}});
    s.api::<Cluster>()
        .patch("c1", &PatchParams::default(), &Patch::Merge(&pause))
        .await?;
    let started = tokio::time::Instant::now();
    let pm = s
        .wait_for("m1", "paused", |pm| {
            condition(pm, "Paused").is_some_and(|c| c.status == "True")
        })
        .await?;
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "noticed through the Cluster watch, not the 10 min resync"
    );
    let message = &condition(&pm, "Paused").context("Paused")?.message;
    assert!(message.contains("Cluster spec.paused"), "{message}");
    controller.abort();
    Ok(())
}

#[tokio::test]
async fn an_object_deleted_by_clusterctl_move_is_released_and_its_vm_kept() -> Result<()> {
    let (s, _ns) = Scenario::new("pxm-move").await?;
    let controller = s.start_controller();
    s.machine("m1", None).await?;
    s.wait_for("m1", "provisioned", provisioned).await?;
    let vms_before = s.pve.vms();
    assert_eq!(vms_before.len(), 1);
    // (The Cluster is not even paused here.)
    s.delete_for_move("m1").await?;
    let machines = s.api::<ProxmoxMachine>();
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    while machines.get_opt("m1").await?.is_some() {
        if tokio::time::Instant::now() > deadline {
            bail!("the provider kept its finalizer on an object deleted for move");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let vms_after = s.pve.vms();
    assert_eq!(
        vms_after.keys().collect::<Vec<_>>(),
        vms_before.keys().collect::<Vec<_>>(),
        "the VM belongs to the copy on the target cluster"
    );
    assert!(vms_after.values().all(|vm| vm.running));
    let calls = s.pve.calls();
    assert!(
        !calls
            .iter()
            .any(|c| c == "stop_vm" || c == "delete_vm" || c == "shutdown_vm"),
        "{calls:?}"
    );
    controller.abort();
    Ok(())
}

/// A machine created anew with a providerID (the copy `clusterctl move` makes) and deleted
/// before it adopted its VM, while Proxmox refuses the token the listing of guests: the VM may
/// exist, so the finalizer stays and `Ready` says why, instead of the object going as if it had
/// no VM (which would leak it).
#[tokio::test]
async fn a_moved_machine_deleted_while_its_vm_cannot_be_looked_for_keeps_its_finalizer() -> Result<()> {
    let (s, _ns) = Scenario::new("pxm-move-403").await?;
    let controller = s.start_controller();
    s.machine("m1", None).await?;
    let source = s.wait_for("m1", "provisioned", provisioned).await?;
    s.delete_for_move("m1").await?;
    s.wait_gone("m1").await?;
    controller.abort();
    let vms = s.pve.vms();
    assert_eq!(vms.len(), 1);

    // The copy: same spec (providerID included), no status, a new UID; deleted at once.
    let mut copy = ProxmoxMachine::new("m1", source.spec.clone());
    assert!(copy.spec.provider_id.is_some());
    copy.metadata.labels = source.metadata.labels.clone();
    copy.metadata.owner_references = source.metadata.owner_references.clone();
    copy.metadata.finalizers = Some(vec![FINALIZER.to_owned()]);
    let machines = s.api::<ProxmoxMachine>();
    machines.create(&PostParams::default(), &copy).await?;
    machines.delete("m1", &DeleteParams::default()).await?;
    for _ in 0..100 {
        s.pve.fail_next(
            "guests",
            banlieue_proxmox::fake::api_error(403, "Permission check failed (/vms, VM.Audit)"),
        );
    }
    let controller = s.start_controller();
    let held = s
        .wait_for("m1", "blocked", |pm| {
            condition(pm, "Ready").is_some_and(|c| c.reason == "PermissionDenied")
        })
        .await?;
    assert!(held.finalizers().iter().any(|f| f == FINALIZER));
    assert_eq!(
        s.pve.vms().keys().collect::<Vec<_>>(),
        vms.keys().collect::<Vec<_>>()
    );
    let calls = s.pve.calls();
    assert!(!calls.iter().any(|c| c == "delete_vm"), "{calls:?}");
    controller.abort();
    Ok(())
}

#[tokio::test]
async fn machine_templates_publish_their_capacity() -> Result<()> {
    use banlieue_api::infrastructure::{ProxmoxMachineTemplate, ProxmoxMachineTemplateSpec};
    use banlieue_provider_kit::template::{self as template_controller, TemplateContext};
    let (s, _ns) = Scenario::new("pxmt").await?;
    let template: ProxmoxMachineTemplate = serde_json::from_value(serde_json::json!({
        "apiVersion": "infrastructure.banlieue.io/v1alpha1",
        "kind": "ProxmoxMachineTemplate",
        "metadata": {"name": "workers"},
        "spec": {"template": {"spec": {
            "source": {"vmid": 9000}, "cpu": {"cores": 2, "sockets": 2}, "memoryMiB": 3072
        }}}
    }))?;
    let _: &ProxmoxMachineTemplateSpec = &template.spec;
    s.api::<ProxmoxMachineTemplate>()
        .create(&PostParams::default(), &template)
        .await?;
    let ctx = Arc::new(TemplateContext {
        client: s.client.clone(),
        field_manager: machine_controller::FIELD_MANAGER,
        watch_filter: None,
        metrics: Default::default(),
    });
    let ns = s.ns.clone();
    let controller = tokio::spawn(async move {
        template_controller::run::<ProxmoxMachineTemplate>(ctx, Some(&ns), std::future::pending()).await;
    });
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    loop {
        let t = s.api::<ProxmoxMachineTemplate>().get("workers").await?;
        if let Some(status) = t.status {
            assert_eq!(status.capacity["cpu"].0, "4");
            assert_eq!(status.capacity["memory"].0, "3072Mi");
            break;
        }
        if tokio::time::Instant::now() > deadline {
            bail!("no capacity published");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    controller.abort();
    Ok(())
}
