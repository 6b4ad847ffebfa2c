//! What the survivors did during the outage, from their own `/metrics` scraped once a
//! second: [`Survivor`]; a finished fleet run ([`FleetRecord`]) and the table of a fleet's
//! runs ([`SurvivorTable`]).

use std::fmt::{self, Write as _};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Uri};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::balancer::BalancerView;
use crate::output::RunRecord;
use crate::report::Phases;

/// One server's counters at one second of the run.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Scrape {
    /// `/api` requests served (2xx) so far.
    pub served: u64,
    /// `/api` requests rejected by a limit (429, or 503 with `Retry-After`) so far.
    pub rejected: u64,
    /// `/api` answers carrying the stop signal so far.
    pub stop_signals: u64,
    /// The overload layer's window retry share (absent without the layer).
    pub retry_share: Option<f64>,
}

impl Scrape {
    /// Reads a `/metrics` page of `demo-server`.
    pub fn parse(text: &str) -> Self {
        let outcome = |o: &str| {
            sum(
                text,
                "demo_server_requests_total",
                &format!("outcome=\"{o}\""),
            )
        };
        Self {
            served: outcome("served").unwrap_or(0.0) as u64,
            rejected: outcome("rejected").unwrap_or(0.0) as u64,
            stop_signals: outcome("stop_signal").unwrap_or(0.0) as u64,
            retry_share: sum(text, "overload_signal_window_retry_share", ""),
        }
    }
}

/// The sum of the samples of metric `name` whose labels contain `label`; `None` if none.
fn sum(text: &str, name: &str, label: &str) -> Option<f64> {
    let mut total = None;
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some(rest) = line.strip_prefix(name) else {
            continue;
        };
        let (labels, value) = match rest.strip_prefix('{') {
            Some(labelled) => match labelled.split_once('}') {
                Some(split) => split,
                None => continue,
            },
            None if rest.starts_with(' ') => ("", rest),
            None => continue,
        };
        if !labels.contains(label) {
            continue;
        }
        if let Some(v) = value
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<f64>().ok())
        {
            *total.get_or_insert(0.0) += v;
        }
    }
    total
}

/// The running scraper of [`spawn_scraper`].
#[derive(Debug)]
pub(super) struct Scraper {
    task: JoinHandle<()>,
    series: Arc<Mutex<Vec<Vec<Option<Scrape>>>>>,
}

