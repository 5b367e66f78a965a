//! The scenarios, each a function generic over the provider. [`crate::scenario_tests!`] makes
//! one test of each.

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use banlieue_capi::{IpAddress, IpAddressClaim, Machine};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::ResourceExt;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use crate::fixture::{CLUSTER, Scenario, USER_DATA, allocate_address};
use crate::object::{self, condition, fully_provisioned, paused_is, provider_id};
use crate::provider::{Access, ProviderUnderTest, Template};

/// How long "nothing happens" is watched for (after the controller has provably seen the
/// change).
const QUIET: Duration = Duration::from_secs(3);
const PAUSED: &str = "cluster.x-k8s.io/paused";

fn fd_at<P: ProviderUnderTest>(s: &Scenario<P>, i: usize) -> Result<String> {
    let fds = s.provider.failure_domains();
    ensure!(!fds.is_empty(), "the provider declares no failure domain");
    Ok(fds[i % fds.len()].clone())
}

/// Checks the contract fields of a provisioned machine and its one VM.
async fn check_provisioned<P: ProviderUnderTest>(
    s: &Scenario<P>,
    m: &Value,
    uid: &str,
    fd: &str,
) -> Result<()> {
    let name = m["metadata"]["name"].as_str().unwrap_or_default();
    let id = provider_id(m).context("no providerID")?;
    ensure!(
        id.starts_with(P::PROVIDER_ID_PREFIX) && id.len() > P::PROVIDER_ID_PREFIX.len(),
        "{name}: providerID {id:?} is not {}…",
        P::PROVIDER_ID_PREFIX
    );
    ensure!(
        object::failure_domain(m) == Some(fd),
        "{name}: status.failureDomain {:?}, the Machine asked for {fd}",
        object::failure_domain(m)
    );
    ensure!(
        object::ready(m),
        "{name}: Ready is not True: {:?}",
        condition(m, "Ready")
    );
    ensure!(
        paused_is(m, "False"),
        "{name}: Paused is not False: {:?}",
        condition(m, "Paused")
    );
    ensure!(
        condition(m, "VMUpToDate").is_some_and(|c| c.status == "True"),
        "{name}: VMUpToDate is not True on a provisioned machine: {:?}",
        condition(m, "VMUpToDate")
    );
    ensure!(
        m["metadata"]["finalizers"]
            .as_array()
            .is_some_and(|f| !f.is_empty()),
        "{name}: no finalizer on a machine with a VM"
    );
    ensure!(
        m.pointer("/status/observedGeneration") == m.pointer("/metadata/generation"),
        "{name}: observedGeneration {:?} != generation {:?}",
        m.pointer("/status/observedGeneration"),
        m.pointer("/metadata/generation")
    );
    let vms = s.vms_of(uid).await?;
    ensure!(vms.len() == 1, "{name}: {} VMs carry its UID: {vms:?}", vms.len());
    let vm = &vms[0];
    ensure!(
        vm.failure_domain.as_deref() == Some(fd),
        "{name}: the VM runs in {:?}, the Machine asked for {fd}",
        vm.failure_domain
    );
    ensure!(
        vm.user_data.as_deref() == Some(USER_DATA),
        "{name}: the guest does not see the bootstrap Secret's value: {:?}",
        vm.user_data.as_deref().map(String::from_utf8_lossy)
    );
    Ok(())
}

