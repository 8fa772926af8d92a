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
//! Each worker also accepts its own connections ([`accept`]) on a listening socket of its own
//! (`SO_REUSEPORT`: the kernel spreads new connections over the workers' sockets by their
//! addresses and ports), as nginx's workers do with `reuseport`: a connection is never handed from
//! an accepting thread to a worker (that hand-off cost a quarter of the CPU of a new connection:
//! two more epoll registrations, a wake-up of the worker, and the accepting threads' own work).

use std::cell::Cell;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::Poll;
use std::time::Duration;

use futures_util::task::AtomicWaker;

use tokio::io::unix::AsyncFd;
use tokio::net::TcpListener;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};

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

/// The accept queue of each listening socket (the kernel caps it at `net.core.somaxconn`), as
/// tokio's `TcpListener::bind` has it.
pub const BACKLOG: u32 = 1024;

type Job = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Threads that each run a current-thread tokio runtime. Dropping it lets the threads finish the
/// jobs they were given and exit.
pub struct Workers {
    queues: Vec<mpsc::UnboundedSender<Job>>,
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
                        crate::server::deadline::reuse_on_this_thread();
                        let mut jobs = tokio::task::JoinSet::new();
                        let mut collect = tokio::time::interval(crate::alloc::COLLECT_EVERY);
                        collect.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
                        loop {
                            tokio::select! {
                                job = rx.recv() => match job {
                                    Some(job) => { jobs.spawn(job); }
                                    None => break,
                                },
                                Some(_) = jobs.join_next(), if !jobs.is_empty() => {}
                                _ = collect.tick() => crate::alloc::collect(),
                            }
                        }
                        while jobs.join_next().await.is_some() {}
                        crate::server::deadline::stop_reusing_on_this_thread();
                    });
                })?;
            queues.push(tx);
        }
        Ok(Workers { queues })
    }

    pub fn len(&self) -> usize {
        self.queues.len()
    }

    pub fn is_empty(&self) -> bool {
        self.queues.is_empty()
    }

    /// Runs a job on worker `i`. The future is built there, by `make`, so that anything it
    /// registers with a runtime (a socket, a timer) belongs to that worker, and so do the tasks
    /// it spawns.
    pub fn run_on<F, Fut>(&self, i: usize, make: F)
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let job = Box::pin(async move { make().await });
        // A worker only stops when `Workers` is dropped, so sending cannot fail while `self` lives.
        let _ = self.queues[i % self.len()].send(job);
    }
}

/// Accepts connections on `listener` until `shutdown` completes, and serves each with
/// `serve(socket, peer, permit)` on the thread that accepted it: on each of `workers`, or on the
/// caller's runtime when there are none. The socket is non-blocking and not yet registered with
/// the runtime (`tokio::net::TcpStream::from_std` does that; [`crate::server`] waits until it
/// must). At most `max_connections` are open at once (a connection
/// holds its permit until it drops it); more wait in the kernel's accept queue. Returns once no
/// thread accepts any more and the listening sockets are closed.
///
/// Each worker listens with a socket of its own bound to the same address when `listener` has
/// `SO_REUSEPORT` ([`crate::start::bind`] binds so); otherwise the workers share `listener`, and
/// whichever is woken first takes a connection (on Linux, often the same one while it keeps up).
pub async fn accept<S, Fut>(
    listener: TcpListener,
    workers: Option<&Workers>,
    max_connections: usize,
    shutdown: impl Future<Output = ()>,
    serve: S,
) where
    S: Fn(std::net::TcpStream, SocketAddr, OwnedSemaphorePermit) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let permits = Arc::new(Semaphore::new(max_connections.max(1)));
    // One stop a loop.
    let mut stops = Vec::new();
    // Every loop holds a sender; `recv` answers `None` once all of them have ended.
    let (running, mut ended) = mpsc::channel::<()>(1);
    match workers {
        None => {
            let stop = Arc::new(Stop::default());
            stops.push(stop.clone());
            let (permits, running, serve) = (permits.clone(), running.clone(), serve.clone());
            match listener.into_std() {
                Ok(listener) => {
                    tokio::spawn(accept_loop(listener, permits, stop, running, serve));
                }
                Err(e) => tracing::error!(error = %e, "cannot accept"),
            }
        }
        Some(workers) => match per_worker(listener, workers.len()) {
            Ok(sockets) => {
                for (i, socket) in sockets.into_iter().enumerate() {
                    let stop = Arc::new(Stop::default());
                    stops.push(stop.clone());
                    let (permits, running, serve) =
                        (permits.clone(), running.clone(), serve.clone());
                    workers.run_on(i, move || {
                        accept_loop(socket, permits, stop, running, serve)
                    });
                }
            }
            Err(e) => tracing::error!(error = %e, "cannot accept on the workers"),
        },
    }
    drop((running, serve));
    shutdown.await;
    for stop in &stops {
        stop.now();
    }
    let _ = ended.recv().await;
}

