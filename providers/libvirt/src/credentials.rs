//! Connection credentials of remote libvirt URIs, from a Secret, handed to libvirt as files.
//!
//! libvirt reads keys and certificates only from files named in the URI, so the Secret's
//! bytes are written to a private directory (mode 0700, files 0600) and the URI gets the
//! parameters that point at them:
//!
//! | transport | Secret keys | URI |
//! |---|---|---|
//! | `qemu+ssh`, `qemu+libssh`, `qemu+libssh2` | `ssh-privatekey`, `known_hosts` | `qemu+libssh://…?keyfile=<dir>/id&known_hosts=<dir>/known_hosts&sshauth=privkey` |
//! | `qemu+tls` | `ca.crt`, `tls.crt`, `tls.key` | `…?pkipath=<dir>` (`cacert.pem`, `clientcert.pem`, `clientkey.pem`) |
//!
//! `qemu+ssh://` is opened through libvirt's libssh transport: its OpenSSH transport cannot be
//! given a `known_hosts` file (it would use the controller's own `~/.ssh/known_hosts`), and the
//! host key must be verified. An unknown or changed host key fails the connection.
//!
//! The directory is named after the Secret and a hash of its content: a rotated Secret gets a
//! new directory (and so a new URI, hence a new connection) and the stale one is removed.
//! Nothing in this module puts a Secret's bytes into an error, a log line or a status: errors
//! name the Secret and the missing key only.

use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::io::Write as _;
use std::path::{Path, PathBuf};

use banlieue_provider_kit::cluster::Problem;

/// Key of the SSH private key (OpenSSH or PEM format).
pub const SSH_PRIVATE_KEY: &str = "ssh-privatekey";
/// Key of the `known_hosts` lines of the libvirt host.
pub const KNOWN_HOSTS: &str = "known_hosts";
/// Key of the CA certificate that signed the libvirt server's certificate.
pub const CA_CRT: &str = "ca.crt";
/// Key of the client certificate.
pub const TLS_CRT: &str = "tls.crt";
/// Key of the client certificate's private key.
pub const TLS_KEY: &str = "tls.key";
/// Environment variable overriding [`default_dir`].
pub const DIR_ENV: &str = "BANLIEUE_LIBVIRT_CREDENTIALS_DIR";

/// How a URI reaches its daemon, as far as credentials are concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    /// SSH (`+ssh`, `+libssh`, `+libssh2`).
    Ssh,
    /// TLS (`+tls`, or a remote `qemu://host/…` whose default transport is TLS).
    Tls,
    /// Local socket, plain TCP or the test driver: no files to pass.
    Other,
}

/// The transport of a libvirt URI.
pub fn transport(uri: &str) -> Transport {
    let Some((scheme, rest)) = uri.split_once("://") else {
        return Transport::Other;
    };
    match scheme.split_once('+').map(|(_, t)| t) {
        Some("ssh" | "libssh" | "libssh2") => Transport::Ssh,
        Some("tls") => Transport::Tls,
        Some(_) => Transport::Other,
        // `qemu://host/system` (with a host) defaults to TLS; `qemu:///system` is local.
        None if !rest.starts_with('/') && !scheme.starts_with("test") => Transport::Tls,
        None => Transport::Other,
    }
}

/// What to write and how the URI changes, before any file exists. Pure.
#[derive(Clone, PartialEq, Eq)]
pub struct Plan {
    /// Files (name in the directory, content).
    pub files: Vec<(&'static str, Vec<u8>)>,
    /// The transport the URI is opened with.
    pub transport: Transport,
}

impl std::fmt::Debug for Plan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the content.
        f.debug_struct("Plan")
            .field("files", &self.files.iter().map(|(n, _)| *n).collect::<Vec<_>>())
            .field("transport", &self.transport)
            .finish()
    }
}

/// Decides which Secret keys a URI needs and the files they become.
pub fn plan(uri: &str, secret: &str, data: &BTreeMap<String, Vec<u8>>) -> Result<Plan, Problem> {
    let take = |key: &str| -> Result<Vec<u8>, Problem> {
        match data.get(key) {
            Some(v) if !v.is_empty() => Ok(v.clone()),
            _ => Err(Problem::new(
                "CredentialsInvalid",
                format!("Secret {secret:?} has no (or an empty) key {key:?}, needed for {uri}"),
            )),
        }
    };
    match transport(uri) {
        Transport::Ssh => Ok(Plan {
            files: vec![
                ("id", take(SSH_PRIVATE_KEY)?),
                ("known_hosts", take(KNOWN_HOSTS)?),
            ],
            transport: Transport::Ssh,
        }),
        Transport::Tls => Ok(Plan {
            files: vec![
                ("cacert.pem", take(CA_CRT)?),
                ("clientcert.pem", take(TLS_CRT)?),
                ("clientkey.pem", take(TLS_KEY)?),
            ],
            transport: Transport::Tls,
        }),
        Transport::Other => Err(Problem::new(
            "CredentialsUnsupported",
            format!(
                "a credentials Secret ({secret:?}) is only used with qemu+ssh:// or qemu+tls:// URIs, not {uri}: remove credentialsRef or change the URI"
            ),
        )),
    }
}

