//! The banlieue kinds read well with the machine's `kubectl` against the real apiserver
//! (the validation table and the examples are checked by `banlieue-api`'s `tests/apiserver.rs`).

use banlieue_testenv::TestEnv;

#[tokio::test]
async fn kubectl_explains_and_lists_banlieue_kinds() -> anyhow::Result<()> {
    let env = TestEnv::shared().await?;
    env.install_crds(&banlieue_api::crds::all()).await?;

    // The apiserver publishes a new CRD's OpenAPI schema a moment after it is Established; until
    // then `kubectl explain` cannot find the resource. Wait for it (bounded), then assert.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let explain = loop {
        let explain = env
            .kubectl()
            .args(["explain", "virtualmachines.spec.memoryMiB"])
            .output()?;
        if explain.status.success() || std::time::Instant::now() > deadline {
            break explain;
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    };
    let text = String::from_utf8_lossy(&explain.stdout);
    assert!(
        explain.status.success(),
        "kubectl explain failed: {}",
        String::from_utf8_lossy(&explain.stderr)
    );
    assert!(
        text.contains("memoryMiB"),
        "kubectl explain printed no field docs:\n{text}"
    );
    assert!(
        text.contains("MiB"),
        "kubectl explain printed no description:\n{text}"
    );

    // A cluster-scoped banlieue object applied with kubectl shows up under the `banlieue` category.
    let example = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../examples/virtualmachineclass.yaml"
    );
    let apply = env
        .kubectl()
        .args(["apply", "--server-side", "-f", example])
        .output()?;
    assert!(
        apply.status.success(),
        "kubectl apply failed: {}",
        String::from_utf8_lossy(&apply.stderr)
    );
    let get = env
        .kubectl()
        .args(["get", "banlieue", "--all-namespaces", "-o", "name"])
        .output()?;
    let listed = String::from_utf8_lossy(&get.stdout);
    assert!(
        get.status.success(),
        "`kubectl get banlieue` (the CRD category) failed: {}",
        String::from_utf8_lossy(&get.stderr)
    );
    assert!(
        listed.contains("virtualmachineclass.banlieue.io/"),
        "`kubectl get banlieue` does not list the applied VirtualMachineClass:\n{listed}"
    );
    Ok(())
}
