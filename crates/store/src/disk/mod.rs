//! disk: the embedded store's counters kept in a directory (`store.path`), so that a restart
//! does not hand every key its quota again, and a crash never lets one pass it.
//!
//! Counters are decided in memory as without a path; what goes to disk is each counter's
//! *claim* ([`record::Claim`]): units spent since its last record, and units reserved ahead in
//! blocks ([`cover`]). A request is answered only once the units it spent are covered by a
//! durable record. Records are appended to a log by one writer thread that groups them: one
//! write and one `fdatasync` per commit, at most one commit per [`COMMIT_EVERY`]. Now and then
//! (and at a clean stop) the writer writes every counter to a snapshot and starts a new log,
//! so the files hold the counters still in their windows, not the history.
//!
//! Files in the directory: `lock` (held with `flock` while a process uses the directory; it
//! says the holder's pid), `snapshot` (written as `snapshot.tmp`, then renamed), and
//! `log.N`, the logs that follow it. See docs/stores.md for what each guarantee rests on.

pub mod cover;
pub mod record;

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::{Duration, Instant};

use quotagate_engine::clock::Clock;
use quotagate_engine::limiter::{FixedWindow, Period, WindowSet, ZoneId};

use record::{Frame, LOG_MAGIC, Record, SNAPSHOT_MAGIC, read_frame};

/// At most one commit (a write and an `fdatasync`) per this much time, however busy: at most
/// 50 a second.
pub const COMMIT_EVERY: Duration = Duration::from_millis(20);
/// Records no answer waits for yet (reservations written ahead) are committed within this
/// time, or sooner with a record an answer waits for. An `fdatasync` costs the kernel about a
/// millisecond of CPU here: most records of a busy gateway are of this kind, and committing them
/// together keeps that cost off the requests (docs/stores.md). A block written ahead lasts longer
/// than this at its counter's full rate ([`cover::block`]).
pub const LAZY_COMMIT: Duration = Duration::from_millis(100);
/// A log longer than this is folded into a new snapshot.
pub const MAX_LOG_BYTES: u64 = 64 << 20;
/// A log is folded into a snapshot at least this often while it grows, so that counters that
/// left their windows leave the files.
pub const SNAPSHOT_EVERY: Duration = Duration::from_secs(300);
/// While the directory cannot be written, a new snapshot is tried this often.
const RETRY_EVERY: Duration = Duration::from_secs(1);

/// Why the directory cannot be used. One line, naming the path.
#[derive(Debug)]
pub struct DiskError(String);

impl std::fmt::Display for DiskError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for DiskError {}

fn fail(path: &Path, what: impl std::fmt::Display) -> DiskError {
    DiskError(format!("store.path {}: {what}", path.display()))
}

/// What the files held, put where the memory store keeps its counters as they are read (one
/// map insert a counter: a start with a million counters is within a second).
pub trait Restore {
    /// Room for about `sliding` more sliding counters and `fixed` more fixed windows.
    fn reserve(&mut self, sliding: usize, fixed: usize);
    /// Sliding counter `key`, put as it is.
    fn put_counter(&mut self, key: String, set: WindowSet);
    /// Sliding counter `key` (created empty when missing).
    fn counter(&mut self, key: &str) -> &mut WindowSet;
    /// Forgets every sliding counter whose name starts with `prefix`.
    fn forget(&mut self, prefix: &str);
    /// Fixed window `name`, put as it is.
    fn put_fixed(&mut self, name: String, w: FixedWindow);
    /// Fixed window `name`, if there is one.
    fn fixed(&mut self, name: &str) -> Option<&mut FixedWindow>;
}

/// Counters read into plain maps (what the fuzz target and tools read files into; the memory
/// store reads them into its own shards).
#[derive(Debug, Default)]
pub struct Collected {
    pub counters: HashMap<String, WindowSet>,
    pub fixed: HashMap<String, FixedWindow>,
}

impl Restore for Collected {
    fn reserve(&mut self, sliding: usize, fixed: usize) {
        self.counters.reserve(sliding);
        self.fixed.reserve(fixed);
    }

    fn put_counter(&mut self, key: String, set: WindowSet) {
        self.counters.insert(key, set);
    }

    fn counter(&mut self, key: &str) -> &mut WindowSet {
        self.counters.entry(key.to_owned()).or_default()
    }

    fn forget(&mut self, prefix: &str) {
        self.counters.retain(|k, _| !k.starts_with(prefix));
    }

    fn put_fixed(&mut self, name: String, w: FixedWindow) {
        self.fixed.insert(name, w);
    }

