//! Real Kubernetes nodes for the harness: containerd, runc, the CNI plugins (Debian packages) and
//! the kubelet built from the pinned `k8s.io/kubernetes` module, each node in its own network,
//! mount, UTS and PID namespaces, so Pods are scheduled, started, probed, restarted and logged as
//! on any cluster (`kubectl logs/exec` work).
//!
//! A control plane started with [`crate::TestEnvBuilder::node_network`] owns a [`NodeNetwork`]:
//! a host bridge with its own /24 (`10.201.<k>.0/24`, the API server listens on `.1`), a
//! kube-scheduler, the controller-manager's Pod controllers and Node authorization.
//! [`Node::start`] adds one node: a veth into its network namespace (`10.201.<k>.<10+i>`), its
//! Pod range `10.<202+i>.<k>.0/24` routed from the host, a cgroup `/banlieue-<k>-<i>` in every
//! v1 hierarchy, and `node/boot.sh` as PID 1 of its namespaces (containerd, the images of
//! `node/images.sh`, kube-proxy, kubelet). Everything is removed on drop; what a killed run left behind is
//! removed by the next [`NodeNetwork::create`] (each network records its owner's PID and what it
//! created under [`STATE_DIR`]).

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node as NodeObject;
use kube::Api;

use crate::setup::setup_output;
use crate::{Error, ManagedProcess, Result, TestEnv, bin_dir};

/// Where each node network records its owner PID and what it created.
pub const STATE_DIR: &str = "/run/banlieue-testenv-nodes";

/// The cgroup v1 hierarchies a node gets a cgroup in (see `node/boot.sh`).
const CGROUP_HIERARCHIES: [&str; 9] = [
    "cpu", "cpuacct", "cpuset", "memory", "devices", "freezer", "blkio", "pids", "systemd",
];

/// How long a node gets to register and become Ready.
const READY_TIMEOUT: Duration = Duration::from_secs(120);

/// Programs a node needs, with the Debian package that has each.
const PROGRAMS: [(&str, &str); 9] = [
    ("containerd", "containerd"),
    ("runc", "runc"),
    ("ctr", "containerd"),
    ("umoci", "umoci"),
    ("gcc", "gcc (and libc6-dev)"),
    ("ip", "iproute2"),
    ("unshare", "util-linux"),
    ("iptables", "iptables"),
    ("busybox", "busybox-static"),
];

/// CNI plugins the node's network configuration uses.
const CNI_PLUGINS: [&str; 4] = ["bridge", "host-local", "loopback", "portmap"];
/// Where Debian's containernetworking-plugins puts them.
const CNI_BIN_DIR: &str = "/usr/lib/cni";

/// One line naming everything a node needs that this machine lacks, and how to get it.
pub fn check_prerequisites() -> Result<()> {
    let missing = missing_prerequisites(&std::env::var_os("PATH").unwrap_or_default());
    if missing.is_empty() {
        Ok(())
    } else {
        Err(Error::MissingNodePrerequisites(missing.join(", ")))
    }
}

/// What a node needs and cannot find with `path` (a `PATH` value), each with how to get it.
fn missing_prerequisites(path: &std::ffi::OsStr) -> Vec<String> {
    let mut missing = Vec::new();
    for (program, package) in PROGRAMS {
        if which_in(path, program).is_none() {
            missing.push(format!("`{program}` (Debian package {package})"));
        }
    }
    for plugin in CNI_PLUGINS {
        if !Path::new(CNI_BIN_DIR).join(plugin).is_file() {
            missing.push(format!(
                "CNI plugin {CNI_BIN_DIR}/{plugin} (Debian package containernetworking-plugins)"
            ));
        }
    }
    for binary in ["kubelet", "kube-scheduler", "kube-proxy"] {
        if !bin_dir().join(binary).is_file() {
            missing.push(format!(
                "{} (run tests/controlplane/build.sh)",
                bin_dir().join(binary).display()
            ));
        }
    }
    if !Path::new("/sys/fs/cgroup/memory").is_dir() {
        missing.push("cgroup v1 hierarchies under /sys/fs/cgroup (this harness needs them)".to_owned());
    }
    missing
}

