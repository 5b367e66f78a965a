//! End to end for the libvirt and vSphere providers (issues #8 and #9: "usable through the
//! banlieue controller with no change to the controller"): the real control plane (standalone
//! mode, no CAPI CRDs), the real provider (`banlieue-libvirt`, `banlieue-vsphere`) and the real
//! `banlieue controller`, each started from its own binary as its own process by
//! [`banlieue_dev::start_controller`], and a cluster-scoped banlieue `Provider` whose
//! `spec.backend` is `libvirt` or `vsphere`. The test only talks to the API server (as a user
//! would) and looks at the hypervisor (as its admin would):
//!
//! - vSphere: a vcsim started by the test (the vSphere client's test helper), looked at with
//!   `banlieue-vsphere-client`. vcsim has no VMware Tools, so the test plays them: once the
//!   clone waits for its guest it sets the guest IP through vcsim's `SET.guest.ipAddress`.
//! - libvirt: the running libvirtd at `qemu:///system` (`providers/libvirt/ci/start-libvirtd.sh`,
//!   network `banlieue-test`, pool `default`), looked at with `virsh`. The guest is the libvirt
//!   provider's tiny TCG guest (Debian kernel + busybox initramfs, `tests/guest/build.sh`); its
//!   user data (from the VirtualMachine's Secret) loads the ACPI button and evdev modules and
//!   starts busybox `acpid`, so the provider's ACPI shutdown really powers it off. Without a
//!   daemon the libvirt test prints `SKIPPED` and passes, unless `CI` is set.
//!
//! Per backend: create a VirtualMachine → the infra machine created by the controller with a
//! controlling ownerReference to it, the infra cluster `banlieue-<Provider>` owned by the
//! Provider → the VirtualMachine `Ready`/`Running` with the providerID and the guest's address
//! mirrored → `spec.powerState: Off` → the hypervisor VM off, the VirtualMachine `Stopped`
//! (vSphere: `On` again → running and `Ready`, same VM) → delete → the hypervisor VM (and its
//! volumes) gone, the finalizer released, no infra machine left.
//!
//! Run: `cargo build -p banlieue-controllers -p banlieue-libvirt -p banlieue-vsphere && cargo test
//! -p banlieue-dev --test e2e_backends`.

#[path = "../../../providers/vsphere/client/tests/support/vcsim.rs"]
mod vcsim_support;

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use banlieue_api::banlieue::{Provider, VirtualMachine, VirtualMachinePhase};
use banlieue_api::common::PowerState;
use banlieue_api::condition;
use banlieue_api::infrastructure::{LibvirtCluster, LibvirtMachine, VSphereCluster, VSphereMachine};
use banlieue_api::standalone::infra_cluster_name;
use banlieue_dev::BANLIEUE;
use banlieue_testenv::{ManagedProcess, TestEnv, TestNamespace};
use banlieue_vsphere_client::vim::ConfigSpec;
use banlieue_vsphere_client::{MoRef, VmPowerState};
use base64::Engine as _;
use common::{env, executable};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::serde::de::DeserializeOwned;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, Resource, ResourceExt};
use serde_json::{Value, json};
use vcsim_support::{PASSWORD, USER, Vcsim};

const LIBVIRT_PROVIDER: &str = "banlieue-libvirt";
const VSPHERE_PROVIDER: &str = "banlieue-vsphere";

/// One backend's world: a namespace, a banlieue Provider, the provider and controller
/// processes (restricted to the namespace).
struct Stack {
    env: &'static TestEnv,
    ns: TestNamespace,
    client: Client,
    provider: String,
    provider_binary: &'static str,
    logs: PathBuf,
    processes: Vec<(&'static str, ManagedProcess)>,
    /// Upper bound for one expected transition.
    wait: Duration,
}

impl Stack {
    async fn new(prefix: &str, provider_binary: &'static str, wait: Duration) -> anyhow::Result<Self> {
        let env = env().await?;
        let ns = env.namespace(prefix).await?;
        let client = env.client().await?;
        let provider = format!("{ns}-p");
        let logs = env.workdir().join("logs").join(ns.name());
        Ok(Self {
            env,
            ns,
            client,
            provider,
            provider_binary,
            logs,
            processes: Vec::new(),
            wait,
        })
    }

