//! The banlieue controller against a real kube-apiserver and kube-controller-manager
//! (`banlieue-testenv`): a test plays the provider by writing the ProxmoxMachine's status, as
//! a provider process would, and observes what a user sees on the VirtualMachine.
//!
//! Run: `cargo test -p banlieue-controllers --test virtual_machines` (needs the control plane
//! binaries in `tests/controlplane/bin`, see `tests/controlplane/README.md`).

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail};
use banlieue_api::banlieue::{Provider, ProviderAllocation, VirtualMachine, VirtualMachinePhase};
use banlieue_api::common::PowerState;
use banlieue_api::condition;
use banlieue_api::infrastructure::{ProxmoxCluster, ProxmoxMachine};
use banlieue_controllers::controller::{Metrics, run_with_metrics};
use banlieue_testenv::TestEnv;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use tokio::sync::oneshot;

const WAIT: Duration = Duration::from_secs(30);

async fn env() -> anyhow::Result<&'static TestEnv> {
    Ok(TestEnv::shared_with(|b| b.crds(banlieue_api::crds::all())).await?)
}

/// The controller, running in this process on one namespace; stops when dropped.
struct RunningController {
    metrics: Arc<Metrics>,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl RunningController {
    fn start(client: Client, namespace: &str) -> Self {
        Self::start_in(client, Some(namespace))
    }

    /// Watching every namespace, as deployed: the Provider reconciler runs too. Only for a
    /// private control plane (the shared one has a namespaced controller per test).
    fn start_cluster_wide(client: Client) -> Self {
        Self::start_in(client, None)
    }

    fn start_in(client: Client, namespace: Option<&str>) -> Self {
        let (stop, stopped) = oneshot::channel::<()>();
        let metrics = Arc::new(Metrics::default());
        let task = tokio::spawn(run_with_metrics(
            client,
            namespace.map(str::to_owned),
            async move {
                let _ = stopped.await;
            },
            metrics.clone(),
        ));
        Self {
            metrics,
            stop: Some(stop),
            task,
        }
    }

    async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = tokio::time::timeout(WAIT, &mut self.task).await;
    }
}

impl Drop for RunningController {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Polls `probe` every 100 ms until it returns `Some`, failing after [`WAIT`] with `what`.
async fn eventually<T, F, Fut>(what: &str, mut probe: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<Option<T>>>,
{
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        if let Some(v) = probe().await? {
            return Ok(v);
        }
        if tokio::time::Instant::now() > deadline {
            bail!("timed out after {WAIT:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn create_provider(client: &Client, name: &str, labels: Value) -> anyhow::Result<Provider> {
    let provider: Provider = serde_json::from_value(json!({
        "apiVersion": "banlieue.io/v1alpha1", "kind": "Provider",
        "metadata": {"name": name, "labels": labels},
        "spec": {"backend": "proxmox", "endpoint": "https://pve.example:8006",
                 "credentialsRef": {"name": "pve", "namespace": "banlieue-system"},
                 "defaults": {"storage": "local-lvm"}},
    }))?;
    Api::<Provider>::all(client.clone())
        .create(&PostParams::default(), &provider)
        .await
        .context("creating Provider")
}

fn vm(name: &str, spec: Value) -> anyhow::Result<VirtualMachine> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine",
        "metadata": {"name": name}, "spec": spec,
    }))?)
}

fn ready_reason(vm: &VirtualMachine) -> Option<(String, String)> {
    let c = condition::find(&vm.status.as_ref()?.conditions, condition::READY)?;
    Some((c.status.clone(), c.reason.clone()))
}

/// Writes a provider-like status (and `spec.providerID`) on a ProxmoxMachine, with the
/// provider's own field manager, as the Proxmox provider does.
async fn provider_reports_running(api: &Api<ProxmoxMachine>, name: &str) -> anyhow::Result<()> {
    let pp = PatchParams::apply("fake-proxmox-provider").force();
    api.patch(
        name,
        &pp,
        &Patch::Apply(
            json!({"apiVersion": "infrastructure.banlieue.io/v1alpha1", "kind": "ProxmoxMachine",
            "spec": {"providerID": "proxmox://test/101"}}),
        ),
    )
    .await
    .context("provider sets providerID")?;
    api.patch_status(
        name,
        &pp,
        &Patch::Apply(json!({"apiVersion": "infrastructure.banlieue.io/v1alpha1", "kind": "ProxmoxMachine",
            "status": {
                "initialization": {"provisioned": true},
                "addresses": [{"type": "InternalIP", "address": "192.0.2.10"}],
                "powerState": "On", "node": "pve1", "vmid": 101,
                "provisioning": {"state": "Ready"},
                "conditions": [{"type": "Ready", "status": "True", "reason": "Running",
                    "message": "the VM runs and the guest agent answers", "lastTransitionTime": "2026-01-01T00:00:00Z"}],
            }})),
    )
    .await
    .context("provider writes status")?;
    Ok(())
}

/// The Proxmox provider's finalizer, which the controller writes with each machine and which
/// holds the machine until the provider has deleted its hypervisor VM.
const PROVIDER_FINALIZER: &str = "infrastructure.banlieue.io/proxmox";

/// Plays the provider's deletion: once the machine `name` is being deleted, takes its
/// finalizer off (the hypervisor VM is gone).
async fn provider_deletes(api: &Api<ProxmoxMachine>, name: &str) -> anyhow::Result<()> {
    let Some(deleting) = eventually("the ProxmoxMachine being deleted", || async {
        Ok(match api.get_opt(name).await? {
            None => Some(None),
            Some(m) => m.metadata.deletion_timestamp.is_some().then_some(Some(m)),
        })
    })
    .await?
    else {
        return Ok(());
    };
    let rest: Vec<String> = deleting
        .finalizers()
        .iter()
        .filter(|f| *f != PROVIDER_FINALIZER)
        .cloned()
        .collect();
    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": rest}})),
    )
    .await
    .context("the provider's finalizer removed")?;
    Ok(())
}

