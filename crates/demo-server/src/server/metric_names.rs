//! Names of the connection metrics, recorded through the `metrics` facade.

/// Counter of connections the server closed on its own, labelled `reason`:
/// `header_timeout` (no complete request headers in time) or `evicted` (closed to make
/// room under the connection cap).
pub const CONNECTIONS_CLOSED: &str = "demo_server_connections_closed_total";

/// Gauge: open connections, set by the `demo-server` binary once a second.
pub const CONNECTIONS_OPEN: &str = "demo_server_connections_open";
