//! `banlieue`: the banlieue command line.

use std::io::Write;

use anyhow::Context;
use clap::{Parser, Subcommand};

/// banlieue: hypervisor-neutral virtual machines and Cluster API infrastructure providers.
#[derive(Debug, Parser)]
#[command(name = "banlieue", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Print every banlieue CustomResourceDefinition as multi-document YAML
    /// (`banlieue crds | kubectl apply -f -`).
    Crds,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Crds => {
            let yaml = banlieue_controllers::all_crds_yaml()?;
            std::io::stdout()
                .lock()
                .write_all(yaml.as_bytes())
                .context("writing CRDs to stdout")?;
        }
    }
    Ok(())
}
