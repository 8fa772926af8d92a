//! telemetry: log output, text or JSON. `RUST_LOG` wins over the configured level when set.

use tracing_subscriber::EnvFilter;

use crate::config::{LogConfig, LogFormat};

/// Installs the global subscriber. Safe to call more than once (later calls do nothing).
pub fn init(cfg: &LogConfig) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(&cfg.level));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi);
    let _ = match cfg.format {
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
        LogFormat::Text => builder.try_init(),
    };
}

/// A short, stable fingerprint of an API key for logs: never the key itself.
///
/// The first 48 bits of its SHA-256, in hex: the same in every instance and across restarts, so an
/// operator can find a key's lines (`printf %s KEY | sha256sum | cut -c1-12`); a hash a log reader
/// cannot run backwards for keys of any real length, unlike the 32-bit FNV it replaces.
pub fn fingerprint(key: &[u8]) -> String {
    fingerprint_of(fingerprint_bits(key))
}

/// Fingerprints remembered per thread at most; past that the thread starts over.
const REMEMBERED: usize = 4096;

thread_local! {
    static REMEMBERED_FINGERPRINTS: std::cell::RefCell<std::collections::HashMap<u64, String>> =
        Default::default();
}

/// [`fingerprint`], remembered per thread by a seeded 64-bit hash of the key (a SHA-256 costs
/// more than the rest of a traced request's bookkeeping; hot keys come back). Holds fingerprints
/// only, never keys.
pub fn fingerprint_remembered(key: &[u8]) -> String {
    use std::hash::BuildHasher;
    static IDS: std::sync::LazyLock<foldhash::fast::RandomState> =
        std::sync::LazyLock::new(Default::default);
    let id = IDS.hash_one(key);
    REMEMBERED_FINGERPRINTS.with(|m| {
        let mut m = m.borrow_mut();
        if let Some(f) = m.get(&id) {
            return f.clone();
        }
        if m.len() >= REMEMBERED {
            m.clear();
        }
        let f = fingerprint(key);
        m.insert(id, f.clone());
        f
    })
}

/// The 48 bits [`fingerprint`] shows, as a number (what `/status` `top_limited` keeps per key).
pub fn fingerprint_bits(key: &[u8]) -> u64 {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(key);
    digest[..6].iter().fold(0, |n, b| n << 8 | u64::from(*b))
}

/// The fingerprint of [`fingerprint_bits`]: `key#` and 12 hex digits.
pub fn fingerprint_of(bits: u64) -> String {
    format!("key#{bits:012x}")
}

#[cfg(test)]
mod tests {
    #[test]
    fn fingerprints_are_short_and_stable() {
        assert_eq!(super::fingerprint(b"7H6AMB0FXQKQBG3JKPW1PXTTNW").len(), 16);
        // printf %s abc | sha256sum: ba7816bf8f01cfea...
        assert_eq!(super::fingerprint(b"abc"), "key#ba7816bf8f01");
        assert_eq!(super::fingerprint(b"a"), super::fingerprint(b"a"));
        assert_ne!(super::fingerprint(b"a"), super::fingerprint(b"b"));
        for _ in 0..2 {
            assert_eq!(super::fingerprint_remembered(b"abc"), "key#ba7816bf8f01");
        }
    }
}
