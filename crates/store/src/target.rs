//! target: where Redis is and how to reach it, as configured: the mode, the URLs, TLS files and
//! the password file, checked and read once ([`RedisTarget::new`]); errors name the option
//! ([`OptionError`]) and never hold a password.

use std::path::Path;

use redis::{ConnectionAddr, ConnectionInfo, IntoConnectionInfo, TlsCertificates};

/// How the Redis store reaches Redis (`store.redis_mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RedisMode {
    /// One server. Default.
    #[default]
    Single,
    /// Redis Cluster; the URLs are seed nodes.
    Cluster,
    /// Redis Sentinel; the URLs are the sentinels.
    Sentinel,
}

impl RedisMode {
    pub fn as_str(self) -> &'static str {
        match self {
            RedisMode::Single => "single",
            RedisMode::Cluster => "cluster",
            RedisMode::Sentinel => "sentinel",
        }
    }
}

/// Where Redis is and how to talk to it: checked settings, files read.
#[derive(Clone)]
pub struct RedisTarget {
    pub mode: RedisMode,
    /// The server, the seed nodes, or the sentinels.
    pub(crate) nodes: Vec<ConnectionInfo>,
    /// The master's name (sentinel mode).
    pub(crate) master: String,
    pub(crate) tls: Option<TlsCertificates>,
    /// Username and password for the data nodes (from the first URL or the password file).
    pub(crate) username: Option<String>,
    pub(crate) password: Option<String>,
    /// The URLs with any password replaced, for messages.
    pub(crate) shown: String,
}

impl std::fmt::Debug for RedisTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisTarget")
            .field("mode", &self.mode)
            .field("nodes", &self.shown)
            .finish_non_exhaustive()
    }
}

/// The files and switches of `[store]` that shape connections.
#[derive(Debug, Clone, Default)]
pub struct TlsFiles<'a> {
    pub ca: &'a str,
    pub cert: &'a str,
    pub key: &'a str,
    pub insecure: bool,
}

/// A Redis setting that cannot be used: which option, and why. Messages never hold a password.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OptionError {
    option: &'static str,
    reason: String,
}

impl OptionError {
    pub(crate) fn new(option: &'static str, reason: impl Into<String>) -> OptionError {
        OptionError {
            option,
            reason: reason.into(),
        }
    }

    /// The option at fault (`store.redis_url`, `store.tls_ca_file`...).
    pub fn option(&self) -> &'static str {
        self.option
    }

    /// Why, without the option's name.
    pub fn reason(&self) -> &str {
        &self.reason
    }
}

impl std::fmt::Display for OptionError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.option, self.reason)
    }
}

impl std::error::Error for OptionError {}

fn read(option: &'static str, path: &str) -> Result<Vec<u8>, OptionError> {
    std::fs::read(Path::new(path)).map_err(|e| OptionError::new(option, format!("{path}: {e}")))
}

impl RedisTarget {
    /// One server at `url`, nothing else set (tests, the Divvy drop-in).
    pub fn single(url: &str) -> Result<RedisTarget, OptionError> {
        RedisTarget::new(url, RedisMode::Single, "", "", &TlsFiles::default())
    }

    /// Checks `urls` (comma-separated) for `mode`, reading the TLS and password files. Errors name
    /// the setting and never hold a password.
    pub fn new(
        urls: &str,
        mode: RedisMode,
        master: &str,
        password_file: &str,
        tls: &TlsFiles,
    ) -> Result<RedisTarget, OptionError> {
        let shown = urls
            .split(',')
            .map(|u| redact_url(u.trim()))
            .collect::<Vec<_>>()
            .join(",");
        let list: Vec<&str> = urls
            .split(',')
            .map(str::trim)
            .filter(|u| !u.is_empty())
            .collect();
        if list.is_empty() {
            return Err(OptionError::new("store.redis_url", "is empty"));
        }
        if mode == RedisMode::Single && list.len() > 1 {
            return Err(OptionError::new(
                "store.redis_url",
                format!(
                    "lists {} servers; set store.redis_mode to \"cluster\" or \"sentinel\" to use several",
                    list.len()
                ),
            ));
        }
        if mode == RedisMode::Sentinel && master.is_empty() {
            return Err(OptionError::new(
                "store.sentinel_master",
                "is needed with store.redis_mode = \"sentinel\"",
            ));
        }
        let mut nodes = Vec::with_capacity(list.len());
        for u in &list {
            let info = u.into_connection_info().map_err(|e| {
                OptionError::new(
                    "store.redis_url",
                    format!("{} is not a Redis URL: {e}", redact_url(u)),
                )
            })?;
            nodes.push(info);
        }
        let password = match password_file {
            "" => None,
            path => {
                let bytes = read("store.redis_password_file", path)?;
                let text = String::from_utf8(bytes).map_err(|_| {
                    OptionError::new("store.redis_password_file", format!("{path} is not UTF-8"))
                })?;
                // One line; a trailing newline is the editor's, not the password's.
                Some(text.trim_end_matches(['\n', '\r']).to_owned())
            }
        };
        let first = nodes[0].redis_settings().clone();
        let username = first.username().map(str::to_owned);
        let password = password.or_else(|| first.password().map(str::to_owned));
        let uses_tls = nodes
            .iter()
            .any(|n| matches!(n.addr(), ConnectionAddr::TcpTls { .. }));
        if !uses_tls && (!tls.ca.is_empty() || !tls.cert.is_empty() || tls.insecure) {
            return Err(OptionError::new(
                "store.redis_url",
                "must be rediss:// URLs when store.tls_* are set",
            ));
        }
        if tls.cert.is_empty() != tls.key.is_empty() {
            return Err(OptionError::new(
                "store.tls_key_file",
                "and store.tls_cert_file go together",
            ));
        }
        let certs = if tls.ca.is_empty() && tls.cert.is_empty() {
            None
        } else {
            Some(TlsCertificates {
                client_tls: if tls.cert.is_empty() {
                    None
                } else {
                    Some(redis::ClientTlsConfig {
                        client_cert: read("store.tls_cert_file", tls.cert)?,
                        client_key: read("store.tls_key_file", tls.key)?,
                    })
                },
                root_cert: if tls.ca.is_empty() {
                    None
                } else {
                    Some(read("store.tls_ca_file", tls.ca)?)
                },
            })
        };
        if tls.insecure {
            for n in &mut nodes {
                if let ConnectionAddr::TcpTls { host, port, .. } = n.addr().clone() {
                    *n = n.clone().set_addr(ConnectionAddr::TcpTls {
                        host,
                        port,
                        insecure: true,
                        tls_params: None,
                    });
                }
            }
        }
        // The password file's password (or the first URL's) for every data node.
        if let Some(p) = &password
            && mode != RedisMode::Sentinel
        {
            for n in &mut nodes {
                let settings = n.redis_settings().clone().set_password(p);
                *n = n.clone().set_redis_settings(settings);
            }
        }
        Ok(RedisTarget {
            mode,
            nodes,
            master: master.to_owned(),
            tls: certs,
            username,
            password,
            shown,
        })
    }

