//! [`TestEnv`]: one control plane (or an existing cluster) for a test binary.

use std::net::{IpAddr, Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};

use crate::binaries::Binaries;
use crate::crds::{FIELD_MANAGER, install_crds};
use crate::error::{Error, Result};
use crate::kubeconfig::{Credential, KubeconfigFile, cluster_entry};
use crate::nodes::NodeNetwork;
use crate::pki::{Ca, ServiceAccountKey};
use crate::process::{ManagedProcess, log_tail};
use crate::workdir::WorkDir;
use kube::config::NamedCluster;

/// Environment variable: target this existing cluster (kubeconfig path) instead of starting one.
pub const EXTERNAL_KUBECONFIG_ENV_VAR: &str = "BANLIEUE_TEST_KUBECONFIG";
/// Environment variable: start-up timeout in seconds (default 180).
pub const START_TIMEOUT_ENV_VAR: &str = "BANLIEUE_TESTENV_START_TIMEOUT";
/// Label put on every namespace created by [`TestEnv::namespace`].
pub const NAMESPACE_LABEL: &str = "banlieue.dev/testenv";

const DEFAULT_START_TIMEOUT: Duration = Duration::from_secs(180);
const CRD_TIMEOUT: Duration = Duration::from_secs(60);
const API_TIMEOUT: Duration = Duration::from_secs(30);
const POLL: Duration = Duration::from_millis(200);
const SERVICE_ACCOUNT_ISSUER: &str = "https://kubernetes.default.svc.cluster.local";
const SERVICE_CLUSTER_IP_RANGE: &str = "10.0.0.0/24";
const SERVICE_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
/// Controllers of kube-controller-manager that a control plane without nodes needs.
const CONTROLLERS: &[&str] = &[
    "garbage-collector-controller",
    "namespace-controller",
    "serviceaccount-controller",
    "serviceaccount-token-controller",
    "clusterrole-aggregation-controller",
    "root-ca-certificate-publisher-controller",
];

/// The controller-manager's controllers when real nodes run: every default one but the cloud
/// provider's and node IPAM (each node's Pod range is set by the harness).
const NODE_CONTROLLERS: &[&str] = &[
    "*",
    "-cloud-node-lifecycle-controller",
    "-service-lb-controller",
    "-node-route-controller",
    "-node-ipam-controller",
];

static KUBECONFIG_SEQ: AtomicU32 = AtomicU32::new(0);

/// Options for [`TestEnv`]; see [`TestEnv::builder`].
#[derive(Clone, Debug)]
pub struct TestEnvBuilder {
    crds: Vec<CustomResourceDefinition>,
    controller_manager: bool,
    start_timeout: Option<Duration>,
    apiserver_args: Vec<String>,
    allow_external: bool,
    existing_cluster: Option<PathBuf>,
    node_network: bool,
}

impl TestEnvBuilder {
    /// Installs this CRD after start (and waits until it is Established).
    #[must_use]
    pub fn crd(mut self, crd: CustomResourceDefinition) -> Self {
        self.crds.push(crd);
        self
    }

    /// Installs these CRDs after start (see [`crate::crds_from_files`] for YAML files).
    #[must_use]
    pub fn crds(mut self, crds: impl IntoIterator<Item = CustomResourceDefinition>) -> Self {
        self.crds.extend(crds);
        self
    }

    /// Whether to run kube-controller-manager (default: yes). Without it, owner references are not
    /// garbage collected and deleted namespaces stay `Terminating`.
    #[must_use]
    pub fn controller_manager(mut self, enabled: bool) -> Self {
        self.controller_manager = enabled;
        self
    }

    /// How long start-up may take (default 180 s, or `BANLIEUE_TESTENV_START_TIMEOUT` seconds).
    #[must_use]
    pub fn start_timeout(mut self, timeout: Duration) -> Self {
        self.start_timeout = Some(timeout);
        self
    }

    /// An extra kube-apiserver flag (e.g. `--feature-gates=…`), appended after the defaults.
    #[must_use]
    pub fn apiserver_arg(mut self, arg: impl Into<String>) -> Self {
        self.apiserver_args.push(arg.into());
        self
    }

    /// Whether `BANLIEUE_TEST_KUBECONFIG` may redirect this environment to an existing cluster
    /// (default: yes). Tests of the harness itself that need the local processes turn it off.
    #[must_use]
    pub fn allow_external(mut self, allow: bool) -> Self {
        self.allow_external = allow;
        self
    }

    /// Whether real nodes can join (default: no): the API server then listens on the host side of a
    /// bridge of its own ([`crate::nodes::NodeNetwork`]) instead of loopback, authorizes nodes
    /// (`Node,RBAC`, NodeRestriction) and reaches kubelets with a client certificate; the
    /// controller-manager runs every default controller (Deployments, ReplicaSets, node
    /// lifecycle…) and a kube-scheduler runs. Add nodes with [`crate::nodes::Node::start`].
    #[must_use]
    pub fn node_network(mut self, enabled: bool) -> Self {
        self.node_network = enabled;
        self
    }