/// Provision: a Machine in a failure domain gets exactly one VM carrying its bootstrap data,
/// and the infra machine reports `provisioned`, a providerID, addresses, the failure domain,
/// `Ready=True`, `Paused=False`, a finalizer and its observedGeneration. Once converged, a
/// change to the Machine makes the provider write nothing.
pub async fn provision<P: ProviderUnderTest>() -> Result<()> {
    let mut s = Scenario::<P>::new("provision").await?;
    s.ready_cluster().await?;
    let fd = fd_at(&s, 0)?;
    let uid = s.machine("m1", Some(&fd), Template::Valid).await?;
    let m = s.wait_machine("m1", "provisioned", fully_provisioned).await?;
    check_provisioned(&s, &m, &uid, &fd).await?;
    ensure!(
        s.vms().await?.len() == 1,
        "other VMs appeared: {:?}",
        s.vms().await?
    );

    // Converged (the status, conditions included, describes the current generation): a
    // reconcile triggered by the owning Machine changes nothing.
    s.wait_machine("m1", "observed at its generation", object::observed_current)
        .await?;
    let before = s.machines().get("m1").await?;
    let rv = before.resource_version().context("resourceVersion")?;
    s.api::<Machine>()
        .patch(
            "m1",
            &PatchParams::default(),
            &Patch::Merge(&json!({"metadata": {"labels": {"touched": "yes"}}})),
        )
        .await?;
    tokio::time::sleep(QUIET).await;
    let after = s.machines().get("m1").await?;
    ensure!(
        after.resource_version().as_deref() == Some(rv.as_str()),
        "a converged machine was written again:\nbefore: {:#}\nafter: {:#}",
        serde_json::to_value(&before)?,
        serde_json::to_value(&after)?
    );
    Ok(())
}

