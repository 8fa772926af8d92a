//! load: the rule files on disk. `rls.config` names one YAML file or a directory whose `*.yaml`
//! and `*.yml` files are read (not its subdirectories, not hidden files). A watcher compares the
//! files' names, sizes, modification times and inodes every second and reloads on any change (added,
//! replaced, renamed, deleted; a directory swapped behind a symlink, as Kubernetes mounts
//! ConfigMaps, too). A set that does not load keeps the one in service and logs every problem.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use super::rules::{MAX_RULE_FILE_BYTES, Problems, RuleSet};
use super::service::Rls;

/// How often the rule files are looked at. Default: 1 s.
pub const WATCH_INTERVAL: Duration = Duration::from_secs(1);
/// Rule files read from one directory, at most. Default: 1000.
pub const MAX_RULE_FILES: usize = 1000;

/// What the watcher compares: each file's path, size, modification time and inode (a file
/// renamed over another is a new inode even when its size and time match the old one's).
pub type Fingerprint = Vec<(PathBuf, u64, Option<SystemTime>, u64)>;

/// Why the rule files cannot be listed.
#[derive(Debug, thiserror::Error)]
pub enum ListError {
    #[error("{}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: more than {MAX_RULE_FILES} rule files", path.display())]
    TooMany { path: PathBuf },
}

/// The rule files `path` names, sorted, with their fingerprint.
pub fn list(path: &Path) -> Result<Fingerprint, ListError> {
    let read = |source| ListError::Read {
        path: path.to_owned(),
        source,
    };
    let meta = std::fs::metadata(path).map_err(read)?;
    let files: Vec<PathBuf> = if meta.is_dir() {
        let mut files = Vec::new();
        let dir = std::fs::read_dir(path).map_err(read)?;
        for entry in dir.flatten() {
            let p = entry.path();
            let name = entry.file_name();
            let name = name.to_string_lossy();
            let yaml = name.ends_with(".yaml") || name.ends_with(".yml");
            if yaml && !name.starts_with('.') && p.is_file() {
                files.push(p);
            }
        }
        if files.len() > MAX_RULE_FILES {
            return Err(ListError::TooMany {
                path: path.to_owned(),
            });
        }
        files.sort();
        files
    } else {
        vec![path.to_owned()]
    };
    Ok(files
        .into_iter()
        .map(|p| {
            use std::os::unix::fs::MetadataExt;
            let m = std::fs::metadata(&p).ok();
            let size = m.as_ref().map_or(0, |m| m.len());
            let inode = m.as_ref().map_or(0, |m| m.ino());
            let modified = m.and_then(|m| m.modified().ok());
            (p, size, modified, inode)
        })
        .collect())
}

/// Reads and checks every rule file `path` names.
pub fn load(path: &Path, merge: bool) -> Result<RuleSet, Problems> {
    let files = list(path).map_err(|e| Problems(vec![e.to_string()]))?;
    let mut texts = Vec::with_capacity(files.len());
    let mut problems = Vec::new();
    for (file, size, _, _) in &files {
        let name = file.display().to_string();
        if *size > MAX_RULE_FILE_BYTES {
            problems.push(format!("{name}: larger than {MAX_RULE_FILE_BYTES} bytes"));
            continue;
        }
        match crate::config::files::read_capped(file, MAX_RULE_FILE_BYTES) {
            Ok(text) => texts.push((name, text)),
            Err(e) => problems.push(format!("{name}: {e}")),
        }
    }
    if !problems.is_empty() {
        return Err(Problems(problems));
    }
    RuleSet::parse(&texts, merge)
}

/// Applies changes to the rule files until the task is dropped: a set that loads replaces the
/// one in service; one that does not is logged, problem by problem, and changes nothing.
pub async fn watch(rls: Arc<Rls>, path: PathBuf, mut seen: Fingerprint) {
    let mut tick = tokio::time::interval(WATCH_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let p = path.clone();
        let Ok(now) = tokio::task::spawn_blocking(move || list(&p)).await else {
            continue;
        };
        let now = now.unwrap_or_default();
        if now == seen {
            continue;
        }
        seen = now;
        let p = path.clone();
        let merge = rls.merges_domains();
        match tokio::task::spawn_blocking(move || load(&p, merge)).await {
            Ok(Ok(rules)) => {
                tracing::info!(domains = rules.domain_count(), path = %path.display(), "rate-limit rules reloaded");
                rls.apply(rules);
                rls.metrics.loaded(true);
            }
            Ok(Err(problems)) => {
                for p in &problems.0 {
                    tracing::warn!(problem = %p, "rate-limit rules not reloaded; the rules in service stay");
                }
                rls.metrics.loaded(false);
            }
            Err(_) => {}
        }
    }
}
