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
    Connect(String),
    Redis(redis::RedisError),
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
    /// Redis could not be reached; `why` in our words.
    pub(crate) fn unreachable(why: String) -> Self {
        StoreError {
            cause: Cause::Connect(why),
        }
    }

    /// No connection could be opened to Redis at `shown` (URLs without their passwords).
    pub(crate) fn connect(shown: &str, e: &redis::RedisError) -> Self {
        StoreError {
            cause: Cause::Connect(format!("cannot connect to Redis at {shown}: {e}")),
        }
    }
    pub(crate) fn redis(e: redis::RedisError) -> Self {
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
            Cause::Connect(e) => f.write_str(e),
            Cause::Redis(e) => write!(f, "Redis error: {e}"),
            Cause::Reply(e) => write!(f, "bad reply from Redis: {e}"),
        }
    }
}

impl std::error::Error for StoreError {}
