//! A password wrapper that never prints its content.

use std::fmt;

/// A secret string (a password or a session cookie). `Debug` prints `***`; there is no `Display`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret value.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The value, only for putting it on the wire. Never log it.
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
    #[test]
    fn debug_hides_the_value() {
        let s = super::Secret::new("hunter2");
        assert_eq!(format!("{s:?}"), "***");
        assert_eq!(s.expose(), "hunter2");
    }
}
