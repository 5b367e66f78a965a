//! The real [`Hypervisor`]: the crates.io `virt` crate (C bindings to libvirt), one
//! `virConnect` per URI shared by all reconciles, every call on tokio's blocking pool with a
//! timeout.
//!
//! libvirt's default error handler prints every error to stderr; it is replaced by a no-op
//! once per process ([`virt::error::clear_error_callback`]). A connection that libvirt reports
//! dead is reopened on the next call.
//!
//! `test:///default` cannot store volume contents (`virStorageVolUpload` is not implemented
//! there); for that driver only, uploaded bytes are kept in this connection's memory so tests
//! can read them back with [`VirtHypervisor::uploaded`]. Nor has it a DHCP server: what a
//! test's guest reports as its lease ([`VirtHypervisor::report_leases`]) is what
//! [`Hypervisor::domain_addresses`] returns there, instead of the driver's made-up address.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Once};
use std::time::Duration;

use banlieue_provider_kit::lock;
use virt::connect::Connect;
use virt::domain::{Domain, DomainState};
use virt::enumutil::Enum;
use virt::error::ErrorNumber;
use virt::storage_pool::StoragePool;
use virt::storage_vol::StorageVol;
use virt::stream::Stream;

use crate::hypervisor::{
    DomainInfo, ErrorKind, GuestAddress, HostInfo, HvError, HvResult, Hypervisor, RunState, VolumeInfo,
};
use crate::xml;

mod fake;

/// Longest time one libvirt call may take before the reconcile gives up on it.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(60);
/// Longest time the upload or copy of an imported image may take.
pub const IMAGE_TIMEOUT: Duration = Duration::from_secs(3600);
/// Size of the pieces an image file is streamed in.
const UPLOAD_CHUNK: usize = 1 << 20;

static QUIET: Once = Once::new();

/// Volume contents kept for the `test` driver, by (pool, volume).
type Uploads = HashMap<(String, String), Vec<u8>>;

/// DHCP leases reported for the `test` driver's domains, by domain uuid (lower-case).
type Leases = HashMap<String, Vec<GuestAddress>>;

/// cloud-init's report as the guest agents of the `test` driver's domains would read it, by
/// domain uuid (lower-case); `None`: not written yet.
type CloudInitReports = HashMap<String, Option<String>>;

/// What the guest agent of a `test` driver domain nobody reported on reads: a guest whose
/// cloud-init finished at once, without errors.
pub const TEST_DRIVER_CLOUD_INIT_DONE: &str = r#"{"v1": {"datasource": "DataSourceNoCloud", "errors": []}}"#;

fn classify(operation: &str, e: &virt::error::Error) -> HvError {
    let kind = match e.code() {
        Enum::Known(
            ErrorNumber::NoDomain
            | ErrorNumber::NoStorageVolume
            | ErrorNumber::NoStoragePool
            | ErrorNumber::NoNetwork
            | ErrorNumber::NoDomainMetadata,
        ) => ErrorKind::NotFound,
        Enum::Known(ErrorNumber::DomExist | ErrorNumber::StorageVolExist) => ErrorKind::Exists,
        Enum::Known(ErrorNumber::NoSupport) => ErrorKind::Unsupported,
        Enum::Known(
            ErrorNumber::NoConnect
            | ErrorNumber::InvalidConn
            | ErrorNumber::Rpc
            | ErrorNumber::OperationTimeout
            | ErrorNumber::SystemError,
        ) => ErrorKind::Transient,
        _ => ErrorKind::Other,
    };
    HvError::new(kind, operation, e.message())
}

/// A libvirt connection to one host.
pub struct VirtHypervisor {
    uri: String,
    conn: Arc<Mutex<Option<Arc<Connect>>>>,
    test_driver: bool,
    uploads: Arc<Mutex<Uploads>>,
    leases: Arc<Mutex<Leases>>,
    cloud_init: Arc<Mutex<CloudInitReports>>,
}

impl std::fmt::Debug for VirtHypervisor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VirtHypervisor").field("uri", &self.uri).finish()
    }
}

impl VirtHypervisor {
    /// A handle for `uri`; the connection is opened on first use.
    pub fn new(uri: impl Into<String>) -> Self {
        QUIET.call_once(virt::error::clear_error_callback);
        let uri = uri.into();
        Self {
            test_driver: uri.starts_with("test://") || uri.starts_with("test+"),
            uri,
            conn: Arc::default(),
            uploads: Arc::default(),
            leases: Arc::default(),
            cloud_init: Arc::default(),
        }
    }

