//! The libvirt provider under the shared scenario suite: libvirt's `test:///default` driver
//! through the real `virt` connection (its state lives as long as the connection, so one
//! connector per scenario is kept across controller restarts), and the LibvirtCluster and
//! LibvirtMachine controllers running in-process for the scenario's namespace.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use anyhow::Result;
use banlieue_cloudinit::SeedFiles;
use banlieue_libvirt::cluster_controller::LibvirtClusters;
use banlieue_libvirt::connection::{VirtConnector, VirtHypervisor};
use banlieue_libvirt::desired::{Settings, domain_name};
use banlieue_libvirt::hosts::Connector;
use banlieue_libvirt::hypervisor::{
    DomainInfo, ErrorKind, GuestAddress, HostInfo, HvError, HvResult, Hypervisor, VolumeInfo,
};
use banlieue_libvirt::machine_controller::{FIELD_MANAGER, LibvirtMachines};
use banlieue_libvirt::xml::{self, DomainType, Owner};
use banlieue_provider_kit::cluster::{self as kit_cluster, ClusterContext};
use banlieue_provider_kit::machine::{self as kit_machine, MachineContext};
use banlieue_scenarios::{Access, Controllers, MachineHint, ProviderUnderTest, Template, Vm};
use serde_json::{Value, json};

const URI: &str = "test:///default";
const POOL: &str = "default-pool";
const BASE: &str = "base.qcow2";
/// A libvirt daemon that is not there (nothing listens on port 1).
const UNREACHABLE: &str = "qemu+tcp://127.0.0.1:1/system";

/// `test:///default` with a base volume; one host, failure domain `localhost`.
pub struct TestDriver {
    kube: kube::Client,
    ns: String,
    connector: SlowConnector,
    controllers: Controllers,
}

impl ProviderUnderTest for TestDriver {
    const NAME: &'static str = "lv";
    const CLUSTER_KIND: &'static str = "LibvirtCluster";
    const MACHINE_KIND: &'static str = "LibvirtMachine";
    const PROVIDER_ID_PREFIX: &'static str = "libvirt://localhost/";
    const BAD_TEMPLATE_REASON: &'static str = "BaseVolumeNotFound";
    const MISSING_TEMPLATE: &'static str = "missing-base.qcow2";
    // libvirt credentials are SSH keys or TLS certificates for remote URIs; without a remote
    // daemon here, bad access is a host that does not answer.
    const BAD_ACCESS_REASONS: &'static [&'static str] = &["Unreachable"];
    const OUTAGE_MESSAGE: &'static str = "(test outage)";
    // finalizer, providerID, one status: libvirt calls return when done.
    const PROVISIONING_WRITES: usize = 3;
    const NETWORK: &'static str = "default";

    async fn setup(kube: kube::Client, ns: &str) -> Result<Self> {
        let connector = SlowConnector::default();
        let hv = connector.inner.get(URI);
        // test:///default is one shared state per process and scenarios set up in parallel:
        // another one may create the base volume between the check and the create.
        if hv.volume(POOL, BASE).await?.is_none()
            && let Err(e) = hv
                .create_volume(POOL, &xml::plain_volume_xml(BASE, 1 << 30, "qcow2"))
                .await
            && hv.volume(POOL, BASE).await?.is_none()
        {
            return Err(e.into());
        }
        Ok(Self {
            kube,
            ns: ns.to_owned(),
            connector,
            controllers: Controllers::default(),
        })
    }

    fn failure_domains(&self) -> Vec<String> {
        vec!["localhost".into()]
    }

    async fn cluster_spec(&self, access: Access) -> Result<Value> {
        let uri = match access {
            Access::Valid => URI,
            Access::Bad => UNREACHABLE,
        };
        Ok(json!({"uri": uri}))
    }

    fn machine_spec(&self, template: Template) -> Value {
        let volume = match template {
            Template::Valid => BASE,
            Template::Missing => Self::MISSING_TEMPLATE,
        };
        json!({"source": {"volume": volume, "pool": POOL}, "cpu": {"cores": 1}, "memoryMiB": 256})
    }

    fn start(&mut self) {
        let settings = Settings {
            domain_type: DomainType::Qemu,
            ..Settings::default()
        };
        let machines = Arc::new(MachineContext::new(
            self.kube.clone(),
            LibvirtMachines {
                connector: self.connector.clone(),
                settings,
                imports: Default::default(),
            },
            "banlieue-libvirt-test",
        ));
        let clusters = Arc::new(ClusterContext::new(
            self.kube.clone(),
            LibvirtClusters {
                connector: self.connector.clone(),
            },
            FIELD_MANAGER,
        ));
        let (a, b) = (self.ns.clone(), self.ns.clone());
        self.controllers.push(tokio::spawn(async move {
            kit_machine::run(machines, Some(&a), 4, std::future::pending()).await;
        }));
        self.controllers.push(tokio::spawn(async move {
            kit_cluster::run(clusters, Some(&b), 2, std::future::pending()).await;
        }));
    }

    async fn stop(&mut self) {
        self.controllers.stop().await;
    }

    async fn vms(&self, machines: &[MachineHint]) -> Result<Vec<Vm>> {
        // Domains are found by the names and uuids the provider would give them (the test
        // driver's own `test` domain is not ours).
        let hv = self.connector.inner.get(URI);
        let mut found: Vec<(DomainInfo, String)> = Vec::new();
        for m in machines {
            let name = domain_name(&self.ns, &m.name);
            for d in [hv.domain_by_uuid(&m.uid).await?, hv.domain_by_name(&name).await?]
                .into_iter()
                .flatten()
            {
                if !found.iter().any(|(f, _)| f.uuid == d.uuid) {
                    found.push((d, name.clone()));
                }
            }
        }
        Ok(found
            .into_iter()
            .map(|(d, name)| {
                let seed = hv
                    .uploaded(POOL, &format!("{name}-seed.iso"))
                    .and_then(|iso| SeedFiles::from_iso(&iso).ok())
                    .unwrap_or_default();
                Vm {
                    id: d.uuid.clone(),
                    owner_uid: d.owner.as_ref().map(|o| o.uid.clone()),
                    failure_domain: Some("localhost".into()),
                    user_data: seed.user_data,
                    network_config: seed.network_config,
                }
            })
            .collect())
    }

    async fn slow_down(&self) -> Result<()> {
        self.connector.delay_ms.store(50, Ordering::Relaxed);
        Ok(())
    }

    async fn outage(&self, down: bool) -> Result<()> {
        self.connector.down.store(down, Ordering::Relaxed);
        Ok(())
    }

    fn secrets(&self) -> Vec<String> {
        Vec::new()
    }
}

