//! Self-signed certificates and keys for one control plane.

use std::net::IpAddr;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose, SanType,
};

use crate::error::{Error, Result};

/// A certificate and its private key, both PEM encoded.
#[derive(Clone)]
pub struct CertAndKey {
    /// The certificate (PEM).
    pub cert_pem: String,
    /// Its private key (PKCS#8 PEM).
    pub key_pem: String,
}

impl std::fmt::Debug for CertAndKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertAndKey")
            .field("key_pem", &"<redacted>")
            .finish_non_exhaustive()
    }
}

/// The cluster CA, able to issue serving and client certificates at any time.
pub(crate) struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl std::fmt::Debug for Ca {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ca").finish_non_exhaustive()
    }
}

impl Ca {
    /// Generates a fresh CA (ECDSA P-256).
    pub(crate) fn generate() -> Result<Self> {
        let what = "cluster CA";
        let key = KeyPair::generate().map_err(|e| Error::pki(what, e))?;
        let mut params = CertificateParams::default();
        params
            .distinguished_name
            .push(DnType::CommonName, "banlieue-testenv-ca");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let issuer = CertifiedIssuer::self_signed(params, key).map_err(|e| Error::pki(what, e))?;
        Ok(Self { issuer })
    }

    /// The CA certificate (PEM).
    pub(crate) fn cert_pem(&self) -> String {
        self.issuer.pem()
    }

    /// The CA's private key (PKCS#8 PEM).
    pub(crate) fn key_pem(&self) -> String {
        self.issuer.key().serialize_pem()
    }

    /// Issues a TLS serving certificate for the given IP addresses and DNS names.
    pub(crate) fn issue_serving(&self, ips: &[IpAddr], dns_names: &[&str]) -> Result<CertAndKey> {
        let what = "serving certificate";
        let mut params = CertificateParams::default();
        params
            .distinguished_name
            .push(DnType::CommonName, "kube-apiserver");
        params.subject_alt_names = ips.iter().map(|ip| SanType::IpAddress(*ip)).collect();
        for name in dns_names {
            let name = (*name).to_owned().try_into().map_err(|e| Error::pki(what, e))?;
            params.subject_alt_names.push(SanType::DnsName(name));
        }
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.sign(what, &params)
    }

    /// Issues a client certificate: Kubernetes reads the user name from the common name and the
    /// groups from the organizations.
    pub(crate) fn issue_client(&self, user: &str, groups: &[&str]) -> Result<CertAndKey> {
        let what = format!("client certificate for {user}");
        let mut params = CertificateParams::default();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, user);
        for group in groups {
            params.distinguished_name.push(DnType::OrganizationName, *group);
        }
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.sign(&what, &params)
    }

    fn sign(&self, what: &str, params: &CertificateParams) -> Result<CertAndKey> {
        let key = KeyPair::generate().map_err(|e| Error::pki(what, e))?;
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(|e| Error::pki(what, e))?;
        Ok(CertAndKey {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}

/// A service-account token signing key pair (ECDSA P-256, PEM).
pub(crate) struct ServiceAccountKey {
    pub(crate) private_pem: String,
    pub(crate) public_pem: String,
}

impl ServiceAccountKey {
    /// Generates a fresh signing key.
    pub(crate) fn generate() -> Result<Self> {
        let key = KeyPair::generate().map_err(|e| Error::pki("service-account signing key", e))?;
        Ok(Self {
            private_pem: key.serialize_pem(),
            public_pem: key.public_key_pem(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issues_pem_certificates_and_keys() {
        let ca = Ca::generate().unwrap();
        assert!(ca.cert_pem().starts_with("-----BEGIN CERTIFICATE-----"));
        let serving = ca
            .issue_serving(&["127.1.2.3".parse().unwrap()], &["localhost"])
            .unwrap();
        assert!(serving.cert_pem.starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(serving.key_pem.starts_with("-----BEGIN PRIVATE KEY-----"));
        let client = ca.issue_client("alice", &["team-a", "team-b"]).unwrap();
        assert_ne!(client.cert_pem, serving.cert_pem);
        assert!(!format!("{client:?}").contains("PRIVATE KEY"));
        let sa = ServiceAccountKey::generate().unwrap();
        assert!(sa.public_pem.starts_with("-----BEGIN PUBLIC KEY-----"));
        assert!(sa.private_pem.starts_with("-----BEGIN PRIVATE KEY-----"));
    }

    #[test]
    fn rejects_unusable_dns_names() {
        let ca = Ca::generate().unwrap();
        let err = ca.issue_serving(&[], &["bücher.example"]).unwrap_err();
        assert!(
            err.to_string().starts_with("generating serving certificate"),
            "{err}"
        );
    }
}