pub(crate) fn which(program: &str) -> Option<PathBuf> {
    which_in(&std::env::var_os("PATH").unwrap_or_default(), program)
}

fn which_in(path: &std::ffi::OsStr, program: &str) -> Option<PathBuf> {
    std::env::split_paths(path)
        .chain(["/usr/sbin".into(), "/sbin".into()])
        .map(|dir| dir.join(program))
        .find(|path| path.is_file())
}

/// Runs `program args…`; an error carries its stderr.
/// Imports an image tarball (OCI layout) as `reference` (`name:tag`) into the Kubernetes
/// namespace of the containerd listening on `socket`, with the host's `ctr` (which streams the
/// tarball to it).
pub(crate) fn import_image(socket: &Path, reference: &str, tarball: &Path) -> Result<()> {
    let (name, _) = crate::images::split_reference(reference)?;
    run(
        "ctr",
        &[
            "--address",
            &socket.display().to_string(),
            "-n",
            "k8s.io",
            "images",
            "import",
            "--base-name",
            name,
            &tarball.display().to_string(),
        ],
    )
}

pub(crate) fn run(program: &str, args: &[&str]) -> Result<()> {
    let output = Command::new(program)
        .args(args)
        .output()
        .map_err(|source| Error::Spawn {
            name: program.to_owned(),
            source,
        })?;
    if output.status.success() {
        Ok(())
    } else {
        Err(Error::NodeSetup(format!(
            "{program} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        )))
    }
}

/// The host side of the nodes of one control plane: a bridge and a /24 for node addresses.
#[derive(Debug)]
pub struct NodeNetwork {
    index: u8,
    state: PathBuf,
}

impl NodeNetwork {
    /// Creates the bridge of a free network index (after removing what killed runs left behind).
    pub fn create() -> Result<Self> {
        check_prerequisites()?;
        std::fs::create_dir_all(STATE_DIR).map_err(|e| Error::io("creating", STATE_DIR, e))?;
        clean_up_abandoned();
        let start = (std::process::id() % 200) as u8;
        for offset in 0..200u8 {
            let index = 1 + (start + offset) % 200;
            let state = Path::new(STATE_DIR).join(index.to_string());
            if std::fs::create_dir(&state).is_err() {
                continue;
            }
            let network = Self { index, state };
            network.record("pid", &std::process::id().to_string())?;
            let bridge = network.bridge();
            if run("ip", &["link", "add", &bridge, "type", "bridge"]).is_err() {
                continue; // dropping `network` frees the index again
            }
            network.record("bridge", &bridge)?;
            run(
                "ip",
                &[
                    "addr",
                    "add",
                    &format!("{}/24", network.gateway()),
                    "dev",
                    &bridge,
                ],
            )?;
            run("ip", &["link", "set", &bridge, "up"])?;
            return Ok(network);
        }
        Err(Error::NodeSetup(format!(
            "no free node network index: every one in {STATE_DIR} is in use"
        )))
    }

    /// The host's address on the bridge, where the API server listens.
    pub fn gateway(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, 201, self.index, 1)
    }

    fn bridge(&self) -> String {
        format!("bnlbr{}", self.index)
    }

    fn node_ip(&self, node: u8) -> Ipv4Addr {
        Ipv4Addr::new(10, 201, self.index, 10 + node)
    }

    fn pod_cidr(&self, node: u8) -> String {
        format!("10.{}.{}.0/24", 202 + u16::from(node), self.index)
    }

    fn record(&self, key: &str, value: &str) -> Result<()> {
        let path = self.state.join(key);
        std::fs::write(&path, value).map_err(|e| Error::io("writing", path, e))
    }
}

impl Drop for NodeNetwork {
    fn drop(&mut self) {
        remove_recorded(&self.state);
    }
}

/// Removes what the state folder of a network or lab records (nodes or guests first, then a
/// process it started, then the bridge) and the folder itself. Best effort: what is already gone
/// is skipped.
pub(crate) fn remove_recorded(state: &Path) {
    let read = |name: &str| std::fs::read_to_string(state.join(name)).ok();
    if let Ok(entries) = std::fs::read_dir(state) {
        for entry in entries.flatten() {
            if entry.path().is_dir() {
                remove_node_resources(&entry.path());
            }
        }
    }
    // A recorded process is killed only while its command line still names this state folder
    // (a PID of a process that ended may be another process's now).
    let kill_files = std::fs::read_dir(state)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("kill-pid"));
    for file in kill_files {
        let pid = std::fs::read_to_string(file.path()).unwrap_or_default();
        let cmdline = std::fs::read(format!("/proc/{}/cmdline", pid.trim())).unwrap_or_default();
        if !pid.trim().is_empty()
            && String::from_utf8_lossy(&cmdline).contains(&format!("{}/", state.display()))
        {
            let _ = Command::new("kill").args(["-KILL", pid.trim()]).status();
        }
    }
    if let Some(bridge) = read("bridge") {
        let _ = run("ip", &["link", "del", bridge.trim()]);
    }
    let _ = std::fs::remove_dir_all(state);
}

/// Removes the networks of owners that no longer run.
fn clean_up_abandoned() {
    clean_up_abandoned_in(Path::new(STATE_DIR));
}

/// Removes the networks or labs recorded in `dir` whose owners no longer run.
pub(crate) fn clean_up_abandoned_in(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        if owner_is_gone(&entry.path()) {
            tracing::info!(state = %entry.path().display(), "removing a node network a killed run left behind");
            remove_recorded(&entry.path());
        }
    }
}