/// Few writes: from its creation to provisioned, the provider writes an infra machine at most
/// [`ProviderUnderTest::PROVISIONING_WRITES`] times (each write is paid by the API server and
/// every watcher, CAPI's controllers included), counted from a watch of the object (every
/// change of its resourceVersion).
pub async fn few_writes<P: ProviderUnderTest>() -> Result<()> {
    use futures::{StreamExt as _, TryStreamExt as _};
    use kube::runtime::{WatchStreamExt as _, watcher};
    let mut s = Scenario::<P>::new("writes").await?;
    s.ready_cluster().await?;
    // Each version seen, with what it says (for a failure's message).
    let versions = std::sync::Arc::new(std::sync::Mutex::new(Vec::<(String, String)>::new()));
    let watch = {
        let versions = versions.clone();
        let stream = watcher(
            s.machines(),
            watcher::Config::default().fields("metadata.name=m1"),
        )
        .applied_objects()
        .boxed();
        tokio::spawn(async move {
            let mut stream = stream;
            while let Ok(Some(m)) = stream.try_next().await {
                let rv = m.resource_version().unwrap_or_default();
                let mut versions = versions.lock().unwrap_or_else(|e| e.into_inner());
                if versions.last().map(|(v, _)| v) != Some(&rv) {
                    let ready = m.data["status"]["conditions"]
                        .as_array()
                        .and_then(|cs| cs.iter().find(|c| c["type"] == "Ready"))
                        .map(|c| format!("Ready={} {}", c["status"], c["reason"]))
                        .unwrap_or_default();
                    let provisioning = &m.data["status"]["provisioning"];
                    let summary = format!(
                        "rv {rv}: finalizers {:?}, providerID {}, {ready}, provisioning {} {}",
                        m.finalizers(),
                        m.data["spec"]["providerID"],
                        provisioning["state"],
                        provisioning["taskId"]
                    );
                    versions.push((rv, summary));
                }
            }
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    let fd = fd_at(&s, 0)?;
    s.machine("m1", Some(&fd), Template::Valid).await?;
    s.wait_machine("m1", "provisioned", fully_provisioned).await?;
    s.wait_machine("m1", "observed at its generation", object::observed_current)
        .await?;
    tokio::time::sleep(QUIET).await;
    watch.abort();
    let versions = versions.lock().unwrap_or_else(|e| e.into_inner()).clone();
    // The first version seen is the one the fixture created.
    let writes = versions.len().saturating_sub(1);
    eprintln!(
        "{}: {writes} writes of the infra machine from creation to provisioned",
        P::NAME
    );
    ensure!(
        writes <= P::PROVISIONING_WRITES,
        "{writes} writes of the infra machine from creation to provisioned, at most {} expected:\n{}",
        P::PROVISIONING_WRITES,
        versions
            .iter()
            .map(|(_, summary)| summary.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    );
    Ok(())
}

/// Scale 1 → 3 across the failure domains, then back to 1: each Machine gets its own VM in
/// its failure domain; scaling down deletes exactly the removed machines' VMs.
pub async fn scale<P: ProviderUnderTest>() -> Result<()> {
    let mut s = Scenario::<P>::new("scale").await?;
    s.ready_cluster().await?;
    let mut machines = Vec::new();
    for (i, name) in ["m1", "m2", "m3"].into_iter().enumerate() {
        let fd = fd_at(&s, i)?;
        let uid = s.machine(name, Some(&fd), Template::Valid).await?;
        machines.push((name, uid, fd));
        if i == 0 {
            s.wait_machine(name, "provisioned", fully_provisioned).await?;
        }
    }
    let mut ids = BTreeSet::new();
    for (name, uid, fd) in &machines {
        let m = s.wait_machine(name, "provisioned", fully_provisioned).await?;
        check_provisioned(&s, &m, uid, fd).await?;
        ids.insert(provider_id(&m).unwrap_or_default().to_owned());
    }
    ensure!(ids.len() == 3, "providerIDs are not distinct: {ids:?}");
    let vms = s.vms().await?;
    ensure!(vms.len() == 3, "{} VMs for 3 machines: {vms:?}", vms.len());

    for (name, _, _) in &machines[1..] {
        s.delete_machine(name).await?;
    }
    for (name, _, _) in &machines[1..] {
        s.wait_machine_gone(name).await?;
    }
    let vms = s.vms().await?;
    ensure!(
        vms.len() == 1 && vms[0].owner_uid.as_deref() == Some(machines[0].1.as_str()),
        "after scaling down to m1: {vms:?}"
    );
    Ok(())
}

/// Address modes: one interface with a static address (and DNS server), one with an address
/// from a CAPI IPAM pool. The machine claims the pool address and waits for it without creating
/// a VM (`WaitingForIPAddress`); once the IPAM provider (played here) allocates it, exactly one
/// VM is created and its guest's `network-config` carries both addresses and their gateways.
pub async fn address_modes<P: ProviderUnderTest>() -> Result<()> {
    let mut s = Scenario::<P>::new("addr").await?;
    s.ready_cluster().await?;
    let pool = json!({"apiGroup": "ipam.cluster.x-k8s.io", "kind": "InClusterIPPool", "name": "nodes"});
    let mut spec = s.provider.machine_spec(Template::Valid);
    spec["networks"] = json!([
        {"name": "net0", "network": P::NETWORK, "dnsServers": ["192.0.2.53"],
         "ipv4": {"mode": "Static", "addresses": ["192.0.2.10/24"], "gateway": "192.0.2.1"}},
        {"name": "net1", "network": P::NETWORK, "ipv4": {"mode": "Pool", "poolRef": pool}},
    ]);
    // A claim of the same name controlled by another object (an earlier machine named m1 whose
    // claim is not garbage-collected yet; here a ConfigMap, which keeps it alive) holds an
    // address: it is not the new machine's.
    let earlier: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "earlier-m1"}}))?;
    let earlier = s
        .api::<ConfigMap>()
        .create(&PostParams::default(), &earlier)
        .await?;
    let claim_name = "m1-net1-ipv4";
    let stale: IpAddressClaim = serde_json::from_value(json!({
        "apiVersion": "ipam.cluster.x-k8s.io/v1beta2", "kind": "IPAddressClaim",
        "metadata": {"name": claim_name, "ownerReferences": [{
            "apiVersion": "v1", "kind": "ConfigMap", "name": "earlier-m1",
            "uid": earlier.uid().context("ConfigMap uid")?, "controller": true}]},
        "spec": {"clusterName": CLUSTER, "poolRef": pool},
    }))?;
    s.api::<IpAddressClaim>()
        .create(&PostParams::default(), &stale)
        .await?;
    allocate_address(
        &s.kube,
        &s.ns,
        claim_name,
        &pool,
        ("198.51.100.99", 24, "198.51.100.1"),
    )
    .await?;
    let uid = s.machine_with_spec("m1", Some(&fd_at(&s, 0)?), spec).await?;
    s.wait_machine("m1", "waiting for the earlier object's claim to go", |m| {
        condition(m, "Ready")
            .is_some_and(|c| c.reason == "WaitingForIPAddress" && c.message.contains("earlier object"))
    })
    .await?;
    s.api::<IpAddressClaim>()
        .delete(claim_name, &Default::default())
        .await?;
    s.api::<IpAddress>()
        .delete(claim_name, &Default::default())
        .await?;
    s.wait_machine("m1", "waiting for its pool address", |m| {
        condition(m, "Ready")
            .is_some_and(|c| c.reason == "WaitingForIPAddress" && c.message.contains(claim_name))
    })
    .await?;
    tokio::time::sleep(QUIET).await;
    ensure!(
        s.vms_of(&uid).await?.is_empty(),
        "a VM was created before its address was allocated"
    );
    let claim = s.api::<IpAddressClaim>().get(claim_name).await?;
    ensure!(
        claim.spec.pool_ref.name == "nodes",
        "claim of pool {:?}",
        claim.spec.pool_ref
    );
    ensure!(
        claim.spec.cluster_name.as_deref() == Some(CLUSTER),
        "claim labelled for cluster {:?}",
        claim.spec.cluster_name
    );
    ensure!(
        claim
            .owner_references()
            .iter()
            .any(|o| o.kind == P::MACHINE_KIND && o.uid == uid && o.controller == Some(true)),
        "the claim is not controlled by the machine: {:?}",
        claim.owner_references()
    );

    // The IPAM provider answers.
    allocate_address(
        &s.kube,
        &s.ns,
        claim_name,
        &pool,
        ("198.51.100.7", 24, "198.51.100.1"),
    )
    .await?;
    s.wait_machine("m1", "provisioned", fully_provisioned).await?;
    let vms = s.vms_of(&uid).await?;
    ensure!(vms.len() == 1, "{} VMs for one machine: {vms:?}", vms.len());
    let config = vms[0]
        .network_config
        .as_deref()
        .context("the guest gets no network-config")?;
    let config: Value = serde_yaml::from_str(config).context("network-config is not YAML")?;
    let ethernet = |name: &str| {
        config["ethernets"]
            .as_object()
            .and_then(|e| e.get(name))
            .cloned()
            .unwrap_or_default()
    };
    let (net0, net1) = (ethernet("net0"), ethernet("net1"));
    ensure!(
        net0["addresses"] == json!(["192.0.2.10/24"])
            && net0["routes"][0]["via"] == "192.0.2.1"
            && net0["nameservers"]["addresses"] == json!(["192.0.2.53"]),
        "net0 is not the static configuration: {config:#}"
    );
    ensure!(
        net1["addresses"] == json!(["198.51.100.7/24"]) && net1["routes"][0]["via"] == "198.51.100.1",
        "net1 does not carry the pool's address: {config:#}"
    );
    Ok(())
}