/// The provider's deletion progress, as the Proxmox provider reports it.
async fn provider_reports_deleting(
    api: &Api<ProxmoxMachine>,
    name: &str,
    message: &str,
) -> anyhow::Result<()> {
    api.patch_status(
        name,
        &PatchParams::apply("fake-proxmox-provider").force(),
        &Patch::Apply(
            json!({"apiVersion": "infrastructure.banlieue.io/v1alpha1", "kind": "ProxmoxMachine",
            "status": {"conditions": [{"type": "Ready", "status": "False", "reason": "Deleting",
                "message": message, "lastTransitionTime": "2026-01-01T00:00:00Z"}]}}),
        ),
    )
    .await
    .context("provider reports deletion progress")?;
    Ok(())
}

#[tokio::test]
async fn virtual_machine_lifecycle_on_proxmox() -> anyhow::Result<()> {
    let env = env().await?;
    let ns = env.namespace("vm-lifecycle").await?;
    let client = env.client().await?;
    let provider_name = format!("{ns}-pve");
    create_provider(&client, &provider_name, json!({})).await?;
    let controller = RunningController::start(client.clone(), &ns);
    let vms: Api<VirtualMachine> = Api::namespaced(client.clone(), &ns);
    let machines: Api<ProxmoxMachine> = Api::namespaced(client.clone(), &ns);

    let created = vms
        .create(
            &PostParams::default(),
            &vm(
                "web",
                json!({"providerRef": {"name": provider_name}, "source": {"proxmox": {"vmid": 9000}},
                   "cpu": {"cores": 2}, "memoryMiB": 2048,
                   "networks": [{"name": "net0", "network": "vmbr0"}]}),
            )?,
        )
        .await?;

    // 1. The ProxmoxMachine appears with the mapped spec and a controller ownerReference.
    let pm = eventually("the ProxmoxMachine", || async {
        Ok(machines.get_opt("web").await?)
    })
    .await?;
    assert_eq!(pm.spec.memory_mib, 2048);
    assert_eq!(pm.spec.cpu.cores, 2);
    assert_eq!(pm.spec.source.vmid, Some(9000));
    assert_eq!(
        pm.spec.provider_ref.as_ref().map(|r| r.name.as_str()),
        Some(provider_name.as_str())
    );
    assert_eq!(pm.spec.storage.as_deref(), Some("local-lvm"));
    assert_eq!(pm.spec.networks[0].network, "vmbr0");
    let owner = pm.owner_references().first().context("an ownerReference")?;
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str()),
        ("VirtualMachine", "web")
    );
    assert_eq!(Some(owner.uid.as_str()), created.metadata.uid.as_deref());
    assert_eq!(owner.controller, Some(true));
    assert_eq!(
        pm.labels().get("banlieue.io/virtual-machine").map(String::as_str),
        Some("web")
    );
    assert!(
        vms.get("web")
            .await?
            .finalizers()
            .contains(&"banlieue.io/virtual-machine".to_owned()),
        "the VirtualMachine carries the controller's finalizer"
    );
    // The infra cluster object of the Provider in this namespace, owned by the Provider.
    let clusters: Api<ProxmoxCluster> = Api::namespaced(client.clone(), &ns);
    let pxc = clusters
        .get(&format!("banlieue-{provider_name}"))
        .await
        .context("the ProxmoxCluster of the Provider")?;
    assert_eq!(
        pxc.spec.provider_ref.as_ref().map(|r| r.name.as_str()),
        Some(provider_name.as_str())
    );
    let owner = pxc.owner_references().first().context("an ownerReference")?;
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str(), owner.controller),
        ("Provider", provider_name.as_str(), Some(true))
    );
    assert_eq!(
        pxc.labels()
            .get("app.kubernetes.io/managed-by")
            .map(String::as_str),
        Some("banlieue-controller")
    );

    let pending = eventually("VirtualMachine phase Provisioning", || async {
        let v = vms.get("web").await?;
        let phase = v.status.as_ref().and_then(|s| s.phase);
        Ok((phase == Some(VirtualMachinePhase::Provisioning)).then_some(v))
    })
    .await?;
    let status = pending.status.as_ref().context("status")?;
    assert_eq!(status.provider.as_deref(), Some(provider_name.as_str()));
    assert_eq!(
        status.infrastructure_ref.as_ref().map(|r| r.kind.as_str()),
        Some("ProxmoxMachine")
    );
    assert_eq!(ready_reason(&pending), Some(("False".into(), "Pending".into())));

    // 2. The provider reports Running; the VirtualMachine mirrors it.
    provider_reports_running(&machines, "web").await?;
    let running = eventually("VirtualMachine Running and Ready", || async {
        let v = vms.get("web").await?;
        let ok = v.status.as_ref().and_then(|s| s.phase) == Some(VirtualMachinePhase::Running)
            && ready_reason(&v) == Some(("True".into(), "Running".into()));
        Ok(ok.then_some(v))
    })
    .await?;
    let status = running.status.as_ref().context("status")?;
    assert_eq!(status.provider_id.as_deref(), Some("proxmox://test/101"));
    assert_eq!(status.addresses[0].address, "192.0.2.10");
    assert_eq!(status.node.as_deref(), Some("pve1"));
    assert_eq!(status.observed_generation, running.metadata.generation);
    for t in [condition::PROVISIONED, condition::INFRASTRUCTURE_READY] {
        assert!(
            condition::is_true(&status.conditions, t),
            "{t} should be True: {:?}",
            status.conditions
        );
    }

    // What a user sees with kubectl: `wait --for=condition=Ready` returns, `get bvm` has columns.
    let wait = banlieue_testenv::run_with_timeout(
        env.kubectl().args([
            "wait",
            "--for=condition=Ready",
            "virtualmachine/web",
            "-n",
            &ns,
            "--timeout=20s",
        ]),
        WAIT,
    )?;
    assert!(
        wait.status.success(),
        "kubectl wait: {}",
        String::from_utf8_lossy(&wait.stderr)
    );
    let get = banlieue_testenv::run_with_timeout(env.kubectl().args(["get", "bvm", "web", "-n", &ns]), WAIT)?;
    let table = String::from_utf8_lossy(&get.stdout);
    let mut lines = table.lines();
    let (header, row) = (lines.next().unwrap_or_default(), lines.next().unwrap_or_default());
    for column in ["PHASE", "POWER", "PROVIDER", "NODE", "IP"] {
        assert!(header.contains(column), "column {column} in {header:?}");
    }
    for value in ["Running", "On", provider_name.as_str(), "pve1", "192.0.2.10"] {
        assert!(row.contains(value), "{value} in {row:?}");
    }

    // 3. Memory grows: propagated, and the provider's providerID is left alone.
    vms.patch(
        "web",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"memoryMiB": 8192}})),
    )
    .await?;
    let grown = eventually("memoryMiB 8192 on the ProxmoxMachine", || async {
        let pm = machines.get("web").await?;
        Ok((pm.spec.memory_mib == 8192).then_some(pm))
    })
    .await?;
    assert_eq!(grown.spec.provider_id.as_deref(), Some("proxmox://test/101"));
    eventually("observedGeneration 2", || async {
        let v = vms.get("web").await?;
        Ok((v.status.as_ref().and_then(|s| s.observed_generation) == Some(2)).then_some(v))
    })
    .await?;

    // A field the controller stops setting is removed from the machine.
    vms.patch(
        "web",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"networks": null}})),
    )
    .await?;
    eventually("the network removed from the ProxmoxMachine", || async {
        Ok(machines.get("web").await?.spec.networks.is_empty().then_some(()))
    })
    .await?;
    let vm_now = eventually("observedGeneration 3", || async {
        let v = vms.get("web").await?;
        Ok((v.status.as_ref().and_then(|s| s.observed_generation) == Some(3)).then_some(v))
    })
    .await?;
    let pm_now = machines.get("web").await?;
    assert_eq!(pm_now.spec.provider_id.as_deref(), Some("proxmox://test/101"));
    assert_eq!(
        pm_now.status.as_ref().and_then(|s| s.vmid),
        Some(101),
        "provider status untouched"
    );

    // 4. A restarted controller reconciles everything again and writes nothing.
    controller.stop().await;
    let (vm_rv, pm_rv) = (vm_now.resource_version(), pm_now.resource_version());
    let controller = RunningController::start(client.clone(), &ns);
    eventually(
        "the restarted controller to reconcile the VirtualMachine",
        || async { Ok((controller.metrics.snapshot().reconciles >= 1).then_some(())) },
    )
    .await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let counters = controller.metrics.snapshot();
    assert_eq!(counters.writes(), 0, "writes on a no-op resync: {counters:?}");
    assert_eq!(
        vms.get("web").await?.resource_version(),
        vm_rv,
        "VirtualMachine changed on a no-op resync"
    );
    assert_eq!(
        machines.get("web").await?.resource_version(),
        pm_rv,
        "ProxmoxMachine changed on a no-op resync"
    );

    // 5. Power: the VirtualMachine's powerState reaches the machine.
    vms.patch(
        "web",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"powerState": "Off"}})),
    )
    .await?;
    eventually("powerState Off on the ProxmoxMachine", || async {
        let pm = machines.get("web").await?;
        Ok((pm.spec.power_state == Some(PowerState::Off)).then_some(()))
    })
    .await?;

    // 6. Deletion: the controller deletes the machine and keeps its finalizer (showing the
    // provider's progress) until the provider's own finalizer, which the controller wrote with
    // the machine, lets the machine go.
    assert_eq!(
        machines.get("web").await?.finalizers(),
        [PROVIDER_FINALIZER.to_owned()],
        "the machine carries the provider's finalizer from its creation"
    );
    vms.delete("web", &DeleteParams::background()).await?;
    eventually("the ProxmoxMachine being deleted", || async {
        let pm = machines.get("web").await?;
        Ok(pm.metadata.deletion_timestamp.is_some().then_some(()))
    })
    .await?;
    provider_reports_deleting(&machines, "web", "stopping VM 101").await?;
    let deleting = eventually("VirtualMachine Deleting with the provider's message", || async {
        let v = vms.get("web").await?;
        let message = v
            .status
            .as_ref()
            .and_then(|s| condition::find(&s.conditions, condition::READY))
            .map(|c| c.message.clone());
        Ok((message.as_deref() == Some("stopping VM 101")).then_some(v))
    })
    .await?;
    assert_eq!(
        deleting.status.as_ref().and_then(|s| s.phase),
        Some(VirtualMachinePhase::Deleting)
    );
    machines
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await?;
    eventually("the VirtualMachine gone after its machine", || async {
        Ok(vms.get_opt("web").await?.is_none().then_some(()))
    })
    .await?;
    assert!(machines.get_opt("web").await?.is_none());
    controller.stop().await;
    Api::<Provider>::all(client)
        .delete(&provider_name, &DeleteParams::default())
        .await?;
    Ok(())
}

