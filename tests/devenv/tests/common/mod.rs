//! Helpers shared by the end-to-end test binaries (`e2e.rs`: Proxmox, `e2e_backends.rs`:
//! libvirt and vSphere).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use banlieue_testenv::TestEnv;

/// Upper bound for one expected transition (debug builds on 2 shared cores).
pub const WAIT: Duration = Duration::from_secs(90);

/// The control plane of this test binary (no CAPI CRDs: standalone mode), with banlieue's CRDs.
pub async fn env() -> anyhow::Result<&'static TestEnv> {
    Ok(TestEnv::shared_with(|b| b.crds(banlieue_api::crds::all())).await?)
}

/// The executable process `pid` runs once it has exec'd into `name` (it starts as `setpriv`,
/// which execs `env`, which execs the binary); the last one seen after 10 s otherwise.
pub async fn executable(pid: u32, name: &str) -> anyhow::Result<PathBuf> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let exe = std::fs::read_link(format!("/proc/{pid}/exe"))
            .with_context(|| format!("reading /proc/{pid}/exe"))?;
        if exe.ends_with(name) || tokio::time::Instant::now() > deadline {
            return Ok(exe);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