/// Delete: the VM goes, then the finalizer (the object is released); a machine that never got
/// a VM is released too.
pub async fn delete<P: ProviderUnderTest>() -> Result<()> {
    let mut s = Scenario::<P>::new("delete").await?;
    s.ready_cluster().await?;
    let uid = s.machine("m1", Some(&fd_at(&s, 0)?), Template::Valid).await?;
    s.wait_machine("m1", "provisioned", fully_provisioned).await?;
    ensure!(s.vms_of(&uid).await?.len() == 1, "no VM to delete");
    s.delete_machine("m1").await?;
    s.wait_machine_gone("m1").await?;
    ensure!(s.vms().await?.is_empty(), "VMs left behind: {:?}", s.vms().await?);

    s.machine("m2", Some(&fd_at(&s, 0)?), Template::Missing).await?;
    s.wait_machine("m2", "failed", |m| {
        condition(m, "Ready").is_some_and(|c| c.reason == P::BAD_TEMPLATE_REASON)
    })
    .await?;
    s.delete_machine("m2").await?;
    s.wait_machine_gone("m2").await?;
    ensure!(s.vms().await?.is_empty(), "VMs left behind: {:?}", s.vms().await?);
    Ok(())
}

/// Pause: with the paused annotation the provider reports `Paused=True` and does nothing (a
/// deletion waits, the VM stays); with `Cluster.spec.paused` a new machine gets no VM. Unpausing
/// resumes both.
pub async fn pause<P: ProviderUnderTest>() -> Result<()> {
    let mut s = Scenario::<P>::new("pause").await?;
    s.ready_cluster().await?;
    let uid = s.machine("m1", Some(&fd_at(&s, 0)?), Template::Valid).await?;
    s.wait_machine("m1", "provisioned", fully_provisioned).await?;

    s.patch_machine_metadata("m1", json!({"annotations": {PAUSED: ""}}))
        .await?;
    s.wait_machine("m1", "Paused=True", |m| paused_is(m, "True"))
        .await?;
    // clusterctl move deletes paused objects: nothing may happen on the hypervisor.
    s.delete_machine("m1").await?;
    tokio::time::sleep(QUIET).await;
    ensure!(
        s.get_infra(P::MACHINE_KIND, "m1").await?.is_some(),
        "a paused machine was released"
    );
    ensure!(
        s.vms_of(&uid).await?.len() == 1,
        "a paused machine's VM was touched"
    );
    s.patch_machine_metadata("m1", json!({"annotations": {PAUSED: null}}))
        .await?;
    s.wait_machine_gone("m1").await?;
    ensure!(
        s.vms_of(&uid).await?.is_empty(),
        "the VM survived the unpaused deletion"
    );

    s.pause_cluster(true).await?;
    let uid = s.machine("m2", Some(&fd_at(&s, 0)?), Template::Valid).await?;
    let m = s
        .wait_machine("m2", "Paused=True", |m| paused_is(m, "True"))
        .await?;
    tokio::time::sleep(QUIET).await;
    ensure!(
        s.vms_of(&uid).await?.is_empty(),
        "a VM was created while the Cluster is paused"
    );
    let m2 = s.get_infra(P::MACHINE_KIND, "m2").await?.unwrap_or(m);
    ensure!(
        !object::provisioned(&m2) && provider_id(&m2).is_none(),
        "progress while paused: {:#}",
        m2["status"]
    );
    s.pause_cluster(false).await?;
    let m2 = s.wait_machine("m2", "provisioned", fully_provisioned).await?;
    ensure!(
        paused_is(&m2, "False"),
        "Paused after unpausing: {:?}",
        condition(&m2, "Paused")
    );
    ensure!(s.vms_of(&uid).await?.len() == 1);
    Ok(())
}

