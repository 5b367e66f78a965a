//! Contract scenarios: what banlieue does with PVE, asserted the same way on the simulator and on a
//! real PVE. Each scenario cleans up what it creates.

use std::time::{Duration, Instant};

use banlieue_cloudinit::{MetaData, NoCloudSeed};
use banlieue_pve_client::config::format_tags;
use banlieue_pve_client::{
    CloneRequest, ConfigUpdate, DeleteVmOptions, ErrorClass, IpAssign, IpConfig, NetDevice, ResourceType,
    Size, SizeChange, TaskOutcome, Upid, UploadContent,
};

use super::target::Target;

const POLL: Duration = Duration::from_millis(50);

async fn wait_ok(t: &Target, upid: &Upid) -> TaskOutcome {
    let outcome = t
        .client
        .wait_task(upid, t.task_deadline, POLL)
        .await
        .expect("task succeeds");
    assert!(outcome.is_success(), "{upid}: {outcome:?}");
    outcome
}

/// Version, nodes, node status, cluster resources, storages, pools.
pub async fn discovery(t: &Target) {
    let c = &t.client;
    let version = c.version().await.unwrap();
    assert!(version.version.starts_with(&version.release), "{version:?}");

    let nodes = c.nodes().await.unwrap();
    let node = nodes
        .iter()
        .find(|n| n.node == t.node)
        .expect("configured node is listed");
    assert_eq!(node.status, "online");

    let status = c.node_status(&t.node).await.unwrap();
    let mem = status.memory;
    assert!(
        mem.total.unwrap_or(0) > 0 && mem.used.unwrap_or(0) <= mem.total.unwrap_or(0),
        "{mem:?}"
    );

    let vms = c.cluster_resources(Some(ResourceType::Vm)).await.unwrap();
    let tpl = vms
        .iter()
        .find(|r| r.vmid == Some(t.template))
        .expect("template in cluster resources");
    assert!(tpl.template);
    assert_eq!(tpl.resource_type, "qemu");
    assert!(
        vms.iter()
            .all(|r| r.resource_type == "qemu" || r.resource_type == "lxc")
    );
    let all = c.cluster_resources(None).await.unwrap();
    assert!(
        all.iter()
            .any(|r| r.resource_type == "node" && r.node.as_deref() == Some(t.node.as_str()))
    );

    let listed = c.list_vms(&t.node).await.unwrap();
    assert!(listed.iter().any(|v| v.vmid == t.template && v.template));

    let storages = c.list_storage(&t.node, None).await.unwrap();
    let iso = storages
        .iter()
        .find(|s| s.storage == t.iso_storage)
        .expect("ISO storage listed");
    assert!(iso.allows("iso"), "{iso:?}");
    let filtered = c.list_storage(&t.node, Some("iso")).await.unwrap();
    assert!(
        !filtered.is_empty() && filtered.iter().all(|s| s.allows("iso")),
        "{filtered:?}"
    );

    let pools = c.pools().await.unwrap();
    if let Some(pool) = &t.pool {
        assert!(pools.iter().any(|p| &p.poolid == pool), "{pools:?}");
        assert_eq!(&c.pool(pool).await.unwrap().poolid, pool);
    }
    let err = c.pool("banlieue-no-such-pool").await.unwrap_err();
    assert_eq!(err.class(), ErrorClass::NotFound, "{err}");
}