    /// Targets the existing cluster of this kubeconfig (its current context) instead of starting
    /// one, as `BANLIEUE_TEST_KUBECONFIG` does.
    #[must_use]
    pub fn existing_cluster(mut self, kubeconfig: impl Into<PathBuf>) -> Self {
        self.existing_cluster = Some(kubeconfig.into());
        self
    }

    /// Starts the environment: a fresh local control plane, or an existing cluster (see
    /// [`TestEnvBuilder::existing_cluster`] and `BANLIEUE_TEST_KUBECONFIG`).
    pub async fn start(self) -> Result<TestEnv> {
        let began = Instant::now();
        let timeout = match self.start_timeout {
            Some(timeout) => timeout,
            None => start_timeout_from_env()?,
        };
        let from_env = std::env::var_os(EXTERNAL_KUBECONFIG_ENV_VAR)
            .filter(|v| !v.is_empty() && self.allow_external)
            .map(PathBuf::from);
        let env = match self.existing_cluster.clone().or(from_env) {
            Some(path) => TestEnv::connect(path, timeout).await?,
            None => TestEnv::launch(&self, timeout).await?,
        };
        if env.is_external() && !self.crds.is_empty() {
            env.install_crds(&self.crds).await?;
        }
        let elapsed = began.elapsed();
        let env = TestEnv {
            started_in: elapsed,
            ..env
        };
        let what = if env.is_external() {
            "connected to existing cluster"
        } else {
            "control plane ready"
        };
        eprintln!(
            "banlieue-testenv: {what} at {} in {:.2}s",
            env.server,
            elapsed.as_secs_f64()
        );
        tracing::info!(server = %env.server, elapsed_ms = elapsed.as_millis() as u64, "{what}");
        Ok(env)
    }
}

fn start_timeout_from_env() -> Result<Duration> {
    match std::env::var(START_TIMEOUT_ENV_VAR) {
        Ok(value) if !value.is_empty() => {
            value
                .parse::<u64>()
                .map(Duration::from_secs)
                .map_err(|e| Error::BadEnvVar {
                    name: START_TIMEOUT_ENV_VAR,
                    value,
                    message: format!("not a number of seconds: {e}"),
                })
        }
        _ => Ok(DEFAULT_START_TIMEOUT),
    }
}

/// The processes of a control plane this crate started, in stop order.
struct Local {
    ca: Ca,
    /// Runs with a node network only.
    scheduler: Option<Mutex<ManagedProcess>>,
    controller_manager: Option<Mutex<ManagedProcess>>,
    apiserver: Mutex<ManagedProcess>,
    etcd: Mutex<ManagedProcess>,
    /// The bridge real nodes join (dropped after the processes above: fields drop in order).
    node_network: Option<NodeNetwork>,
}

impl Local {
    fn check(&self) -> Result<()> {
        for process in [
            Some(&self.etcd),
            Some(&self.apiserver),
            self.controller_manager.as_ref(),
            self.scheduler.as_ref(),
        ]
        .into_iter()
        .flatten()
        {
            process
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .check_running()?;
        }
        Ok(())
    }
}

/// A Kubernetes API for tests: a private etcd + kube-apiserver (+ kube-controller-manager) on a
/// random loopback address, or an existing cluster when `BANLIEUE_TEST_KUBECONFIG` is set.
///
/// Dropping it kills the processes and removes its scratch directory. A static shared instance
/// ([`TestEnv::shared`]) is never dropped; its processes die with the test binary anyway (they
/// carry a parent-death signal) and its directory is removed by the next environment created.
pub struct TestEnv {
    // Field order is drop order: processes stop before their directory is removed.
    local: Option<Local>,
    admin: KubeconfigFile,
    server: String,
    started_in: Duration,
    workdir: WorkDir,
}

impl std::fmt::Debug for TestEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestEnv")
            .field("server", &self.server)
            .field("external", &self.is_external())
            .field("workdir", &self.workdir.path())
            .finish_non_exhaustive()
    }
}

static SHARED: tokio::sync::OnceCell<std::result::Result<TestEnv, String>> =
    tokio::sync::OnceCell::const_new();

impl TestEnv {
    /// Options for a new environment.
    pub fn builder() -> TestEnvBuilder {
        TestEnvBuilder {
            crds: Vec::new(),
            controller_manager: true,
            start_timeout: None,
            apiserver_args: Vec::new(),
            allow_external: true,
            existing_cluster: None,
            node_network: false,
        }
    }

    /// Starts a new environment with default options (see [`TestEnvBuilder::start`]).
    pub async fn start() -> Result<Self> {
        Self::builder().start().await
    }

