//! The committed clusterctl artifacts are exactly what the generator makes, agree with the CRDs'
//! contract labels, and the provider Deployment only passes flags the real binary has.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use banlieue_capi::clusterctl::Metadata;
use banlieue_clusterctl::{Infra, VERSION, artifacts, components, yaml};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A binary of the workspace, built next to this test's executable (`target/<profile>/`).
fn workspace_binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    let dir = exe.parent().and_then(Path::parent).expect("target dir");
    let path = dir.join(name);
    assert!(
        path.is_file(),
        "{} is missing: build it first (`cargo build -p banlieue-proxmox -p banlieue-libvirt -p banlieue-vsphere -p banlieue-controllers`)",
        path.display()
    );
    path
}

#[test]
fn committed_artifacts_match_the_generator() {
    if std::env::var_os("BANLIEUE_UPDATE_CLUSTERCTL").is_some() {
        artifacts::write_all(&root()).unwrap();
    }
    let drifted = artifacts::drifted(&root()).unwrap();
    assert!(
        drifted.is_empty(),
        "generated clusterctl artifacts drifted: {drifted:?}; run `cargo run -p banlieue-clusterctl -- write` \
         (or set BANLIEUE_UPDATE_CLUSTERCTL=1) and commit the result"
    );
}

#[test]
fn metadata_agrees_with_the_crd_contract_labels() {
    let text = std::fs::read_to_string(root().join("metadata.yaml")).unwrap();
    let metadata: Metadata = serde_yaml::from_str(&text).unwrap();
    let series = metadata.series_for(VERSION).expect("this release has a series");
    let contract_label = format!("cluster.x-k8s.io/{}", series.contract);
    let mut crds = Vec::new();
    for infra in Infra::ALL {
        let path = artifacts::components_path(infra);
        let components = std::fs::read_to_string(root().join(&path)).unwrap();
        let found: Vec<_> = yaml::parse(&components, &path)
            .unwrap()
            .into_iter()
            .filter(|d| d["kind"] == "CustomResourceDefinition")
            .collect();
        assert_eq!(found.len(), 4, "{path}");
        crds.extend(found);
    }
    for crd in crds {
        let name = crd["metadata"]["name"].as_str().unwrap().to_owned();
        let label = crd["metadata"]["labels"][&contract_label]
            .as_str()
            .unwrap_or_else(|| panic!("{name} has no {contract_label} label: the CRD does not implement the contract of metadata.yaml"));
        let served: Vec<&str> = crd["spec"]["versions"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|v| v["served"] == true)
            .map(|v| v["name"].as_str().unwrap())
            .collect();
        let labelled: Vec<&str> = label.split('_').collect();
        assert_eq!(
            labelled, served,
            "{name}: {contract_label} must list the served versions"
        );
    }
}

