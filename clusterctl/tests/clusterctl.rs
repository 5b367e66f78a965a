//! The real clusterctl (v1.14.2, built by `tests/controlplane/build.sh`) against the harness
//! control plane: `clusterctl init` installs CAPI's core/kubeadm providers and banlieue-proxmox,
//! banlieue-libvirt and banlieue-vsphere from a local repository written by
//! `banlieue-clusterctl`, and `clusterctl generate cluster` renders every flavor of every provider
//! from the documented variables into objects the apiserver accepts.
//!
//! The provider's Deployment gets no pods: the harness has no kubelet (and no scheduler), which is
//! expected; the objects and their labels are what clusterctl is responsible for.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::time::Duration;

use anyhow::{Context as _, Result, bail, ensure};
use banlieue_clusterctl::repository::{self, CAPI_VERSION};
use banlieue_clusterctl::{Infra, PROXMOX_NAMESPACE, VERSION, components};
use banlieue_testenv::{TestEnv, bin_dir, cert_manager_stub_crds};

/// Variables clusterctl sets itself from `generate cluster`'s arguments.
const CLUSTERCTL_SET: [&str; 5] = [
    "CLUSTER_NAME",
    "NAMESPACE",
    "KUBERNETES_VERSION",
    "CONTROL_PLANE_MACHINE_COUNT",
    "WORKER_MACHINE_COUNT",
];
const FLAVORS: [&str; 4] = ["", "ipam", "external-lb", "clusterclass"];

/// Each provider's flavors (`""` = the default `cluster-template.yaml`).
fn flavors(infra: Infra) -> &'static [&'static str] {
    match infra {
        Infra::Proxmox => &FLAVORS,
        Infra::Libvirt | Infra::Vsphere => &[""],
    }
}

/// The README heading of a provider's template variables table.
fn variables_heading(infra: Infra) -> &'static str {
    match infra {
        Infra::Proxmox => "## Template variables\n",
        Infra::Libvirt => "## Template variables: libvirt\n",
        Infra::Vsphere => "## Template variables: vSphere\n",
    }
}

async fn env() -> Result<&'static TestEnv> {
    let crds = cert_manager_stub_crds()?;
    Ok(TestEnv::shared_with(|b| b.crds(crds)).await?)
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// What `clusterctl init` left behind, shared by the tests of this binary.
struct Initialized {
    config: PathBuf,
    home: PathBuf,
    init_output: String,
}

static INIT: OnceLock<Result<Initialized, String>> = OnceLock::new();

/// A clusterctl command with a private HOME, no version check and nothing else from the
/// environment but PATH.
fn clusterctl(home: &Path) -> Command {
    let mut cmd = Command::new(bin_dir().join("clusterctl"));
    cmd.env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", home)
        .env("XDG_CONFIG_HOME", home.join(".config"))
        .env("CLUSTERCTL_DISABLE_VERSIONCHECK", "true");
    cmd
}

fn run(cmd: &mut Command, what: &str) -> Result<Output> {
    let output = banlieue_testenv::run_with_timeout(cmd, Duration::from_secs(300))
        .with_context(|| format!("running {what}"))?;
    ensure!(
        output.status.success(),
        "{what} failed ({}):\n--- stdout\n{}\n--- stderr\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(output)
}

/// Writes the local repository (CAPI from `bin/capi-crds`, banlieue-proxmox from this tree) and
/// runs `clusterctl init` once.
fn init(env: &TestEnv) -> Result<Initialized> {
    let dir = env.workdir().join("clusterctl");
    let home = dir.join("home");
    std::fs::create_dir_all(&home)?;
    let repo = dir.join("repository");
    let mut entries = repository::write_capi(&repo, &bin_dir().join("capi-crds"), CAPI_VERSION)?;
    entries.extend(repository::write_all_infra(&repo, &root().join("templates"))?);
    let infrastructure = Infra::ALL
        .map(|infra| format!("{}:{VERSION}", infra.name()))
        .join(",");
    let config = repository::write_config(&repo, &entries)?;
    let output = run(
        clusterctl(&home)
            .args(["init", "--config"])
            .arg(&config)
            .arg("--kubeconfig")
            .arg(env.admin().path())
            .args([
                &format!("--core=cluster-api:{CAPI_VERSION}"),
                &format!("--bootstrap=kubeadm:{CAPI_VERSION}"),
                &format!("--control-plane=kubeadm:{CAPI_VERSION}"),
                &format!("--infrastructure={infrastructure}"),
                "-v3",
            ])
            .env("PROXMOX_TOKEN", "capi@pve!capi")
            .env("PROXMOX_SECRET", "8e1f1c0a-0000-4000-8000-000000000001")
            .env("PROXMOX_URL", "https://pve.example.com:8006")
            .env("VSPHERE_USERNAME", "capi@vsphere.local")
            .env("VSPHERE_SERVER", "vcenter.example.com")
            .env("VSPHERE_PASSWORD", "not-a-real-password"),
        "clusterctl init",
    )?;
    Ok(Initialized {
        config,
        home,
        init_output: format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ),
    })
}

