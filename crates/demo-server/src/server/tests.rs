use std::time::Duration;

use super::*;

#[test]
fn defaults_are_stated() {
    let c = ServerConfig::default();
    assert_eq!(c.abandoned(), Abandoned::Serve);
    assert_eq!(c.max_connections().get(), 10_000);
    assert_eq!(c.header_read_timeout(), Duration::from_secs(10));
    assert_eq!(ServerConfig::builder().build().unwrap(), c);
}

#[test]
fn a_zero_header_timeout_is_refused_by_name() {
    let err = ServerConfig::builder()
        .header_read_timeout(Duration::ZERO)
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "header_read_timeout");
    assert!(err.to_string().contains("greater than zero"), "{err}");
}

#[test]
fn the_connection_cap_leaves_room_for_other_descriptors() {
    assert_eq!(connections_within(20_000), 18_000);
    assert_eq!(connections_within(1024), 922);
    assert_eq!(connections_within(10), 1);
}
