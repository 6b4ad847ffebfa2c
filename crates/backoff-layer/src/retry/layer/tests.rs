//! The builder's rules and defaults.

use super::*;

#[test]
fn invalid_configurations_are_refused_by_name_value_and_rule() {
    use overload_core::ConfigErrorKind::OutOfRange;
    let refused = |b: RetryBuilder| {
        let e = b.build().unwrap_err();
        (e.field(), e.kind(), e.to_string())
    };
    assert_eq!(
        refused(RetryLayer::builder().max_attempts(0)),
        (
            "max_attempts",
            OutOfRange,
            "max_attempts must be at least 1, got 0".to_owned()
        )
    );
    assert_eq!(
        refused(RetryLayer::builder().deadline(Duration::ZERO)),
        (
            "deadline",
            OutOfRange,
            "deadline must be greater than zero, got 0ns".to_owned()
        )
    );
    assert_eq!(
        refused(RetryLayer::builder().attempt_timeout(Duration::ZERO)),
        (
            "attempt_timeout",
            OutOfRange,
            "attempt_timeout must be greater than zero, got 0ns".to_owned()
        )
    );
    assert_eq!(
        refused(RetryLayer::builder().grpc_retryable_codes(&[14, 0])),
        (
            "grpc_retryable_codes",
            OutOfRange,
            "grpc_retryable_codes must be a gRPC status code other than OK, within 1..=16, \
             got 0"
                .to_owned()
        )
    );
    let (field, kind, message) = refused(
        RetryLayer::builder()
            .classifier(DefaultClassifier::new())
            .grpc_retryable_codes(&[14]),
    );
    assert_eq!(
        (field, kind),
        (
            "grpc_retryable_codes",
            overload_core::ConfigErrorKind::Conflict
        )
    );
    assert!(
        message.contains("cannot be used with classifier"),
        "{message}"
    );
    assert!(RetryLayer::builder().max_attempts(1).build().is_ok());
    assert!(
        RetryLayer::builder()
            .max_retry_after(Duration::ZERO)
            .grpc_retryable_codes(&[])
            .build()
            .is_ok()
    );
    assert!(
        RetryLayer::builder()
            .deadline(Duration::from_nanos(1))
            .attempt_timeout(Duration::from_nanos(1))
            .build()
            .is_ok()
    );
}

#[test]
fn defaults_are_the_documented_ones() {
    let layer = RetryLayer::new();
    let c = &layer.config;
    assert_eq!(c.max_attempts, 3);
    assert_eq!(c.max_attempts, RetryLayer::DEFAULT_MAX_ATTEMPTS);
    assert_eq!(c.body_limit, 64 * 1024);
    assert_eq!(c.body_limit, RetryLayer::DEFAULT_BODY_LIMIT);
    assert_eq!(c.name().as_str(), "default");
    assert_eq!(c.deadline, Some(Duration::from_secs(15)));
    assert_eq!(c.deadline, Some(RetryLayer::DEFAULT_DEADLINE));
    assert!(!c.deadline_on_wire, "the default deadline is never sent");
    assert_eq!(c.attempt_timeout, None);
    assert_eq!(c.backoff.max_delay(), Duration::from_secs(15 * 60));
    assert_eq!(
        format!("{:?}", c.backoff),
        format!("{:?}", Exponential::new())
    );
    assert_eq!(
        format!("{:?}", c.classifier),
        format!("{:?}", DefaultClassifier::new())
    );
    assert_eq!(c.max_retry_after, Duration::from_secs(30));
    assert_eq!(c.max_retry_after, RetryLayer::DEFAULT_MAX_RETRY_AFTER);
    assert_eq!(c.destinations.max(), 32);
    assert_eq!(
        c.destinations.max(),
        RetryLayer::DEFAULT_MAX_DESTINATION_SERIES
    );
    let throttle = c.throttle.as_ref().expect("throttled by default");
    assert_eq!(throttle.name(), "default", "named after the layer");
    assert_eq!(throttle.window(), Throttle::DEFAULT_WINDOW);
    assert!((throttle.multiplier() - 2.0).abs() < 1e-12);
    assert!((throttle.max_probability() - 0.9).abs() < 1e-12);
    // `build()` of an untouched builder is the same as `new()`.
    let built = RetryLayer::builder().build().unwrap();
    assert_eq!(format!("{:?}", built.config), format!("{c:?}"));
}

fn assert_send_sync_clone<T: Send + Sync + Clone>() {}

#[test]
fn layer_and_service_are_send_sync_clone() {
    assert_send_sync_clone::<RetryLayer>();
    assert_send_sync_clone::<Retry<()>>();
    #[cfg(feature = "tonic")]
    {
        assert_send_sync_clone::<RetryLayer<crate::adapter::Tonic>>();
        assert_send_sync_clone::<Retry<(), crate::adapter::Tonic>>();
    }
}

#[test]
fn a_name_is_checked_and_given_to_the_layers_own_budget() {
    for bad in ["", "caf\u{e9}", "tab\there"] {
        let err = RetryLayer::builder().name(bad).build().unwrap_err();
        assert_eq!(err.field(), "name", "{bad:?}");
    }
    let layer = RetryLayer::builder().name("payments").build().unwrap();
    assert_eq!(layer.config.name().as_str(), "payments");
    assert_eq!(layer.config.throttle.as_ref().unwrap().name(), "payments");
    assert!(format!("{:?}", layer.config).contains("name: \"payments\""));
}

#[test]
fn only_an_explicit_deadline_goes_on_the_wire_and_no_deadline_removes_it() {
    let config = |b: RetryBuilder| {
        let c = b.build().unwrap().config;
        (c.deadline, c.deadline_on_wire)
    };
    let s = Duration::from_secs;
    assert_eq!(config(RetryLayer::builder()), (Some(s(15)), false));
    assert_eq!(
        config(RetryLayer::builder().deadline(s(3))),
        (Some(s(3)), true)
    );
    assert_eq!(config(RetryLayer::builder().no_deadline()), (None, false));
    // Both: refused (the last call won silently before issue 30's review item D3).
    for both in [
        RetryLayer::builder().deadline(s(3)).no_deadline(),
        RetryLayer::builder().no_deadline().deadline(s(3)),
    ] {
        assert_eq!(both.build().unwrap_err().field(), "deadline");
    }
}

#[test]
fn grpc_retryable_codes_configure_the_default_classifier() {
    let layer = RetryLayer::builder()
        .grpc_retryable_codes(&[14, 4])
        .build()
        .unwrap();
    assert_eq!(
        format!("{:?}", layer.config.classifier),
        "DefaultClassifier { grpc_retryable_codes: [4, 14] }"
    );
}