/// An accept loop's stop: a flag it looks at before each accept (one load), and the loop's waker
/// while it waits for a connection. (A `CancellationToken` locked a mutex for each look, and
/// again for each wait: ~230 instructions a connection, callgrind.)
#[derive(Default)]
struct Stop {
    stopped: AtomicBool,
    waiting: AtomicWaker,
}

impl Stop {
    fn now(&self) {
        self.stopped.store(true, Ordering::Release);
        self.waiting.wake();
    }

    fn is_now(&self) -> bool {
        self.stopped.load(Ordering::Acquire)
    }

    /// Completes once [`Stop::now`] is called; polled again, it only registers the waker anew.
    async fn wait(&self) {
        std::future::poll_fn(|cx| {
            if self.is_now() {
                return Poll::Ready(());
            }
            self.waiting.register(cx.waker());
            // Stopped between the look and the registration: its wake-up found no waker.
            match self.is_now() {
                true => Poll::Ready(()),
                false => Poll::Pending,
            }
        })
        .await
    }
}

/// `count` listening sockets for `listener`'s address, `listener` first: new ones bound with
/// `SO_REUSEPORT` beside it, or copies of it where that is refused (it was bound without).
fn per_worker(listener: TcpListener, count: usize) -> std::io::Result<Vec<std::net::TcpListener>> {
    let addr = listener.local_addr()?;
    let first = listener.into_std()?;
    let mut all = Vec::with_capacity(count);
    for _ in 1..count {
        // Refused (the listener was bound without `SO_REUSEPORT`, or the kernel lacks it): share.
        all.push(match listen(addr).and_then(TcpListener::into_std) {
            Ok(s) => s,
            Err(_) => first.try_clone()?,
        });
    }
    all.insert(0, first);
    Ok(all)
}

/// A TCP socket for `addr` with `SO_REUSEADDR`, as `TcpListener::bind` makes one: a restart may
/// bind while old connections are in TIME_WAIT.
pub fn socket(addr: SocketAddr) -> std::io::Result<tokio::net::TcpSocket> {
    let s = match addr {
        SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4(),
        SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6(),
    }?;
    s.set_reuseaddr(true)?;
    Ok(s)
}

/// A listener on `addr` that the workers' own sockets can join ([`accept`]): `SO_REUSEPORT`, and
/// `TCP_NODELAY` for every connection it accepts (inherited on Linux: no system call for it per
/// connection). Both are only for speed: where the kernel refuses one, the listener is made
/// without it (the workers then share it; each connection gets `TCP_NODELAY` on its own). Fails
/// if `addr` is taken by a socket without `SO_REUSEPORT`.
pub fn listen(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let s = socket(addr)?;
    let _ = s.set_reuseport(true);
    let _ = s.set_nodelay(true);
    s.bind(addr)?;
    s.listen(BACKLOG)
}

/// How long the kernel holds a new connection back until its client has sent something, in
/// seconds (`TCP_DEFER_ACCEPT`; Linux rounds it up to its SYN-ACK retransmissions: ~1 s).
const DEFER_ACCEPT_SECONDS: libc::c_int = 1;

