//! Client throughput against the simulator: `cargo run --release -p banlieue-pve-client --example
//! pve-bench -- [requests] [concurrency]`. Prints requests/s for GET status/current through one
//! shared client (TLS with a pinned fingerprint, token auth, connection pooling).

use std::time::{Duration, Instant};

use banlieue_pve_client::{Client, TlsVerification};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let total: usize = args.next().map_or(Ok(5000), |a| a.parse())?;
    let concurrency: usize = args.next().map_or(Ok(16), |a| a.parse())?;
    let sim = banlieue_pve_sim::start(banlieue_pve_sim::SimConfig::fast()).await?;
    let client = Client::builder(sim.url())
        .token(sim.token_id(), sim.token_secret())
        .tls(TlsVerification::Fingerprint(sim.fingerprint_sha256()))
        .timeout(Duration::from_secs(10))
        .build()?;
    client.version().await?;
    let started = Instant::now();
    let mut workers = tokio::task::JoinSet::new();
    for w in 0..concurrency {
        let client = client.clone();
        let n = total / concurrency + usize::from(w < total % concurrency);
        workers.spawn(async move {
            for _ in 0..n {
                client.vm_status("pve1", 9000).await?;
            }
            Ok::<_, banlieue_pve_client::Error>(n)
        });
    }
    let mut done = 0;
    while let Some(res) = workers.join_next().await {
        done += res??;
    }
    let elapsed = started.elapsed();
    println!(
        "{done} requests, concurrency {concurrency}: {:.2} s, {:.0} requests/s",
        elapsed.as_secs_f64(),
        done as f64 / elapsed.as_secs_f64()
    );
    sim.shutdown().await;
    Ok(())
}
