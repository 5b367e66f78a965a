//! TLS for the SOAP endpoint: the verification modes of this client. The rustls configuration
//! and the HTTPS connector are `banlieue-provider-runtime`'s (`tls` feature), shared with the
//! Proxmox client.

use banlieue_provider_runtime::tls::{self as shared, Trust};
pub(crate) use banlieue_provider_runtime::tls::{HttpsConnector, TlsHandshakeError};

use crate::error::{Error, Result};

/// How vCenter's certificate is checked. The default verifies against the web PKI roots.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum TlsVerification {
    /// Chain and host name against the Mozilla roots (webpki-roots).
    #[default]
    WebPki,
    /// Chain and host name against the certificates of this PEM bundle only.
    CaBundle(String),
    /// Exactly the leaf certificate with this SHA-256 thumbprint (hex, `:` optional); chain and
    /// host name are not checked, handshake signatures are.
    Thumbprint(String),
    /// Any certificate: explicit opt-in for labs, never the default.
    InsecureSkipVerify,
}

/// Checks a `tls.serverName` (a DNS name or an IP address).
pub(crate) fn check_server_name(name: &str) -> Result<()> {
    shared::check_server_name(name).map_err(|e| Error::Config(e.to_string()))
}

/// Parses a SHA-256 thumbprint: 64 hex digits, optionally colon-separated.
pub fn parse_thumbprint(text: &str) -> Result<[u8; 32]> {
    shared::parse_sha256(text)
        .map_err(|_| Error::Config(format!("SHA-256 thumbprint {text:?}: expected 64 hex digits")))
}

/// The SHA-256 thumbprint of a DER certificate, as `AB:CD:…`.
pub fn thumbprint_of(der: &[u8]) -> String {
    shared::sha256_of(der)
}

/// The rustls configuration for a verification mode.
pub(crate) fn client_config(mode: &TlsVerification) -> Result<rustls::ClientConfig> {
    let trust = match mode {
        TlsVerification::WebPki => Trust::WebPki,
        TlsVerification::CaBundle(pem) => Trust::CaBundle(pem.clone()),
        TlsVerification::Thumbprint(tp) => Trust::Pinned(parse_thumbprint(tp)?),
        TlsVerification::InsecureSkipVerify => Trust::Insecure,
    };
    shared::client_config(&trust).map_err(|e| Error::Config(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thumbprints_parse_with_and_without_colons() {
        let colon = "AB:".repeat(31) + "CD";
        let parsed = parse_thumbprint(&colon).unwrap();
        assert_eq!((parsed[0], parsed[31]), (0xAB, 0xCD));
        assert_eq!(
            parse_thumbprint(&colon.replace(':', "").to_lowercase()).unwrap(),
            parsed
        );
        assert!(parse_thumbprint("AB:CD").is_err());
        assert!(parse_thumbprint(&"ZZ".repeat(32)).is_err());
    }

    #[test]
    fn empty_ca_bundle_is_a_config_error() {
        assert!(matches!(
            client_config(&TlsVerification::CaBundle("nothing".into())),
            Err(Error::Config(_))
        ));
    }
}