#[tokio::test]
async fn missing_provider_is_reported_then_resolved_when_it_appears() -> anyhow::Result<()> {
    let env = env().await?;
    let ns = env.namespace("vm-missing").await?;
    let client = env.client().await?;
    let controller = RunningController::start(client.clone(), &ns);
    let vms: Api<VirtualMachine> = Api::namespaced(client.clone(), &ns);
    let machines: Api<ProxmoxMachine> = Api::namespaced(client.clone(), &ns);
    let provider_name = format!("{ns}-later");
    vms.create(
        &PostParams::default(),
        &vm(
            "orphan",
            json!({"providerRef": {"name": provider_name}, "source": {"proxmox": {"vmid": 9000}},
               "cpu": {"cores": 1}, "memoryMiB": 512}),
        )?,
    )
    .await?;
    let v = eventually("Ready=False ProviderNotFound", || async {
        let v = vms.get("orphan").await?;
        Ok((ready_reason(&v) == Some(("False".into(), "ProviderNotFound".into()))).then_some(v))
    })
    .await?;
    let ready = condition::find(&v.status.as_ref().context("status")?.conditions, condition::READY)
        .context("Ready")?;
    assert!(
        ready.message.contains(&provider_name),
        "message names the Provider: {}",
        ready.message
    );
    // A missing Provider needs a human: phase Failed until it exists.
    assert_eq!(
        v.status.as_ref().and_then(|s| s.phase),
        Some(VirtualMachinePhase::Failed)
    );
    assert!(machines.get_opt("orphan").await?.is_none());
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(client.clone(), &ns);
    let warning = eventually("a ProviderNotFound Warning event", || async {
        Ok(events
            .list(&Default::default())
            .await?
            .items
            .into_iter()
            .find(|e| e.reason.as_deref() == Some("ProviderNotFound")))
    })
    .await?;
    assert_eq!(warning.type_.as_deref(), Some("Warning"));
    assert_eq!(
        warning.regarding.as_ref().and_then(|r| r.name.as_deref()),
        Some("orphan")
    );

    // Creating the Provider triggers the VirtualMachine at once (not after the 5 min retry).
    create_provider(&client, &provider_name, json!({})).await?;
    eventually("the ProxmoxMachine once the Provider exists", || async {
        Ok(machines.get_opt("orphan").await?)
    })
    .await?;
    controller.stop().await;
    Api::<Provider>::all(client)
        .delete(&provider_name, &DeleteParams::default())
        .await?;
    Ok(())
}

