//! The client against a real vcsim process (govmomi's vSphere simulator) on loopback, over TLS
//! verified with a CA bundle or a pinned thumbprint.

#[path = "support/vcsim.rs"]
mod vcsim_support;

use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use banlieue_vsphere_client::vim::ConfigSpec;
use banlieue_vsphere_client::{
    Client, ClientBuilder, CloneSpec, ErrorClass, HostRoom, MoRef, PoolHosts, TlsVerification, VmPowerState,
};
use base64::Engine as _;
use vcsim_support::{PASSWORD, USER, Vcsim};

const POLL: Duration = Duration::from_millis(100);
const TASK_TIMEOUT: Duration = Duration::from_secs(60);

fn client(sim: &Vcsim) -> Result<Client> {
    Ok(ClientBuilder::new(&sim.url, USER, PASSWORD)
        .tls(TlsVerification::CaBundle(sim.ca_pem.clone()))
        .timeout(Duration::from_secs(30))
        .build()?)
}

async fn find(c: &Client, path: &str) -> Result<MoRef> {
    c.find_by_inventory_path(path)
        .await?
        .with_context(|| format!("{path} not found"))
}

/// Powers off the model's VM `DC0_C0_RP0_VM0` and marks it as a template.
async fn make_template(c: &Client) -> Result<MoRef> {
    let vm = find(c, "/DC0/vm/DC0_C0_RP0_VM0").await?;
    let info = c.vm_info(&vm).await?.context("template VM vanished")?;
    if info.power_state == Some(VmPowerState::PoweredOn) {
        let task = c.power_off(&vm).await?;
        c.wait_task(&task, POLL, TASK_TIMEOUT).await?;
    }
    c.mark_as_template(&vm).await?;
    Ok(vm)
}

#[tokio::test]
async fn logs_in_with_a_ca_bundle_and_finds_the_inventory() -> Result<()> {
    let sim = Vcsim::start(&[])?;
    let c = client(&sim)?;
    let content = c.service_content().await?;
    ensure!(content.api_type == "VirtualCenter", "{content:?}");
    c.login().await?;
    let dc = find(&c, "/DC0").await?;
    ensure!(dc.kind == "Datacenter", "{dc}");
    ensure!(find(&c, "DC0/vm").await?.kind == "Folder");
    ensure!(find(&c, "/DC0/host/DC0_C0/Resources").await?.kind == "ResourcePool");
    ensure!(find(&c, "/DC0/datastore/LocalDS_0").await?.kind == "Datastore");
    ensure!(find(&c, "/DC0/vm/DC0_C0_RP0_VM0").await?.kind == "VirtualMachine");
    ensure!(
        c.find_by_inventory_path("/DC0/vm/no-such-template")
            .await?
            .is_none()
    );
    Ok(())
}

#[tokio::test]
async fn tls_is_verified_by_thumbprint_and_rejected_otherwise() -> Result<()> {
    let sim = Vcsim::start(&[])?;
    let pinned = ClientBuilder::new(&sim.host, USER, PASSWORD)
        .tls(TlsVerification::Thumbprint(sim.thumbprint.clone()))
        .build()?;
    pinned.login().await?;

    let wrong = ClientBuilder::new(&sim.host, USER, PASSWORD)
        .tls(TlsVerification::Thumbprint("00".repeat(32)))
        .build()?;
    let err = wrong.login().await.expect_err("a wrong thumbprint was accepted");
    ensure!(err.class() == ErrorClass::Tls, "{err:?}");
    // The message names both: the presented and the pinned one.
    let shown = err.to_string().to_uppercase().replace(':', "");
    ensure!(
        shown.contains("FINGERPRINT MISMATCH")
            && shown.contains(&sim.thumbprint.to_uppercase().replace(':', ""))
            && shown.contains(&"00".repeat(32)),
        "{err}"
    );

    // The default (web PKI roots) does not trust a private CA, and says so.
    let default = ClientBuilder::new(&sim.host, USER, PASSWORD).build()?;
    let err = default.login().await.expect_err("an untrusted CA was accepted");
    ensure!(err.class() == ErrorClass::Tls, "{err:?}");
    ensure!(err.to_string().contains("unknown CA"), "{err}");
    Ok(())
}

