//! Throughput benchmark: starts the simulator in-process with zero-delay tasks and hammers it over
//! HTTPS keep-alive connections with a mixed workload (status/config/list reads, nextid, and
//! start/stop tasks plus task-status polls). Client and server share the machine, so the figure is
//! a lower bound for the simulator alone.
//!
//! `cargo run --release -p banlieue-pve-sim --example sim_bench -- [SECONDS] [CONNECTIONS]`

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use banlieue_pve_sim::SimConfig;
use banlieue_pve_sim::probe::{Probe, encode_segment};
use http::Method;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let seconds: u64 = args
        .next()
        .map(|s| s.parse())
        .transpose()
        .context("SECONDS")?
        .unwrap_or(5);
    let connections: u32 = args
        .next()
        .map(|s| s.parse())
        .transpose()
        .context("CONNECTIONS")?
        .unwrap_or(16);
    let sim = banlieue_pve_sim::start(SimConfig::fast()).await?;
    let ok = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let mut workers = Vec::new();
    for w in 0..connections {
        let mut p = Probe::for_sim(&sim)?;
        let (ok, failed) = (ok.clone(), failed.clone());
        workers.push(tokio::spawn(async move {
            let vmid = (1000 + w).to_string();
            let clone = p
                .call(Method::POST, "/nodes/pve1/qemu/9000/clone", &[("newid", &vmid)])
                .await?;
            anyhow::ensure!(clone.status == 200, "clone failed: {clone:?}");
            let status = format!("/nodes/pve1/qemu/{vmid}/status/current");
            let config = format!("/nodes/pve1/qemu/{vmid}/config");
            let mut i = 0u64;
            while Instant::now() < deadline {
                i += 1;
                let r = match i % 10 {
                    0 => {
                        let action = if (i / 10).is_multiple_of(2) {
                            "start"
                        } else {
                            "stop"
                        };
                        let path = format!("/nodes/pve1/qemu/{vmid}/status/{action}");
                        let r = p.call(Method::POST, &path, &[]).await?;
                        if r.status == 200 { &ok } else { &failed }.fetch_add(1, Ordering::Relaxed);
                        if let Some(upid) = r.data().as_str() {
                            let path = format!("/nodes/pve1/tasks/{}/status", encode_segment(upid));
                            p.call(Method::GET, &path, &[]).await?
                        } else {
                            r
                        }
                    }
                    1 => p.call(Method::GET, "/cluster/nextid", &[]).await?,
                    2 => p.call(Method::GET, "/nodes/pve1/qemu", &[]).await?,
                    3..=5 => p.call(Method::GET, &config, &[]).await?,
                    _ => p.call(Method::GET, &status, &[]).await?,
                };
                if r.status == 200 { &ok } else { &failed }.fetch_add(1, Ordering::Relaxed);
            }
            Ok(())
        }));
    }
    let started = Instant::now();
    for w in workers {
        w.await??;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let ok = ok.load(Ordering::Relaxed);
    let failed = failed.load(Ordering::Relaxed);
    println!(
        "{ok} ok + {failed} failed requests in {elapsed:.2} s over {connections} connections: {:.0} req/s",
        (ok + failed) as f64 / elapsed
    );
    sim.shutdown().await;
    anyhow::ensure!(failed == 0, "{failed} requests failed");
    Ok(())
}
