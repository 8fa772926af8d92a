//! workers: one single-threaded runtime per core for the proxy's connections.
//!
//! Why: on a multi-threaded runtime every request crosses threads several times (the connection
//! task, the upstream connection task and the Redis connection task wake each other wherever they
//! happen to run, and idle workers are woken to steal work). Measured on 2 cores, that was a large
//! share of the CPU per request. Here a connection lives on one thread for its whole life, and the
//! upstream pool and the Redis connection it uses are that thread's own ([`current`] picks them),
//! so a request never leaves its thread: the nginx and Pingora shape (one event loop per core,
//! nothing shared on the hot path but the counters themselves).
//!
//! The accept loop stays on the caller's runtime and hands each connection to the worker with the
//! fewest open connections, so long-lived keep-alive connections spread evenly.

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::net::TcpStream;
use tokio::sync::mpsc;

thread_local! {
    static INDEX: Cell<usize> = const { Cell::new(0) };
}

/// The index of the worker this thread is (0 outside the workers, e.g. in tests), for picking
/// per-worker resources: `resources[current() % resources.len()]`.
pub fn current() -> usize {
    INDEX.with(Cell::get)
}

/// The number of workers `0` stands for: one per core the process may use.
pub fn default_count() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

type Job = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Threads that each run a current-thread tokio runtime. Dropping it lets the threads finish the
/// tasks they run and exit.
pub struct Workers {
    queues: Vec<mpsc::UnboundedSender<Job>>,
    /// Tasks handed to each worker and not yet finished.
    load: Vec<Arc<AtomicUsize>>,
}

impl std::fmt::Debug for Workers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Workers")
            .field("count", &self.len())
            .finish()
    }
}

impl Workers {
    /// Starts `count` workers (at least one) named `<name>-<i>`.
    pub fn start(count: usize, name: &str) -> std::io::Result<Workers> {
        let count = count.max(1);
        let mut queues = Vec::with_capacity(count);
        let mut load = Vec::with_capacity(count);
        for i in 0..count {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            let (tx, mut rx) = mpsc::unbounded_channel::<Job>();
            std::thread::Builder::new()
                .name(format!("{name}-{i}"))
                .spawn(move || {
                    INDEX.with(|c| c.set(i));
                    runtime.block_on(async move {
                        let mut tasks = tokio::task::JoinSet::new();
                        let mut collect = tokio::time::interval(crate::alloc::COLLECT_EVERY);
                        collect.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
                        loop {
                            tokio::select! {
                                job = rx.recv() => match job {
                                    Some(job) => { tasks.spawn(job); }
                                    None => break,
                                },
                                Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
                                _ = collect.tick() => crate::alloc::collect(),
                            }
                        }
                        while tasks.join_next().await.is_some() {}
                    });
                })?;
            queues.push(tx);
            load.push(Arc::new(AtomicUsize::new(0)));
        }
        Ok(Workers { queues, load })
    }

    pub fn len(&self) -> usize {
        self.queues.len()
    }

    pub fn is_empty(&self) -> bool {
        self.queues.is_empty()
    }

    /// Runs `task` on the least loaded worker. The future is built there, by `make`, so that
    /// anything it registers with a runtime (a socket, a timer) belongs to that worker.
    pub fn run<F, Fut>(&self, make: F)
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let (i, load) = self
            .load
            .iter()
            .enumerate()
            .min_by_key(|(_, l)| l.load(Ordering::Relaxed))
            .expect("at least one worker");
        let load = load.clone();
        load.fetch_add(1, Ordering::Relaxed);
        let job = Box::pin(async move {
            let _done = Finished(load);
            make().await;
        });
        // A worker only stops when `Workers` is dropped, so sending cannot fail while `self` lives.
        let _ = self.queues[i].send(job);
    }
}

/// Serves one accepted connection with `serve`: on the least loaded of `workers`, whose reactor the
/// socket moves to, or on the caller's runtime when there are none.
pub fn spawn_connection<F, Fut>(workers: Option<&Workers>, tcp: TcpStream, serve: F)
where
    F: FnOnce(TcpStream) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let Some(workers) = workers else {
        tokio::spawn(serve(tcp));
        return;
    };
    match tcp.into_std() {
        Ok(std) => workers.run(move || async move {
            if let Ok(tcp) = TcpStream::from_std(std) {
                serve(tcp).await;
            }
        }),
        Err(e) => tracing::warn!(error = %e, "cannot hand a connection to a worker"),
    }
}

/// Counts a task as finished even if it panics.
struct Finished(Arc<AtomicUsize>);

impl Drop for Finished {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn tasks_run_on_their_workers_and_spread() {
        let workers = Workers::start(2, "test-worker").unwrap();
        let (tx, mut rx) = mpsc::unbounded_channel();
        let (hold_tx, hold_rx) = tokio::sync::watch::channel(false);
        for _ in 0..4 {
            let (tx, mut hold) = (tx.clone(), hold_rx.clone());
            workers.run(move || async move {
                tx.send((current(), std::thread::current().name().map(str::to_owned)))
                    .unwrap();
                let _ = hold.wait_for(|go| *go).await;
            });
        }
        let mut seen = Vec::new();
        for _ in 0..4 {
            seen.push(rx.recv().await.unwrap());
        }
        seen.sort();
        // Least loaded first: two long tasks each.
        assert_eq!(
            seen,
            vec![
                (0, Some("test-worker-0".into())),
                (0, Some("test-worker-0".into())),
                (1, Some("test-worker-1".into())),
                (1, Some("test-worker-1".into())),
            ]
        );
        hold_tx.send(true).unwrap();
    }
}
