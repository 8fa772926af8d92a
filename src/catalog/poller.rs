//! poller: keeps the live catalog in step with a catalog server (`docs/catalog-protocol.md`).
//!
//! A poll that finds nothing new costs one small request (`GET /latest` answered 304). A new
//! version is fetched as a diff when the server can give one, else whole; it is validated and built
//! here, off the request path, then swapped in with one store. Any failure (unreachable, timeout,
//! error status, truncated or invalid JSON, a catalog that fails validation, an older version) keeps
//! the current catalog serving; it is logged once per episode and counted, and polls back off
//! exponentially until the server answers again. A server that only has `/indexed_limits`
//! (DynLimits) works too.

use std::future::Future;
use std::hash::BuildHasher;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use http::header::{ETAG, IF_NONE_MATCH};
use http::{HeaderName, StatusCode};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use tokio_util::sync::CancellationToken;

use super::live::Live;
use super::server::content_hash;
use super::{CatalogDoc, CatalogVersion, KeySecrets, Snapshot, UnknownFields};
use crate::config::{CatalogConfig, ConfigError, header_name, positive_ms};
use crate::observe::metrics::OutcomeLabels;

/// Triggered fetches (refresh header, pub/sub) wait this long so that triggers arriving together
/// share one fetch.
pub const COALESCE: Duration = Duration::from_millis(20);

/// Runs catalog work (parsing, building, applying a diff: seconds for a million keys) on tokio's
/// blocking threads, so that the workers keep serving requests meanwhile.
async fn off_workers<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, PollError> {
    tokio::task::spawn_blocking(|| {
        let done = work();
        crate::alloc::release();
        done
    })
    .await
    .map_err(|e| PollError::Invalid(format!("building the catalog failed: {e}")))
}

/// Poller settings (see `[catalog]` in `docs/configuration.md`).
#[derive(Debug, Clone)]
pub struct PollerOptions {
    /// Base URL of the catalog server, e.g. `http://catalog:9100`.
    pub url: reqwest::Url,
    pub auth_header: HeaderName,
    /// Sent in `auth_header`; `None`: nothing sent.
    pub secret: Option<String>,
    pub interval: Duration,
    /// Each wait is the interval plus or minus this share of it (0 to 50).
    pub jitter_percent: u64,
    pub connect_timeout: Duration,
    /// Bound on each request, body included.
    pub request_timeout: Duration,
    pub backoff_max: Duration,
    /// Triggered fetches start at least this long after the previous fetch started.
    pub refresh_min_interval: Duration,
    pub max_bytes: u64,
    /// The secrets `hmac-sha256` key digests are made with (`catalog.key_secret_file`, read by
    /// the gateway's settings).
    pub secrets: Option<Arc<KeySecrets>>,
}

impl TryFrom<&CatalogConfig> for PollerOptions {
    type Error = ConfigError;

    /// The poller's settings; an error when `catalog.server_url` is empty (no poller then).
    fn try_from(c: &CatalogConfig) -> Result<Self, ConfigError> {
        let url = reqwest::Url::parse(&c.server_url)
            .ok()
            .filter(|u| matches!(u.scheme(), "http" | "https") && u.has_host())
            .ok_or_else(|| {
                ConfigError::option(
                    "catalog.server_url",
                    format!("{:?} is not an http(s) URL", c.server_url),
                )
            })?;
        Ok(PollerOptions {
            url,
            auth_header: header_name("catalog.server_auth_header", &c.server_auth_header)?,
            secret: (!c.server_secret.is_empty()).then(|| c.server_secret.clone()),
            interval: positive_ms("catalog.poll_interval_ms", c.poll_interval_ms)?,
            jitter_percent: c.poll_jitter_percent,
            connect_timeout: positive_ms("catalog.connect_timeout_ms", c.connect_timeout_ms)?,
            request_timeout: positive_ms("catalog.request_timeout_ms", c.request_timeout_ms)?,
            backoff_max: positive_ms("catalog.backoff_max_ms", c.backoff_max_ms)?,
            refresh_min_interval: Duration::from_millis(c.refresh_min_interval_ms),
            max_bytes: crate::config::max_bytes(c.max_bytes)?,
            secrets: None,
        })
    }
}

