//! Lab guests: the VMs of a simulated hypervisor, booted for real. A [`Lab`] is the network the
//! guests share (a host bridge `10.203.<k>.0/24` with the host on `.1` and a DHCP and DNS server,
//! Debian's dnsmasq, handing out `.100`–`.199` and resolving the guests' names; `.2`–`.99` stay
//! free for virtual and static addresses). [`Guest::power_on`] boots one VM from the lab guest image (`tests/guest`, built by
//! [`guest_image`]): its own network namespace with one NIC of the name and MAC the hypervisor's
//! guest would see, its own mount, PID, UTS and cgroup namespaces, a disk that is an overlay of
//! the image, its seed drive, and the image's own init (`banlieue-guest-init`: cloud-init's
//! stages, containerd, kubelet). Dropping a guest powers it off: every process of it ends and
//! its namespaces and cgroups go; its disk stays in its folder, as a VM's does, so a guest
//! powered on again from the same folder boots from it as the same node (kubelet's credentials,
//! containerd's images, cloud-init's record of the first boot), until [`Guest::discard_disk`]
//! (the VM was deleted; its logs stay). What a killed run left
//! behind is removed by the next [`Lab::create`] (each lab records its owner and what it made
//! under [`LAB_STATE_DIR`]).

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::nodes::{clean_up_abandoned_in, import_image, remove_node_resources, run, which, write};
use crate::setup::setup_output;
use crate::{Error, ManagedProcess, Result};

/// Where each lab records its owner PID and what it created.
pub const LAB_STATE_DIR: &str = "/run/banlieue-testenv-labs";
/// Environment variable naming where [`guest_image`] builds and caches the guest image.
pub const GUEST_IMAGE_ENV_VAR: &str = "BANLIEUE_GUEST_IMAGE";

/// The lab guest image, built (or found up to date) by `tests/guest/build.sh` into
/// `$BANLIEUE_GUEST_IMAGE` or `tests/guest/out`; returns its root filesystem. Takes about a
/// minute the first time (mmdebstrap, etcd and CoreDNS), nothing when inputs are unchanged.
pub fn guest_image() -> Result<PathBuf> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../guest/build.sh");
    let out = std::env::var_os(GUEST_IMAGE_ENV_VAR)
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../guest/out"));
    let log = setup_output(
        Command::new("bash")
            .arg(&script)
            .arg(&out)
            .env(crate::BIN_DIR_ENV_VAR, crate::bin_dir()),
        "tests/guest/build.sh",
        &format!("building the guest image ({})", script.display()),
    )?;
    tracing::info!(log = %String::from_utf8_lossy(&log).trim(), "guest image");
    Ok(out.join("rootfs"))
}

/// The network of a set of guests (see the module documentation). Removed on drop.
#[derive(Debug)]
pub struct Lab {
    index: u8,
    state: PathBuf,
    dhcp: Option<ManagedProcess>,
    next_guest: AtomicU32,
}