    /// A domain stopped or gone holds no lease any more.
    fn forget_leases(&self, uuid: &str) {
        lock(&self.leases).remove(&uuid.to_ascii_lowercase());
    }

    /// The open connection, (re)opened when absent or dead. Blocking.
    fn connection(uri: &str, slot: &Mutex<Option<Arc<Connect>>>) -> HvResult<Arc<Connect>> {
        let mut slot = lock(slot);
        if let Some(conn) = slot.as_ref()
            && conn.is_alive().unwrap_or(false)
        {
            return Ok(conn.clone());
        }
        let conn = Connect::open(Some(uri)).map_err(|e| {
            let mut err = classify(&format!("connecting to {uri}"), &e);
            // A failed open (daemon down, refused) is worth retrying.
            err.kind = ErrorKind::Transient;
            err
        })?;
        let conn = Arc::new(conn);
        *slot = Some(conn.clone());
        Ok(conn)
    }

    /// Runs `f` on the blocking pool with the connection, bounded by [`CALL_TIMEOUT`].
    async fn call<T, F>(&self, operation: &str, f: F) -> HvResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connect) -> HvResult<T> + Send + 'static,
    {
        self.call_within(CALL_TIMEOUT, operation, f).await
    }

    /// Runs `f` on the domain `uuid` ([`Self::call`]), with `operation` for its errors.
    async fn on_domain<T, F>(&self, uuid: &str, operation: &'static str, f: F) -> HvResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&Domain, &'static str) -> HvResult<T> + Send + 'static,
    {
        let uuid = uuid.to_owned();
        self.call(operation, move |c| {
            f(&lookup_uuid(c, &uuid, operation)?, operation)
        })
        .await
    }

    /// Starts (`on`) or stops the domain `uuid` with `act`, unless it already is in that state
    /// (its leases are forgotten: a stopped guest holds none, a started one none until its DHCP
    /// client gets one).
    async fn power(
        &self,
        uuid: &str,
        operation: &'static str,
        on: bool,
        act: fn(&Domain) -> Result<(), virt::error::Error>,
    ) -> HvResult<()> {
        self.forget_leases(uuid);
        self.on_domain(uuid, operation, move |d, op| {
            // A state that cannot be read counts as the other one: the act is tried.
            if d.is_active().unwrap_or(!on) == on {
                return Ok(());
            }
            act(d).map_err(|e| classify(op, &e))
        })
        .await
    }

    /// [`Self::call`] bounded by `timeout`.
    async fn call_within<T, F>(&self, timeout: Duration, operation: &str, f: F) -> HvResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connect) -> HvResult<T> + Send + 'static,
    {
        let uri = self.uri.clone();
        let slot = self.conn.clone();
        let task = tokio::task::spawn_blocking(move || {
            let conn = Self::connection(&uri, &slot)?;
            f(&conn)
        });
        match tokio::time::timeout(timeout, task).await {
            Err(_) => Err(HvError::new(
                ErrorKind::Transient,
                operation,
                format!("no answer within {}s", timeout.as_secs()),
            )),
            Ok(Err(join)) => Err(HvError::new(ErrorKind::Other, operation, join.to_string())),
            Ok(Ok(out)) => out,
        }
    }
}

fn domain_info(d: &Domain) -> Result<DomainInfo, virt::error::Error> {
    let (state, _) = d.state()?;
    let state = match state {
        Enum::Known(DomainState::Shutoff) => RunState::ShutOff,
        Enum::Known(DomainState::Shutdown) => RunState::ShuttingDown,
        Enum::Known(DomainState::Crashed) => RunState::Crashed,
        _ => RunState::Running,
    };
    let desc = d.xml_desc(virt::sys::VIR_DOMAIN_XML_INACTIVE)?;
    Ok(DomainInfo {
        name: d.name()?,
        uuid: d.uuid_string()?.to_ascii_lowercase(),
        state,
        owner: xml::owner_from_xml(&desc),
        adopted_from: xml::adopted_from_xml(&desc),
        macs: xml::macs_from_xml(&desc),
        sizing: xml::sizing_from_xml(&desc),
    })
}