/// Bad template: `Ready=False` with the provider's reason and the template's name in the
/// message; no VM.
pub async fn bad_template<P: ProviderUnderTest>() -> Result<()> {
    let mut s = Scenario::<P>::new("badtpl").await?;
    s.ready_cluster().await?;
    s.machine("m1", Some(&fd_at(&s, 0)?), Template::Missing).await?;
    let m = s
        .wait_machine("m1", P::BAD_TEMPLATE_REASON, |m| {
            condition(m, "Ready").is_some_and(|c| c.reason == P::BAD_TEMPLATE_REASON)
        })
        .await?;
    let ready = condition(&m, "Ready").context("Ready")?;
    ensure!(ready.status == "False", "{ready:?}");
    ensure!(
        ready.message.contains(P::MISSING_TEMPLATE),
        "the message does not name the template: {}",
        ready.message
    );
    ensure!(!object::provisioned(&m) && provider_id(&m).is_none());
    ensure!(
        s.vms().await?.is_empty(),
        "a VM for a bad template: {:?}",
        s.vms().await?
    );
    Ok(())
}

/// Unsupported field: a machine asking what the backend cannot do (a field its declarations
/// refuse) gets `Ready=False` `UnsupportedField` naming the field and the provider, a Warning
/// Event, and no VM; once the field is removed it is provisioned with one VM.
pub async fn unsupported_field<P: ProviderUnderTest>() -> Result<()> {
    let mut s = Scenario::<P>::new("unsupported").await?;
    let (extra, field) = s
        .provider
        .unsupported_field()
        .context("the provider names no field it refuses")?;
    s.ready_cluster().await?;
    let valid = s.provider.machine_spec(Template::Valid);
    let mut spec = valid.clone();
    for (key, value) in extra.as_object().into_iter().flatten() {
        spec[key] = value.clone();
    }
    let backend = banlieue_api::support::BACKENDS
        .into_iter()
        .find(|b| banlieue_api::support::Kind::Machine.name(*b) == P::MACHINE_KIND)
        .context("no backend of this machine kind")?;
    let declared = banlieue_api::support::machine_refusals(backend, &spec);
    ensure!(
        declared.iter().any(|r| r.field == field),
        "the declarations do not refuse {field}: {declared:?}"
    );
    let uid = s.machine_with_spec("m1", Some(&fd_at(&s, 0)?), spec).await?;
    let m = s
        .wait_machine("m1", "UnsupportedField", |m| {
            condition(m, "Ready").is_some_and(|c| c.reason == "UnsupportedField")
        })
        .await?;
    let ready = condition(&m, "Ready").context("Ready")?;
    ensure!(
        ready.status == "False"
            && ready.message.contains(field)
            && ready
                .message
                .contains(&format!("the {} provider", backend.as_str())),
        "the condition does not name {field} and the provider: {ready:?}"
    );
    ensure!(s.vms().await?.is_empty(), "a VM was made: {:?}", s.vms().await?);
    wait_for_warning(&s, "m1", "UnsupportedField", field).await?;
    // The field removed (the valid spec's value, or none): provisioned with one VM.
    undo(&s, "m1", &extra, &valid).await?;
    s.wait_machine("m1", "provisioned", fully_provisioned).await?;
    ensure!(s.vms_of(&uid).await?.len() == 1, "{:?}", s.vms().await?);
    Ok(())
}