/// How long a state folder may lack its owner's PID before it counts as abandoned: its owner
/// writes the PID right after creating the folder, and a concurrent clean-up must not take a
/// folder being set up (and the bridge it is about to configure) for a killed run's.
const PID_GRACE: Duration = Duration::from_secs(60);

/// Whether the owner recorded in a state folder no longer runs. A folder without a (complete)
/// PID is its owner's until [`PID_GRACE`] has passed since it was created.
fn owner_is_gone(state: &Path) -> bool {
    let pid = std::fs::read_to_string(state.join("pid")).unwrap_or_default();
    match pid.trim().parse::<u32>() {
        Ok(pid) => !Path::new(&format!("/proc/{pid}")).exists(),
        Err(_) => std::fs::metadata(state)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|created| created.elapsed().ok())
            .is_some_and(|age| age > PID_GRACE),
    }
}

/// One real node (see the module documentation). Stopped and removed on drop.
pub struct Node {
    name: String,
    process: Option<ManagedProcess>,
    state: PathBuf,
    dir: PathBuf,
}

/// What a node gets from its host beyond the defaults.
#[derive(Clone, Debug, Default)]
pub struct NodeOptions {
    /// Folders under `/run` of the host that stay visible in the node (whose `/run` is private
    /// otherwise), e.g. `/run/libvirt` for Pods with a hostPath volume to a host daemon's socket.
    pub host_run_paths: Vec<PathBuf>,
}

impl NodeOptions {
    fn check(&self) -> Result<String> {
        let mut paths = Vec::new();
        for path in &self.host_run_paths {
            let text = path.to_str().unwrap_or_default();
            if !path.starts_with("/run/") || text.contains(char::is_whitespace) || !path.is_dir() {
                return Err(Error::NodeSetup(format!(
                    "host run path {}: must be an existing folder under /run/ without spaces",
                    path.display()
                )));
            }
            paths.push(text.to_owned());
        }
        Ok(paths.join(" "))
    }
}

impl Node {
    /// Starts node `index` (0…49) of `env`'s node network, named `name`, and waits until it is
    /// Ready.
    pub async fn start(env: &TestEnv, index: u8, name: &str) -> Result<Self> {
        Self::start_with(env, index, name, &NodeOptions::default()).await
    }

