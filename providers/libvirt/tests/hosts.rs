//! LibvirtCluster hosts and credentials, and LibvirtMachineTemplate capacity, with the real
//! controllers on the real apiserver (`banlieue-testenv`) and libvirt's test driver through the
//! real `virt` connection:
//!
//! - `spec.hosts` with two separate test-driver hypervisors become two failure domains (with
//!   their `controlPlane` flags);
//! - a `qemu+ssh://` host's Secret is written to 0600 files and never appears in the
//!   LibvirtCluster's status or the namespace's Events, whatever fails (missing key, missing
//!   Secret, unreachable host);
//! - a credentials Secret created after the fact is acted on within seconds (the Secret watch),
//!   not at the next retry;
//! - a LibvirtMachineTemplate gets `status.capacity`, and a reconcile of an up-to-date template
//!   writes nothing.
//!
//! Run: `cargo test -p banlieue-libvirt --test hosts` (needs `tests/controlplane/build.sh`).

#![cfg(feature = "libvirt")]

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Result, bail};
use banlieue_api::banlieue::Provider;
use banlieue_api::infrastructure::{LibvirtCluster, LibvirtMachineTemplate};
use banlieue_libvirt::cluster_controller::LibvirtClusters;
use banlieue_libvirt::connection::VirtConnector;
use banlieue_libvirt::machine_controller::FIELD_MANAGER;
use banlieue_provider_kit::cluster::{self as kit_cluster, ClusterContext};
use banlieue_provider_kit::machine::{self as kit_machine, MachineContext};
use banlieue_provider_kit::template::{self as template_controller, TemplateContext};
use banlieue_provider_runtime::testing::eventually;
use banlieue_testenv::TestEnv;
use k8s_openapi::api::core::v1::{Event, Secret};
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Resource};
use serde_json::json;

const MARKER: &str = "PRIVATE-KEY-MATERIAL-5d1c";
/// Long enough for the reconciles an object's own writes trigger to have run.
const SETTLE: Duration = Duration::from_secs(3);

async fn env() -> Result<&'static TestEnv> {
    Ok(TestEnv::shared_with(|b| b.crds(banlieue_api::crds::all())).await?)
}

/// A Provider owning the LibvirtClusters (the cluster controller acts for Provider- or
/// Cluster-owned infra clusters; a dangling owner would be garbage-collected).
async fn provider(client: &kube::Client, name: &str) -> Result<Provider> {
    let p: Provider = serde_json::from_value(json!({
        "apiVersion": "banlieue.io/v1alpha1", "kind": "Provider",
        "metadata": {"name": name},
        "spec": {"backend": "libvirt", "endpoint": "test:///default"},
    }))?;
    Ok(Api::<Provider>::all(client.clone())
        .create(&PostParams::default(), &p)
        .await?)
}

fn owned_cluster(owner: &Provider, name: &str, spec: serde_json::Value) -> Result<LibvirtCluster> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "infrastructure.banlieue.io/v1alpha1", "kind": "LibvirtCluster",
        "metadata": {"name": name, "ownerReferences": [{
            "apiVersion": Provider::api_version(&()), "kind": "Provider",
            "name": owner.metadata.name, "uid": owner.metadata.uid, "controller": true,
        }]},
        "spec": spec,
    }))?)
}

fn start_cluster_controller(client: &kube::Client, ns: &str) -> tokio::task::JoinHandle<()> {
    start_cluster_controller_retrying(client, ns, kit_cluster::RETRY)
}

/// The cluster controller, retrying unreachable hosts and unusable credentials every `retry`.
fn start_cluster_controller_retrying(
    client: &kube::Client,
    ns: &str,
    retry: Duration,
) -> tokio::task::JoinHandle<()> {
    let mut ctx = ClusterContext::new(
        client.clone(),
        LibvirtClusters {
            connector: VirtConnector::default(),
        },
        FIELD_MANAGER,
    );
    ctx.retry = retry;
    let ctx = Arc::new(ctx);
    let ns = ns.to_owned();
    tokio::spawn(async move { kit_cluster::run(ctx, Some(&ns), 2, std::future::pending()).await })
}

