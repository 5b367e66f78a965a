//! The READMEs' clusterctl blocks, run as written with the real clusterctl (v1.14.2, built by
//! `tests/controlplane/build.sh`, whose `--clusterctl` option each block's first line runs):
//! every fenced `sh` block after a `<!-- readme-test: NAME -->` marker in `README.md` and
//! `clusterctl/README.md` is a bash script run from the repository root with a private HOME. Only
//! two things are replaced: `cargo run -p banlieue-clusterctl --` by this crate's binary (cargo is
//! already running this test) and the documented `…` placeholders by example values.
//!
//! `generate-before-init` runs with no management cluster at all (KUBECONFIG names a missing
//! file); the install blocks then run, in README order, against a fresh harness control plane
//! with nothing installed (no cert-manager either: the offline configuration brings its own).

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, Result, bail, ensure};
use banlieue_testenv::TestEnv;

const CARGO_RUN: &str = "cargo run -p banlieue-clusterctl --";
/// An example SHA-256 fingerprint, colon-separated as openssl prints it.
macro_rules! fingerprint {
    () => {
        "AB:CD:EF:01:23:45:67:89:AB:CD:EF:01:23:45:67:89:AB:CD:EF:01:23:45:67:89:AB:CD:EF:01:23:45:67:89"
    };
}
const FINGERPRINT: &str = fingerprint!();
/// The README's placeholders and what the test puts there.
const PLACEHOLDERS: [(&str, &str); 3] = [
    (
        "PROXMOX_SECRET=…",
        "PROXMOX_SECRET=8e1f1c0a-0000-4000-8000-000000000001",
    ),
    ("VSPHERE_PASSWORD=…", "VSPHERE_PASSWORD=not-a-real-password"),
    (
        "PROXMOX_TLS_FINGERPRINT=AB:CD:…",
        concat!("PROXMOX_TLS_FINGERPRINT=", fingerprint!()),
    ),
];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// `block` with the binary for `cargo run` and example values for the placeholders; any other
/// `…` outside a comment is an error (the README grew a placeholder this test does not know).
fn script(file: &str, name: &str) -> Result<String> {
    let mut text = banlieue_testenv::readme::block(&root(), file, name)?
        .replace(CARGO_RUN, env!("CARGO_BIN_EXE_banlieue-clusterctl"));
    for (placeholder, value) in PLACEHOLDERS {
        text = text.replace(placeholder, value);
    }
    for line in text.lines() {
        let code = line.split(" #").next().unwrap_or_default();
        ensure!(
            !code.contains('…'),
            "{file} {name}: unknown placeholder in {line:?}"
        );
    }
    Ok(text)
}

/// How a block starts: in a new shell, or continuing the shell of an earlier block that put
/// clusterctl on PATH.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Shell {
    New,
    Continued,
}

