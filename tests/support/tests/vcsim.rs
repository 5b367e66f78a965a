//! govmomi's vSphere simulator built by `tests/controlplane/build.sh` starts on a free port,
//! announces its URL and answers the vSphere SOAP API.

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use banlieue_testenv::{ManagedProcess, bin_dir};

const TIMEOUT: Duration = Duration::from_secs(60);

/// One HTTP/1.0 POST (the server closes the connection after answering).
fn post(host: &str, path: &str, body: &str) -> Result<String> {
    let mut stream = TcpStream::connect(host)?;
    stream.set_read_timeout(Some(TIMEOUT))?;
    stream.set_write_timeout(Some(TIMEOUT))?;
    write!(
        stream,
        "POST {path} HTTP/1.0\r\nHost: {host}\r\nContent-Type: text/xml\r\nSOAPAction: urn:vim25/8.0\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    )?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    Ok(response)
}

#[test]
fn vcsim_serves_the_vsphere_api() -> Result<()> {
    let dir = std::env::temp_dir().join(format!("banlieue-testenv-vcsim-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let env_file = dir.join("vcsim.env");
    let args = ["-l", "127.0.0.1:0", "-tls=false", "-dc", "2", "-E"].map(str::to_owned);
    let mut args = args.to_vec();
    args.push(env_file.display().to_string());
    let mut vcsim = ManagedProcess::start("vcsim", &bin_dir().join("vcsim"), &args, &dir.join("vcsim.log"))?;

    // vcsim writes `export GOVC_URL=http://user:pass@127.0.0.1:PORT/sdk GOVC_SIM_PID=…` once listening.
    let deadline = Instant::now() + TIMEOUT;
    let url = loop {
        vcsim.check_running()?;
        let text = std::fs::read_to_string(&env_file).unwrap_or_default();
        if let Some(url) = text.split_whitespace().find_map(|w| w.strip_prefix("GOVC_URL=")) {
            break url.to_owned();
        }
        if Instant::now() > deadline {
            bail!("vcsim announced no URL; log:\n{}", vcsim.log_tail(20));
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let host = url
        .strip_prefix("http://")
        .and_then(|rest| rest.rsplit_once('@').map(|(_, host)| host))
        .and_then(|rest| rest.strip_suffix("/sdk"))
        .with_context(|| format!("unexpected GOVC_URL {url}"))?
        .to_owned();

    let envelope = r#"<?xml version="1.0" encoding="UTF-8"?>
<soapenv:Envelope xmlns:soapenv="http://schemas.xmlsoap.org/soap/envelope/" xmlns:urn="urn:vim25">
<soapenv:Body><urn:RetrieveServiceContent><urn:_this type="ServiceInstance">ServiceInstance</urn:_this>
</urn:RetrieveServiceContent></soapenv:Body></soapenv:Envelope>"#;
    let response = post(&host, "/sdk", envelope)?;
    ensure!(
        response.starts_with("HTTP/1.0 200"),
        "unexpected answer: {response}"
    );
    ensure!(
        response.contains("<apiType>VirtualCenter</apiType>"),
        "not a vCenter: {response}"
    );
    ensure!(
        response.contains("<rootFolder type=\"Folder\">"),
        "no inventory root: {response}"
    );

    let fault = post(&host, "/sdk", "<not-soap/>")?;
    ensure!(
        !fault.starts_with("HTTP/1.0 200"),
        "garbage was accepted: {fault}"
    );

    drop(vcsim);
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}