/// The real connector with an adjustable delay before every libvirt call (the test driver
/// answers in microseconds; a crash test needs time between steps).
#[derive(Clone, Default)]
struct SlowConnector {
    inner: VirtConnector,
    delay_ms: Arc<AtomicU64>,
    down: Arc<AtomicBool>,
}

impl Connector for SlowConnector {
    type Hv = SlowHypervisor;

    fn connect(&self, uri: &str) -> Arc<SlowHypervisor> {
        Arc::new(SlowHypervisor {
            inner: self.inner.get(uri),
            delay_ms: self.delay_ms.clone(),
            down: self.down.clone(),
        })
    }
}

struct SlowHypervisor {
    inner: Arc<VirtHypervisor>,
    delay_ms: Arc<AtomicU64>,
    down: Arc<AtomicBool>,
}

impl SlowHypervisor {
    /// Waits the delay; fails as libvirt does when the daemon is gone, during an outage.
    async fn pause(&self) -> HvResult<()> {
        let ms = self.delay_ms.load(Ordering::Relaxed);
        if ms > 0 {
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
        if self.down.load(Ordering::Relaxed) {
            return Err(HvError::new(
                ErrorKind::Transient,
                "connecting",
                "Cannot recv data: Connection reset by peer (test outage)",
            ));
        }
        Ok(())
    }
}

impl Hypervisor for SlowHypervisor {
    async fn host_info(&self) -> HvResult<HostInfo> {
        self.pause().await?;
        self.inner.host_info().await
    }
    async fn domain_by_uuid(&self, uuid: &str) -> HvResult<Option<DomainInfo>> {
        self.pause().await?;
        self.inner.domain_by_uuid(uuid).await
    }
    async fn domain_by_name(&self, name: &str) -> HvResult<Option<DomainInfo>> {
        self.pause().await?;
        self.inner.domain_by_name(name).await
    }
    async fn define_domain(&self, xml: &str) -> HvResult<DomainInfo> {
        self.pause().await?;
        self.inner.define_domain(xml).await
    }
    async fn start_domain(&self, uuid: &str) -> HvResult<()> {
        self.pause().await?;
        self.inner.start_domain(uuid).await
    }
    async fn shutdown_domain(&self, uuid: &str) -> HvResult<()> {
        self.pause().await?;
        self.inner.shutdown_domain(uuid).await
    }
    async fn destroy_domain(&self, uuid: &str) -> HvResult<()> {
        self.pause().await?;
        self.inner.destroy_domain(uuid).await
    }
    async fn set_domain_owner(&self, uuid: &str, owner: &Owner, adopted_from: Option<&str>) -> HvResult<()> {
        self.pause().await?;
        self.inner.set_domain_owner(uuid, owner, adopted_from).await
    }
    async fn undefine_domain(&self, uuid: &str) -> HvResult<()> {
        self.pause().await?;
        self.inner.undefine_domain(uuid).await
    }
    async fn domain_addresses(&self, uuid: &str) -> HvResult<Vec<GuestAddress>> {
        self.pause().await?;
        self.inner.domain_addresses(uuid).await
    }
    async fn volume(&self, pool: &str, name: &str) -> HvResult<Option<VolumeInfo>> {
        self.pause().await?;
        self.inner.volume(pool, name).await
    }
    async fn create_volume(&self, pool: &str, xml: &str) -> HvResult<VolumeInfo> {
        self.pause().await?;
        self.inner.create_volume(pool, xml).await
    }
    async fn upload_volume(&self, pool: &str, name: &str, data: Vec<u8>) -> HvResult<()> {
        self.pause().await?;
        self.inner.upload_volume(pool, name, data).await
    }
    async fn upload_volume_file(
        &self,
        pool: &str,
        name: &str,
        path: &std::path::Path,
        length: u64,
    ) -> HvResult<()> {
        self.pause().await?;
        self.inner.upload_volume_file(pool, name, path, length).await
    }
    async fn clone_volume(&self, pool: &str, xml: &str, from: &str) -> HvResult<VolumeInfo> {
        self.pause().await?;
        self.inner.clone_volume(pool, xml, from).await
    }
    async fn delete_volume(&self, pool: &str, name: &str) -> HvResult<()> {
        self.pause().await?;
        self.inner.delete_volume(pool, name).await
    }
    async fn cloud_init_result(&self, uuid: &str) -> HvResult<Option<String>> {
        self.pause().await?;
        self.inner.cloud_init_result(uuid).await
    }
}