/// nextid, clone (lock window, fresh MAC and uuid), config get/put/post, resize, power, agent,
/// delete.
pub async fn vm_lifecycle(t: &Target) {
    let c = &t.client;
    let newid = c.next_id().await.unwrap();
    assert!(newid >= 100);
    assert!(c.is_vmid_free(newid).await.unwrap());
    assert!(!c.is_vmid_free(t.template).await.unwrap());

    let tpl = c.vm_config(&t.node, t.template).await.unwrap();
    assert!(tpl.is_template());
    let tpl_net = tpl.net(0).unwrap().expect("template has net0");

    let name = format!("banlieue-contract-{newid}");
    let req = CloneRequest {
        newid,
        name: Some(name.clone()),
        pool: t.pool.clone(),
        ..CloneRequest::default()
    };
    let task = c.clone_vm(&t.node, t.template, &req).await.unwrap();
    assert_eq!(
        (task.task_type.as_str(), task.node.as_str()),
        ("qmclone", t.node.as_str())
    );
    let during = c.vm_config(&t.node, newid).await.unwrap();
    if c.task_status(&task).await.unwrap().outcome() == TaskOutcome::Running {
        assert_eq!(
            during.lock(),
            Some("clone"),
            "config exists with the clone lock while cloning"
        );
    }
    wait_ok(t, &task).await;

    let err = c.clone_vm(&t.node, t.template, &req).await.unwrap_err();
    assert_eq!(err.class(), ErrorClass::AlreadyExists, "{err}");

    let cfg = c.vm_config(&t.node, newid).await.unwrap();
    assert_eq!(cfg.name(), Some(name.as_str()));
    assert_eq!(cfg.lock(), None);
    assert!(!cfg.is_template());
    let net = cfg.net(0).unwrap().expect("clone has net0");
    let mac = net.mac.clone().expect("clone has a MAC");
    assert_ne!(Some(&mac), tpl_net.mac.as_ref(), "clone gets a new MAC");
    assert!(mac.to_uppercase().starts_with("BC:24:11:"), "{mac}");
    assert!(cfg.smbios_uuid().is_some());
    assert_ne!(
        cfg.smbios_uuid(),
        tpl.smbios_uuid(),
        "clone gets a new smbios uuid"
    );
    if let Some(pool) = &t.pool {
        let members = c.pool(pool).await.unwrap().members;
        assert!(members.iter().any(|m| m.vmid == Some(newid)), "{members:?}");
    }

    // Synchronous update with typed values.
    let ip = IpConfig {
        ip: Some(IpAssign::Static("10.0.0.5/24".into())),
        gw: Some("10.0.0.1".into()),
        ..IpConfig::default()
    };
    let nic = NetDevice {
        mac: Some(mac.clone()),
        tag: Some(20),
        ..NetDevice::virtio("vmbr0")
    };
    let update = ConfigUpdate::default()
        .set("cores", "2")
        .set("memory", "2048")
        .set("tags", format_tags(["banlieue", "Contract"]).unwrap())
        .set("ipconfig0", ip.to_string())
        .set("net0", nic.to_string());
    c.update_vm_config(&t.node, newid, &update).await.unwrap();
    let cfg = c.vm_config(&t.node, newid).await.unwrap();
    assert_eq!(cfg.memory_mib(), Some(2048));
    assert_eq!(cfg.get("cores"), Some("2"));
    assert_eq!(cfg.tags().unwrap(), vec!["banlieue", "contract"]);
    assert_eq!(cfg.ipconfig(0).unwrap(), Some(ip));
    let net = cfg.net(0).unwrap().unwrap();
    assert_eq!(
        (net.mac.as_deref(), net.tag, net.bridge.as_deref()),
        (Some(mac.as_str()), Some(20), Some("vmbr0"))
    );

    // Asynchronous update with a delete.
    let update = ConfigUpdate::default()
        .set("description", "banlieue contract test")
        .delete("ipconfig0");
    if let Some(task) = c.update_vm_config_async(&t.node, newid, &update).await.unwrap() {
        assert_eq!(task.task_type, "qmconfig");
        wait_ok(t, &task).await;
    }
    let cfg = c.vm_config(&t.node, newid).await.unwrap();
    assert_eq!(cfg.get("description"), Some("banlieue contract test"));
    assert_eq!(cfg.get("ipconfig0"), None);

    // Resize.
    let before = cfg.disks().unwrap()["scsi0"].size.expect("scsi0 has a size");
    if let Some(task) = c
        .resize_disk(&t.node, newid, "scsi0", SizeChange::Grow(Size::gib(2)))
        .await
        .unwrap()
    {
        wait_ok(t, &task).await;
    }
    let after = c.vm_config(&t.node, newid).await.unwrap().disks().unwrap()["scsi0"]
        .size
        .unwrap();
    assert_eq!(after.bytes(), before.bytes() + Size::gib(2).bytes());
    let err = c
        .resize_disk(&t.node, newid, "scsi0", SizeChange::To(Size::gib(1)))
        .await;
    match err {
        Err(e) => assert_ne!(e.class(), ErrorClass::Transient, "{e}"),
        Ok(Some(task)) => assert!(
            c.wait_task(&task, t.task_deadline, POLL).await.is_err(),
            "shrinking fails"
        ),
        Ok(None) => panic!("shrinking must fail"),
    }

    // Power.
    wait_ok(t, &c.start_vm(&t.node, newid).await.unwrap()).await;
    let status = c.vm_status(&t.node, newid).await.unwrap();
    assert!(status.is_running(), "{status:?}");
    assert_eq!(status.vmid, newid);

    if t.sim.is_some() {
        let deadline = Instant::now() + Duration::from_secs(10);
        let ifaces = loop {
            match c.agent_network_interfaces(&t.node, newid).await {
                Ok(ifaces) => break ifaces,
                Err(e) if e.class() == ErrorClass::AgentNotRunning && Instant::now() < deadline => {
                    tokio::time::sleep(POLL).await;
                }
                Err(e) => panic!("agent: {e}"),
            }
        };
        let nic = ifaces
            .iter()
            .find(|i| {
                i.hardware_address
                    .as_deref()
                    .is_some_and(|m| m.eq_ignore_ascii_case(&mac))
            })
            .expect("an interface with the VM's MAC");
        assert!(
            nic.ip_addresses.iter().any(|a| a.ip_address_type == "ipv4"),
            "{nic:?}"
        );
        wait_ok(t, &c.reboot_vm(&t.node, newid).await.unwrap()).await;
        wait_ok(t, &c.shutdown_vm(&t.node, newid, Some(30), true).await.unwrap()).await;
        assert!(!c.vm_status(&t.node, newid).await.unwrap().is_running());
        wait_ok(t, &c.start_vm(&t.node, newid).await.unwrap()).await;
    }

    let err = c
        .delete_vm(&t.node, newid, DeleteVmOptions::default())
        .await
        .unwrap_err();
    assert!(err.message().unwrap_or_default().contains("running"), "{err}");

    wait_ok(t, &c.stop_vm(&t.node, newid).await.unwrap()).await;
    assert_eq!(c.vm_status(&t.node, newid).await.unwrap().status, "stopped");

    let task = c
        .delete_vm(
            &t.node,
            newid,
            DeleteVmOptions {
                purge: true,
                destroy_unreferenced_disks: true,
            },
        )
        .await;
    wait_ok(t, &task.unwrap()).await;
    let err = c.vm_config(&t.node, newid).await.unwrap_err();
    assert_eq!(err.class(), ErrorClass::NotFound, "{err}");
    let err = c.vm_status(&t.node, newid).await.unwrap_err();
    assert_eq!(err.class(), ErrorClass::NotFound, "{err}");
    let log = c.task_log(&task_for_log(t), 0, 50).await.unwrap();
    assert!(log.iter().all(|l| l.n >= 1));
}