    /// Creates the cluster-scoped Provider with `spec`.
    async fn create_provider(&self, spec: Value) -> anyhow::Result<Provider> {
        let provider: Provider = serde_json::from_value(json!({
            "apiVersion": "banlieue.io/v1alpha1", "kind": "Provider",
            "metadata": {"name": self.provider}, "spec": spec,
        }))?;
        Ok(Api::<Provider>::all(self.client.clone())
            .create(&PostParams::default(), &provider)
            .await?)
    }

    /// Starts the provider (with `extra` flags) and the banlieue controller, each from its own
    /// binary, and checks they are two processes running those binaries.
    async fn start_processes(&mut self, extra: &[&str]) -> anyhow::Result<()> {
        // Every provider takes banlieue-provider-runtime's flags, as the Proxmox one does.
        let mut args = banlieue_dev::controller_args(banlieue_dev::PROXMOX_PROVIDER).to_vec();
        args.extend(extra);
        let provider = self.launch(self.provider_binary, &args)?;
        let controller = self.launch(BANLIEUE, banlieue_dev::controller_args(BANLIEUE))?;
        let (provider_pid, controller_pid) = (provider.id(), controller.id());
        self.processes.push((self.provider_binary, provider));
        self.processes.push((BANLIEUE, controller));
        ensure!(provider_pid != controller_pid && provider_pid != std::process::id());
        for (pid, name) in [(provider_pid, self.provider_binary), (controller_pid, BANLIEUE)] {
            let exe = executable(pid, name).await?;
            ensure!(exe.ends_with(name), "process {pid} runs {}", exe.display());
        }
        Ok(())
    }

    fn launch(&self, name: &str, args: &[&str]) -> anyhow::Result<ManagedProcess> {
        let mut args = args.to_vec();
        args.extend(["--namespace", self.ns.name()]);
        banlieue_dev::start_controller(
            &banlieue_dev::binary_dir()?,
            name,
            &args,
            self.env.admin().path(),
            &self.logs,
        )
        .with_context(|| {
            format!(
                "build the binaries first: cargo build -p banlieue-controllers -p {}",
                self.provider_binary
            )
        })
    }

    /// The end of every process's log, for failure messages.
    fn log_tails(&self) -> String {
        let mut out = String::new();
        for (name, _) in &self.processes {
            let text = std::fs::read_to_string(self.logs.join(format!("{name}.log"))).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            out.push_str(&format!(
                "--- {name} ---\n{}\n",
                lines[lines.len().saturating_sub(15)..].join("\n")
            ));
        }
        out
    }

