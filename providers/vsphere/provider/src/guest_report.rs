//! cloud-init's report from a vSphere guest.
//!
//! vSphere reads no guest file without the guest's own credentials (its guest operations log in
//! to the guest OS), so the guest reports itself. Every clone gets vendor data
//! (`guestinfo.vendordata`) that installs a per-boot script: at every boot cloud-init runs it
//! among its last modules, and it starts a waiter in the background that, once cloud-init has
//! written this boot's report (`/run/cloud-init/result.json`), publishes its errors (at most 10,
//! cut to 500 characters: guestinfo values are small), base64, with VMware Tools' `vmware-rpctool
//! "info-set guestinfo.banlieue.cloud-init …"`. Values a guest sets that way show in the VM's
//! `config.extraConfig`, which the provider reads on every step anyway: waiting for cloud-init
//! costs no vCenter call. Reporting at every boot covers a guest that reboots during its first
//! boot and a guest-set value lost when the VM was powered off.
//!
//! The scripts never fail (a failing vendor script would be cloud-init's error) and work with or
//! without systemd. A clone starts with the key emptied, so a template that once reported says
//! nothing about its clones, and carries [`REPORTER_KEY`]: a VM without it (cloned before the
//! reporter existed) is not waited for.

use std::collections::BTreeMap;

use banlieue_provider_kit::cloud_init::{CloudInit, RESULT_FILE};
use base64::Engine as _;

/// The guestinfo key the guest publishes cloud-init's report under.
pub const REPORT_KEY: &str = "guestinfo.banlieue.cloud-init";

/// The extraConfig key that says the VM got the reporting vendor data (set at clone time): a VM
/// cloned before, or adopted without it, is not waited for.
pub const REPORTER_KEY: &str = "guestinfo.banlieue.cloud-init-reporter";

/// What the guest publishes when it has no report to send (none within the wait, or no tool
/// to encode it).
const NO_REPORT: &str = "none";

/// How long the guest waits for cloud-init's report, per boot, before it says there is none.
const GUEST_WAIT_SECONDS: u32 = 3 * 3600;

/// Where the vendor data installs the reporter (run by cloud-init's `scripts_per_boot` at every
/// boot, this one included: it runs after `scripts_vendor`).
const PER_BOOT_SCRIPT: &str = "/var/lib/cloud/scripts/per-boot/banlieue-report-cloud-init";
/// The background waiter the per-boot script starts.
const WAITER_SCRIPT: &str = "/var/lib/banlieue/report-cloud-init.sh";

