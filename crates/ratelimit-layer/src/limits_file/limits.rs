//! The limits file's content: [`Limits`], parsed and validated, and its errors.

use std::collections::BTreeMap;
use std::fmt;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::Duration;

use http::HeaderName;
use serde::Deserialize;
use toml::Spanned;

use crate::algorithm::TokenBucket;

/// The limits a file sets, validated: a [`TokenBucket`] for the default, each route and
/// each tenant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    default: TokenBucket,
    exact: BTreeMap<String, TokenBucket>,
    /// Longest first.
    prefixes: Vec<(String, TokenBucket)>,
    tenant_header: Option<HeaderName>,
    tenants: BTreeMap<String, TokenBucket>,
}

/// Why a limits file was refused: where (`path:line:column`) and what is wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LimitsFileError {
    pub(super) path: PathBuf,
    /// 1-based line and column; `None` when the file could not be read.
    pub(super) position: Option<(usize, usize)>,
    pub(super) message: String,
}

impl LimitsFileError {
    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The 1-based line and column of the error, `None` when the file could not be read.
    pub fn position(&self) -> Option<(usize, usize)> {
        self.position
    }

    /// What is wrong.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for LimitsFileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.position {
            Some((line, column)) => write!(
                f,
                "{}:{line}:{column}: {}",
                self.path.display(),
                self.message
            ),
            None => write!(f, "{}: {}", self.path.display(), self.message),
        }
    }
}

impl std::error::Error for LimitsFileError {}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileDoc {
    tenant_header: Option<Spanned<String>>,
    default: Spanned<LimitDoc>,
    #[serde(default)]
    route: Vec<Spanned<RouteDoc>>,
    #[serde(default)]
    tenant: BTreeMap<String, Spanned<LimitDoc>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LimitDoc {
    rate: Spanned<u32>,
    period: Option<Spanned<String>>,
    burst: Option<Spanned<u32>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RouteDoc {
    exact: Option<String>,
    prefix: Option<String>,
    rate: Spanned<u32>,
    period: Option<Spanned<String>>,
    burst: Option<Spanned<u32>>,
}

impl Limits {
    /// Reads and validates the file at `path`.
    ///
    /// # Errors
    ///
    /// The file cannot be read, is not TOML, or sets anything invalid: the first error, with
    /// its line and column.
    pub fn load(path: impl AsRef<Path>) -> Result<Self, LimitsFileError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|e| LimitsFileError {
            path: path.to_owned(),
            position: None,
            message: format!("cannot read: {e}"),
        })?;
        Self::parse(path, &text)
    }

    /// Validates `text`, the content of the file at `path` (named in errors only).
    ///
    /// # Errors
    ///
    /// As [`load`](Self::load).
    pub fn parse(path: impl AsRef<Path>, text: &str) -> Result<Self, LimitsFileError> {
        let err = |span: Option<Range<usize>>, message: String| LimitsFileError {
            path: path.as_ref().to_owned(),
            position: Some(span.map_or((1, 1), |s| line_column(text, s.start))),
            message,
        };
        let doc: FileDoc =
            toml::from_str(text).map_err(|e| err(e.span(), e.message().trim_end().to_owned()))?;
        // A limit's bucket; an error points at the setting it names.
        let bucket = |what: &str,
                      rate: &Spanned<u32>,
                      period: Option<&Spanned<String>>,
                      burst: Option<&Spanned<u32>>| {
            let period_value = match period {
                None => TokenBucket::DEFAULT_PERIOD,
                Some(p) => parse_duration(p.get_ref()).ok_or_else(|| {
                    err(
                        Some(p.span()),
                        format!(
                            "{what}: period: cannot read {:?} as a duration such as \"1s\" or \"250ms\"",
                            p.get_ref()
                        ),
                    )
                })?,
            };
            let mut builder = TokenBucket::builder(*rate.get_ref()).period(period_value);
            if let Some(burst) = burst {
                builder = builder.burst(*burst.get_ref());
            }
            builder.build().map_err(|e| {
                let span = match e.field() {
                    "burst" => burst.map_or_else(|| rate.span(), Spanned::span),
                    "period" => period.map_or_else(|| rate.span(), Spanned::span),
                    _ => rate.span(),
                };
                err(Some(span), format!("{what}: {e}"))
            })
        };
        let limit = |what: &str, doc: &Spanned<LimitDoc>| {
            let l = doc.get_ref();
            bucket(what, &l.rate, l.period.as_ref(), l.burst.as_ref())
        };
        let default = limit("[default]", &doc.default)?;
        let mut exact = BTreeMap::new();
        let mut prefixes = Vec::new();
        for route in &doc.route {
            let r = route.get_ref();
            let (path, is_exact) = match (&r.exact, &r.prefix) {
                (Some(p), None) => (p, true),
                (None, Some(p)) => (p, false),
                _ => {
                    return Err(err(
                        Some(route.span()),
                        "[[route]]: set exactly one of `exact` and `prefix`".into(),
                    ));
                }
            };
            let what = format!("[[route]] {path:?}");
            if !path.starts_with('/') {
                return Err(err(
                    Some(route.span()),
                    format!("{what}: a route's path must start with '/'"),
                ));
            }
            let limit = bucket(&what, &r.rate, r.period.as_ref(), r.burst.as_ref())?;
            let duplicate = if is_exact {
                exact.insert(path.clone(), limit).is_some()
            } else if prefixes.iter().any(|(p, _)| p == path) {
                true
            } else {
                prefixes.push((path.clone(), limit));
                false
            };
            if duplicate {
                return Err(err(Some(route.span()), format!("{what}: set twice")));
            }
        }
        prefixes.sort_by_key(|(prefix, _)| std::cmp::Reverse(prefix.len()));
        let tenant_header = match &doc.tenant_header {
            None => None,
            Some(h) => Some(HeaderName::try_from(h.get_ref().as_str()).map_err(|_| {
                err(
                    Some(h.span()),
                    format!("tenant_header: {:?} is not a header name", h.get_ref()),
                )
            })?),
        };
        let mut tenants = BTreeMap::new();
        for (key, doc) in &doc.tenant {
            if tenant_header.is_none() {
                return Err(err(
                    Some(doc.span()),
                    format!("[tenant.{key}]: tenants need `tenant_header`, the header naming them"),
                ));
            }
            tenants.insert(key.clone(), limit(&format!("[tenant.{key}]"), doc)?);
        }
        Ok(Self {
            default,
            exact,
            prefixes,
            tenant_header,
            tenants,
        })
    }

