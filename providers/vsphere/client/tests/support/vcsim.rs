//! Starts govmomi's vcsim (built by `tests/controlplane/build.sh`) on loopback with a fresh CA
//! and server certificate, a fixed user and password, and returns how to reach it.
//! Shared by the client's and the provider's test binaries (`#[path]`-included).

#![allow(dead_code)]

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use banlieue_testenv::{ManagedProcess, bin_dir};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use sha2::{Digest, Sha256};

/// User name vcsim accepts.
pub const USER: &str = "banlieue";
/// Password vcsim accepts.
pub const PASSWORD: &str = "s3cr3t-p4ss";

/// A running vcsim.
pub struct Vcsim {
    /// `host:port`.
    pub host: String,
    /// `https://host:port/sdk`.
    pub url: String,
    /// PEM of the CA that signed the server certificate.
    pub ca_pem: String,
    /// SHA-256 thumbprint of the server certificate (`AB:CD:…`).
    pub thumbprint: String,
    /// DER of the server certificate (for a TLS front when vcsim runs with `-tls=false`).
    pub cert_der: Vec<u8>,
    /// PKCS#8 DER of the server certificate's key.
    pub key_der: Vec<u8>,
    process: ManagedProcess,
    dir: PathBuf,
}

impl Vcsim {
    /// Starts vcsim with the default VPX model plus `extra` flags (e.g. `["-cluster", "2"]`).
    pub fn start(extra: &[&str]) -> Result<Self> {
        Self::start_on(std::net::Ipv4Addr::LOCALHOST, extra)
    }

