//! Test support (feature `testing`): the operations check every provider binary must pass — it
//! serves `/healthz`, `/readyz` and `/metrics`, and with `--leader-elect` only one of two
//! processes runs the controllers, the other taking over when the first stops with SIGTERM.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context as _, ensure};
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;

use crate::http;

const WAIT: Duration = Duration::from_secs(60);

/// One provider process with its endpoint addresses; killed when dropped.
#[derive(Debug)]
pub struct Instance {
    child: Child,
    /// Address of `/metrics`.
    pub metrics: SocketAddr,
    /// Address of `/healthz` and `/readyz`.
    pub health: SocketAddr,
    /// Its stdout and stderr.
    pub log: PathBuf,
}

fn free_addr() -> anyhow::Result<SocketAddr> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?)
}

impl Instance {
    /// Starts `bin` as candidate `identity` (`$POD_NAME`) with the runtime flags (namespace,
    /// leader election in `namespace`, loopback endpoints, text logs) and `extra` flags.
    pub fn start(
        bin: &Path,
        kubeconfig: &Path,
        namespace: &str,
        identity: &str,
        extra: &[&str],
    ) -> anyhow::Result<Self> {
        let (metrics, health) = (free_addr()?, free_addr()?);
        let log = std::env::temp_dir().join(format!(
            "{}-{identity}-{}.log",
            bin.file_name().and_then(|n| n.to_str()).unwrap_or("provider"),
            std::process::id()
        ));
        let out = std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let child = Command::new(bin)
            .args(["--namespace", namespace, "--leader-elect"])
            .args(["--leader-election-namespace", namespace])
            .arg(format!("--metrics-bind-address={metrics}"))
            .arg(format!("--health-probe-bind-address={health}"))
            .args(["--log-format", "text"])
            .args(extra)
            .env("KUBECONFIG", kubeconfig)
            .env("POD_NAME", identity)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        Ok(Self {
            child,
            metrics,
            health,
            log,
        })
    }

    /// `GET path` on the probe (`/healthz`, `/readyz`) or metrics (`/metrics`) address.
    pub async fn get(&self, path: &'static str) -> anyhow::Result<(u16, String)> {
        let addr = if path == "/metrics" {
            self.metrics
        } else {
            self.health
        };
        Ok(tokio::task::spawn_blocking(move || http::get(addr, path)).await??)
    }

