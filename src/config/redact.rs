//! redact: the configuration as it may be logged, secrets replaced.

use quotagate_store::connect::redact_url;

use super::Config;

impl Config {
    /// The configuration as one line of JSON, secrets and Redis passwords replaced by `***`.
    pub fn redacted_json(&self) -> String {
        self.redacted().to_string()
    }

    /// The configuration as JSON, secrets and Redis passwords replaced by `***`.
    pub fn redacted(&self) -> serde_json::Value {
        let mut c = self.clone();
        for secret in [
            &mut c.catalog.server_secret,
            &mut c.catalog.refresh_secret,
            &mut c.admin.secret,
        ] {
            if !secret.is_empty() {
                *secret = "***".into();
            }
        }
        c.store.redis_url = redact_url(&c.store.redis_url);
        serde_json::to_value(&c).unwrap_or_default()
    }
}