/// Why a poll failed. The current catalog keeps serving.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PollError {
    #[error("catalog server unreachable: {0}")]
    Unreachable(String),
    #[error("catalog server did not answer within the request timeout")]
    Timeout,
    #[error("catalog server's answer was cut off: {0}")]
    Truncated(String),
    #[error("catalog server answered {0}")]
    Status(u16),
    #[error("catalog server sent more than {0} bytes")]
    TooLarge(u64),
    #[error("catalog server sent an invalid catalog: {0}")]
    Invalid(String),
    #[error("catalog server offered version {offered}, older than the current {current}")]
    Older { offered: String, current: String },
}

impl PollError {
    /// A short label for counting failures by kind.
    pub fn kind(&self) -> &'static str {
        match self {
            PollError::Unreachable(_) => "unreachable",
            PollError::Timeout => "timeout",
            PollError::Truncated(_) => "truncated",
            PollError::Status(_) => "status",
            PollError::TooLarge(_) => "too_large",
            PollError::Invalid(_) => "invalid",
            PollError::Older { .. } => "older",
        }
    }
}

/// What a successful poll did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PollOutcome {
    Unchanged,
    /// A new version was applied, from a diff or from the whole catalog.
    Applied {
        version: CatalogVersion,
        from_diff: bool,
    },
}

/// Told about every version this instance applies (Redis pub/sub, so other instances fetch it too).
pub trait Announce: Send + Sync {
    fn announce(&self, hash: &str);
}

/// One answer of the catalog server: status, `ETag`, body.
pub type Fetched = (StatusCode, Option<String>, Bytes);

/// How the poller reaches its catalog server: over HTTP ([`Http`]), or a fake in unit tests.
pub trait Fetch: Send + Sync + 'static {
    /// `GET url`, with `If-None-Match` when given; the body is read whole, up to the size limit.
    fn get(
        &self,
        url: reqwest::Url,
        if_none_match: Option<&str>,
    ) -> impl Future<Output = Result<Fetched, PollError>> + Send;

    /// `GET url` whose `200` answer's body `read` consumes, on a blocking thread, as it arrives
    /// (up to the size limit); another status is returned with nothing read. A body cut short
    /// or over the limit is that error, whatever `read` made of the part it got. By default the
    /// body is read whole first.
    fn get_read<T: Send + 'static>(
        &self,
        url: reqwest::Url,
        read: impl FnOnce(&mut dyn std::io::Read) -> T + Send + 'static,
    ) -> impl Future<Output = Result<(StatusCode, Option<T>), PollError>> + Send {
        async move {
            let (status, _, body) = self.get(url, None).await?;
            if status != StatusCode::OK {
                return Ok((status, None));
            }
            let read = off_workers(move || read(&mut &body[..])).await?;
            Ok((status, Some(read)))
        }
    }
}

/// The catalog server over HTTP (reqwest), with the shared secret and the size limit.
pub struct Http {
    client: reqwest::Client,
    auth_header: HeaderName,
    secret: Option<String>,
    max_bytes: u64,
}

impl Http {
    pub fn new(opts: &PollerOptions) -> Result<Http, reqwest::Error> {
        Ok(Http {
            client: reqwest::Client::builder()
                .connect_timeout(opts.connect_timeout)
                .timeout(opts.request_timeout)
                .build()?,
            auth_header: opts.auth_header.clone(),
            secret: opts.secret.clone(),
            max_bytes: opts.max_bytes,
        })
    }
}

impl Http {
    /// Sends `GET url` and checks the answer's announced length.
    async fn send(
        &self,
        url: reqwest::Url,
        if_none_match: Option<&str>,
    ) -> Result<reqwest::Response, PollError> {
        let mut req = self.client.get(url);
        if let Some(secret) = &self.secret {
            req = req.header(&self.auth_header, secret.as_str());
        }
        if let Some(tag) = if_none_match {
            req = req.header(IF_NONE_MATCH, tag);
        }
        let classify = |e: reqwest::Error| {
            if e.is_timeout() {
                PollError::Timeout
            } else {
                PollError::Unreachable(e.to_string())
            }
        };
        let resp = req.send().await.map_err(classify)?;
        if resp.content_length().is_some_and(|n| n > self.max_bytes) {
            return Err(PollError::TooLarge(self.max_bytes));
        }
        Ok(resp)
    }

    /// The next piece of `resp`'s body, `received` bytes so far counted with it.
    async fn chunk(
        &self,
        resp: &mut reqwest::Response,
        received: &mut u64,
    ) -> Result<Option<Bytes>, PollError> {
        let chunk = resp.chunk().await.map_err(|e| {
            if e.is_timeout() {
                PollError::Timeout
            } else {
                PollError::Truncated(e.to_string())
            }
        })?;
        *received += chunk.as_ref().map_or(0, |c| c.len() as u64);
        if *received > self.max_bytes {
            return Err(PollError::TooLarge(self.max_bytes));
        }
        Ok(chunk)
    }
}