impl Scraper {
    /// Stops scraping; per server, the scrape of each whole second of the run (`None` where
    /// the server did not answer within 800 ms).
    pub(super) async fn finish(self) -> Vec<Vec<Option<Scrape>>> {
        self.task.abort();
        let _ = self.task.await;
        std::mem::take(&mut *self.series.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// Scrapes every `/metrics` of `urls` at each whole second from `start`.
pub(super) fn spawn_scraper(urls: Vec<Uri>, start: Instant) -> Scraper {
    let series: Arc<Mutex<Vec<Vec<Option<Scrape>>>>> =
        Arc::new(Mutex::new(vec![Vec::new(); urls.len()]));
    let out = Arc::clone(&series);
    let client: Client<HttpConnector, Empty<Bytes>> =
        Client::builder(TokioExecutor::new()).build(HttpConnector::new());
    let task = tokio::spawn(async move {
        for second in 0usize.. {
            tokio::time::sleep_until(start + Duration::from_secs(second as u64)).await;
            let scrapes: Vec<_> = urls
                .iter()
                .map(|url| {
                    let (client, url) = (client.clone(), url.clone());
                    tokio::spawn(async move {
                        let scrape = async {
                            let request = Request::get(url).body(Empty::new()).ok()?;
                            let response = client.request(request).await.ok()?;
                            let body = response.into_body().collect().await.ok()?.to_bytes();
                            Some(Scrape::parse(std::str::from_utf8(&body).ok()?))
                        };
                        tokio::time::timeout(Duration::from_millis(800), scrape)
                            .await
                            .ok()
                            .flatten()
                    })
                })
                .collect();
            let mut got = Vec::with_capacity(scrapes.len());
            for s in scrapes {
                got.push(s.await.ok().flatten());
            }
            let mut series = out.lock().unwrap_or_else(|e| e.into_inner());
            for (server, scrape) in series.iter_mut().zip(got) {
                server.resize(second, None);
                server.push(scrape);
            }
        }
    });
    Scraper { task, series }
}

/// What one surviving server did during the outage.
#[derive(Debug, Clone, PartialEq)]
pub struct Survivor {
    /// Its name in the balancer (`s2`, `s3`).
    pub name: String,
    /// Requests served per second during the outage.
    pub served_per_s: Option<f64>,
    /// That, as a share of one server's capacity.
    pub capacity_share: Option<f64>,
    /// Requests rejected per second during the outage.
    pub rejected_per_s: Option<f64>,
    /// Stop signals it sent during the outage.
    pub stop_signals: Option<u64>,
    /// Seconds from the start of the outage to its first stop signal, if any.
    pub first_stop: Option<usize>,
    /// The highest retry share its overload layer saw during the outage.
    pub peak_retry_share: Option<f64>,
}

impl Survivor {
    /// The figures of `series` (one scrape per second) over the outage of `phases` from
    /// `settle` seconds into it (the time the balancer takes to see the server stopped: the
    /// served and rejected rates are the survivors' once they carry the load; the stop
    /// signals are counted from the start), one server's capacity being `capacity`
    /// requests per second.
    pub fn compute(
        name: String,
        series: &[Option<Scrape>],
        phases: Phases,
        settle: usize,
        capacity: f64,
    ) -> Self {
        let (start, to) = (phases.pause_at, phases.resume_at());
        let from = (start + settle).min(to.saturating_sub(1));
        // The last scrape at or before second `s`, with its second.
        let at = |s: usize| {
            (0..=s.min(series.len().saturating_sub(1)))
                .rev()
                .find_map(|i| series.get(i).copied().flatten().map(|x| (i, x)))
        };
        let window = match (at(from), at(to)) {
            (Some((i, a)), Some((j, b))) if j > i => Some((a, b, (j - i) as f64)),
            _ => None,
        };
        let served_per_s = window.map(|(a, b, secs)| (b.served - a.served) as f64 / secs);
        let during = series.get(start..=to.min(series.len().saturating_sub(1)));
        let before = at(start).map(|(_, a)| a.stop_signals);
        let first_stop = match (during, before) {
            (Some(during), Some(before)) => during
                .iter()
                .position(|s| s.is_some_and(|s| s.stop_signals > before)),
            _ => None,
        };
        Self {
            name,
            served_per_s,
            capacity_share: served_per_s.map(|s| s / capacity),
            rejected_per_s: window.map(|(a, b, secs)| (b.rejected - a.rejected) as f64 / secs),
            stop_signals: match (at(start), at(to)) {
                (Some((_, a)), Some((_, b))) => Some(b.stop_signals - a.stop_signals),
                _ => None,
            },
            first_stop,
            peak_retry_share: during.and_then(|d| {
                d.iter()
                    .filter_map(|s| s.and_then(|s| s.retry_share))
                    .reduce(f64::max)
            }),
        }
    }
}

/// One finished fleet run.
#[derive(Debug, Clone)]
pub struct FleetRecord {
    /// The clients' view, as a scenario records it.
    pub run: RunRecord,
    /// The two servers that stayed up, during the outage.
    pub survivors: Vec<Survivor>,
    /// The balancer's view at the end of the run.
    pub balancer: BalancerView,
}

impl FleetRecord {
    /// Requests the balancer sent to the servers per request the clients started, over the
    /// whole run: what the clients' retries and the balancer's together cost the servers
    /// (`None` when the clients started nothing).
    pub fn server_attempts_per_request(&self) -> Option<f64> {
        let requests = self.run.report.requests;
        (requests > 0).then(|| self.balancer.server_requests() as f64 / requests as f64)
    }

    /// Attempts the clients sent per request they started, over the whole run.
    pub fn client_attempts_per_request(&self) -> Option<f64> {
        let requests = self.run.report.requests;
        let attempts: u64 = self.run.seconds.iter().map(|s| s.attempts).sum();
        (requests > 0).then(|| attempts as f64 / requests as f64)
    }
}

/// The survivors of every run and the balancer's view, as a text table.
#[derive(Debug)]
pub struct SurvivorTable<'a>(pub &'a [FleetRecord]);

impl fmt::Display for SurvivorTable<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let opt = |v: Option<f64>, digits: usize| {
            v.map_or_else(|| "-".to_owned(), |v| format!("{v:.digits$}"))
        };
        writeln!(
            f,
            "the survivors during the outage (rates once the balancer took the stopped server out)"
        )?;
        writeln!(
            f,
            "{:<28} {:<8} {:>12} {:>9} {:>12} {:>8} {:>11} {:>12}",
            "run",
            "survivor",
            "served/s",
            "capacity",
            "rejected/s",
            "stops",
            "first stop",
            "retry share"
        )?;
        for record in self.0 {
            for s in &record.survivors {
                writeln!(
                    f,
                    "{:<28} {:<8} {:>12} {:>8}% {:>12} {:>8} {:>11} {:>12}",
                    record.run.report.label,
                    s.name,
                    opt(s.served_per_s, 0),
                    opt(s.capacity_share.map(|c| c * 100.0), 0),
                    opt(s.rejected_per_s, 0),
                    s.stop_signals
                        .map_or_else(|| "-".to_owned(), |n| n.to_string()),
                    s.first_stop
                        .map_or_else(|| "never".to_owned(), |n| format!("+{n} s")),
                    opt(s.peak_retry_share, 2),
                )?;
            }
        }
        writeln!(f)?;
        let name = self.0.first().map_or("HAProxy", |r| r.balancer.name());
        writeln!(f, "the balancer's view ({name} statistics, whole run)")?;
        for record in self.0 {
            for line in format!("{:#}", record.balancer).lines() {
                writeln!(f, "{:<28} {line}", record.run.report.label)?;
            }
        }
        writeln!(f)?;
        writeln!(
            f,
            "attempts per request (whole run: attempts the clients sent, requests the balancer sent the servers)"
        )?;
        writeln!(
            f,
            "{:<28} {:>10} {:>14} {:>14} {:>12} {:>12}",
            "run", "requests", "client att/rq", "server att/rq", "servers got", "LB retries"
        )?;
        for record in self.0 {
            writeln!(
                f,
                "{:<28} {:>10} {:>14} {:>14} {:>12} {:>12}",
                record.run.report.label,
                record.run.report.requests,
                opt(record.client_attempts_per_request(), 2),
                opt(record.server_attempts_per_request(), 2),
                record.balancer.server_requests(),
                record.balancer.retries(),
            )?;
        }
        Ok(())
    }
}