impl Lab {
    /// Creates the bridge and DHCP server of a free lab index (after removing what killed runs
    /// left behind).
    pub fn create() -> Result<Self> {
        let dnsmasq = which("dnsmasq").ok_or_else(|| {
            Error::MissingNodePrerequisites("`dnsmasq` (Debian package dnsmasq-base)".to_owned())
        })?;
        std::fs::create_dir_all(LAB_STATE_DIR).map_err(|e| Error::io("creating", LAB_STATE_DIR, e))?;
        clean_up_abandoned_in(Path::new(LAB_STATE_DIR));
        let start = (std::process::id() % 200) as u8;
        for offset in 0..200u8 {
            let index = 1 + (start + offset) % 200;
            let state = Path::new(LAB_STATE_DIR).join(index.to_string());
            if std::fs::create_dir(&state).is_err() {
                continue;
            }
            let mut lab = Self {
                index,
                state,
                dhcp: None,
                next_guest: AtomicU32::new(0),
            };
            write(&lab.state.join("pid"), &std::process::id().to_string())?;
            let bridge = lab.bridge();
            if run("ip", &["link", "add", &bridge, "type", "bridge"]).is_err() {
                continue; // dropping `lab` frees the index again
            }
            write(&lab.state.join("bridge"), &bridge)?;
            let cidr = format!("{}/24", lab.gateway());
            run("ip", &["addr", "add", &cidr, "dev", &bridge])?;
            run("ip", &["link", "set", &bridge, "up"])?;
            let leases = lab.state.join("leases");
            let args: Vec<String> = vec![
                "--keep-in-foreground".into(),
                "--strict-order".into(),
                "--bind-interfaces".into(),
                format!("--interface={bridge}"),
                "--except-interface=lo".into(),
                format!("--listen-address={}", lab.gateway()),
                format!(
                    "--dhcp-range={},{},255.255.255.0,1h",
                    lab.address(100),
                    lab.address(199)
                ),
                format!("--dhcp-leasefile={}", leases.display()),
                // DNS for the lab only: the guests' names (from their DHCP requests) resolve, any
                // other name fails at once (no upstream: nothing leaves the machine).
                "--no-resolv".into(),
                "--no-hosts".into(),
                "--domain-needed".into(),
                "--log-dhcp".into(),
                "--log-facility=-".into(),
                "--conf-file=/dev/null".into(),
            ];
            let dhcp = ManagedProcess::start(
                &format!("lab {index} DHCP"),
                &dnsmasq,
                &args,
                &lab.state.join("dnsmasq.log"),
            )?;
            write(&lab.state.join("kill-pid"), &dhcp.id().to_string())?;
            lab.dhcp = Some(dhcp);
            return Ok(lab);
        }
        Err(Error::NodeSetup(format!(
            "no free lab index: every one in {LAB_STATE_DIR} is in use"
        )))
    }

    /// The host's address on the lab bridge (the guests' default gateway).
    pub fn gateway(&self) -> Ipv4Addr {
        self.address(1)
    }

    /// Address `.host` of the lab's /24 (`.2`–`.99` are never handed out by DHCP).
    pub fn address(&self, host: u8) -> Ipv4Addr {
        Ipv4Addr::new(10, 203, self.index, host)
    }

    /// The lab's DHCP server log (one line per lease).
    pub fn dhcp_log(&self) -> PathBuf {
        self.state.join("dnsmasq.log")
    }

    fn bridge(&self) -> String {
        format!("bnllab{}", self.index)
    }

    /// Starts an external load balancer for a workload cluster's control plane, as a user
    /// without kube-vip runs one (the `external-lb` template flavor): Debian's haproxy in TCP
    /// mode on `.host:port` of the lab (an address DHCP never hands out), its backend port 6443
    /// of every address DHCP hands out, each checked with `GET /readyz` over TLS every second:
    /// only control plane nodes whose API server is ready get connections, whichever machines
    /// come and go. Stopped on drop (and with the lab).
    pub fn start_load_balancer(&self, host: u8, port: u16) -> Result<LoadBalancer> {
        let haproxy = which("haproxy").ok_or_else(|| {
            Error::MissingNodePrerequisites("`haproxy` (Debian package haproxy)".to_owned())
        })?;
        let address = self.address(host);
        let dir = self.state.join(format!("lb-{host}"));
        std::fs::create_dir_all(&dir).map_err(|e| Error::io("creating", &dir, e))?;
        let config = dir.join("haproxy.cfg");
        write(
            &config,
            &load_balancer_config(address, port, (100..=199).map(|h| self.address(h))),
        )?;
        setup_output(
            Command::new(&haproxy).arg("-c").arg("-f").arg(&config),
            "haproxy",
            &format!("checking the load balancer's configuration {}", config.display()),
        )?;
        run(
            "ip",
            &["addr", "add", &format!("{address}/32"), "dev", &self.bridge()],
        )?;
        let started = ManagedProcess::start(
            &format!("lab {} load balancer", self.index),
            &haproxy,
            &["-db".to_owned(), "-f".to_owned(), config.display().to_string()],
            &dir.join("haproxy.log"),
        )
        .and_then(|mut process| {
            // A bind that fails ends haproxy at once.
            std::thread::sleep(std::time::Duration::from_millis(300));
            process.check_running().map(|()| process)
        });
        let process = match started {
            Ok(process) => process,
            Err(e) => {
                let _ = run(
                    "ip",
                    &["addr", "del", &format!("{address}/32"), "dev", &self.bridge()],
                );
                return Err(e);
            }
        };
        write(
            &self.state.join(format!("kill-pid-lb-{host}")),
            &process.id().to_string(),
        )?;
        Ok(LoadBalancer {
            process: Some(process),
            address,
            port,
            bridge: self.bridge(),
            pid_file: self.state.join(format!("kill-pid-lb-{host}")),
        })
    }
}