/// Has the kernel hand over a new connection only once its first bytes have come (or after
/// [`DEFER_ACCEPT_SECONDS`], without them), as nginx's `deferred` and HAProxy's `defer-accept`:
/// every protocol served here has the client speak first, and then the first read of a new
/// connection finds its request, without waiting (nor registering the socket, `server::socket`).
/// Only for speed: where the kernel refuses it, connections are accepted as they come.
fn defer_accept(listener: &std::net::TcpListener) {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        // SAFETY: the option's value is the `c_int` it points to, of the length given; the
        // descriptor is the listener's, open while it is borrowed.
        let _ = unsafe {
            libc::setsockopt(
                listener.as_raw_fd(),
                libc::IPPROTO_TCP,
                libc::TCP_DEFER_ACCEPT,
                (&DEFER_ACCEPT_SECONDS as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
    }
    #[cfg(not(target_os = "linux"))]
    let _ = listener;
}

/// One connection from `listener`, as `accept4(SOCK_NONBLOCK | SOCK_CLOEXEC)` gives it (mio's
/// accept, which tokio's `TcpListener::accept` calls before it registers the socket).
async fn accept_one(
    listener: &AsyncFd<mio::net::TcpListener>,
) -> std::io::Result<(std::net::TcpStream, SocketAddr)> {
    loop {
        let mut ready = listener.readable().await?;
        // Would block: the readiness is cleared, and the loop waits for the next.
        if let Ok(accepted) = ready.try_io(|l| l.get_ref().accept()) {
            return accepted.map(|(tcp, peer)| (tcp.into(), peer));
        }
    }
}

async fn accept_loop<S, Fut>(
    listener: std::net::TcpListener,
    permits: Arc<Semaphore>,
    stopped: Arc<Stop>,
    running: mpsc::Sender<()>,
    serve: S,
) where
    S: Fn(std::net::TcpStream, SocketAddr, OwnedSemaphorePermit) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    defer_accept(&listener);
    // Registered with this thread's runtime (the worker's): its connections are accepted here.
    let registered = listener.set_nonblocking(true).and_then(|()| {
        let listener = mio::net::TcpListener::from_std(listener);
        // SAFETY: the mio listener owns its descriptor, gives that one for as long as it lives,
        // and lives as long as the `AsyncFd`, which closes it when dropped.
        unsafe { AsyncFd::register_with_interest(listener, tokio::io::Interest::READABLE) }
            .map_err(std::io::Error::from)
    });
    let listener = match registered {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(error = %e, "cannot accept on this thread");
            return;
        }
    };
    let mut inherits = None;
    // One wait for the stop, made once, and a permit is mostly there to be taken at once.
    let stop = stopped.wait();
    tokio::pin!(stop);
    loop {
        if stopped.is_now() {
            break;
        }
        let permit = match permits.clone().try_acquire_owned() {
            Ok(p) => p,
            Err(tokio::sync::TryAcquireError::Closed) => break,
            Err(tokio::sync::TryAcquireError::NoPermits) => tokio::select! {
                p = permits.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => break },
                () = &mut stop => break,
            },
        };
        // The stop is looked at (one load) before each accept, and waited for only while no
        // connection comes: a stop still ends a loop that always has one ready.
        let (tcp, peer) = tokio::select! {
            biased;
            res = accept_one(&listener) => match res {
                Ok(c) => c,
                Err(e) => {
                    // Typically EMFILE: back off briefly instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut stop => break,
        };
        // Small answers go out at once (no Nagle). An accepted socket inherits the option from a
        // listener that has it (Linux; `start::bind` and `per_worker` set it): then no system
        // call a connection. The first connection tells.
        let inherits = *inherits.get_or_insert_with(|| matches!(tcp.nodelay(), Ok(true)));
        if !inherits {
            let _ = tcp.set_nodelay(true);
        }
        tokio::spawn(serve(tcp, peer, permit));
    }
    // In this order: `accept` returns only when the socket is closed and `serve` (which may hold
    // what the caller waits to have back) is gone.
    drop(listener);
    drop(serve);
    drop(running);
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    /// Each connection answers the name of the thread that serves it, if its socket has
    /// `TCP_NODELAY` (inherited or set).
    async fn name_thread(tcp: std::net::TcpStream, _: SocketAddr, _permit: OwnedSemaphorePermit) {
        let mut tcp = TcpStream::from_std(tcp).unwrap();
        let name = match tcp.nodelay() {
            Ok(true) => std::thread::current().name().unwrap_or("").to_owned(),
            _ => "without TCP_NODELAY".to_owned(),
        };
        let _ = tcp.write_all(name.as_bytes()).await;
    }

    async fn served_by(addr: SocketAddr) -> String {
        let mut tcp = TcpStream::connect(addr).await.unwrap();
        let mut name = String::new();
        tcp.read_to_string(&mut name).await.unwrap();
        name
    }

    /// Serves connections from `listener` on two workers until the returned sender is used.
    fn serve_on_two(
        listener: TcpListener,
    ) -> (
        Arc<Workers>,
        tokio::sync::oneshot::Sender<()>,
        tokio::task::JoinHandle<()>,
    ) {
        let workers = Arc::new(Workers::start(2, "test-accept").unwrap());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn({
            let workers = workers.clone();
            async move {
                let shutdown = async move {
                    let _ = stopped.await;
                };
                accept(listener, Some(&workers), 10, shutdown, name_thread).await;
            }
        });
        (workers, stop, server)
    }

    #[tokio::test]
    async fn each_worker_accepts_on_a_socket_of_its_own() {
        let (listener, addr) = crate::start::bind("127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();
        let (_workers, stop, server) = serve_on_two(listener);
        // The kernel picks a socket by the connection's addresses: both are picked among 40
        // connections but with a chance of 2^-39.
        let mut seen = std::collections::BTreeMap::<String, usize>::new();
        for _ in 0..40 {
            *seen.entry(served_by(addr).await).or_default() += 1;
        }
        assert_eq!(
            seen.keys().collect::<Vec<_>>(),
            ["test-accept-0", "test-accept-1"],
            "{seen:?}"
        );
        stop.send(()).unwrap();
        server.await.unwrap();
        // Every worker's socket is closed once `accept` returns.
        assert!(TcpStream::connect(addr).await.is_err());
    }

    #[tokio::test]
    async fn a_listener_without_reuseport_is_shared_and_a_busy_worker_holds_none_up() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (workers, stop, server) = serve_on_two(listener);
        // Worker 0 is stuck (a blocking call on its thread): worker 1 takes every connection.
        let (release, held) = std::sync::mpsc::channel::<()>();
        let (blocked_tx, blocked) = tokio::sync::oneshot::channel();
        workers.run_on(0, move || async move {
            let _ = blocked_tx.send(());
            let _ = held.recv();
        });
        blocked.await.unwrap();
        for _ in 0..4 {
            assert_eq!(served_by(addr).await, "test-accept-1");
        }
        release.send(()).unwrap();
        stop.send(()).unwrap();
        server.await.unwrap();
        assert!(TcpStream::connect(addr).await.is_err());
    }
}