#[tokio::test]
async fn selector_picks_a_labelled_provider_and_missing_class_is_reported() -> anyhow::Result<()> {
    let env = env().await?;
    let ns = env.namespace("vm-select").await?;
    let client = env.client().await?;
    let zone = ns.to_string();
    let name = format!("{ns}-zoned");
    create_provider(&client, &name, json!({"banlieue.io/test-zone": zone})).await?;
    let controller = RunningController::start(client.clone(), &ns);
    let vms: Api<VirtualMachine> = Api::namespaced(client.clone(), &ns);
    let machines: Api<ProxmoxMachine> = Api::namespaced(client.clone(), &ns);
    let selector = json!({"providerSelector": {"matchLabels": {"banlieue.io/test-zone": zone}}});
    vms.create(
        &PostParams::default(),
        &vm(
            "picked",
            json!({"placement": selector, "source": {"proxmox": {"vmid": 9000}}, "cpu": {"cores": 1}, "memoryMiB": 512}),
        )?,
    )
    .await?;
    vms.create(
        &PostParams::default(),
        &vm(
            "classless",
            json!({"placement": selector, "source": {"proxmox": {"vmid": 9000}}, "classRef": {"name": format!("{ns}-nope")}}),
        )?,
    )
    .await?;
    let pm = eventually("the selected ProxmoxMachine", || async {
        Ok(machines.get_opt("picked").await?)
    })
    .await?;
    assert_eq!(pm.spec.provider_ref.map(|r| r.name), Some(name.clone()));
    let recorded = eventually("status.provider", || async {
        Ok(vms.get("picked").await?.status.and_then(|s| s.provider))
    })
    .await?;
    assert_eq!(recorded, name);
    eventually("Ready=False ClassNotFound", || async {
        let v = vms.get("classless").await?;
        Ok((ready_reason(&v) == Some(("False".into(), "ClassNotFound".into()))).then_some(()))
    })
    .await?;
    assert!(machines.get_opt("classless").await?.is_none());
    controller.stop().await;
    Api::<Provider>::all(client)
        .delete(&name, &DeleteParams::default())
        .await?;
    Ok(())
}

#[tokio::test]
async fn invalid_virtual_machine_is_rejected_by_the_apiserver_with_the_cel_message() -> anyhow::Result<()> {
    let env = env().await?;
    let ns = env.namespace("vm-invalid").await?;
    let vms: Api<VirtualMachine> = Api::namespaced(env.client().await?, &ns);
    let both = vm(
        "both",
        json!({"providerRef": {"name": "a"}, "placement": {"providerSelector": {}},
               "source": {"proxmox": {"vmid": 9000}}, "cpu": {"cores": 1}, "memoryMiB": 512}),
    )?;
    let err = vms
        .create(&PostParams::default(), &both)
        .await
        .expect_err("rejected");
    assert!(
        err.to_string()
            .contains("set exactly one of spec.providerRef or spec.placement.providerSelector"),
        "{err}"
    );
    Ok(())
}

#[tokio::test]
async fn a_machine_owned_by_someone_else_is_never_touched() -> anyhow::Result<()> {
    let env = env().await?;
    let ns = env.namespace("vm-conflict").await?;
    let client = env.client().await?;
    let provider_name = format!("{ns}-pve");
    create_provider(&client, &provider_name, json!({})).await?;
    let machines: Api<ProxmoxMachine> = Api::namespaced(client.clone(), &ns);
    // A ProxmoxMachine as CAPI would create it (owned by a Machine), with the VM's name.
    let capi_owned: ProxmoxMachine = serde_json::from_value(json!({
        "apiVersion": "infrastructure.banlieue.io/v1alpha1", "kind": "ProxmoxMachine",
        "metadata": {"name": "taken", "ownerReferences": [{"apiVersion": "cluster.x-k8s.io/v1beta2",
            "kind": "Machine", "name": "m", "uid": "00000000-0000-0000-0000-000000000001", "controller": true}]},
        "spec": {"source": {"vmid": 100}, "cpu": {"cores": 8}, "memoryMiB": 16384},
    }))?;
    let before = machines.create(&PostParams::default(), &capi_owned).await?;
    let controller = RunningController::start(client.clone(), &ns);
    let vms: Api<VirtualMachine> = Api::namespaced(client.clone(), &ns);
    vms.create(
        &PostParams::default(),
        &vm(
            "taken",
            json!({"providerRef": {"name": provider_name}, "source": {"proxmox": {"vmid": 9000}},
               "cpu": {"cores": 1}, "memoryMiB": 512}),
        )?,
    )
    .await?;
    eventually("Ready=False InfrastructureMachineConflict", || async {
        let v = vms.get("taken").await?;
        Ok(
            (ready_reason(&v) == Some(("False".into(), "InfrastructureMachineConflict".into())))
                .then_some(()),
        )
    })
    .await?;
    let after = machines.get("taken").await?;
    assert_eq!(
        after.resource_version(),
        before.resource_version(),
        "the CAPI-owned machine was modified"
    );
    assert_eq!(after.spec.memory_mib, 16384);
    assert_eq!(controller.metrics.snapshot().machine_applies, 0);
    controller.stop().await;
    Api::<Provider>::all(client)
        .delete(&provider_name, &DeleteParams::default())
        .await?;
    Ok(())
}

