//! error: everything wrong with a catalog, reported together.

use std::fmt;

/// One thing wrong with a catalog: where, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// JSON location, e.g. `endpoints[3].p`; empty for whole-file problems.
    pub at: String,
    pub reason: String,
}

/// A refused catalog, with every problem found in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CatalogError {
    /// Where the catalog came from (a file path or a URL).
    pub source: String,
    pub problems: Vec<Problem>,
}

impl fmt::Display for CatalogError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.problems.len();
        write!(
            f,
            "catalog {} is invalid ({n} problem{}):",
            self.source,
            if n == 1 { "" } else { "s" }
        )?;
        for p in &self.problems {
            if p.at.is_empty() {
                write!(f, "\n  {}", p.reason)?;
            } else {
                write!(f, "\n  {}: {}", p.at, p.reason)?;
            }
        }
        Ok(())
    }
}

impl std::error::Error for CatalogError {}