    /// Like [`Vcsim::start`], listening on `address` (which its certificate names too): the host's
    /// address on a node bridge, for clients in Pods.
    pub fn start_on(address: std::net::Ipv4Addr, extra: &[&str]) -> Result<Self> {
        static SEQ: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("banlieue-vcsim-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;

        let ca_key = KeyPair::generate()?;
        let mut ca = CertificateParams::new(Vec::<String>::new())?;
        ca.distinguished_name
            .push(DnType::CommonName, "banlieue test vCenter CA");
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature];
        let ca_cert = ca.self_signed(&ca_key)?;
        let issuer = Issuer::new(ca, ca_key);
        let leaf_key = KeyPair::generate()?;
        let mut names = vec!["localhost".to_owned(), "127.0.0.1".to_owned()];
        if !address.is_loopback() {
            names.push(address.to_string());
        }
        let mut leaf = CertificateParams::new(names)?;
        leaf.distinguished_name
            .push(DnType::CommonName, "vcsim.banlieue.invalid");
        leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let leaf_cert = leaf.signed_by(&leaf_key, &issuer)?;
        let thumbprint = Sha256::digest(leaf_cert.der())
            .iter()
            .map(|b| format!("{b:02X}"))
            .collect::<Vec<_>>()
            .join(":");
        let cert_file = dir.join("server.pem");
        let key_file = dir.join("server-key.pem");
        std::fs::write(&cert_file, leaf_cert.pem())?;
        std::fs::write(&key_file, leaf_key.serialize_pem())?;

        let env_file = dir.join("vcsim.env");
        let listen = format!("{address}:0");
        let mut args: Vec<String> = [
            "-l",
            listen.as_str(),
            "-tls=true",
            "-username",
            USER,
            "-password",
            PASSWORD,
        ]
        .map(str::to_owned)
        .to_vec();
        args.extend(["-tlscert".to_owned(), cert_file.display().to_string()]);
        args.extend(["-tlskey".to_owned(), key_file.display().to_string()]);
        args.extend(["-E".to_owned(), env_file.display().to_string()]);
        args.extend(extra.iter().map(|s| (*s).to_owned()));
        let program = bin_dir().join("vcsim");
        if !program.exists() {
            bail!(
                "{} is missing: run tests/controlplane/build.sh",
                program.display()
            );
        }
        let mut process = ManagedProcess::start("vcsim", &program, &args, &dir.join("vcsim.log"))?;
        let deadline = Instant::now() + Duration::from_secs(60);
        let url = loop {
            process.check_running()?;
            let text = std::fs::read_to_string(&env_file).unwrap_or_default();
            if let Some(url) = text.split_whitespace().find_map(|w| w.strip_prefix("GOVC_URL=")) {
                break url.to_owned();
            }
            if Instant::now() > deadline {
                bail!("vcsim announced no URL; log:\n{}", process.log_tail(20));
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let host = url
            .split_once("://")
            .map(|(_, rest)| rest)
            .map(|rest| rest.rsplit_once('@').map_or(rest, |(_, h)| h))
            .and_then(|rest| rest.strip_suffix("/sdk"))
            .with_context(|| format!("unexpected GOVC_URL {url}"))?
            .to_owned();
        Ok(Self {
            url: format!("https://{host}/sdk"),
            host,
            ca_pem: ca_cert.pem(),
            thumbprint,
            cert_der: leaf_cert.der().to_vec(),
            key_der: leaf_key.serialize_der(),
            process,
            dir,
        })
    }

    /// A client of this vcsim, trusting its CA.
    pub fn client(&self) -> Result<banlieue_vsphere_client::Client> {
        self.client_as(USER, PASSWORD)
    }

    /// A client of `user` (a `-role-user` of vcsim, whose role it checks).
    #[allow(dead_code, reason = "not every test binary logs in as another user")]
    pub fn client_as(&self, user: &str, password: &str) -> Result<banlieue_vsphere_client::Client> {
        Ok(
            banlieue_vsphere_client::ClientBuilder::new(&self.url, user, password)
                .tls(banlieue_vsphere_client::TlsVerification::CaBundle(
                    self.ca_pem.clone(),
                ))
                .build()?,
        )
    }

    /// Powers vcsim's model VM `/DC0/vm/<name>` off and marks it as a template (what the tests
    /// clone from); returns it.
    pub async fn make_template(
        &self,
        client: &banlieue_vsphere_client::Client,
        name: &str,
    ) -> Result<banlieue_vsphere_client::MoRef> {
        let model = client
            .find_by_inventory_path(&format!("/DC0/vm/{name}"))
            .await?
            .with_context(|| format!("no model VM {name} in vcsim"))?;
        let task = client.power_off(&model).await?;
        client
            .wait_task(&task, Duration::from_millis(50), Duration::from_secs(60))
            .await?;
        client.mark_as_template(&model).await?;
        Ok(model)
    }

    /// Turns DRS off on cluster `path` (vcsim's clusters have it on): VMs cloned into its pool
    /// are then placed by the caller.
    pub async fn disable_drs(&self, client: &banlieue_vsphere_client::Client, path: &str) -> Result<()> {
        let cluster = client
            .find_by_inventory_path(path)
            .await?
            .with_context(|| format!("no cluster {path} in vcsim"))?;
        let body = format!(
            "{}<spec xsi:type=\"ClusterConfigSpecEx\"><drsConfig><enabled>false</enabled></drsConfig></spec><modify>true</modify>",
            cluster.to_xml("_this")
        );
        let response = client.call("ReconfigureComputeResource_Task", &body).await?;
        let task = response
            .child("returnval")
            .and_then(banlieue_vsphere_client::MoRef::from_xml)
            .context("ReconfigureComputeResource_Task returned no task")?;
        client
            .wait_task(&task, Duration::from_millis(50), Duration::from_secs(60))
            .await?;
        Ok(())
    }

    /// The last lines of vcsim's log.
    pub fn log_tail(&self, n: usize) -> String {
        self.process.log_tail(n)
    }

    /// Stops vcsim (e.g. to inject an outage mid-task).
    pub fn stop(&mut self) {
        self.process.stop();
    }
}

impl Drop for Vcsim {
    fn drop(&mut self) {
        self.process.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
