//! A Proxmox VE API simulator speaking the real wire protocol, held to the official schema.
//!
//! [`start`] binds an HTTPS server on `127.0.0.1` with a generated CA and node certificate and
//! serves `/api2/json` like a PVE 9.1 cluster: API-token and ticket + CSRF authentication with
//! the real 401 behaviour, every request checked against `pve-api-schema-9.1.json` (501 for
//! unknown paths, `400 Parameter verification failed.` with the `errors` map), Perl-typed
//! responses, asynchronous tasks with UPIDs, the `lock: clone` window, seed-ISO uploads that tests
//! can read back, guest-agent addresses after a delay, and seeded fault injection.
//!
//! ```no_run
//! # async fn demo() -> Result<(), banlieue_pve_sim::SimError> {
//! let sim = banlieue_pve_sim::start(banlieue_pve_sim::SimConfig::fast()).await?;
//! println!("{} token {}", sim.url(), sim.token_id());
//! sim.shutdown().await;
//! # Ok(()) }
//! ```

pub mod acl;
pub mod config;
pub mod faults;
pub mod iso;
pub mod probe;
pub mod schema;
mod server;
pub mod state;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use sha2::{Digest, Sha256};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub use config::{SimConfig, StorageSpec, TemplateSpec};
pub use faults::{FaultEffect, FaultError, FaultInjector, FaultRule, PathMatch, Trigger};
pub use state::{GuestInterface, SeedData, TaskInfo, VmInfo};

use server::Shared;