    fn fixed(&mut self, name: &str) -> Option<&mut FixedWindow> {
        self.fixed.get_mut(name)
    }
}

/// How the files ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Recovered {
    /// The last stop was clean (the counts are exact), else reservations were charged back.
    pub clean: bool,
    /// Snapshot entries read.
    pub counters: u64,
}

/// The counters a snapshot is written from: the memory store's maps.
pub trait Source: Send + Sync {
    /// Calls `f` with the bytes of a record of every live counter ([`Record::Counter`],
    /// [`Record::Fixed`]), a shard at a time; `clean`: at a stop, after the last request (no reservation is
    /// outstanding: the counts are exact), sliding counters first. Returns how many of each:
    /// sliding counters, fixed windows.
    fn each(&self, now_ms: u64, clean: bool, f: &mut dyn FnMut(&[u8])) -> (u64, u64);
}

/// Records waiting for the writer.
struct Queue {
    buf: Vec<u8>,
    /// The sequence number of the latest record appended.
    seq: u64,
    stop: bool,
    /// A snapshot is asked for now ([`Disk::compact_now`]).
    compact: bool,
    /// An answer waits for a record in `buf`: commit it as soon as [`COMMIT_EVERY`] allows.
    urgent: bool,
    /// When the oldest record in `buf` was appended.
    since: Option<Instant>,
}

struct Shared {
    queue: Mutex<Queue>,
    wake: Condvar,
    /// The latest record on disk.
    durable: AtomicU64,
    /// The directory cannot be written: answers are not durable (the failure policy applies).
    failed: AtomicBool,
    durable_now: tokio::sync::Notify,
    /// Commits written (one `fdatasync` each): a metric.
    commits: prometheus_client::metrics::counter::Counter,
}

/// The embedded store's directory, once opened: appends records, says when they are durable.
pub struct Disk {
    shared: Arc<Shared>,
    dir: PathBuf,
    writer: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// Until the writer starts: the open log and the lock.
    files: Mutex<Option<Files>>,
    clock: Arc<dyn Clock>,
    commit_every: Duration,
}

impl std::fmt::Debug for Disk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Disk").field("dir", &self.dir).finish()
    }
}

struct Files {
    _lock: File,
    log: File,
    log_gen: u64,
    log_bytes: u64,
}

impl Disk {
    /// Opens `dir` (created when missing), locks it, and reads what it holds. Refuses a
    /// directory another process holds, and files that cannot show every committed record.
    /// `commit_every`: at most one commit per this much time ([`COMMIT_EVERY`]).
    pub fn open(
        dir: &Path,
        clock: Arc<dyn Clock>,
        commit_every: Duration,
        into: &mut dyn Restore,
    ) -> Result<(Disk, Recovered), DiskError> {
        fs::create_dir_all(dir).map_err(|e| fail(dir, format_args!("cannot create: {e}")))?;
        let lock = lock(dir)?;
        let now_ms = clock.now_ms();
        let (recovered, log_gen, log_bytes) = recover(dir, now_ms, into)?;
        let log_path = dir.join(log_name(log_gen));
        let mut log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(|e| {
                fail(
                    dir,
                    format_args!("cannot write {}: {e}", log_path.display()),
                )
            })?;
        let log_bytes = if log_bytes < LOG_MAGIC.len() as u64 {
            log.set_len(0)
                .and_then(|()| log.write_all(LOG_MAGIC))
                .and_then(|()| log.sync_data())
                .and_then(|()| sync_dir(dir))
                .map_err(|e| {
                    fail(
                        dir,
                        format_args!("cannot write {}: {e}", log_path.display()),
                    )
                })?;
            LOG_MAGIC.len() as u64
        } else {
            log_bytes
        };
        // Every cover starts afresh: what the last claims reserved is charged as spent by now,
        // should this process stop before its first snapshot.
        let mut marker = Vec::new();
        Record::Restart { at_ms: now_ms }.encode(&mut marker);
        let mut framed = Vec::new();
        record::frame(&mut framed, &marker);
        log.write_all(&framed)
            .and_then(|()| log.sync_data())
            .map_err(|e| {
                fail(
                    dir,
                    format_args!("cannot write {}: {e}", log_path.display()),
                )
            })?;
        let log_bytes = log_bytes + framed.len() as u64;
        let disk = Disk {
            shared: Arc::new(Shared {
                queue: Mutex::new(Queue {
                    buf: Vec::new(),
                    seq: 0,
                    stop: false,
                    compact: false,
                    urgent: false,
                    since: None,
                }),
                wake: Condvar::new(),
                durable: AtomicU64::new(0),
                failed: AtomicBool::new(false),
                durable_now: tokio::sync::Notify::new(),
                commits: Default::default(),
            }),
            dir: dir.to_owned(),
            writer: Mutex::new(None),
            files: Mutex::new(Some(Files {
                _lock: lock,
                log,
                log_gen,
                log_bytes,
            })),
            clock,
            commit_every,
        };
        Ok((disk, recovered))
    }

