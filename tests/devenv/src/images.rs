//! banlieue's container images built here, without a registry or a container runtime, for the
//! harness's real nodes: each is the binary cargo built (beside this one) with the libraries it
//! links, under the name and tag the clusterctl components reference, and with the entrypoint,
//! user and ports of its `Dockerfile` stage (a test holds them against the Dockerfile). The
//! Dockerfile stays the recipe of the published images (static musl on distroless).

use std::path::{Path, PathBuf};

use anyhow::Context;
use banlieue_testenv::images::BinaryImage;

/// One of banlieue's images.
#[derive(Clone, Copy, Debug)]
pub struct Image {
    /// Its stage in the `Dockerfile` (`docker build --target …`).
    pub dockerfile_target: &'static str,
    /// The cargo binary it holds.
    pub binary: &'static str,
    /// Name and tag, as the components YAML in `clusterctl/dist/` reference it by default.
    pub reference: &'static str,
    /// Exposed ports: metrics, and health probes for the providers.
    pub ports: &'static [u16],
}

/// User every image runs as (distroless `nonroot`).
pub const USER: &str = "65532:65532";

/// The Proxmox provider's image.
pub const PROXMOX: Image = Image {
    dockerfile_target: "proxmox",
    binary: "banlieue-proxmox",
    reference: "ghcr.io/banlieue/banlieue-proxmox:v0.1.0",
    ports: &[8080, 8081],
};

/// The vSphere provider's image.
pub const VSPHERE: Image = Image {
    dockerfile_target: "vsphere",
    binary: "banlieue-vsphere",
    reference: "ghcr.io/banlieue/banlieue-vsphere:v0.1.0",
    ports: &[8080, 8081],
};

/// The banlieue controller's image (`banlieue controller …`).
pub const CONTROLLER: Image = Image {
    dockerfile_target: "controller",
    binary: "banlieue",
    reference: "ghcr.io/banlieue/banlieue:v0.1.0",
    ports: &[8080],
};

/// The libvirt provider's image.
pub const LIBVIRT: Image = Image {
    dockerfile_target: "libvirt",
    binary: "banlieue-libvirt",
    reference: "ghcr.io/banlieue/banlieue-libvirt:v0.1.0",
    ports: &[8080, 8081],
};

/// Every image: the three providers and the banlieue controller.
pub const ALL: [Image; 4] = [PROXMOX, VSPHERE, LIBVIRT, CONTROLLER];

impl Image {
    /// Where the binary sits in the image (its entrypoint), as in the Dockerfile.
    pub fn path(&self) -> String {
        format!("/{}", self.binary)
    }

    /// Builds the image from the binary in `bin_dir` into `out` and returns the tarball.
    pub fn build(&self, bin_dir: &Path, out: &Path) -> anyhow::Result<PathBuf> {
        let binary = bin_dir.join(self.binary);
        anyhow::ensure!(
            binary.is_file(),
            "{} is missing: `cargo build -p <its crate>` (cargo test --workspace builds it)",
            binary.display()
        );
        let path = self.path();
        BinaryImage {
            reference: self.reference,
            binary: &binary,
            path: &path,
            user: USER,
            ports: self.ports,
        }
        .build(out)
        .with_context(|| format!("building image {}", self.reference))
    }
}
