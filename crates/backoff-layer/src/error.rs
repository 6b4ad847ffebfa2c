//! The boxed error type of the crate, apart from the root so that every module can name it
//! without importing the crate root.

/// The boxed error type the retry layer returns: `Box<dyn Error + Send + Sync>`, the same as
/// `tower::BoxError`.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
