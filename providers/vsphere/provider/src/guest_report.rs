//! cloud-init's report from a vSphere guest.
//!
//! vSphere reads no guest file without the guest's own credentials (its guest operations log in
//! to the guest OS), so the guest reports itself. Every clone gets vendor data
//! (`guestinfo.vendordata`, a script cloud-init runs among its last modules) that waits, in the
//! background, until cloud-init has written its report (`/run/cloud-init/result.json`) and then
//! publishes it, base64, with VMware Tools' `vmware-rpctool "info-set guestinfo.banlieue.cloud-init
//! …"`. Values a guest sets that way show in the VM's `config.extraConfig`, which the provider
//! reads on every step anyway: waiting for cloud-init costs no vCenter call.
//!
//! The script never fails (a failing vendor script would be cloud-init's error), reports at most
//! once per instance (vendor scripts run once per instance), and works with or without systemd.
//! A clone starts with the key emptied, so a template that once reported says nothing about its
//! clones.

use std::collections::BTreeMap;

use banlieue_provider_kit::cloud_init::{CloudInit, RESULT_FILE};
use base64::Engine as _;

/// The guestinfo key the guest publishes cloud-init's report under.
pub const REPORT_KEY: &str = "guestinfo.banlieue.cloud-init";

/// What the guest publishes when cloud-init wrote no report within the script's wait.
const NO_REPORT: &str = "none";

/// How long the guest waits for cloud-init's report before it says there is none.
const GUEST_WAIT_SECONDS: u32 = 3 * 3600;

/// The vendor data script (see the module documentation).
fn vendor_script() -> String {
    format!(
        r#"#!/bin/sh
# banlieue: once cloud-init has finished, publish its report ({RESULT_FILE}, base64) to vSphere
# as {REPORT_KEY}; the provider turns the machine Ready when it reads it. Never fails.
report=/run/banlieue-cloud-init-report.sh
cat > "$report" <<'SCRIPT'
waited=0
while [ ! -e {RESULT_FILE} ] && [ "$waited" -lt {GUEST_WAIT_SECONDS} ]; do
    sleep 2
    waited=$((waited + 2))
done
value=$(base64 < {RESULT_FILE} 2>/dev/null | tr -d '\n')
value=${{value:-{NO_REPORT}}}
vmware-rpctool "info-set {REPORT_KEY} $value" >/dev/null 2>&1 ||
    vmtoolsd --cmd "info-set {REPORT_KEY} $value" >/dev/null 2>&1
exit 0
SCRIPT
if [ -d /run/systemd/system ] && command -v systemd-run >/dev/null 2>&1 &&
    systemd-run --no-block --unit=banlieue-cloud-init-report sh "$report" >/dev/null 2>&1; then
    exit 0
fi
nohup sh "$report" >/dev/null 2>&1 &
exit 0
"#
    )
}

/// The extraConfig entries of a clone for the report: the vendor data (base64) and the report
/// key emptied.
pub fn clone_extra_config() -> Vec<(String, String)> {
    vec![
        ("guestinfo.vendordata".to_owned(), encode(&vendor_script())),
        ("guestinfo.vendordata.encoding".to_owned(), "base64".to_owned()),
        (REPORT_KEY.to_owned(), String::new()),
    ]
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
            "cloud-init wrote no {RESULT_FILE} within {} hours",
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
            matches!(cloud_init(&config(Some(NO_REPORT))), CloudInit::Failed(e) if e.contains("wrote no"))
        );
        assert!(matches!(cloud_init(&config(Some("%%"))), CloudInit::Failed(e) if e.contains("base64")));
    }

    #[test]
    fn a_clone_gets_the_script_and_an_empty_report() {
        let extra: BTreeMap<_, _> = clone_extra_config().into_iter().collect();
        assert_eq!(extra.get(REPORT_KEY).map(String::as_str), Some(""));
        let script = base64::engine::general_purpose::STANDARD
            .decode(&extra["guestinfo.vendordata"])
            .unwrap();
        let script = String::from_utf8(script).unwrap();
        assert!(script.starts_with("#!/bin/sh\n"), "{script}");
        assert!(
            script.contains(&format!("info-set {REPORT_KEY} $value")),
            "{script}"
        );
        assert!(script.contains("value=${value:-none}"), "{script}");
    }

    /// The script as a guest's shell runs it: it returns at once (the wait is in the
    /// background), and once the report appears publishes it through `vmware-rpctool`.
    #[test]
    fn the_script_publishes_the_report_through_vmware_rpctool() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let result = root.join("result.json");
        let published = root.join("published");
        let bin = root.join("bin");
        std::fs::create_dir(&bin).unwrap();
        let rpctool = bin.join("vmware-rpctool");
        std::fs::write(
            &rpctool,
            format!("#!/bin/sh\nprintf '%s' \"$1\" > {}\n", published.display()),
        )
        .unwrap();
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&rpctool, std::fs::Permissions::from_mode(0o755)).unwrap();
        let script = vendor_script()
            .replace(RESULT_FILE, &result.display().to_string())
            .replace(
                "/run/banlieue-cloud-init-report.sh",
                &root.join("r.sh").display().to_string(),
            )
            .replace("[ -d /run/systemd/system ]", "false");
        let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
        let status = std::process::Command::new("sh")
            .arg("-c")
            .arg(&script)
            .env("PATH", &path)
            .status()
            .unwrap();
        assert!(status.success());
        std::thread::sleep(std::time::Duration::from_millis(300));
        assert!(!published.exists(), "nothing is published before the report");
        let report = r#"{"v1": {"errors": []}}"#;
        std::fs::write(&result, report).unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while !published.exists() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        let said = std::fs::read_to_string(&published).expect("published within 20 s");
        assert_eq!(said, format!("info-set {REPORT_KEY} {}", encode(report)));
    }
}
