//! source: where the keys tokens are verified with come from (`limits.jwt_jwks_file`,
//! `limits.jwt_jwks_url`, `limits.jwt_secret_file`), and the verification a request asks for:
//! the memo first, then the keys; a token naming a key the set does not have makes one refetch
//! of the URL, at most once every [`REFETCH_FLOOR`] whatever the tokens say.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;

use crate::observe::metrics::{Metrics, OutcomeLabels};
use quotagate_engine::clock::Clock;
use tokio_util::sync::CancellationToken;

use super::memo::Memo;
use super::{Checked, Keys, Refusal, Rules, verify};

/// Key set fetches at most one in this time, however many tokens name unknown keys; also the
/// wait before trying again after a failed fetch.
pub const REFETCH_FLOOR: Duration = Duration::from_secs(10);

/// A key set's body at most.
pub const MAX_JWKS_BYTES: u64 = 1024 * 1024;

/// The `jwt:` source's settings, read and checked at start.
#[derive(Clone)]
pub struct JwtSettings {
    pub rules: Rules,
    /// From `limits.jwt_jwks_file` and `limits.jwt_secret_file`: what there is before any fetch.
    pub keys: Arc<Keys>,
    /// The secret (`limits.jwt_secret_file`), added to every fetched set.
    pub secret: Option<Arc<[u8]>>,
    pub url: Option<Fetching>,
    /// Tokens remembered at most (`limits.jwt_memo_max`).
    pub memo_max: usize,
}

/// Fetching the key set from `limits.jwt_jwks_url`.
#[derive(Clone, Debug)]
pub struct Fetching {
    pub url: reqwest::Url,
    /// Used when the answer has no `Cache-Control: max-age` (`limits.jwt_jwks_refresh_ms`).
    pub refresh: Duration,
    pub client: reqwest::Client,
}

impl std::fmt::Debug for JwtSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JwtSettings")
            .field("rules", &self.rules)
            .field("keys", &self.keys)
            .field("url", &self.url.as_ref().map(|u| u.url.as_str()))
            .finish()
    }
}

/// The `jwt:` source at work: its keys, its memo, its fetches.
pub struct Jwt {
    rules: Rules,
    keys: ArcSwap<Keys>,
    secret: Option<Arc<[u8]>>,
    memo: Memo,
    clock: Arc<dyn Clock>,
    fetch: Option<Fetch>,
    counts: Counts,
}

/// `quotagate_jwt_tokens` and `quotagate_jwt_key_set_fetches`.
struct Counts {
    fetches: Family<OutcomeLabels, Counter>,
    /// Taken from the memo, taken after a verification, and each refusal's (by
    /// [`Refusal::as_str`]): resolved once, not looked up by label on every request.
    remembered: Counter,
    verified: Counter,
    refused: Family<OutcomeLabels, Counter>,
}

impl Counts {
    fn new(metrics: &Metrics) -> Counts {
        let (fetches, tokens) = (
            Family::default(),
            Family::<OutcomeLabels, Counter>::default(),
        );
        let of = |outcome| tokens.get_or_create(&OutcomeLabels { outcome }).clone();
        let counts = Counts {
            fetches: fetches.clone(),
            remembered: of("remembered"),
            verified: of("verified"),
            refused: tokens.clone(),
        };
        metrics.register(|r| {
            r.register(
                "quotagate_jwt_tokens",
                "Bearer JWTs of the jwt: key source by outcome: remembered, verified, or why refused",
                tokens,
            );
            r.register(
                "quotagate_jwt_key_set_fetches",
                "Fetches of limits.jwt_jwks_url by outcome: applied, or why not",
                fetches,
            );
        });
        counts
    }

    fn token(&self, checked: &Checked) {
        match &checked.0 {
            Ok(_) => self.verified.inc(),
            Err(why) => self
                .refused
                .get_or_create(&OutcomeLabels {
                    outcome: why.as_str(),
                })
                .inc(),
        };
    }
}