#[test]
fn deployment_flags_are_flags_of_the_real_binary() {
    for infra in Infra::ALL {
        let binary = infra.name();
        let output = Command::new(workspace_binary(&binary))
            .arg("--help")
            .output()
            .unwrap();
        assert!(output.status.success(), "{binary} --help");
        let help = String::from_utf8(output.stdout).unwrap();
        for arg in components::args(infra) {
            let flag = arg.split('=').next().unwrap();
            assert!(
                help.contains(&format!("{flag} "))
                    || help.contains(&format!("{flag}\n"))
                    || help.contains(&format!("{flag} <")),
                "the Deployment passes {flag}, which `{binary} --help` does not list:\n{help}"
            );
        }
    }
    let output = Command::new(workspace_binary("banlieue"))
        .args(["controller", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8(output.stdout).unwrap();
    for arg in components::core_args().iter().skip(1) {
        let flag = arg.split('=').next().unwrap();
        assert!(help.contains(flag), "the core Deployment passes {flag}:\n{help}");
    }
}

/// The image recipe cannot be built here (no container runtime); this pins what the generated
/// Deployments rely on: each image's entrypoint is its binary, and it runs as the uid the
/// Deployments' securityContext declares.
#[test]
fn dockerfile_matches_the_deployments() {
    let dockerfile = std::fs::read_to_string(root().join("Dockerfile")).unwrap();
    for (target, binary) in [
        ("proxmox", "banlieue-proxmox"),
        ("vsphere", "banlieue-vsphere"),
        ("libvirt", "banlieue-libvirt"),
        ("controller", "banlieue"),
    ] {
        let stage = dockerfile
            .split("\nFROM ")
            .find(|s| {
                s.lines()
                    .next()
                    .is_some_and(|l| l.ends_with(&format!(" AS {target}")))
            })
            .unwrap_or_else(|| panic!("no stage {target}"));
        assert!(
            stage.contains(&format!("ENTRYPOINT [\"/{binary}\"]")),
            "{target}: {stage}"
        );
        assert!(stage.contains("USER 65532:65532"), "{target}: {stage}");
        if target == "libvirt" {
            // libvirt's C library and ssh: debian-slim with exactly these packages.
            assert!(
                stage.starts_with("docker.io/library/debian:bookworm-slim"),
                "{stage}"
            );
            assert!(stage.contains("libvirt0 openssh-client"), "{stage}");
        } else {
            assert!(stage.starts_with("gcr.io/distroless/static"), "{target}: {stage}");
        }
        assert!(
            dockerfile.contains(&format!("--bin {binary}")),
            "{binary} is not built"
        );
    }
    let mut all: Vec<Vec<serde_json::Value>> = Infra::ALL.map(components::infra_components).to_vec();
    all.push(components::core_components());
    for docs in all {
        let deployment = docs.iter().find(|d| d["kind"] == "Deployment").unwrap();
        let pod = &deployment["spec"]["template"]["spec"];
        assert_eq!(pod["securityContext"]["runAsUser"], 65532);
        assert!(
            pod["containers"][0].get("command").is_none(),
            "the image entrypoint is the binary"
        );
    }
}

/// `${VAR}` / `${VAR:=default}` occurrences of a text: name → default.
fn variables_in(text: &str) -> BTreeMap<String, Option<String>> {
    let mut out = BTreeMap::new();
    for chunk in text.split("${").skip(1) {
        let inner = chunk.split('}').next().unwrap_or_default();
        let (name, default) = match inner.split_once(":=") {
            Some((n, d)) => (n, Some(d.to_owned())),
            None => (inner, None),
        };
        out.insert(name.to_owned(), default);
    }
    out
}

/// Every variable of each provider's components is in its README table, with its default, and
/// the table lists nothing else.
#[test]
fn component_variables_match_the_readme() {
    let readme = std::fs::read_to_string(root().join("clusterctl/README.md")).unwrap();
    for infra in Infra::ALL {
        let heading = match infra {
            Infra::Proxmox => "Variables of the components (`clusterctl init`):\n",
            Infra::Libvirt => "Variables of the libvirt components:\n",
            Infra::Vsphere => "Variables of the vSphere components:\n",
        };
        let table = readme
            .split(heading)
            .nth(1)
            .unwrap_or_else(|| panic!("README has no {heading:?}"));
        let documented: BTreeMap<String, Option<String>> = table
            .lines()
            .skip_while(|l| !l.starts_with('|'))
            .take_while(|l| l.starts_with('|'))
            .filter(|l| l.starts_with("| `"))
            .map(|l| {
                let cells: Vec<&str> = l.trim_matches('|').split('|').map(str::trim).collect();
                let default = (cells[1] != "(required)").then(|| cells[1].trim_matches('`').to_owned());
                (cells[0].trim_matches('`').to_owned(), default)
            })
            .collect();
        let used = variables_in(&artifacts::components_yaml(infra).unwrap());
        assert_eq!(used, documented, "{infra:?}: components (left) vs README (right)");
    }
}