fn lookup_uuid(conn: &Connect, uuid: &str, op: &str) -> HvResult<Domain> {
    conn.lookup_domain_by_uuid_string(uuid)
        .map_err(|e| classify(op, &e))
}

fn pool(conn: &Connect, name: &str) -> HvResult<StoragePool> {
    conn.lookup_storage_pool_by_name(name)
        .map_err(|e| classify(&format!("storage pool {name}"), &e))
}

fn volume_info(v: &StorageVol) -> Result<VolumeInfo, virt::error::Error> {
    let info = v.info()?;
    let desc = v.xml_desc(0)?;
    Ok(VolumeInfo {
        name: v.name()?,
        path: v.path()?,
        capacity: info.capacity,
        format: xml::volume_format(&desc),
    })
}

fn not_found_is_none<T>(r: HvResult<T>) -> HvResult<Option<T>> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(e) if e.is_not_found() => Ok(None),
        Err(e) => Err(e),
    }
}

impl Hypervisor for VirtHypervisor {
    async fn host_info(&self) -> HvResult<HostInfo> {
        self.call("host info", |c| {
            let v = c.lib_version().map_err(|e| classify("version", &e))?;
            let node = c.node_info().ok();
            Ok(HostInfo {
                version: format!("{}.{}.{}", v / 1_000_000, (v / 1000) % 1000, v % 1000),
                // Placement and capacity only: a driver that cannot tell is not an unreachable
                // host.
                free_memory: c.free_memory().unwrap_or(0),
                cpus: node.as_ref().map(|n| n.cpus),
                memory_mib: node.map(|n| n.memory >> 10),
            })
        })
        .await
    }

    async fn domain_by_uuid(&self, uuid: &str) -> HvResult<Option<DomainInfo>> {
        let uuid = uuid.to_owned();
        self.call("looking up domain", move |c| {
            let op = format!("domain {uuid}");
            not_found_is_none(
                lookup_uuid(c, &uuid, &op).and_then(|d| domain_info(&d).map_err(|e| classify(&op, &e))),
            )
        })
        .await
    }

    async fn domain_by_name(&self, name: &str) -> HvResult<Option<DomainInfo>> {
        let name = name.to_owned();
        self.call("looking up domain", move |c| {
            let op = format!("domain {name}");
            not_found_is_none(
                c.lookup_domain_by_name(&name)
                    .and_then(|d| domain_info(&d))
                    .map_err(|e| classify(&op, &e)),
            )
        })
        .await
    }

    async fn define_domain(&self, xml: &str) -> HvResult<DomainInfo> {
        let xml = xml.to_owned();
        self.call("defining domain", move |c| {
            c.define_domain_xml(&xml)
                .and_then(|d| domain_info(&d))
                .map_err(|e| classify("defining domain", &e))
        })
        .await
    }

    async fn start_domain(&self, uuid: &str) -> HvResult<()> {
        self.power(uuid, "starting domain", true, Domain::create).await
    }

    async fn shutdown_domain(&self, uuid: &str) -> HvResult<()> {
        self.power(uuid, "shutting down domain", false, Domain::shutdown)
            .await
    }

    async fn destroy_domain(&self, uuid: &str) -> HvResult<()> {
        self.power(uuid, "destroying domain", false, Domain::destroy)
            .await
    }

    async fn set_domain_owner(
        &self,
        uuid: &str,
        owner: &xml::Owner,
        adopted_from: Option<&str>,
    ) -> HvResult<()> {
        let element = xml::owner_metadata(owner, adopted_from);
        self.on_domain(uuid, "re-marking domain", move |d, op| {
            let mut flags = virt::sys::VIR_DOMAIN_AFFECT_CONFIG;
            if d.is_active().map_err(|e| classify(op, &e))? {
                flags |= virt::sys::VIR_DOMAIN_AFFECT_LIVE;
            }
            d.set_metadata(
                virt::sys::VIR_DOMAIN_METADATA_ELEMENT as i32,
                Some(&element),
                Some(xml::METADATA_PREFIX),
                Some(xml::METADATA_NS),
                flags,
            )
            .map_err(|e| classify(op, &e))
        })
        .await
    }