fn condition(lvc: &LibvirtCluster, type_: &str) -> Option<(String, String, String)> {
    lvc.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

fn node_file(tag: &str) -> String {
    let path = std::env::temp_dir().join(format!("banlieue-libvirt-hosts-{tag}-{}.xml", std::process::id()));
    std::fs::write(
        &path,
        "<node><network><name>default</name><bridge name='virbr0'/><forward/>\
         <ip address='192.168.124.1' netmask='255.255.255.0'><dhcp>\
         <range start='192.168.124.2' end='192.168.124.254'/></dhcp></ip></network>\
         <pool type='dir'><name>default-pool</name><capacity unit='GiB'>10</capacity>\
         <allocation>0</allocation><available unit='GiB'>10</available>\
         <target><path>/default-pool</path></target></pool></node>",
    )
    .unwrap();
    format!("test://{}", path.display())
}

#[tokio::test]
async fn two_hosts_are_two_failure_domains() -> Result<()> {
    let env = env().await?;
    let ns = env.namespace("lv-hosts").await?;
    let client = env.client().await?;
    let p = provider(&client, ns.name()).await?;
    let api = Api::<LibvirtCluster>::namespaced(client.clone(), ns.name());
    api.create(
        &PostParams::default(),
        &owned_cluster(
            &p,
            "two",
            json!({"hosts": [
                {"name": "kvm-b", "uri": node_file("b"), "controlPlane": false},
                {"name": "kvm-a", "uri": "test:///default"},
            ]}),
        )?,
    )
    .await?;
    let task = start_cluster_controller(&client, ns.name());
    let lvc = eventually("the LibvirtCluster to be provisioned", || async {
        let c = api.get("two").await?;
        Ok(condition(&c, "Ready").filter(|r| r.0 == "True").map(|_| c))
    })
    .await?;
    let fds: Vec<(String, Option<bool>)> = lvc
        .status
        .unwrap()
        .failure_domains
        .into_iter()
        .map(|f| (f.name, f.control_plane))
        .collect();
    assert_eq!(
        fds,
        vec![("kvm-a".into(), Some(true)), ("kvm-b".into(), Some(false))]
    );
    task.abort();
    Ok(())
}

#[tokio::test]
async fn ssh_credentials_reach_private_files_and_never_the_status_or_events() -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let env = env().await?;
    let ns = env.namespace("lv-creds").await?;
    let client = env.client().await?;
    let p = provider(&client, ns.name()).await?;
    let secrets = Api::<Secret>::namespaced(client.clone(), ns.name());
    let secret = |keys: &[&str]| Secret {
        metadata: kube::api::ObjectMeta {
            name: Some("lab-ssh".into()),
            ..Default::default()
        },
        string_data: Some(
            keys.iter()
                .map(|k| ((*k).to_owned(), format!("{MARKER} {k}\n")))
                .collect(),
        ),
        ..Default::default()
    };
    secrets
        .create(&PostParams::default(), &secret(&["ssh-privatekey"]))
        .await?;
    let api = Api::<LibvirtCluster>::namespaced(client.clone(), ns.name());
    // Port 1 on loopback: the connection is refused at once.
    api.create(
        &PostParams::default(),
        &owned_cluster(
            &p,
            "remote",
            json!({"hosts": [{"name": "kvm1", "uri": "qemu+ssh://root@127.0.0.1:1/system",
                              "credentialsRef": {"name": "lab-ssh"}}]}),
        )?,
    )
    .await?;
    let task = start_cluster_controller(&client, ns.name());
    let mut seen = Vec::new();
    let wait_reason = |reason: &'static str| {
        let api = api.clone();
        async move {
            eventually(reason, || async {
                let c = api.get("remote").await?;
                Ok(condition(&c, "LibvirtConnected")
                    .filter(|r| r.1 == reason)
                    .map(|r| (r, serde_json::to_string(&c.status).unwrap())))
            })
            .await
        }
    };
    // A missing key: named, not shown.
    let (cond, status) = wait_reason("CredentialsInvalid").await?;
    assert!(cond.2.contains("known_hosts"), "{}", cond.2);
    seen.push(status);

    // Complete Secret: files written 0600, URI switched to libssh, host unreachable.
    secrets
        .replace(
            "lab-ssh",
            &PostParams::default(),
            &secret(&["ssh-privatekey", "known_hosts"]),
        )
        .await?;
    let (cond, status) = wait_reason("Unreachable").await?;
    seen.push(status);
    let base = banlieue_libvirt::credentials::default_dir();
    let dir = std::fs::read_dir(&base)?
        .flatten()
        .find(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with(&format!("{}_lab-ssh_", ns.name()))
        })
        .expect("credential directory")
        .path();
    for f in ["id", "known_hosts"] {
        let meta = std::fs::metadata(dir.join(f))?;
        assert_eq!(meta.permissions().mode() & 0o777, 0o600, "{f}");
    }
    assert!(
        std::fs::read_to_string(dir.join("id"))?.contains(MARKER),
        "the key file holds the Secret's key"
    );
    assert!(!cond.2.contains(MARKER));

    // The Secret goes away.
    secrets.delete("lab-ssh", &Default::default()).await?;
    let (_, status) = wait_reason("CredentialsNotFound").await?;
    seen.push(status);

    for s in &seen {
        assert!(!s.contains(MARKER), "status leaks the secret: {s}");
    }
    let events = Api::<Event>::namespaced(client.clone(), ns.name())
        .list(&ListParams::default())
        .await?;
    assert!(!serde_json::to_string(&events)?.contains(MARKER));
    task.abort();
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// The Secret watch: a host whose credentials Secret does not exist yet says so, and the
/// Secret created afterwards is used within seconds, although the controller retries such a
/// LibvirtCluster only every 10 minutes here.
#[tokio::test]
async fn a_late_credentials_secret_is_acted_on_within_seconds() -> Result<()> {
    const LONG_RETRY: Duration = Duration::from_secs(600);
    const WELL_BEFORE_THE_RETRY: Duration = Duration::from_secs(30);
    let env = env().await?;
    let ns = env.namespace("lv-late-creds").await?;
    let client = env.client().await?;
    let p = provider(&client, ns.name()).await?;
    let api = Api::<LibvirtCluster>::namespaced(client.clone(), ns.name());
    // Port 1 on loopback: once the credentials are usable, the connection is refused at once.
    api.create(
        &PostParams::default(),
        &owned_cluster(
            &p,
            "late",
            json!({"hosts": [{"name": "kvm1", "uri": "qemu+ssh://root@127.0.0.1:1/system",
                              "credentialsRef": {"name": "late-ssh"}}]}),
        )?,
    )
    .await?;
    let task = start_cluster_controller_retrying(&client, ns.name(), LONG_RETRY);
    let connected = |c: &LibvirtCluster| condition(c, "LibvirtConnected");
    let (_, _, message) = eventually("CredentialsNotFound", || async {
        Ok(connected(&api.get("late").await?).filter(|c| c.1 == "CredentialsNotFound"))
    })
    .await?;
    assert!(message.contains("late-ssh"), "{message}");
    // Let the reconciles its own writes (finalizer, status) triggered finish: from now on only
    // the Secret watch brings it back before the retry.
    tokio::time::sleep(SETTLE).await;

    let secret = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some("late-ssh".into()),
            ..Default::default()
        },
        string_data: Some(
            ["ssh-privatekey", "known_hosts"]
                .iter()
                .map(|k| ((*k).to_owned(), format!("{MARKER} {k}\n")))
                .collect(),
        ),
        ..Default::default()
    };
    Api::<Secret>::namespaced(client.clone(), ns.name())
        .create(&PostParams::default(), &secret)
        .await?;
    // Read, written to files and used: the host is now merely unreachable.
    let deadline = tokio::time::Instant::now() + WELL_BEFORE_THE_RETRY;
    loop {
        let c = connected(&api.get("late").await?);
        if c.as_ref().is_some_and(|c| c.1 == "Unreachable") {
            break;
        }
        if tokio::time::Instant::now() > deadline {
            bail!(
                "the Secret was not used within {WELL_BEFORE_THE_RETRY:?} (the retry is {LONG_RETRY:?}): {c:?}"
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    task.abort();
    let base = banlieue_libvirt::credentials::default_dir();
    let prefix = format!("{}_late-ssh_", ns.name());
    for e in std::fs::read_dir(&base)?.flatten() {
        if e.file_name().to_string_lossy().starts_with(&prefix) {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
    Ok(())
}

#[tokio::test]
async fn templates_publish_capacity_once() -> Result<()> {
    let env = env().await?;
    let ns = env.namespace("lv-tmpl").await?;
    let client = env.client().await?;
    let api = Api::<LibvirtMachineTemplate>::namespaced(client.clone(), ns.name());
    let t: LibvirtMachineTemplate = serde_json::from_value(json!({
        "apiVersion": "infrastructure.banlieue.io/v1alpha1", "kind": "LibvirtMachineTemplate",
        "metadata": {"name": "workers"},
        "spec": {"template": {"spec": {
            "source": {"volume": "base.qcow2", "pool": "default"},
            "cpu": {"cores": 2, "sockets": 2}, "memoryMiB": 3072,
        }}},
    }))?;
    api.create(&PostParams::default(), &t).await?;
    let ctx = Arc::new(TemplateContext {
        client: client.clone(),
        field_manager: banlieue_libvirt::machine_controller::FIELD_MANAGER,
        watch_filter: None,
        metrics: Default::default(),
    });
    let namespace = ns.name().to_owned();
    let ctx2 = ctx.clone();
    let task = tokio::spawn(async move {
        template_controller::run::<LibvirtMachineTemplate>(ctx2, Some(&namespace), std::future::pending())
            .await
    });
    let published = eventually("status.capacity", || async {
        let t = api.get("workers").await?;
        Ok(t.status
            .as_ref()
            .filter(|s| !s.capacity.is_empty())
            .map(|s| serde_json::to_value(s).unwrap())
            .map(|v| (v, t.clone())))
    })
    .await?;
    assert_eq!(published.0, json!({"capacity": {"cpu": "4", "memory": "3072Mi"}}));
    task.abort();
    // An up-to-date template: reconciling it writes nothing.
    let before = published.1.metadata.resource_version.clone();
    template_controller::reconcile(Arc::new(published.1), ctx.clone()).await?;
    assert_eq!(api.get("workers").await?.metadata.resource_version, before);
    // A template without status gets one written (the same reconcile function).
    let mut stale = api.get("workers").await?;
    stale.status = None;
    api.patch_status(
        "workers",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"capacity": {"cpu": "1"}}})),
    )
    .await?;
    template_controller::reconcile(Arc::new(stale), ctx).await?;
    let fixed = api.get("workers").await?;
    assert_eq!(
        serde_json::to_value(fixed.status.unwrap())?,
        json!({"capacity": {"cpu": "4", "memory": "3072Mi"}})
    );
    Ok(())
}