/// The survivors of every run as CSV.
pub(super) fn survivors_csv(records: &[FleetRecord]) -> String {
    let mut out = String::from(
        "run,survivor,served_per_s,capacity_share,rejected_per_s,stop_signals,first_stop_s,peak_retry_share\n",
    );
    let cell = |v: Option<f64>| v.map_or_else(String::new, |v| format!("{v:.3}"));
    for record in records {
        for s in &record.survivors {
            let _ = writeln!(
                out,
                "{},{},{},{},{},{},{},{}",
                record.run.report.label,
                s.name,
                cell(s.served_per_s),
                cell(s.capacity_share),
                cell(s.rejected_per_s),
                s.stop_signals.map_or_else(String::new, |n| n.to_string()),
                s.first_stop.map_or_else(String::new, |n| n.to_string()),
                cell(s.peak_retry_share),
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_metrics_page_is_read() {
        let text = "# TYPE demo_server_requests_total counter\n\
            demo_server_requests_total{outcome=\"served\"} 120\n\
            demo_server_requests_total{outcome=\"rejected\"} 30\n\
            demo_server_requests_total{outcome=\"stop_signal\"} 4\n\
            overload_signal_window_retry_share{name=\"default\"} 0.25\n";
        assert_eq!(
            Scrape::parse(text),
            Scrape {
                served: 120,
                rejected: 30,
                stop_signals: 4,
                retry_share: Some(0.25),
            }
        );
        assert_eq!(Scrape::parse("").retry_share, None);
    }

    #[test]
    fn survivors_are_judged_over_the_outage() {
        let phases = Phases {
            pause_at: 2,
            pause_for: 4,
            observe_for: 10,
        };
        let s = |served, stop_signals, share| {
            Some(Scrape {
                served,
                rejected: served / 10,
                stop_signals,
                retry_share: Some(share),
            })
        };
        // 180 served a second from second 2 to 6, a stop signal from second 4; second 5
        // not scraped.
        let series = vec![
            s(0, 0, 0.0),
            s(150, 0, 0.0),
            s(300, 0, 0.1),
            s(480, 0, 0.3),
            s(660, 2, 0.6),
            None,
            s(1020, 9, 0.5),
            s(1200, 9, 0.9),
        ];
        let survivor = Survivor::compute("s2".into(), &series, phases, 0, 200.0);
        assert_eq!(survivor.served_per_s, Some(180.0));
        assert_eq!(survivor.capacity_share, Some(0.9));
        assert_eq!(survivor.rejected_per_s, Some(18.0));
        assert_eq!(survivor.stop_signals, Some(9));
        assert_eq!(survivor.first_stop, Some(2));
        assert_eq!(survivor.peak_retry_share, Some(0.6));
        let nothing = Survivor::compute("s3".into(), &[None; 8], phases, 0, 200.0);
        // From the second second of the outage: (1020 - 480) / 3.
        let settled = Survivor::compute("s2".into(), &series, phases, 1, 200.0);
        assert_eq!(settled.served_per_s, Some(180.0));
        assert_eq!(settled.stop_signals, Some(9));
        let settled = Survivor::compute("s2".into(), &series, phases, 3, 200.0);
        // From second 5, not scraped: the last scrape before it, second 4.
        assert_eq!(settled.served_per_s, Some(180.0));
        assert_eq!((nothing.served_per_s, nothing.first_stop), (None, None));
    }
}