    /// The last lines of its log.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    /// Sends SIGTERM and waits (up to a minute) for a clean exit.
    pub async fn terminate(mut self) -> anyhow::Result<()> {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()?;
        ensure!(status.success(), "kill -TERM failed");
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            if let Some(status) = self.child.try_wait()? {
                ensure!(
                    status.success(),
                    "exited with {status} after SIGTERM:\n{}",
                    self.log_tail()
                );
                return Ok(());
            }
            ensure!(
                tokio::time::Instant::now() < deadline,
                "still running a minute after SIGTERM"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Instance {
    /// Kills it with SIGKILL (a crashed Pod, a lost node): its Lease is not released.
    pub fn crash(mut self) -> anyhow::Result<()> {
        self.child.kill()?;
        self.child.wait()?;
        Ok(())
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Polls `f` until it yields `Some` (a minute at most); `what` names the wait in the error.
pub async fn eventually<T, Fut>(what: &str, mut f: impl FnMut() -> Fut) -> anyhow::Result<T>
where
    Fut: Future<Output = anyhow::Result<Option<T>>>,
{
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        if let Some(v) = f().await? {
            return Ok(v);
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "{what}: not within {WAIT:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The value of `controller_runtime_reconcile_total{controller, result="success"}` in a
/// `/metrics` body (0 when absent).
pub fn reconciles(metrics: &str, controller: &str) -> u64 {
    let prefix =
        format!("controller_runtime_reconcile_total{{controller=\"{controller}\",result=\"success\"}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

async fn status(i: &Instance, path: &'static str) -> anyhow::Result<Option<u16>> {
    Ok(i.get(path).await.ok().map(|(s, _)| s))
}

async fn holder(leases: &Api<Lease>, name: &str) -> anyhow::Result<Option<String>> {
    Ok(leases
        .get_opt(name)
        .await?
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity))
}

/// What [`check_operations`] runs.
#[derive(Clone, Copy, Debug)]
pub struct Operations<'a> {
    /// The provider binary.
    pub bin: &'a Path,
    /// Its component name (Lease `<component>-leader`), e.g. `banlieue-libvirt`.
    pub component: &'a str,
    /// Its kubeconfig.
    pub kubeconfig: &'a Path,
    /// The namespace it watches and elects in.
    pub namespace: &'a str,
    /// Flags beyond the runtime's.
    pub extra: &'a [&'a str],
    /// Metric labels of the controllers that must count reconciles.
    pub controllers: &'a [&'a str],
}

/// The operations check of a provider binary: two candidates `a` and `b`; `trigger` creates
/// objects that make the controllers reconcile.
pub async fn check_operations(
    ops: Operations<'_>,
    client: kube::Client,
    trigger: impl Future<Output = anyhow::Result<()>>,
) -> anyhow::Result<()> {
    let Operations {
        bin,
        component,
        kubeconfig,
        namespace,
        extra,
        controllers,
    } = ops;
    let leases: Api<Lease> = Api::namespaced(client, namespace);
    let lease = format!("{component}-leader");
    let a = Instance::start(bin, kubeconfig, namespace, "a", extra)?;
    eventually("a takes the Lease and is ready", || async {
        Ok((status(&a, "/readyz").await? == Some(200)).then_some(()))
    })
    .await
    .with_context(|| a.log_tail())?;
    ensure!(
        holder(&leases, &lease).await?.as_deref() == Some("a"),
        "a holds {lease}"
    );
    ensure!(a.get("/healthz").await?.0 == 200, "a is healthy");
    let b = Instance::start(bin, kubeconfig, namespace, "b", extra)?;
    eventually("b serves /healthz", || async {
        Ok((status(&b, "/healthz").await? == Some(200)).then_some(()))
    })
    .await
    .with_context(|| b.log_tail())?;
    ensure!(b.get("/readyz").await?.0 == 503, "b is not ready while a leads");

    trigger.await?;
    for controller in controllers {
        eventually(&format!("a counts a reconcile of {controller}"), || async {
            let (code, body) = a.get("/metrics").await?;
            ensure!(code == 200, "/metrics answered {code}");
            Ok((reconciles(&body, controller) >= 1).then_some(()))
        })
        .await
        .with_context(|| a.log_tail())?;
    }
    let (_, body) = a.get("/metrics").await?;
    for family in [
        "# TYPE controller_runtime_reconcile_total counter",
        "# TYPE controller_runtime_reconcile_errors_total counter",
        "# TYPE controller_runtime_reconcile_time_seconds histogram",
    ] {
        ensure!(body.contains(family), "{family} missing from /metrics:\n{body}");
    }
    let (_, body) = b.get("/metrics").await?;
    for controller in controllers {
        ensure!(
            reconciles(&body, controller) == 0,
            "the standby b reconciled {controller}:\n{body}"
        );
    }
    ensure!(
        holder(&leases, &lease).await?.as_deref() == Some("a"),
        "still one leader: a"
    );

    // a stops gracefully and releases the Lease: b takes over without waiting for expiry.
    a.terminate().await?;
    eventually("b takes over", || async {
        Ok((status(&b, "/readyz").await? == Some(200)).then_some(()))
    })
    .await
    .with_context(|| b.log_tail())?;
    ensure!(
        holder(&leases, &lease).await?.as_deref() == Some("b"),
        "b holds {lease}"
    );

    // b crashes (SIGKILL: the Lease stays held): the standby c takes over once the Lease
    // expires (15 s, then its next try) and prints how long that took (no timing asserted).
    let c = Instance::start(bin, kubeconfig, namespace, "c", extra)?;
    eventually("c serves /healthz", || async {
        Ok((status(&c, "/healthz").await? == Some(200)).then_some(()))
    })
    .await
    .with_context(|| c.log_tail())?;
    let crashed = tokio::time::Instant::now();
    b.crash()?;
    eventually("c takes over from the crashed b", || async {
        Ok((status(&c, "/readyz").await? == Some(200)).then_some(()))
    })
    .await
    .with_context(|| c.log_tail())?;
    let failover = crashed.elapsed();
    eprintln!("{component}: failover after SIGKILL of the leader took {failover:.1?}");
    ensure!(
        holder(&leases, &lease).await?.as_deref() == Some("c"),
        "c holds {lease}"
    );
    c.terminate().await?;
    ensure!(
        holder(&leases, &lease).await?.is_none(),
        "c released {lease} on SIGTERM"
    );
    Ok(())
}

/// Applies the YAML files `paths` with `kubectl` (a command carrying its `--kubeconfig`), their
/// `namespace: default` moved to `namespace`.
pub fn apply_in_namespace(mut kubectl: Command, namespace: &str, paths: &[PathBuf]) -> anyhow::Result<()> {
    use std::io::Write as _;
    let mut text = String::new();
    for p in paths {
        let doc = std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
        text.push_str("---\n");
        text.push_str(&doc.replace("namespace: default", &format!("namespace: {namespace}")));
    }
    let mut child = kubectl
        .args(["apply", "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting kubectl")?;
    child
        .stdin
        .take()
        .context("kubectl stdin")?
        .write_all(text.as_bytes())?;
    let out = child.wait_with_output()?;
    ensure!(
        out.status.success(),
        "kubectl apply: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}