struct Fetch {
    how: Fetching,
    /// When the last fetch began, on the gateway's clock (milliseconds).
    last: Mutex<Option<u64>>,
    /// One fetch at a time; requests waiting on one find its keys when it ends.
    one: tokio::sync::Mutex<()>,
}

/// Why a fetch failed, for the log.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("{0}")]
    Http(String),
    #[error("answered {0}")]
    Status(u16),
    #[error("the key set is over {MAX_JWKS_BYTES} bytes")]
    TooLarge,
    #[error("{0}")]
    Keys(String),
}

impl Jwt {
    pub fn new(s: &JwtSettings, clock: Arc<dyn Clock>, metrics: &Metrics) -> Jwt {
        Jwt {
            rules: s.rules.clone(),
            keys: ArcSwap::new(s.keys.clone()),
            secret: s.secret.clone(),
            memo: Memo::new(s.memo_max),
            clock,
            fetch: s.url.clone().map(|how| Fetch {
                how,
                last: Mutex::new(None),
                one: tokio::sync::Mutex::new(()),
            }),
            counts: Counts::new(metrics),
        }
    }

    pub fn rules(&self) -> &Rules {
        &self.rules
    }

    fn now_s(&self) -> u64 {
        self.clock.now_ms() / 1000
    }

    /// `token` checked with what is at hand; `None`: it names a key the set does not have (or
    /// there is none yet) and a fetch may be made for it ([`Jwt::check_fetching`]).
    pub fn check(&self, token: &[u8]) -> Option<Checked> {
        let now_s = self.now_s();
        if let Some(v) = self.memo.get(token, now_s) {
            self.counts.remembered.inc();
            return Some(Checked(Ok(v)));
        }
        let keys = self.keys.load();
        let got = verify(token, &keys, &self.rules, now_s);
        match &got {
            Ok(v) => self.memo.put(token, v, now_s),
            // A fetch under way (the first, at start) may bring its key: waited for too.
            Err(Refusal::UnknownKey | Refusal::NoKeys) if self.may_fetch() || self.fetching() => {
                return None;
            }
            Err(_) => {}
        }
        let checked = Checked(got);
        self.counts.token(&checked);
        Some(checked)
    }

    /// `token` checked after a fetch of the key set (one at a time, within the floor).
    pub async fn check_fetching(&self, token: &[u8]) -> Checked {
        if let Some(f) = &self.fetch {
            let _one = f.one.lock().await;
            // Another request's fetch may have brought the key while this one waited.
            let known = self.keys.load();
            let kid = super::head(token).ok().and_then(|h| h.kid);
            let missing = match &kid {
                Some(kid) => !known.knows(kid),
                None => known.is_empty(),
            };
            if missing
                && self.may_fetch()
                && let Err(e) = self.fetch_now().await
            {
                tracing::warn!(url = %f.how.url, error = %e, "the JWT key set could not be fetched; the last one is kept");
            }
        }
        let now_s = self.now_s();
        let got = verify(token, &self.keys.load(), &self.rules, now_s);
        if let Ok(v) = &got {
            self.memo.put(token, v, now_s);
        }
        let checked = Checked(got);
        self.counts.token(&checked);
        checked
    }

    fn may_fetch(&self) -> bool {
        let Some(f) = &self.fetch else {
            return false;
        };
        let last = *f.last.lock().unwrap_or_else(|p| p.into_inner());
        let floor = REFETCH_FLOOR.as_millis() as u64;
        last.is_none_or(|t| self.clock.now_ms().saturating_sub(t) >= floor)
    }

    fn fetching(&self) -> bool {
        self.fetch
            .as_ref()
            .is_some_and(|f| f.one.try_lock().is_err())
    }