    /// The URLs as configured, passwords replaced: for messages.
    pub fn shown(&self) -> &str {
        &self.shown
    }

    /// True when certificate checks are off (said at start-up).
    pub fn is_insecure(&self) -> bool {
        self.nodes
            .iter()
            .any(|n| matches!(n.addr(), ConnectionAddr::TcpTls { insecure: true, .. }))
    }
}

/// A URL as it may be logged: `redis://user:password@host` becomes `redis://user:***@host`.
pub fn redact_url(url: &str) -> String {
    if let Some((scheme, rest)) = url.split_once("://")
        && let Some((auth, host)) = rest.rsplit_once('@')
    {
        let user = auth.split_once(':').map_or("", |(u, _)| u);
        return format!("{scheme}://{user}:***@{host}");
    }
    url.to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(urls: &str, mode: RedisMode) -> Result<RedisTarget, String> {
        // Messages as the operator reads them.
        RedisTarget::new(urls, mode, "mymaster", "", &TlsFiles::default())
            .map_err(|e| e.to_string())
    }

    #[test]
    fn urls_are_checked_per_mode_and_messages_hide_passwords() {
        assert!(target("redis://127.0.0.1:6379", RedisMode::Single).is_ok());
        let e = target("redis://a:1,redis://b:2", RedisMode::Single).unwrap_err();
        assert!(e.contains("set store.redis_mode"), "{e}");
        let t = target(
            "redis://u:s3cret@a:7000, redis://b:7001",
            RedisMode::Cluster,
        )
        .unwrap();
        assert_eq!(t.nodes.len(), 2);
        assert!(!t.shown().contains("s3cret"), "{}", t.shown());
        assert!(!format!("{t:?}").contains("s3cret"));
        let e = target("http://x", RedisMode::Single).unwrap_err();
        assert!(e.starts_with("store.redis_url: "), "{e}");
        let e = RedisTarget::new(
            "redis://a:1",
            RedisMode::Sentinel,
            "",
            "",
            &TlsFiles::default(),
        )
        .unwrap_err();
        assert_eq!(e.option(), "store.sentinel_master", "{e}");
        let tls = TlsFiles {
            ca: "/nonexistent/ca.pem",
            ..Default::default()
        };
        let e = RedisTarget::new("redis://a:1", RedisMode::Single, "", "", &tls).unwrap_err();
        assert!(e.reason().contains("rediss://"), "{e}");
        let e = RedisTarget::new("rediss://a:1", RedisMode::Single, "", "", &tls).unwrap_err();
        assert_eq!(e.option(), "store.tls_ca_file");
        assert!(e.reason().starts_with("/nonexistent/ca.pem: "), "{e}");
    }

    #[test]
    fn the_password_file_wins_and_is_not_shown() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("pw");
        std::fs::write(&file, "fromfile\n").unwrap();
        let t = RedisTarget::new(
            "redis://app:inurl@a:1",
            RedisMode::Single,
            "",
            file.to_str().unwrap(),
            &TlsFiles::default(),
        )
        .unwrap();
        assert_eq!(t.password.as_deref(), Some("fromfile"));
        assert_eq!(t.nodes[0].redis_settings().password(), Some("fromfile"));
        assert_eq!(t.nodes[0].redis_settings().username(), Some("app"));
        assert!(!t.shown().contains("fromfile") && !t.shown().contains("inurl"));
    }
}