/// Errors starting the simulator.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// The configuration is inconsistent.
    #[error("invalid simulator configuration: {0}")]
    Config(String),
    /// The API schema could not be loaded.
    #[error("loading the PVE API schema")]
    Schema(#[source] Arc<schema::SchemaError>),
    /// Certificate generation failed.
    #[error("generating the TLS certificate")]
    Certificate(#[source] rcgen::Error),
    /// The TLS configuration was rejected.
    #[error("configuring TLS")]
    Tls(#[source] rustls::Error),
    /// Binding the listening socket failed.
    #[error("binding port {port}")]
    Bind {
        /// The requested port.
        port: u16,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

/// Time allowed for a TLS handshake before the connection is closed.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// A running simulator.
pub struct SimHandle {
    shared: Arc<Shared>,
    addr: SocketAddr,
    ca_pem: String,
    fingerprint: String,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl std::fmt::Debug for SimHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimHandle")
            .field("addr", &self.addr)
            .field("fingerprint", &self.fingerprint)
            .finish()
    }
}

/// Starts the simulator on `{config.bind_address}:{config.port}` (HTTPS; loopback by default).
pub async fn start(config: SimConfig) -> Result<SimHandle, SimError> {
    config.validate().map_err(SimError::Config)?;
    let schema = match &config.schema_path {
        Some(p) => Arc::new(schema::ApiSchema::load(p).map_err(|e| SimError::Schema(Arc::new(e)))?),
        None => schema::shared_default().map_err(SimError::Schema)?,
    };
    let certs = make_certificates(
        &config.nodes.first().cloned().unwrap_or_else(|| "pve1".into()),
        config.bind_address,
    )?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut tls = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(SimError::Tls)?
        .with_no_client_auth()
        .with_single_cert(
            vec![certs.leaf_der.clone(), certs.ca_der],
            PrivateKeyDer::Pkcs8(certs.leaf_key),
        )
        .map_err(SimError::Tls)?;
    tls.alpn_protocols = vec![b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
    let port = config.port;
    let listener = TcpListener::bind((config.bind_address, port))
        .await
        .map_err(|source| SimError::Bind { port, source })?;
    let addr = listener
        .local_addr()
        .map_err(|source| SimError::Bind { port, source })?;
    let fingerprint = fingerprint(&certs.leaf_der);
    let shared = Arc::new(Shared::new(Arc::new(config), schema, fingerprint.clone()));
    let (stop, mut stopped) = watch::channel(false);
    let serving = shared.clone();
    let task = tokio::spawn(async move {
        let mut conns = tokio::task::JoinSet::new();
        loop {
            while conns.try_join_next().is_some() {}
            let accepted = tokio::select! {
                _ = stopped.changed() => break,
                a = listener.accept() => a,
            };
            let Ok((tcp, _)) = accepted else { continue };
            let _ = tcp.set_nodelay(true);
            let acceptor = acceptor.clone();
            let shared = serving.clone();
            conns.spawn(async move {
                let Ok(Ok(tls)) = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await else {
                    return;
                };
                let service = service_fn(move |req| server::serve(shared.clone(), req));
                let _ = hyper::server::conn::http1::Builder::new()
                    .keep_alive(true)
                    .serve_connection(TokioIo::new(tls), service)
                    .await;
            });
        }
        conns.abort_all();
    });
    Ok(SimHandle {
        shared,
        addr,
        ca_pem: certs.ca_pem,
        fingerprint,
        stop,
        task,
    })
}

struct Certs {
    ca_der: CertificateDer<'static>,
    ca_pem: String,
    leaf_der: CertificateDer<'static>,
    leaf_key: PrivatePkcs8KeyDer<'static>,
}

/// A cluster CA (like `pve-root-ca.pem`) and a node certificate signed by it (like `pve-ssl.pem`).
fn make_certificates(node: &str, address: std::net::Ipv4Addr) -> Result<Certs, SimError> {
    let ca_key = KeyPair::generate().map_err(SimError::Certificate)?;
    let mut ca = CertificateParams::new(Vec::<String>::new()).map_err(SimError::Certificate)?;
    ca.distinguished_name
        .push(DnType::CommonName, "Proxmox Virtual Environment");
    ca.distinguished_name
        .push(DnType::OrganizationalUnitName, "banlieue pve-sim");
    ca.distinguished_name
        .push(DnType::OrganizationName, "PVE Cluster Manager CA");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_cert = ca.self_signed(&ca_key).map_err(SimError::Certificate)?;
    let issuer = Issuer::new(ca, ca_key);
    let leaf_key = KeyPair::generate().map_err(SimError::Certificate)?;
    let mut names = vec!["localhost".to_owned(), "127.0.0.1".to_owned(), node.to_owned()];
    if !address.is_loopback() {
        names.push(address.to_string());
    }
    let mut leaf = CertificateParams::new(names).map_err(SimError::Certificate)?;
    leaf.distinguished_name
        .push(DnType::CommonName, format!("{node}.banlieue.invalid"));
    leaf.distinguished_name
        .push(DnType::OrganizationName, "PVE Cluster Node");
    leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let leaf_cert = leaf
        .signed_by(&leaf_key, &issuer)
        .map_err(SimError::Certificate)?;
    Ok(Certs {
        ca_der: ca_cert.der().clone(),
        ca_pem: ca_cert.pem(),
        leaf_der: leaf_cert.der().clone(),
        leaf_key: PrivatePkcs8KeyDer::from(leaf_key.serialize_der()),
    })
}

/// `AB:CD:…` (upper case, colon-separated) SHA-256 of a DER certificate, as PVE shows it.
pub fn fingerprint(der: &[u8]) -> String {
    Sha256::digest(der)
        .iter()
        .map(|b| format!("{b:02X}"))
        .collect::<Vec<_>>()
        .join(":")
}

impl SimHandle {
    /// `https://127.0.0.1:PORT` (clients append `/api2/json`).
    pub fn url(&self) -> String {
        format!("https://{}", self.addr)
    }
    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
    /// PEM of the cluster CA that signed the serving certificate (use as CA bundle).
    pub fn ca_pem(&self) -> String {
        self.ca_pem.clone()
    }
    /// SHA-256 fingerprint of the serving (node) certificate, `AB:CD:…`.
    pub fn fingerprint_sha256(&self) -> String {
        self.fingerprint.clone()
    }
    /// The API token id, `root@pam!banlieue`.
    pub fn token_id(&self) -> String {
        self.shared.token_id.clone()
    }
    /// The API token secret (a uuid).
    pub fn token_secret(&self) -> String {
        self.shared.token_secret.clone()
    }
    /// The `Authorization` header value for the token.
    pub fn token_header(&self) -> String {
        format!(
            "PVEAPIToken={}={}",
            self.shared.token_id, self.shared.token_secret
        )
    }
    /// The ticket login user, `root@pam`.
    pub fn username(&self) -> String {
        self.shared.cfg.username.clone()
    }
    /// The ticket login password.
    pub fn password(&self) -> String {
        self.shared.password.clone()
    }
    /// The fault injector (cloneable).
    pub fn faults(&self) -> FaultInjector {
        self.shared.faults.clone()
    }
    /// The configuration the simulator runs with.
    pub fn config(&self) -> &SimConfig {
        &self.shared.cfg
    }
    /// The loaded API schema.
    pub fn schema(&self) -> Arc<schema::ApiSchema> {
        self.shared.schema.clone()
    }
    /// All VMs (after finishing due tasks).
    pub fn vms(&self) -> Vec<VmInfo> {
        self.shared.state().vm_infos()
    }
    /// When each running VM's guest agent started answering (its start plus
    /// [`SimConfig::agent_delay`]), by VM name: what a client's "guest up → Ready" latency is
    /// measured from.
    pub fn agents_answering_since(&self) -> Vec<(String, std::time::Instant)> {
        self.shared.state().agents_answering_since()
    }
    /// Every volume on the nodes' storages (seed ISOs, uploads): `(node, storage, volume id)`.
    pub fn volumes(&self) -> Vec<(String, String, String)> {
        self.shared.state().volume_ids()
    }
    /// One VM.
    pub fn vm(&self, vmid: u32) -> Option<VmInfo> {
        self.vms().into_iter().find(|v| v.vmid == vmid)
    }
    /// All known tasks (finished ones up to `max_finished_tasks`).
    pub fn tasks(&self) -> Vec<TaskInfo> {
        self.shared.state().task_infos()
    }
    /// The decoded seed ISO the VM booted with (captured at start), or else the one attached now.
    pub fn seed(&self, vmid: u32) -> Option<SeedData> {
        self.shared.state().seed(vmid)
    }
    /// What the real guest of running VM `vmid` has, as its guest agent would report it
    /// ([`SimConfig::external_guests`]): from now on `agent/network-get-interfaces` answers with
    /// these interfaces, until the VM stops or reboots. Fails when the VM does not run.
    pub fn report_guest_interfaces(&self, vmid: u32, interfaces: Vec<GuestInterface>) -> Result<(), String> {
        self.shared.state().report_guest_interfaces(vmid, interfaces)
    }
    /// A file of the real guest of running VM `vmid` ([`SimConfig::external_guests`]), as its
    /// agent's `file-read` would return it (e.g. cloud-init's `/run/cloud-init/result.json`),
    /// until the VM stops or reboots. Fails when the VM does not run.
    pub fn report_guest_file(&self, vmid: u32, path: &str, content: String) -> Result<(), String> {
        self.shared.state().report_guest_file(vmid, path, content)
    }
    /// The API calls answered so far, counted by `METHOD /schema/{path}` (e.g.
    /// `POST /nodes/{node}/qemu/{vmid}/clone`): what a client costs.
    pub fn calls(&self) -> std::collections::BTreeMap<String, u64> {
        server::lock(&self.shared.calls).clone()
    }
    /// The API token loses its privileges on VM `vmid`: listings leave it out silently (as
    /// `/cluster/resources` does for what the token lacks VM.Audit on) and calls on it answer
    /// `403 Permission check failed (/vms/<vmid>, VM.Audit)`.
    pub fn hide_from_token(&self, vmid: u32) {
        self.shared.state().hide(vmid);
    }
    /// From now on the API token has exactly the privileges `acl` grants (`None`: root's, the
    /// default): the schema's permission checks, the checks PVE's handlers make in code and the
    /// listings that leave out what the token may not see (see [`acl`]).
    pub fn set_acl(&self, acl: Option<acl::Acl>) {
        self.shared.state().set_acl(acl);
    }
    /// pvestatd restarts (as after a node boot): for `resources_lag`, `/cluster/resources` lists
    /// every guest with status `unknown` and without name, template flag or memory.
    pub fn restart_pvestatd(&self) {
        self.shared.state().restart_pvestatd();
    }
    /// The most API requests served at once so far.
    pub fn peak_in_flight(&self) -> usize {
        self.shared.in_flight.1.load(std::sync::atomic::Ordering::SeqCst)
    }
    /// Forgets the counted calls.
    pub fn reset_calls(&self) {
        server::lock(&self.shared.calls).clear();
    }
    /// Responses so far that did not match the declared `returns` (`METHOD /path: problem`).
    /// Empty unless the simulator has a bug; contract tests can assert on it.
    pub fn returns_violations(&self) -> Vec<String> {
        server::lock(&self.shared.violations).clone()
    }
    /// Stops accepting connections, closes open ones and waits for the server task.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}
