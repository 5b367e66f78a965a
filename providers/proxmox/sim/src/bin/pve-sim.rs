//! `pve-sim`: run the Proxmox VE simulator until Ctrl-C.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use banlieue_pve_sim::{SimConfig, TemplateSpec};
use clap::Parser;

/// A Proxmox VE 9.1 API simulator (HTTPS on 127.0.0.1).
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// Port on 127.0.0.1 (0 = any free port).
    #[arg(long, default_value_t = 8006, env = "PVE_SIM_PORT")]
    port: u16,
    /// Number of nodes (pve1..pveN).
    #[arg(long, default_value_t = 3)]
    nodes: usize,
    /// Seed for faults, MACs, uuids and credentials.
    #[arg(long, default_value_t = 0x5eed)]
    seed: u64,
    /// Zero-delay tasks, no agent delay, no auth-failure delay (overridden by the flags below).
    #[arg(long)]
    fast: bool,
    /// Default task duration in milliseconds.
    #[arg(long)]
    task_ms: Option<u64>,
    /// Per task type duration, e.g. `qmclone=5000` (repeatable).
    #[arg(long = "task", value_parser = parse_task)]
    tasks: Vec<(String, u64)>,
    /// Guest-agent delay after start, milliseconds.
    #[arg(long)]
    agent_delay_ms: Option<u64>,
    /// Delay before 401 answers, milliseconds.
    #[arg(long)]
    auth_delay_ms: Option<u64>,
    /// Path to pve-api-schema-9.1.json (default: $PVE_API_SCHEMA, else the repository's copy in
    /// providers/proxmox/sim/schema).
    #[arg(long)]
    schema: Option<PathBuf>,
    /// Fixed token secret (default: derived from the seed).
    #[arg(long, env = "PVE_SIM_TOKEN_SECRET", hide_env_values = true)]
    token_secret: Option<String>,
}

fn parse_task(s: &str) -> Result<(String, u64), String> {
    let (k, v) = s
        .split_once('=')
        .ok_or_else(|| format!("expected TYPE=MS, got {s:?}"))?;
    Ok((
        k.to_owned(),
        v.parse().map_err(|e| format!("bad milliseconds in {s:?}: {e}"))?,
    ))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(
            std::io::IsTerminal::is_terminal(&std::io::stderr())
                && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty()),
        )
        .init();
    let mut cfg = if args.fast {
        SimConfig::fast()
    } else {
        SimConfig::default()
    };
    anyhow::ensure!(args.nodes >= 1, "--nodes must be at least 1");
    cfg.nodes = (1..=args.nodes).map(|i| format!("pve{i}")).collect();
    cfg.templates = vec![TemplateSpec::ubuntu(&cfg.nodes[0])];
    cfg.port = args.port;
    cfg.seed = args.seed;
    cfg.schema_path = args.schema;
    cfg.token_secret = args.token_secret;
    if let Some(ms) = args.task_ms {
        cfg.task_duration = Duration::from_millis(ms);
        cfg.task_durations.clear();
    }
    for (kind, ms) in args.tasks {
        cfg.task_durations.insert(kind, Duration::from_millis(ms));
    }
    if let Some(ms) = args.agent_delay_ms {
        cfg.agent_delay = Duration::from_millis(ms);
    }
    if let Some(ms) = args.auth_delay_ms {
        cfg.auth_failure_delay = Duration::from_millis(ms);
    }
    let sim = banlieue_pve_sim::start(cfg)
        .await
        .context("starting the simulator")?;
    println!("url:         {}/api2/json", sim.url());
    println!("fingerprint: {}", sim.fingerprint_sha256());
    println!("token id:    {}", sim.token_id());
    println!("token:       {}", sim.token_secret());
    println!("user:        {}", sim.username());
    println!("password:    {}", sim.password());
    println!(
        "admin:       {}/_sim/{{faults,tickets/expire,vms,tasks,seed/VMID}} (token auth)",
        sim.url()
    );
    println!("CA certificate:\n{}", sim.ca_pem());
    tokio::signal::ctrl_c().await.context("waiting for Ctrl-C")?;
    sim.shutdown().await;
    Ok(())
}
