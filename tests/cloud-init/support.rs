//! Reads seeds with the real cloud-init: Debian bookworm's package, unpacked by
//! `tests/cloud-init/install.sh` (which `.ci/run` runs), driven by `read_seed.py` beside this file
//! through its NoCloud and VMware datasources and its netplan, eni and networkd renderers.
//! Shared by test binaries (`#[path]`-included).

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context as _, Result, bail};
use serde::Deserialize;

/// What cloud-init understood of a seed.
#[derive(Debug, Deserialize)]
pub struct Read {
    /// The meta-data as cloud-init holds it (strings stay strings only if written so).
    pub metadata: serde_json::Value,
    /// The instance id.
    pub instance_id: serde_json::Value,
    /// The user data, as text.
    pub userdata: Option<String>,
    /// The network configuration (`null` when none).
    pub network_config: serde_json::Value,
    /// The interfaces renamed before networking: `[mac, name, driver, device id]`.
    pub renames: Vec<(String, String, Option<String>, Option<String>)>,
    /// `"<renderer>:<path>"` → the file that renderer wrote.
    pub rendered: BTreeMap<String, String>,
}

impl Read {
    /// The text of the one file `renderer` wrote whose path contains `part`.
    pub fn file(&self, renderer: &str, part: &str) -> Result<&str> {
        let mut found = self
            .rendered
            .iter()
            .filter(|(k, _)| k.starts_with(&format!("{renderer}:")) && k.contains(part));
        match (found.next(), found.next()) {
            (Some((_, text)), None) => Ok(text),
            _ => bail!(
                "no single {renderer} file with {part:?} among {:?}",
                self.rendered.keys()
            ),
        }
    }
}

fn here() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .map(|d| d.join("tests/cloud-init"))
        .find(|d| d.join("read_seed.py").is_file())
        .expect("tests/cloud-init/read_seed.py above the crate")
}

fn python(args: &[&str], env: &[(String, String)], stdin: Option<&str>) -> Result<Vec<u8>> {
    use std::io::Write as _;
    let root = here().join("root");
    if !root.join("usr/bin/cloud-init").is_file() {
        bail!(
            "the real cloud-init is not unpacked in {}: run tests/cloud-init/install.sh (as .ci/run does)",
            root.display()
        );
    }
    let mut child = Command::new("/usr/bin/python3")
        .arg(here().join("read_seed.py"))
        .args(args)
        .env("PYTHONPATH", root.join("usr/lib/python3/dist-packages"))
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .context("running Debian's /usr/bin/python3")?;
    let mut input = child.stdin.take().context("stdin")?;
    input.write_all(stdin.unwrap_or_default().as_bytes())?;
    drop(input);
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!(
            "cloud-init could not read it:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(out.stdout)
}

/// `text` loaded by cloud-init's own YAML loader, as JSON.
pub fn load_yaml(text: &str) -> Result<serde_json::Value> {
    serde_json::from_slice(&python(&["yaml"], &[], Some(text))?).context("read_seed.py's output")
}

fn cloud_init(args: &[&str], env: &[(String, String)]) -> Result<Read> {
    serde_json::from_slice(&python(args, env, None)?).context("read_seed.py's output")
}

/// The NoCloud seed made of `files` (name, content), read by cloud-init's NoCloud datasource.
pub fn read_nocloud(files: &[(String, Vec<u8>)]) -> Result<Read> {
    let dir = tempfile::tempdir()?;
    let seed = dir.path().join("seed");
    std::fs::create_dir(&seed)?;
    for (name, data) in files {
        std::fs::write(seed.join(name), data)?;
    }
    let out = dir.path().join("out");
    cloud_init(&["nocloud", &seed.to_string_lossy(), &out.to_string_lossy()], &[])
}

/// A VM's `guestinfo.*` extraConfig, read by cloud-init's VMware datasource (through its
/// environment transport: `VMX_GUESTINFO_*`).
pub fn read_vmware(extra_config: &[(String, String)]) -> Result<Read> {
    let dir = tempfile::tempdir()?;
    let mut env = vec![("VMX_GUESTINFO".to_owned(), "1".to_owned())];
    env.extend(
        extra_config
            .iter()
            .filter(|(k, _)| k.starts_with("guestinfo."))
            .map(|(k, v)| {
                (
                    format!("VMX_{}", k.to_ascii_uppercase().replace('.', "_")),
                    v.clone(),
                )
            }),
    );
    cloud_init(&["vmware", &dir.path().to_string_lossy()], &env)
}