    /// [`Node::start`] with `options`.
    pub async fn start_with(env: &TestEnv, index: u8, name: &str, options: &NodeOptions) -> Result<Self> {
        let host_run_paths = options.check()?;
        let network = env.node_network().ok_or(Error::NodeSetup(
            "the control plane has no node network: start it with TestEnvBuilder::node_network(true)"
                .to_owned(),
        ))?;
        if index >= 50 {
            return Err(Error::NodeSetup(format!("node index {index} is over 49")));
        }
        let dir = env.workdir().join("nodes").join(name);
        std::fs::create_dir_all(dir.join("cni/net.d")).map_err(|e| Error::io("creating", &dir, e))?;
        let plan = NodePlan {
            name: name.to_owned(),
            node_ip: network.node_ip(index),
            pod_cidr: network.pod_cidr(index),
            cgroup: format!("banlieue-{}-{index}", network.index),
            netns: format!("bnl-{}-{index}", network.index),
            host_veth: format!("bnlv{}-{index}", network.index),
            dir: dir.clone(),
            host_run_paths,
        };
        let state = network.state.join(format!("node-{index}"));
        plan.record(&state)?;
        // From here on, dropping `node` removes whatever was created.
        let mut node = Self {
            name: name.to_owned(),
            process: None,
            state,
            dir,
        };
        plan.attach_network(network)?;
        plan.write_files(env, &node_images(env)?)?;
        node.process = Some(plan.boot()?);
        node.wait_ready(env).await?;
        Ok(node)
    }

    /// The node's name (its Node object).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Imports an image tarball (OCI layout, e.g. from [`crate::images::BinaryImage::build`]) into
    /// the node's containerd as `reference` (`name:tag`): Pods with `imagePullPolicy: IfNotPresent`
    /// or `Never` then run it.
    pub fn import(&self, reference: &str, tarball: &Path) -> Result<()> {
        import_image(&self.dir.join("containerd.sock"), reference, tarball)
    }

