//! The README's "run it" command works: `banlieue-dev --once` brings the whole local
//! environment up (control plane, CRDs, simulator, Provider, the Proxmox provider and the banlieue
//! controller, which must still run after two seconds) and prints how to use it. The controller
//! binaries are built next to `banlieue-dev` by `cargo test --workspace` (or `tests/dev.sh`).
//!
//! The walk-through runs `tests/dev.sh` itself, as a newcomer does, in a mount namespace where
//! the `shared/` reference folder that sits beside the engineers' and CI's clones is hidden, so
//! it proves that a clone of this repository alone is enough.

use std::path::Path;
use std::process::{Command, Output};

fn run_once(kubeconfig: &Path) -> (Output, String, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_banlieue-dev"))
        .args(["--once", "--kubeconfig"])
        .arg(kubeconfig)
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(
        output.status.success(),
        "banlieue-dev --once failed:\n{stdout}\n{stderr}"
    );
    (output, stdout, stderr)
}

#[test]
fn banlieue_dev_once_starts_everything_and_prints_the_kubeconfig() {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    let (_, stdout, stderr) = run_once(&kubeconfig);
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
        stderr.contains("installing 17 CAPI CRDs from "),
        "CAPI's CRDs (all but clusterctl's two) were not installed:\n{stderr}"
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

    // A second start keeps the first start's logs; logs written to a file carry no colour codes.
    let first = std::fs::read_to_string(dir.path().join("logs/banlieue.log")).unwrap();
    run_once(&kubeconfig);
    for controller in ["banlieue-proxmox", "banlieue"] {
        let logs = dir.path().join("logs");
        let kept = std::fs::read_to_string(logs.join(format!("{controller}.log.1")))
            .unwrap_or_else(|e| panic!("{controller}: the first start's log was not kept: {e}"));
        let current = std::fs::read_to_string(logs.join(format!("{controller}.log"))).unwrap();
        assert!(!current.is_empty() && !kept.is_empty(), "{controller}: empty log");
        for text in [&kept, &current] {
            assert!(
                !text.contains('\u{1b}'),
                "{controller}: colour codes in a log file:\n{text}"
            );
        }
    }
    assert_eq!(
        std::fs::read_to_string(dir.path().join("logs/banlieue.log.1")).unwrap(),
        first
    );
}

/// A command that runs `tests/dev.sh args…` from the repository root with every `shared/`
/// folder near the repository hidden by an empty tmpfs in a private mount namespace (needs root,
/// as CI and the README's set-up run). Where there is no such folder, it runs `tests/dev.sh`
/// as it is.
fn dev_sh_without_shared(root: &Path, args: &[&str]) -> Command {
    let root = root.canonicalize().unwrap();
    let mut hidden: Vec<String> = root
        .ancestors()
        .flat_map(|dir| [dir.join("shared"), dir.join("../shared")])
        .filter(|d| d.is_dir())
        .filter_map(|d| d.canonicalize().ok())
        .map(|d| d.display().to_string())
        .collect();
    hidden.sort();
    hidden.dedup();
    let mut script = String::from("set -e\n");
    for dir in &hidden {
        script.push_str(&format!(
            "mount -t tmpfs -o ro,size=4k banlieue-no-shared '{dir}'\n"
        ));
    }
    script.push_str("exec bash tests/dev.sh \"$@\"\n");
    let mut command = Command::new("unshare");
    command
        .args([
            "--mount",
            "--propagation",
            "private",
            "--",
            "bash",
            "-c",
            &script,
            "dev.sh",
        ])
        .args(args)
        .current_dir(&root);
    command
}

/// The README's walk-through from a clone with nothing beside it: `tests/dev.sh` running (with
/// `shared/` hidden), the example VirtualMachine applied with kubectl reaches Ready end to end
/// (real provider and controller processes, simulator), the progress is printed, and Ctrl-C
/// (SIGINT) stops every controller cleanly (SIGTERM first).
#[test]
fn the_example_virtual_machine_reaches_ready_and_ctrl_c_stops_everything() {
    use std::time::{Duration, Instant};

    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    let stderr_path = dir.path().join("stderr.log");
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
    let kubeconfig_arg = kubeconfig.display().to_string();
    let mut dev = dev_sh_without_shared(
        Path::new(root),
        &[
            "--task-ms",
            "20",
            "--agent-ms",
            "200",
            "--kubeconfig",
            &kubeconfig_arg,
        ],
    )
    .stdout(std::process::Stdio::null())
    .stderr(std::fs::File::create(&stderr_path).unwrap())
    .spawn()
    .unwrap();
    let stderr = || std::fs::read_to_string(&stderr_path).unwrap_or_default();
    let wait_for = |what: &str, limit: Duration, dev: &mut std::process::Child| {
        let deadline = Instant::now() + limit;
        while !stderr().contains(what) {
            if let Some(status) = dev.try_wait().unwrap() {
                panic!("banlieue-dev exited ({status}) before {what:?}:\n{}", stderr());
            }
            if Instant::now() > deadline {
                let _ = dev.kill();
                panic!("no {what:?} after {limit:?}:\n{}", stderr());
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    };
    // tests/dev.sh finds everything built (by `cargo test`), so it only checks and starts.
    wait_for("starting banlieue (log:", Duration::from_secs(300), &mut dev);
    assert!(
        stderr().contains("installing 17 CAPI CRDs from "),
        "CAPI's CRDs from the repository were not installed:\n{}",
        stderr()
    );
    let kubectl = |args: &[&str]| {
        let out = Command::new(std::env::var("BANLIEUE_KUBECTL").unwrap_or_else(|_| "kubectl".into()))
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(args)
            .current_dir(root)
            .output()
            .unwrap();
        (
            out.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    };
    let (ok, out) = kubectl(&["apply", "-f", "tests/devenv/examples/vm-on-sim.yaml"]);
    assert!(ok, "kubectl apply: {out}");
    let (ok, out) = kubectl(&[
        "wait",
        "--for=condition=Ready",
        "virtualmachine/hello",
        "--timeout=120s",
    ]);
    if !ok {
        let _ = dev.kill();
        panic!("kubectl wait: {out}\n{}", stderr());
    }
    // The progress lines: provisioning steps, then Running with an address.
    wait_for(
        "VirtualMachine default/hello: Running, Ready=True",
        Duration::from_secs(10),
        &mut dev,
    );
    assert!(
        stderr().contains("VirtualMachine default/hello: Provisioning"),
        "{}",
        stderr()
    );

    let status = Command::new("kill")
        .args(["-INT", &dev.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let deadline = Instant::now() + Duration::from_secs(60);
    let exit = loop {
        if let Some(exit) = dev.try_wait().unwrap() {
            break exit;
        }
        if Instant::now() > deadline {
            let _ = dev.kill();
            panic!("banlieue-dev did not stop after SIGINT:\n{}", stderr());
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let text = stderr();
    assert!(exit.success(), "banlieue-dev exit {exit}:\n{text}");
    for controller in ["banlieue-proxmox", "banlieue"] {
        assert!(
            text.contains(&format!("] {controller} stopped")),
            "{controller} did not stop on SIGTERM:\n{text}"
        );
    }
}