    /// The header whose value names a request's tenant, if the file names one.
    pub fn tenant_header(&self) -> Option<&HeaderName> {
        self.tenant_header.as_ref()
    }

    /// The limit of a request for `path` from `tenant` (the value of
    /// [`tenant_header`](Self::tenant_header)): the tenant's if the file sets one, else the
    /// exact route's, else the longest prefix's, else the default.
    pub fn limit_for(&self, path: &str, tenant: Option<&str>) -> &TokenBucket {
        if let Some(limit) = tenant.and_then(|t| self.tenants.get(t)) {
            return limit;
        }
        if let Some(limit) = self.exact.get(path) {
            return limit;
        }
        self.prefixes
            .iter()
            .find(|(prefix, _)| path.starts_with(prefix.as_str()))
            .map_or(&self.default, |(_, limit)| limit)
    }

    /// What differs from `self` to `new`, one line per limit, for the reload's log.
    pub fn changes(&self, new: &Self) -> Vec<String> {
        let mut out = Vec::new();
        let show = |b: &TokenBucket| format!("{}/{:?} burst {}", b.rate(), b.period(), b.burst());
        let mut diff =
            |what: String, old: Option<&TokenBucket>, new: Option<&TokenBucket>| match (old, new) {
                (Some(o), Some(n)) if o != n => {
                    out.push(format!("{what}: {} -> {}", show(o), show(n)));
                }
                (Some(o), None) => out.push(format!("{what}: {} removed", show(o))),
                (None, Some(n)) => out.push(format!("{what}: {} added", show(n))),
                _ => {}
            };
        diff("default".into(), Some(&self.default), Some(&new.default));
        let union = |a: Vec<&String>, b: Vec<&String>| {
            let mut all: Vec<String> = a.into_iter().chain(b).cloned().collect();
            all.sort();
            all.dedup();
            all
        };
        for p in union(self.exact.keys().collect(), new.exact.keys().collect()) {
            diff(
                format!("route exact {p:?}"),
                self.exact.get(&p),
                new.exact.get(&p),
            );
        }
        let find = |v: &[(String, TokenBucket)], p: &str| {
            v.iter().find(|(q, _)| q == p).map(|(_, b)| b.clone())
        };
        for p in union(
            self.prefixes.iter().map(|(p, _)| p).collect(),
            new.prefixes.iter().map(|(p, _)| p).collect(),
        ) {
            diff(
                format!("route prefix {p:?}"),
                find(&self.prefixes, &p).as_ref(),
                find(&new.prefixes, &p).as_ref(),
            );
        }
        for t in union(self.tenants.keys().collect(), new.tenants.keys().collect()) {
            diff(
                format!("tenant {t:?}"),
                self.tenants.get(&t),
                new.tenants.get(&t),
            );
        }
        if self.tenant_header != new.tenant_header {
            out.push(format!(
                "tenant_header: {:?} -> {:?}",
                self.tenant_header, new.tenant_header
            ));
        }
        out
    }
}

/// The 1-based line and column (in characters) of byte `offset` of `text`.
fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let before = text.get(..offset).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}

/// A duration written as a whole number and a unit: `ns`, `us`, `ms`, `s`, `m` or `h`.
pub(super) fn parse_duration(text: &str) -> Option<Duration> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit())?;
    let (number, unit) = text.split_at(split);
    let n: u64 = number.parse().ok()?;
    match unit.trim() {
        "ns" => Some(Duration::from_nanos(n)),
        "us" => Some(Duration::from_micros(n)),
        "ms" => Some(Duration::from_millis(n)),
        "s" => Some(Duration::from_secs(n)),
        "m" => n.checked_mul(60).map(Duration::from_secs),
        "h" => n.checked_mul(3_600).map(Duration::from_secs),
        _ => None,
    }
}
