//! Behaviour of the models under paused tokio time.

use std::num::NonZeroUsize;
use std::time::Duration;

use rand::SeedableRng;
use rand::rngs::SmallRng;
use rand_distr::{Distribution, Exp};
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep, sleep_until};
use tower::ServiceExt;

use super::*;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn spawn_request(model: &Model) -> JoinHandle<Result<Duration, Refused>> {
    let model = model.clone();
    tokio::spawn(async move { model.serve().await })
}

fn close_to(actual: Duration, expected: Duration, tolerance: Duration) -> bool {
    actual.abs_diff(expected) <= tolerance
}

#[tokio::test(start_paused = true)]
async fn article_single_request_takes_the_base_delay() {
    let model = Model::new(LatencyModel::default());
    let took = model.serve().await.unwrap();
    assert_eq!(took, ms(100));
    assert_eq!(model.last_delay(), ms(100));
    assert_eq!(model.concurrency(), 0);
    assert_eq!(model.take_peak_concurrency(), 1);
    assert_eq!(model.take_peak_concurrency(), 0);
}

#[tokio::test(start_paused = true)]
async fn article_45_concurrent_requests_take_105_ms() {
    let model = Model::new(LatencyModel::default());
    let handles: Vec<_> = (0..45).map(|_| spawn_request(&model)).collect();
    sleep(ms(60)).await;
    assert_eq!(model.concurrency(), 45);
    assert!(close_to(
        model.last_delay(),
        ms(105),
        Duration::from_micros(1)
    ));
    let mut took: Vec<_> = Vec::new();
    for h in handles {
        took.push(h.await.unwrap().unwrap());
    }
    // The last request saw 45 inside from its first evaluation: 105 ms. The first 30 saw at
    // most 30 in their first tick, so did half their work at 100 ms: 50 + 52.5 ms.
    assert!(close_to(took[44], ms(105), ms(1)), "{took:?}");
    for t in &took[..30] {
        assert!(
            close_to(*t, Duration::from_micros(102_500), ms(1)),
            "{took:?}"
        );
    }
    assert_eq!(model.concurrency(), 0);
    assert_eq!(model.take_peak_concurrency(), 45);
}

#[tokio::test(start_paused = true)]
async fn article_remaining_wait_follows_the_current_delay() {
    let article = ArticleModel::default();
    let model = Model::new(article.into());
    let start = Instant::now();
    let first = spawn_request(&model);
    // Half-way through the first tick, 920 more requests arrive.
    sleep(ms(25)).await;
    let burst: Vec<_> = (0..920).map(|_| spawn_request(&model)).collect();
    let took = first.await.unwrap().unwrap();
    // 50 ms at 100 ms per unit of work did half of it; the other half at the new delay.
    let expected = ms(50) + article.delay(921) / 2;
    assert!(close_to(took, expected, ms(2)), "{took:?} vs {expected:?}");
    assert!(took > Duration::from_millis(900), "{took:?}");
    assert_eq!(model.take_peak_concurrency(), 921);
    assert!(close_to(model.last_delay(), article.delay(920), ms(10)));
    for h in burst {
        h.await.unwrap().unwrap();
    }
    assert!(start.elapsed() < ms(25) + article.delay(921) + ms(50));
    assert_eq!(model.concurrency(), 0);
}

#[tokio::test(start_paused = true)]
async fn pause_freezes_requests_inside_and_resume_continues_them() {
    let switch = PauseSwitch::new(10);
    let model = Model::with_pause_switch(LatencyModel::default(), switch.clone());
    let request = spawn_request(&model);
    sleep(ms(40)).await;
    switch.pause();
    sleep(ms(1_000)).await;
    assert!(!request.is_finished(), "a paused model made progress");
    assert_eq!(model.concurrency(), 1);
    switch.resume();
    let took = request.await.unwrap().unwrap();
    // 40 ms before the pause, 1 s paused, the remaining 60 ms after.
    assert!(close_to(took, ms(1_100), ms(1)), "{took:?}");
}