    /// Starts the writer, which snapshots from `source` (held weakly: when it is gone, the
    /// writer ends as a crash would, every commit on disk).
    pub fn start(&self, source: Weak<dyn Source>) {
        let Some(files) = self.files.lock().unwrap_or_else(|e| e.into_inner()).take() else {
            return;
        };
        let writer = Writer {
            shared: self.shared.clone(),
            dir: self.dir.clone(),
            files,
            source,
            clock: self.clock.clone(),
            last_snapshot: Instant::now(),
            last_commit: Instant::now()
                .checked_sub(self.commit_every)
                .unwrap_or_else(Instant::now),
            commit_every: self.commit_every,
            failed_logged: false,
        };
        let handle = std::thread::Builder::new()
            .name("quotagate-disk".into())
            .spawn(move || writer.run());
        match handle {
            Ok(h) => *self.writer.lock().unwrap_or_else(|e| e.into_inner()) = Some(h),
            Err(e) => {
                tracing::error!(error = %e, "store.path: cannot start the writer thread");
                self.shared.failed.store(true, Ordering::SeqCst);
            }
        }
    }

    /// Appends `record`, committed within [`LAZY_COMMIT`]; its sequence number, durable once
    /// [`Disk::durable`] reaches it.
    pub fn append(&self, record: &Record) -> u64 {
        self.append_with(false, |buf| record.encode(buf))
    }

    /// Appends the record `encode` writes (one whole record: see [`record`]'s `encode_*`);
    /// `urgent`: an answer waits for it (else it is committed within [`LAZY_COMMIT`]).
    pub fn append_with(&self, urgent: bool, encode: impl FnOnce(&mut Vec<u8>)) -> u64 {
        let mut q = self.shared.queue.lock().unwrap_or_else(|e| e.into_inner());
        if q.buf.is_empty() {
            q.since = Some(Instant::now());
        }
        encode(&mut q.buf);
        q.seq += 1;
        if urgent {
            q.urgent = true;
            self.shared.wake.notify_one();
        }
        q.seq
    }

    /// An answer now waits for a record appended without hurry: commit what is queued as soon
    /// as [`COMMIT_EVERY`] allows.
    pub fn hurry(&self) {
        let mut q = self.shared.queue.lock().unwrap_or_else(|e| e.into_inner());
        // An empty queue: the record is being committed already.
        if !q.buf.is_empty() {
            q.urgent = true;
            self.shared.wake.notify_one();
        }
    }

    /// The latest record on disk.
    pub fn durable(&self) -> u64 {
        self.shared.durable.load(Ordering::Acquire)
    }

    /// The directory cannot be written (since the last commit tried).
    pub fn is_failed(&self) -> bool {
        self.shared.failed.load(Ordering::Acquire)
    }

    /// Commits (one `fdatasync` each) so far, as a metric the application registers.
    pub fn commits(&self) -> &prometheus_client::metrics::counter::Counter {
        &self.shared.commits
    }

    /// Waits until record `seq` is on disk; `false` when the directory cannot be written.
    pub async fn wait(&self, seq: u64) -> bool {
        loop {
            if self.durable() >= seq {
                return true;
            }
            if self.is_failed() {
                return false;
            }
            let notified = self.shared.durable_now.notified();
            let mut notified = std::pin::pin!(notified);
            notified.as_mut().enable();
            if self.durable() >= seq {
                return true;
            }
            if self.is_failed() {
                return false;
            }
            notified.await;
        }
    }

    /// Folds the log into a new snapshot at the writer's next turn, as it does every
    /// [`SNAPSHOT_EVERY`] (for tests of what a failed snapshot does, and for operators' tools).
    pub fn compact_now(&self) {
        let mut q = self.shared.queue.lock().unwrap_or_else(|e| e.into_inner());
        q.compact = true;
        self.shared.wake.notify_one();
    }

