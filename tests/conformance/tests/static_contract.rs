//! The static half of conformance: every banlieue infrastructure CRD as shipped in `config/crd/`
//! (and as generated from the Rust types) is checked against the CAPI v1beta2 provider contract
//! (`shared/CAPI-CONTRACT.md`) and against CAPI v1.14's own CRDs for every field CAPI copies.
//! Writes `target/conformance/static-contract.md`. Fast: no processes.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};
use banlieue_conformance::contract::{self, Role};
use banlieue_conformance::report::{Outcome, Report, report_dir};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde_json::Value;

const INFRA_GROUP: &str = "infrastructure.banlieue.io";

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The infrastructure CRDs as committed in `config/crd/` (what clusterctl ships), by kind.
fn committed_crds() -> Result<BTreeMap<String, CustomResourceDefinition>> {
    let dir = workspace().join("config/crd");
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        if !path.to_string_lossy().ends_with(&format!("{INFRA_GROUP}.yaml")) {
            continue;
        }
        let text = std::fs::read_to_string(&path)?;
        let crd: CustomResourceDefinition =
            serde_yaml::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
        out.insert(crd.spec.names.kind.clone(), crd);
    }
    Ok(out)
}

/// `openAPIV3Schema` of the v1beta2 version of one of CAPI's CRD files.
fn capi_schema(file: &str) -> Option<Value> {
    let text = std::fs::read_to_string(banlieue_capi::crds::file(file)).ok()?;
    let crd: CustomResourceDefinition = serde_yaml::from_str(&text).ok()?;
    let version = crd.spec.versions.into_iter().find(|v| v.name == "v1beta2")?;
    serde_json::to_value(version.schema?.open_api_v3_schema?).ok()
}

fn check_kind(
    report: &mut Report,
    crd: &CustomResourceDefinition,
    all: &BTreeMap<String, CustomResourceDefinition>,
) {
    let kind = crd.spec.names.kind.clone();
    let Some(role) = Role::of_kind(&kind) else {
        report.record(
            &kind,
            "has a contract role",
            Outcome::fail("kind name matches no role"),
            None,
        );
        return;
    };
    let section = format!("{kind} ({role:?})");
    for f in contract::check_crd_shape(crd, role) {
        report.record(&section, f.check, f.outcome, None);
    }
    let Some(schema) = contract::contract_schema(crd) else {
        report.record(
            &section,
            "has a schema",
            Outcome::fail("no openAPIV3Schema"),
            None,
        );
        return;
    };
    for f in contract::check_fields(&schema, role) {
        report.record(&section, f.check, f.outcome, None);
    }
    for f in contract::check_copies(&schema, role, &capi_schema) {
        report.record(&section, f.check, f.outcome, None);
    }
    if let Some(object_kind) = kind.strip_suffix("Template") {
        let finding = match all.get(object_kind).and_then(contract::contract_schema) {
            Some(object) => contract::check_template_mirrors(&schema, &object, object_kind),
            None => contract::Finding {
                check: format!("{object_kind} exists for the template"),
                outcome: Outcome::fail("no such CRD"),
            },
        };
        report.record(&section, finding.check, finding.outcome, None);
    }
}

#[test]
fn infrastructure_crds_conform_to_the_capi_v1beta2_contract() -> Result<()> {
    let committed = committed_crds()?;
    let mut report = Report::new("banlieue CAPI conformance: static contract check");

    // The committed YAML is what ships; it must cover exactly the generated infrastructure kinds.
    let generated: BTreeMap<String, CustomResourceDefinition> = banlieue_api::crds::all()
        .into_iter()
        .filter(|c| c.spec.group == INFRA_GROUP)
        .map(|c| (c.spec.names.kind.clone(), c))
        .collect();
    let same_kinds = generated.keys().eq(committed.keys());
    report.record(
        "config/crd",
        "committed infrastructure CRDs = generated ones",
        if same_kinds {
            Outcome::pass(format!("{} kinds", committed.len()))
        } else {
            Outcome::fail(format!(
                "committed {:?}, generated {:?}",
                committed.keys().collect::<Vec<_>>(),
                generated.keys().collect::<Vec<_>>()
            ))
        },
        None,
    );
    for role in [
        Role::InfraCluster,
        Role::InfraMachine,
        Role::InfraClusterTemplate,
        Role::InfraMachineTemplate,
    ] {
        let count = committed
            .keys()
            .filter(|k| Role::of_kind(k) == Some(role))
            .count();
        report.record(
            "config/crd",
            format!("one {role:?} per backend (proxmox, libvirt, vsphere)"),
            if count == 3 {
                Outcome::pass("3")
            } else {
                Outcome::fail(count.to_string())
            },
            None,
        );
    }
    for crd in committed.values() {
        check_kind(&mut report, crd, &committed);
    }
    report.note(format!(
        "Contract: CAPI's v1beta2 provider contract; CAPI's CRDs: {} (CAPI {}).",
        banlieue_capi::crds::dir().display(),
        banlieue_capi::crds::SERIES
    ));
    report.note(
        "Copy checks: a value our CRD accepts must be accepted by the CAPI field CAPI copies it to \
         (type, length bounds, enums, ranges, maxItems, known fields).",
    );
    let path = report.write(&report_dir().join("static-contract.md"))?;
    eprintln!("report: {}", path.display());

    let failures = report.failures();
    assert!(
        failures.is_empty(),
        "contract violations:\n{}",
        failures
            .iter()
            .map(|e| format!("  {}: {}: {:?}", e.section, e.check, e.outcome))
            .collect::<Vec<_>>()
            .join("\n")
    );
    // Every required rule really was evaluated for each of the 12 kinds (no silent empty run).
    let (passed, _, _) = report.counts();
    assert!(passed > 12 * 5, "only {passed} checks passed");
    Ok(())
}
