//! Lifecycle guarantees of the harness: private control planes are isolated from each other,
//! dropping one stops its processes and removes its directory, processes die with the test binary
//! even when never dropped, and an existing cluster can be targeted instead.
//!
//! These tests are about the local processes, so they ignore `BANLIEUE_TEST_KUBECONFIG`.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, ensure};
use banlieue_testenv::{Error, TestEnv, run_with_timeout};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::ResourceExt as _;
use kube::api::{Api, ObjectMeta, PostParams};

const ORPHAN_PIDFILE_ENV_VAR: &str = "BANLIEUE_TESTENV_ORPHAN_PIDFILE";

/// Alive = exists and is not a zombie (a killed child of a dead parent may linger as a zombie
/// until its new parent reaps it; it no longer runs).
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            let state = stat
                .rsplit_once(')')
                .map(|(_, rest)| rest.trim_start())
                .unwrap_or("");
            !(state.starts_with('Z') || state.starts_with('X'))
        }
        Err(_) => false,
    }
}

fn wait_until_dead(pids: &[u32], timeout: Duration) -> Vec<u32> {
    let deadline = Instant::now() + timeout;
    loop {
        let living: Vec<u32> = pids.iter().copied().filter(|pid| alive(*pid)).collect();
        if living.is_empty() || Instant::now() > deadline {
            return living;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn private() -> banlieue_testenv::TestEnvBuilder {
    TestEnv::builder().allow_external(false)
}

#[tokio::test]
async fn private_environments_are_isolated_and_cleaned_up_on_drop() -> Result<()> {
    let (a, b) = tokio::join!(
        private().controller_manager(false).start(),
        private().controller_manager(false).start()
    );
    let (a, b) = (a?, b?);
    assert_ne!(a.server(), b.server());
    assert_ne!(a.workdir(), b.workdir());
    for env in [&a, &b] {
        let names: Vec<_> = env.process_ids().into_iter().map(|(name, _)| name).collect();
        assert_eq!(
            names,
            ["etcd", "kube-apiserver"],
            "no controller-manager was asked for"
        );
        assert!(
            !env.log_tail("kube-apiserver", 5).is_empty(),
            "the apiserver logs to its file"
        );
    }

    let created = Api::<Namespace>::all(a.client().await?)
        .create(
            &PostParams::default(),
            &Namespace {
                metadata: ObjectMeta {
                    name: Some("only-in-a".into()),
                    ..ObjectMeta::default()
                },
                ..Namespace::default()
            },
        )
        .await?;
    assert!(created.metadata.uid.is_some());
    let in_b = Api::<Namespace>::all(b.client().await?)
        .get_opt("only-in-a")
        .await?;
    assert!(in_b.is_none(), "environments share state");
    // One environment's credentials are not accepted by the other (different CAs).
    let mut cross = a.admin().config().await?;
    cross.cluster_url = b.server().parse()?;
    let cross_client = kube::Client::try_from(cross)?;
    let err = Api::<Namespace>::all(cross_client)
        .list(&Default::default())
        .await;
    assert!(err.is_err(), "A's CA must not validate B's serving certificate");

    let pids: Vec<u32> = a
        .process_ids()
        .into_iter()
        .chain(b.process_ids())
        .map(|(_, pid)| pid)
        .collect();
    assert!(pids.iter().all(|pid| alive(*pid)));
    let dirs: Vec<PathBuf> = [a.workdir().to_owned(), b.workdir().to_owned()].into();
    drop(a);
    drop(b);
    assert_eq!(
        wait_until_dead(&pids, Duration::from_secs(10)),
        Vec::<u32>::new(),
        "processes survived drop"
    );
    if std::env::var_os(banlieue_testenv::KEEP_ENV_VAR).is_none() {
        assert!(
            dirs.iter().all(|d| !d.exists()),
            "scratch directories survived drop: {dirs:?}"
        );
    }
    Ok(())
}

/// Run by [`processes_die_with_the_test_binary_even_when_never_dropped`] in a child test process:
/// starts a control plane, records its pids, leaks it (as a static shared instance is never
/// dropped) and fails.
#[tokio::test]
#[ignore = "helper: run in a child process by processes_die_with_the_test_binary_even_when_never_dropped"]
async fn orphan_helper() {
    let Some(pidfile) = std::env::var_os(ORPHAN_PIDFILE_ENV_VAR) else {
        return;
    };
    let env = private().start().await.expect("control plane starts");
    let pids: Vec<String> = env
        .process_ids()
        .into_iter()
        .map(|(_, pid)| pid.to_string())
        .collect();
    std::fs::write(
        &pidfile,
        format!("{}\n{}\n", pids.join(" "), env.workdir().display()),
    )
    .expect("pidfile");
    std::mem::forget(env);
    panic!("deliberate failure with a leaked control plane");
}

#[test]
fn processes_die_with_the_test_binary_even_when_never_dropped() -> Result<()> {
    let pidfile = std::env::temp_dir().join(format!("banlieue-testenv-orphan-{}.pids", std::process::id()));
    let _ = std::fs::remove_file(&pidfile);
    let mut child = std::process::Command::new(std::env::current_exe()?);
    child
        .args([
            "orphan_helper",
            "--exact",
            "--include-ignored",
            "--test-threads=1",
        ])
        .env(ORPHAN_PIDFILE_ENV_VAR, &pidfile);
    let output = run_with_timeout(&mut child, Duration::from_secs(300))?;
    let contents = std::fs::read_to_string(&pidfile).with_context(|| {
        format!(
            "the helper wrote no pidfile; its output:\n{}\n{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )
    })?;
    std::fs::remove_file(&pidfile)?;
    ensure!(!output.status.success(), "the helper was expected to panic");
    let mut lines = contents.lines();
    let pids: Vec<u32> = lines
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .map(str::parse)
        .collect::<Result<_, _>>()?;
    let workdir = Path::new(lines.next().unwrap_or_default());
    ensure!(
        pids.len() == 3,
        "expected etcd, kube-apiserver and kube-controller-manager pids: {contents}"
    );
    let survivors = wait_until_dead(&pids, Duration::from_secs(10));
    ensure!(
        survivors.is_empty(),
        "processes {survivors:?} outlived their test binary"
    );
    // Its directory could not be removed by the dead binary; the next environment removes it.
    ensure!(workdir.exists() || std::env::var_os(banlieue_testenv::KEEP_ENV_VAR).is_none());
    Ok(())
}

#[tokio::test]
async fn an_existing_cluster_can_be_targeted_instead() -> Result<()> {
    let local = private().controller_manager(false).start().await?;
    let external = private().existing_cluster(local.admin().path()).start().await?;
    assert!(external.is_external());
    assert!(
        external.process_ids().is_empty(),
        "nothing is started for an existing cluster"
    );
    assert_eq!(external.server().trim_end_matches('/'), local.server());

    let ns = external.namespace("ext").await?;
    let local_namespaces: Api<Namespace> = Api::all(local.client().await?);
    let seen = local_namespaces.get(&ns).await?;
    assert_eq!(
        seen.labels()
            .get(banlieue_testenv::NAMESPACE_LABEL)
            .map(String::as_str),
        Some("true")
    );

    // Service-account kubeconfigs work against any cluster; client certificates need our CA.
    let robot = external.service_account_kubeconfig(&ns, "robot").await?;
    Api::<ConfigMap>::namespaced(robot.client().await?, &ns)
        .list(&Default::default())
        .await
        .expect_err("an unbound service account is forbidden");
    assert!(matches!(
        external.user_kubeconfig("alice", &[]),
        Err(Error::Unsupported { .. })
    ));

    // Against an existing cluster, a test namespace is deleted when it drops (this control plane
    // runs no namespace controller, so it stays Terminating with a deletion timestamp).
    let name = ns.to_string();
    drop(ns);
    let after = local_namespaces.get_opt(&name).await?;
    assert!(
        after.is_none_or(|n| n.metadata.deletion_timestamp.is_some()),
        "namespace {name} was not deleted"
    );

    // The local process of the first environment is untouched by dropping the second.
    drop(external);
    local.check_processes()?;
    Ok(())
}
