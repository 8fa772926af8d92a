//! runtime: what the doors (the HTTP proxy, the Divvy port, the admin listener) share at run
//! time, built once by [`crate::app`] and handed to each explicitly. Settings stay plain values;
//! nothing here is read from the configuration.

use std::sync::Arc;

use quotagate_engine::clock::Clock;
use quotagate_store::{Announcer, Store};

use crate::observe::metrics::Metrics;
use crate::server::workers::Workers;

/// The shared objects of a running quotagate.
#[derive(Clone)]
pub struct Runtime {
    /// The counters, with the failure policy.
    pub store: Arc<Store>,
    pub metrics: Arc<Metrics>,
    /// The threads connections are served on.
    pub workers: Arc<Workers>,
    /// Where the limiter's `now` comes from.
    pub clock: Arc<dyn Clock>,
    /// Catalog announcements between instances, with the Redis store.
    pub announcer: Option<Arc<Announcer>>,
}