/// Percent-encodes a URI query value (paths keep their `/`).
fn encode(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for b in value.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~/".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// `uri` with `params` set (replacing parameters of the same name). Pure.
pub fn with_params(uri: &str, params: &[(&str, String)]) -> String {
    let (base, query) = uri.split_once('?').unwrap_or((uri, ""));
    let mut pairs: Vec<String> = query
        .split('&')
        .filter(|p| !p.is_empty())
        .filter(|p| {
            let key = p.split_once('=').map_or(*p, |(k, _)| k);
            !params.iter().any(|(k, _)| *k == key)
        })
        .map(str::to_owned)
        .collect();
    pairs.extend(params.iter().map(|(k, v)| format!("{k}={}", encode(v))));
    if pairs.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", pairs.join("&"))
    }
}

/// The URI libvirt is opened with, given the directory holding the plan's files. Pure.
pub fn uri_for(uri: &str, plan: &Plan, dir: &Path) -> String {
    let path = |f: &str| dir.join(f).to_string_lossy().into_owned();
    match plan.transport {
        Transport::Ssh => {
            // libvirt's OpenSSH transport ignores known_hosts: use libssh.
            let uri = match uri.split_once("+ssh://") {
                Some((driver, rest)) => format!("{driver}+libssh://{rest}"),
                None => uri.to_owned(),
            };
            with_params(
                &uri,
                &[
                    ("keyfile", path("id")),
                    ("known_hosts", path("known_hosts")),
                    ("sshauth", "privkey".to_owned()),
                ],
            )
        }
        Transport::Tls => with_params(uri, &[("pkipath", dir.to_string_lossy().into_owned())]),
        Transport::Other => uri.to_owned(),
    }
}

/// Where credential files are written: `$BANLIEUE_LIBVIRT_CREDENTIALS_DIR`, else
/// `<temp dir>/banlieue-libvirt-credentials`.
pub fn default_dir() -> PathBuf {
    std::env::var_os(DIR_ENV)
        .map(PathBuf::from)
        .unwrap_or_else(|| std::env::temp_dir().join("banlieue-libvirt-credentials"))
}

fn sanitize(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

fn io_error(what: &str, e: &std::io::Error) -> Problem {
    // The path and the OS error only: never content.
    Problem::new(
        "CredentialsInvalid",
        format!("cannot write credential files: {what}: {e}"),
    )
}

#[cfg(unix)]
fn private_dir(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o700))
}

#[cfg(not(unix))]
fn private_dir(path: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(path)
}

#[cfg(unix)]
fn write_private(path: &Path, content: &[u8]) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension("tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)?;
    f.write_all(content)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)
}

#[cfg(not(unix))]
fn write_private(path: &Path, content: &[u8]) -> std::io::Result<()> {
    std::fs::write(path, content)
}