    /// The node's folder: `node.log` (its init and kubelet), `containerd.log`, configuration.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Resident memory of every process of the node (its init, containerd, kubelet, kube-proxy,
    /// the shims and every container), summed from `/proc/<pid>/status` `VmRSS` (pages shared
    /// between processes count once per process, so this is an upper bound).
    pub fn resident_memory_bytes(&self) -> Result<u64> {
        let root = self
            .process
            .as_ref()
            .map(ManagedProcess::id)
            .ok_or_else(|| Error::NodeSetup(format!("node {} is not running", self.name)))?;
        let mut children: std::collections::HashMap<u32, Vec<u32>> = std::collections::HashMap::new();
        let proc_dir = Path::new("/proc");
        let entries = std::fs::read_dir(proc_dir).map_err(|e| Error::io("reading", proc_dir, e))?;
        for entry in entries.flatten() {
            let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
                continue;
            };
            // `stat` is "pid (comm) state ppid …"; comm may hold spaces, so split after ')'.
            let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
            let ppid = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1))
                .and_then(|p| p.parse::<u32>().ok());
            if let Some(ppid) = ppid {
                children.entry(ppid).or_default().push(pid);
            }
        }
        let mut total = 0;
        let mut pending = vec![root];
        while let Some(pid) = pending.pop() {
            let status =
                std::fs::read_to_string(proc_dir.join(pid.to_string()).join("status")).unwrap_or_default();
            let kib = status
                .lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0);
            total += kib * 1024;
            pending.extend(children.remove(&pid).unwrap_or_default());
        }
        Ok(total)
    }

    async fn wait_ready(&mut self, env: &TestEnv) -> Result<()> {
        let nodes: Api<NodeObject> = Api::all(env.client().await?);
        let deadline = Instant::now() + READY_TIMEOUT;
        let mut last = String::from("not registered");
        loop {
            if let Some(process) = &mut self.process {
                process.check_running()?;
            }
            if let Ok(Some(node)) = nodes.get_opt(&self.name).await {
                let ready = node
                    .status
                    .and_then(|s| s.conditions)
                    .unwrap_or_default()
                    .into_iter()
                    .find(|c| c.type_ == "Ready");
                match ready {
                    Some(c) if c.status == "True" => return Ok(()),
                    Some(c) => last = format!("Ready={} {}", c.status, c.message.unwrap_or_default()),
                    None => last = "registered, no Ready condition yet".to_owned(),
                }
            }
            if Instant::now() > deadline {
                return Err(Error::Timeout {
                    what: format!("node {} to become Ready", self.name),
                    timeout: READY_TIMEOUT,
                    detail: format!(
                        " ({last}); last lines of {}:\n{}",
                        self.dir.join("node.log").display(),
                        self.process.as_ref().map(|p| p.log_tail(20)).unwrap_or_default()
                    ),
                });
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}

/// Names and addresses of one node, and the steps that set it up.
struct NodePlan {
    name: String,
    node_ip: Ipv4Addr,
    pod_cidr: String,
    cgroup: String,
    netns: String,
    host_veth: String,
    dir: PathBuf,
    /// [`NodeOptions::host_run_paths`], space separated.
    host_run_paths: String,
}

impl NodePlan {
    /// Records, before anything is created, what removing the node means (see
    /// [`remove_node_resources`]).
    fn record(&self, state: &Path) -> Result<()> {
        std::fs::create_dir_all(state).map_err(|e| Error::io("creating", state, e))?;
        for (key, value) in [
            ("cgroup", &self.cgroup),
            ("route", &self.pod_cidr),
            ("netns", &self.netns),
            ("veth", &self.host_veth),
        ] {
            write(&state.join(key), value)?;
        }
        Ok(())
    }

    /// The node's network namespace with a veth on the bridge, its default route to the host,
    /// and its Pod range routed to it from the host.
    fn attach_network(&self, network: &NodeNetwork) -> Result<()> {
        let (netns, veth) = (self.netns.as_str(), self.host_veth.as_str());
        run("ip", &["netns", "add", netns])?;
        run(
            "ip",
            &[
                "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", netns,
            ],
        )?;
        run("ip", &["link", "set", veth, "master", &network.bridge(), "up"])?;
        let in_netns = |args: &[&str]| {
            let mut all = vec!["netns", "exec", netns, "ip"];
            all.extend_from_slice(args);
            run("ip", &all)
        };
        in_netns(&["addr", "add", &format!("{}/24", self.node_ip), "dev", "eth0"])?;
        in_netns(&["link", "set", "eth0", "up"])?;
        in_netns(&["link", "set", "lo", "up"])?;
        in_netns(&["route", "add", "default", "via", &network.gateway().to_string()])?;
        run(
            "ip",
            &["route", "add", &self.pod_cidr, "via", &self.node_ip.to_string()],
        )
    }

    /// Identities (kubelet as `system:node:<name>`, kube-proxy), the kubelet's serving
    /// certificate, the configuration of kubelet, kube-proxy, containerd and CNI, and the `env`
    /// file `node/boot.sh` reads.
    fn write_files(&self, env: &TestEnv, images: &[(String, PathBuf)]) -> Result<()> {
        let (dir, name) = (&self.dir, self.name.as_str());
        let kubelet = env.user_kubeconfig(&format!("system:node:{name}"), &["system:nodes"])?;
        std::fs::copy(kubelet.path(), dir.join("kubelet.kubeconfig"))
            .map_err(|e| Error::io("copying", kubelet.path(), e))?;
        let proxy = env.user_kubeconfig("system:kube-proxy", &[])?;
        std::fs::copy(proxy.path(), dir.join("kube-proxy.kubeconfig"))
            .map_err(|e| Error::io("copying", proxy.path(), e))?;
        let serving = env.serving_certificate(&[IpAddr::V4(self.node_ip)], &[name])?;
        write(&dir.join("kubelet.crt"), &serving.cert_pem)?;
        write(&dir.join("kubelet.key"), &serving.key_pem)?;
        write(&dir.join("ca.crt"), &env.ca_pem()?)?;
        write(&dir.join("kube-proxy.yaml"), &kube_proxy_config(dir, name))?;
        write(
            &dir.join("kubelet.yaml"),
            &kubelet_config(dir, &self.cgroup, &self.pod_cidr),
        )?;
        write(&dir.join("containerd.toml"), &containerd_config(dir))?;
        write(
            &dir.join("cni/net.d/10-banlieue.conflist"),
            &cni_config(dir, &self.pod_cidr),
        )?;
        let image_list: Vec<String> = images
            .iter()
            .map(|(reference, tarball)| format!("{reference}={}", tarball.display()))
            .collect();
        write(
            &dir.join("env"),
            &format!(
                "NAME='{name}'\nCGROUP='{}'\nNODE_IP='{}'\nIMAGES='{}'\nHOST_RUN_PATHS='{}'\nPATH='{}:{}'\n",
                self.cgroup,
                self.node_ip,
                image_list.join(" "),
                self.host_run_paths,
                bin_dir().display(),
                std::env::var("PATH").unwrap_or_default()
            ),
        )
    }

    /// `node/boot.sh` as PID 1 of the node's PID, mount and UTS namespaces inside its network
    /// namespace; killing the returned process ends the node (`--kill-child`).
    fn boot(&self) -> Result<ManagedProcess> {
        let boot = Path::new(env!("CARGO_MANIFEST_DIR")).join("node/boot.sh");
        let args: Vec<String> = [
            "netns",
            "exec",
            &self.netns,
            "unshare",
            "--mount",
            "--uts",
            "--pid",
            "--fork",
            "--mount-proc",
            "--propagation",
            "private",
            "--kill-child=SIGKILL",
            "bash",
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .chain([boot.display().to_string(), self.dir.display().to_string()])
        .collect();
        ManagedProcess::start(
            &format!("node {}", self.name),
            &which("ip").unwrap_or_else(|| "/usr/sbin/ip".into()),
            &args,
            &self.dir.join("node.log"),
        )
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Some(mut process) = self.process.take() {
            // SIGKILL to unshare; --kill-child ends the node's PID 1 and with it every process of
            // its PID namespace (containerd, shims, Pods, kubelet).
            process.stop();
        }
        remove_node_resources(&self.state);
    }
}

/// Removes a node's namespace, route and cgroups as recorded in its state folder, once no
/// process is left in its cgroups (bounded wait).
pub(crate) fn remove_node_resources(state: &Path) {
    let read = |name: &str| {
        std::fs::read_to_string(state.join(name))
            .ok()
            .map(|s| s.trim().to_owned())
    };
    if let Some(cgroup) = read("cgroup") {
        let deadline = Instant::now() + Duration::from_secs(10);
        for hierarchy in CGROUP_HIERARCHIES {
            let root = Path::new("/sys/fs/cgroup").join(hierarchy).join(&cgroup);
            kill_and_remove_cgroup(&root, deadline);
        }
    }
    // The veth pair first: a mount namespace made meanwhile (any `unshare --mount` on the host)
    // may hold a copy of the netns mount and keep the namespace, with its end of the pair, alive.
    if let Some(veth) = read("veth") {
        let _ = run("ip", &["link", "del", &veth]);
    }
    if let Some(netns) = read("netns") {
        let _ = run("ip", &["netns", "del", &netns]);
    }
    if let Some(route) = read("route") {
        let _ = run("ip", &["route", "del", &route]);
    }
    let _ = std::fs::remove_dir_all(state);
}

/// Kills what is left in the cgroup tree at `root` and removes it, deepest first.
fn kill_and_remove_cgroup(root: &Path, deadline: Instant) {
    if !root.is_dir() {
        return;
    }
    let mut dirs = Vec::new();
    collect_dirs(root, &mut dirs);
    dirs.sort_by_key(|d| std::cmp::Reverse(d.components().count()));
    for dir in dirs {
        loop {
            let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
            for pid in procs.split_whitespace() {
                let _ = Command::new("kill").args(["-KILL", pid]).status();
            }
            if std::fs::remove_dir(&dir).is_ok() || !dir.exists() || Instant::now() > deadline {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

fn collect_dirs(dir: &Path, out: &mut Vec<PathBuf>) {
    out.push(dir.to_owned());
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                collect_dirs(&entry.path(), out);
            }
        }
    }
}

pub(crate) fn write(path: &Path, contents: &str) -> Result<()> {
    std::fs::write(path, contents).map_err(|e| Error::io("writing", path, e))
}

/// The images every node imports (`node/images.sh`, built once per control plane).
fn node_images(env: &TestEnv) -> Result<Vec<(String, PathBuf)>> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("node/images.sh");
    let out = env.workdir().join("node-images");
    let stdout = setup_output(
        Command::new("bash").arg(&script).arg(&out),
        "node/images.sh",
        &format!("building the node images ({})", script.display()),
    )?;
    Ok(String::from_utf8_lossy(&stdout)
        .lines()
        .filter_map(|line| line.split_once('='))
        .map(|(reference, tarball)| (reference.to_owned(), PathBuf::from(tarball)))
        .collect())
}

/// The kubelet's configuration. Disk-pressure eviction is off (thresholds at 0%): the node's
/// filesystem is the host's, shared with cargo's target folder and every other test, so a host
/// with little free disk would otherwise evict the Pods under test (seen on CI) and taint the node.
fn kubelet_config(dir: &Path, cgroup: &str, pod_cidr: &str) -> String {
    let d = dir.display();
    format!(
        r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: cgroupfs
cgroupRoot: /{cgroup}
failCgroupV1: false
failSwapOn: false
containerRuntimeEndpoint: unix://{d}/containerd.sock
podCIDR: {pod_cidr}
authentication:
  anonymous: {{enabled: false}}
  webhook: {{enabled: true}}
  x509: {{clientCAFile: {d}/ca.crt}}
authorization: {{mode: Webhook}}
tlsCertFile: {d}/kubelet.crt
tlsPrivateKeyFile: {d}/kubelet.key
readOnlyPort: 0
healthzPort: 0
registerNode: true
evictionHard: {{memory.available: 100Mi, nodefs.available: 0%, imagefs.available: 0%, nodefs.inodesFree: 0%}}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
"#
    )
}

fn kube_proxy_config(dir: &Path, name: &str) -> String {
    format!(
        r#"apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
clusterCIDR: 10.0.0.0/8
hostnameOverride: {name}
clientConnection:
  kubeconfig: {}/kube-proxy.kubeconfig
conntrack:
  maxPerCore: 0
"#,
        dir.display()
    )
}

fn containerd_config(dir: &Path) -> String {
    let d = dir.display();
    format!(
        r#"version = 2
root = "{d}/containerd/root"
state = "{d}/containerd/state"
[grpc]
  address = "{d}/containerd.sock"
[ttrpc]
  address = "{d}/containerd.sock.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "{d}/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "registry.k8s.io/pause:3.10"
  restrict_oom_score_adj = true
  disable_apparmor = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_BIN_DIR}"
    conf_dir = "{d}/cni/net.d"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
"#
    )
}

fn cni_config(dir: &Path, pod_cidr: &str) -> String {
    serde_json::json!({
        "cniVersion": "1.0.0",
        "name": "banlieue",
        "plugins": [
            {
                "type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": true,
                "hairpinMode": true,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": pod_cidr}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": dir.join("cni/ipam").display().to_string(),
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": true}},
        ],
    })
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_program_is_named_with_its_package() {
        let missing = missing_prerequisites(std::ffi::OsStr::new("/nonexistent"));
        let text = missing.join(", ");
        assert!(
            text.contains("`containerd` (Debian package containerd)"),
            "{text}"
        );
        assert!(text.contains("`umoci` (Debian package umoci)"), "{text}");
        // /usr/sbin is searched whatever PATH says (ip lives there).
        assert!(!text.contains("`ip`"), "{text}");
    }

    #[test]
    fn a_folder_still_being_set_up_is_not_taken_for_a_killed_runs() {
        let dir = tempfile::tempdir().unwrap();
        let fresh = dir.path().join("24");
        std::fs::create_dir(&fresh).unwrap();
        assert!(!owner_is_gone(&fresh), "no PID yet: its owner is writing it");
        std::fs::write(fresh.join("pid"), "").unwrap();
        assert!(!owner_is_gone(&fresh), "an empty PID is one being written");

        std::fs::write(fresh.join("pid"), std::process::id().to_string()).unwrap();
        assert!(!owner_is_gone(&fresh), "its owner runs");
        std::fs::write(fresh.join("pid"), u32::MAX.to_string()).unwrap();
        assert!(owner_is_gone(&fresh), "no such process");

        let old = dir.path().join("25");
        std::fs::create_dir(&old).unwrap();
        let long_ago = std::time::SystemTime::now() - 2 * PID_GRACE;
        std::fs::File::open(&old).unwrap().set_modified(long_ago).unwrap();
        assert!(owner_is_gone(&old), "a PID never written within the grace");
    }
}