fn task_for_log(t: &Target) -> Upid {
    t.records()
        .iter()
        .rev()
        .find_map(|r| {
            r.path
                .contains("/tasks/")
                .then(|| r.path.split('/').nth(4).map(str::to_owned))
                .flatten()
        })
        .expect("a task was polled")
        .parse()
        .unwrap()
}

/// Starting a template is accepted and fails inside the task.
pub async fn start_template_fails_in_task(t: &Target) {
    let c = &t.client;
    let task = c.start_vm(&t.node, t.template).await.unwrap();
    let err = c.wait_task(&task, t.task_deadline, POLL).await.unwrap_err();
    assert_eq!(err.class(), ErrorClass::TaskFailed, "{err}");
    assert!(err.message().unwrap_or_default().contains("template"), "{err}");
}

/// Missing objects are `NotFound`.
pub async fn missing_objects(t: &Target) {
    let c = &t.client;
    let free = c.next_id().await.unwrap();
    for err in [
        c.vm_config(&t.node, free).await.unwrap_err(),
        c.vm_status(&t.node, free).await.unwrap_err(),
        c.agent_network_interfaces(&t.node, free).await.unwrap_err(),
    ] {
        assert_eq!(err.class(), ErrorClass::NotFound, "{err}");
    }
}

/// Upload a NoCloud seed ISO, find it in the storage content, boot a VM with it (simulator: read
/// the seed back), delete it.
pub async fn seed_iso_upload(t: &Target) {
    let c = &t.client;
    let newid = c.next_id().await.unwrap();
    let seed = NoCloudSeed {
        user_data: b"#cloud-config\nhostname: contract\n".to_vec(),
        meta_data: MetaData {
            instance_id: format!("contract-{newid}"),
            local_hostname: "contract".into(),
        },
        network_config: None,
    };
    let iso = seed.to_iso().unwrap();
    let file = format!("banlieue-contract-{newid}.iso");
    let task = c
        .upload(&t.node, &t.iso_storage, UploadContent::Iso, &file, iso.clone())
        .await
        .unwrap();
    wait_ok(t, &task).await;
    let volid = format!("{}:iso/{file}", t.iso_storage);
    let content = c
        .storage_content(&t.node, &t.iso_storage, Some("iso"))
        .await
        .unwrap();
    let vol = content
        .iter()
        .find(|v| v.volid == volid)
        .expect("uploaded ISO listed");
    assert_eq!(vol.size, Some(iso.len() as u64));
    assert_eq!(vol.content, "iso");

    if let Some(sim) = &t.sim {
        let req = CloneRequest {
            newid,
            name: Some(format!("seed-{newid}")),
            ..CloneRequest::default()
        };
        wait_ok(t, &c.clone_vm(&t.node, t.template, &req).await.unwrap()).await;
        let update = ConfigUpdate::default().set("ide0", format!("{volid},media=cdrom"));
        c.update_vm_config(&t.node, newid, &update).await.unwrap();
        wait_ok(t, &c.start_vm(&t.node, newid).await.unwrap()).await;
        let booted = sim.seed(newid).expect("VM booted with a seed");
        assert_eq!(
            booted.user_data.as_deref(),
            Some("#cloud-config\nhostname: contract\n")
        );
        assert!(
            booted
                .meta_data
                .unwrap_or_default()
                .contains(&format!("contract-{newid}"))
        );
        wait_ok(t, &c.stop_vm(&t.node, newid).await.unwrap()).await;
        wait_ok(
            t,
            &c.delete_vm(&t.node, newid, DeleteVmOptions::default())
                .await
                .unwrap(),
        )
        .await;
    }

    if let Some(task) = c.delete_volume(&t.node, &t.iso_storage, &volid).await.unwrap() {
        wait_ok(t, &task).await;
    }
    let content = c.storage_content(&t.node, &t.iso_storage, None).await.unwrap();
    assert!(content.iter().all(|v| v.volid != volid), "volume deleted");
}

/// All scenarios, in order.
pub async fn all(t: &Target) {
    discovery(t).await;
    vm_lifecycle(t).await;
    start_template_fails_in_task(t).await;
    missing_objects(t).await;
    seed_iso_upload(t).await;
}