/// haproxy's configuration for [`Lab::start_load_balancer`].
fn load_balancer_config(address: Ipv4Addr, port: u16, backends: impl Iterator<Item = Ipv4Addr>) -> String {
    let mut config = format!(
        "global\n    maxconn 4096\n\ndefaults\n    mode tcp\n    timeout connect 5s\n    \
         timeout client 1h\n    timeout server 1h\n    timeout check 2s\n\n\
         frontend control-plane\n    bind {address}:{port}\n    default_backend api-servers\n\n\
         backend api-servers\n    option httpchk GET /readyz\n    http-check expect status 200\n    \
         default-server check check-ssl verify none inter 1s fall 2 rise 1 on-marked-down shutdown-sessions\n"
    );
    for backend in backends {
        config.push_str(&format!("    server {backend} {backend}:6443\n"));
    }
    config
}

/// A running [`Lab::start_load_balancer`].
#[derive(Debug)]
pub struct LoadBalancer {
    process: Option<ManagedProcess>,
    address: Ipv4Addr,
    port: u16,
    bridge: String,
    pid_file: PathBuf,
}

impl LoadBalancer {
    /// Its frontend's address.
    pub fn address(&self) -> Ipv4Addr {
        self.address
    }

    /// Its frontend's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Its log (haproxy's own lines: backends going up and down).
    pub fn log_tail(&self, lines: usize) -> String {
        self.process
            .as_ref()
            .map(|p| p.log_tail(lines))
            .unwrap_or_default()
    }
}

impl Drop for LoadBalancer {
    fn drop(&mut self) {
        if let Some(mut process) = self.process.take() {
            process.stop();
            let _ = std::fs::remove_file(&self.pid_file);
        }
        let _ = run(
            "ip",
            &[
                "addr",
                "del",
                &format!("{}/32", self.address),
                "dev",
                &self.bridge,
            ],
        );
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        if let Some(mut dhcp) = self.dhcp.take() {
            dhcp.stop();
            // Stopped and reaped: its PID may be another process's by now.
            let _ = std::fs::remove_file(self.state.join("kill-pid"));
        }
        crate::nodes::remove_recorded(&self.state);
    }
}

/// What a guest is powered on with.
#[derive(Clone, Debug)]
pub struct GuestSpec {
    /// A name for logs and folders (e.g. the VMID).
    pub name: String,
    /// The NIC's name in the guest, as the hypervisor's guests name it (Proxmox: `ens18`).
    pub nic: String,
    /// The NIC's MAC address, as the hypervisor assigned it.
    pub mac: String,
    /// The seed drive's image (a NoCloud ISO), as the provider delivered it.
    pub seed: Option<Vec<u8>>,
    /// The VM's SMBIOS system information (`/sys/class/dmi/id` in the guest), if the
    /// hypervisor gives it one.
    pub smbios: Option<Smbios>,
    /// The VM's guestinfo values by key (`guestinfo.userdata`, …), served in the guest by its
    /// `vmware-rpctool` (vSphere's channel to cloud-init's VMware datasource); empty elsewhere.
    pub guestinfo: std::collections::BTreeMap<String, String>,
    /// The Kubernetes version the VM's disk was built for, when it is not the image's own (a
    /// template built for the next minor): the image's layer for it lies over the image (see
    /// [`kubernetes_layers`]).
    pub kubernetes: Option<String>,
}

