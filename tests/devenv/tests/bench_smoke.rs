//! The fleet benchmark (`examples/e2e-bench/`) at a small N, as CI's smoke run of it: every
//! VirtualMachine becomes Running and Ready, each VM is cloned exactly once, nothing is written
//! or asked of Proxmox while idle but Lease renewals, and the JSON it writes holds the figures the
//! README's table is made of; its CAPI scenario brings a few Machines of a MachineDeployment to
//! provisioned through CAPI's core manager, each cloned once, in at most 5 provider writes; and
//! its vSphere and libvirt runs bring a few VirtualMachines to Ready on vcsim (the bench playing
//! their guests) and on libvirt's test driver. No timing is asserted (the figures are the benchmark's, see
//! `controllers/README.md#benchmark`). `cargo test` builds the example next to this test.

use std::process::Command;

/// Runs the benchmark's `scenario` on `backend` at `n`; what it printed and the JSON it wrote.
fn run_bench(scenario: &str, backend: &str, n: usize) -> (String, serde_json::Value) {
    let bench = banlieue_dev::binary_dir().unwrap().join("examples/e2e-bench");
    assert!(
        bench.is_file(),
        "{} is missing: `cargo test -p banlieue-dev` builds it (or `cargo build -p banlieue-dev \
         --example e2e-bench`)",
        bench.display()
    );
    let dir = tempfile::tempdir().unwrap();
    let json_path = dir.path().join("run.json");
    let output = Command::new(&bench)
        .arg(n.to_string())
        .env("BENCH_SCENARIO", scenario)
        .env("BENCH_BACKEND", backend)
        .env("BENCH_IDLE_SECS", "2")
        .env("BENCH_JSON", &json_path)
        .env_remove("BENCH_SIM")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the benchmark failed:\n{stdout}\n{stderr}"
    );
    let run = serde_json::from_slice(&std::fs::read(&json_path).unwrap()).unwrap();
    (stdout, run)
}

#[test]
fn the_fleet_benchmark_runs_at_a_small_n_and_reports_its_figures() {
    let n = 4;
    let (stdout, run) = run_bench("standalone", "proxmox", n);
    assert!(stdout.contains("all Running and Ready after"), "{stdout}");
    assert_eq!(run["n"], n, "{run:#}");
    assert_eq!(run["simulator"], "instant", "{run:#}");
    let clones = &run["proxmox_calls_per_vm_by_endpoint"]["POST /nodes/{node}/qemu/{vmid}/clone"];
    assert_eq!(clones.as_f64(), Some(1.0), "each VM cloned exactly once: {run:#}");
    let writes = run["api_writes_per_vm"].as_f64().unwrap();
    assert!(
        (3.0..40.0).contains(&writes),
        "API writes per VM counted from the API server's metrics: {writes}"
    );
    assert_eq!(
        run["idle"]["proxmox_calls_per_minute"].as_f64(),
        Some(0.0),
        "no Proxmox call while idle: {run:#}"
    );
    for key in [
        "floor",
        "provider",
        "controller",
        "to_ready_seconds",
        "api_writes_per_vm_by_verb_and_resource",
    ] {
        assert!(!run[key].is_null(), "{key} is missing: {run:#}");
    }
}

#[test]
fn the_fleet_benchmarks_capi_scenario_provisions_machines_through_capi() {
    let m = 3;
    let (stdout, run) = run_bench("capi", "proxmox", m);
    assert!(
        stdout.contains("all Machines' infrastructure provisioned after"),
        "{stdout}"
    );
    assert_eq!(run["m"], m, "{run:#}");
    let clones = &run["proxmox_calls_per_machine_by_endpoint"]["POST /nodes/{node}/qemu/{vmid}/clone"];
    assert_eq!(
        clones.as_f64(),
        Some(1.0),
        "each Machine cloned exactly once: {run:#}"
    );
    let provider_writes = run["provider_writes_per_machine"].as_f64().unwrap();
    assert!(
        (1.0..=5.0).contains(&provider_writes),
        "the provider's writes per CAPI Machine, counted by its metrics: {provider_writes} (the fleet target is at most 5)"
    );
    assert_eq!(
        run["idle"]["proxmox_calls_per_minute"].as_f64(),
        Some(0.0),
        "no Proxmox call while idle: {run:#}"
    );
    for key in [
        "floor",
        "provider",
        "capi_manager",
        "to_provisioned_seconds",
        "api_writes_per_machine_by_verb_and_resource",
    ] {
        assert!(!run[key].is_null(), "{key} is missing: {run:#}");
    }
}

#[test]
fn the_fleet_benchmark_runs_on_vcsim_playing_the_guests() {
    let n = 3;
    let (stdout, run) = run_bench("standalone", "vsphere", n);
    assert!(stdout.contains("all Running and Ready after"), "{stdout}");
    assert_eq!(run["n"], n, "{run:#}");
    let writes = run["api_writes_per_vm"].as_f64().unwrap();
    assert!(
        (3.0..40.0).contains(&writes),
        "API writes per VM counted from the API server's metrics: {writes}"
    );
    assert!(
        run["guest_to_ready_seconds"]["max"].as_f64().is_some(),
        "each VM's time from its played guest to Ready: {run:#}"
    );
    for key in [
        "floor",
        "provider",
        "controller",
        "to_ready_seconds",
        "guest_to_ready_seconds",
    ] {
        assert!(!run[key].is_null(), "{key} is missing: {run:#}");
    }
}

#[test]
fn the_fleet_benchmark_runs_on_libvirts_test_driver() {
    let n = 3;
    let (stdout, run) = run_bench("standalone", "libvirt", n);
    assert!(stdout.contains("all Running and Ready after"), "{stdout}");
    assert_eq!(run["n"], n, "{run:#}");
    assert_eq!(run["backend"], "libvirt (test driver)", "{run:#}");
    let writes = run["api_writes_per_vm"].as_f64().unwrap();
    assert!(
        (3.0..40.0).contains(&writes),
        "API writes per VM counted from the API server's metrics: {writes}"
    );
    for key in ["floor", "provider", "controller", "to_ready_seconds"] {
        assert!(!run[key].is_null(), "{key} is missing: {run:#}");
    }
}
