//! Boilerplate shared by the middleware of every crate in the workspace.

/// Defines `get_ref`, `get_mut` and `into_inner` on a middleware whose wrapped service is
/// the field `inner`, of type `S` (or the type given).
///
/// Used inside an `impl<S> Middleware<S> { .. }` block by `overload-signal`,
/// `backoff-layer` and `ratelimit-layer`. Not part of the public API: it may change in any
/// release.
#[doc(hidden)]
#[macro_export]
macro_rules! define_inner_service_accessors {
    () => {
        $crate::define_inner_service_accessors!(S);
    };
    ($inner:ty) => {
        /// A reference to the wrapped service.
        pub const fn get_ref(&self) -> &$inner {
            &self.inner
        }

        /// A mutable reference to the wrapped service.
        ///
        /// Calling it while a readiness reservation is held (between `poll_ready` and
        /// `call`) may break the inner service's contract; prefer it before the first use.
        pub const fn get_mut(&mut self) -> &mut $inner {
            &mut self.inner
        }

        /// The wrapped service, consuming this middleware.
        pub fn into_inner(self) -> $inner {
            self.inner
        }
    };
}
