//! error: a failed store call, opaque, asked with `is_*` predicates.

use std::fmt;

/// A failed store call. Opaque; ask it with the `is_*` predicates, and for the Redis error behind
/// it with [`std::error::Error::source`].
#[derive(Debug)]
pub struct StoreError {
    cause: Cause,
}

#[derive(Debug)]
enum Cause {
    Timeout,
    /// The options do not make a Redis client.
    Config(redis::RedisError),
    /// No connection could be opened to Redis at `shown`.
    Connect {
        shown: String,
        source: redis::RedisError,
    },
    /// Redis could not be reached or is not usable; why, in our words (the cause was printed in).
    Unreachable(String),
    Redis(redis::RedisError),
    Reply(String),
    /// The embedded store's directory cannot be written.
    Disk,
    /// A question no store answers (what, in our words): not an outage.
    Unsupported(&'static str),
}

impl StoreError {
    pub(crate) fn timeout() -> Self {
        StoreError {
            cause: Cause::Timeout,
        }
    }
    pub(crate) fn config(e: redis::RedisError) -> Self {
        StoreError {
            cause: Cause::Config(e),
        }
    }
    /// Redis could not be reached; `why` in our words.
    pub(crate) fn unreachable(why: String) -> Self {
        StoreError {
            cause: Cause::Unreachable(why),
        }
    }

    /// No connection could be opened to Redis at `shown` (URLs without their passwords).
    pub(crate) fn connect(shown: &str, e: &redis::RedisError) -> Self {
        StoreError {
            cause: Cause::Connect {
                shown: shown.to_owned(),
                source: e.clone(),
            },
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

    /// The embedded store's directory (`store.path`) cannot be written: answers would not be
    /// durable.
    pub(crate) fn disk() -> Self {
        StoreError { cause: Cause::Disk }
    }

    /// A request's limits mix a fixed window with other windows: no store decides these yet.
    pub(crate) fn mixed_kinds() -> Self {
        StoreError {
            cause: Cause::Unsupported("a request's limits mix a fixed window with other windows"),
        }
    }

    /// Parts of one request that are not all sliding windows and calendar periods of one hash
    /// tag (the catalog never makes such a request).
    pub(crate) fn parts_apart() -> Self {
        StoreError {
            cause: Cause::Unsupported(
                "a request's counters must share one API key and count in sliding windows or calendar periods",
            ),
        }
    }

    /// Peeking at fixed windows (only the admin peeks, at the catalog's sliding windows).
    pub(crate) fn peek_fixed() -> Self {
        StoreError {
            cause: Cause::Unsupported("peeking at fixed windows"),
        }
    }

    /// The question is one no store answers (no backend is at fault: the failure policy does not
    /// apply).
    pub fn is_unsupported(&self) -> bool {
        matches!(self.cause, Cause::Unsupported(_))
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
            Cause::Connect { shown, source } => {
                write!(f, "cannot connect to Redis at {shown}: {source}")
            }
            Cause::Unreachable(why) => f.write_str(why),
            Cause::Redis(e) => write!(f, "Redis error: {e}"),
            Cause::Reply(e) => write!(f, "bad reply from Redis: {e}"),
            Cause::Disk => f.write_str("store.path cannot be written"),
            Cause::Unsupported(what) => write!(f, "not supported: {what}"),
        }
    }
}

impl std::error::Error for StoreError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.cause {
            Cause::Config(e) | Cause::Connect { source: e, .. } | Cause::Redis(e) => Some(e),
            Cause::Timeout
            | Cause::Unreachable(_)
            | Cause::Reply(_)
            | Cause::Disk
            | Cause::Unsupported(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::error::Error;

    use super::*;

    #[test]
    fn the_redis_error_behind_a_failure_is_its_source() {
        let io = || redis::RedisError::from((redis::ErrorKind::Io, "connection refused"));
        let connect = StoreError::connect("redis://127.0.0.1:1", &io());
        assert!(
            connect
                .to_string()
                .starts_with("cannot connect to Redis at redis://127.0.0.1:1: connection refused"),
            "{connect}"
        );
        let source = connect.source().expect("a source");
        assert!(source.to_string().contains("connection refused"));
        assert!(StoreError::redis(io()).source().is_some());
        assert!(StoreError::timeout().source().is_none());
        assert!(StoreError::timeout().is_timeout());
    }
}