#[tokio::test]
async fn wrong_credentials_are_an_auth_error_without_the_password() -> Result<()> {
    let sim = Vcsim::start(&[])?;
    let c = ClientBuilder::new(&sim.url, USER, "not-the-password")
        .tls(TlsVerification::CaBundle(sim.ca_pem.clone()))
        .build()?;
    let err = c
        .find_by_inventory_path("/DC0")
        .await
        .expect_err("bad password accepted");
    ensure!(err.class() == ErrorClass::Auth, "{err:?}");
    ensure!(err.fault() == Some("InvalidLogin"), "{err:?}");
    let shown = format!("{err} {err:?} {c:?}");
    ensure!(!shown.contains("not-the-password"), "password leaked: {shown}");
    Ok(())
}

#[tokio::test]
async fn logs_in_again_when_the_session_is_gone() -> Result<()> {
    let sim = Vcsim::start(&[])?;
    let c = client(&sim)?;
    c.login().await?;
    // End the session on the server but keep the cookie: the next call gets NotAuthenticated.
    let sm = c.service_content().await?.session_manager.clone();
    c.call("Logout", &sm.to_xml("_this")).await?;
    let dc = c.find_by_inventory_path("/DC0").await?;
    ensure!(dc.is_some(), "call after re-login failed");
    Ok(())
}

#[tokio::test]
async fn clone_configure_power_guest_ip_find_and_destroy() -> Result<()> {
    let sim = Vcsim::start(&[])?;
    let c = client(&sim)?;
    let template = make_template(&c).await?;
    let folder = find(&c, "/DC0/vm").await?;
    let pool = find(&c, "/DC0/host/DC0_C0/Resources").await?;
    let datastore = find(&c, "/DC0/datastore/LocalDS_0").await?;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let owner = "0b9f1c2e-1111-4c5d-9e8f-aa00bb11cc22";
    let spec = CloneSpec {
        folder: folder.clone(),
        name: "machine-1".into(),
        pool,
        datastore: Some(datastore),
        host: None,
        linked_snapshot: None,
        config: ConfigSpec {
            extra_config: vec![
                (
                    "guestinfo.userdata".into(),
                    b64("#cloud-config\nhostname: machine-1\n"),
                ),
                ("guestinfo.userdata.encoding".into(), "base64".into()),
                ("guestinfo.metadata".into(), b64("instance-id: machine-1\n")),
                ("guestinfo.metadata.encoding".into(), "base64".into()),
                ("banlieue.owner-uid".into(), owner.into()),
            ],
            ..ConfigSpec::default()
        },
        power_on: false,
    };
    let task = c.clone_vm(&template, &spec).await?;
    ensure!(task.kind == "Task", "{task}");
    let vm = c
        .wait_task(&task, POLL, TASK_TIMEOUT)
        .await?
        .context("clone returned no VM")?;
    ensure!(vm.kind == "VirtualMachine", "{vm}");
    let info = c.vm_info(&vm).await?.context("clone vanished")?;
    ensure!(info.name == "machine-1");
    ensure!(!info.template);
    ensure!(
        info.extra_config.get("guestinfo.userdata") == Some(&b64("#cloud-config\nhostname: machine-1\n"))
    );
    ensure!(info.extra_config.get("banlieue.owner-uid").map(String::as_str) == Some(owner));
    let uuid = info.bios_uuid.clone().context("no BIOS UUID")?;

    // A second clone with the same name fails as a task error with its fault type.
    let dup = c.clone_vm(&template, &spec).await?;
    let err = c
        .wait_task(&dup, POLL, TASK_TIMEOUT)
        .await
        .expect_err("duplicate accepted");
    ensure!(err.fault().is_some(), "{err:?}");

    // CPU and memory.
    let reconf = ConfigSpec {
        num_cpus: Some(4),
        cores_per_socket: Some(2),
        memory_mb: Some(4096),
        ..ConfigSpec::default()
    };
    c.wait_task(&c.reconfigure(&vm, &reconf).await?, POLL, TASK_TIMEOUT)
        .await?;
    let info = c.vm_info(&vm).await?.context("vanished")?;
    ensure!(
        info.num_cpu == Some(4) && info.memory_mb == Some(4096),
        "{info:?}"
    );

    // Power on, then the guest IP (vcsim: set through extraConfig SET.guest.ipAddress).
    c.wait_task(&c.power_on(&vm).await?, POLL, TASK_TIMEOUT).await?;
    let set_ip = ConfigSpec {
        extra_config: vec![("SET.guest.ipAddress".into(), "10.20.30.40".into())],
        ..ConfigSpec::default()
    };
    c.wait_task(&c.reconfigure(&vm, &set_ip).await?, POLL, TASK_TIMEOUT)
        .await?;
    let info = c.vm_info(&vm).await?.context("vanished")?;
    ensure!(info.power_state == Some(VmPowerState::PoweredOn), "{info:?}");
    ensure!(info.ip_address.as_deref() == Some("10.20.30.40"), "{info:?}");
    ensure!(info.host.is_some(), "{info:?}");

    // Lookups: by BIOS UUID and by the owner marker.
    ensure!(c.find_vm_by_bios_uuid(None, &uuid).await? == Some(vm.clone()));
    ensure!(c.find_vms_by_extra_config("banlieue.owner-uid", owner).await? == vec![vm.clone()]);
    ensure!(
        c.find_vms_by_extra_config("banlieue.owner-uid", "someone-else")
            .await?
            .is_empty()
    );

    // Power off and destroy.
    c.wait_task(&c.power_off(&vm).await?, POLL, TASK_TIMEOUT).await?;
    c.wait_task(&c.destroy(&vm).await?, POLL, TASK_TIMEOUT).await?;
    ensure!(c.vm_info(&vm).await?.is_none(), "VM still there");
    ensure!(c.find_vm_by_bios_uuid(None, &uuid).await?.is_none());
    Ok(())
}

