//! The README's "run it" command works: `banlieue-dev --once` brings the whole local
//! environment up (control plane, CRDs, simulator, Provider, the Proxmox provider and the banlieue
//! controller, which must still run after two seconds) and prints how to use it. The controller
//! binaries are built next to `banlieue-dev` by `cargo test --workspace` (or `tests/dev.sh`).

use std::process::Command;

#[test]
fn banlieue_dev_once_starts_everything_and_prints_the_kubeconfig() {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    let output = Command::new(env!("CARGO_BIN_EXE_banlieue-dev"))
        .args(["--once", "--kubeconfig"])
        .arg(&kubeconfig)
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "banlieue-dev --once failed:\n{stdout}\n{stderr}"
    );
    assert!(stdout.contains("banlieue local environment is up"), "{stdout}");
    assert!(
        stdout.contains(&format!("export KUBECONFIG={}", kubeconfig.display())),
        "{stdout}"
    );
    assert!(
        stderr.contains("registering the simulator as Provider pve-sim"),
        "{stderr}"
    );
    assert!(
        stderr.contains("CAPI CRDs"),
        "CAPI's CRDs were not installed:\n{stderr}"
    );
    for controller in ["banlieue-proxmox", "banlieue"] {
        assert!(
            stderr.contains(&format!("starting {controller}")),
            "{controller} was not started:\n{stderr}"
        );
        assert!(
            dir.path()
                .join("logs")
                .join(format!("{controller}.log"))
                .is_file(),
            "no log for {controller}"
        );
    }
    let written = std::fs::read_to_string(&kubeconfig).unwrap();
    assert!(written.contains("server: https://127."), "{written}");
}
