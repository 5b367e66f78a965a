//! TLS: verification modes (web PKI, CA bundle, pinned leaf fingerprint, explicit insecure) and the
//! HTTPS connector used by the hyper client.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper_util::client::legacy::connect::{Connected, Connection};
use hyper_util::rt::TokioIo;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use sha2::{Digest, Sha256};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

use crate::error::{BoxError, Error, Result};

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

/// Parses a SHA-256 fingerprint: 32 bytes as hex, with or without `:` separators, any case.
pub fn parse_fingerprint(text: &str) -> Result<[u8; 32]> {
    let hex: String = text.chars().filter(|c| *c != ':' && !c.is_whitespace()).collect();
    if hex.len() != 64 || !hex.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err(Error::parse(
            "SHA-256 fingerprint",
            text,
            "expected 32 hex-encoded bytes",
        ));
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16)
            .map_err(|e| Error::parse("SHA-256 fingerprint", text, e.to_string()))?;
    }
    Ok(out)
}

/// Formats the SHA-256 fingerprint of a DER certificate as PVE shows it (`AB:CD:…`).
pub fn fingerprint_of(der: &[u8]) -> String {
    let digest = Sha256::digest(der);
    digest
        .iter()
        .map(|b| format!("{b:02X}"))
        .collect::<Vec<_>>()
        .join(":")
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Builds the rustls client configuration for a verification mode.
pub(crate) fn client_config(mode: &TlsVerification) -> Result<rustls::ClientConfig> {
    let provider = provider();
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Config(format!("TLS protocol versions: {e}")))?;
    let config = match mode {
        TlsVerification::WebPki => {
            let roots = rustls::RootCertStore {
                roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
            };
            builder.with_root_certificates(roots).with_no_client_auth()
        }
        TlsVerification::CaBundle(pem) => {
            let mut roots = rustls::RootCertStore::empty();
            let mut reader = std::io::BufReader::new(pem.as_bytes());
            for cert in rustls_pemfile::certs(&mut reader) {
                let cert = cert.map_err(|e| Error::Config(format!("CA bundle: {e}")))?;
                roots
                    .add(cert)
                    .map_err(|e| Error::Config(format!("CA bundle certificate: {e}")))?;
            }
            if roots.is_empty() {
                return Err(Error::Config("CA bundle contains no PEM certificate".into()));
            }
            builder.with_root_certificates(roots).with_no_client_auth()
        }
        TlsVerification::Fingerprint(fp) => {
            let verifier = PinnedVerifier {
                pin: Some(parse_fingerprint(fp)?),
                algs: provider.signature_verification_algorithms,
            };
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(verifier))
                .with_no_client_auth()
        }
        TlsVerification::InsecureSkipVerify => {
            let verifier = PinnedVerifier {
                pin: None,
                algs: provider.signature_verification_algorithms,
            };
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(verifier))
                .with_no_client_auth()
        }
    };
    Ok(config)
}

/// Accepts the leaf whose SHA-256 matches `pin` (any leaf when `pin` is `None`: insecure opt-in),
/// and still verifies the TLS handshake signatures against that leaf's public key.
#[derive(Debug)]
struct PinnedVerifier {
    pin: Option<[u8; 32]>,
    algs: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for PinnedVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        match self.pin {
            None => Ok(ServerCertVerified::assertion()),
            Some(pin) if Sha256::digest(end_entity.as_ref()).as_slice() == pin => {
                Ok(ServerCertVerified::assertion())
            }
            Some(_) => Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::Other(rustls::OtherError(Arc::new(FingerprintMismatch(
                    fingerprint_of(end_entity.as_ref()),
                )))),
            )),
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algs)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algs)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algs.supported_schemes()
    }
}

#[derive(Debug, thiserror::Error)]
#[error("server certificate fingerprint {0} does not match the pinned fingerprint")]
struct FingerprintMismatch(String);

/// The TLS handshake failed (certificate rejected, protocol mismatch): not transient.
#[derive(Debug, thiserror::Error)]
#[error("TLS handshake failed: {0}")]
pub(crate) struct TlsHandshakeError(pub(crate) String);

/// Connects TCP (with a timeout) and runs the TLS handshake.
#[derive(Clone)]
pub(crate) struct HttpsConnector {
    pub(crate) tls: tokio_rustls::TlsConnector,
    pub(crate) connect_timeout: Duration,
}

impl tower_service::Service<http::Uri> for HttpsConnector {
    type Response = TlsConn;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = std::result::Result<TlsConn, BoxError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<std::result::Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: http::Uri) -> Self::Future {
        let tls = self.tls.clone();
        let timeout = self.connect_timeout;
        Box::pin(async move {
            let host = uri.host().ok_or("URL has no host")?;
            let host = host.trim_start_matches('[').trim_end_matches(']').to_owned();
            let port = uri.port_u16().unwrap_or(443);
            let connect = async {
                let tcp = TcpStream::connect((host.as_str(), port)).await?;
                tcp.set_nodelay(true)?;
                let name = ServerName::try_from(host.clone())?;
                let stream = tls
                    .connect(name, tcp)
                    .await
                    .map_err(|e| TlsHandshakeError(e.to_string()))?;
                Ok::<_, BoxError>(TlsConn(TokioIo::new(stream)))
            };
            tokio::time::timeout(timeout, connect)
                .await
                .map_err(|_| format!("connecting to {host}:{port} timed out after {timeout:?}"))?
        })
    }
}

/// A TLS connection usable by hyper.
pub(crate) struct TlsConn(TokioIo<TlsStream<TcpStream>>);

impl Connection for TlsConn {
    fn connected(&self) -> Connected {
        Connected::new()
    }
}

impl hyper::rt::Read for TlsConn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_read(cx, buf)
    }
}

impl hyper::rt::Write for TlsConn {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().0).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_fingerprints_in_pve_and_plain_form() {
        let colon = "AB:".repeat(31) + "CD";
        let parsed = parse_fingerprint(&colon).unwrap();
        assert_eq!(parsed[0], 0xAB);
        assert_eq!(parsed[31], 0xCD);
        assert_eq!(
            parse_fingerprint(&colon.replace(':', "").to_lowercase()).unwrap(),
            parsed
        );
    }

    #[test]
    fn rejects_malformed_fingerprints() {
        assert!(parse_fingerprint("AB:CD").is_err());
        assert!(parse_fingerprint(&"ZZ".repeat(32)).is_err());
        assert!(parse_fingerprint("").is_err());
    }

    #[test]
    fn fingerprint_formatting_round_trips() {
        let fp = fingerprint_of(b"not really a certificate");
        assert_eq!(fp.len(), 32 * 3 - 1);
        assert_eq!(
            parse_fingerprint(&fp).unwrap().as_slice(),
            Sha256::digest(b"not really a certificate").as_slice()
        );
    }

    #[test]
    fn empty_ca_bundle_is_a_config_error() {
        let err = client_config(&TlsVerification::CaBundle("no pem here".into())).unwrap_err();
        assert!(matches!(err, Error::Config(_)), "{err}");
    }

    #[test]
    fn builds_every_mode() {
        client_config(&TlsVerification::WebPki).unwrap();
        client_config(&TlsVerification::InsecureSkipVerify).unwrap();
        client_config(&TlsVerification::Fingerprint("00".repeat(32))).unwrap();
    }
}