fn rooms(hosts: PoolHosts) -> Result<Vec<HostRoom>> {
    match hosts {
        PoolHosts::Hosts(rooms) => Ok(rooms),
        PoolHosts::Drs => anyhow::bail!("DRS places the VM"),
    }
}

#[tokio::test]
async fn a_pool_lists_its_hosts_with_the_memory_committed_to_their_vms_unless_drs_places() -> Result<()> {
    let sim = Vcsim::start(&[])?;
    let c = client(&sim)?;
    let template = make_template(&c).await?;
    let pool = find(&c, "/DC0/host/DC0_C0/Resources").await?;
    ensure!(
        c.pool_hosts(&pool).await? == PoolHosts::Drs,
        "vcsim's clusters have DRS on"
    );

    sim.disable_drs(&c, "/DC0/host/DC0_C0").await?;
    let before = rooms(c.pool_hosts(&pool).await?)?;
    let mut names: Vec<&str> = before.iter().map(|h| h.name.as_str()).collect();
    names.sort_unstable();
    ensure!(names == ["DC0_C0_H0", "DC0_C0_H1", "DC0_C0_H2"], "{before:?}");
    ensure!(
        before
            .iter()
            .all(|h| h.usable && h.memory_mib > 0 && h.free_mib() <= h.memory_mib),
        "{before:?}"
    );

    // A clone pinned to a host commits its configured memory there, whether powered on or not.
    let target = before.iter().find(|h| h.name == "DC0_C0_H2").context("no H2")?;
    let spec = CloneSpec {
        folder: find(&c, "/DC0/vm").await?,
        name: "placed".into(),
        pool: pool.clone(),
        datastore: None,
        host: Some(target.host.clone()),
        linked_snapshot: None,
        config: ConfigSpec::default(),
        power_on: false,
    };
    let vm = c
        .wait_task(&c.clone_vm(&template, &spec).await?, POLL, TASK_TIMEOUT)
        .await?
        .context("clone returned no VM")?;
    let info = c.vm_info(&vm).await?.context("clone vanished")?;
    ensure!(info.host.as_ref() == Some(&target.host), "{info:?}");
    let reconf = ConfigSpec {
        memory_mb: Some(1536),
        ..ConfigSpec::default()
    };
    c.wait_task(&c.reconfigure(&vm, &reconf).await?, POLL, TASK_TIMEOUT)
        .await?;
    let after = rooms(c.pool_hosts(&pool).await?)?;
    for host in &after {
        let was = before
            .iter()
            .find(|h| h.host == host.host)
            .context("a host vanished")?;
        let grew = if host.host == target.host { 1536 } else { 0 };
        ensure!(
            host.committed_mib == was.committed_mib + grew,
            "{was:?} -> {host:?}"
        );
    }

    // A standalone host's pool has that one host.
    let standalone = rooms(
        c.pool_hosts(&find(&c, "/DC0/host/DC0_H0/Resources").await?)
            .await?,
    )?;
    ensure!(
        standalone.len() == 1 && standalone[0].name == "DC0_H0",
        "{standalone:?}"
    );
    Ok(())
}