impl Fetch for Http {
    async fn get(
        &self,
        url: reqwest::Url,
        if_none_match: Option<&str>,
    ) -> Result<Fetched, PollError> {
        let mut resp = self.send(url, if_none_match).await?;
        let status = resp.status();
        let etag = resp
            .headers()
            .get(ETAG)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        // Sized once when the length is announced: growing by doubling would hold up to three
        // times a large catalog's bytes for a moment.
        let announced = resp.content_length().unwrap_or(0);
        let mut body = BytesMut::with_capacity(usize::try_from(announced).unwrap_or(0));
        let mut received = 0;
        while let Some(chunk) = self.chunk(&mut resp, &mut received).await? {
            body.extend_from_slice(&chunk);
        }
        Ok((status, etag, body.freeze()))
    }

    async fn get_read<T: Send + 'static>(
        &self,
        url: reqwest::Url,
        read: impl FnOnce(&mut dyn std::io::Read) -> T + Send + 'static,
    ) -> Result<(StatusCode, Option<T>), PollError> {
        let mut resp = self.send(url, None).await?;
        let status = resp.status();
        if status != StatusCode::OK {
            return Ok((status, None));
        }
        // A few pieces in flight: the reader keeps up with the network, and what is held is
        // bounded whatever the body's size.
        let (tx, rx) = tokio::sync::mpsc::channel(8);
        let reading = off_workers(move || read(&mut Pieces::new(rx)));
        let mut received = 0;
        // Moves `tx` in: its end, dropped, is the body's end for the reader.
        let fed = async move {
            while let Some(chunk) = self.chunk(&mut resp, &mut received).await? {
                if tx.send(chunk).await.is_err() {
                    break; // the reader stopped: its answer says why
                }
            }
            Ok::<(), PollError>(())
        };
        let (fed, read) = tokio::join!(fed, reading);
        fed?;
        Ok((status, Some(read?)))
    }
}

/// The pieces of a body as they arrive, read on a blocking thread; the end when the sender is
/// gone.
struct Pieces {
    rx: tokio::sync::mpsc::Receiver<Bytes>,
    piece: Bytes,
}

impl Pieces {
    fn new(rx: tokio::sync::mpsc::Receiver<Bytes>) -> Pieces {
        Pieces {
            rx,
            piece: Bytes::new(),
        }
    }
}

impl std::io::Read for Pieces {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.piece.is_empty() {
            match self.rx.blocking_recv() {
                Some(piece) => self.piece = piece,
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.piece.len());
        buf[..n].copy_from_slice(&self.piece.split_to(n));
        Ok(n)
    }
}

/// Polls one catalog server (`F`: how it is reached).
pub struct Poller<F = Http> {
    fetch: F,
    opts: PollerOptions,
    live: Arc<Live>,
    announce: Option<Arc<dyn Announce>>,
    /// Polls by outcome (a metric).
    polls: Family<OutcomeLabels, Counter>,
    /// The server has no `/latest` (a DynLimits-style server): poll `/indexed_limits` directly.
    no_latest: AtomicBool,
    /// ETag of the last whole catalog fetched, for `If-None-Match`.
    etag: std::sync::Mutex<Option<String>>,
}

fn jittered(d: Duration, percent: u64) -> Duration {
    let percent = percent.min(50);
    if percent == 0 {
        return d;
    }
    let r =
        std::collections::hash_map::RandomState::new().hash_one(Instant::now()) % (2 * percent + 1);
    d.mul_f64(1.0 + (r as f64 - percent as f64) / 100.0)
}

impl Poller {
    /// A poller that reaches its server over HTTP.
    pub fn new(
        opts: PollerOptions,
        live: Arc<Live>,
        announce: Option<Arc<dyn Announce>>,
        polls: Family<OutcomeLabels, Counter>,
    ) -> Result<Poller, reqwest::Error> {
        Ok(Poller::with_fetch(
            Http::new(&opts)?,
            opts,
            live,
            announce,
            polls,
        ))
    }
}

impl<F: Fetch> Poller<F> {
    /// A poller that reaches its server through `fetch`.
    pub fn with_fetch(
        fetch: F,
        opts: PollerOptions,
        live: Arc<Live>,
        announce: Option<Arc<dyn Announce>>,
        polls: Family<OutcomeLabels, Counter>,
    ) -> Poller<F> {
        Poller {
            fetch,
            opts,
            live,
            announce,
            polls,
            no_latest: AtomicBool::new(false),
            etag: std::sync::Mutex::new(None),
        }
    }