    /// Writes what is queued, then every counter as it is now (exact: call it after the last
    /// request), and stops the writer. After it the directory holds the counts exactly.
    pub fn close(&self) {
        {
            let mut q = self.shared.queue.lock().unwrap_or_else(|e| e.into_inner());
            q.stop = true;
            self.shared.wake.notify_one();
        }
        if let Some(h) = self.writer.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = h.join();
        }
        // Nothing is written after it: a later answer is not durable (the failure policy).
        self.shared.failed.store(true, Ordering::Release);
        self.shared.durable_now.notify_waiters();
    }
}

/// The name of log `gen`.
fn log_name(generation: u64) -> String {
    format!("log.{generation:010}")
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Takes the directory's lock, or names who holds it.
fn lock(dir: &Path) -> Result<File, DiskError> {
    let path = dir.join("lock");
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(|e| fail(dir, format_args!("cannot write {}: {e}", path.display())))?;
    match file.try_lock() {
        Ok(()) => {}
        Err(fs::TryLockError::WouldBlock) => {
            let mut holder = String::new();
            let _ = file.read_to_string(&mut holder);
            let holder = holder.trim();
            let who = match holder.parse::<u32>() {
                Ok(pid) => format!("by another quotagate (pid {pid})"),
                Err(_) => "by another process".to_owned(),
            };
            return Err(fail(
                dir,
                format_args!("in use {who}: a directory serves one instance"),
            ));
        }
        Err(fs::TryLockError::Error(e)) => {
            return Err(fail(
                dir,
                format_args!("cannot lock {}: {e}", path.display()),
            ));
        }
    }
    let _ = file.set_len(0);
    let _ = write!(file, "{}", std::process::id());
    Ok(file)
}

/// The files as they are read: the counters go to `into`; what the last claim of each counter
/// reserved is kept apart until it is charged (at a restart marker, or at the end).
struct Replay<'a> {
    into: &'a mut dyn Restore,
    /// Sliding counters' outstanding units and until when.
    outstanding: HashMap<String, (u64, u64), foldhash::fast::RandomState>,
    /// Fixed windows' outstanding units.
    fixed_outstanding: HashMap<String, u64, foldhash::fast::RandomState>,
    counters: u64,
}

