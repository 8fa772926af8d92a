//! connection: the hot path's connections (one multiplexed connection a worker, refilled
//! from the pool when it breaks), loading the scripts, and every command bounded by the timeout.

use super::*;

impl Lua {
    pub(super) fn new(source: &'static str) -> Lua {
        Lua {
            script: Script::new(source),
        }
    }

    /// `SCRIPT LOAD` (on a cluster, redis-rs sends it to every master).
    pub(super) async fn load_async<C: redis::aio::ConnectionLike>(
        &self,
        conn: &mut C,
    ) -> redis::RedisResult<String> {
        self.script.load_async(conn).await
    }

    /// `EVALSHA <hash> <number of keys>`, with room for `args` more arguments of `bytes` bytes in
    /// all (so the command is not regrown as the caller adds the keys and arguments).
    pub(super) fn call(&self, keys: usize, args: usize, bytes: usize) -> redis::Cmd {
        let hash = self.script.get_hash();
        let mut cmd = redis::Cmd::with_capacity(3 + args, 16 + hash.len() + bytes);
        cmd.arg("EVALSHA").arg(hash).arg(keys);
        cmd
    }

    /// Runs `cmd` (from [`Lua::call`]); a server that lost the script (a restart, `SCRIPT FLUSH`,
    /// a failover to a replica that never saw it) is given it and asked once more.
    pub(super) async fn run<C: redis::aio::ConnectionLike>(
        &self,
        conn: &mut C,
        cmd: &redis::Cmd,
    ) -> redis::RedisResult<String> {
        match cmd.query_async(conn).await {
            Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
                self.load_async(conn).await?;
                cmd.query_async(conn).await
            }
            r => r,
        }
    }
}

/// A failure of the connection rather than of the command: the connection is dropped and the
/// call may be tried on a fresh one.
fn is_broken(e: &redis::RedisError) -> bool {
    e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_unrecoverable_error()
}

impl RedisStore {
    pub(super) fn slot(&self) -> &Slot {
        &self.slots[(self.thread_slot)() % self.slots.len()]
    }

    pub(super) async fn connection(&self) -> Result<Arc<Conn>, StoreError> {
        let slot = self.slot();
        if let Some(c) = slot.conn.load_full() {
            return Ok(c);
        }
        // Boxed: connecting is a large future, and every store call's future (and so every
        // request's) would otherwise carry it, and copy it, although it is rarely needed.
        Box::pin(self.refill(slot)).await
    }

    pub(super) async fn refill(&self, slot: &Slot) -> Result<Arc<Conn>, StoreError> {
        let _refilling = slot.refill.lock().await;
        if let Some(c) = slot.conn.load_full() {
            return Ok(c);
        }
        let mut c = self
            .connector
            .connect(self.timeout)
            .await
            .map_err(|e| StoreError::connect(self.target.shown(), &e))?;
        // Load the scripts before anyone uses the connection: a NOSCRIPT retry would let later
        // commands overtake earlier ones. (A later SCRIPT FLUSH is still healed by `Lua::run`.)
        // On a cluster, SCRIPT LOAD goes to every master.
        for script in [&*WINDOW, &*DIVVY] {
            script.load_async(&mut c).await.map_err(StoreError::redis)?;
        }
        let c = Arc::new(c);
        slot.conn.store(Some(c.clone()));
        Ok(c)
    }

    /// Runs `call` on this worker's connection; if that connection turns out to be broken (Redis
    /// closed it when idle, a proxy in between restarted, `CLIENT KILL`), once more on a fresh
    /// one, so that one stale connection never makes a healthy Redis look down. Both tries fall
    /// within the caller's `store.timeout_ms`. A broken connection can lose the reply of a call
    /// Redis did execute; the retry then counts that request twice, which can only refuse early,
    /// never admit too much.
    pub(super) async fn on_connection<T, F, Fut>(&self, call: F) -> Result<T, StoreError>
    where
        F: Fn(Conn) -> Fut,
        Fut: Future<Output = redis::RedisResult<T>>,
    {
        let conn = self.connection().await?;
        match call((*conn).clone()).await {
            Ok(v) => return Ok(v),
            Err(e) if !is_broken(&e) => return Err(StoreError::redis(e)),
            Err(_) => self.forget(&conn),
        }
        let conn = self.connection().await?;
        call((*conn).clone()).await.map_err(|e| {
            if is_broken(&e) {
                self.forget(&conn);
            }
            StoreError::redis(e)
        })
    }

    /// Clears this worker's slot if it still holds `conn` (not a fresh one another call put there).
    pub(super) fn forget(&self, conn: &Arc<Conn>) {
        self.slot().conn.compare_and_swap(conn, None::<Arc<Conn>>);
    }

    /// Forgets the current connection, so the next call opens a fresh one.
    pub fn reset_connection(&self) {
        for slot in &self.slots {
            slot.conn.store(None);
        }
    }

    /// One PING, bounded by the timeout: is Redis answering?
    pub async fn ping(&self) -> Result<(), StoreError> {
        self.command::<String>(redis::cmd("PING")).await.map(drop)
    }

    pub(super) async fn command<T: redis::FromRedisValue>(
        &self,
        cmd: redis::Cmd,
    ) -> Result<T, StoreError> {
        self.bounded(self.on_connection(|mut conn| {
            let cmd = cmd.clone();
            async move { cmd.query_async::<T>(&mut conn).await }
        }))
        .await
    }

    /// Runs a store call within the store timeout. (A combinator, not an `async fn`: that would
    /// hold `call` twice, doubling the size of every request's future.)
    pub(super) fn bounded<T>(
        &self,
        call: impl Future<Output = Result<T, StoreError>>,
    ) -> impl Future<Output = Result<T, StoreError>> {
        use futures_util::FutureExt;
        tokio::time::timeout(self.timeout, call)
            .map(|r| r.unwrap_or_else(|_| Err(StoreError::timeout())))
    }
}