    /// `path` on the catalog server, below the configured URL's own path.
    fn endpoint(&self, path: &str) -> reqwest::Url {
        let mut url = self.opts.url.clone();
        let base = url.path().trim_end_matches('/').to_owned();
        url.set_path(&format!("{base}{path}"));
        url.set_query(None);
        url
    }

    /// One poll: brings the live catalog up to date with the server, or says why it could not.
    pub async fn poll_once(&self) -> Result<PollOutcome, PollError> {
        let current = self.live.snapshot();
        let ready = self.live.is_ready();
        let current_hash = if ready {
            current.version.hash.clone()
        } else {
            String::new()
        };
        let quoted = (!current_hash.is_empty()).then(|| format!("\"{current_hash}\""));

        if !self.no_latest.load(Ordering::Relaxed) {
            let (status, _, body) = self
                .fetch
                .get(self.endpoint("/latest"), quoted.as_deref())
                .await?;
            match status {
                StatusCode::NOT_MODIFIED => return Ok(PollOutcome::Unchanged),
                StatusCode::OK => {
                    let offered: CatalogVersion = serde_json::from_slice(&body)
                        .map_err(|e| PollError::Invalid(format!("/latest: {e}")))?;
                    if !offered.hash.is_empty() && offered.hash == current_hash {
                        return Ok(PollOutcome::Unchanged);
                    }
                    if ready && offered.is_older_than(&current.version) {
                        return Err(PollError::Older {
                            offered: offered.hash,
                            current: current_hash,
                        });
                    }
                    if !current_hash.is_empty()
                        && let Some(outcome) = self.try_diff(current.clone(), &current_hash).await?
                    {
                        return Ok(outcome);
                    }
                }
                StatusCode::NOT_FOUND => {
                    tracing::info!(
                        "the catalog server has no /latest; polling /indexed_limits instead"
                    );
                    self.no_latest.store(true, Ordering::Relaxed);
                }
                other => return Err(PollError::Status(other.as_u16())),
            }
        }

        let etag = if ready {
            self.etag.lock().unwrap_or_else(|e| e.into_inner()).clone()
        } else {
            None
        };
        let (status, etag, body) = self
            .fetch
            .get(self.endpoint("/indexed_limits"), etag.as_deref())
            .await?;
        match status {
            StatusCode::NOT_MODIFIED => Ok(PollOutcome::Unchanged),
            StatusCode::OK => {
                // The keys are read in a second pass, once the version is known to be new.
                let read = body.clone();
                let (doc, unknown) = off_workers(move || {
                    let mut unknown = UnknownFields::default();
                    let mut doc = CatalogDoc::parse_head("/indexed_limits", &read, &mut unknown)?;
                    if doc.hash().is_empty() {
                        // A server without versions: the content identifies the version.
                        let mut v = doc.version.take().unwrap_or_default();
                        v.hash = content_hash(&read);
                        doc.version = Some(v);
                    }
                    Ok::<_, super::CatalogError>((doc, unknown))
                })
                .await?
                .map_err(|e| PollError::Invalid(e.to_string()))?;
                *self.etag.lock().unwrap_or_else(|e| e.into_inner()) = etag;
                if ready && doc.hash() == current_hash {
                    return Ok(PollOutcome::Unchanged);
                }
                let offered = doc.version.clone().unwrap_or_default();
                if ready && offered.is_older_than(&current.version) {
                    return Err(PollError::Older {
                        offered: offered.hash,
                        current: current_hash,
                    });
                }
                let source = self.opts.url.to_string();
                let secrets = self.opts.secrets.clone();
                let snapshot =
                    off_workers(move || Snapshot::from_head(&source, doc, unknown, &body, secrets))
                        .await?
                        .map_err(|e| PollError::Invalid(e.to_string()))?;
                Ok(self.install(snapshot, false))
            }
            other => Err(PollError::Status(other.as_u16())),
        }
    }