    /// The environment shared by all tests of this test binary, started on first use. Give each
    /// test its own namespace ([`TestEnv::namespace`]) and its own client ([`TestEnv::client`]).
    /// If start-up failed, every caller gets that failure (it is not retried).
    pub async fn shared() -> Result<&'static TestEnv> {
        Self::shared_with(|builder| builder).await
    }

    /// Like [`TestEnv::shared`], with options for the start (e.g. CRDs to install before the
    /// controller-manager starts, so that its garbage collector knows them at once). Only the first
    /// call of a test binary starts the environment, so every test of a binary should pass the same
    /// options (call one helper function).
    pub async fn shared_with(
        configure: impl FnOnce(TestEnvBuilder) -> TestEnvBuilder,
    ) -> Result<&'static TestEnv> {
        let result = SHARED
            .get_or_init(|| async {
                configure(Self::builder())
                    .start()
                    .await
                    .map_err(|e| e.to_string())
            })
            .await;
        result.as_ref().map_err(|e| Error::SharedStartFailed(e.clone()))
    }

    async fn connect(path: PathBuf, timeout: Duration) -> Result<Self> {
        let workdir = WorkDir::create()?;
        let cache = workdir.subdir("kubectl-cache")?;
        let admin = KubeconfigFile::load(path, "admin (BANLIEUE_TEST_KUBECONFIG)".into(), cache)?;
        let config = admin.config().await?;
        let server = config.cluster_url.to_string();
        let client = admin.client().await?;
        let deadline = Instant::now() + timeout;
        wait_ready(&client, None, deadline, timeout).await?;
        Ok(Self {
            local: None,
            admin,
            server,
            started_in: Duration::ZERO,
            workdir,
        })
    }

    async fn launch(options: &TestEnvBuilder, timeout: Duration) -> Result<Self> {
        let deadline = Instant::now() + timeout;
        let binaries = Binaries::locate(options.controller_manager)?;
        let workdir = WorkDir::create()?;
        let etcd_ip = random_loopback_ip();
        let node_network = if options.node_network {
            Some(NodeNetwork::create()?)
        } else {
            None
        };
        // Real nodes reach the API server on their bridge; without nodes it stays on loopback,
        // on etcd's address: then its port is picked with etcd's so that all three differ.
        let ip = node_network.as_ref().map_or(etcd_ip, NodeNetwork::gateway);
        let (etcd_port, peer_port, apiserver_port) = if ip == etcd_ip {
            let [client, peer, apiserver] = free_ports(etcd_ip)?;
            (client, peer, apiserver)
        } else {
            let [client, peer] = free_ports(etcd_ip)?;
            (client, peer, free_port(ip)?)
        };
        let server = format!("https://{ip}:{apiserver_port}");

        let ca = Ca::generate()?;
        let serving = ca.issue_serving(
            &[IpAddr::V4(ip), IpAddr::V4(SERVICE_IP)],
            &[
                "localhost",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
            ],
        )?;
        let admin_cert = ca.issue_client("banlieue-testenv-admin", &["system:masters"])?;
        let kcm_cert = ca.issue_client("system:kube-controller-manager", &["system:masters"])?;
        let sa_key = ServiceAccountKey::generate()?;
        let pki = workdir.subdir("pki")?;
        let ca_file = workdir.write("pki/ca.crt", &ca.cert_pem())?;
        let serving_cert = workdir.write("pki/apiserver.crt", &serving.cert_pem)?;
        let serving_key = workdir.write("pki/apiserver.key", &serving.key_pem)?;
        let sa_private = workdir.write("pki/sa.key", &sa_key.private_pem)?;
        let sa_public = workdir.write("pki/sa.pub", &sa_key.public_pem)?;

        let logs = workdir.subdir("logs")?;
        let etcd_data = workdir.path().join("etcd");
        let etcd_url = format!("http://{etcd_ip}:{etcd_port}");
        let peer_url = format!("http://{etcd_ip}:{peer_port}");
        let etcd_args = vec![
            "--name=testenv".to_owned(),
            format!("--data-dir={}", etcd_data.display()),
            format!("--listen-client-urls={etcd_url}"),
            format!("--advertise-client-urls={etcd_url}"),
            format!("--listen-peer-urls={peer_url}"),
            format!("--initial-advertise-peer-urls={peer_url}"),
            format!("--initial-cluster=testenv={peer_url}"),
            "--initial-cluster-state=new".to_owned(),
            // Test data is disposable: skipping fsync makes every write much faster.
            "--unsafe-no-fsync=true".to_owned(),
            "--log-level=warn".to_owned(),
        ];
        let etcd = ManagedProcess::start("etcd", &binaries.etcd, &etcd_args, &logs.join("etcd.log"))?;

        let mut apiserver_args = vec![
            format!("--etcd-servers={etcd_url}"),
            format!("--bind-address={ip}"),
            format!("--advertise-address={ip}"),
            format!("--secure-port={apiserver_port}"),
            format!("--cert-dir={}", pki.display()),
            format!("--tls-cert-file={}", serving_cert.display()),
            format!("--tls-private-key-file={}", serving_key.display()),
            format!("--client-ca-file={}", ca_file.display()),
            format!("--service-account-issuer={SERVICE_ACCOUNT_ISSUER}"),
            format!("--service-account-key-file={}", sa_public.display()),
            format!("--service-account-signing-key-file={}", sa_private.display()),
            format!("--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}"),
            if node_network.is_some() {
                "--authorization-mode=Node,RBAC".to_owned()
            } else {
                "--authorization-mode=RBAC".to_owned()
            },
            // No nodes and a loopback advertise address: keep the `kubernetes` endpoints alone.
            // With real nodes, the `kubernetes` Service leads to the API server (Pods reach it
            // through kube-proxy); without, nothing could use it.
            if node_network.is_some() {
                "--endpoint-reconciler-type=lease".to_owned()
            } else {
                "--endpoint-reconciler-type=none".to_owned()
            },
            "--enable-priority-and-fairness=false".to_owned(),
            "--profiling=false".to_owned(),
            "--allow-privileged=true".to_owned(),
        ];
        if node_network.is_some() {
            let kubelet_client = ca.issue_client("kube-apiserver-kubelet-client", &["system:masters"])?;
            let cert = workdir.write("pki/kubelet-client.crt", &kubelet_client.cert_pem)?;
            let key = workdir.write("pki/kubelet-client.key", &kubelet_client.key_pem)?;
            apiserver_args.extend([
                "--enable-admission-plugins=NodeRestriction".to_owned(),
                format!("--kubelet-client-certificate={}", cert.display()),
                format!("--kubelet-client-key={}", key.display()),
                "--kubelet-preferred-address-types=InternalIP".to_owned(),
                // Webhooks and aggregated APIs served by Pods: the API server runs on the host,
                // where no kube-proxy maps Service addresses, so it calls the Pod's address (its
                // range is routed to the node) instead of the Service's cluster IP.
                "--enable-aggregator-routing=true".to_owned(),
            ]);
        }
        apiserver_args.extend(options.apiserver_args.iter().cloned());
        let apiserver = ManagedProcess::start(
            "kube-apiserver",
            &binaries.kube_apiserver,
            &apiserver_args,
            &logs.join("kube-apiserver.log"),
        )?;

        let cache = workdir.subdir("kubectl-cache")?;
        let cluster = cluster_entry("testenv", &server, &ca.cert_pem())?;
        let admin = KubeconfigFile::write(
            workdir.path().join("admin.kubeconfig"),
            "admin".into(),
            &cluster,
            &Credential::ClientCert(admin_cert),
            None,
            cache.clone(),
        )?;
        let mut local = Local {
            ca,
            scheduler: None,
            controller_manager: None,
            apiserver: Mutex::new(apiserver),
            etcd: Mutex::new(etcd),
            node_network,
        };
        let client = admin.client().await?;
        wait_ready(&client, Some(&local), deadline, timeout).await?;
        let apiserver_ready = Instant::now();
        if !options.crds.is_empty() {
            // Before the controller-manager starts: its garbage collector discovers resource types
            // at start and then only every 30 s, so CRDs installed later are collected late.
            install_crds(&client, &options.crds, CRD_TIMEOUT).await?;
        }

        if let Some(kcm_binary) = &binaries.kube_controller_manager {
            let kcm_kubeconfig = KubeconfigFile::write(
                workdir.path().join("kube-controller-manager.kubeconfig"),
                "kube-controller-manager".into(),
                &cluster,
                &Credential::ClientCert(kcm_cert),
                None,
                cache,
            )?;
            let kcm_args = vec![
                format!("--kubeconfig={}", kcm_kubeconfig.path().display()),
                format!(
                    "--controllers={}",
                    if local.node_network.is_some() {
                        NODE_CONTROLLERS.join(",")
                    } else {
                        CONTROLLERS.join(",")
                    }
                ),
                "--leader-elect=false".to_owned(),
                // No HTTPS endpoint: nothing scrapes it, and it would need another port.
                "--secure-port=0".to_owned(),
                format!("--service-account-private-key-file={}", sa_private.display()),
                format!("--root-ca-file={}", ca_file.display()),
                "--profiling=false".to_owned(),
            ];
            let kcm = ManagedProcess::start(
                "kube-controller-manager",
                kcm_binary,
                &kcm_args,
                &logs.join("kube-controller-manager.log"),
            )?;
            local.controller_manager = Some(Mutex::new(kcm));
            if local.node_network.is_some() {
                local.scheduler = Some(Mutex::new(start_scheduler(&local, &cluster, &workdir, &logs)?));
            }
            wait_controller_manager(&client, &local, deadline, timeout).await?;
            tracing::debug!(
                elapsed_ms = apiserver_ready.elapsed().as_millis() as u64,
                "controller-manager ready"
            );
        }
        Ok(Self {
            local: Some(local),
            admin,
            server,
            started_in: Duration::ZERO,
            workdir,
        })
    }

    /// The network real nodes join, when started with [`TestEnvBuilder::node_network`].
    pub fn node_network(&self) -> Option<&NodeNetwork> {
        self.local.as_ref()?.node_network.as_ref()
    }

    /// Whether this environment targets an existing cluster (`BANLIEUE_TEST_KUBECONFIG`).
    pub fn is_external(&self) -> bool {
        self.local.is_none()
    }

    /// The API server URL.
    pub fn server(&self) -> &str {
        &self.server
    }

    /// How long start-up took (processes, readiness, CRDs).
    pub fn started_in(&self) -> Duration {
        self.started_in
    }

    /// The scratch directory (kubeconfigs, certificates, etcd data, `logs/`).
    pub fn workdir(&self) -> &Path {
        self.workdir.path()
    }

    /// The log file of a component this crate started (`etcd`, `kube-apiserver`,
    /// `kube-controller-manager`), if any.
    pub fn log_file(&self, component: &str) -> Option<PathBuf> {
        let local = self.local.as_ref()?;
        let process = match component {
            "etcd" => &local.etcd,
            "kube-apiserver" => &local.apiserver,
            "kube-controller-manager" => local.controller_manager.as_ref()?,
            _ => return None,
        };
        Some(
            process
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .log()
                .to_owned(),
        )
    }

    /// The last `lines` lines of a component's log (empty if there is no such log).
    pub fn log_tail(&self, component: &str, lines: usize) -> String {
        self.log_file(component)
            .map(|path| log_tail(&path, lines))
            .unwrap_or_default()
    }

    /// The process ids of the components this crate started, by component name.
    pub fn process_ids(&self) -> Vec<(&'static str, u32)> {
        let Some(local) = self.local.as_ref() else {
            return Vec::new();
        };
        let mut ids = vec![("etcd", &local.etcd), ("kube-apiserver", &local.apiserver)];
        if let Some(kcm) = &local.controller_manager {
            ids.push(("kube-controller-manager", kcm));
        }
        ids.into_iter()
            .map(|(name, p)| {
                (
                    name,
                    p.lock().unwrap_or_else(std::sync::PoisonError::into_inner).id(),
                )
            })
            .collect()
    }

    /// Fails if a control-plane process has exited (with the end of its log).
    pub fn check_processes(&self) -> Result<()> {
        self.local.as_ref().map_or(Ok(()), Local::check)
    }

    /// The cluster-admin kubeconfig.
    pub fn admin(&self) -> &KubeconfigFile {
        &self.admin
    }

    /// A new cluster-admin client, bound to the calling tokio runtime.
    pub async fn client(&self) -> Result<kube::Client> {
        self.admin.client().await
    }

    /// A cluster-admin `kubectl` command (see [`KubeconfigFile::kubectl`]).
    pub fn kubectl(&self) -> std::process::Command {
        self.admin.kubectl()
    }

    /// Creates a namespace named `<prefix>-<random suffix>` (labelled [`NAMESPACE_LABEL`]) and
    /// returns its name. Against an existing cluster it is deleted when the returned value drops.
    pub async fn namespace(&self, prefix: &str) -> Result<TestNamespace> {
        let client = self.client().await?;
        let api: Api<Namespace> = Api::all(client);
        let namespace = Namespace {
            metadata: ObjectMeta {
                generate_name: Some(format!("{prefix}-")),
                labels: Some([(NAMESPACE_LABEL.to_owned(), "true".to_owned())].into()),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        };
        let action = format!("creating namespace with prefix {prefix:?}");
        let created = with_timeout(&action, api.create(&PostParams::default(), &namespace)).await?;
        let name = created.metadata.name.ok_or_else(|| Error::Manifest {
            what: action,
            message: "the server returned a namespace without a name".into(),
        })?;
        let cleanup = self.is_external().then(|| self.admin.clone());
        Ok(TestNamespace { name, cleanup })
    }

    /// Installs CRDs (server-side apply, idempotent) and waits until they are Established.
    ///
    /// The controller-manager's garbage collector learns about new resource types only every 30 s:
    /// for prompt owner-reference cascades of custom resources, install their CRDs at start
    /// ([`TestEnvBuilder::crds`], [`TestEnv::shared_with`]).
    pub async fn install_crds(&self, crds: &[CustomResourceDefinition]) -> Result<()> {
        install_crds(&self.client().await?, crds, CRD_TIMEOUT).await
    }

    /// Creates `ValidatingAdmissionPolicy` and `ValidatingAdmissionPolicyBinding` objects
    /// (e.g. `banlieue_api::policies::all()`); ones that exist already are replaced. The
    /// apiserver starts enforcing a policy a moment after its creation.
    pub async fn install_admission_policies(&self, docs: &[serde_json::Value]) -> Result<()> {
        let client = self.client().await?;
        for doc in docs {
            let kind = doc["kind"].as_str().unwrap_or_default();
            let plural = match kind {
                "ValidatingAdmissionPolicy" => "validatingadmissionpolicies",
                "ValidatingAdmissionPolicyBinding" => "validatingadmissionpolicybindings",
                other => {
                    return Err(Error::Manifest {
                        what: format!("admission policy document of kind {other:?}"),
                        message: "only ValidatingAdmissionPolicy and its binding are installed here"
                            .to_owned(),
                    });
                }
            };
            let gvk = kube::api::GroupVersionKind::gvk("admissionregistration.k8s.io", "v1", kind);
            let api: Api<kube::api::DynamicObject> = Api::all_with(
                client.clone(),
                &kube::api::ApiResource::from_gvk_with_plural(&gvk, plural),
            );
            let object: kube::api::DynamicObject =
                serde_json::from_value(doc.clone()).map_err(|e| Error::Manifest {
                    what: format!("{kind} {}", doc["metadata"]["name"]),
                    message: e.to_string(),
                })?;
            let name = object.metadata.name.clone().unwrap_or_default();
            let created = match api.create(&Default::default(), &object).await {
                // One that exists (e.g. of an older build) is replaced by this one.
                Err(kube::Error::Api(status)) if status.code == 409 => match api.get(&name).await {
                    Ok(existing) => {
                        let mut object = object.clone();
                        object.metadata.resource_version = existing.metadata.resource_version;
                        api.replace(&name, &Default::default(), &object).await
                    }
                    Err(e) => Err(e),
                },
                other => other,
            };
            created.map_err(|source| Error::Kube {
                action: format!("creating {kind} {name}"),
                source,
            })?;
        }
        Ok(())
    }

    /// Installs the CRDs of YAML files (see [`crate::crds_from_files`]).
    pub async fn install_crd_files<P: AsRef<Path>>(&self, paths: impl IntoIterator<Item = P>) -> Result<()> {
        self.install_crds(&crate::crds::crds_from_files(paths)?).await
    }

    /// The cluster CA certificate (PEM) of a control plane this crate started.
    pub fn ca_pem(&self) -> Result<String> {
        let local = self.local.as_ref().ok_or(Error::Unsupported {
            operation: "reading the cluster CA",
        })?;
        Ok(local.ca.cert_pem())
    }

    /// The cluster CA's private key (PKCS#8 PEM), for a test that hands the CA to something that
    /// issues certificates itself (e.g. Cluster API's `<cluster>-ca` Secret).
    pub fn ca_key_pem(&self) -> Result<String> {
        let local = self.local.as_ref().ok_or(Error::Unsupported {
            operation: "reading the cluster CA key",
        })?;
        Ok(local.ca.key_pem())
    }

    /// Issues a TLS serving certificate signed by the cluster CA (e.g. for a webhook server a test
    /// runs), valid for the given addresses and DNS names. See [`TestEnv::ca_pem`].
    pub fn serving_certificate(&self, ips: &[IpAddr], dns_names: &[&str]) -> Result<crate::CertAndKey> {
        let local = self.local.as_ref().ok_or(Error::Unsupported {
            operation: "issuing a certificate",
        })?;
        local.ca.issue_serving(ips, dns_names)
    }

    /// Mints a kubeconfig for a user authenticated by a client certificate signed by this control
    /// plane's CA: Kubernetes sees user `user` in `groups`, with no permissions until a test binds
    /// a role. Not possible against an existing cluster ([`Error::Unsupported`]).
    pub fn user_kubeconfig(&self, user: &str, groups: &[&str]) -> Result<KubeconfigFile> {
        let local = self.local.as_ref().ok_or(Error::Unsupported {
            operation: "minting a client certificate",
        })?;
        let pair = local.ca.issue_client(user, groups)?;
        self.write_kubeconfig(&format!("user {user}"), &Credential::ClientCert(pair), None)
    }

    /// Mints a kubeconfig for ServiceAccount `namespace/name` (created if missing) holding a
    /// one-hour token from the TokenRequest API. Its default namespace is `namespace`.
    pub async fn service_account_kubeconfig(&self, namespace: &str, name: &str) -> Result<KubeconfigFile> {
        let client = self.client().await?;
        let api: Api<ServiceAccount> = Api::namespaced(client, namespace);
        let account = ServiceAccount {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                ..ObjectMeta::default()
            },
            ..ServiceAccount::default()
        };
        let what = format!("serviceaccount {namespace}/{name}");
        with_timeout(
            &format!("applying {what}"),
            api.patch(name, &PatchParams::apply(FIELD_MANAGER), &Patch::Apply(&account)),
        )
        .await?;
        let request = TokenRequest {
            spec: Some(TokenRequestSpec {
                expiration_seconds: Some(3600),
                ..TokenRequestSpec::default()
            }),
            ..TokenRequest::default()
        };
        let response: TokenRequest = with_timeout(
            &format!("requesting a token for {what}"),
            api.create_subresource("token", name, &PostParams::default(), &request),
        )
        .await?;
        let token = response.status.and_then(|s| s.token).unwrap_or_default();
        if token.is_empty() {
            return Err(Error::Manifest {
                what: format!("TokenRequest for {what}"),
                message: "the server returned no token".into(),
            });
        }
        self.write_kubeconfig(&what, &Credential::Token(token), Some(namespace))
    }

    fn write_kubeconfig(
        &self,
        identity: &str,
        credential: &Credential,
        namespace: Option<&str>,
    ) -> Result<KubeconfigFile> {
        let cluster = self.admin.current_cluster()?;
        let dir = self.workdir.subdir("kubeconfigs")?;
        let seq = KUBECONFIG_SEQ.fetch_add(1, Ordering::Relaxed);
        let file: String = identity
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect();
        let path = dir.join(format!("{seq:04}-{file}.kubeconfig"));
        let cache = self.workdir.subdir("kubectl-cache")?;
        KubeconfigFile::write(path, identity.to_owned(), &cluster, credential, namespace, cache)
    }
}

