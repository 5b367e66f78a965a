//! `banlieue crds` prints exactly the committed `config/crd/*.yaml`, in `crds::all()` order.

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Runs the `banlieue` binary with `args`, killing it after 30 s; returns (success, stdout).
fn banlieue(args: &[&str]) -> (bool, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_banlieue"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("banlieue starts");
    let mut stdout = child.stdout.take().expect("piped stdout");
    let reader = std::thread::spawn(move || {
        let mut out = String::new();
        stdout.read_to_string(&mut out).map(|_| out)
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait works") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("banlieue {args:?} did not finish within 30 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    (
        status.success(),
        reader.join().expect("reader thread").expect("stdout is UTF-8"),
    )
}

#[test]
fn crds_subcommand_prints_the_committed_yaml_and_the_admission_policies() {
    let (ok, out) = banlieue(&["crds"]);
    assert!(ok);
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/crd");
    let mut expected = String::new();
    for crd in banlieue_api::crds::all() {
        expected.push_str("---\n");
        expected.push_str(
            &std::fs::read_to_string(dir.join(banlieue_api::crds::file_name(&crd)))
                .expect("committed CRD file"),
        );
    }
    expected.push_str(&banlieue_controllers::admission_policies_yaml().expect("renders"));
    assert!(
        out == expected,
        "`banlieue crds` differs from config/crd (regenerate it)"
    );
}

#[test]
fn unknown_subcommand_fails() {
    let (ok, out) = banlieue(&["no-such-command"]);
    assert!(!ok);
    assert!(out.is_empty());
}