#[tokio::test]
async fn one_infra_cluster_per_provider_and_namespace_and_it_comes_back_when_deleted() -> anyhow::Result<()> {
    let env = env().await?;
    let ns = env.namespace("vm-infra-cluster").await?;
    let client = env.client().await?;
    let provider_name = format!("{ns}-pve");
    create_provider(&client, &provider_name, json!({})).await?;
    let controller = RunningController::start(client.clone(), &ns);
    let vms: Api<VirtualMachine> = Api::namespaced(client.clone(), &ns);
    let machines: Api<ProxmoxMachine> = Api::namespaced(client.clone(), &ns);
    let clusters: Api<ProxmoxCluster> = Api::namespaced(client.clone(), &ns);
    for name in ["a", "b", "c"] {
        vms.create(
            &PostParams::default(),
            &vm(
                name,
                json!({"providerRef": {"name": provider_name}, "source": {"proxmox": {"vmid": 9000}},
                   "cpu": {"cores": 1}, "memoryMiB": 512}),
            )?,
        )
        .await?;
    }
    for name in ["a", "b", "c"] {
        eventually("the ProxmoxMachine", || async {
            Ok(machines.get_opt(name).await?)
        })
        .await?;
    }
    let listed = clusters.list(&Default::default()).await?.items;
    assert_eq!(listed.len(), 1, "one ProxmoxCluster for three VirtualMachines");
    assert_eq!(controller.metrics.snapshot().cluster_applies, 1);
    let cluster_name = format!("banlieue-{provider_name}");
    assert_eq!(listed[0].name_any(), cluster_name);

    // Deleted by hand: applied again at once (not at the next resync).
    clusters
        .delete(&cluster_name, &DeleteParams::background())
        .await?;
    let old_uid = listed[0].metadata.uid.clone();
    eventually("the ProxmoxCluster re-created", || async {
        let c = clusters.get_opt(&cluster_name).await?;
        Ok(c.filter(|c| c.metadata.uid != old_uid).map(|_| ()))
    })
    .await?;
    assert_eq!(clusters.list(&Default::default()).await?.items.len(), 1);
    controller.stop().await;
    Api::<Provider>::all(client)
        .delete(&provider_name, &DeleteParams::default())
        .await?;
    Ok(())
}

#[tokio::test]
async fn an_infra_cluster_not_controlled_by_the_provider_is_never_touched() -> anyhow::Result<()> {
    let env = env().await?;
    let ns = env.namespace("vm-cluster-conflict").await?;
    let client = env.client().await?;
    let provider_name = format!("{ns}-pve");
    create_provider(&client, &provider_name, json!({})).await?;
    let clusters: Api<ProxmoxCluster> = Api::namespaced(client.clone(), &ns);
    let cluster_name = format!("banlieue-{provider_name}");
    let by_hand: ProxmoxCluster = serde_json::from_value(json!({
        "apiVersion": "infrastructure.banlieue.io/v1alpha1", "kind": "ProxmoxCluster",
        "metadata": {"name": cluster_name},
        "spec": {"endpoint": "https://other.example:8006", "credentialsRef": {"name": "x"}},
    }))?;
    let before = clusters.create(&PostParams::default(), &by_hand).await?;
    let controller = RunningController::start(client.clone(), &ns);
    let vms: Api<VirtualMachine> = Api::namespaced(client.clone(), &ns);
    vms.create(
        &PostParams::default(),
        &vm(
            "blocked",
            json!({"providerRef": {"name": provider_name}, "source": {"proxmox": {"vmid": 9000}},
               "cpu": {"cores": 1}, "memoryMiB": 512}),
        )?,
    )
    .await?;
    eventually("Ready=False InfrastructureClusterConflict", || async {
        let v = vms.get("blocked").await?;
        Ok(
            (ready_reason(&v) == Some(("False".into(), "InfrastructureClusterConflict".into())))
                .then_some(()),
        )
    })
    .await?;
    assert_eq!(
        clusters.get(&cluster_name).await?.resource_version(),
        before.resource_version(),
        "the hand-made ProxmoxCluster was modified"
    );
    let machines: Api<ProxmoxMachine> = Api::namespaced(client.clone(), &ns);
    assert!(machines.get_opt("blocked").await?.is_none());
    controller.stop().await;
    Api::<Provider>::all(client)
        .delete(&provider_name, &DeleteParams::default())
        .await?;
    Ok(())
}

/// Writes the generated ProxmoxCluster's `Ready` as the Proxmox provider's cluster controller
/// does (and `initialization.provisioned` once Ready).
async fn provider_reports_cluster(
    api: &Api<ProxmoxCluster>,
    name: &str,
    ready: bool,
    reason: &str,
    message: &str,
) -> anyhow::Result<()> {
    let mut status = json!({"conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" },
        "reason": reason, "message": message, "lastTransitionTime": "2026-01-01T00:00:00Z"}]});
    if ready {
        status["initialization"] = json!({"provisioned": true});
    }
    api.patch_status(
        name,
        &PatchParams::apply("fake-proxmox-provider").force(),
        &Patch::Apply(
            json!({"apiVersion": "infrastructure.banlieue.io/v1alpha1", "kind": "ProxmoxCluster",
            "status": status}),
        ),
    )
    .await
    .context("provider writes the ProxmoxCluster status")?;
    Ok(())
}

/// The Warning Events regarding VirtualMachine `name` with `reason`.
async fn warnings(
    events: &Api<k8s_openapi::api::events::v1::Event>,
    name: &str,
    reason: &str,
) -> anyhow::Result<Vec<k8s_openapi::api::events::v1::Event>> {
    Ok(events
        .list(&Default::default())
        .await?
        .items
        .into_iter()
        .filter(|e| {
            e.reason.as_deref() == Some(reason)
                && e.type_.as_deref() == Some("Warning")
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
        })
        .collect())
}