async fn initialized() -> Result<(&'static TestEnv, &'static Initialized)> {
    let env = env().await?;
    let init = INIT.get_or_init(|| init(env).map_err(|e| format!("{e:#}")));
    match init {
        Ok(i) => Ok((env, i)),
        Err(e) => bail!("clusterctl init failed: {e}"),
    }
}

/// Every `enum` of a schema with its path, in document order.
fn enums(schema: &serde_json::Value, path: &str, out: &mut Vec<(String, serde_json::Value)>) {
    match schema {
        serde_json::Value::Object(map) => {
            for (key, value) in map {
                if key == "enum" {
                    out.push((path.to_owned(), value.clone()));
                } else {
                    enums(value, &format!("{path}.{key}"), out);
                }
            }
        }
        serde_json::Value::Array(items) => {
            for item in items {
                enums(item, path, out);
            }
        }
        _ => {}
    }
}

fn kubectl_json(env: &TestEnv, args: &[&str]) -> Result<serde_json::Value> {
    let output = run(
        env.kubectl().args(args).args(["-o", "json"]),
        &format!("kubectl {args:?}"),
    )?;
    Ok(serde_json::from_slice(&output.stdout)?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clusterctl_init_installs_the_provider_with_its_labels() -> Result<()> {
    let (env, init) = initialized().await?;
    assert!(
        init.init_output.contains("Skipping installing cert-manager"),
        "{}",
        init.init_output
    );
    for infra in Infra::ALL {
        assert!(
            init.init_output.contains(&format!(
                "Installing provider=\"{}\" version=\"{VERSION}\" targetNamespace=\"{}\"",
                infra.label(),
                infra.namespace()
            )),
            "{}",
            init.init_output
        );
    }

    // clusterctl's inventory knows the providers, their versions and namespaces.
    let inventory = kubectl_json(env, &["get", "providers.clusterctl.cluster.x-k8s.io", "-A"])?;
    let entries: Vec<(String, String, String)> = inventory["items"]
        .as_array()
        .context("items")?
        .iter()
        .map(|p| {
            (
                p["metadata"]["name"].as_str().unwrap_or_default().to_owned(),
                p["metadata"]["namespace"].as_str().unwrap_or_default().to_owned(),
                p["version"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    for infra in Infra::ALL {
        assert!(
            entries.contains(&(infra.label(), infra.namespace(), VERSION.into())),
            "{infra:?}: {entries:?}"
        );
    }
    for capi in ["cluster-api", "bootstrap-kubeadm", "control-plane-kubeadm"] {
        assert!(
            entries.iter().any(|(n, _, v)| n == capi && v == CAPI_VERSION),
            "{capi}: {entries:?}"
        );
    }

    // Every object of each components file is in the cluster, labelled for clusterctl, and each
    // provider's CRDs are exactly its own four.
    for infra in Infra::ALL {
        let label = infra.label();
        for doc in components::infra_components(infra) {
            let kind = doc["kind"].as_str().context("kind")?.to_lowercase();
            let name = doc["metadata"]["name"].as_str().context("name")?;
            let mut args = vec!["get", kind.as_str(), name];
            if let Some(ns) = doc["metadata"]["namespace"].as_str() {
                args.extend(["-n", ns]);
            }
            let live = kubectl_json(env, &args)?;
            assert_eq!(
                live["metadata"]["labels"]["cluster.x-k8s.io/provider"], label,
                "{kind} {name}"
            );
        }
        let selector = format!("cluster.x-k8s.io/provider={label}");
        let labelled = kubectl_json(env, &["get", "crd", "-l", &selector])?;
        let kinds: BTreeSet<String> = labelled["items"]
            .as_array()
            .context("items")?
            .iter()
            .filter_map(|c| c["spec"]["names"]["kind"].as_str().map(str::to_owned))
            .collect();
        let want: BTreeSet<String> = ["Cluster", "Machine", "ClusterTemplate", "MachineTemplate"]
            .map(|k| format!("{}{k}", infra.kind_prefix()))
            .into();
        assert_eq!(kinds, want, "{infra:?}");
        // clusterctl reads YAML 1.1, where a plain `On`/`Off` is a boolean: the installed schemas
        // must still be the Rust types' (e.g. `powerState` enum `On`/`Off`, not `true`/`false`).
        for crd in labelled["items"].as_array().context("items")? {
            let kind = crd["spec"]["names"]["kind"].as_str().context("kind")?;
            let live = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
            let ours = banlieue_api::crds::schema_of(kind).context("no such kind")?;
            let (mut live_enums, mut our_enums) = (Vec::new(), Vec::new());
            enums(live, "", &mut live_enums);
            enums(&ours, "", &mut our_enums);
            live_enums.sort_by(|a, b| a.0.cmp(&b.0));
            our_enums.sort_by(|a, b| a.0.cmp(&b.0));
            assert!(
                !our_enums.is_empty() || !kind.ends_with("Machine"),
                "{kind}: no enums?"
            );
            assert_eq!(live_enums, our_enums, "{kind}: enums as installed by clusterctl");
        }
    }

    // Variables were substituted (token from the environment, defaults for the rest).
    let secret = kubectl_json(
        env,
        &[
            "get",
            "secret",
            components::PROXMOX_CREDENTIALS_SECRET,
            "-n",
            PROXMOX_NAMESPACE,
        ],
    )?;
    let token = secret["data"]["tokenID"].as_str().context("tokenID")?;
    assert_eq!(token, "Y2FwaUBwdmUhY2FwaQ==", "base64 of capi@pve!capi");
    let deployment = kubectl_json(
        env,
        &[
            "get",
            "deployment",
            components::PROXMOX_DEPLOYMENT,
            "-n",
            PROXMOX_NAMESPACE,
        ],
    )?;
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(container["image"], components::proxmox_image());
    assert!(
        container["args"]
            .as_array()
            .context("args")?
            .iter()
            .any(|a| a == "--concurrency=10"),
        "{container}"
    );

    let secret = kubectl_json(
        env,
        &[
            "get",
            "secret",
            &components::credentials_secret(Infra::Vsphere).context("vSphere Secret")?,
            "-n",
            &Infra::Vsphere.namespace(),
        ],
    )?;
    assert_eq!(
        secret["data"]["username"].as_str(),
        Some("Y2FwaUB2c3BoZXJlLmxvY2Fs"),
        "base64 of capi@vsphere.local"
    );
    let deployment = kubectl_json(
        env,
        &[
            "get",
            "deployment",
            &components::deployment_name(Infra::Libvirt),
            "-n",
            &Infra::Libvirt.namespace(),
        ],
    )?;
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(
        pod["securityContext"]["supplementalGroups"],
        serde_json::json!([65532])
    );
    assert_eq!(
        pod["volumes"][0]["hostPath"]["path"],
        components::LIBVIRT_SOCKET_DIR
    );
    assert!(
        pod["containers"][0]["args"]
            .as_array()
            .context("args")?
            .iter()
            .any(|a| a == "--domain-type=kvm"),
        "{pod}"
    );

    // CAPI's aggregated manager role picked up every provider's rules (kube-controller-manager's
    // clusterrole-aggregation controller).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let role = kubectl_json(env, &["get", "clusterrole", "capi-aggregated-manager-role"])?;
        let text = role["rules"].to_string();
        if ["proxmoxmachines", "libvirtmachines", "vspheremachines"]
            .iter()
            .all(|r| text.contains(r))
        {
            break;
        }
        ensure!(tokio::time::Instant::now() < deadline, "not aggregated: {role}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Ok(())
}

/// A README row: default (`None` = required) and flavors.
type Documented = (Option<String>, Vec<String>);

/// Rows of the README's template variables table of `infra`: name → (default, flavors).
fn documented_variables(infra: Infra) -> Result<BTreeMap<String, Documented>> {
    let readme = std::fs::read_to_string(root().join("clusterctl/README.md"))?;
    let heading = variables_heading(infra);
    let section = readme
        .split(heading)
        .nth(1)
        .with_context(|| format!("README has a section {heading:?}"))?;
    let section = section.split("\n## ").next().unwrap_or_default();
    let mut out = BTreeMap::new();
    for line in section.lines().filter(|l| l.starts_with("| `")) {
        let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
        ensure!(cells.len() == 4, "bad row: {line}");
        let name = cells[0].trim_matches('`').to_owned();
        let default = (cells[1] != "(required)").then(|| cells[1].trim_matches('`').to_owned());
        let flavors = cells[2].split(',').map(|f| f.trim().to_owned()).collect();
        out.insert(name, (default, flavors));
    }
    ensure!(!out.is_empty(), "no variables parsed");
    Ok(out)
}

/// The README's variables of a flavor (`""` = default) or of the ClusterClass file (`"class"`).
fn documented_for(infra: Infra, flavor: &str) -> Result<BTreeMap<String, Option<String>>> {
    let name = if flavor.is_empty() { "default" } else { flavor };
    Ok(documented_variables(infra)?
        .into_iter()
        .filter(|(_, (_, flavors))| {
            flavors
                .iter()
                .any(|f| f == name || (f == "all" && name != "class"))
        })
        .map(|(var, (default, _))| (var, default))
        .collect())
}

/// `${VAR}` / `${VAR:=default}` occurrences of a template: name → default.
fn variables_in(text: &str) -> Result<BTreeMap<String, Option<String>>> {
    let mut out = BTreeMap::new();
    let mut rest = text;
    while let Some(start) = rest.find("${") {
        let after = &rest[start + 2..];
        let end = after.find('}').context("unterminated ${")?;
        let (name, default) = match after[..end].split_once(":=") {
            Some((n, d)) => (n, Some(d.to_owned())),
            None => (&after[..end], None),
        };
        if let Some(previous) = out.insert(name.to_owned(), default.clone()) {
            ensure!(
                previous == default,
                "{name} has two defaults: {previous:?} and {default:?}"
            );
        }
        rest = &after[end..];
    }
    Ok(out)
}

fn generate(init: &Initialized, env: &TestEnv, infra: Infra, flavor: &str, extra: &[&str]) -> Command {
    let mut cmd = clusterctl(&init.home);
    cmd.args(["generate", "cluster", "c1", "--config"])
        .arg(&init.config)
        .arg("--kubeconfig")
        .arg(env.admin().path())
        .arg(format!("--infrastructure={}:{VERSION}", infra.name()))
        .args(extra);
    if !flavor.is_empty() {
        cmd.arg(format!("--flavor={flavor}"));
    }
    cmd
}

fn names(m: &BTreeMap<String, Option<String>>) -> BTreeSet<String> {
    m.keys().cloned().collect()
}

#[test]
fn the_clusterclass_file_uses_exactly_the_documented_class_variables() -> Result<()> {
    let text = std::fs::read_to_string(root().join("templates/clusterclass-banlieue-proxmox.yaml"))?;
    let mut used = variables_in(&text)?;
    for var in CLUSTERCTL_SET {
        used.remove(var);
    }
    assert_eq!(
        used,
        documented_for(Infra::Proxmox, "class")?,
        "clusterclass file (left) vs README rows tagged `class`"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_variables_matches_the_readme() -> Result<()> {
    let (env, init) = initialized().await?;
    for (infra, flavor) in Infra::ALL
        .into_iter()
        .flat_map(|i| flavors(i).iter().map(move |f| (i, *f)))
    {
        let output = run(
            &mut generate(init, env, infra, flavor, &["--list-variables"]),
            "list-variables",
        )?;
        let text = String::from_utf8_lossy(&output.stdout).into_owned();
        let mut listed = BTreeMap::new();
        for line in text.lines() {
            let Some(rest) = line.trim().strip_prefix("- ") else {
                continue;
            };
            let mut parts = rest.splitn(2, char::is_whitespace);
            let name = parts.next().unwrap_or_default().to_owned();
            let default = parts
                .next()
                .map(str::trim)
                .and_then(|d| d.strip_prefix("(defaults to \""))
                .and_then(|d| d.strip_suffix("\")"))
                .map(str::to_owned);
            listed.insert(name, default);
        }
        for var in CLUSTERCTL_SET {
            listed.remove(var);
        }
        let documented = documented_for(infra, flavor)?;
        assert_eq!(
            names(&listed),
            names(&documented),
            "{infra:?} flavor {flavor:?}: clusterctl lists (left) vs README (right)\n{text}"
        );
        for (var, default) in &documented {
            assert_eq!(
                listed.get(var).cloned().flatten().as_ref(),
                default.as_ref(),
                "{infra:?} flavor {flavor:?}: default of {var}\n{text}"
            );
        }
    }
    Ok(())
}

/// Sets only the required variables of the README, with example values (for the clusterclass
/// flavor also those of the class file clusterctl adds).
fn set_required_variables(cmd: &mut Command, infra: Infra, flavor: &str) -> Result<()> {
    let mut documented = documented_for(infra, flavor)?;
    if flavor == "clusterclass" {
        documented.extend(documented_for(infra, "class")?);
    }
    for (var, default) in documented {
        if default.is_some() {
            continue;
        }
        let value = match var.as_str() {
            "PROXMOX_URL" => "https://pve.example.com:8006",
            "PROXMOX_TEMPLATE_VMID" => "9000",
            "CONTROL_PLANE_ENDPOINT_IP" => "192.0.2.10",
            "IP_POOL_NAME" => "workers",
            "LIBVIRT_BASE_VOLUME" => "ubuntu-24.04.qcow2",
            "VSPHERE_SERVER" => "vcenter.example.com",
            "VSPHERE_DATACENTER" => "dc1",
            "VSPHERE_TEMPLATE" => "ubuntu-2404-kube-v1.33",
            "VSPHERE_RESOURCE_POOL" => "cluster1/Resources",
            "VSPHERE_DATASTORE" => "ds1",
            other => bail!("no example value for required variable {other}"),
        };
        cmd.env(var, value);
    }
    Ok(())
}

/// The Proxmox TLS variables of every flavor: by default the API is verified against the system
/// roots (no fingerprint, not insecure); `PROXMOX_TLS_FINGERPRINT` pins the certificate;
/// `PROXMOX_TLS_INSECURE=true` alone is accepted (the default fingerprint `null` counts as unset
/// for the CRD's CEL rule); both together are rejected by the apiserver with the CRD's message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxmox_tls_variables_verify_pin_or_skip() -> Result<()> {
    const FINGERPRINT: &str =
        "01:23:45:67:89:AB:CD:EF:01:23:45:67:89:AB:CD:EF:01:23:45:67:89:AB:CD:EF:01:23:45:67:89:AB:CD:EF";
    let (env, init) = initialized().await?;
    let ns = env.namespace("tls").await?;
    for flavor in FLAVORS {
        for (vars, want) in [
            (vec![], Some((None, Some(false)))),
            (
                vec![("PROXMOX_TLS_FINGERPRINT", FINGERPRINT)],
                Some((Some(FINGERPRINT.to_owned()), Some(false))),
            ),
            (vec![("PROXMOX_TLS_INSECURE", "true")], Some((None, Some(true)))),
            (
                vec![
                    ("PROXMOX_TLS_INSECURE", "true"),
                    ("PROXMOX_TLS_FINGERPRINT", FINGERPRINT),
                ],
                None,
            ),
        ] {
            let what = format!("flavor {flavor:?} with {vars:?}");
            let mut cmd = generate(
                init,
                env,
                Infra::Proxmox,
                flavor,
                &[
                    "--kubernetes-version=v1.33.1",
                    &format!("--target-namespace={}", ns.name()),
                ],
            );
            set_required_variables(&mut cmd, Infra::Proxmox, flavor)?;
            cmd.envs(vars.iter().copied());
            let rendered = run(&mut cmd, &format!("generate cluster, {what}"))?.stdout;
            let file = env.workdir().join("cluster-tls.yaml");
            std::fs::write(&file, rendered)?;
            let output = banlieue_testenv::run_with_timeout(
                env.kubectl()
                    .args(["apply", "--server-side", "--dry-run=server", "-o", "json", "-n"])
                    .arg(ns.name())
                    .arg("-f")
                    .arg(&file),
                Duration::from_secs(60),
            )?;
            let Some((fingerprint, insecure)) = want else {
                let stderr = String::from_utf8_lossy(&output.stderr);
                assert!(
                    !output.status.success()
                        && stderr.contains("set at most one of tls.caBundleRef, tls.sha256Fingerprint or tls.insecureSkipVerify"),
                    "{what}: want the CRD's CEL message, got {}:\n{stderr}",
                    output.status
                );
                continue;
            };
            ensure!(
                output.status.success(),
                "{what}: dry-run failed: {}",
                String::from_utf8_lossy(&output.stderr)
            );
            let applied: serde_json::Value = serde_json::from_slice(&output.stdout)?;
            let tls = applied["items"]
                .as_array()
                .context("items")?
                .iter()
                .find_map(|o| match o["kind"].as_str() {
                    Some("ProxmoxCluster") => Some(o["spec"]["tls"].clone()),
                    Some("ProxmoxClusterTemplate") => Some(o["spec"]["template"]["spec"]["tls"].clone()),
                    _ => None,
                })
                .with_context(|| format!("{what}: no ProxmoxCluster(Template)"))?;
            let tls: banlieue_api::common::TlsTrust = serde_json::from_value(tls)?;
            assert_eq!(tls.sha256_fingerprint, fingerprint, "{what}");
            assert_eq!(tls.insecure_skip_verify, insecure, "{what}");
            assert_eq!(tls.ca_bundle_ref, None, "{what}");
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_flavor_renders_from_documented_variables_and_is_accepted() -> Result<()> {
    let (env, init) = initialized().await?;
    for (infra, flavor) in Infra::ALL
        .into_iter()
        .flat_map(|i| flavors(i).iter().map(move |f| (i, *f)))
    {
        let ns = env.namespace("generate").await?;
        let mut cmd = generate(
            init,
            env,
            infra,
            flavor,
            &[
                "--kubernetes-version=v1.33.1",
                "--control-plane-machine-count=3",
                "--worker-machine-count=2",
                &format!("--target-namespace={}", ns.name()),
            ],
        );
        set_required_variables(&mut cmd, infra, flavor)?;
        let output = run(
            &mut cmd,
            &format!("generate cluster ({infra:?}, flavor {flavor:?})"),
        )?;
        let rendered = String::from_utf8(output.stdout)?;
        assert!(!rendered.contains("${"), "unsubstituted variable:\n{rendered}");
        let file = env.workdir().join(format!(
            "cluster-{}-{}.yaml",
            infra.short(),
            if flavor.is_empty() { "default" } else { flavor }
        ));
        std::fs::write(&file, &rendered)?;
        let output = run(
            env.kubectl()
                .args([
                    "apply",
                    "--server-side",
                    "--dry-run=server",
                    "-n",
                    ns.name(),
                    "-f",
                ])
                .arg(&file),
            &format!("server-side dry-run of {infra:?} flavor {flavor:?}"),
        )?;
        let applied = String::from_utf8_lossy(&output.stdout);
        let prefix = infra.kind_prefix().to_lowercase();
        let mut kinds = vec![
            "cluster.cluster.x-k8s.io/c1".to_owned(),
            format!("{prefix}machinetemplate.infrastructure.banlieue.io"),
        ];
        kinds.push(match flavor {
            "clusterclass" => "clusterclass.cluster.x-k8s.io/banlieue-proxmox".to_owned(),
            _ => format!("{prefix}cluster.infrastructure.banlieue.io/c1"),
        });
        if flavor != "clusterclass" {
            kinds.push("kubeadmcontrolplane.controlplane.cluster.x-k8s.io/c1-control-plane".to_owned());
        }
        for kind in kinds {
            assert!(
                applied.contains(&kind),
                "{infra:?} flavor {flavor:?}: {kind} missing in\n{applied}"
            );
        }
    }
    Ok(())
}