/// A namespace created for one test.
#[derive(Debug)]
pub struct TestNamespace {
    name: String,
    /// Set against an existing cluster: delete the namespace on drop.
    cleanup: Option<KubeconfigFile>,
}

impl TestNamespace {
    /// The namespace's name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl std::ops::Deref for TestNamespace {
    type Target = str;

    fn deref(&self) -> &str {
        &self.name
    }
}

impl std::fmt::Display for TestNamespace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name)
    }
}

impl Drop for TestNamespace {
    fn drop(&mut self) {
        let Some(admin) = self.cleanup.take() else {
            return;
        };
        // Drop cannot await, and the test's runtime may be shutting down: delete from a thread
        // with its own runtime, waiting a bounded time for it.
        let name = self.name.clone();
        let (done, wait) = std::sync::mpsc::channel();
        let spawned = std::thread::Builder::new()
            .name("banlieue-testenv-ns-cleanup".into())
            .spawn(move || {
                let result = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map(|rt| {
                        rt.block_on(async {
                            let client = admin.client().await.ok()?;
                            let api: Api<Namespace> = Api::all(client);
                            tokio::time::timeout(API_TIMEOUT, api.delete(&name, &DeleteParams::background()))
                                .await
                                .ok()
                        })
                    });
                let _ = done.send(result.is_ok());
            });
        if spawned.is_ok() && wait.recv_timeout(API_TIMEOUT + Duration::from_secs(5)).is_err() {
            tracing::warn!(namespace = %self.name, "namespace clean-up did not finish in time");
        }
    }
}

