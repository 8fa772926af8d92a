//! error: a failed store call, opaque, asked with `is_*` predicates.

use std::fmt;

/// A failed store call. Opaque; ask it with the `is_*` predicates.
#[derive(Debug)]
pub struct StoreError {
    cause: Cause,
}

#[derive(Debug)]
enum Cause {
    Timeout,
    Config(String),
    Pool(String),
    Redis(deadpool_redis::redis::RedisError),
    Reply(String),
}

impl StoreError {
    pub(crate) fn timeout() -> Self {
        StoreError {
            cause: Cause::Timeout,
        }
    }
    pub(crate) fn config(e: impl fmt::Display) -> Self {
        StoreError {
            cause: Cause::Config(e.to_string()),
        }
    }
    pub(crate) fn pool(e: impl fmt::Display) -> Self {
        StoreError {
            cause: Cause::Pool(e.to_string()),
        }
    }
    pub(crate) fn redis(e: deadpool_redis::redis::RedisError) -> Self {
        StoreError {
            cause: Cause::Redis(e),
        }
    }
    pub(crate) fn reply(msg: String) -> Self {
        StoreError {
            cause: Cause::Reply(msg),
        }
    }

    /// The call did not finish within the store timeout.
    pub fn is_timeout(&self) -> bool {
        matches!(self.cause, Cause::Timeout)
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.cause {
            Cause::Timeout => f.write_str("store call timed out"),
            Cause::Config(e) => write!(f, "invalid store configuration: {e}"),
            Cause::Pool(e) => write!(f, "no Redis connection: {e}"),
            Cause::Redis(e) => write!(f, "Redis error: {e}"),
            Cause::Reply(e) => write!(f, "bad reply from Redis: {e}"),
        }
    }
}

impl std::error::Error for StoreError {}
