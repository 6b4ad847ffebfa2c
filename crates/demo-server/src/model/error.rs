//! The error of a model builder.

use std::fmt;

/// Invalid model parameters; the message says which rule was broken.
///
/// The rules are listed on [`ArticleModelBuilder::build`](super::ArticleModelBuilder::build)
/// and [`MmcModelBuilder::build`](super::MmcModelBuilder::build).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InvalidModel {
    reason: &'static str,
}

impl InvalidModel {
    pub(super) const fn new(reason: &'static str) -> Self {
        Self { reason }
    }
}

impl fmt::Display for InvalidModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.reason)
    }
}

impl std::error::Error for InvalidModel {}