/// Waits (bounded) for an Event of `name` with `reason` naming `field`: Events follow the status
/// write that the scenario waited for.
async fn wait_for_warning<P: ProviderUnderTest>(
    s: &Scenario<P>,
    name: &str,
    reason: &str,
    field: &str,
) -> Result<()> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let events = s.event_texts(name).await?;
        if events.iter().any(|e| e.contains(reason) && e.contains(field)) {
            return Ok(());
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "no {reason} Event naming {field}: {events:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Sets the top-level spec fields `changed` set back to their value in `original` (or unset).
async fn undo<P: ProviderUnderTest>(
    s: &Scenario<P>,
    name: &str,
    changed: &Value,
    original: &Value,
) -> Result<()> {
    let mut undo = serde_json::Map::new();
    for key in changed.as_object().into_iter().flat_map(|o| o.keys()) {
        undo.insert(key.clone(), original.get(key).cloned().unwrap_or(Value::Null));
    }
    s.infra(P::MACHINE_KIND)
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": undo})),
        )
        .await?;
    Ok(())
}

/// A field that acts only at creation, changed on a provisioned machine: `VMUpToDate=False`
/// `RecreateRequired` naming the field (its old and new value) and a Warning Event, the VM kept
/// (one, not replaced); set back, `VMUpToDate` is True again.
pub async fn creation_only_change<P: ProviderUnderTest>() -> Result<()> {
    let mut s = Scenario::<P>::new("creation").await?;
    let (change, field) = s.provider.creation_only_change();
    s.ready_cluster().await?;
    let uid = s.machine("m1", Some(&fd_at(&s, 0)?), Template::Valid).await?;
    let m = s.wait_machine("m1", "provisioned", fully_provisioned).await?;
    let recorded = m["metadata"]["annotations"]["banlieue.io/created-with"].clone();
    ensure!(
        recorded.is_string(),
        "no record of the creation values: {:?}",
        m["metadata"]
    );
    let before = m["spec"].clone();
    s.infra(P::MACHINE_KIND)
        .patch(
            "m1",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": change})),
        )
        .await?;
    let m = s
        .wait_machine("m1", "RecreateRequired", |m| {
            condition(m, "VMUpToDate").is_some_and(|c| c.reason == "RecreateRequired")
        })
        .await?;
    let up_to_date = condition(&m, "VMUpToDate").context("VMUpToDate")?;
    ensure!(
        up_to_date.status == "False" && up_to_date.message.contains(field),
        "the condition does not name {field}: {up_to_date:?}"
    );
    ensure!(
        object::ready(&m),
        "the running VM is still Ready: {:?}",
        condition(&m, "Ready")
    );
    ensure!(s.vms_of(&uid).await?.len() == 1, "{:?}", s.vms().await?);
    wait_for_warning(&s, "m1", "RecreateRequired", field).await?;
    // Set back: up to date again, the same VM.
    undo(&s, "m1", &change, &before).await?;
    s.wait_machine("m1", "up to date again", |m| {
        condition(m, "VMUpToDate").is_some_and(|c| c.status == "True")
    })
    .await?;
    ensure!(
        s.vms_of(&uid).await?.len() == 1 && s.vms().await?.len() == 1,
        "{:?}",
        s.vms().await?
    );
    Ok(())
}