/// The generated ProxmoxCluster cannot authenticate: the VirtualMachine (not only the cluster
/// nobody looks at) shows the cause with the Provider's name, phase Failed and one Warning
/// Event; a no-op reconcile writes nothing; fixing the credentials brings it back.
#[tokio::test]
async fn the_infra_clusters_cause_reaches_the_virtual_machine_and_clears_when_fixed() -> anyhow::Result<()> {
    let env = env().await?;
    let ns = env.namespace("vm-cluster-cause").await?;
    let client = env.client().await?;
    let provider_name = format!("{ns}-pve");
    create_provider(&client, &provider_name, json!({})).await?;
    let controller = RunningController::start(client.clone(), &ns);
    let vms: Api<VirtualMachine> = Api::namespaced(client.clone(), &ns);
    let machines: Api<ProxmoxMachine> = Api::namespaced(client.clone(), &ns);
    let clusters: Api<ProxmoxCluster> = Api::namespaced(client.clone(), &ns);
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(client.clone(), &ns);
    vms.create(
        &PostParams::default(),
        &vm(
            "db",
            json!({"providerRef": {"name": provider_name}, "source": {"proxmox": {"vmid": 9000}},
               "cpu": {"cores": 1}, "memoryMiB": 512}),
        )?,
    )
    .await?;
    eventually("the ProxmoxMachine", || async {
        Ok(machines.get_opt("db").await?)
    })
    .await?;
    let cluster_name = format!("banlieue-{provider_name}");
    eventually("the ProxmoxCluster", || async {
        Ok(clusters.get_opt(&cluster_name).await?)
    })
    .await?;

    // The provider: the machine waits for the cluster (mirrored as is), then the cluster
    // reports that it cannot authenticate. Only the cluster changes at that point, so this
    // also shows that a cluster's Ready change reconciles the VirtualMachine.
    machines
        .patch_status(
            "db",
            &PatchParams::apply("fake-proxmox-provider").force(),
            &Patch::Apply(json!({"apiVersion": "infrastructure.banlieue.io/v1alpha1", "kind": "ProxmoxMachine",
                "status": {"conditions": [{"type": "Ready", "status": "False",
                    "reason": "WaitingForClusterInfrastructure",
                    "message": format!("ProxmoxCluster {cluster_name} (of Provider {provider_name}) is not provisioned yet"),
                    "lastTransitionTime": "2026-01-01T00:00:00Z"}]}})),
        )
        .await?;
    eventually("Ready=False WaitingForClusterInfrastructure", || async {
        let v = vms.get("db").await?;
        Ok(
            (ready_reason(&v) == Some(("False".into(), "WaitingForClusterInfrastructure".into())))
                .then_some(()),
        )
    })
    .await?;
    provider_reports_cluster(
        &clusters,
        &cluster_name,
        false,
        "AuthenticationFailed",
        "401 authentication failure: invalid API token",
    )
    .await?;
    let failed = eventually("Ready=False AuthenticationFailed, phase Failed", || async {
        let v = vms.get("db").await?;
        let ok = ready_reason(&v) == Some(("False".into(), "AuthenticationFailed".into()))
            && v.status.as_ref().and_then(|s| s.phase) == Some(VirtualMachinePhase::Failed);
        Ok(ok.then_some(v))
    })
    .await?;
    let ready = condition::find(
        &failed.status.as_ref().context("status")?.conditions,
        condition::READY,
    )
    .context("Ready")?;
    assert_eq!(
        ready.message,
        format!("Provider {provider_name}: 401 authentication failure: invalid API token")
    );
    eventually(
        "one AuthenticationFailed Warning on the VirtualMachine",
        || async { Ok((!warnings(&events, "db", "AuthenticationFailed").await?.is_empty()).then_some(())) },
    )
    .await?;

    // A reconcile that changes nothing (an annotation on the VM) writes nothing and publishes
    // no second Event.
    let before = controller.metrics.snapshot();
    vms.patch(
        "db",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"annotations": {"test.banlieue.io/poke": "1"}}})),
    )
    .await?;
    eventually("the reconcile of the annotated VirtualMachine", || async {
        Ok((controller.metrics.snapshot().reconciles > before.reconciles).then_some(()))
    })
    .await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = controller.metrics.snapshot();
    assert_eq!(after.writes(), before.writes(), "a no-op reconcile wrote");
    let published = warnings(&events, "db", "AuthenticationFailed").await?;
    assert_eq!(published.len(), 1, "one Event object for the cause");
    assert!(
        published[0].series.is_none(),
        "the Event was not repeated: {:?}",
        published[0].series
    );

    // The operator fixes the credentials: the cluster becomes Ready, the provider provisions.
    provider_reports_cluster(&clusters, &cluster_name, true, "Provisioned", "").await?;
    provider_reports_running(&machines, "db").await?;
    eventually("Ready=True, phase Running", || async {
        let v = vms.get("db").await?;
        let ok = ready_reason(&v).is_some_and(|(s, _)| s == "True")
            && v.status.as_ref().and_then(|s| s.phase) == Some(VirtualMachinePhase::Running);
        Ok(ok.then_some(()))
    })
    .await?;
    controller.stop().await;
    Api::<Provider>::all(client)
        .delete(&provider_name, &DeleteParams::default())
        .await?;
    Ok(())
}

/// A VirtualMachine whose user-data Secret does not exist: the provider waits for bootstrap
/// data; the VirtualMachine says which Secret to create, phase Failed, one Warning Event; once
/// the provider can provision, Running.
#[tokio::test]
async fn a_missing_user_data_secret_is_shown_on_the_virtual_machine() -> anyhow::Result<()> {
    let env = env().await?;
    let ns = env.namespace("vm-user-data").await?;
    let client = env.client().await?;
    let provider_name = format!("{ns}-pve");
    create_provider(&client, &provider_name, json!({})).await?;
    let controller = RunningController::start(client.clone(), &ns);
    let vms: Api<VirtualMachine> = Api::namespaced(client.clone(), &ns);
    let machines: Api<ProxmoxMachine> = Api::namespaced(client.clone(), &ns);
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(client.clone(), &ns);
    vms.create(
        &PostParams::default(),
        &vm(
            "app",
            json!({"providerRef": {"name": provider_name}, "source": {"proxmox": {"vmid": 9000}},
               "cpu": {"cores": 1}, "memoryMiB": 512, "userDataSecretRef": {"name": "app-cloud-init"}}),
        )?,
    )
    .await?;
    eventually("the ProxmoxMachine", || async {
        Ok(machines.get_opt("app").await?)
    })
    .await?;
    machines
        .patch_status(
            "app",
            &PatchParams::apply("fake-proxmox-provider").force(),
            &Patch::Apply(
                json!({"apiVersion": "infrastructure.banlieue.io/v1alpha1", "kind": "ProxmoxMachine",
                "status": {"conditions": [{"type": "Ready", "status": "False",
                    "reason": "WaitingForBootstrapData",
                    "message": format!("Secret {ns}/app-cloud-init not found"),
                    "lastTransitionTime": "2026-01-01T00:00:00Z"}]}}),
            ),
        )
        .await?;
    let failed = eventually("Ready=False UserDataSecretNotFound, phase Failed", || async {
        let v = vms.get("app").await?;
        let ok = ready_reason(&v) == Some(("False".into(), "UserDataSecretNotFound".into()))
            && v.status.as_ref().and_then(|s| s.phase) == Some(VirtualMachinePhase::Failed);
        Ok(ok.then_some(v))
    })
    .await?;
    let ready = condition::find(
        &failed.status.as_ref().context("status")?.conditions,
        condition::READY,
    )
    .context("Ready")?;
    assert!(ready.message.contains("app-cloud-init"), "{}", ready.message);
    eventually(
        "a UserDataSecretNotFound Warning on the VirtualMachine",
        || async {
            Ok((!warnings(&events, "app", "UserDataSecretNotFound")
                .await?
                .is_empty())
            .then_some(()))
        },
    )
    .await?;
    provider_reports_running(&machines, "app").await?;
    eventually("phase Running", || async {
        let v = vms.get("app").await?;
        Ok((v.status.as_ref().and_then(|s| s.phase) == Some(VirtualMachinePhase::Running)).then_some(()))
    })
    .await?;
    controller.stop().await;
    Api::<Provider>::all(client)
        .delete(&provider_name, &DeleteParams::default())
        .await?;
    Ok(())
}