impl<'a> Replay<'a> {
    fn new(into: &'a mut dyn Restore) -> Replay<'a> {
        Replay {
            into,
            outstanding: HashMap::default(),
            fixed_outstanding: HashMap::default(),
            counters: 0,
        }
    }

    fn apply(&mut self, r: Record) {
        match r {
            Record::Counter {
                key,
                set,
                outstanding,
                until_ms,
            } => {
                self.counters += 1;
                if outstanding > 0 {
                    self.outstanding
                        .insert(key.clone(), (outstanding, until_ms));
                }
                self.into.put_counter(key, set);
            }
            Record::Fixed {
                name,
                credit,
                expires,
            } => {
                self.counters += 1;
                self.into.put_fixed(name, FixedWindow { credit, expires });
            }
            Record::Grant {
                key,
                claim,
                windows,
                tallies,
            } => {
                let set = self.into.counter(&key);
                set.charge(&windows, &tallies, claim.spent, claim.at_ms);
                // The units it spent before are in `spent`: only this claim is outstanding.
                self.outstanding
                    .insert(key, (claim.open + claim.reserve, claim.until_ms));
            }
            Record::FixedGrant {
                name,
                limit,
                expires,
                claim,
            } => {
                match self.into.fixed(&name) {
                    Some(w) if w.expires == expires => {
                        w.credit = w.credit.saturating_sub(claim.spent);
                    }
                    // A window that started after the one kept, or one no snapshot holds.
                    _ => self.into.put_fixed(
                        name.clone(),
                        FixedWindow {
                            credit: limit.saturating_sub(claim.spent),
                            expires,
                        },
                    ),
                }
                self.fixed_outstanding
                    .insert(name, claim.open + claim.reserve);
            }
            Record::Forget { prefix } => {
                self.into.forget(&prefix);
                self.outstanding.retain(|k, _| !k.starts_with(&prefix));
            }
            Record::Restart { at_ms } => self.charge_outstanding(at_ms),
            Record::End { .. } => {}
        }
    }

    /// Charges every counter's outstanding units at their end, or at `at_ms` if sooner (every
    /// unit spent before a restart was spent by then): a restart starts every cover afresh, so
    /// what the last claims reserved becomes spent.
    fn charge_outstanding(&mut self, at_ms: u64) {
        for (key, (outstanding, until_ms)) in self.outstanding.drain() {
            let set = self.into.counter(&key);
            let windows: Vec<u32> = set.windows().iter().map(|w| w.seconds()).collect();
            let tallies: Vec<(Period, ZoneId)> = set
                .tallies()
                .iter()
                .map(|t| (t.period(), t.zone()))
                .collect();
            set.charge(&windows, &tallies, outstanding, until_ms.min(at_ms));
        }
        for (name, outstanding) in self.fixed_outstanding.drain() {
            if let Some(w) = self.into.fixed(&name) {
                w.credit = w.credit.saturating_sub(outstanding);
            }
        }
    }

    /// The counters as they are to be resumed at `now_ms` (those that left their windows too:
    /// the memory store sweeps them as it does its own).
    fn finish(mut self, now_ms: u64, clean: bool) -> Recovered {
        self.charge_outstanding(now_ms);
        Recovered {
            clean,
            counters: self.counters,
        }
    }
}

/// Reads the snapshot and the logs after it; what they hold, the log to append to and its
/// length (0: a new one).
fn recover(
    dir: &Path,
    now_ms: u64,
    into: &mut dyn Restore,
) -> Result<(Recovered, u64, u64), DiskError> {
    let _ = fs::remove_file(dir.join("snapshot.tmp"));
    let mut logs: Vec<u64> = Vec::new();
    for entry in fs::read_dir(dir).map_err(|e| fail(dir, format_args!("cannot read: {e}")))? {
        let Ok(entry) = entry else { continue };
        let name = entry.file_name();
        if let Some(generation) = name
            .to_str()
            .and_then(|n| n.strip_prefix("log."))
            .and_then(|g| g.parse::<u64>().ok())
        {
            logs.push(generation);
        }
    }
    logs.sort_unstable();
    let snapshot = dir.join("snapshot");
    let mut replay = Replay::new(into);
    let (first_log, clean) = match fs::read(&snapshot) {
        Ok(bytes) => read_snapshot(dir, &bytes, &mut replay)?,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            if !logs.is_empty() {
                return Err(fail(
                    dir,
                    "holds logs but no snapshot: refusing to start from part of the counts",
                ));
            }
            // A new directory: an empty snapshot first, so that a log is never without one.
            let mut bytes = SNAPSHOT_MAGIC.to_vec();
            let mut end = Vec::new();
            Record::End {
                next_log: 1,
                entries: 0,
                fixed: 0,
                clean: true,
            }
            .encode(&mut end);
            record::frame(&mut bytes, &end);
            let tmp = dir.join("snapshot.tmp");
            fs::write(&tmp, &bytes)
                .and_then(|()| File::open(&tmp)?.sync_all())
                .and_then(|()| fs::rename(&tmp, &snapshot))
                .and_then(|()| sync_dir(dir))
                .map_err(|e| fail(dir, format_args!("cannot write: {e}")))?;
            return Ok((
                Recovered {
                    clean: true,
                    counters: 0,
                },
                1,
                0,
            ));
        }
        Err(e) => return Err(fail(dir, format_args!("cannot read snapshot: {e}"))),
    };
    // Logs the last snapshot folded in, left by a stop between its rename and their removal.
    for &g in logs.iter().filter(|&&g| g < first_log) {
        let _ = fs::remove_file(dir.join(log_name(g)));
    }
    logs.retain(|&g| g >= first_log);
    for (i, &g) in logs.iter().enumerate() {
        if g != first_log + i as u64 {
            return Err(fail(
                dir,
                format_args!(
                    "{} is missing: refusing to start from part of the counts",
                    log_name(first_log + i as u64)
                ),
            ));
        }
    }
    let mut clean = clean;
    let (mut append_gen, mut append_bytes) = (first_log, 0);
    let lengths: Vec<u64> = logs
        .iter()
        .map(|&g| fs::metadata(dir.join(log_name(g))).map_or(0, |m| m.len()))
        .collect();
    for (i, &g) in logs.iter().enumerate() {
        let path = dir.join(log_name(g));
        let bytes = fs::read(&path)
            .map_err(|e| fail(dir, format_args!("cannot read {}: {e}", path.display())))?;
        // No commit follows this log's: a commit it ends with, cut short, was the last written.
        let last = lengths[i + 1..]
            .iter()
            .all(|&n| n <= LOG_MAGIC.len() as u64);
        let whole = read_log(dir, &path, &bytes, last, &mut replay)?;
        if whole > LOG_MAGIC.len() {
            clean = false;
        }
        if whole < bytes.len() {
            // A commit cut short by the crash: it was never answered. Cut it off so that the
            // next commits follow the last whole one.
            tracing::warn!(path = %path.display(), at = whole, "store.path: the last commit was cut short by a stop; it was never answered and is dropped");
            let f = OpenOptions::new()
                .write(true)
                .open(&path)
                .map_err(|e| fail(dir, format_args!("cannot write {}: {e}", path.display())))?;
            f.set_len(whole as u64)
                .and_then(|()| f.sync_all())
                .map_err(|e| fail(dir, format_args!("cannot write {}: {e}", path.display())))?;
        }
        (append_gen, append_bytes) = (g, whole as u64);
    }
    Ok((replay.finish(now_ms, clean), append_gen, append_bytes))
}