    /// Fetches the key set and puts it in place; `Ok`: how long it may be kept (its
    /// `Cache-Control: max-age`, if it says).
    pub async fn fetch_now(&self) -> Result<Option<Duration>, FetchError> {
        let got = self.fetch_set().await;
        let outcome = match &got {
            Ok(_) => "applied",
            Err(FetchError::Http(_)) => "unreachable",
            Err(FetchError::Status(_)) => "status",
            Err(FetchError::TooLarge) => "too_large",
            Err(FetchError::Keys(_)) => "invalid",
        };
        self.counts
            .fetches
            .get_or_create(&OutcomeLabels { outcome })
            .inc();
        got
    }

    async fn fetch_set(&self) -> Result<Option<Duration>, FetchError> {
        let Some(f) = &self.fetch else {
            return Ok(None);
        };
        *f.last.lock().unwrap_or_else(|p| p.into_inner()) = Some(self.clock.now_ms());
        let http = |e: reqwest::Error| FetchError::Http(crate::start::with_causes(&e));
        let mut resp = f
            .how
            .client
            .get(f.how.url.clone())
            .send()
            .await
            .map_err(http)?;
        if !resp.status().is_success() {
            return Err(FetchError::Status(resp.status().as_u16()));
        }
        if resp.content_length().is_some_and(|n| n > MAX_JWKS_BYTES) {
            return Err(FetchError::TooLarge);
        }
        let max_age = resp
            .headers()
            .get_all(http::header::CACHE_CONTROL)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .find_map(max_age);
        let mut body = Vec::new();
        while let Some(chunk) = resp.chunk().await.map_err(http)? {
            if body.len() + chunk.len() > MAX_JWKS_BYTES as usize {
                return Err(FetchError::TooLarge);
            }
            body.extend_from_slice(&chunk);
        }
        let (mut keys, skipped) = Keys::from_jwks(&body).map_err(FetchError::Keys)?;
        if let Some(secret) = &self.secret {
            keys = keys.with_secret(secret).map_err(FetchError::Keys)?;
        }
        if !skipped.is_empty() {
            tracing::warn!(url = %f.how.url, skipped = %skipped.join("; "), "JWT key set: keys left out");
        }
        tracing::info!(url = %f.how.url, keys = keys.len(), "JWT key set fetched");
        self.keys.store(Arc::new(keys));
        // A key gone from the set stops its tokens now, not at their expiry.
        self.memo.clear();
        Ok(max_age)
    }

    /// Keeps the key set fresh: fetched at once, then again after its `max-age` (or
    /// `limits.jwt_jwks_refresh_ms`), and [`REFETCH_FLOOR`] after a failure, until `shutdown`.
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        let Some(f) = &self.fetch else {
            return;
        };
        loop {
            let wait = {
                let _one = f.one.lock().await;
                match self.fetch_now().await {
                    Ok(max_age) => max_age.unwrap_or(f.how.refresh).max(REFETCH_FLOOR),
                    Err(e) => {
                        tracing::warn!(url = %f.how.url, error = %e, "the JWT key set could not be fetched; the last one is kept");
                        REFETCH_FLOOR
                    }
                }
            };
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = shutdown.cancelled() => return,
            }
        }
    }
}

/// `max-age=N` of one `Cache-Control` value.
fn max_age(value: &str) -> Option<Duration> {
    value.split(',').find_map(|d| {
        let (name, n) = d.trim().split_once('=')?;
        (name.trim().eq_ignore_ascii_case("max-age"))
            .then(|| n.trim().trim_matches('"').parse().ok())
            .flatten()
            .map(Duration::from_secs)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_age_is_read_from_cache_control() {
        assert_eq!(
            max_age("public, max-age=600"),
            Some(Duration::from_secs(600))
        );
        assert_eq!(max_age("Max-Age=\"60\""), Some(Duration::from_secs(60)));
        assert_eq!(max_age("no-cache"), None);
        assert_eq!(max_age("max-age=x"), None);
    }
}
