//! redact: the configuration as it may be logged, secrets replaced.

use super::Config;

impl Config {
    /// The configuration as one line of JSON, secrets and Redis passwords replaced by `***`.
    pub fn redacted_json(&self) -> String {
        let mut c = self.clone();
        for secret in [&mut c.catalog.server_secret, &mut c.catalog.refresh_secret] {
            if !secret.is_empty() {
                *secret = "***".into();
            }
        }
        // redis://user:password@host -> redis://user:***@host
        if let Some((scheme, rest)) = c.store.redis_url.split_once("://")
            && let Some((auth, host)) = rest.rsplit_once('@')
        {
            let user = auth.split_once(':').map_or("", |(u, _)| u);
            c.store.redis_url = format!("{scheme}://{user}:***@{host}");
        }
        serde_json::to_string(&c).unwrap_or_default()
    }
}