/// The folder of the image's layers, one per extra Kubernetes version, beside its root filesystem
/// (`tests/guest/build.sh`; overlayfs refuses a lower layer inside another).
fn kubernetes_layers_dir(rootfs: &Path) -> PathBuf {
    rootfs.with_file_name("kubernetes")
}

/// The Kubernetes versions the image at `rootfs` has a layer for besides its own (its kubelet,
/// kubeadm and preloaded images; `tests/controlplane/build.sh --next` then `tests/guest/build.sh`
/// add the next minor), oldest first (by version number: v1.9 before v1.34).
pub fn kubernetes_layers(rootfs: &Path) -> Vec<String> {
    let mut versions: Vec<String> = std::fs::read_dir(kubernetes_layers_dir(rootfs))
        .into_iter()
        .flatten()
        .flatten()
        .filter(|entry| entry.path().is_dir())
        .filter_map(|entry| entry.file_name().into_string().ok())
        .collect();
    versions.sort_by_key(|v| version_numbers(v));
    versions
}

/// `v1.34.4` → `[1, 34, 4]` (what is not a number counts as 0), for ordering versions.
fn version_numbers(version: &str) -> Vec<u64> {
    version
        .trim_start_matches('v')
        .split(['.', '-', '+'])
        .map(|part| part.parse().unwrap_or(0))
        .collect()
}

/// SMBIOS system information of a VM, as its firmware reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Smbios {
    /// `sys_vendor` (e.g. `VMware, Inc.`, `QEMU`).
    pub vendor: String,
    /// `product_name` (e.g. `VMware7,1`, `Standard PC (i440FX + PIIX, 1996)`).
    pub product: String,
    /// `product_uuid`: the VM's BIOS/SMBIOS uuid (the kubelet's `systemUUID`).
    pub uuid: String,
}

/// One network interface of a running guest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GuestNic {
    /// Its name in the guest.
    pub name: String,
    /// Its MAC address.
    pub mac: String,
    /// Its addresses with prefix lengths.
    pub addresses: Vec<(IpAddr, u8)>,
}

/// One powered-on guest (see the module documentation). Powered off on drop.
pub struct Guest {
    name: String,
    netns: String,
    cgroup: String,
    process: Option<ManagedProcess>,
    state: PathBuf,
    dir: PathBuf,
}