    fn vms(&self) -> Api<VirtualMachine> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    fn api<K>(&self) -> Api<K>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
            + Clone
            + DeserializeOwned
            + std::fmt::Debug,
    {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    async fn create_secret(&self, name: &str, data: Value) -> anyhow::Result<()> {
        let secret: Secret = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "stringData": data,
        }))?;
        Api::<Secret>::namespaced(self.client.clone(), &self.ns)
            .create(&PostParams::default(), &secret)
            .await?;
        Ok(())
    }

    async fn create_vm(&self, name: &str, spec: Value) -> anyhow::Result<VirtualMachine> {
        let mut spec = spec;
        spec["providerRef"] = json!({"name": self.provider});
        let vm: VirtualMachine = serde_json::from_value(json!({
            "apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine",
            "metadata": {"name": name}, "spec": spec,
        }))?;
        Ok(self.vms().create(&PostParams::default(), &vm).await?)
    }

    /// Polls `probe` every 250 ms until it returns `Some`; on timeout fails with `what`, the
    /// VirtualMachines' status and the processes' logs.
    async fn eventually<T, F, Fut>(&self, what: &str, mut probe: F) -> anyhow::Result<T>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = anyhow::Result<Option<T>>>,
    {
        let deadline = tokio::time::Instant::now() + self.wait;
        loop {
            if let Some(v) = probe().await? {
                return Ok(v);
            }
            if tokio::time::Instant::now() > deadline {
                let vms = self.vms().list(&ListParams::default()).await.ok().map(|l| {
                    l.items
                        .iter()
                        .map(|v| format!("{}: {:?}", v.name_any(), v.status))
                        .collect::<Vec<_>>()
                });
                bail!(
                    "timed out after {:?} waiting for {what}\nVirtualMachines: {vms:#?}\n{}",
                    self.wait,
                    self.log_tails()
                );
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// The infra machine of VirtualMachine `vm`, once the controller has created it: same name,
    /// controlling ownerReference to the VirtualMachine.
    async fn wait_infra_machine<K>(&self, vm: &VirtualMachine) -> anyhow::Result<K>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
            + Clone
            + DeserializeOwned
            + std::fmt::Debug,
    {
        let name = vm.name_any();
        let machine: K = self
            .eventually(&format!("the {} {name}", K::kind(&())), || async {
                Ok(self.api::<K>().get_opt(&name).await?)
            })
            .await?;
        let owner = machine
            .meta()
            .owner_references
            .iter()
            .flatten()
            .find(|o| o.controller == Some(true))
            .with_context(|| format!("{} {name} has no controller ownerReference", K::kind(&())))?;
        ensure!(
            owner.kind == "VirtualMachine"
                && owner.api_version == "banlieue.io/v1alpha1"
                && owner.name == name
                && Some(&owner.uid) == vm.metadata.uid.as_ref()
                && owner.block_owner_deletion == Some(true),
            "{owner:?}"
        );
        Ok(machine)
    }

    /// The infra cluster `banlieue-<Provider>` exists, controlled by the Provider.
    async fn check_infra_cluster<K>(&self, provider: &Provider) -> anyhow::Result<()>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
            + Clone
            + DeserializeOwned
            + std::fmt::Debug,
    {
        let clusters = self.api::<K>().list(&ListParams::default()).await?.items;
        ensure!(clusters.len() == 1, "one {}: {clusters:?}", K::kind(&()));
        ensure!(clusters[0].name_any() == infra_cluster_name(&self.provider));
        let owner = clusters[0]
            .meta()
            .owner_references
            .iter()
            .flatten()
            .find(|o| o.controller == Some(true))
            .context("the infra cluster has no controller ownerReference")?;
        ensure!(
            owner.kind == "Provider" && Some(&owner.uid) == provider.metadata.uid.as_ref(),
            "{owner:?}"
        );
        Ok(())
    }

    async fn wait_ready(&self, name: &str) -> anyhow::Result<VirtualMachine> {
        self.eventually(&format!("VirtualMachine {name} Ready and Running"), || async {
            let vm = self.vms().get(name).await?;
            let ready = vm.status.as_ref().is_some_and(|s| {
                condition::is_true(&s.conditions, condition::READY)
                    && s.phase == Some(VirtualMachinePhase::Running)
            });
            Ok(ready.then_some(vm))
        })
        .await
    }

    /// Sets the VirtualMachine's `spec.powerState`.
    async fn set_power(&self, name: &str, power: &str) -> anyhow::Result<()> {
        self.vms()
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"powerState": power}})),
            )
            .await?;
        Ok(())
    }

    /// The VirtualMachine shows the power-off: phase `Stopped`, `status.powerState: Off`.
    async fn wait_stopped(&self, name: &str) -> anyhow::Result<()> {
        self.eventually(&format!("VirtualMachine {name} Stopped"), || async {
            let vm = self.vms().get(name).await?;
            let stopped = vm.status.as_ref().is_some_and(|s| {
                s.phase == Some(VirtualMachinePhase::Stopped) && s.power_state == Some(PowerState::Off)
            });
            Ok(stopped.then_some(()))
        })
        .await
    }

    /// Deletes VirtualMachine `name` and waits until it is gone (its finalizer released).
    async fn delete_vm(&self, name: &str) -> anyhow::Result<()> {
        self.vms().delete(name, &DeleteParams::background()).await?;
        self.eventually(&format!("VirtualMachine {name} gone"), || async {
            Ok(self.vms().get_opt(name).await?.is_none().then_some(()))
        })
        .await
    }

    /// Checks the processes still run, then stops them (SIGTERM) and deletes the Provider.
    async fn stop(mut self) -> anyhow::Result<()> {
        let mut died = Vec::new();
        for (name, p) in &mut self.processes {
            if p.check_running().is_err() {
                died.push(*name);
            }
            banlieue_dev::terminate(p, Duration::from_secs(10));
        }
        let _ = Api::<Provider>::all(self.client.clone())
            .delete(&self.provider, &DeleteParams::default())
            .await;
        ensure!(
            died.is_empty(),
            "exited during the test: {died:?}\n{}",
            self.log_tails()
        );
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// vSphere

const TEMPLATE: &str = "DC0_C0_RP0_VM0";
const GUEST_IP: &str = "192.0.2.41";

#[tokio::test]
async fn vsphere_virtual_machine_through_the_banlieue_controller() -> anyhow::Result<()> {
    let sim = Vcsim::start(&[])?;
    let vc = sim.client()?;
    // vcsim's model VM becomes the template.
    let model = sim.make_template(&vc, TEMPLATE).await?;

    let mut s = Stack::new("e2e-vsphere", VSPHERE_PROVIDER, common::WAIT).await?;
    s.create_secret("vc-creds", json!({"username": USER, "password": PASSWORD}))
        .await?;
    let provider = s
        .create_provider(json!({
            "backend": "vsphere",
            "endpoint": sim.url,
            "credentialsRef": {"name": "vc-creds", "namespace": s.ns.name()},
            "tls": {"sha256Fingerprint": sim.thumbprint},
            "defaults": {"datacenter": "DC0", "storage": "LocalDS_0", "resourcePool": "DC0_C0/Resources"},
        }))
        .await?;
    s.start_processes(&[]).await?;

    let user_data = "#cloud-config\nruncmd:\n  - [echo, e2e-vsphere-user-data]\n";
    s.create_secret("web-user-data", json!({"value": user_data}))
        .await?;
    let vm = s
        .create_vm(
            "web",
            json!({"source": {"vsphere": {"template": TEMPLATE}}, "cpu": {"cores": 2}, "memoryMiB": 2048,
                   "userDataSecretRef": {"name": "web-user-data"}}),
        )
        .await?;

    // The controller creates the VSphereMachine (owned by the VirtualMachine) and the
    // VSphereCluster (owned by the Provider); the provider clones and waits for the guest.
    let machine: VSphereMachine = s.wait_infra_machine(&vm).await?;
    assert_eq!(
        machine.spec.datacenter.as_deref(),
        Some("DC0"),
        "Provider default"
    );
    s.check_infra_cluster::<VSphereCluster>(&provider).await?;
    let vm_ref = s
        .eventually("the clone waiting for its guest", || async {
            let m = s.api::<VSphereMachine>().get("web").await?;
            let st = m.status.as_ref();
            let waiting = st
                .and_then(|st| st.provisioning.as_ref())
                .is_some_and(|p| p.state.as_str() == "WaitingForGuest");
            Ok(waiting.then(|| st.and_then(|st| st.vm_ref.clone())).flatten())
        })
        .await?;
    let vm_moref = MoRef::new("VirtualMachine", vm_ref);
    let info = vc
        .vm_info(&vm_moref)
        .await?
        .context("the clone is not in vcsim")?;
    let owner_uid = machine.metadata.uid.clone().context("machine uid")?;
    assert_eq!(
        info.extra_config.get("guestinfo.banlieue.owner-uid"),
        Some(&owner_uid),
        "the clone carries the machine's UID"
    );
    let delivered = base64::engine::general_purpose::STANDARD.decode(
        info.extra_config
            .get("guestinfo.userdata")
            .context("no guestinfo.userdata on the clone")?,
    )?;
    assert_eq!(
        delivered,
        user_data.as_bytes(),
        "the VirtualMachine's user data reached the VM"
    );
    assert_eq!(info.power_state, Some(VmPowerState::PoweredOn));
    assert_eq!((info.num_cpu, info.memory_mb), (Some(2), Some(2048)));

    // Meanwhile the VirtualMachine mirrors the provider's progress.
    s.eventually(
        "the VirtualMachine Provisioning, waiting for its guest",
        || async {
            let vm = s.vms().get("web").await?;
            let mirrored = vm.status.as_ref().is_some_and(|st| {
                st.phase == Some(VirtualMachinePhase::Provisioning)
                    && st.conditions.iter().any(|c| {
                        c.type_ == condition::READY && c.status == "False" && c.reason == "WaitingForGuest"
                    })
            });
            Ok(mirrored.then_some(()))
        },
    )
    .await?;

    // VMware Tools (played through vcsim) reports the guest's address, and the guest publishes
    // cloud-init's report.
    let set_ip = ConfigSpec {
        extra_config: vec![
            ("SET.guest.ipAddress".into(), GUEST_IP.into()),
            banlieue_vsphere::guest_report::published_done(),
        ],
        ..ConfigSpec::default()
    };
    vc.wait_task(
        &vc.reconfigure(&vm_moref, &set_ip).await?,
        Duration::from_millis(100),
        Duration::from_secs(30),
    )
    .await?;
    let vm = s.wait_ready("web").await?;
    let status = vm.status.as_ref().context("status")?;
    let bios_uuid = info.bios_uuid.clone().context("no BIOS UUID in vcsim")?;
    assert_eq!(status.provider_id, Some(format!("vsphere://{bios_uuid}")));
    assert!(
        status.addresses.iter().any(|a| a.address == GUEST_IP),
        "{GUEST_IP} in {:?}",
        status.addresses
    );
    assert_eq!(status.provider.as_deref(), Some(s.provider.as_str()));
    assert_eq!(status.power_state, Some(PowerState::On));
    assert_eq!(
        status.infrastructure_ref.as_ref().map(|r| r.kind.as_str()),
        Some("VSphereMachine")
    );

    // Power off: the vcsim VM is powered off and the VirtualMachine shows it.
    s.set_power("web", "Off").await?;
    s.eventually("the vcsim VM powered off", || async {
        let power = vc.vm_info(&vm_moref).await?.and_then(|i| i.power_state);
        Ok((power == Some(VmPowerState::PoweredOff)).then_some(()))
    })
    .await?;
    s.wait_stopped("web").await?;
    assert_eq!(
        vc.find_vms_by_extra_config("guestinfo.banlieue.owner-uid", &owner_uid)
            .await?
            .len(),
        1,
        "powered off in place, not re-cloned"
    );

    // And on again: the same vcsim VM runs, the VirtualMachine is Running and Ready.
    s.set_power("web", "On").await?;
    s.eventually("the vcsim VM powered on again", || async {
        let power = vc.vm_info(&vm_moref).await?.and_then(|i| i.power_state);
        Ok((power == Some(VmPowerState::PoweredOn)).then_some(()))
    })
    .await?;
    let vm = s.wait_ready("web").await?;
    assert_eq!(
        vm.status.as_ref().and_then(|st| st.power_state),
        Some(PowerState::On)
    );

    // Delete: the vcsim VM destroyed, the finalizer released, nothing left.
    s.delete_vm("web").await?;
    assert!(vc.vm_info(&vm_moref).await?.is_none(), "the VM is still in vcsim");
    assert_eq!(
        vc.find_vms_by_extra_config("guestinfo.banlieue.owner-uid", &owner_uid)
            .await?,
        Vec::<MoRef>::new(),
        "orphan VMs in vcsim"
    );
    assert!(
        s.api::<VSphereMachine>()
            .list(&ListParams::default())
            .await?
            .items
            .is_empty(),
        "a VSphereMachine was left"
    );
    let template = vc.vm_info(&model).await?.context("the template is gone")?;
    assert!(template.template, "the template was left alone");
    s.stop().await
}

// ---------------------------------------------------------------------------------------------
// libvirt

const LIBVIRT_URI: &str = "qemu:///system";
const POOL: &str = "default";
const NETWORK: &str = "banlieue-test";
const BASE_VOLUME: &str = "banlieue-test-base.qcow2";
const BOOT_DIR: &str = "/var/lib/libvirt/boot/banlieue-e2e";
const SERIAL_DIR: &str = "/var/log/libvirt/qemu";

/// `virsh -c qemu:///system ARGS`: stdout on success, the error otherwise.
fn virsh(args: &[&str]) -> anyhow::Result<String> {
    let mut cmd = Command::new("virsh");
    cmd.args(["-c", LIBVIRT_URI]).args(args);
    let out = banlieue_testenv::run_with_timeout(&mut cmd, Duration::from_secs(60))?;
    ensure!(
        out.status.success(),
        "virsh {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// The kernel `tests/guest/build.sh` boots (the newest `/boot/vmlinuz-*`) and its modules folder.
fn guest_kernel_modules() -> anyhow::Result<PathBuf> {
    let version = std::fs::read_dir("/boot")?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter_map(|n| n.strip_prefix("vmlinuz-").map(str::to_owned))
        .max()
        .context("no /boot/vmlinuz-*: install linux-image-amd64")?;
    Ok(Path::new("/lib/modules").join(version))
}

/// The guest's user data: a script (the tiny guest runs user data starting with `#!`) that prints
/// `token`, then loads the ACPI power button and evdev modules (carried inline: the guest's
/// initramfs has neither) and starts busybox `acpid`, whose power-button action powers the guest
/// off. So the provider's ACPI shutdown works as on a real distribution.
fn guest_user_data(token: &str) -> anyhow::Result<String> {
    let modules = guest_kernel_modules()?;
    let mut script = format!("#!/bin/sh\necho \"BANLIEUE e2e user-data {token}\"\nmkdir -p /tmp/ko\n");
    for (name, path) in [
        ("evdev", "kernel/drivers/input/evdev.ko"),
        ("button", "kernel/drivers/acpi/button.ko"),
    ] {
        let bytes = std::fs::read(modules.join(path)).with_context(|| format!("reading {path}"))?;
        let encoded = base64::engine::general_purpose::STANDARD.encode(bytes);
        script.push_str(&format!("base64 -d > /tmp/ko/{name}.ko <<'EOF'\n"));
        for line in encoded.as_bytes().chunks(76) {
            script.push_str(std::str::from_utf8(line)?);
            script.push('\n');
        }
        script.push_str(&format!("EOF\ninsmod /tmp/ko/{name}.ko\n"));
    }
    script.push_str(concat!(
        "for _ in $(seq 1 50); do [ -e /dev/input/event0 ] && break; sleep 0.1; done\n",
        "mkdir -p /etc/acpi/PWRF /var/log /var/run\n",
        "printf '#!/bin/sh\\necho \"BANLIEUE power button\" > /dev/console\\nsync\\npoweroff -f\\n' ",
        "> /etc/acpi/PWRF/00000080\n",
        "chmod +x /etc/acpi/PWRF/00000080\n",
        "acpid -l /tmp/acpid.log && echo \"BANLIEUE acpid up\"\n",
    ));
    Ok(script)
}

/// Whether a libvirt daemon answers; without one the test is skipped (failed under CI).
fn libvirtd_available() -> bool {
    match virsh(&["uri"]) {
        Ok(_) => true,
        Err(e) if std::env::var_os("CI").is_some() => {
            panic!("libvirtd must run under CI (providers/libvirt/ci/start-libvirtd.sh): {e}")
        }
        Err(e) => {
            eprintln!(
                "SKIPPED: no libvirt daemon at {LIBVIRT_URI} ({e}); run providers/libvirt/ci/start-libvirtd.sh"
            );
            false
        }
    }
}

#[tokio::test]
async fn libvirt_virtual_machine_through_the_banlieue_controller() -> anyhow::Result<()> {
    if !libvirtd_available() {
        return Ok(());
    }
    let build = Command::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../providers/libvirt/tests/guest/build.sh"
    ))
    .arg(BOOT_DIR)
    .status()
    .context("running providers/libvirt/tests/guest/build.sh")?;
    ensure!(build.success(), "building the test guest failed");
    if virsh(&["vol-info", "--pool", POOL, BASE_VOLUME]).is_err() {
        virsh(&["vol-create-as", POOL, BASE_VOLUME, "64M", "--format", "qcow2"])?;
    }

    // Booting under TCG on 2 shared cores takes 15-40 s.
    let mut s = Stack::new("e2e-libvirt", LIBVIRT_PROVIDER, Duration::from_secs(150)).await?;
    let provider = s
        .create_provider(json!({
            "backend": "libvirt",
            "endpoint": LIBVIRT_URI,
            "defaults": {"storage": POOL, "network": NETWORK},
        }))
        .await?;
    let kernel = format!("{BOOT_DIR}/vmlinuz");
    let initrd = format!("{BOOT_DIR}/initrd.gz");
    s.start_processes(&[
        "--domain-type",
        "qemu",
        "--kernel",
        &kernel,
        "--initrd",
        &initrd,
        "--cmdline",
        "console=ttyS0 panic=-1",
        "--serial-log-dir",
        SERIAL_DIR,
    ])
    .await?;

    let token = format!("token-{}", s.ns.name());
    s.create_secret("tiny-user-data", json!({"value": guest_user_data(&token)?}))
        .await?;
    let vm = s
        .create_vm(
            "tiny",
            json!({"source": {"libvirt": {"pool": POOL, "volume": BASE_VOLUME}}, "cpu": {"cores": 1},
                   "memoryMiB": 256, "disks": [{"name": "root", "sizeGiB": 1}],
                   "networks": [{"name": "eth0", "network": NETWORK}],
                   "userDataSecretRef": {"name": "tiny-user-data"},
                   // The busybox guest runs its user data itself: no cloud-init, no agent.
                   "readinessChecks": {"skipCloudInit": true}}),
        )
        .await?;
    let domain = format!("{}_tiny", s.ns.name());
    let serial_log = Path::new(SERIAL_DIR).join(format!("{domain}.serial"));
    let result = libvirt_lifecycle(&s, &vm, &provider, &domain, &serial_log, &token).await;
    if result.is_err() {
        // Leave nothing behind on the shared daemon.
        let _ = virsh(&["destroy", &domain]);
        let _ = virsh(&["undefine", &domain]);
        for suffix in ["-root.qcow2", "-seed.iso"] {
            let _ = virsh(&["vol-delete", "--pool", POOL, &format!("{domain}{suffix}")]);
        }
    }
    let _ = std::fs::remove_file(&serial_log);
    let _ = std::fs::remove_file(Path::new(SERIAL_DIR).join(format!("{domain}.log")));
    result?;
    s.stop().await
}

async fn libvirt_lifecycle(
    s: &Stack,
    vm: &VirtualMachine,
    provider: &Provider,
    domain: &str,
    serial_log: &Path,
    token: &str,
) -> anyhow::Result<()> {
    // The controller creates the LibvirtMachine (owned by the VirtualMachine) and the
    // LibvirtCluster (owned by the Provider); the provider defines and boots the domain.
    let machine: LibvirtMachine = s.wait_infra_machine(vm).await?;
    assert_eq!(
        machine.spec.storage_pool.as_deref(),
        Some(POOL),
        "Provider default"
    );
    s.check_infra_cluster::<LibvirtCluster>(provider).await?;
    let uid = machine.metadata.uid.clone().context("machine uid")?;

    let vm = s.wait_ready("tiny").await?;
    let status = vm.status.as_ref().context("status")?;
    assert_eq!(status.provider_id, Some(format!("libvirt://localhost/{uid}")));
    assert_eq!(virsh(&["domuuid", domain])?, uid, "domain uuid = machine UID");
    assert_eq!(virsh(&["domstate", &uid])?, "running");
    let ip = status
        .addresses
        .iter()
        .map(|a| a.address.as_str())
        .find(|a| a.starts_with("10.213.0."))
        .with_context(|| format!("no address on {NETWORK} in {:?}", status.addresses))?
        .to_owned();
    let leases = virsh(&["domifaddr", &uid, "--source", "lease"])?;
    assert!(leases.contains(&ip), "{ip} is the domain's DHCP lease: {leases}");
    assert_eq!(status.provider.as_deref(), Some(s.provider.as_str()));

    // The guest ran the VirtualMachine's user data (and armed its power button).
    s.eventually("the user data run in the guest", || async {
        let log = std::fs::read_to_string(serial_log).unwrap_or_default();
        Ok(
            (log.contains(&format!("BANLIEUE e2e user-data {token}")) && log.contains("BANLIEUE acpid up"))
                .then_some(()),
        )
    })
    .await
    .with_context(|| {
        format!(
            "serial log:\n{}",
            std::fs::read_to_string(serial_log).unwrap_or_default()
        )
    })?;

    // Power off: ACPI shutdown, the guest powers off, the VirtualMachine shows it.
    s.set_power("tiny", "Off").await?;
    s.eventually("the domain shut off", || async {
        Ok((virsh(&["domstate", &uid])? == "shut off").then_some(()))
    })
    .await?;
    s.wait_stopped("tiny").await?;
    let log = std::fs::read_to_string(serial_log).unwrap_or_default();
    assert!(log.contains("BANLIEUE power button"), "serial log:\n{log}");

    // Delete: domain undefined, its volumes deleted, the finalizer released.
    s.delete_vm("tiny").await?;
    assert!(virsh(&["dominfo", &uid]).is_err(), "domain {uid} still defined");
    let volumes = virsh(&["vol-list", "--pool", POOL])?;
    assert!(
        !volumes.contains(domain),
        "volumes of {domain} left in pool {POOL}:\n{volumes}"
    );
    assert!(
        s.api::<LibvirtMachine>()
            .list(&ListParams::default())
            .await?
            .items
            .is_empty(),
        "a LibvirtMachine was left"
    );
    Ok(())
}
