//! files: reading files whose size a user controls, with a bound.

use std::path::Path;

/// Reads a text file of at most `max` bytes.
pub fn read_capped(path: &Path, max: u64) -> std::io::Result<String> {
    let len = std::fs::metadata(path)?.len();
    if len > max {
        return Err(std::io::Error::other(format!(
            "it is {len} bytes; at most {max} are accepted"
        )));
    }
    std::fs::read_to_string(path)
}
