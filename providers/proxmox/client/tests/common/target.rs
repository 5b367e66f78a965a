//! Where contract scenarios run: the simulator (default) or a real PVE (from the environment).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use banlieue_pve_client::{Client, ClientBuilder, RequestRecord, RetryPolicy, TlsVerification};
use banlieue_pve_sim::{SimConfig, SimHandle};

pub const REAL_PVE: &str = "needs a real Proxmox VE: set PROXMOX_URL, PROXMOX_TOKEN_ID, PROXMOX_SECRET \
    (optional: PROXMOX_NODE, PROXMOX_TEMPLATE_VMID, PROXMOX_ISO_STORAGE, PROXMOX_POOL, PROXMOX_FINGERPRINT or PROXMOX_CA_FILE)";

/// A client plus what the scenarios need to know about the target.
pub struct Target {
    pub client: Client,
    pub node: String,
    pub template: u32,
    pub iso_storage: String,
    /// A pool clones may join.
    pub pool: Option<String>,
    /// Every request the client sent.
    pub records: Arc<Mutex<Vec<RequestRecord>>>,
    pub sim: Option<SimHandle>,
    /// How long tasks may take here.
    pub task_deadline: Duration,
}

impl Target {
    pub fn records(&self) -> Vec<RequestRecord> {
        self.records.lock().unwrap().clone()
    }

    /// Attempts seen for `method` on paths ending with `suffix`.
    pub fn attempts(&self, method: &str, suffix: &str) -> usize {
        self.records()
            .iter()
            .filter(|r| r.method.as_str() == method && r.path.ends_with(suffix))
            .count()
    }
}

pub fn recording(builder: ClientBuilder) -> (ClientBuilder, Arc<Mutex<Vec<RequestRecord>>>) {
    let records: Arc<Mutex<Vec<RequestRecord>>> = Arc::default();
    let sink = records.clone();
    (
        builder.on_request(move |r| sink.lock().unwrap().push(r.clone())),
        records,
    )
}

pub fn fast_retry() -> RetryPolicy {
    RetryPolicy {
        max_retries: 3,
        initial_backoff: Duration::from_millis(5),
        max_backoff: Duration::from_millis(40),
    }
}

/// A client builder for a running simulator, pinned to its certificate, token auth.
pub fn sim_builder(sim: &SimHandle) -> ClientBuilder {
    Client::builder(sim.url())
        .token(sim.token_id(), sim.token_secret())
        .tls(TlsVerification::Fingerprint(sim.fingerprint_sha256()))
        .timeout(Duration::from_secs(10))
        .retry(fast_retry())
}

pub async fn sim_target_with(config: SimConfig) -> Target {
    let sim = banlieue_pve_sim::start(config).await.expect("simulator starts");
    let (builder, records) = recording(sim_builder(&sim));
    Target {
        client: builder.build().unwrap(),
        node: "pve1".into(),
        template: 9000,
        iso_storage: "local".into(),
        pool: Some("banlieue".into()),
        records,
        sim: Some(sim),
        task_deadline: Duration::from_secs(20),
    }
}

pub async fn sim_target() -> Target {
    sim_target_with(SimConfig::fast()).await
}

/// The real PVE from the environment, or `None` when it is not configured.
pub fn real_target() -> Option<Target> {
    let url = std::env::var("PROXMOX_URL").ok()?;
    let token_id = std::env::var("PROXMOX_TOKEN_ID").ok()?;
    let secret = std::env::var("PROXMOX_SECRET").ok()?;
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    let tls = if let Some(fp) = env("PROXMOX_FINGERPRINT") {
        TlsVerification::Fingerprint(fp)
    } else if let Some(file) = env("PROXMOX_CA_FILE") {
        TlsVerification::CaBundle(std::fs::read_to_string(file).expect("PROXMOX_CA_FILE is readable"))
    } else if env("PROXMOX_INSECURE").as_deref() == Some("1") {
        TlsVerification::InsecureSkipVerify
    } else {
        TlsVerification::WebPki
    };
    let builder = Client::builder(url)
        .token(token_id, secret)
        .tls(tls)
        .timeout(Duration::from_secs(60));
    let (builder, records) = recording(builder);
    Some(Target {
        client: builder.build().expect("client from PROXMOX_* settings"),
        node: env("PROXMOX_NODE").unwrap_or_else(|| "pve".into()),
        template: env("PROXMOX_TEMPLATE_VMID")
            .map_or(9000, |v| v.parse().expect("PROXMOX_TEMPLATE_VMID is a VMID")),
        iso_storage: env("PROXMOX_ISO_STORAGE").unwrap_or_else(|| "local".into()),
        pool: env("PROXMOX_POOL"),
        records,
        sim: None,
        task_deadline: Duration::from_secs(300),
    })
}
