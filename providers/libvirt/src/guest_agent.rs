//! Reading a file of a guest through its QEMU guest agent (`virDomainQemuAgentCommand`, the
//! `org.qemu.guest_agent.0` channel every banlieue domain has): `guest-file-open`, then
//! `guest-file-read` until the end, then `guest-file-close`. Used for cloud-init's report
//! ([`banlieue_provider_kit::cloud_init::RESULT_FILE`]). Blocking: run on the connection's
//! blocking pool.

use base64::Engine as _;
use serde_json::{Value, json};
use virt::domain::Domain;
use virt::enumutil::Enum;
use virt::error::ErrorNumber;

use crate::hypervisor::{ErrorKind, HvError, HvResult};

/// How long one agent command may take (seconds).
const AGENT_TIMEOUT_SECS: i32 = 10;
/// Bytes asked for per `guest-file-read`.
const CHUNK: u64 = 64 * 1024;
/// The largest file read (cloud-init's report is a few hundred bytes).
const MAX_FILE: usize = 1 << 20;

/// What one agent command gave: its `return`, or `None` when the agent does not answer (not
/// connected yet, the domain not running, no agent channel) or the file does not exist.
fn command(domain: &Domain, operation: &str, cmd: &Value) -> HvResult<Option<Value>> {
    match domain.qemu_agent_command(&cmd.to_string(), AGENT_TIMEOUT_SECS, 0) {
        Ok(text) => {
            let answer: Value = serde_json::from_str(&text).map_err(|e| {
                HvError::new(
                    ErrorKind::Other,
                    operation,
                    format!("the guest agent's answer is not JSON: {e}"),
                )
            })?;
            Ok(Some(answer.get("return").cloned().unwrap_or(Value::Null)))
        }
        Err(e) if agent_absent(&e) || e.message().contains("No such file or directory") => Ok(None),
        Err(e) => Err(HvError::new(ErrorKind::Transient, operation, e.message())),
    }
}

/// The agent cannot answer (yet): not connected, not running, not configured.
fn agent_absent(e: &virt::error::Error) -> bool {
    matches!(
        e.code(),
        Enum::Known(
            ErrorNumber::AgentUnresponsive
                | ErrorNumber::AgentUnsynced
                | ErrorNumber::OperationInvalid
                | ErrorNumber::ArgumentUnsupported
        )
    )
}

/// The content of `path` in the guest; `None` while the agent does not answer or the file does
/// not exist.
pub fn read_file(domain: &Domain, path: &str) -> HvResult<Option<String>> {
    let operation = format!("reading {path} through the guest agent");
    let open = json!({"execute": "guest-file-open", "arguments": {"path": path, "mode": "r"}});
    let Some(handle) = command(domain, &operation, &open)? else {
        return Ok(None);
    };
    let handle = handle.as_i64().ok_or_else(|| {
        HvError::new(
            ErrorKind::Other,
            &operation,
            format!("guest-file-open answered {handle}"),
        )
    })?;
    let content = read_all(domain, &operation, handle);
    let close = json!({"execute": "guest-file-close", "arguments": {"handle": handle}});
    // A handle left open is the agent's to reap; the content read is what matters.
    let _ = command(domain, &operation, &close);
    content
}

fn read_all(domain: &Domain, operation: &str, handle: i64) -> HvResult<Option<String>> {
    let mut bytes = Vec::new();
    loop {
        let read = json!({"execute": "guest-file-read", "arguments": {"handle": handle, "count": CHUNK}});
        let Some(chunk) = command(domain, operation, &read)? else {
            return Ok(None);
        };
        let data = chunk.get("buf-b64").and_then(Value::as_str).unwrap_or_default();
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(data)
            .map_err(|e| HvError::new(ErrorKind::Other, operation, format!("guest-file-read: {e}")))?;
        bytes.extend_from_slice(&decoded);
        if bytes.len() > MAX_FILE {
            return Err(HvError::new(
                ErrorKind::Other,
                operation,
                format!("the file is larger than {MAX_FILE} bytes"),
            ));
        }
        if chunk.get("eof").and_then(Value::as_bool).unwrap_or(true) || decoded.is_empty() {
            return Ok(Some(String::from_utf8_lossy(&bytes).into_owned()));
        }
    }
}
