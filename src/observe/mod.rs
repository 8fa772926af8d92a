//! observe: what the gateway tells about itself: metrics ([`metrics`]), log output
//! ([`telemetry`]), OpenTelemetry traces ([`otel`]), the dashboard's last 15 minutes
//! ([`history`]) and the API keys refused most ([`top`]).

pub mod history;
pub mod metrics;
pub mod otel;
pub mod telemetry;
pub mod top;