/// Bad credentials: the infra cluster reports it (`Ready=False`, the provider's reason on one
/// of its conditions) without the secret in any message or Event, is not provisioned, and a
/// machine of that cluster gets no VM.
pub async fn bad_credentials<P: ProviderUnderTest>() -> Result<()> {
    let mut s = Scenario::<P>::new("badcreds").await?;
    s.cluster(Access::Bad).await?;
    s.provider.start();
    let c = s
        .wait_infra(P::CLUSTER_KIND, CLUSTER, "refused", |c| {
            object::conditions(c)
                .iter()
                .any(|(_, c)| P::BAD_ACCESS_REASONS.contains(&c.reason.as_str()))
        })
        .await?;
    let ready = condition(&c, "Ready").context("no Ready on the infra cluster")?;
    ensure!(ready.status == "False", "{ready:?}");
    ensure!(!object::provisioned(&c), "provisioned with bad credentials");
    let uid = s.machine("m1", Some(&fd_at(&s, 0)?), Template::Valid).await?;
    s.wait_machine("m1", "Ready=False", |m| {
        condition(m, "Ready").is_some_and(|c| c.status == "False")
    })
    .await?;
    ensure!(s.vms_of(&uid).await?.is_empty(), "a VM without valid credentials");
    let c = s.get_infra(P::CLUSTER_KIND, CLUSTER).await?.unwrap_or(c);
    let mut texts: Vec<String> = object::conditions(&c)
        .into_iter()
        .map(|(_, c)| c.message)
        .collect();
    texts.extend(s.event_texts(CLUSTER).await?);
    texts.extend(s.event_texts("m1").await?);
    if let Some(m) = s.get_infra(P::MACHINE_KIND, "m1").await? {
        texts.extend(object::conditions(&m).into_iter().map(|(_, c)| c.message));
    }
    for secret in s.provider.secrets() {
        ensure!(
            !texts.iter().any(|t| t.contains(&secret)),
            "a secret leaked into a condition or Event"
        );
    }
    Ok(())
}