#[tokio::test(start_paused = true)]
async fn paused_model_backlogs_new_requests_then_refuses_when_full() {
    let switch = PauseSwitch::new(2);
    let model = Model::with_pause_switch(LatencyModel::default(), switch.clone());
    switch.pause();
    let waiting: Vec<_> = (0..2).map(|_| spawn_request(&model)).collect();
    sleep(ms(1)).await;
    assert_eq!(switch.backlog(), 2);
    assert_eq!(
        model.concurrency(),
        0,
        "backlogged requests are not inside yet"
    );
    // The backlog is full: the next request fails at once, like a refused connection.
    let refused_at = Instant::now();
    let err = model.serve().await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "request refused: the server is paused and its backlog is full"
    );
    assert_eq!(refused_at.elapsed(), Duration::ZERO);
    let refused = model.clone().oneshot(http::Request::new(())).await;
    assert!(refused.is_err());

    sleep(ms(500)).await;
    let resumed_at = Instant::now();
    switch.resume();
    for h in waiting {
        h.await.unwrap().unwrap();
    }
    assert_eq!(
        resumed_at.elapsed(),
        ms(100),
        "the backlog drains on resume"
    );
    assert_eq!(switch.backlog(), 0);
    assert_eq!(model.take_peak_concurrency(), 2);
}

#[tokio::test(start_paused = true)]
async fn mmc_paused_service_time_freezes() {
    let mmc = MmcModel::builder()
        .workers(NonZeroUsize::new(1).unwrap())
        .seed(3)
        .build()
        .unwrap();
    let service = mmc.service_time(0);
    assert!(service > ms(4), "pick a seed with a visible service time");
    let switch = PauseSwitch::new(10);
    let model = Model::with_pause_switch(mmc.into(), switch.clone());
    let request = spawn_request(&model);
    sleep(ms(2)).await;
    switch.pause();
    sleep(ms(10_000)).await;
    assert!(!request.is_finished());
    switch.resume();
    let took = request.await.unwrap().unwrap();
    assert_eq!(took, service + ms(10_000));
    assert_eq!(model.last_delay(), took);
}

#[tokio::test(start_paused = true)]
async fn dropped_requests_stop_counting() {
    let model = Model::new(LatencyModel::default());
    let abandoned = tokio::time::timeout(ms(30), model.serve()).await;
    assert!(abandoned.is_err(), "timed out");
    assert_eq!(model.concurrency(), 0);

    // A request that leaves lowers the delay of those still inside.
    let handles: Vec<_> = (0..200).map(|_| spawn_request(&model)).collect();
    sleep(ms(1)).await;
    assert_eq!(model.concurrency(), 200);
    for h in &handles[..190] {
        h.abort();
    }
    sleep(ms(1)).await;
    assert_eq!(model.concurrency(), 10);

    // A backlogged request that is dropped leaves the backlog.
    let switch = model.pause_switch().clone();
    switch.pause();
    let gone = tokio::time::timeout(ms(30), model.serve()).await;
    assert!(gone.is_err());
    assert_eq!(switch.backlog(), 0);
    switch.resume();
}

#[tokio::test(start_paused = true)]
async fn mmc_workers_serve_in_fifo_order() {
    let mmc = MmcModel::builder()
        .workers(NonZeroUsize::new(2).unwrap())
        .seed(11)
        .build()
        .unwrap();
    let model = Model::new(mmc.into());
    let handles: Vec<_> = (0..6).map(|_| spawn_request(&model)).collect();
    sleep(ms(0)).await;
    let mut times = Vec::new();
    for h in handles {
        times.push(h.await.unwrap().unwrap());
    }
    // Replay the queue by hand: two workers, requests in arrival order.
    let mut free_at = [Duration::ZERO; 2];
    for (n, took) in times.iter().enumerate() {
        let w = if free_at[0] <= free_at[1] { 0 } else { 1 };
        free_at[w] += mmc.service_time(n as u64);
        assert_eq!(*took, free_at[w], "request {n}");
    }
}

/// Erlang C: the mean response time of an M/M/c queue.
fn erlang_c_mean_response(lambda: f64, mu: f64, c: u32) -> f64 {
    let a = lambda / mu;
    let mut term = 1.0; // a^k / k!
    let mut sum = 0.0;
    for k in 0..c {
        sum += term;
        term *= a / f64::from(k + 1);
    }
    // term is now a^c / c!
    let tail = term * f64::from(c) / (f64::from(c) - a);
    let p_wait = tail / (sum + tail);
    p_wait / (f64::from(c) * mu - lambda) + 1.0 / mu
}

/// Offers `n` Poisson arrivals at `rate` per second to `model`, in virtual time; returns the
/// response time of every request.
async fn poisson_load(model: &Model, rate: f64, n: usize, seed: u64) -> Vec<Duration> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let gaps = Exp::new(rate).unwrap();
    let start = Instant::now();
    let mut at = 0.0;
    let mut handles = Vec::with_capacity(n);
    for _ in 0..n {
        at += gaps.sample(&mut rng);
        // Absolute deadlines: the timer's millisecond rounding cannot accumulate.
        sleep_until(start + Duration::from_secs_f64(at)).await;
        handles.push(spawn_request(model));
    }
    let mut times = Vec::with_capacity(n);
    for h in handles {
        times.push(h.await.unwrap().unwrap());
    }
    times
}

