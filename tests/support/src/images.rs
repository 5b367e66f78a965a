//! Container images built here without a registry (umoci), for the harness's real nodes: a
//! binary with the libraries it links, as an OCI layout tarball that
//! [`crate::nodes::Node::import`] loads into a node's containerd; and what such a tarball's
//! image declares ([`ImageConfig::read`]), to hold it against a Dockerfile.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::{Error, Result};

/// An image made of one binary (see `node/binary-image.sh`).
#[derive(Clone, Debug)]
pub struct BinaryImage<'a> {
    /// `name:tag`, as manifests reference it.
    pub reference: &'a str,
    /// The binary on this machine.
    pub binary: &'a Path,
    /// Where it sits in the image; also the entrypoint.
    pub path: &'a str,
    /// `uid:gid` the image runs as.
    pub user: &'a str,
    /// TCP ports the image exposes.
    pub ports: &'a [u16],
}

impl BinaryImage<'_> {
    /// Builds the tarball into `dir` (named after the reference) and returns its path.
    pub fn build(&self, dir: &Path) -> Result<PathBuf> {
        let (_, tag) = split_reference(self.reference)?;
        std::fs::create_dir_all(dir).map_err(|e| Error::io("creating", dir, e))?;
        let file = self.reference.replace(['/', ':'], "_") + ".tar";
        let out = dir.join(file);
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("node/binary-image.sh");
        crate::setup::setup_output(
            Command::new("bash")
                .arg(&script)
                .arg(&out)
                .arg(tag)
                .arg(self.binary)
                .args([self.path, self.user])
                .args(self.ports.iter().map(u16::to_string)),
            "node/binary-image.sh",
            &format!("building image {} from {}", self.reference, self.binary.display()),
        )?;
        Ok(out)
    }
}

/// `name` and `tag` of `name:tag` (the tag is required: nodes never pull).
pub fn split_reference(reference: &str) -> Result<(&str, &str)> {
    match reference.rsplit_once(':') {
        Some((name, tag)) if !tag.contains('/') && !name.is_empty() => Ok((name, tag)),
        _ => Err(Error::NodeSetup(format!(
            "image reference {reference:?} has no tag (nodes import images, they never pull)"
        ))),
    }
}

/// What an image declares, as read from its OCI layout tarball.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ImageConfig {
    /// `config.Entrypoint`.
    pub entrypoint: Vec<String>,
    /// `config.User`.
    pub user: String,
    /// `config.ExposedPorts` keys (`8080/tcp`).
    pub exposed_ports: BTreeSet<String>,
    /// Every path in its layers (`/banlieue-proxmox`, …).
    pub files: BTreeSet<String>,
}

impl ImageConfig {
    /// Reads the image of an OCI layout tarball with one manifest.
    pub fn read(tarball: &Path) -> Result<Self> {
        let index: serde_json::Value = json_member(tarball, "index.json")?;
        let manifest_digest = index["manifests"][0]["digest"]
            .as_str()
            .ok_or_else(|| bad(tarball, "index.json has no manifest"))?;
        let manifest: serde_json::Value = json_member(tarball, &blob_path(manifest_digest))?;
        let config_digest = manifest["config"]["digest"]
            .as_str()
            .ok_or_else(|| bad(tarball, "the manifest has no config"))?;
        let config: serde_json::Value = json_member(tarball, &blob_path(config_digest))?;
        let strings = |v: &serde_json::Value| -> Vec<String> {
            v.as_array()
                .map(|a| a.iter().filter_map(|s| s.as_str().map(str::to_owned)).collect())
                .unwrap_or_default()
        };
        let mut files = BTreeSet::new();
        for layer in manifest["layers"].as_array().into_iter().flatten() {
            let digest = layer["digest"]
                .as_str()
                .ok_or_else(|| bad(tarball, "a layer without a digest"))?;
            let bytes = member(tarball, &blob_path(digest))?;
            files.extend(layer_files(tarball, &bytes)?);
        }
        Ok(Self {
            entrypoint: strings(&config["config"]["Entrypoint"]),
            user: config["config"]["User"].as_str().unwrap_or_default().to_owned(),
            exposed_ports: config["config"]["ExposedPorts"]
                .as_object()
                .map(|ports| ports.keys().cloned().collect())
                .unwrap_or_default(),
            files,
        })
    }
}

fn bad(tarball: &Path, message: &str) -> Error {
    Error::Manifest {
        what: tarball.display().to_string(),
        message: message.to_owned(),
    }
}

fn blob_path(digest: &str) -> String {
    format!("blobs/{}", digest.replacen(':', "/", 1))
}

/// The bytes of `./name` in the tarball.
fn member(tarball: &Path, name: &str) -> Result<Vec<u8>> {
    let output = Command::new("tar")
        .arg("-xOf")
        .arg(tarball)
        .arg(format!("./{name}"))
        .output()
        .map_err(|source| Error::Spawn {
            name: "tar".to_owned(),
            source,
        })?;
    if !output.status.success() {
        return Err(bad(
            tarball,
            &format!("no {name}: {}", String::from_utf8_lossy(&output.stderr)),
        ));
    }
    Ok(output.stdout)
}

fn json_member(tarball: &Path, name: &str) -> Result<serde_json::Value> {
    serde_json::from_slice(&member(tarball, name)?).map_err(|e| bad(tarball, &format!("{name}: {e}")))
}

/// The paths in a gzip-compressed layer (`/etc/passwd`, …).
fn layer_files(tarball: &Path, layer: &[u8]) -> Result<Vec<String>> {
    use std::io::Write as _;
    let mut child = Command::new("tar")
        .arg("-tzf")
        .arg("-")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .map_err(|source| Error::Spawn {
            name: "tar".to_owned(),
            source,
        })?;
    let mut stdin = child
        .stdin
        .take()
        .ok_or_else(|| bad(tarball, "tar has no stdin"))?;
    let bytes = layer.to_vec();
    let writer = std::thread::spawn(move || stdin.write_all(&bytes));
    let output = child.wait_with_output().map_err(|source| Error::Spawn {
        name: "tar".to_owned(),
        source,
    })?;
    let _ = writer.join();
    if !output.status.success() {
        return Err(bad(tarball, "a layer is not a gzip tarball"));
    }
    Ok(String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|line| format!("/{}", line.trim_start_matches("./").trim_end_matches('/')))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reference_needs_a_tag() {
        assert_eq!(
            split_reference("ghcr.io/banlieue/banlieue-proxmox:v0.1.0").unwrap(),
            ("ghcr.io/banlieue/banlieue-proxmox", "v0.1.0")
        );
        assert!(split_reference("registry:5000/busybox").is_err());
        assert!(split_reference("busybox").is_err());
    }
}
