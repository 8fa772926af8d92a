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

impl CatalogError {
    /// The catalog could not be read at all (`reason`: why, in a few words).
    pub fn unreadable(source: &str, e: &std::io::Error) -> CatalogError {
        let reason = match e.kind() {
            std::io::ErrorKind::NotFound => "no such file".to_owned(),
            std::io::ErrorKind::PermissionDenied => "permission denied".to_owned(),
            std::io::ErrorKind::IsADirectory => "it is a directory".to_owned(),
            _ => e.to_string(),
        };
        CatalogError {
            source: source.to_owned(),
            problems: vec![Problem {
                at: READ.to_owned(),
                reason,
            }],
        }
    }
}

/// The location of a read failure: the whole file, before any content.
const READ: &str = "\0read";

impl fmt::Display for CatalogError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let [p] = self.problems.as_slice()
            && p.at == READ
        {
            return write!(f, "cannot read catalog {}: {}", self.source, p.reason);
        }
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