/// The waiter: waits for this boot's report, keeps its errors only (at most 10, 500 characters
/// each: guestinfo values are small), and publishes them, base64, with VMware Tools.
fn waiter_script() -> String {
    format!(
        r#"#!/bin/sh
waited=0
while [ ! -e {RESULT_FILE} ] && [ "$waited" -lt {GUEST_WAIT_SECONDS} ]; do
    sleep 2
    waited=$((waited + 2))
done
errors=$(python3 -c 'import json, sys
r = json.load(open(sys.argv[1])).get("v1", {{}})
print(json.dumps({{"v1": {{"errors": [str(e)[:500] for e in r.get("errors", [])][:10]}}}}))' {RESULT_FILE} 2>/dev/null) ||
    errors=$(cat {RESULT_FILE} 2>/dev/null)
value=$(printf '%s' "$errors" | base64 2>/dev/null | tr -d '\n')
value=${{value:-{NO_REPORT}}}
vmware-rpctool "info-set {REPORT_KEY} $value" >/dev/null 2>&1 ||
    vmtoolsd --cmd "info-set {REPORT_KEY} $value" >/dev/null 2>&1
exit 0
"#
    )
}

/// The per-boot script: starts the waiter in the background and returns at once.
fn per_boot_script() -> String {
    format!(
        r#"#!/bin/sh
if [ -d /run/systemd/system ] && command -v systemd-run >/dev/null 2>&1 &&
    systemd-run --no-block --collect --unit=banlieue-report-cloud-init sh {WAITER_SCRIPT} >/dev/null 2>&1; then
    exit 0
fi
nohup sh {WAITER_SCRIPT} >/dev/null 2>&1 &
exit 0
"#
    )
}

/// The vendor data (see the module documentation): installs the waiter and the per-boot script
/// that starts it. Never fails.
fn vendor_script() -> String {
    format!(
        r#"#!/bin/sh
# banlieue: at every boot, once cloud-init has finished, publish its errors (from {RESULT_FILE},
# base64) to vSphere as {REPORT_KEY}; the provider turns the machine Ready when it reads them.
mkdir -p "$(dirname {WAITER_SCRIPT})" "$(dirname {PER_BOOT_SCRIPT})" 2>/dev/null
cat > {WAITER_SCRIPT} <<'WAITER'
{waiter}WAITER
cat > {PER_BOOT_SCRIPT} <<'PERBOOT'
{per_boot}PERBOOT
chmod 0755 {WAITER_SCRIPT} {PER_BOOT_SCRIPT} 2>/dev/null
exit 0
"#,
        waiter = waiter_script(),
        per_boot = per_boot_script(),
    )
}

/// The extraConfig entries of a clone for the report: the vendor data (base64), the report key
/// emptied, and the marker that the VM reports.
pub fn clone_extra_config() -> Vec<(String, String)> {
    vec![
        ("guestinfo.vendordata".to_owned(), encode(&vendor_script())),
        ("guestinfo.vendordata.encoding".to_owned(), "base64".to_owned()),
        (REPORT_KEY.to_owned(), String::new()),
        (REPORTER_KEY.to_owned(), "1".to_owned()),
    ]
}

/// Whether the VM got the reporting vendor data: one that did not (cloned before it existed)
/// is not waited for.
pub fn reports(extra_config: &BTreeMap<String, String>) -> bool {
    extra_config.get(REPORTER_KEY).is_some_and(|v| v == "1")
}

/// What the guest's script publishes for a report `result` (the content of `result.json`).
pub fn encode(result: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(result)
}

/// The extraConfig entry a guest whose cloud-init finished without errors publishes (what tests
/// set in vcsim, which boots no guest, for one).
pub fn published_done() -> (String, String) {
    (REPORT_KEY.to_owned(), encode(r#"{"v1": {"errors": []}}"#))
}

/// What cloud-init in the guest says, from the VM's extraConfig.
pub fn cloud_init(extra_config: &BTreeMap<String, String>) -> CloudInit {
    match extra_config.get(REPORT_KEY).map(|v| v.trim()) {
        None | Some("") => CloudInit::Running,
        Some(NO_REPORT) => CloudInit::Failed(format!(
            "the guest published no report: no {RESULT_FILE} within {} hours of its boot (or no base64 in the guest)",
            GUEST_WAIT_SECONDS / 3600
        )),
        Some(value) => match base64::engine::general_purpose::STANDARD.decode(value) {
            Ok(bytes) => CloudInit::from_result(Some(&String::from_utf8_lossy(&bytes))),
            Err(e) => CloudInit::Failed(format!("{REPORT_KEY} is not base64: {e}")),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(value: Option<&str>) -> BTreeMap<String, String> {
        value
            .map(|v| (REPORT_KEY.to_owned(), v.to_owned()))
            .into_iter()
            .collect()
    }

    #[test]
    fn the_published_report_says_running_done_or_failed() {
        assert_eq!(cloud_init(&config(None)), CloudInit::Running);
        assert_eq!(cloud_init(&config(Some(""))), CloudInit::Running);
        let done = encode(r#"{"v1": {"datasource": "DataSourceVMware", "errors": []}}"#);
        assert_eq!(cloud_init(&config(Some(&done))), CloudInit::Done);
        let failed = encode(r#"{"v1": {"errors": ["('scripts_user', RuntimeError('boom'))"]}}"#);
        assert!(matches!(cloud_init(&config(Some(&failed))), CloudInit::Failed(e) if e.contains("boom")));
        assert!(
            matches!(cloud_init(&config(Some(NO_REPORT))), CloudInit::Failed(e) if e.contains("published no report"))
        );
        assert!(matches!(cloud_init(&config(Some("%%"))), CloudInit::Failed(e) if e.contains("base64")));
    }

    #[test]
    fn a_clone_gets_the_script_an_empty_report_and_the_marker() {
        let extra: BTreeMap<_, _> = clone_extra_config().into_iter().collect();
        assert_eq!(extra.get(REPORT_KEY).map(String::as_str), Some(""));
        assert!(reports(&extra));
        assert!(
            !reports(&BTreeMap::new()),
            "a VM cloned before the reporter is not waited for"
        );
        let script = base64::engine::general_purpose::STANDARD
            .decode(&extra["guestinfo.vendordata"])
            .unwrap();
        let script = String::from_utf8(script).unwrap();
        assert!(script.starts_with("#!/bin/sh\n"), "{script}");
        assert!(script.contains(PER_BOOT_SCRIPT), "{script}");
        assert!(
            script.contains(&format!("info-set {REPORT_KEY} $value")),
            "{script}"
        );
        assert!(script.contains("value=${value:-none}"), "{script}");
        assert!(script.contains("tr -d '\\n'"), "{script}");
    }

    /// Runs `script` with `sh` and the test's `vmware-rpctool` first in PATH.
    fn run(script: &str, bin: &std::path::Path) {
        let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
        let status = std::process::Command::new("sh")
            .arg("-c")
            .arg(script)
            .env("PATH", &path)
            .status()
            .unwrap();
        assert!(status.success(), "{script}");
    }

    /// The scripts as a guest runs them: the vendor data installs the waiter and the per-boot
    /// script and returns; the per-boot script (cloud-init runs it at every boot) returns at once;
    /// once the boot's report appears, its errors (at most 10, each cut to 500 characters) are
    /// published through `vmware-rpctool`.
    #[test]
    fn the_scripts_publish_the_boots_errors_through_vmware_rpctool() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let (result, published, bin) = (root.join("result.json"), root.join("published"), root.join("bin"));
        std::fs::create_dir(&bin).unwrap();
        let rpctool = bin.join("vmware-rpctool");
        std::fs::write(
            &rpctool,
            format!("#!/bin/sh\nprintf '%s' \"$1\" > {}\n", published.display()),
        )
        .unwrap();
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&rpctool, std::fs::Permissions::from_mode(0o755)).unwrap();
        let (waiter, per_boot) = (root.join("lib/waiter.sh"), root.join("per-boot/report"));
        let local = |script: String| {
            script
                .replace(RESULT_FILE, &result.display().to_string())
                .replace(WAITER_SCRIPT, &waiter.display().to_string())
                .replace(PER_BOOT_SCRIPT, &per_boot.display().to_string())
                .replace("[ -d /run/systemd/system ]", "false")
        };
        run(&local(vendor_script()), &bin);
        assert!(waiter.is_file() && per_boot.is_file(), "installed");
        run(&std::fs::read_to_string(&per_boot).unwrap(), &bin);
        std::thread::sleep(std::time::Duration::from_millis(300));
        assert!(!published.exists(), "nothing is published before the report");
        let errors: Vec<String> = (0..12)
            .map(|i| format!("error {i} {}", "x".repeat(900)))
            .collect();
        std::fs::write(
            &result,
            serde_json::json!({"v1": {"datasource": "DataSourceVMware", "errors": errors}}).to_string(),
        )
        .unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while !published.exists() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        let said = std::fs::read_to_string(&published).expect("published within 20 s");
        let value = said
            .strip_prefix(&format!("info-set {REPORT_KEY} "))
            .expect("the report key");
        let json = base64::engine::general_purpose::STANDARD.decode(value).unwrap();
        let sent: serde_json::Value = serde_json::from_slice(&json).unwrap();
        let sent = sent["v1"]["errors"].as_array().unwrap();
        assert_eq!(sent.len(), 10, "at most 10 errors");
        assert!(
            sent.iter().all(|e| e.as_str().unwrap().len() == 500),
            "cut to 500"
        );
        let config = [(REPORT_KEY.to_owned(), value.to_owned())].into_iter().collect();
        assert!(matches!(cloud_init(&config), CloudInit::Failed(e) if e.contains("error 0")));
    }
}