/// Crash/restart: the controllers are killed again and again while two machines provision
/// (the hypervisor slowed down so kills land between steps); there is never more than one VM
/// per machine, and after a final restart exactly one each. Deletion then leaves nothing.
pub async fn crash_restart<P: ProviderUnderTest>() -> Result<()> {
    let mut s = Scenario::<P>::new("crash").await?;
    s.ready_cluster().await?;
    s.provider.stop().await;
    s.provider.slow_down().await?;
    let a = s.machine("m1", Some(&fd_at(&s, 0)?), Template::Valid).await?;
    let b = s.machine("m2", Some(&fd_at(&s, 1)?), Template::Valid).await?;
    let (mut kills, mut mid_flight) = (0u32, 0u32);
    while kills < 14 {
        s.provider.start();
        tokio::time::sleep(Duration::from_millis(100 + 70 * u64::from(kills))).await;
        s.provider.stop().await;
        kills += 1;
        let vms = s.vms().await?;
        for uid in [&a, &b] {
            let n = vms.iter().filter(|v| v.owner_uid.as_ref() == Some(uid)).count();
            ensure!(n <= 1, "{n} VMs for one machine after {kills} kills: {vms:?}");
        }
        // A VM still being cloned may not show its owner mark yet; it still counts.
        ensure!(
            vms.len() <= 2,
            "{} VMs for 2 machines after {kills} kills: {vms:?}",
            vms.len()
        );
        let (mut done, mut started) = (true, false);
        for name in ["m1", "m2"] {
            let m = s.get_infra(P::MACHINE_KIND, name).await?.unwrap_or_default();
            done &= fully_provisioned(&m);
            // The finalizer comes before anything is created on the hypervisor.
            started |= m["metadata"]["finalizers"]
                .as_array()
                .is_some_and(|f| !f.is_empty());
        }
        if done {
            break;
        }
        if started || !vms.is_empty() {
            mid_flight += 1;
        }
    }
    ensure!(
        mid_flight >= 2,
        "only {mid_flight} of {kills} kills landed while the machines were being provisioned"
    );
    s.provider.start();
    for (name, uid) in [("m1", &a), ("m2", &b)] {
        s.wait_machine(name, "provisioned", fully_provisioned).await?;
        let n = s.vms_of(uid).await?.len();
        ensure!(n == 1, "{name}: {n} VMs after {kills} kills");
    }
    let vms = s.vms().await?;
    ensure!(
        vms.len() == 2 && vms.iter().all(|v| v.owner_uid.is_some()),
        "after the last restart: {vms:?}"
    );
    for name in ["m1", "m2"] {
        s.delete_machine(name).await?;
    }
    for name in ["m1", "m2"] {
        s.wait_machine_gone(name).await?;
    }
    ensure!(s.vms().await?.is_empty(), "orphaned: {:?}", s.vms().await?);
    Ok(())
}

/// Outage: the hypervisor becomes unreachable while a machine provisions (the hypervisor
/// slowed down so the cut lands mid-way): `Ready=False` with the connection error in its
/// message, never a second VM; once it is back the machine is provisioned with exactly one VM.
pub async fn outage<P: ProviderUnderTest>() -> Result<()> {
    let mut s = Scenario::<P>::new("outage").await?;
    s.ready_cluster().await?;
    s.provider.slow_down().await?;
    let uid = s.machine("m1", Some(&fd_at(&s, 0)?), Template::Valid).await?;
    let deadline = tokio::time::Instant::now() + crate::fixture::TIMEOUT;
    while s.vms().await?.is_empty() {
        ensure!(tokio::time::Instant::now() < deadline, "no VM appeared");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    s.provider.outage(true).await?;
    let m = s
        .wait_machine("m1", "reporting the outage", |m| {
            condition(m, "Ready")
                .is_some_and(|c| c.status == "False" && c.message.contains(P::OUTAGE_MESSAGE))
        })
        .await?;
    ensure!(!object::ready(&m));
    ensure!(s.vms().await?.len() <= 1, "{:?}", s.vms().await?);
    s.provider.outage(false).await?;
    let m = s.wait_machine("m1", "provisioned", fully_provisioned).await?;
    ensure!(object::ready(&m), "{:?}", condition(&m, "Ready"));
    let vms = s.vms_of(&uid).await?;
    ensure!(
        vms.len() == 1 && s.vms().await?.len() == 1,
        "after the outage: {vms:?}"
    );
    Ok(())
}