/// What a snapshot and the logs after it hold, read as a start reads them, from bytes (the fuzz
/// target's door: nothing a file holds may panic or hang a start).
pub fn read_bytes(
    snapshot: &[u8],
    logs: &[&[u8]],
    now_ms: u64,
    into: &mut dyn Restore,
) -> Result<Recovered, DiskError> {
    let dir = Path::new("(bytes)");
    let mut replay = Replay::new(into);
    let (_, clean) = read_snapshot(dir, snapshot, &mut replay)?;
    for (i, log) in logs.iter().enumerate() {
        read_log(dir, Path::new("log"), log, i + 1 == logs.len(), &mut replay)?;
    }
    Ok(replay.finish(now_ms.min(record::MAX_MS), clean))
}

/// Reads a snapshot into `replay`: the log that follows it, and whether it was written at a
/// clean stop.
fn read_snapshot(dir: &Path, bytes: &[u8], replay: &mut Replay) -> Result<(u64, bool), DiskError> {
    let damaged = |why: &str| {
        fail(
            dir,
            format_args!(
                "snapshot is damaged ({why}): refusing to start from part of the counts; restore the directory from a backup, or move it away to start from zero"
            ),
        )
    };
    let Some(mut rest) = bytes.strip_prefix(SNAPSHOT_MAGIC) else {
        return Err(damaged("not a quotagate snapshot"));
    };
    // Room for the counters at once, from the count its last record gives (a hint, checked
    // below; bounded by what the bytes can hold).
    if let Some(end) = bytes.len().checked_sub(record::END_LEN)
        && bytes[end] == record::END
    {
        let at = |i: usize| u64::from_le_bytes(bytes[i..i + 8].try_into().unwrap_or_default());
        let (entries, fixed) = (at(end + 9), at(end + 17));
        let most = (bytes.len() / 24) as u64;
        let fixed = fixed.min(entries).min(most);
        replay
            .into
            .reserve((entries.min(most) - fixed) as usize, fixed as usize);
    }
    let mut entries = 0u64;
    loop {
        match read_frame(rest) {
            Frame::Whole(payload, n) => {
                rest = &rest[n..];
                for r in Record::decode_all(payload).map_err(|m| damaged(m.0))? {
                    if let Record::End {
                        next_log,
                        entries: count,
                        clean,
                        ..
                    } = r
                    {
                        if count != entries || !rest.is_empty() {
                            return Err(damaged("entries missing"));
                        }
                        return Ok((next_log, clean));
                    }
                    entries += 1;
                    replay.apply(r);
                }
            }
            Frame::Short => return Err(damaged("cut short")),
            Frame::Bad => return Err(damaged("a checksum does not hold")),
        }
    }
}

/// Reads a log's commits into `replay`; the bytes of whole commits. A commit that does not
/// read whole is accepted only at the end of the last log, with nothing whole after it (a
/// commit the crash cut short: it was never answered); anywhere else it refuses.
fn read_log(
    dir: &Path,
    path: &Path,
    bytes: &[u8],
    last: bool,
    replay: &mut Replay,
) -> Result<usize, DiskError> {
    let damaged = |at: usize, why: &str| {
        fail(
            dir,
            format_args!(
                "{} is damaged at byte {at} ({why}): refusing to start from part of the counts; restore the directory from a backup, or move it away to start from zero",
                path.display()
            ),
        )
    };
    if !bytes.starts_with(LOG_MAGIC) {
        // A log created by a snapshot that did not finish: it holds nothing.
        if LOG_MAGIC.starts_with(bytes) {
            return Ok(bytes.len());
        }
        return Err(damaged(0, "not a quotagate log"));
    }
    let mut at = LOG_MAGIC.len();
    loop {
        if at == bytes.len() {
            return Ok(at);
        }
        match read_frame(&bytes[at..]) {
            Frame::Whole(payload, n) => {
                for r in Record::decode_all(payload).map_err(|m| damaged(at, m.0))? {
                    replay.apply(r);
                }
                at += n;
            }
            Frame::Short | Frame::Bad => {
                if last && !whole_frame_after(&bytes[at + 1..]) {
                    return Ok(at);
                }
                return Err(damaged(at, "a commit after it is whole"));
            }
        }
    }
}

