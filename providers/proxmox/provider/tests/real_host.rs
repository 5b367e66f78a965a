//! The real-host check: the shared scenario suite (provision, scale, delete, pause, a missing
//! template, bad credentials, restarts mid-provisioning) run by the provider's controllers
//! against a **real Proxmox VE**, on the test control plane. Skipped unless
//! `BANLIEUE_PVE_ENDPOINT` is set (see `real_host/real_pve.rs` for the other variables and the
//! provider's README for the command). It prints the VMs each scenario created and deletes any
//! it left behind.
//!
//! The same suite runs in CI against the simulator through exactly the same code
//! (`on_the_simulator`), so the check itself is known to work before someone points it at a
//! real cluster.

#[path = "real_host/real_pve.rs"]
mod real_pve;

use anyhow::Result;
use banlieue_scenarios::{Access, MachineHint, ProviderUnderTest, Template, Vm};
use real_pve::{RealHost, RealPve};
use serde_json::Value;

/// Each scenario on the real host, or a line saying why it was skipped.
macro_rules! on_a_real_host {
    ($($scenario:ident),+ $(,)?) => {
        mod on_a_real_host {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $scenario() -> Result<()> {
                    if RealHost::from_env()?.is_none() {
                        eprintln!(
                            "skipped: set BANLIEUE_PVE_ENDPOINT, BANLIEUE_PVE_TOKEN_ID, \
                             BANLIEUE_PVE_TOKEN_SECRET and BANLIEUE_PVE_TEMPLATE_VMID to run \
                             the scenarios on a real Proxmox VE"
                        );
                        return Ok(());
                    }
                    banlieue_scenarios::scenarios::$scenario::<RealPve>().await
                }
            )+
        }
    };
}

on_a_real_host!(
    provision,
    scale,
    delete,
    pause,
    bad_template,
    bad_credentials,
    crash_restart
);

banlieue_scenarios::scenario_tests!(
    SimAsRealHost: provision,
    scale,
    delete,
    pause,
    bad_template,
    bad_credentials,
    crash_restart,
);

/// The simulator given to the real-host check as if it were a real cluster (endpoint, token,
/// fingerprint, template VMID): the check's own code path, proven in CI.
pub struct SimAsRealHost {
    host: RealPve,
    sim: banlieue_pve_sim::SimHandle,
}

impl ProviderUnderTest for SimAsRealHost {
    const NAME: &'static str = "pvesim";
    const CLUSTER_KIND: &'static str = RealPve::CLUSTER_KIND;
    const MACHINE_KIND: &'static str = RealPve::MACHINE_KIND;
    const PROVIDER_ID_PREFIX: &'static str = RealPve::PROVIDER_ID_PREFIX;
    const BAD_TEMPLATE_REASON: &'static str = RealPve::BAD_TEMPLATE_REASON;
    const MISSING_TEMPLATE: &'static str = RealPve::MISSING_TEMPLATE;
    const BAD_ACCESS_REASONS: &'static [&'static str] = RealPve::BAD_ACCESS_REASONS;
    const OUTAGE_MESSAGE: &'static str = RealPve::OUTAGE_MESSAGE;
    const PROVISIONING_WRITES: usize = RealPve::PROVISIONING_WRITES;
    const NETWORK: &'static str = RealPve::NETWORK;

    async fn setup(kube: kube::Client, ns: &str) -> Result<Self> {
        let mut config = banlieue_pve_sim::SimConfig::fast();
        // As on most multi-node clusters: the template's disks on storage every node reaches.
        for storage in &mut config.storages {
            storage.shared |= storage.id == "local-lvm";
        }
        let sim = banlieue_pve_sim::start(config).await?;
        let host = RealHost {
            endpoint: sim.url(),
            token_id: sim.token_id(),
            token_secret: sim.token_secret(),
            fingerprint: Some(sim.fingerprint_sha256()),
            template_vmid: 9000,
            nodes: None,
            seed_storage: "local".into(),
        };
        Ok(Self {
            host: RealPve::with_host(kube, ns, host).await?,
            sim,
        })
    }

    fn failure_domains(&self) -> Vec<String> {
        self.host.failure_domains()
    }

    async fn cluster_spec(&self, access: Access) -> Result<Value> {
        self.host.cluster_spec(access).await
    }

    fn machine_spec(&self, template: Template) -> Value {
        self.host.machine_spec(template)
    }

    fn start(&mut self) {
        self.host.start();
    }

    async fn stop(&mut self) {
        self.host.stop().await;
    }

    async fn vms(&self, machines: &[MachineHint]) -> Result<Vec<Vm>> {
        self.host.vms(machines).await
    }

    async fn slow_down(&self) -> Result<()> {
        // Slower than the instant simulator, as a real cluster is, so restarts land mid-way.
        self.sim.faults().add(banlieue_pve_sim::FaultRule::latency(
            std::time::Duration::from_millis(40),
        ))?;
        Ok(())
    }

    async fn outage(&self, down: bool) -> Result<()> {
        self.host.outage(down).await
    }

    fn secrets(&self) -> Vec<String> {
        self.host.secrets()
    }
}