    async fn undefine_domain(&self, uuid: &str) -> HvResult<()> {
        self.forget_leases(uuid);
        self.on_domain(uuid, "undefining domain", |d, op| {
            // UEFI domains need the NVRAM flag; the test driver rejects it: retry without.
            match d.undefine_flags(virt::sys::VIR_DOMAIN_UNDEFINE_NVRAM) {
                Ok(()) => Ok(()),
                Err(_) => d.undefine().map_err(|e| classify(op, &e)),
            }
        })
        .await
    }

    async fn domain_addresses(&self, uuid: &str) -> HvResult<Vec<GuestAddress>> {
        if self.test_driver
            && let Some(leases) = lock(&self.leases).get(&uuid.to_ascii_lowercase())
        {
            return Ok(leases.clone());
        }
        self.on_domain(uuid, "reading domain addresses", |d, _| {
            let ifaces = d
                .interface_addresses(virt::sys::VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_LEASE, 0)
                .map_err(|e| classify("reading DHCP leases", &e))?;
            Ok(ifaces
                .into_iter()
                .flat_map(|i| {
                    let mac = i.hwaddr.clone().unwrap_or_default().to_ascii_lowercase();
                    i.addrs.into_iter().map(move |a| GuestAddress {
                        mac: mac.clone(),
                        ip: a.addr,
                    })
                })
                .collect())
        })
        .await
    }

    async fn volume(&self, pool_name: &str, name: &str) -> HvResult<Option<VolumeInfo>> {
        let (pool_name, name) = (pool_name.to_owned(), name.to_owned());
        self.call("looking up volume", move |c| {
            let p = pool(c, &pool_name)?;
            // A volume created by someone else appears only after a refresh of a dir pool.
            let op = format!("volume {pool_name}/{name}");
            let found = match p.lookup_storage_vol_by_name(&name) {
                Ok(v) => Ok(v),
                Err(_) => {
                    let _ = p.refresh(0);
                    p.lookup_storage_vol_by_name(&name)
                }
            };
            not_found_is_none(found.and_then(|v| volume_info(&v)).map_err(|e| classify(&op, &e)))
        })
        .await
    }

    async fn create_volume(&self, pool_name: &str, xml: &str) -> HvResult<VolumeInfo> {
        let (pool_name, xml) = (pool_name.to_owned(), xml.to_owned());
        self.call("creating volume", move |c| {
            let p = pool(c, &pool_name)?;
            StorageVol::create_xml(&p, &xml, 0)
                .and_then(|v| volume_info(&v))
                .map_err(|e| classify(&format!("creating volume in {pool_name}"), &e))
        })
        .await
    }

    async fn upload_volume(&self, pool_name: &str, name: &str, data: Vec<u8>) -> HvResult<()> {
        if self.test_driver {
            lock(&self.uploads).insert((pool_name.to_owned(), name.to_owned()), data);
            return Ok(());
        }
        let (pool_name, name) = (pool_name.to_owned(), name.to_owned());
        self.call("uploading volume", move |c| {
            let op = format!("uploading {pool_name}/{name}");
            let p = pool(c, &pool_name)?;
            let v = p
                .lookup_storage_vol_by_name(&name)
                .map_err(|e| classify(&op, &e))?;
            let stream = Stream::new(c, 0).map_err(|e| classify(&op, &e))?;
            v.upload(&stream, 0, data.len() as u64, 0)
                .map_err(|e| classify(&op, &e))?;
            let mut sent = 0;
            while sent < data.len() {
                let n = stream.send(&data[sent..]).map_err(|e| classify(&op, &e))?;
                if n <= 0 {
                    let _ = stream.abort();
                    return Err(HvError::new(ErrorKind::Transient, op, "stream closed"));
                }
                sent += n as usize;
            }
            stream.finish().map_err(|e| classify(&op, &e))
        })
        .await
    }

