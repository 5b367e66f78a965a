//! `tracing` initialisation: JSON lines (the default, for log collectors) or text, filtered by
//! `RUST_LOG` (default `info`). Text carries colour codes only when standard output is a
//! terminal and `NO_COLOR` is unset, so log files and collectors get plain text.

use std::ffi::OsStr;
use std::io::IsTerminal;

/// Log output format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// One JSON object per line.
    Json,
    /// Human-readable text.
    Text,
}

/// Whether text logs get ANSI colour codes: only on a terminal, and never when `NO_COLOR` is set
/// to a non-empty value (<https://no-color.org>).
pub fn colour(stdout_is_terminal: bool, no_color: Option<&OsStr>) -> bool {
    stdout_is_terminal && no_color.is_none_or(OsStr::is_empty)
}

/// Installs the global subscriber, writing to standard output. A second call (e.g. in tests) is
/// a no-op.
pub fn init(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let ansi = colour(
        std::io::stdout().is_terminal(),
        std::env::var_os("NO_COLOR").as_deref(),
    );
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_ansi(ansi);
    let _ = match format {
        LogFormat::Json => builder.json().try_init(),
        LogFormat::Text => builder.try_init(),
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn colour_only_on_a_terminal_without_no_color() {
        assert!(colour(true, None));
        assert!(colour(true, Some(OsStr::new(""))));
        assert!(!colour(true, Some(OsStr::new("1"))));
        assert!(!colour(false, None));
        assert!(!colour(false, Some(OsStr::new("1"))));
    }
}