#[tokio::test]
async fn a_machine_lands_on_its_failure_domain_and_is_reconfigured_in_place() -> Result<()> {
    use banlieue_api::banlieue::VirtualMachine;
    use banlieue_api::infrastructure::LibvirtMachine;
    use banlieue_api::standalone::infra_cluster_name;
    use banlieue_libvirt::desired::Settings;
    use banlieue_libvirt::hypervisor::Hypervisor;
    use banlieue_libvirt::xml::{self, DomainType};

    let env = env().await?;
    let ns = env.namespace("lv-place").await?;
    let client = env.client().await?;
    let p = provider(&client, ns.name()).await?;
    let uri_b = node_file("place");
    let connector = VirtConnector::default();
    for uri in ["test:///default", uri_b.as_str()] {
        let hv = connector.get(uri);
        if hv.volume("default-pool", "base.qcow2").await?.is_none() {
            let _ = hv
                .create_volume(
                    "default-pool",
                    &xml::plain_volume_xml("base.qcow2", 1 << 30, "qcow2"),
                )
                .await;
        }
    }
    Api::<LibvirtCluster>::namespaced(client.clone(), ns.name())
        .create(
            &PostParams::default(),
            &owned_cluster(
                &p,
                &infra_cluster_name(ns.name()),
                json!({"hosts": [
                    {"name": "kvm-a", "uri": "test:///default"},
                    {"name": "kvm-b", "uri": uri_b},
                ]}),
            )?,
        )
        .await?;
    let settings = Settings {
        domain_type: DomainType::Qemu,
        ..Settings::default()
    };
    let backends = banlieue_libvirt::provider(connector.clone(), settings);
    let cctx = Arc::new(ClusterContext::new(
        client.clone(),
        backends.clusters,
        FIELD_MANAGER,
    ));
    let mctx = Arc::new(MachineContext::new(
        client.clone(),
        backends.machines,
        "banlieue-libvirt-test",
    ));
    let (n1, n2) = (ns.name().to_owned(), ns.name().to_owned());
    let tasks = [
        tokio::spawn(async move { kit_cluster::run(cctx, Some(&n1), 2, std::future::pending()).await }),
        tokio::spawn(async move { kit_machine::run(mctx, Some(&n2), 2, std::future::pending()).await }),
    ];
    // What the banlieue controller creates for a VirtualMachine placed in kvm-b.
    let vm: VirtualMachine = serde_json::from_value(json!({
        "apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine",
        "metadata": {"name": "placed"},
        "spec": {
            "providerRef": {"name": ns.name()},
            "source": {"libvirt": {"volume": "base.qcow2", "pool": "default-pool"}},
            "cpu": {"cores": 1}, "memoryMiB": 256,
            "placement": {"failureDomain": "kvm-b"},
        },
    }))?;
    let vm = Api::<VirtualMachine>::namespaced(client.clone(), ns.name())
        .create(&PostParams::default(), &vm)
        .await?;
    let lm: LibvirtMachine = serde_json::from_value(json!({
        "apiVersion": "infrastructure.banlieue.io/v1alpha1", "kind": "LibvirtMachine",
        "metadata": {"name": "placed", "ownerReferences": [{
            "apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine",
            "name": "placed", "uid": vm.metadata.uid, "controller": true,
        }]},
        "spec": {
            "providerRef": {"name": ns.name()},
            "source": {"volume": "base.qcow2", "pool": "default-pool"},
            "cpu": {"cores": 1}, "memoryMiB": 256,
        },
    }))?;
    let machines = Api::<LibvirtMachine>::namespaced(client.clone(), ns.name());
    let lm = machines.create(&PostParams::default(), &lm).await?;
    let uid = lm.metadata.uid.clone().unwrap();
    let lm = match eventually("the machine provisioned", || async {
        let m = machines.get("placed").await?;
        // providerID (spec) is written just before the status: wait for both.
        let done = m.spec.provider_id.is_some()
            && m.status.as_ref().is_some_and(|s| {
                banlieue_api::common::Initialization::is_provisioned(s.initialization.as_ref())
            });
        Ok(done.then_some(m))
    })
    .await
    {
        Ok(m) => m,
        Err(e) => bail!("{e}: {:?}", machines.get("placed").await?.status),
    };
    assert_eq!(
        lm.spec.provider_id.as_deref(),
        Some(format!("libvirt://kvm-b/{uid}").as_str())
    );
    let status = lm.status.clone().unwrap();
    assert_eq!(
        (status.node.as_deref(), status.failure_domain.as_deref()),
        (Some("kvm-b"), Some("kvm-b"))
    );
    let (a, b) = (connector.get("test:///default"), connector.get(&uri_b));
    assert!(b.domain_by_uuid(&uid).await?.is_some(), "the domain is on kvm-b");
    assert!(a.domain_by_uuid(&uid).await?.is_none(), "and not on kvm-a");

    // More CPU and memory, a restart allowed: the same domain on kvm-b is redefined and running
    // again.
    machines
        .patch(
            "placed",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"spec": {"cpu": {"cores": 2}, "memoryMiB": 512, "restartPolicy": "Automatic"}}),
            ),
        )
        .await?;
    let d = eventually("the domain reconfigured", || async {
        Ok(b.domain_by_uuid(&uid)
            .await?
            .filter(|d| d.sizing.is_some_and(|z| (z.cores, z.memory_mib) == (2, 512)))
            .filter(|d| d.state == banlieue_libvirt::hypervisor::RunState::Running))
    })
    .await?;
    assert_eq!(d.uuid, uid);
    // Events are published after the status write: wait for it.
    let events = Api::<Event>::namespaced(client.clone(), ns.name());
    eventually("a Reconfigured event", || async {
        let list = events.list(&ListParams::default()).await?;
        Ok(list
            .items
            .iter()
            .any(|e| e.reason.as_deref() == Some("Reconfigured"))
            .then_some(()))
    })
    .await?;
    for t in tasks {
        t.abort();
    }
    Ok(())
}