/// Whether a whole frame starts anywhere in `bytes` (a damaged commit followed by good ones is
/// damage, not a crash).
fn whole_frame_after(bytes: &[u8]) -> bool {
    (0..bytes.len()).any(|i| matches!(read_frame(&bytes[i..]), Frame::Whole(p, _) if !p.is_empty() && Record::decode_all(p).is_ok()))
}

/// The writer thread's state.
struct Writer {
    shared: Arc<Shared>,
    dir: PathBuf,
    files: Files,
    source: Weak<dyn Source>,
    clock: Arc<dyn Clock>,
    last_snapshot: Instant,
    last_commit: Instant,
    commit_every: Duration,
    failed_logged: bool,
}

impl Writer {
    fn run(mut self) {
        let mut spare = Vec::new();
        loop {
            let (stop, seq, compact) = {
                let mut q = self.shared.queue.lock().unwrap_or_else(|e| e.into_inner());
                loop {
                    if q.stop || q.compact || (!q.buf.is_empty() && q.urgent) {
                        break;
                    }
                    // Records no answer waits for: committed once the oldest is LAZY_COMMIT old.
                    let wait = match q.since {
                        Some(since) if !q.buf.is_empty() => {
                            match LAZY_COMMIT.checked_sub(since.elapsed()) {
                                Some(left) if !left.is_zero() => left,
                                _ => break,
                            }
                        }
                        _ => RETRY_EVERY,
                    };
                    let (guard, timeout) = self
                        .shared
                        .wake
                        .wait_timeout(q, wait)
                        .unwrap_or_else(|e| e.into_inner());
                    q = guard;
                    if timeout.timed_out() && q.buf.is_empty() {
                        break;
                    }
                }
                q.urgent = false;
                q.since = None;
                std::mem::swap(&mut q.buf, &mut spare);
                (q.stop, q.seq, std::mem::take(&mut q.compact))
            };
            if self.source.strong_count() == 0 && !stop {
                // The store is gone without a stop: end as a crash would.
                let _ = self.commit(&mut spare, seq);
                return;
            }
            if self.shared.failed.load(Ordering::Acquire) {
                spare.clear();
                // Every count is in memory: a snapshot makes the directory whole again.
                if self.snapshot(false).is_ok() {
                    self.shared.durable.store(seq, Ordering::Release);
                    self.shared.failed.store(false, Ordering::Release);
                    self.shared.durable_now.notify_waiters();
                    self.failed_logged = false;
                    tracing::warn!(path = %self.dir.display(), "store.path is writable again: answers are durable again");
                }
            } else if !spare.is_empty()
                && let Err(e) = self.commit(&mut spare, seq)
            {
                self.failing(&e);
            }
            if stop {
                if !self.shared.failed.load(Ordering::Acquire)
                    && let Err(e) = self.snapshot(true)
                {
                    tracing::error!(path = %self.dir.display(), error = %e, "store.path: the last snapshot was not written; the next start charges back reservations");
                }
                return;
            }
            let due = compact
                || self.files.log_bytes > MAX_LOG_BYTES
                || (self.last_snapshot.elapsed() >= SNAPSHOT_EVERY
                    && self.files.log_bytes > LOG_MAGIC.len() as u64);
            if due
                && !self.shared.failed.load(Ordering::Acquire)
                && let Err(e) = self.snapshot(false)
            {
                self.failing(&e);
            }
            // At most one commit per COMMIT_EVERY: records that come meanwhile wait together.
            let since = self.last_commit.elapsed();
            if since < self.commit_every {
                std::thread::sleep(self.commit_every - since);
            }
        }
    }

    fn failing(&mut self, e: &io::Error) {
        self.shared.failed.store(true, Ordering::Release);
        self.shared.durable_now.notify_waiters();
        if !self.failed_logged {
            self.failed_logged = true;
            tracing::error!(path = %self.dir.display(), error = %e, "store.path cannot be written: the failure policy applies until it can");
        }
    }

    /// Writes `buf` (records up to `seq`) as one commit and makes it durable.
    fn commit(&mut self, buf: &mut Vec<u8>, seq: u64) -> io::Result<()> {
        self.last_commit = Instant::now();
        let n = commit_to(&mut self.files.log, &self.shared, buf, seq)?;
        self.files.log_bytes += n;
        Ok(())
    }

