//! Set-up commands of the harness (image builds, network reads): run to completion, their output
//! or an error that says what was being done.

use std::process::Command;

use crate::{Error, Result};

/// Runs `command` (called `name` in errors) and returns its stdout; when it fails, the error says
/// `what` it was doing and carries its stderr.
pub(crate) fn setup_output(command: &mut Command, name: &str, what: &str) -> Result<Vec<u8>> {
    let output = command.output().map_err(|source| Error::Spawn {
        name: name.to_owned(),
        source,
    })?;
    if output.status.success() {
        Ok(output.stdout)
    } else {
        Err(Error::NodeSetup(format!(
            "{what}: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        )))
    }
}