    /// Tries `/catalog_diff`; `None` means "fetch the whole catalog".
    async fn try_diff(
        &self,
        current: Arc<Snapshot>,
        current_hash: &str,
    ) -> Result<Option<PollOutcome>, PollError> {
        let mut url = self.endpoint("/catalog_diff");
        url.query_pairs_mut().append_pair("from", current_hash);
        // Read and applied as it arrives (a diff of every key is as large as the catalog). A
        // diff only carries keys: the document's unknown fields stay as they were.
        let source = self.opts.url.to_string();
        let (status, applied) = self
            .fetch
            .get_read(url, move |body| current.apply_read(&source, body))
            .await?;
        match (status, applied) {
            (StatusCode::NOT_MODIFIED, _) => Ok(Some(PollOutcome::Unchanged)),
            (StatusCode::OK, Some(applied)) => {
                match applied.map_err(|e| PollError::Invalid(e.to_string()))? {
                    Some(snapshot) => Ok(Some(self.install(snapshot, true))),
                    None => Ok(None), // not from our version: fetch it whole
                }
            }
            _ => Ok(None),
        }
    }

    /// Serves `snapshot` from now on.
    fn install(&self, snapshot: Snapshot, from_diff: bool) -> PollOutcome {
        let version = snapshot.version.clone();
        tracing::info!(
            hash = %version.hash,
            semver = %version.semver,
            keys = snapshot.key_count(),
            endpoints = snapshot.endpoints().len(),
            from_diff,
            "catalog updated"
        );
        self.live.store(snapshot);
        if let Some(a) = &self.announce {
            a.announce(&version.hash);
        }
        PollOutcome::Applied { version, from_diff }
    }