impl Guest {
    /// Powers on a guest of `lab` from `image` (see [`guest_image`]), its files in `dir` (its
    /// console log `console.log`, its disk's writes under `disk/`, its logs under
    /// `disk/var/log/`).
    pub fn power_on(lab: &Lab, image: &Path, dir: &Path, spec: &GuestSpec) -> Result<Self> {
        let layer = match &spec.kubernetes {
            None => String::new(),
            Some(version) => {
                let layer = kubernetes_layers_dir(image).join(version);
                if !layer.is_dir() {
                    return Err(Error::NodeSetup(format!(
                        "guest {}: the image {} has no layer for Kubernetes {version} (it has {:?}; \
                         build it: tests/controlplane/build.sh --next, then tests/guest/build.sh)",
                        spec.name,
                        image.display(),
                        kubernetes_layers(image)
                    )));
                }
                layer.display().to_string()
            }
        };
        let n = lab.next_guest.fetch_add(1, Ordering::Relaxed);
        let (netns, veth) = (
            format!("bnlg-{}-{n}", lab.index),
            format!("bnlgv{}-{n}", lab.index),
        );
        let cgroup = format!("banlieue-guest-{}-{n}", lab.index);
        let state = lab.state.join(format!("guest-{n}"));
        std::fs::create_dir_all(&state).map_err(|e| Error::io("creating", &state, e))?;
        for (key, value) in [("cgroup", &cgroup), ("netns", &netns), ("veth", &veth)] {
            write(&state.join(key), value)?;
        }
        std::fs::create_dir_all(dir).map_err(|e| Error::io("creating", dir, e))?;
        // From here on, dropping `guest` removes whatever was created.
        let mut guest = Self {
            name: spec.name.clone(),
            netns: netns.clone(),
            cgroup: cgroup.clone(),
            process: None,
            state,
            dir: dir.to_owned(),
        };
        run("ip", &["netns", "add", &netns])?;
        run(
            "ip",
            &[
                "link", "add", &veth, "type", "veth", "peer", "name", &spec.nic, "netns", &netns,
            ],
        )?;
        run("ip", &["link", "set", &veth, "master", &lab.bridge(), "up"])?;
        run(
            "ip",
            &[
                "netns", "exec", &netns, "ip", "link", "set", &spec.nic, "address", &spec.mac,
            ],
        )?;
        let seed = match &spec.seed {
            Some(image) => {
                let path = dir.join("seed.iso");
                std::fs::write(&path, image).map_err(|e| Error::io("writing", &path, e))?;
                path.display().to_string()
            }
            None => String::new(),
        };
        let guestinfo = if spec.guestinfo.is_empty() {
            String::new()
        } else {
            let folder = dir.join("guestinfo");
            let _ = std::fs::remove_dir_all(&folder);
            std::fs::create_dir_all(&folder).map_err(|e| Error::io("creating", &folder, e))?;
            for (key, value) in &spec.guestinfo {
                if key.contains('/') || key.starts_with('.') {
                    return Err(Error::NodeSetup(format!(
                        "guest {}: guestinfo key {key:?} is not a file name",
                        spec.name
                    )));
                }
                write(&folder.join(key), value)?;
            }
            folder.display().to_string()
        };
        let quoted = |value: &str| format!("'{}'", value.replace('\'', "'\\''"));
        let (vendor, product, uuid) = spec
            .smbios
            .as_ref()
            .map(|s| (s.vendor.as_str(), s.product.as_str(), s.uuid.as_str()))
            .unwrap_or_default();
        write(
            &dir.join("env"),
            &format!(
                "ROOTFS={}\nKUBERNETES_LAYER={}\nCGROUP={}\nSEED={}\nSMBIOS_VENDOR={}\nSMBIOS_PRODUCT={}\nSMBIOS_UUID={}\nGUESTINFO={}\n",
                quoted(&image.display().to_string()),
                quoted(&layer),
                quoted(&cgroup),
                quoted(&seed),
                quoted(vendor),
                quoted(product),
                quoted(uuid),
                quoted(&guestinfo),
            ),
        )?;
        let boot = Path::new(env!("CARGO_MANIFEST_DIR")).join("node/guest-boot.sh");
        let args: Vec<String> = [
            "netns",
            "exec",
            &netns,
            "unshare",
            "--mount",
            "--uts",
            "--pid",
            "--fork",
            "--propagation",
            "private",
            "--kill-child=SIGKILL",
            "nice",
            "-n",
            "10",
            "bash",
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .chain([boot.display().to_string(), dir.display().to_string()])
        .collect();
        guest.process = Some(ManagedProcess::start(
            &format!("guest {}", spec.name),
            &which("ip").unwrap_or_else(|| "/usr/sbin/ip".into()),
            &args,
            &dir.join("console.log"),
        )?);
        Ok(guest)
    }

    /// The name it was powered on with.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its folder (see [`Guest::power_on`]).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The last `lines` lines of its console.
    pub fn console_tail(&self, lines: usize) -> String {
        self.process
            .as_ref()
            .map(|p| p.log_tail(lines))
            .unwrap_or_default()
    }

    /// Why a guest did not become what was expected, in one place: the last `lines` lines of its
    /// console, of cloud-init's output (`/var/log/cloud-init-output.log`: the bootstrap
    /// commands' own output) and of its kubelet's log.
    pub fn boot_report(&self, lines: usize) -> String {
        let tail = |path: &Path| {
            let text = std::fs::read_to_string(path).unwrap_or_else(|e| format!("({e})"));
            let all: Vec<&str> = text.lines().collect();
            all[all.len().saturating_sub(lines)..].join("\n")
        };
        let log = self.dir.join("disk/var/log");
        format!(
            "== guest {} console ==\n{}\n== {} ==\n{}\n== {} ==\n{}",
            self.name,
            self.console_tail(lines),
            log.join("cloud-init-output.log").display(),
            tail(&log.join("cloud-init-output.log")),
            log.join("kubelet.log").display(),
            tail(&log.join("kubelet.log")),
        )
    }

    /// cloud-init's verdict once its last stage ran (`/var/lib/cloud/data/result.json`): the
    /// errors it reports, empty when every module succeeded; `None` before it finished.
    pub fn cloud_init_errors(&self) -> Option<Vec<String>> {
        let result: serde_json::Value = serde_json::from_str(&self.cloud_init_result()?).ok()?;
        Some(
            result["v1"]["errors"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|e| e.as_str().map_or_else(|| e.to_string(), str::to_owned))
                .collect(),
        )
    }

    /// cloud-init's report as it wrote it once its last stage ran (the guest's
    /// `/run/cloud-init/result.json` links to this file of its disk); `None` before.
    pub fn cloud_init_result(&self) -> Option<String> {
        std::fs::read_to_string(self.dir.join("disk/var/lib/cloud/data/result.json")).ok()
    }

    /// A guestinfo value as the guest holds it now: the one its VM had at power-on, or what the
    /// guest set since with `vmware-rpctool "info-set <key> <value>"` (its stand-in keeps both
    /// in `/var/lib/banlieue-guestinfo`); `None` when it has none.
    pub fn guestinfo_set(&self, key: &str) -> Option<String> {
        if key.contains('/') {
            return None;
        }
        std::fs::read_to_string(self.dir.join("disk/var/lib/banlieue-guestinfo").join(key)).ok()
    }

    /// The memory its processes use now (its memory cgroup's usage: anonymous memory and the
    /// page cache it brought in, e.g. its images; binaries shared with other guests count once).
    pub fn memory_bytes(&self) -> Option<u64> {
        let path = Path::new("/sys/fs/cgroup/memory")
            .join(&self.cgroup)
            .join("memory.usage_in_bytes");
        std::fs::read_to_string(path).ok()?.trim().parse().ok()
    }

    /// Imports an image tarball (OCI layout, e.g. from [`crate::images::BinaryImage::build`]) into
    /// the running guest's containerd as `reference` (`name:tag`), as a user's `ctr images
    /// import` on the VM would: the host's `ctr` talks to the guest's socket through its init's
    /// root (`/proc/<init>/root/run/containerd/containerd.sock`) and streams the tarball to it.
    pub fn import_image(&self, reference: &str, tarball: &Path) -> Result<()> {
        let init = self.init_pid().ok_or_else(|| {
            Error::NodeSetup(format!(
                "guest {}: not running, cannot import {reference}",
                self.name
            ))
        })?;
        let socket = PathBuf::from(format!("/proc/{init}/root/run/containerd/containerd.sock"));
        import_image(&socket, reference, tarball)
    }

    /// The host's id of the guest's PID 1 (its init): the child `unshare --fork` started.
    fn init_pid(&self) -> Option<u32> {
        let unshare = self.process.as_ref()?.id();
        let children = std::fs::read_to_string(format!("/proc/{unshare}/task/{unshare}/children")).ok()?;
        children.split_whitespace().next()?.parse().ok()
    }

    /// Whether its init still runs.
    pub fn is_running(&mut self) -> bool {
        self.process.as_mut().is_some_and(|p| p.check_running().is_ok())
    }

    /// Its network namespace: [`interfaces_in`] it gives the guest's network interfaces and
    /// addresses (what a guest agent reports), without holding the guest.
    pub fn network_namespace(&self) -> &str {
        &self.netns
    }
}

/// The network interfaces but loopback of network namespace `netns` (a guest's, see
/// [`Guest::network_namespace`]), with the addresses they have now.
pub fn interfaces_in(netns: &str) -> Result<Vec<GuestNic>> {
    let json = setup_output(
        Command::new("ip").args(["netns", "exec", netns, "ip", "-json", "addr", "show"]),
        "ip",
        &format!("reading the addresses in network namespace {netns}"),
    )?;
    Ok(parse_interfaces(&json))
}

/// Interfaces but loopback from `ip -json addr show`.
fn parse_interfaces(json: &[u8]) -> Vec<GuestNic> {
    let links: Vec<serde_json::Value> = serde_json::from_slice(json).unwrap_or_default();
    links
        .iter()
        .filter(|link| link["link_type"].as_str() != Some("loopback"))
        .map(|link| GuestNic {
            name: link["ifname"].as_str().unwrap_or_default().to_owned(),
            mac: link["address"].as_str().unwrap_or_default().to_owned(),
            addresses: link["addr_info"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|a| {
                    let ip = a["local"].as_str()?.parse().ok()?;
                    let prefix = u8::try_from(a["prefixlen"].as_u64()?).ok()?;
                    Some((ip, prefix))
                })
                .collect(),
        })
        .collect()
}

impl Drop for Guest {
    fn drop(&mut self) {
        if let Some(mut process) = self.process.take() {
            // SIGKILL to unshare; --kill-child ends the guest's PID 1 and with it every process
            // of its PID namespace.
            process.stop();
        }
        remove_node_resources(&self.state);
        // The overlay's scaffolding (its mount point and work folder); the disk stays.
        for scaffolding in ["disk-work", "root"] {
            let _ = std::fs::remove_dir_all(self.dir.join(scaffolding));
        }
    }
}

impl Guest {
    /// The disk's bulk of the powered-off guest whose files are in `dir` (containerd's images
    /// and snapshots, kubelet's folder; powering off removed the rest but the disk's writes),
    /// for a VM that was deleted; its writes under `disk/`, its logs among them, stay.
    pub fn discard_disk(dir: &Path) {
        for bulk in ["containerd", "kubelet"] {
            let _ = std::fs::remove_dir_all(dir.join(bulk));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubernetes_layers_are_listed_oldest_first_by_version_number() {
        let out = tempfile::tempdir().unwrap();
        let rootfs = out.path().join("rootfs");
        for version in ["v1.34.4", "v1.100.0", "v1.9.11"] {
            std::fs::create_dir_all(out.path().join("kubernetes").join(version)).unwrap();
        }
        std::fs::write(out.path().join("kubernetes").join("notes"), "a file, not a layer").unwrap();

        assert_eq!(kubernetes_layers(&rootfs), ["v1.9.11", "v1.34.4", "v1.100.0"]);
    }

    #[test]
    fn the_load_balancer_checks_every_backend_for_a_ready_api_server() {
        let config = load_balancer_config(
            Ipv4Addr::new(10, 203, 7, 2),
            6443,
            [Ipv4Addr::new(10, 203, 7, 100), Ipv4Addr::new(10, 203, 7, 101)].into_iter(),
        );
        assert!(config.contains("bind 10.203.7.2:6443"), "{config}");
        assert!(config.contains("option httpchk GET /readyz"), "{config}");
        assert!(config.contains("check check-ssl verify none"), "{config}");
        assert!(
            config.contains("server 10.203.7.100 10.203.7.100:6443\n"),
            "{config}"
        );
        assert!(
            config.contains("server 10.203.7.101 10.203.7.101:6443\n"),
            "{config}"
        );
    }

    #[test]
    fn interfaces_come_from_ip_json_without_loopback() {
        let json = br#"[
            {"ifname":"lo","link_type":"loopback","address":"00:00:00:00:00:00",
             "addr_info":[{"family":"inet","local":"127.0.0.1","prefixlen":8}]},
            {"ifname":"ens18","link_type":"ether","address":"bc:24:11:00:00:01",
             "addr_info":[{"family":"inet","local":"10.203.4.120","prefixlen":24},
                          {"family":"inet","local":"10.203.4.2","prefixlen":32},
                          {"family":"inet6","local":"fe80::1","prefixlen":64}]}]"#;
        let nics = parse_interfaces(json);
        assert_eq!(nics.len(), 1);
        assert_eq!(nics[0].name, "ens18");
        assert_eq!(nics[0].mac, "bc:24:11:00:00:01");
        assert_eq!(
            nics[0].addresses,
            vec![
                ("10.203.4.120".parse().unwrap(), 24),
                ("10.203.4.2".parse().unwrap(), 32),
                ("fe80::1".parse().unwrap(), 64)
            ]
        );
    }
}