async fn mmc_matches_erlang_c(rate: f64, n: usize) {
    let mmc = MmcModel::builder().seed(2024).build().unwrap();
    let model = Model::new(mmc.into());
    let times = poisson_load(&model, rate, n, 99).await;
    let mean = times.iter().map(Duration::as_secs_f64).sum::<f64>() / n as f64;
    let expected = erlang_c_mean_response(rate, 20.0, 10);
    let error = (mean - expected).abs() / expected;
    println!(
        "M/M/10 at {rate} req/s: simulated mean {:.1} ms, Erlang C {:.1} ms ({:.1}% off)",
        mean * 1e3,
        expected * 1e3,
        error * 100.0
    );
    assert!(error < 0.10, "mean {mean} vs Erlang C {expected}");
}

#[test]
fn erlang_c_formula_matches_known_values() {
    // M/M/1 reduces to 1 / (mu - lambda).
    assert!((erlang_c_mean_response(10.0, 20.0, 1) - 0.1).abs() < 1e-12);
    // The paper's server: lightly loaded it is the service time.
    assert!((erlang_c_mean_response(1.0, 20.0, 10) - 0.05).abs() < 1e-6);
}

#[tokio::test(start_paused = true)]
async fn mmc_matches_erlang_c_at_150_per_second() {
    mmc_matches_erlang_c(150.0, 30_000).await;
}

#[tokio::test(start_paused = true)]
async fn mmc_matches_erlang_c_at_183_per_second() {
    mmc_matches_erlang_c(183.0, 60_000).await;
}

#[tokio::test(start_paused = true)]
async fn article_capacity_moves_the_knee_at_run_time() {
    let model = Model::new(LatencyModel::default());
    assert_eq!(model.capacity().map(NonZeroUsize::get), Some(30));
    let before = model.set_capacity(NonZeroUsize::new(15).unwrap()).unwrap();
    assert_eq!(before.get(), 30);
    // 30 inside is now 15 above the knee: 100 ms * 1.05.
    let handles: Vec<_> = (0..30).map(|_| spawn_request(&model)).collect();
    sleep(ms(60)).await;
    assert!(close_to(
        model.last_delay(),
        ms(105),
        Duration::from_micros(1)
    ));
    for h in handles {
        h.await.unwrap().unwrap();
    }
    // Back to 30: flat again.
    model.set_capacity(NonZeroUsize::new(30).unwrap()).unwrap();
    let handles: Vec<_> = (0..30).map(|_| spawn_request(&model)).collect();
    for h in handles {
        assert_eq!(h.await.unwrap().unwrap(), ms(100));
    }
}

#[tokio::test(start_paused = true)]
async fn mmc_workers_change_at_run_time_busy_ones_leave_when_done() {
    let mmc = MmcModel::builder()
        .workers(NonZeroUsize::new(4).unwrap())
        .mean_service(ms(50))
        .seed(3)
        .build()
        .unwrap();
    let model = Model::new(mmc.into());
    // Four busy workers, four more requests queued.
    let handles: Vec<_> = (0..8).map(|_| spawn_request(&model)).collect();
    tokio::task::yield_now().await;
    // Remove three while all are busy: they leave as they finish.
    assert_eq!(
        model
            .set_capacity(NonZeroUsize::new(1).unwrap())
            .unwrap()
            .get(),
        4
    );
    assert_eq!(model.capacity().map(NonZeroUsize::get), Some(1));
    let workers = model.shared.workers.as_ref().unwrap();
    for h in handles {
        h.await.unwrap().unwrap();
    }
    sleep(ms(1)).await;
    assert_eq!(workers.available_permits(), 1, "one worker left");
    // Grow to three: added at once.
    model.set_capacity(NonZeroUsize::new(3).unwrap()).unwrap();
    assert_eq!(workers.available_permits(), 3);
}

#[test]
fn instant_has_no_capacity() {
    let model = Model::new(LatencyModel::Instant);
    assert_eq!(model.capacity(), None);
    assert_eq!(
        model.set_capacity(NonZeroUsize::new(5).unwrap()),
        Err(NoCapacity)
    );
}
