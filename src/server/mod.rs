//! server: the serving plumbing: the HTTP server shared by the proxy, the rate-limit service and
//! the example upstream, and what it runs on.
//!
//! Takes an already-bound listener and a shutdown future (tests bind port 0). Speaks HTTP/1.1 and
//! HTTP/2 on the same port (told by a connection's first bytes, [`sniff`]). On shutdown it stops
//! accepting at once, lets in-flight requests finish (idle keep-alive connections are closed), and
//! gives up after the drain timeout.
//!
//! Its rooms: [`serve`] (accepting, a connection's protocol, the drain), [`settings`] (a
//! listener's limits and where its connections run), [`workers`] (the worker threads) and
//! [`deadline`] (the timers a worker reuses), [`tls`] (certificates), [`h1`] (the own HTTP/1.1
//! server) and [`http1`] (reading heads, for it and the upstream exchange), [`idle`] (a
//! connection's time between requests), [`linger`] (lingering close), [`written`] (an answer's
//! fields as they go on the wire), [`passed`] (a request's fields handed on unread), [`body`] (a
//! request's body), [`problem`] (the answers quotagate gives itself), and helpers of the request
//! path's speed: [`shelf`], [`cold`], [`coarse`].

mod body;
pub mod coarse;
pub mod cold;
pub mod deadline;
pub mod framing;
pub mod h1;
pub mod http1;
pub mod idle;
mod linger;
pub mod passed;
pub mod problem;
mod serve;
mod settings;
pub mod shelf;
mod sniff;
mod socket;
pub mod tls;
pub mod workers;
mod written;

pub use body::RequestBody;
pub use serve::serve;
pub use settings::{Executor, HttpSettings, listener_tls};
pub use written::{Answer, Written};