    async fn upload_volume_file(
        &self,
        pool_name: &str,
        name: &str,
        path: &std::path::Path,
        length: u64,
    ) -> HvResult<()> {
        if self.test_driver {
            let data = tokio::fs::read(path).await.map_err(|e| {
                HvError::new(
                    ErrorKind::Other,
                    format!("reading {}", path.display()),
                    e.to_string(),
                )
            })?;
            return self.upload_volume(pool_name, name, data).await;
        }
        let (pool_name, name, path) = (pool_name.to_owned(), name.to_owned(), path.to_owned());
        self.call_within(IMAGE_TIMEOUT, "uploading an image", move |c| {
            use std::io::Read;
            let op = format!("uploading {} to {pool_name}/{name}", path.display());
            let local = |e: std::io::Error| HvError::new(ErrorKind::Other, op.clone(), e.to_string());
            let mut file = std::fs::File::open(&path).map_err(local)?;
            let p = pool(c, &pool_name)?;
            let v = p
                .lookup_storage_vol_by_name(&name)
                .map_err(|e| classify(&op, &e))?;
            let stream = Stream::new(c, 0).map_err(|e| classify(&op, &e))?;
            v.upload(&stream, 0, length, 0).map_err(|e| classify(&op, &e))?;
            let mut chunk = vec![0u8; UPLOAD_CHUNK];
            loop {
                let n = match file.read(&mut chunk) {
                    Ok(n) => n,
                    Err(e) => {
                        let _ = stream.abort();
                        return Err(local(e));
                    }
                };
                if n == 0 {
                    break;
                }
                let mut sent = 0;
                while sent < n {
                    let m = stream.send(&chunk[sent..n]).map_err(|e| classify(&op, &e))?;
                    if m <= 0 {
                        let _ = stream.abort();
                        return Err(HvError::new(ErrorKind::Transient, op, "stream closed"));
                    }
                    sent += m as usize;
                }
            }
            stream.finish().map_err(|e| classify(&op, &e))
        })
        .await
    }

    async fn clone_volume(&self, pool_name: &str, xml: &str, from: &str) -> HvResult<VolumeInfo> {
        let (pool_name, xml, from) = (pool_name.to_owned(), xml.to_owned(), from.to_owned());
        let uploads = self.uploads.clone();
        let test_driver = self.test_driver;
        self.call_within(IMAGE_TIMEOUT, "copying a volume", move |c| {
            let op = format!("copying {pool_name}/{from}");
            let p = pool(c, &pool_name)?;
            let source = p
                .lookup_storage_vol_by_name(&from)
                .map_err(|e| classify(&op, &e))?;
            let made = StorageVol::create_xml_from(&p, &xml, &source, 0)
                .and_then(|v| volume_info(&v))
                .map_err(|e| classify(&op, &e))?;
            if test_driver {
                let mut uploads = lock(&uploads);
                if let Some(data) = uploads.get(&(pool_name.clone(), from.clone())).cloned() {
                    uploads.insert((pool_name, made.name.clone()), data);
                }
            }
            Ok(made)
        })
        .await
    }

    async fn delete_volume(&self, pool_name: &str, name: &str) -> HvResult<()> {
        lock(&self.uploads).remove(&(pool_name.to_owned(), name.to_owned()));
        let (pool_name, name) = (pool_name.to_owned(), name.to_owned());
        self.call("deleting volume", move |c| {
            let op = format!("deleting {pool_name}/{name}");
            let p = pool(c, &pool_name)?;
            match p.lookup_storage_vol_by_name(&name) {
                Ok(v) => v.delete(0).map_err(|e| classify(&op, &e)),
                Err(e) => match classify(&op, &e) {
                    e if e.is_not_found() => Ok(()),
                    e => Err(e),
                },
            }
        })
        .await
    }

    async fn cloud_init_result(&self, uuid: &str) -> HvResult<Option<String>> {
        if self.test_driver {
            let reports = lock(&self.cloud_init);
            return Ok(match reports.get(&uuid.to_ascii_lowercase()) {
                Some(reported) => reported.clone(),
                None => Some(TEST_DRIVER_CLOUD_INIT_DONE.to_owned()),
            });
        }
        self.on_domain(uuid, "reading cloud-init's report", |d, _| {
            crate::guest_agent::read_file(d, banlieue_provider_kit::cloud_init::RESULT_FILE)
        })
        .await
    }
}

/// Hands out one [`VirtHypervisor`] per URI (a `test:///default` connection keeps its state
/// only while it stays open, so the handle must be shared).
#[derive(Default, Clone)]
pub struct VirtConnector {
    hosts: Arc<Mutex<HashMap<String, Arc<VirtHypervisor>>>>,
}

impl VirtConnector {
    /// The handle for `uri`.
    pub fn get(&self, uri: &str) -> Arc<VirtHypervisor> {
        lock(&self.hosts)
            .entry(uri.to_owned())
            .or_insert_with(|| Arc::new(VirtHypervisor::new(uri)))
            .clone()
    }
}