    /// Polls until `shutdown`: at start, every interval (with jitter), and at once when woken.
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        let mut failures: u32 = 0;
        // tokio's clock: tests run the schedule under paused time.
        let mut last_fetch: Option<tokio::time::Instant> = None;
        loop {
            if let Some(last) = last_fetch {
                let delay = if failures == 0 {
                    jittered(self.opts.interval, self.opts.jitter_percent)
                } else {
                    let factor = 2u32.saturating_pow(failures.min(16));
                    jittered(
                        self.opts
                            .interval
                            .saturating_mul(factor)
                            .min(self.opts.backoff_max),
                        self.opts.jitter_percent,
                    )
                };
                let woken = tokio::select! {
                    () = tokio::time::sleep(delay) => false,
                    () = self.live.woken() => true,
                    () = shutdown.cancelled() => return,
                };
                if woken {
                    let spacing = (last + self.opts.refresh_min_interval)
                        .saturating_duration_since(tokio::time::Instant::now());
                    tokio::select! {
                        () = tokio::time::sleep(spacing.max(COALESCE)) => {}
                        () = shutdown.cancelled() => return,
                    }
                }
            }
            // Triggers that arrived while this fetch waited are answered by it: drop their stored
            // wake-up, or it would start a second fetch for nobody.
            let _ = futures_util::FutureExt::now_or_never(self.live.woken());
            let generation = self.live.fetch_started();
            last_fetch = Some(tokio::time::Instant::now());
            let result = self.poll_once().await;
            self.record(&result, &mut failures);
            self.live.fetch_finished(generation);
            // Said after the first poll, not at start-up: usually the catalog arrives at once.
            if generation == 1 && !self.live.is_ready() {
                tracing::warn!("no catalog yet: answering 503 until the catalog server answers");
            }
        }
    }

    fn record(&self, result: &Result<PollOutcome, PollError>, failures: &mut u32) {
        let outcome = match result {
            Ok(PollOutcome::Unchanged) => "unchanged",
            Ok(PollOutcome::Applied { .. }) => "applied",
            Err(e) => e.kind(),
        };
        self.polls.get_or_create(&OutcomeLabels { outcome }).inc();
        let mut status = self.live.status.lock().unwrap_or_else(|e| e.into_inner());
        status.polls += 1;
        status.last_poll = Some(Instant::now());
        match result {
            Ok(outcome) => {
                if *failures > 0 {
                    tracing::info!(failed_polls = *failures, "catalog server answers again");
                }
                *failures = 0;
                status.last_outcome = match outcome {
                    PollOutcome::Unchanged => "unchanged".into(),
                    PollOutcome::Applied { .. } => "applied".into(),
                };
            }
            Err(e) => {
                if *failures == 0 {
                    let serving = self.live.snapshot().version.hash.clone();
                    tracing::warn!(error = %e, serving = %serving, ready = self.live.is_ready(), "catalog poll failed; keeping the current catalog and backing off");
                } else {
                    tracing::debug!(error = %e, "catalog poll failed again");
                }
                *failures = failures.saturating_add(1);
                status.failures += 1;
                status.last_outcome = e.kind().into();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// A catalog server that answers every poll "unchanged" (or fails, as told) and notes when it
    /// was asked, on tokio's clock.
    struct Fake {
        start: tokio::time::Instant,
        failing: AtomicBool,
        asked: Mutex<Vec<Duration>>,
    }

    impl Fake {
        fn asked_at(&self) -> Vec<u64> {
            let asked = self.asked.lock().unwrap();
            asked.iter().map(|d| d.as_millis() as u64).collect()
        }
    }

    impl Fetch for Arc<Fake> {
        async fn get(&self, _: reqwest::Url, _: Option<&str>) -> Result<Fetched, PollError> {
            self.asked.lock().unwrap().push(self.start.elapsed());
            match self.failing.load(Ordering::SeqCst) {
                true => Err(PollError::Status(503)),
                false => Ok((StatusCode::NOT_MODIFIED, None, Bytes::new())),
            }
        }
    }

    fn options() -> PollerOptions {
        PollerOptions {
            url: reqwest::Url::parse("http://catalog.test").unwrap(),
            auth_header: HeaderName::from_static("x-api-key"),
            secret: None,
            interval: Duration::from_millis(1000),
            jitter_percent: 0,
            connect_timeout: Duration::from_secs(1),
            request_timeout: Duration::from_secs(1),
            backoff_max: Duration::from_millis(5000),
            refresh_min_interval: Duration::from_millis(500),
            max_bytes: 1024,
            secrets: None,
        }
    }

    /// A running poller on a fake server; `Live` starts ready so polls ask `/latest` only.
    fn start(failing: bool) -> (Arc<Fake>, Arc<Live>, CancellationToken) {
        let fake = Arc::new(Fake {
            start: tokio::time::Instant::now(),
            failing: AtomicBool::new(failing),
            asked: Mutex::default(),
        });
        let live = Live::new(Some(Snapshot::default()));
        let poller = Poller::with_fetch(
            fake.clone(),
            options(),
            live.clone(),
            None,
            Family::default(),
        );
        let stop = CancellationToken::new();
        tokio::spawn(Arc::new(poller).run(stop.clone()));
        (fake, live, stop)
    }

    async fn at(ms: u64, start: tokio::time::Instant) {
        tokio::time::sleep_until(start + Duration::from_millis(ms)).await;
    }

    #[tokio::test(start_paused = true)]
    async fn polls_at_start_then_every_interval() {
        let (fake, _live, _stop) = start(false);
        at(3500, fake.start).await;
        assert_eq!(fake.asked_at(), [0, 1000, 2000, 3000]);
    }

    #[tokio::test(start_paused = true)]
    async fn failures_back_off_doubling_up_to_the_maximum() {
        let (fake, _live, _stop) = start(true);
        at(20_000, fake.start).await;
        // Waits of 2, 4, 5 (the maximum), 5 s after the failures.
        assert_eq!(fake.asked_at(), [0, 2000, 6000, 11_000, 16_000]);
        fake.failing.store(false, Ordering::SeqCst);
        at(23_000, fake.start).await;
        assert_eq!(fake.asked_at()[5..], [21_000, 22_000]);
    }

    #[tokio::test(start_paused = true)]
    async fn forced_fetches_are_spaced_and_coalesced() {
        let (fake, live, _stop) = start(false);
        // 100 ms after the start-up fetch: it waits for the 500 ms spacing, and every trigger
        // that arrives meanwhile shares that fetch.
        at(100, fake.start).await;
        let waiting: Vec<_> = (0..10)
            .map(|_| {
                let live = live.clone();
                tokio::spawn(async move { live.refresh(Duration::from_secs(2)).await })
            })
            .collect();
        for w in waiting {
            assert!(w.await.unwrap(), "the refresh finished in time");
        }
        assert_eq!(fake.asked_at(), [0, 500]);
        // Long after the last fetch, a trigger waits only the coalescing pause.
        at(1200, fake.start).await;
        assert!(live.refresh(Duration::from_secs(2)).await);
        assert_eq!(
            fake.asked_at(),
            [0, 500, 1200 + COALESCE.as_millis() as u64]
        );
        // The interval counts from the forced fetch.
        at(2300, fake.start).await;
        assert_eq!(fake.asked_at()[3..], [2220]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_refresh_that_cannot_start_in_time_says_so() {
        let (fake, live, _stop) = start(false);
        at(10, fake.start).await;
        assert!(!live.refresh(Duration::from_millis(100)).await);
        assert_eq!(fake.asked_at(), [0]);
    }
}