/// Writes the Secret's files under `base` (idempotent: an unchanged Secret rewrites nothing)
/// and returns the URI to open. `namespace`/`secret` name the Secret (for the directory name
/// and messages).
pub fn materialize(
    base: &Path,
    namespace: &str,
    secret: &str,
    uri: &str,
    data: &BTreeMap<String, Vec<u8>>,
) -> Result<String, Problem> {
    let plan = plan(uri, secret, data)?;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for (name, content) in &plan.files {
        name.hash(&mut h);
        content.hash(&mut h);
    }
    let prefix = format!("{}_{}_", sanitize(namespace), sanitize(secret));
    let dir = base.join(format!("{prefix}{:016x}", h.finish()));
    private_dir(base).map_err(|e| io_error(&base.to_string_lossy(), &e))?;
    private_dir(&dir).map_err(|e| io_error(&dir.to_string_lossy(), &e))?;
    for (name, content) in &plan.files {
        let path = dir.join(name);
        if std::fs::read(&path).is_ok_and(|c| c == *content) {
            continue;
        }
        write_private(&path, content).map_err(|e| io_error(&path.to_string_lossy(), &e))?;
    }
    // Older contents of the same Secret (rotated keys) are removed.
    if let Ok(entries) = std::fs::read_dir(base) {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with(&prefix) && e.path() != dir {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
    Ok(uri_for(uri, &plan, &dir))
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;
    use rstest::rstest;

    const MARKER: &str = "SECRET-MARKER-7f3a";

    fn data(keys: &[&str]) -> BTreeMap<String, Vec<u8>> {
        keys.iter()
            .map(|k| ((*k).to_owned(), format!("{MARKER} {k}\n").into_bytes()))
            .collect()
    }

    #[rstest]
    #[case("qemu+ssh://root@kvm1/system", Transport::Ssh)]
    #[case("qemu+libssh2://root@kvm1/system", Transport::Ssh)]
    #[case("qemu+tls://kvm1/system", Transport::Tls)]
    #[case("qemu://kvm1/system", Transport::Tls)]
    #[case("qemu:///system", Transport::Other)]
    #[case("qemu+tcp://kvm1/system", Transport::Other)]
    #[case("test:///default", Transport::Other)]
    fn transports(#[case] uri: &str, #[case] want: Transport) {
        assert_eq!(transport(uri), want);
    }

    #[test]
    fn params_are_appended_encoded_and_replace_same_named_ones() {
        assert_eq!(
            with_params("qemu+tls://h/system", &[("pkipath", "/a b/c".into())]),
            "qemu+tls://h/system?pkipath=/a%20b/c"
        );
        assert_eq!(
            with_params(
                "qemu+ssh://h/system?keyfile=/old&no_tty=1",
                &[("keyfile", "/new".into())]
            ),
            "qemu+ssh://h/system?no_tty=1&keyfile=/new"
        );
        assert_eq!(with_params("qemu:///system", &[]), "qemu:///system");
    }

    #[test]
    fn ssh_uris_use_libssh_with_the_key_and_known_hosts_files() {
        let p = plan(
            "qemu+ssh://root@kvm1:2222/system",
            "s",
            &data(&[SSH_PRIVATE_KEY, KNOWN_HOSTS]),
        )
        .unwrap();
        assert_eq!(
            uri_for("qemu+ssh://root@kvm1:2222/system", &p, Path::new("/run/c/d")),
            "qemu+libssh://root@kvm1:2222/system?keyfile=/run/c/d/id&known_hosts=/run/c/d/known_hosts&sshauth=privkey"
        );
    }

    #[test]
    fn tls_uris_get_a_pkipath_with_libvirts_file_names() {
        let p = plan("qemu+tls://kvm1/system", "s", &data(&[CA_CRT, TLS_CRT, TLS_KEY])).unwrap();
        assert_eq!(
            p.files.iter().map(|(n, _)| *n).collect::<Vec<_>>(),
            vec!["cacert.pem", "clientcert.pem", "clientkey.pem"]
        );
        assert_eq!(
            uri_for("qemu+tls://kvm1/system", &p, Path::new("/run/c/d")),
            "qemu+tls://kvm1/system?pkipath=/run/c/d"
        );
    }

    #[rstest]
    #[case::ssh_without_known_hosts("qemu+ssh://h/system", &[SSH_PRIVATE_KEY], "CredentialsInvalid", "known_hosts")]
    #[case::tls_without_key("qemu+tls://h/system", &[CA_CRT, TLS_CRT], "CredentialsInvalid", "tls.key")]
    #[case::local_uri("qemu:///system", &[SSH_PRIVATE_KEY], "CredentialsUnsupported", "qemu:///system")]
    fn errors_name_the_missing_key_never_a_value(
        #[case] uri: &str,
        #[case] keys: &[&str],
        #[case] reason: &str,
        #[case] mentions: &str,
    ) {
        let e = plan(uri, "lab-creds", &data(keys)).unwrap_err();
        assert_eq!(e.reason, reason);
        assert!(e.message.contains(mentions), "{}", e.message);
        assert!(e.message.contains("lab-creds"), "{}", e.message);
        assert!(!e.message.contains(MARKER));
        assert!(!format!("{e:?}").contains(MARKER));
    }

    #[test]
    fn plans_debug_print_file_names_only() {
        let p = plan("qemu+ssh://h/system", "s", &data(&[SSH_PRIVATE_KEY, KNOWN_HOSTS])).unwrap();
        let shown = format!("{p:?}");
        assert!(
            shown.contains("known_hosts") && !shown.contains(MARKER),
            "{shown}"
        );
    }

    #[cfg(unix)]
    #[test]
    fn files_are_private_reused_and_replaced_on_rotation() {
        use std::os::unix::fs::PermissionsExt;
        let base = std::env::temp_dir().join(format!("banlieue-libvirt-cred-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let uri = "qemu+ssh://root@kvm1/system";
        let d = data(&[SSH_PRIVATE_KEY, KNOWN_HOSTS]);
        let got = materialize(&base, "ns", "creds", uri, &d).unwrap();
        assert!(!got.contains(MARKER));
        let keyfile = got
            .split(['?', '&'])
            .find_map(|p| p.strip_prefix("keyfile="))
            .unwrap()
            .to_owned();
        let meta = std::fs::metadata(&keyfile).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        let dir = Path::new(&keyfile).parent().unwrap().to_owned();
        assert_eq!(
            std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777,
            0o700
        );
        assert_eq!(
            std::fs::read(&keyfile).unwrap(),
            format!("{MARKER} ssh-privatekey\n").into_bytes()
        );
        // Same Secret: same URI, nothing rewritten.
        let mtime = meta.modified().unwrap();
        assert_eq!(materialize(&base, "ns", "creds", uri, &d).unwrap(), got);
        assert_eq!(std::fs::metadata(&keyfile).unwrap().modified().unwrap(), mtime);
        // Rotated Secret: a new directory, the old one is gone.
        let mut rotated = d.clone();
        rotated.insert(SSH_PRIVATE_KEY.into(), b"new key".to_vec());
        let got2 = materialize(&base, "ns", "creds", uri, &rotated).unwrap();
        assert_ne!(got2, got);
        assert!(!dir.exists());
        let _ = std::fs::remove_dir_all(&base);
    }
}
