//! A disk image the provider downloads itself, pinned by its checksum.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A disk image to import from a URL. The provider downloads it once per storage (every
/// machine naming the same checksum shares that import), verifies the checksum before anything
/// uses it, and refuses a mismatch with a condition; the download's progress shows in the
/// machine's `Ready` condition (reason `ImportingImage`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "self.checksumAlgorithm == 'SHA256' ? size(self.checksum) == 64 : size(self.checksum) == 128",
        "message": "checksum must have 64 hex digits for SHA256 and 128 for SHA512"
    }
]))]
pub struct ImageDownload {
    /// Where the image is served: `http://` or `https://` (certificates verified against the
    /// web PKI; plain HTTP is safe because the checksum is verified). QCOW2 or raw; the format
    /// is read from the image itself.
    #[schemars(length(min = 8, max = 2048), regex(pattern = r"^https?://[^\s]+$"))]
    pub url: String,
    /// Algorithm of `checksum`: `SHA256` or `SHA512`.
    pub checksum_algorithm: ChecksumAlgorithm,
    /// The image's digest as lower-case hex, as published next to it (e.g. in `SHA256SUMS`).
    #[schemars(length(min = 64, max = 128), regex(pattern = r"^[0-9a-f]+$"))]
    pub checksum: String,
}

/// Digest algorithm of an [`ImageDownload`]'s checksum.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum ChecksumAlgorithm {
    /// SHA-256 (64 hex digits).
    #[default]
    #[serde(rename = "SHA256")]
    Sha256,
    /// SHA-512 (128 hex digits).
    #[serde(rename = "SHA512")]
    Sha512,
}

impl ChecksumAlgorithm {
    /// The lower-case name (`sha256`, `sha512`), as volume names and Proxmox use it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Sha256 => "sha256",
            Self::Sha512 => "sha512",
        }
    }
}