/// A Provider's `spec.capacity.virtualMachines` is honoured (three VMs asked of a Provider for
/// two: two placed, the third told why and placed once a slot frees up), `status.allocated`
/// counts them, and a Provider that VMs use is not deleted before the last of them: its
/// deletion says which VMs it waits for, takes no new VM, and completes by itself when they
/// are gone.
#[tokio::test]
async fn provider_capacity_is_honoured_and_a_provider_in_use_outlives_its_last_vm() -> anyhow::Result<()> {
    let env = TestEnv::builder().crds(banlieue_api::crds::all()).start().await?;
    let client = env.client().await?;
    let ns = env.namespace("capacity").await?;
    let controller = RunningController::start_cluster_wide(client.clone());
    let providers: Api<Provider> = Api::all(client.clone());
    let vms: Api<VirtualMachine> = Api::namespaced(client.clone(), &ns);
    let machines: Api<ProxmoxMachine> = Api::namespaced(client.clone(), &ns);
    let provider: Provider = serde_json::from_value(json!({
        "apiVersion": "banlieue.io/v1alpha1", "kind": "Provider", "metadata": {"name": "small"},
        "spec": {"backend": "proxmox", "endpoint": "https://pve.example:8006",
                 "credentialsRef": {"name": "pve", "namespace": "banlieue-system"},
                 "capacity": {"virtualMachines": 2}},
    }))?;
    providers.create(&PostParams::default(), &provider).await?;
    let spec = json!({"providerRef": {"name": "small"}, "source": {"proxmox": {"vmid": 9000}},
                      "cpu": {"cores": 1}, "memoryMiB": 512});
    let names = ["vm-a", "vm-b", "vm-c"];
    for name in names {
        vms.create(&PostParams::default(), &vm(name, spec.clone())?)
            .await?;
    }

    // Two placed, one refused with the reason and what to do.
    let full = eventually("two VMs placed and one ProviderFull", || async {
        let list = vms.list(&Default::default()).await?.items;
        let placed = list
            .iter()
            .filter(|v| v.status.as_ref().and_then(|s| s.provider.as_deref()) == Some("small"))
            .count();
        let full: Vec<_> = list
            .iter()
            .filter(|v| ready_reason(v).is_some_and(|(_, r)| r == "ProviderFull"))
            .map(ResourceExt::name_any)
            .collect();
        Ok((placed == 2 && full.len() == 1).then(|| full[0].clone()))
    })
    .await?;
    let refused = vms.get(&full).await?;
    let message = &condition::find(
        &refused.status.as_ref().context("status")?.conditions,
        condition::READY,
    )
    .context("Ready")?
    .message;
    assert!(message.contains("2 of its 2 VirtualMachines"), "{message}");
    assert_eq!(machines.list(&Default::default()).await?.items.len(), 2);
    assert!(
        machines.get_opt(&full).await?.is_none(),
        "the refused VM got a machine"
    );
    let allocated = eventually("status.allocated.virtualMachines = 2", || async {
        let p = providers.get("small").await?;
        let n = p
            .status
            .and_then(|s| s.allocated)
            .and_then(|a| a.virtual_machines);
        Ok((n == Some(2)).then_some(()))
    })
    .await;
    allocated?;
    let small = providers.get("small").await?;
    assert_eq!(
        small.status.and_then(|s| s.allocated),
        Some(ProviderAllocation {
            vcpus: Some(2),
            memory_mib: Some(1024),
            storage_gib: Some(0),
            virtual_machines: Some(2),
        }),
        "the sum of what its two VMs recorded"
    );

    // One more VM slot, but no vCPU left: the waiting VM is told which capacity holds it back.
    providers
        .patch(
            "small",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"capacity": {"virtualMachines": 3, "vcpus": 2}}})),
        )
        .await?;
    let held = eventually("ProviderFull on spec.capacity.vcpus", || async {
        let v = vms.get(&full).await?;
        let message = v
            .status
            .as_ref()
            .and_then(|s| condition::find(&s.conditions, condition::READY))
            .map(|c| c.message.clone())
            .unwrap_or_default();
        Ok(message.contains("spec.capacity.vcpus").then_some(message))
    })
    .await?;
    assert!(held.contains("take 2 of its 2"), "{held}");
    assert!(machines.get_opt(&full).await?.is_none(), "{held}");
    let in_use = providers.get("small").await?;
    assert!(
        in_use
            .finalizers()
            .iter()
            .any(|f| f == "banlieue.io/provider-in-use"),
        "{:?}",
        in_use.finalizers()
    );

    // A freed slot goes to the waiting VM.
    let placed: Vec<&str> = names.iter().copied().filter(|n| *n != full).collect();
    vms.delete(placed[0], &DeleteParams::default()).await?;
    provider_deletes(&machines, placed[0]).await?;
    eventually("the waiting VM placed once a slot is free", || async {
        let v = vms.get(&full).await?;
        Ok((v.status.as_ref().and_then(|s| s.provider.as_deref()) == Some("small")).then_some(()))
    })
    .await?;
    eventually("the deleted VM gone", || async {
        Ok(vms.get_opt(placed[0]).await?.is_none().then_some(()))
    })
    .await?;

    // Deleting the Provider waits for its VMs, says so, and takes no new VM.
    providers.delete("small", &DeleteParams::default()).await?;
    let waiting = [placed[1], full.as_str()];
    let blocked = eventually("Ready=False DeletionBlockedByVirtualMachines", || async {
        let p = providers.get("small").await?;
        let c = p
            .status
            .as_ref()
            .and_then(|s| condition::find(&s.conditions, condition::READY).cloned());
        Ok(c.filter(|c| c.reason == "DeletionBlockedByVirtualMachines"))
    })
    .await?;
    for name in waiting {
        assert!(
            blocked.message.contains(&format!("{ns}/{name}")),
            "{}",
            blocked.message
        );
    }
    vms.create(&PostParams::default(), &vm("vm-late", spec.clone())?)
        .await?;
    eventually("a new VM refused: ProviderDeleting", || async {
        let v = vms.get("vm-late").await?;
        Ok((ready_reason(&v) == Some(("False".into(), "ProviderDeleting".into()))).then_some(()))
    })
    .await?;
    assert!(machines.get_opt("vm-late").await?.is_none());
    assert!(
        providers.get_opt("small").await?.is_some(),
        "deleted while in use"
    );

    // The last VM gone releases it.
    for name in waiting {
        vms.delete(name, &DeleteParams::default()).await?;
        provider_deletes(&machines, name).await?;
    }
    eventually("the Provider gone after its last VM", || async {
        Ok(providers.get_opt("small").await?.is_none().then_some(()))
    })
    .await?;
    controller.stop().await;
    Ok(())
}