/// A TLS server on loopback standing for an ESXi host behind a lease URL: answers every request
/// `200`, recording each request's header block and body length.
async fn esxi_host() -> Result<(
    u16,
    String,
    tokio::task::JoinHandle<()>,
    std::sync::Arc<std::sync::Mutex<Vec<(String, usize)>>>,
)> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let cert = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_owned()])?;
    let der = cert.cert.der().to_vec();
    let key = rustls::pki_types::PrivateKeyDer::try_from(cert.signing_key.serialize_der())
        .map_err(anyhow::Error::msg)?;
    let config = rustls::ServerConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_no_client_auth()
    .with_single_cert(vec![der.clone().into()], key)?;
    let acceptor = tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let record = seen.clone();
    let task = tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (acceptor, record) = (acceptor.clone(), record.clone());
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let mut data = Vec::new();
                let mut buf = [0u8; 8192];
                // Headers, then as many body bytes as Content-Length says.
                let (head, length) = loop {
                    let Ok(n @ 1..) = tls.read(&mut buf).await else {
                        return;
                    };
                    data.extend_from_slice(&buf[..n]);
                    if let Some(end) = data.windows(4).position(|w| w == b"\r\n\r\n") {
                        let head = String::from_utf8_lossy(&data[..end]).to_string();
                        let length = head
                            .lines()
                            .find_map(|l| {
                                l.to_ascii_lowercase()
                                    .strip_prefix("content-length:")
                                    .map(|v| v.trim().parse::<usize>().unwrap_or(0))
                            })
                            .unwrap_or(0);
                        data.drain(..end + 4);
                        break (head, length);
                    }
                };
                while data.len() < length {
                    let Ok(n @ 1..) = tls.read(&mut buf).await else {
                        break;
                    };
                    data.extend_from_slice(&buf[..n]);
                }
                record.lock().unwrap().push((head, data.len()));
                let _ = tls
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
                    .await;
                let _ = tls.shutdown().await;
            });
        }
    });
    Ok((port, banlieue_provider_runtime::tls::sha1_of(&der), task, seen))
}

/// An upload to a lease URL on another host than vCenter (an ESXi host) pins the SHA-1
/// `sslThumbprint` vCenter gave for that host and carries no vCenter session cookie; a host
/// presenting another certificate is refused, naming both digests.
#[tokio::test]
async fn a_lease_upload_to_a_host_pins_its_sha1_thumbprint_and_sends_no_vcenter_cookie() -> Result<()> {
    let sim = Vcsim::start(&[])?;
    let c = client(&sim)?;
    c.login().await?;
    let (port, thumbprint, server, seen) = esxi_host().await?;
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("disk-0.vmdk");
    std::fs::write(&path, vec![7u8; 3000])?;
    let device = |ssl_thumbprint: Option<String>| banlieue_vsphere_client::ovf::LeaseDevice {
        import_key: "disk:0".into(),
        url: format!("https://127.0.0.1:{port}/nfc/ticket-1/disk-0.vmdk"),
        ssl_thumbprint,
    };
    c.upload_to_lease(
        &device(Some(thumbprint.clone())),
        &path,
        1000,
        2000,
        true,
        Duration::from_secs(30),
    )
    .await?;
    let requests = seen.lock().unwrap().clone();
    ensure!(requests.len() == 1, "{requests:?}");
    let (head, body) = &requests[0];
    ensure!(head.starts_with("PUT /nfc/ticket-1/disk-0.vmdk"), "{head}");
    ensure!(*body == 2000, "the 2000 bytes from offset 1000, got {body}");
    ensure!(
        !head.to_ascii_lowercase().contains("cookie"),
        "the vCenter session went to the host: {head}"
    );

    let wrong = "00:".repeat(19) + "00";
    let refused = c
        .upload_to_lease(&device(Some(wrong)), &path, 0, 10, true, Duration::from_secs(30))
        .await
        .expect_err("another certificate than the pinned one");
    let message = refused.to_string();
    ensure!(
        message.contains("SHA-1") && message.contains(&thumbprint),
        "names the digest presented: {message}"
    );
    ensure!(
        seen.lock().unwrap().len() == 1,
        "nothing was sent to the wrong host"
    );
    server.abort();
    Ok(())
}
