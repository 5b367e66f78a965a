//! The human-readable conformance report: one row per check (section, check, pass/fail/skip,
//! detail, time), written as Markdown.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Result of one check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Passed, with a short detail (may be empty).
    Pass(String),
    /// Failed, with the reason.
    Fail(String),
    /// Not applicable or not runnable here, with the reason.
    Skip(String),
}

impl Outcome {
    /// A pass with a detail.
    pub fn pass(detail: impl Into<String>) -> Self {
        Self::Pass(detail.into())
    }
    /// A failure with a reason.
    pub fn fail(reason: impl Into<String>) -> Self {
        Self::Fail(reason.into())
    }
    /// A skip with a reason.
    pub fn skip(reason: impl Into<String>) -> Self {
        Self::Skip(reason.into())
    }
    /// Whether this is a failure.
    pub fn is_fail(&self) -> bool {
        matches!(self, Self::Fail(_))
    }
    fn label(&self) -> &'static str {
        match self {
            Self::Pass(_) => "PASS",
            Self::Fail(_) => "FAIL",
            Self::Skip(_) => "SKIP",
        }
    }
    fn detail(&self) -> &str {
        match self {
            Self::Pass(d) | Self::Fail(d) | Self::Skip(d) => d,
        }
    }
}

/// One row of the report.
#[derive(Debug, Clone)]
pub struct Entry {
    /// Group of checks (a CRD, a lifecycle step).
    pub section: String,
    /// What was checked.
    pub check: String,
    /// Result.
    pub outcome: Outcome,
    /// Time the check took (`None` for instant static checks).
    pub elapsed: Option<Duration>,
}

/// A report being built.
#[derive(Debug)]
pub struct Report {
    title: String,
    started: Instant,
    entries: Vec<Entry>,
    notes: Vec<String>,
}

impl Report {
    /// An empty report.
    pub fn new(title: impl Into<String>) -> Self {
        Self {
            title: title.into(),
            started: Instant::now(),
            entries: Vec::new(),
            notes: Vec::new(),
        }
    }

    /// Adds a row.
    pub fn record(
        &mut self,
        section: impl Into<String>,
        check: impl Into<String>,
        outcome: Outcome,
        elapsed: Option<Duration>,
    ) {
        self.entries.push(Entry {
            section: section.into(),
            check: check.into(),
            outcome,
            elapsed,
        });
    }

    /// Adds a free-text note printed under the table.
    pub fn note(&mut self, text: impl Into<String>) {
        self.notes.push(text.into());
    }

    /// All rows so far.
    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// The failed rows.
    pub fn failures(&self) -> Vec<&Entry> {
        self.entries.iter().filter(|e| e.outcome.is_fail()).collect()
    }

    /// `(passed, failed, skipped)`.
    pub fn counts(&self) -> (usize, usize, usize) {
        let count = |f: fn(&Outcome) -> bool| self.entries.iter().filter(|e| f(&e.outcome)).count();
        (
            count(|o| matches!(o, Outcome::Pass(_))),
            count(Outcome::is_fail),
            count(|o| matches!(o, Outcome::Skip(_))),
        )
    }

    /// The report as Markdown.
    pub fn to_markdown(&self) -> String {
        let (passed, failed, skipped) = self.counts();
        let mut out = String::new();
        let _ = writeln!(out, "# {}\n", self.title);
        let _ = writeln!(
            out,
            "{passed} passed, {failed} failed, {skipped} skipped; total {:.1} s.\n",
            self.started.elapsed().as_secs_f64()
        );
        let _ = writeln!(out, "| section | check | result | detail | time |");
        let _ = writeln!(out, "|---|---|---|---|---|");
        for e in &self.entries {
            let time = e
                .elapsed
                .map_or(String::new(), |d| format!("{:.1} s", d.as_secs_f64()));
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {time} |",
                cell(&e.section),
                cell(&e.check),
                e.outcome.label(),
                cell(e.outcome.detail())
            );
        }
        if !self.notes.is_empty() {
            out.push('\n');
            for note in &self.notes {
                let _ = writeln!(out, "- {note}");
            }
        }
        out
    }

    /// Writes the Markdown to `path` (creating its folder) and returns the path.
    pub fn write(&self, path: &Path) -> std::io::Result<PathBuf> {
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(path, self.to_markdown())?;
        Ok(path.to_path_buf())
    }
}

fn cell(text: &str) -> String {
    text.replace('|', "\\|").replace('\n', " ")
}

/// Where reports go: `$BANLIEUE_CONFORMANCE_REPORT_DIR`, else `$CARGO_TARGET_DIR/conformance`,
/// else the workspace's `target/conformance`.
pub fn report_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("BANLIEUE_CONFORMANCE_REPORT_DIR") {
        return PathBuf::from(dir);
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target"));
    target.join("conformance")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markdown_has_one_row_per_check_and_escapes_cells() {
        let mut report = Report::new("Demo");
        report.record("CRD a", "x is string", Outcome::pass("string"), None);
        report.record(
            "lifecycle",
            "scale | up",
            Outcome::fail("2 VMs\nfor 3 machines"),
            Some(Duration::from_millis(1500)),
        );
        report.record("lifecycle", "move", Outcome::skip("needs nodeRefs"), None);
        report.note("a note");
        let md = report.to_markdown();
        assert!(md.starts_with("# Demo\n\n1 passed, 1 failed, 1 skipped;"), "{md}");
        assert!(md.contains("| CRD a | x is string | PASS | string |  |\n"));
        assert!(md.contains("| lifecycle | scale \\| up | FAIL | 2 VMs for 3 machines | 1.5 s |\n"));
        assert!(md.contains("| lifecycle | move | SKIP | needs nodeRefs |  |\n"));
        assert!(md.ends_with("- a note\n"));
        assert_eq!(report.failures().len(), 1);
        assert_eq!(report.counts(), (1, 1, 1));
    }
}
