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
pub fn fingerprint(key: &[u8]) -> String {
    // FNV-1a 64: stable across builds and platforms, unlike std's hasher.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in key {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("key#{:08x}", h >> 32)
}

#[cfg(test)]
mod tests {
    #[test]
    fn fingerprints_are_short_and_stable() {
        assert_eq!(super::fingerprint(b"7H6AMB0FXQKQBG3JKPW1PXTTNW").len(), 12);
        assert_eq!(super::fingerprint(b"a"), super::fingerprint(b"a"));
        assert_ne!(super::fingerprint(b"a"), super::fingerprint(b"b"));
    }
}
