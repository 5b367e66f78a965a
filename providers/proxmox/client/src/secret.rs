//! A wrapper for credentials that never prints its content.

use std::fmt;

/// A secret string (API token secret, password, ticket, CSRF token).
///
/// `Debug` prints `***`; there is no `Display`. Read the value only where it goes on the wire, with
/// [`Secret::expose`].
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret value.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The secret value, for putting it on the wire. Never log it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

impl From<String> for Secret {
    fn from(value: String) -> Self {
        Self(value)
    }
}

impl From<&str> for Secret {
    fn from(value: &str) -> Self {
        Self(value.to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_hides_the_value() {
        let secret = Secret::new("5f1d-very-secret");
        assert_eq!(format!("{secret:?}"), "***");
        assert_eq!(format!("{:?}", Some(secret.clone())), "Some(***)");
        assert_eq!(secret.expose(), "5f1d-very-secret");
    }
}