/// A Provider's `Ready` and `status.version` say what the provider found when it connected,
/// read from the infrastructure cluster applied for it: unknown before any VirtualMachine uses
/// it, the cluster's failure with its namespace, then `Connected` with the hypervisor's version.
#[tokio::test]
async fn a_providers_ready_and_version_come_from_its_infra_cluster() -> anyhow::Result<()> {
    let env = TestEnv::builder().crds(banlieue_api::crds::all()).start().await?;
    let client = env.client().await?;
    let ns = env.namespace("provider-health").await?;
    let controller = RunningController::start_cluster_wide(client.clone());
    let providers: Api<Provider> = Api::all(client.clone());
    let clusters: Api<ProxmoxCluster> = Api::namespaced(client.clone(), &ns);
    let machines: Api<ProxmoxMachine> = Api::namespaced(client.clone(), &ns);
    create_provider(&client, "hv", json!({})).await?;
    let ready_of = |p: &Provider| {
        p.status
            .as_ref()
            .and_then(|s| condition::find(&s.conditions, condition::READY))
            .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
    };
    eventually("Ready=Unknown NotUsedYet", || async {
        let p = providers.get("hv").await?;
        Ok(ready_of(&p).filter(|r| r.0 == "Unknown" && r.1 == "NotUsedYet"))
    })
    .await?;

    let vms: Api<VirtualMachine> = Api::namespaced(client.clone(), &ns);
    vms.create(
        &PostParams::default(),
        &vm(
            "web",
            json!({"providerRef": {"name": "hv"}, "source": {"proxmox": {"vmid": 9000}},
               "cpu": {"cores": 1}, "memoryMiB": 512}),
        )?,
    )
    .await?;
    eventually("the ProxmoxCluster", || async {
        Ok(clusters.get_opt("banlieue-hv").await?)
    })
    .await?;
    provider_reports_cluster(
        &clusters,
        "banlieue-hv",
        false,
        "AuthenticationFailed",
        "401 invalid token",
    )
    .await?;
    let failed = eventually("Ready=False AuthenticationFailed", || async {
        let p = providers.get("hv").await?;
        Ok(ready_of(&p).filter(|r| r.0 == "False" && r.1 == "AuthenticationFailed"))
    })
    .await?;
    assert_eq!(failed.2, format!("in namespace {ns}: 401 invalid token"));

    provider_reports_cluster(&clusters, "banlieue-hv", true, "Provisioned", "").await?;
    clusters
        .patch_status(
            "banlieue-hv",
            &PatchParams::apply("fake-proxmox-version").force(),
            &Patch::Apply(
                json!({"apiVersion": "infrastructure.banlieue.io/v1alpha1", "kind": "ProxmoxCluster",
                "status": {"version": "9.1.2", "failureDomains": [
                    {"name": "pve1", "controlPlane": true,
                     "attributes": {"banlieue.io/cpus": "16", "banlieue.io/memoryMiB": "65536"}}]}}),
            ),
        )
        .await?;
    provider_reports_running(&machines, "web").await?;
    let connected = eventually("Ready=True Connected with the version and the nodes", || async {
        let p = providers.get("hv").await?;
        let ok = ready_of(&p).is_some_and(|r| r.0 == "True" && r.1 == "Connected")
            && p.status.as_ref().and_then(|s| s.version.as_deref()) == Some("9.1.2")
            && p.status.as_ref().is_some_and(|s| !s.nodes.is_empty());
        Ok(ok.then_some(p))
    })
    .await?;
    assert_eq!(
        connected.status.as_ref().map(|s| s.nodes.clone()),
        Some(vec![banlieue_api::banlieue::ProviderNode {
            name: "pve1".into(),
            cpus: Some(16),
            memory_mib: Some(65536),
        }]),
        "the nodes and their capacity, from the infra cluster's failure domains"
    );
    assert_eq!(
        connected.status.as_ref().and_then(|s| s.capacity.clone()),
        Some(banlieue_api::banlieue::ProviderNodeTotals {
            nodes: 1,
            cpus: Some(16),
            memory_mib: Some(65536),
        }),
        "their totals, for the printer columns"
    );
    assert_eq!(
        connected.status.as_ref().and_then(|s| s.observed_generation),
        connected.metadata.generation
    );
    controller.stop().await;
    vms.delete("web", &DeleteParams::default()).await?;
    Ok(())
}