/// Runs a README block with bash (`-euo pipefail`) from the repository root.
fn run_block(file: &str, name: &str, shell: Shell, home: &Path, kubeconfig: &Path) -> Result<String> {
    let script = script(file, name)?;
    let mut cmd = banlieue_testenv::readme::bash(&root(), &script, home, 300, shell == Shell::Continued)?;
    cmd.env("KUBECONFIG", kubeconfig);
    let output = banlieue_testenv::run_with_timeout(&mut cmd, Duration::from_secs(330))
        .with_context(|| format!("running {file} block {name}"))?;
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    if !output.status.success() {
        bail!(
            "{file} block {name} failed ({}):\n--- script\n{script}\n--- stdout\n{stdout}\n--- stderr\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(stdout)
}

fn kubectl_json(env: &TestEnv, args: &[&str]) -> Result<serde_json::Value> {
    let output = env
        .kubectl()
        .args(args)
        .args(["-o", "json"])
        .output()
        .with_context(|| format!("kubectl {args:?}"))?;
    ensure!(
        output.status.success(),
        "kubectl {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(serde_json::from_slice(&output.stdout)?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_clusterctl_blocks_work_as_written() -> Result<()> {
    let env = TestEnv::shared().await?;
    let home = env.workdir().join("readme-home");
    std::fs::create_dir_all(&home)?;

    // Before init, with no management cluster: the provider's version and a namespace suffice.
    let stdout = run_block(
        "clusterctl/README.md",
        "generate-before-init",
        Shell::New,
        &home,
        &home.join("no-such-kubeconfig"),
    )?;
    assert!(stdout.contains("PROXMOX_TLS_FINGERPRINT"), "{stdout}");
    let demo = std::fs::read_to_string(root().join("demo.yaml")).context("demo.yaml written")?;
    std::fs::remove_file(root().join("demo.yaml"))?;
    assert!(
        demo.contains("kind: ClusterClass") && demo.contains("name: demo"),
        "{demo}"
    );
    assert!(demo.contains("sha256Fingerprint: null"), "{demo}");
    let offline = home.join(".cluster-api/banlieue/clusterctl-offline.yaml");
    assert!(offline.is_file(), "repository wrote {}", offline.display());

    // Install, generate and apply on a fresh control plane.
    run_block(
        "README.md",
        "install-proxmox",
        Shell::New,
        &home,
        env.admin().path(),
    )?;
    let inventory = kubectl_json(env, &["get", "providers.clusterctl.cluster.x-k8s.io", "-A"])?;
    let installed: Vec<String> = inventory["items"]
        .as_array()
        .context("items")?
        .iter()
        .filter_map(|p| p["metadata"]["name"].as_str().map(str::to_owned))
        .collect();
    for provider in [
        "cluster-api",
        "bootstrap-kubeadm",
        "control-plane-kubeadm",
        "infrastructure-banlieue-proxmox",
    ] {
        assert!(
            installed.iter().any(|p| p == provider),
            "{provider}: {installed:?}"
        );
    }
    let cluster = kubectl_json(env, &["get", "proxmoxcluster", "demo", "-n", "default"])?;
    assert_eq!(
        cluster["spec"]["tls"]["sha256Fingerprint"], FINGERPRINT,
        "the README's fingerprint pins the API: {cluster}"
    );
    assert_eq!(cluster["spec"]["tls"]["insecureSkipVerify"], false);
    let secret = kubectl_json(
        env,
        &[
            "get",
            "secret",
            "banlieue-proxmox-credentials",
            "-n",
            "banlieue-proxmox-system",
        ],
    )?;
    assert_eq!(
        secret["metadata"]["annotations"][banlieue_api::ALLOWED_ENDPOINTS_ANNOTATION],
        cluster["spec"]["endpoint"],
        "the credentials go to the endpoint the generated cluster names, and only there"
    );
    kubectl_json(env, &["get", "cluster.cluster.x-k8s.io", "demo", "-n", "default"])?;
    kubectl_json(env, &["get", "namespace", "banlieue-system"])?;

    // The default (no fingerprint variable) is no pin: the field is nullable, so it is kept as
    // null, which CEL (`has()`) and the provider's Option read as unset; verification stays on.
    let preview = env.workdir().join("demo-clusterclass.yaml");
    std::fs::write(&preview, &demo)?;
    let applied = kubectl_json(
        env,
        &[
            "apply",
            "--server-side",
            "--dry-run=server",
            "-n",
            "default",
            "-f",
            preview.to_str().context("path")?,
        ],
    )?;
    let template = applied["items"]
        .as_array()
        .context("items")?
        .iter()
        .find(|o| o["kind"] == "ProxmoxClusterTemplate")
        .context("a ProxmoxClusterTemplate")?;
    let tls: banlieue_api::common::TlsTrust =
        serde_json::from_value(template["spec"]["template"]["spec"]["tls"].clone())?;
    assert_eq!(tls.sha256_fingerprint, None, "{template}");
    assert_eq!(tls.insecure_skip_verify, Some(false), "{template}");

    run_block(
        "clusterctl/README.md",
        "install-libvirt-vsphere",
        Shell::Continued,
        &home,
        env.admin().path(),
    )?;
    let inventory = kubectl_json(env, &["get", "providers.clusterctl.cluster.x-k8s.io", "-A"])?;
    let text = inventory.to_string();
    for provider in [
        "infrastructure-banlieue-libvirt",
        "infrastructure-banlieue-vsphere",
    ] {
        assert!(text.contains(provider), "{provider}: {text}");
    }
    Ok(())
}