    /// Starts a new log and writes every counter to a new snapshot followed by it; then removes
    /// the logs it folds in. `clean`: at a stop, the counts exact.
    fn snapshot(&mut self, clean: bool) -> io::Result<()> {
        let Some(source) = self.source.upgrade() else {
            return Ok(());
        };
        let next_gen = self.files.log_gen + 1;
        let log_path = self.dir.join(log_name(next_gen));
        let mut log = OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(true)
            .open(&log_path)?;
        log.write_all(LOG_MAGIC)?;
        log.sync_data()?;
        sync_dir(&self.dir)?;
        let tmp = self.dir.join("snapshot.tmp");
        let mut file = io::BufWriter::with_capacity(1 << 20, File::create(&tmp)?);
        file.write_all(SNAPSHOT_MAGIC)?;
        let mut payload = Vec::with_capacity(1 << 20);
        let mut framed = Vec::with_capacity(1 << 20);
        let mut error = None;
        // Records appended from here go to the new log (their units are in memory, so also in
        // this snapshot: counted twice after a crash, never missed).
        let old_gen = self.files.log_gen;
        self.files.log = log;
        self.files.log_gen = next_gen;
        self.files.log_bytes = LOG_MAGIC.len() as u64;
        let (shared, new_log) = (&self.shared, &mut self.files.log);
        let mut log_bytes = 0u64;
        let mut last_commit = self.last_commit;
        let commit_every = self.commit_every;
        let mut queued = Vec::new();
        let mut seen = 0u32;
        let (sliding, fixed) = source.each(self.clock.now_ms(), clean, &mut |r| {
            // Requests keep waiting on commits while a large snapshot is written.
            seen += 1;
            if seen.is_multiple_of(1024) && last_commit.elapsed() >= commit_every {
                let seq = {
                    let mut q = shared.queue.lock().unwrap_or_else(|e| e.into_inner());
                    std::mem::swap(&mut q.buf, &mut queued);
                    q.seq
                };
                last_commit = Instant::now();
                match commit_to(new_log, shared, &mut queued, seq) {
                    Ok(n) => log_bytes += n,
                    Err(e) => {
                        error.get_or_insert(e);
                    }
                }
            }
            payload.extend_from_slice(r);
            if payload.len() >= 1 << 20 {
                framed.clear();
                record::frame(&mut framed, &payload);
                payload.clear();
                if let Err(e) = file.write_all(&framed) {
                    error.get_or_insert(e);
                }
            }
        });
        self.files.log_bytes += log_bytes;
        self.last_commit = last_commit;
        if let Some(e) = error {
            return Err(e);
        }
        Record::End {
            next_log: next_gen,
            entries: sliding + fixed,
            fixed,
            clean,
        }
        .encode(&mut payload);
        framed.clear();
        record::frame(&mut framed, &payload);
        file.write_all(&framed)?;
        let file = file.into_inner().map_err(|e| e.into_error())?;
        file.sync_all()?;
        drop(file);
        fs::rename(&tmp, self.dir.join("snapshot"))?;
        sync_dir(&self.dir)?;
        for g in (1..=old_gen).rev() {
            match fs::remove_file(self.dir.join(log_name(g))) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => break,
                Err(_) => break,
            }
        }
        self.last_snapshot = Instant::now();
        Ok(())
    }
}

/// Writes `buf` (records up to `seq`) to `log` as one commit (several frames if it is longer
/// than a frame may be; records are never split) and makes it durable; the bytes written.
fn commit_to(log: &mut File, shared: &Shared, buf: &mut Vec<u8>, seq: u64) -> io::Result<u64> {
    if buf.is_empty() {
        return Ok(0);
    }
    let mut out = Vec::with_capacity(buf.len() + 16);
    if buf.len() <= record::MAX_FRAME {
        record::frame(&mut out, buf);
    } else {
        let mut rest = &buf[..];
        while !rest.is_empty() {
            let mut probe = rest;
            while rest.len() - probe.len() < record::MAX_FRAME / 2
                && !probe.is_empty()
                && Record::decode(&mut probe).is_ok()
            {}
            let take = match rest.len() - probe.len() {
                0 => rest.len().min(record::MAX_FRAME),
                n => n,
            };
            record::frame(&mut out, &rest[..take]);
            rest = &rest[take..];
        }
    }
    let written = log.write_all(&out).and_then(|()| log.sync_data());
    buf.clear();
    written?;
    shared.commits.inc();
    shared.durable.store(seq, Ordering::Release);
    shared.durable_now.notify_waiters();
    Ok(out.len() as u64)
}
