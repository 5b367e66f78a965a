//! TLS: the verification modes of this client (web PKI, CA bundle, pinned leaf fingerprint,
//! explicit insecure). The rustls configuration and the HTTPS connector are
//! `banlieue-provider-runtime`'s (`tls` feature), shared with the vSphere client.

pub(crate) use banlieue_provider_runtime::tls::HttpsConnector;
use banlieue_provider_runtime::tls::{self as shared, ConfigError, Trust};
pub use banlieue_provider_runtime::tls::{TlsFailureKind, TlsHandshakeError};

use crate::error::{Error, Result};

/// How the client checks the server certificate. The default is [`TlsVerification::WebPki`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum TlsVerification {
    /// Verify the chain against the Mozilla root store (webpki-roots) and the host name.
    #[default]
    WebPki,
    /// Verify the chain and host name against the certificates of this PEM bundle only
    /// (e.g. `/etc/pve/pve-root-ca.pem`, or a self-signed node certificate).
    CaBundle(String),
    /// Accept exactly the leaf certificate with this SHA-256 fingerprint (`AB:CD:…` or plain hex,
    /// as PVE shows it), ignoring chain and host name, but still checking the handshake
    /// signatures made with that certificate's key.
    Fingerprint(String),
    /// Accept any certificate. Only for explicit opt-in (e.g. a lab); never the default.
    InsecureSkipVerify,
}

/// Checks a `tls.serverName` (a DNS name or an IP address).
pub(crate) fn check_server_name(name: &str) -> Result<()> {
    shared::check_server_name(name).map_err(|e| Error::Config(e.to_string()))
}

/// Parses a SHA-256 fingerprint: 32 bytes as hex, with or without `:` separators, any case.
pub fn parse_fingerprint(text: &str) -> Result<[u8; 32]> {
    shared::parse_sha256(text)
        .map_err(|_| Error::parse("SHA-256 fingerprint", text, "expected 32 hex-encoded bytes"))
}

/// Formats the SHA-256 fingerprint of a DER certificate as PVE shows it (`AB:CD:…`).
pub fn fingerprint_of(der: &[u8]) -> String {
    shared::sha256_of(der)
}

/// Builds the rustls client configuration for a verification mode.
pub(crate) fn client_config(mode: &TlsVerification) -> Result<rustls::ClientConfig> {
    let trust = match mode {
        TlsVerification::WebPki => Trust::WebPki,
        TlsVerification::CaBundle(pem) => Trust::CaBundle(pem.clone()),
        TlsVerification::Fingerprint(fp) => Trust::Pinned(parse_fingerprint(fp)?),
        TlsVerification::InsecureSkipVerify => Trust::Insecure,
    };
    shared::client_config(&trust).map_err(|e: ConfigError| Error::Config(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_fingerprints_in_pve_and_plain_form() {
        let colon = format!("AB:{}:CD", ["00"; 30].join(":"));
        let parsed = parse_fingerprint(&colon).unwrap();
        assert_eq!((parsed[0], parsed[31]), (0xAB, 0xCD));
        assert_eq!(
            parse_fingerprint(&colon.replace(':', "").to_lowercase()).unwrap(),
            parsed
        );
        assert!(matches!(parse_fingerprint("AB:CD"), Err(Error::Parse { .. })));
    }

    #[test]
    fn fingerprint_formatting_round_trips() {
        let fp = fingerprint_of(b"not really a certificate");
        assert_eq!(
            parse_fingerprint(&fp).map(|p| fingerprint_of_bytes(&p)).unwrap(),
            fp
        );
    }

    fn fingerprint_of_bytes(digest: &[u8; 32]) -> String {
        digest
            .iter()
            .map(|b| format!("{b:02X}"))
            .collect::<Vec<_>>()
            .join(":")
    }

    #[test]
    fn every_mode_builds_and_a_bundle_without_certificates_is_a_config_error() {
        let err = client_config(&TlsVerification::CaBundle("no pem here".into())).unwrap_err();
        assert!(matches!(err, Error::Config(_)), "{err}");
        client_config(&TlsVerification::WebPki).unwrap();
        client_config(&TlsVerification::InsecureSkipVerify).unwrap();
        client_config(&TlsVerification::Fingerprint("00".repeat(32))).unwrap();
        assert!(client_config(&TlsVerification::Fingerprint("00".into())).is_err());
    }
}