async fn with_timeout<T>(
    action: &str,
    future: impl std::future::Future<Output = std::result::Result<T, kube::Error>>,
) -> Result<T> {
    tokio::time::timeout(API_TIMEOUT, future)
        .await
        .map_err(|_| Error::Timeout {
            what: action.to_owned(),
            timeout: API_TIMEOUT,
            detail: String::new(),
        })?
        .map_err(|e| Error::kube(action.to_owned(), e))
}

/// Polls `/readyz` until it answers `ok`, failing early if a local process exits.
async fn wait_ready(
    client: &kube::Client,
    local: Option<&Local>,
    deadline: Instant,
    timeout: Duration,
) -> Result<()> {
    let mut last;
    loop {
        if let Some(local) = local {
            local.check()?;
        }
        let request = http::Request::get("/readyz")
            .body(Vec::new())
            .map_err(|e| Error::Manifest {
                what: "/readyz request".into(),
                message: e.to_string(),
            })?;
        match tokio::time::timeout(Duration::from_secs(5), client.request_text(request)).await {
            Ok(Ok(body)) if body.trim() == "ok" => return Ok(()),
            Ok(Ok(body)) => last = body,
            Ok(Err(e)) => last = e.to_string(),
            Err(_) => last = "request timed out".into(),
        }
        if Instant::now() >= deadline {
            let tail = local.map(|l| {
                let apiserver = l
                    .apiserver
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                format!(
                    "\nlast lines of {}:\n{}",
                    apiserver.log().display(),
                    log_tail(apiserver.log(), 30)
                )
            });
            return Err(Error::Timeout {
                what: "kube-apiserver /readyz".into(),
                timeout,
                detail: format!("; last answer: {last}{}", tail.unwrap_or_default()),
            });
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Waits until the controller-manager's controllers act: the serviceaccount controller creates the
/// `default` ServiceAccount of namespace `default`.
async fn wait_controller_manager(
    client: &kube::Client,
    local: &Local,
    deadline: Instant,
    timeout: Duration,
) -> Result<()> {
    let api: Api<ServiceAccount> = Api::namespaced(client.clone(), "default");
    let mut last;
    loop {
        local.check()?;
        match tokio::time::timeout(Duration::from_secs(5), api.get_opt("default")).await {
            Ok(Ok(Some(_))) => return Ok(()),
            Ok(Ok(None)) => last = "serviceaccount default/default not created yet".into(),
            Ok(Err(e)) => last = e.to_string(),
            Err(_) => last = "request timed out".into(),
        }
        if Instant::now() >= deadline {
            let tail = local.controller_manager.as_ref().map(|kcm| {
                let kcm = kcm.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                format!(
                    "\nlast lines of {}:\n{}",
                    kcm.log().display(),
                    log_tail(kcm.log(), 30)
                )
            });
            return Err(Error::Timeout {
                what: "kube-controller-manager (default ServiceAccount)".into(),
                timeout,
                detail: format!("; {last}{}", tail.unwrap_or_default()),
            });
        }
        tokio::time::sleep(POLL).await;
    }
}

/// A random address in 127.0.0.0/8 (all of it routes to `lo` on Linux): parallel test binaries
/// then practically never compete for the same address and port.
/// Starts kube-scheduler as `system:kube-scheduler` (its default RBAC), without an HTTPS port.
fn start_scheduler(
    local: &Local,
    cluster: &NamedCluster,
    workdir: &WorkDir,
    logs: &Path,
) -> Result<ManagedProcess> {
    let binary = crate::bin_dir().join("kube-scheduler");
    if !binary.is_file() {
        return Err(Error::MissingBinary {
            name: "kube-scheduler".to_owned(),
            path: binary,
        });
    }
    let cert = local.ca.issue_client("system:kube-scheduler", &[])?;
    let kubeconfig = KubeconfigFile::write(
        workdir.path().join("kube-scheduler.kubeconfig"),
        "kube-scheduler".into(),
        cluster,
        &Credential::ClientCert(cert),
        None,
        workdir.subdir("kubectl-cache")?,
    )?;
    let path = kubeconfig.path().display().to_string();
    ManagedProcess::start(
        "kube-scheduler",
        &binary,
        &[
            format!("--kubeconfig={path}"),
            format!("--authentication-kubeconfig={path}"),
            format!("--authorization-kubeconfig={path}"),
            "--leader-elect=false".to_owned(),
            "--secure-port=0".to_owned(),
        ],
        &logs.join("kube-scheduler.log"),
    )
}

fn random_loopback_ip() -> Ipv4Addr {
    let [a, b, c]: [u8; 3] = rand::random();
    Ipv4Addr::new(127, a.clamp(1, 254), b, c.clamp(2, 254))
}

/// A TCP port that was free on `ip` a moment ago (the kernel picks it), for helper processes a
/// test starts. Prefer a random loopback address of your own over 127.0.0.1 where the helper allows.
pub fn free_port(ip: Ipv4Addr) -> Result<u16> {
    let listener =
        TcpListener::bind((ip, 0)).map_err(|e| Error::io("binding a free port on", ip.to_string(), e))?;
    let port = listener
        .local_addr()
        .map_err(|e| Error::io("reading the bound port of", ip.to_string(), e))?
        .port();
    Ok(port)
}

/// `N` distinct TCP ports that were free on `ip` a moment ago. The listeners are held until all
/// are chosen: one after the other, [`free_port`] could be handed the same port twice (a CI run
/// saw etcd fail with "address already in use" on its own client and peer ports).
pub fn free_ports<const N: usize>(ip: Ipv4Addr) -> Result<[u16; N]> {
    let mut listeners = Vec::with_capacity(N);
    let mut ports = [0u16; N];
    for port in &mut ports {
        let listener =
            TcpListener::bind((ip, 0)).map_err(|e| Error::io("binding a free port on", ip.to_string(), e))?;
        *port = listener
            .local_addr()
            .map_err(|e| Error::io("reading the bound port of", ip.to_string(), e))?
            .port();
        listeners.push(listener);
    }
    Ok(ports)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_picked_together_are_distinct() {
        for _ in 0..50 {
            let [a, b, c] = free_ports(random_loopback_ip()).unwrap();
            assert!(a != b && b != c && a != c, "{a} {b} {c}");
        }
    }

    #[test]
    fn loopback_addresses_are_loopback_and_bindable() {
        for _ in 0..20 {
            let ip = random_loopback_ip();
            assert!(
                ip.is_loopback() && ip.octets()[3] >= 2 && ip.octets()[3] <= 254,
                "{ip}"
            );
        }
        let ip = random_loopback_ip();
        let a = free_port(ip).unwrap();
        assert_ne!(a, 0);
        TcpListener::bind((ip, a)).expect("port reported free is bindable");
    }
}
