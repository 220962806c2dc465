use super::table::{Entry, EntryStatus, EntryWriter};
use super::*;
use crate::config::{BackendConfig, ProxyConfig};
use crate::pool::Pool;
use farside_region::layout::{REGION_WORDS, W_SEQ_TAIL};
use farside_region::{Header, LoadRecord, MappedWords, RegionWriter};
use std::path::PathBuf;
use std::time::Instant;

fn tmp(tag: &str) -> PathBuf {
    std::env::temp_dir().join(format!(
        "farside-control-{tag}-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ))
}

fn backend(port: u16, site: &str) -> BackendConfig {
    BackendConfig {
        addr: format!("127.0.0.1:{port}").parse().unwrap(),
        site: site.into(),
        region: None,
        limit: None,
        maxconn: None,
    }
}

/// A control layer reading an external table that the test writes by hand.
fn with_table(
    backends: Vec<BackendConfig>,
    tweak: impl FnOnce(&mut ProxyConfig),
) -> (Control, Arc<dyn Words>, PathBuf) {
    let path = tmp("table");
    let words = monitor::create_table(Some(&path), backends.len(), 1000).unwrap();
    let mut cfg = ProxyConfig::simple("127.0.0.1:1".parse().unwrap(), backends);
    cfg.admission.enabled = true;
    // These tests write connection counts by hand: metric `conns` unless a test says.
    cfg.admission.metric = Metric::Conns;
    cfg.admission.limit = Some(10);
    // They test when a record is stale: refusing makes that visible.
    cfg.admission.on_stale = StalePolicy::Reject;
    cfg.monitor.table = Some(path.display().to_string());
    tweak(&mut cfg);
    cfg.validate().unwrap();
    (Control::new(&cfg).unwrap(), words, path)
}

fn fresh(conns: u64) -> Entry {
    Entry {
        status: EntryStatus::Ok,
        conns_established: conns,
        advanced_mono_ns: mono_ns(),
        remote_seq: 1,
        ..Default::default()
    }
}

#[test]
fn admits_while_some_backend_is_below_its_limit_and_picks_it() {
    let (c, t, p) = with_table(vec![backend(1, ""), backend(2, "")], |_| {});
    EntryWriter::new(&*t, 0).publish(&fresh(12));
    EntryWriter::new(&*t, 1).publish(&fresh(3));
    assert_eq!(c.decide_accept(), Ok(()));
    assert_eq!(
        c.choose(None),
        Ok(1),
        "the overloaded back-end is never chosen"
    );
    EntryWriter::new(&*t, 1).publish(&fresh(10));
    assert_eq!(c.decide_accept(), Err(Reject::Overloaded));
    assert_eq!(c.choose(None), Err(Reject::Overloaded));
    let _ = std::fs::remove_file(p);
}

#[test]
fn stale_records_follow_the_fail_safe_policy() {
    let (c, t, p) = with_table(vec![backend(1, "")], |cfg| cfg.admission.stale_after_ms = 5);
    let mut e = fresh(1);
    e.advanced_mono_ns = mono_ns() - 50_000_000;
    EntryWriter::new(&*t, 0).publish(&e);
    assert_eq!(
        c.decide_accept(),
        Err(Reject::StaleLoad),
        "fail safe: stale = reject"
    );
    let (c, t, p2) = with_table(vec![backend(1, "")], |cfg| {
        cfg.admission.stale_after_ms = 5;
        cfg.admission.on_stale = StalePolicy::Admit;
    });
    EntryWriter::new(&*t, 0).publish(&e);
    assert_eq!(c.decide_accept(), Ok(()), "fail open: stale = admit");
    let _ = (std::fs::remove_file(p), std::fs::remove_file(p2));
}

/// Freshness per field: the record advanced just now, but its connection count was
/// taken 50 ms before (the gatherer counts every N samples): with stale_after 5 ms the
/// count is stale and admission follows the fail-safe policy.
#[test]
fn an_old_connection_count_inside_a_fresh_record_is_stale() {
    let (c, t, p) = with_table(vec![backend(1, "")], |cfg| cfg.admission.stale_after_ms = 5);
    let mut e = fresh(1);
    EntryWriter::new(&*t, 0).publish(&e);
    assert_eq!(c.decide_accept(), Ok(()), "a fresh count");
    e.conns_lag_ns = 50_000_000;
    EntryWriter::new(&*t, 0).publish(&e);
    assert_eq!(c.decide_accept(), Err(Reject::StaleLoad), "an old count");
    let _ = std::fs::remove_file(p);
}

/// A gatherer that counts connections only every 100 ms (a big host) is slow, not dead:
/// an 80 ms-old count inside a fresh record is within its counting interval and decides
/// by its value; only a count overdue by more than `stale_after` is stale.
#[test]
fn a_count_within_its_counting_interval_is_fresh() {
    let (c, t, p) = with_table(vec![backend(1, "")], |cfg| {
        cfg.admission.stale_after_ms = 20
    });
    let publish = |conns, lag_ms: u64| {
        let mut e = fresh(conns);
        e.conns_interval_ns = 100_000_000;
        e.conns_lag_ns = lag_ms * 1_000_000;
        EntryWriter::new(&*t, 0).publish(&e);
    };
    publish(1, 80);
    assert_eq!(c.decide_accept(), Ok(()), "due, not stale");
    publish(10, 80);
    assert_eq!(
        c.decide_accept(),
        Err(Reject::Overloaded),
        "its value decides"
    );
    publish(1, 200);
    assert_eq!(c.decide_accept(), Err(Reject::StaleLoad), "100 ms overdue");
    let _ = std::fs::remove_file(p);
}

/// `on_stale = local` (the default): a stale back-end is held at the most requests this
/// proxy had in flight to it when a fresh reading admitted one; never read fresh, it is
/// refused.
#[test]
fn a_stale_backend_is_held_at_its_last_safe_concurrency() {
    let (c, t, p) = with_table(vec![backend(1, "")], |cfg| {
        cfg.admission.on_stale = StalePolicy::Local;
        cfg.admission.stale_after_ms = 5;
    });
    assert_eq!(c.choose(None), Err(Reject::StaleLoad), "never read fresh");
    EntryWriter::new(&*t, 0).publish(&fresh(1));
    // Three requests admitted on fresh readings under the limit: safe level 3.
    let mut routes: Vec<Route> = (0..3).map(|_| c.route(None).unwrap()).collect();
    assert_eq!(c.safe_inflight(0), 3);
    // The record goes stale: the three in flight are the level; a fourth waits.
    let mut e = fresh(1);
    e.advanced_mono_ns = mono_ns() - 50_000_000;
    EntryWriter::new(&*t, 0).publish(&e);
    assert_eq!(c.load(0, mono_ns()), Load::Stale);
    assert_eq!(c.choose(None), Err(Reject::StaleLoad), "at the safe level");
    routes.pop();
    assert!(c.choose(None).is_ok(), "one completed: below it again");
    // A fresh reading at the limit refuses and leaves the level alone.
    EntryWriter::new(&*t, 0).publish(&fresh(10));
    assert_eq!(c.choose(None), Err(Reject::Overloaded));
    assert_eq!(c.safe_inflight(0), 3);
    drop(routes);
    let _ = std::fs::remove_file(p);
}

#[test]
fn never_read_backend_is_stale_not_idle() {
    let (c, _t, p) = with_table(vec![backend(1, "")], |_| {});
    assert_eq!(c.load(0, mono_ns()), Load::Stale);
    assert_eq!(c.choose(None), Err(Reject::StaleLoad));
    let _ = std::fs::remove_file(p);
}

#[test]
fn routes_by_site_with_per_site_limits() {
    let (c, t, p) = with_table(
        vec![backend(1, "a.example"), backend(2, "b.example")],
        |cfg| {
            cfg.admission.site_limits.insert("b.example".into(), 100);
        },
    );
    EntryWriter::new(&*t, 0).publish(&fresh(50));
    EntryWriter::new(&*t, 1).publish(&fresh(50));
    assert_eq!(
        c.choose(Some("a.example")),
        Err(Reject::Overloaded),
        "limit 10"
    );
    assert_eq!(
        c.choose(Some("B.example")),
        Ok(1),
        "site limit 100, case-insensitive host"
    );
    assert_eq!(c.choose(Some("c.example")), Err(Reject::UnknownSite));
    let _ = std::fs::remove_file(p);
}

#[test]
fn failed_backend_is_skipped_for_a_while_unless_all_are_down() {
    let mut cfg = ProxyConfig::simple(
        "127.0.0.1:1".parse().unwrap(),
        vec![backend(1, ""), backend(2, "")],
    );
    cfg.balance.policy = BalancePolicy::RoundRobin;
    let c = Control::new(&cfg).unwrap();
    c.report_failure(0);
    for _ in 0..10 {
        assert_eq!(c.choose(None), Ok(1));
    }
    c.report_failure(1);
    // All down: panic mode tries them anyway rather than shedding load.
    assert!(c.choose(None).is_ok());
}

#[test]
fn admission_off_admits_everything_and_balances_by_inflight() {
    let cfg = ProxyConfig::simple(
        "127.0.0.1:1".parse().unwrap(),
        vec![backend(1, ""), backend(2, "")],
    );
    let c = Control::new(&cfg).unwrap();
    let r1 = c.route(None).unwrap();
    let r2 = c.route(None).unwrap();
    assert_ne!(r1.backend, r2.backend, "least-loaded spreads by in-flight");
    drop(r1);
    assert_eq!(c.on_accept("127.0.0.1:9".parse().unwrap()), Ok(()));
}

#[test]
fn embedded_monitor_follows_a_live_region_and_notices_it_stop() {
    let path = tmp("region");
    let mem = MappedWords::create_file(&path, REGION_WORDS).unwrap();
    let mut w = RegionWriter::init(
        mem,
        Header {
            node_id: 1,
            generation: 7,
            period_us: 1000,
            watched_ports: [0; 4],
        },
    );
    w.publish(&LoadRecord {
        conns_established: 4,
        ..Default::default()
    });
    let mut b = backend(1, "");
    b.region = Some(format!("shm:{}", path.display()));
    let mut cfg = ProxyConfig::simple("127.0.0.1:1".parse().unwrap(), vec![b]);
    cfg.admission.enabled = true;
    cfg.admission.metric = Metric::Conns;
    cfg.admission.limit = Some(10);
    // They test when a record is stale: refusing makes that visible.
    cfg.admission.on_stale = StalePolicy::Reject;
    cfg.admission.stale_after_ms = 30;
    cfg.monitor.period_us = 200;
    let c = Control::new(&cfg).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while c.load(0, mono_ns()) != Load::Known(4) {
        assert!(
            Instant::now() < deadline,
            "monitor never published the record"
        );
        std::thread::yield_now();
    }
    // The gatherer stops: no new sequence. The record must go stale and be refused.
    while c.decide_accept() != Err(Reject::StaleLoad) {
        assert!(
            Instant::now() < deadline,
            "stopped gatherer never went stale"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    // It comes back with a new record: fresh again.
    w.publish(&LoadRecord {
        conns_established: 5,
        ..Default::default()
    });
    while c.load(0, mono_ns()) != Load::Known(5) {
        assert!(Instant::now() < deadline, "record never fresh again");
        std::thread::yield_now();
    }
    // Its reads were timed, and the stall shows as one update gap of at least the
    // staleness bound (the first record has no predecessor, so that is the only gap).
    let st = c.monitor.as_ref().unwrap().stats(0).unwrap();
    assert!(st.read.count() >= 2, "every successful read is timed");
    assert_eq!(st.update_gap.count(), 1, "one gap between the two records");
    let mut e = farside_admin::Encoder::new();
    c.render_metrics(&mut e);
    let m = e.finish();
    let count = |name: &str| {
        m.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or_else(|| panic!("no {name}:\n{m}"))
    };
    assert!(count("farside_monitor_read_seconds_count{") >= 2);
    assert_eq!(count("farside_monitor_update_gap_seconds_count{"), 1);
    // Gap >= 30 ms: no bucket at or below 20 ms holds it.
    assert_eq!(
        count("farside_monitor_update_gap_seconds_bucket{backend=\"127.0.0.1:1\",site=\"\",le=\"0.02\"}"),
        0,
        "{m}"
    );
    let _ = std::fs::remove_file(path);
}

#[test]
fn torn_region_record_is_never_used() {
    let path = tmp("torn");
    let mem = MappedWords::create_file(&path, REGION_WORDS).unwrap();
    let mut w = RegionWriter::init(
        mem,
        Header {
            node_id: 1,
            generation: 7,
            period_us: 1000,
            watched_ports: [0; 4],
        },
    );
    w.publish(&LoadRecord {
        conns_established: 4,
        ..Default::default()
    });
    // Corrupt the tail as a writer dying mid-update would leave it.
    w.mem().words()[W_SEQ_TAIL].fetch_add(1, Ordering::SeqCst);
    let mut b = backend(1, "");
    b.region = Some(format!("shm:{}", path.display()));
    let mut cfg = ProxyConfig::simple("127.0.0.1:1".parse().unwrap(), vec![b]);
    cfg.admission.enabled = true;
    cfg.monitor.period_us = 200;
    let c = Control::new(&cfg).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    // Wait until the monitor has tried and failed a few times.
    loop {
        let e = c.table.as_ref().and_then(|t| table::read(&**t, 0));
        if e.is_some_and(|e| e.errors >= 3) {
            break;
        }
        assert!(Instant::now() < deadline, "monitor never attempted a read");
        std::thread::yield_now();
    }
    assert_eq!(
        c.load(0, mono_ns()),
        Load::Stale,
        "a torn record must not become load"
    );
    let _ = std::fs::remove_file(path);
}

/// Idle pooled connections to a listener, `n` of them for back-end 0 of a pool capped
/// at `maxconn`. The listener and accepted ends are returned to keep them open.
async fn pool_with_idle(
    n: usize,
    maxconn: usize,
) -> (
    Arc<Pool>,
    SocketAddr,
    tokio::net::TcpListener,
    Vec<tokio::net::TcpStream>,
) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let pool = Arc::new(Pool::new(&[maxconn], 64, Duration::from_secs(30)));
    let mut server_ends = Vec::new();
    let mut held = Vec::new();
    for _ in 0..n {
        let c = pool
            .checkout(0, addr, false, Duration::ZERO)
            .await
            .ok()
            .unwrap();
        let crate::pool::Checkout::Fresh(p) = c else {
            panic!("nothing idle yet")
        };
        let s = tokio::net::TcpStream::connect(addr).await.unwrap();
        server_ends.push(l.accept().await.unwrap().0);
        held.push((s, p));
    }
    for (s, p) in held {
        pool.put(0, addr, s, p);
    }
    assert_eq!(pool.idle_count(0), n);
    (pool, addr, l, server_ends)
}

#[test]
fn requests_since_the_sample_count_against_the_limit_and_spread_between_samples() {
    // Item 5: A reads 3, B reads 5, limit 6. On the old code every request until the
    // next sample went to A and was admitted (A's figure stayed 3).
    let (c, t, p) = with_table(vec![backend(1, ""), backend(2, "")], |cfg| {
        cfg.admission.limit = Some(6)
    });
    EntryWriter::new(&*t, 0).publish(&fresh(3));
    EntryWriter::new(&*t, 1).publish(&fresh(5));
    let mut routes = Vec::new();
    for _ in 0..4 {
        routes.push(c.route(None).expect("admitted"));
    }
    let to_b = routes.iter().filter(|r| r.backend == 1).count();
    assert_eq!(routes[0].backend, 0);
    assert_eq!(routes[1].backend, 0);
    assert!(
        to_b >= 1,
        "once A's estimate reaches B's, B gets requests too"
    );
    // A: 3 + 3 sent = 6, B: 5 + 1 = 6: both at the limit until something completes.
    assert_eq!(c.load(0, mono_ns()), Load::Known(6));
    assert_eq!(c.route(None).err(), Some(Reject::Overloaded));
    routes.retain(|r| r.backend != 0);
    assert_eq!(
        c.load(0, mono_ns()),
        Load::Known(3),
        "completions since the sample count too"
    );
    assert_eq!(c.choose(None), Ok(0));
    let _ = std::fs::remove_file(p);
}

#[tokio::test(flavor = "current_thread")]
async fn own_idle_pooled_connections_are_not_counted_as_conns() {
    let (c, t, p) = with_table(vec![backend(1, "")], |cfg| cfg.admission.limit = Some(10));
    let (pool, _addr, _l, _ends) = pool_with_idle(3, 64).await;
    // 10 established, 3 of them this proxy's idle pooled connections.
    EntryWriter::new(&*t, 0).publish(&fresh(10));
    assert_eq!(
        c.decide_accept(),
        Err(Reject::Overloaded),
        "pool not bound yet"
    );
    c.bind_pool(pool);
    assert_eq!(c.load(0, mono_ns()), Load::Known(7));
    assert_eq!(c.decide_accept(), Ok(()));
    assert!(!c.route(None).unwrap().reuse_only);
    let _ = std::fs::remove_file(p);
}

fn queued(backlog: u64) -> Entry {
    Entry {
        accept_backlog: backlog,
        ..fresh(0)
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_queueing_backend_gets_idle_connections_shed_and_reuse_only_routes() {
    let (c, t, p) = with_table(vec![backend(1, "")], |cfg| {
        cfg.admission.metric = Metric::Backlog;
        cfg.admission.limit = Some(2);
    });
    let (pool, addr, _l, _ends) = pool_with_idle(5, 64).await;
    c.bind_pool(pool.clone());
    // 3 connections queued while 5 of ours sit idle, pinning workers.
    EntryWriter::new(&*t, 0).publish(&queued(3));
    let r = c.route(None).expect("an idle connection can carry it");
    assert!(r.reuse_only, "admitted onto an idle connection only");
    assert_eq!(
        pool.idle_count(0),
        2,
        "three idle connections shed for three queued"
    );
    assert_eq!(c.shed_total(0), 3);
    c.tend();
    assert_eq!(pool.idle_count(0), 2, "once per sample");
    let got = pool
        .checkout(0, addr, r.reuse_only, Duration::ZERO)
        .await
        .ok();
    assert!(matches!(got, Some(crate::pool::Checkout::Pooled(..))));
    drop(got);
    // A new sample still queueing: tend (no request needed) sheds the rest.
    let mut e = queued(3);
    e.advanced_mono_ns = mono_ns() + 1;
    e.remote_seq = 2;
    EntryWriter::new(&*t, 0).publish(&e);
    c.tend();
    assert_eq!(pool.idle_count(0), 0);
    assert_eq!(c.shed_total(0), 4);
    assert_eq!(c.route(None).err(), Some(Reject::Overloaded));
    // Two of the three queued still wait for workers: the next connections coming back
    // free theirs instead of being pooled.
    for k in 0..3 {
        let Ok(crate::pool::Checkout::Fresh(permit)) =
            pool.checkout(0, addr, false, Duration::ZERO).await
        else {
            panic!("nothing idle, under the cap")
        };
        let s = tokio::net::TcpStream::connect(addr).await.unwrap();
        pool.put(0, addr, s, permit);
        assert_eq!(pool.idle_count(0), k / 2, "closed, closed, then pooled");
    }
    assert_eq!(c.shed_total(0), 6);
    let _ = std::fs::remove_file(p);
}

#[test]
fn admission_and_shedding_rules_are_pure() {
    use crate::config::StalePolicy::{Admit as Open, Reject as Safe};
    let k = Load::Known;
    assert_eq!(admit(k(1), 2, Metric::Backlog, Safe, 0), Ok(Admit::Any));
    assert_eq!(
        admit(k(2), 2, Metric::Backlog, Safe, 0),
        Err(Reject::Overloaded)
    );
    assert_eq!(
        admit(k(9), 2, Metric::Backlog, Safe, 1),
        Ok(Admit::ReuseOnly)
    );
    assert_eq!(
        admit(k(9), 2, Metric::Pending, Safe, 1),
        Ok(Admit::ReuseOnly)
    );
    assert_eq!(
        admit(k(9), 2, Metric::Cpu, Safe, 1),
        Err(Reject::Overloaded),
        "an idle connection does not make CPU free"
    );
    assert_eq!(
        admit(Load::Stale, 2, Metric::Backlog, Safe, 1),
        Err(Reject::StaleLoad)
    );
    assert_eq!(
        admit(Load::Stale, 2, Metric::Backlog, Open, 0),
        Ok(Admit::Any)
    );
    assert_eq!(admit_local(2, 3), Ok(Admit::Any));
    assert_eq!(admit_local(3, 3), Err(Reject::StaleLoad));
    assert_eq!(
        admit_local(0, 0),
        Err(Reject::StaleLoad),
        "never read fresh"
    );
    let r = |close_idle, close_on_return| Relief {
        close_idle,
        close_on_return,
    };
    assert_eq!(relief(3, 5), r(3, 0));
    assert_eq!(relief(3, 1), r(1, 2), "the rest as connections come back");
    assert_eq!(relief(0, 5), r(0, 0));
}

/// A fresh record with delay reading `id` of `delay_us`, from a back-end whose accept
/// queue holds the `backlog` rule's limit: the slow start's queue path
/// ([`Control::slow_start_queue_admits`]) admits nothing, so the budget alone decides.
fn delay_reading(id: u64, delay_us: u64) -> Entry {
    Entry {
        accept_backlog: QUEUE_LIMIT_DEFAULT,
        ..delay_reading_backlog(id, delay_us, 0)
    }
}

fn delay_reading_backlog(id: u64, delay_us: u64, backlog: u64) -> Entry {
    Entry {
        status: EntryStatus::Ok,
        advanced_mono_ns: mono_ns(),
        remote_seq: id,
        queue_delay_us: delay_us,
        queue_delay_id: id,
        accept_backlog: backlog,
        ..Default::default()
    }
}

/// Metric `delay`, slow start: while the fresh accept queue is below the `backlog`
/// rule's limit (with this proxy's sends since the sample), a request the young budget
/// refuses is admitted, up to the cap; once the queue reaches the limit, or after the
/// first reading at or above the target (slow start over), the budget decides alone.
#[test]
fn delay_slow_start_admits_by_the_fresh_accept_queue_until_the_first_cut() {
    let (c, t, p) = with_table(vec![backend(1, "")], |cfg| {
        cfg.admission.metric = Metric::Delay;
        cfg.admission.target_delay_ms = Some(5);
        cfg.admission.limit = Some(8);
    });
    EntryWriter::new(&*t, 0).publish(&delay_reading_backlog(1, 0, 0));
    // Budget 1: the first by the budget, the second by the empty queue; the third would
    // make the estimate (0 + 2 sent) reach the limit of 2 waiting.
    let held: Vec<_> = (0..2).map(|_| c.route(None).unwrap()).collect();
    assert_eq!(
        c.choose(None),
        Err(Reject::Overloaded),
        "queue estimate at 2"
    );
    // A new sample with the queue empty: room again, never past the cap (8).
    let mut held = held;
    for id in 2..10 {
        // A sample taken after the sends so far: the tally counts events in a sample's
        // own millisecond as after it, so wait for the (coarse) clock to move on.
        let ms = coarse_mono_ns() / 1_000_000;
        while coarse_mono_ns() / 1_000_000 <= ms {
            std::thread::yield_now();
        }
        EntryWriter::new(&*t, 0).publish(&Entry {
            advanced_mono_ns: coarse_mono_ns(),
            ..delay_reading_backlog(id, 0, 0)
        });
        while let Ok(r) = c.route(None) {
            held.push(r);
        }
    }
    assert_eq!(held.len(), 8, "at most the cap");
    // The safe level follows what was admitted on fresh readings.
    assert_eq!(c.safe_inflight(0), 8);
    // A reading above the target ends slow start: with an empty queue the budget
    // (whatever it grew to by then, halved) decides alone.
    held.clear();
    publish_and_await_step(&c, &*t, 0, 10, 100_000);
    assert!(!c.backends[0].delay.lock().unwrap().slow_start);
    // The cut also bounds the stale policy's safe level: the slow start's 8 were not
    // taken within the target.
    assert_eq!(
        c.safe_inflight(0),
        c.budget(0),
        "safe level cut to the budget"
    );
    // The same reading (no new step), now with an empty accept queue.
    EntryWriter::new(&*t, 0).publish(&delay_reading_backlog(10, 100_000, 0));
    let budget = c.budget(0);
    let held: Vec<_> = std::iter::from_fn(|| c.route(None).ok()).take(20).collect();
    assert_eq!(held.len() as u64, budget, "the budget alone");
    let _ = std::fs::remove_file(p);
}

/// Metric `delay`: a reading measured with a rare connection count (older than the
/// staleness bound, younger than 1 s) in a fresh record is not stale before the monitor
/// has seen the gatherer's counting interval; an older one is.
#[test]
fn a_delay_reading_within_the_counting_allowance_is_not_stale_before_the_interval_is_seen() {
    let (c, t, p) = with_table(vec![backend(1, "")], |cfg| {
        cfg.admission.metric = Metric::Delay;
        cfg.admission.stale_after_ms = 20;
    });
    let reading = |lag_ns| Entry {
        conns_lag_ns: lag_ns,
        conns_interval_ns: 0,
        ..delay_reading(1, 0)
    };
    EntryWriter::new(&*t, 0).publish(&reading(500_000_000));
    assert_eq!(c.load(0, mono_ns()), Load::Known(0), "due, not stale");
    EntryWriter::new(&*t, 0).publish(&reading(1_500_000_000));
    assert_eq!(
        c.load(0, mono_ns()),
        Load::Stale,
        "overdue past the 1 s allowance"
    );
    // Once the interval is seen (100 ms here), it is the allowance.
    EntryWriter::new(&*t, 0).publish(&Entry {
        conns_interval_ns: 100_000_000,
        ..reading(500_000_000)
    });
    assert_eq!(
        c.load(0, mono_ns()),
        Load::Stale,
        "overdue past its interval"
    );
    let _ = std::fs::remove_file(p);
}

/// Publish delay reading `id` for back-end `i` and wait until the budget has acted on
/// it: a step is due at most once per target delay (`delay::DelayBudget::due`), so a
/// reading published sooner is applied once that time has passed.
fn publish_and_await_step(c: &Control, t: &dyn Words, i: usize, id: u64, delay_us: u64) {
    EntryWriter::new(t, i).publish(&delay_reading(id, delay_us));
    let deadline = Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let _ = c.load(i, mono_ns());
        let applied = c.backends[i]
            .delay
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .reading_id;
        if applied == id {
            return;
        }
        assert!(Instant::now() < deadline, "reading {id} never applied");
        std::thread::yield_now();
    }
}

/// Metric `delay`: the budget starts at one request in flight, grows while the
/// back-end's delay is under the target and the budget is in use, is cut when the delay
/// is above it, and never falls below one (liveness); every check is accounted to the
/// signal that decided it.
#[test]
fn delay_metric_adapts_the_budget_to_the_published_queueing_delay() {
    let (c, t, p) = with_table(vec![backend(1, "")], |cfg| {
        cfg.admission.metric = Metric::Delay;
        cfg.admission.target_delay_ms = Some(5);
        cfg.admission.limit = Some(8);
    });
    let mut id = 1;
    EntryWriter::new(&*t, 0).publish(&delay_reading(id, 0));
    let r1 = c.route(None).expect("budget 1, nothing in flight");
    assert_eq!(c.choose(None), Err(Reject::Overloaded), "budget 1 in use");
    // Low delay readings while the budget is in use: it grows, one per reading, to 8.
    let mut held = vec![r1];
    for _ in 0..10 {
        id += 1;
        publish_and_await_step(&c, &*t, 0, id, 1_000);
        while let Ok(r) = c.route(None) {
            held.push(r);
        }
    }
    assert_eq!(held.len(), 8, "grown to the cap `limit`");
    // A delay far above the target: cut to half at once (the strongest cut).
    id += 1;
    publish_and_await_step(&c, &*t, 0, id, 100_000);
    assert_eq!(c.load(0, mono_ns()), Load::Known(8));
    let mut e = farside_admin::Encoder::new();
    c.render_signal_metrics(&mut e);
    let m = e.finish();
    assert!(
        m.contains("farside_backend_queue_delay_us{backend=\"127.0.0.1:1\",site=\"\"} 100000"),
        "{m}"
    );
    held.truncate(4);
    assert_eq!(
        c.choose(None),
        Err(Reject::Overloaded),
        "4 in flight, budget 4"
    );
    held.truncate(3);
    assert!(c.choose(None).is_ok());
    // However high the delay stays, nothing in flight is always admitted.
    for _ in 0..20 {
        id += 1;
        EntryWriter::new(&*t, 0).publish(&delay_reading(id, 1_000_000));
        let _ = c.load(0, mono_ns());
    }
    held.clear();
    assert!(c.route(None).is_ok(), "never locked out");
    let mut e = farside_admin::Encoder::new();
    c.render_signal_metrics(&mut e);
    let m = e.finish();
    for want in [
        "farside_admission_checks_total{metric=\"delay\",decided=\"below_limit\"}",
        "farside_admission_checks_total{metric=\"delay\",decided=\"over_limit\"}",
        "farside_admission_target_delay_us 5000",
    ] {
        let line = m
            .lines()
            .find(|l| l.starts_with(want))
            .unwrap_or_else(|| panic!("{want} in {m}"));
        assert_ne!(line.rsplit(' ').next(), Some("0"), "{line}");
    }
    let _ = std::fs::remove_file(p);
}

/// Metric `delay`: a back-end whose fresh record carries no delay reading (its gatherd
/// watches no port) is admitted by `backlog` with that rule's limit, and says so in the
/// metrics; a record with a delay reading turns it back.
#[test]
fn delay_metric_admits_a_backend_without_a_delay_reading_by_backlog() {
    let (c, t, p) = with_table(vec![backend(1, "")], |cfg| {
        cfg.admission.metric = Metric::Delay;
        cfg.admission.limit = Some(8);
    });
    EntryWriter::new(&*t, 0).publish(&delay_reading_backlog(0, 0, 0));
    assert_eq!(c.load(0, mono_ns()), Load::Known(0), "fresh, not stale");
    assert_eq!(c.metric_of(0), Metric::Backlog);
    // The `backlog` estimate: the sample (0 waiting) plus this proxy's sends since.
    let held: Vec<_> = std::iter::from_fn(|| c.route(None).ok()).take(10).collect();
    assert_eq!(
        held.len() as u64,
        QUEUE_LIMIT_DEFAULT,
        "the backlog rule's limit"
    );
    assert_eq!(c.choose(None), Err(Reject::Overloaded));
    let mut e = farside_admin::Encoder::new();
    c.render(&mut e);
    let m = e.finish();
    for want in [
        "farside_backend_admission_metric{backend=\"127.0.0.1:1\",site=\"\",metric=\"backlog\"} 1",
        "farside_backend_load{backend=\"127.0.0.1:1\",site=\"\",metric=\"backlog\"} 2",
        "farside_backend_limit{backend=\"127.0.0.1:1\",site=\"\"} 2",
    ] {
        assert!(m.lines().any(|l| l == want), "{want} in {m}");
    }
    // A queue at the limit refuses even with nothing in flight: a sample taken after the
    // completions (the tally counts events in a sample's own millisecond as after it, so
    // wait for the clock to move on; in the same millisecond the two completions would be
    // taken from the sample's 2).
    drop(held);
    let ms = mono_ns() / 1_000_000;
    while mono_ns() / 1_000_000 <= ms {
        std::thread::yield_now();
    }
    EntryWriter::new(&*t, 0).publish(&delay_reading_backlog(0, 0, QUEUE_LIMIT_DEFAULT));
    assert_eq!(c.choose(None), Err(Reject::Overloaded));
    // Its gatherd gets a watched port: the delay metric again.
    EntryWriter::new(&*t, 0).publish(&delay_reading(1, 0));
    assert_eq!(c.load(0, mono_ns()), Load::Known(0));
    assert_eq!(c.metric_of(0), Metric::Delay);
    let mut e = farside_admin::Encoder::new();
    c.render(&mut e);
    let m = e.finish();
    assert!(
        m.contains("farside_backend_admission_metric{backend=\"127.0.0.1:1\",site=\"\",metric=\"delay\"} 1"),
        "{m}"
    );
    // A stale record without a delay reading is stale, whichever metric.
    EntryWriter::new(&*t, 0).publish(&Entry {
        advanced_mono_ns: mono_ns() - 10_000_000_000,
        ..delay_reading_backlog(0, 0, 0)
    });
    assert_eq!(c.load(0, mono_ns()), Load::Stale);
    let _ = std::fs::remove_file(p);
}

/// Metric `delay`: a sequential client (one request in flight at a time) in front of
/// idle back-ends is spread over all of them. The first completion grows the serving
/// back-end's budget (slow start), and an idle back-end must not win by that: with
/// nothing in flight every back-end scores the same and ties rotate.
#[test]
fn delay_metric_spreads_sequential_requests_over_idle_backends() {
    for policy in [BalancePolicy::LeastLoaded, BalancePolicy::P2c] {
        let (c, t, p) = with_table(vec![backend(1, ""), backend(2, "")], |cfg| {
            cfg.admission.metric = Metric::Delay;
            cfg.balance.policy = policy;
        });
        EntryWriter::new(&*t, 0).publish(&delay_reading_backlog(1, 0, 0));
        EntryWriter::new(&*t, 1).publish(&delay_reading_backlog(1, 0, 0));
        let mut to = [0; 2];
        for _ in 0..40 {
            let r = c.route(None).unwrap();
            to[r.backend] += 1;
        }
        assert!(to[0] >= 5 && to[1] >= 5, "{policy:?}: {to:?}");
        let _ = std::fs::remove_file(p);
    }
}

/// Metric `delay` balances by in-flight requests relative to each back-end's budget:
/// the back-end whose delay let its budget grow further takes proportionally more.
#[test]
fn delay_metric_balances_by_headroom_in_the_budget() {
    let mut small = backend(2, "");
    small.limit = Some(3);
    let (c, t, p) = with_table(vec![backend(1, ""), small], |cfg| {
        cfg.admission.metric = Metric::Delay;
        // A target shorter than the staleness bound: each reading is applied while fresh.
        cfg.admission.target_delay_ms = Some(5);
        cfg.admission.limit = Some(12);
    });
    // Both stay under the target while in use: budgets grow to 12 and to 3.
    let mut held = Vec::new();
    for id in 1..=12 {
        publish_and_await_step(&c, &*t, 0, id, 0);
        publish_and_await_step(&c, &*t, 1, id, 0);
        while let Ok(r) = c.route(None) {
            held.push(r);
        }
    }
    assert_eq!(held.len(), 15, "budgets 12 + 3");
    held.clear();
    let held: Vec<_> = (0..6).map(|_| c.route(None).unwrap()).collect();
    let to = |i: usize| held.iter().filter(|r| r.backend == i).count();
    assert_eq!((to(0), to(1)), (5, 1), "by headroom, not by count");
    let _ = std::fs::remove_file(p);
}

/// Per-back-end admission checks made so far (each reads one table entry).
fn checks(c: &Control) -> u64 {
    c.signals.0.iter().map(|x| x.load(Ordering::Relaxed)).sum()
}

fn thousand(policy: BalancePolicy) -> (Control, Arc<dyn Words>, PathBuf) {
    let n = table::TABLE_BACKENDS_MAX;
    let backends = (0..n).map(|i| backend(10_000 + i as u16, "")).collect();
    with_table(backends, |cfg| cfg.balance.policy = policy)
}

#[test]
fn p2c_over_a_thousand_backends_reads_a_bounded_number_of_entries() {
    let (c, t, p) = thousand(BalancePolicy::P2c);
    let n = c.backend_count();
    for i in 0..n {
        EntryWriter::new(&*t, i).publish(&fresh(i as u64 % 5));
    }
    let decisions = 1_000;
    let mut seen = std::collections::HashSet::new();
    for _ in 0..decisions {
        seen.insert(c.choose(None).unwrap());
    }
    let per = checks(&c) as f64 / decisions as f64;
    assert!(
        per <= P2C_DRAWS_MAX as f64,
        "{per} entries read per decision over {n} back-ends"
    );
    assert!(
        seen.len() > n / 4,
        "draws spread: {} back-ends chosen",
        seen.len()
    );
    // The accept check stops at the first admissible back-end.
    let before = checks(&c);
    for _ in 0..decisions {
        c.decide_accept().unwrap();
    }
    assert!(checks(&c) - before <= 2 * decisions);
    let _ = std::fs::remove_file(p);
}

#[test]
fn the_only_usable_backend_among_a_thousand_is_found_by_every_policy() {
    for policy in [
        BalancePolicy::P2c,
        BalancePolicy::RoundRobin,
        BalancePolicy::LeastLoaded,
    ] {
        let (c, t, p) = thousand(policy);
        let n = c.backend_count();
        let only = n - 24; // beyond what a u8 index or a 64-bit mask can name
        for i in 0..n {
            EntryWriter::new(&*t, i).publish(&fresh(if i == only { 0 } else { 10 }));
        }
        for _ in 0..50 {
            assert_eq!(c.choose(None), Ok(only), "{policy:?}");
            assert_eq!(c.decide_accept(), Ok(()), "{policy:?}");
        }
        EntryWriter::new(&*t, only).publish(&fresh(10));
        assert_eq!(c.choose(None), Err(Reject::Overloaded), "{policy:?}");
        assert_eq!(c.decide_accept(), Err(Reject::Overloaded), "{policy:?}");
        let _ = std::fs::remove_file(p);
    }
}

#[test]
fn more_backends_than_the_table_holds_is_a_config_error() {
    let n = table::TABLE_BACKENDS_MAX + 1;
    let backends = (0..n).map(|i| backend(10_000 + i as u16, "")).collect();
    let cfg = ProxyConfig::simple("127.0.0.1:1".parse().unwrap(), backends);
    let err = cfg.validate().unwrap_err().to_string();
    assert!(err.contains("at most 1024 back-ends"), "{err}");
}

/// `[[classes]]` on metric `inflight` (limit 8): a lower-priority class that asks is
/// guaranteed a quarter of the limit (2) and shed first past it near the limit; once its
/// cost is learned 100x the default's, it runs its guarantee at once, no more, while the
/// default class keeps the rest and leaves a freed slot to the costly class while it
/// is owed one; every decision shows in the class metrics.
#[test]
fn classes_bound_a_costly_class_and_shed_it_first() {
    let mut cfg = ProxyConfig::simple("127.0.0.1:1".parse().unwrap(), vec![backend(1, "")]);
    cfg.admission.enabled = true;
    cfg.admission.metric = Metric::Inflight;
    cfg.admission.limit = Some(8);
    cfg.classes =
        vec![crate::config::classes::parse_class("costly,prefix=/cgi/,priority=1").unwrap()];
    cfg.validate().unwrap();
    let c = Control::new(&cfg).unwrap();
    let costly = b"/cgi/work?us=150000";
    // Unlearned, the costly class weighs 1: it has its guarantee of 2, and past it near
    // the limit (7 of 8 in flight, reserve 2) a third one is shed first, the default
    // class is not.
    {
        let first = c.route_request(None, costly).unwrap();
        let cheap: Vec<_> = (0..5)
            .map(|_| c.route_request(None, b"/").unwrap())
            .collect();
        let second = c.route_request(None, costly).expect("its guarantee");
        let third = c.route_request(None, costly).err();
        assert_eq!(third, Some(Reject::Overloaded), "reserve");
        assert!(c.route_request(None, b"/a.html").is_ok());
        drop((first, second, cheap));
    }
    // Learn: default 1 ms, costly 100 ms (what the in-flight guards report).
    let cells = &c.backends[0].classes;
    for _ in 0..classes::COST_WARM_SAMPLES {
        cells.sent(0);
        cells.done(0, 1_000_000);
        cells.sent(1);
        cells.done(1, 100_000_000);
    }
    let one = c
        .route_request(None, costly)
        .expect("a costly request may run");
    let two = c
        .route_request(None, costly)
        .expect("its guarantee: 2 of 8");
    assert_eq!(
        c.route_request(None, costly).err(),
        Some(Reject::Overloaded),
        "bound = guarantee for a 100x class"
    );
    let cheap: Vec<_> = (0..6)
        .map(|_| c.route_request(None, b"/a.html").unwrap())
        .collect();
    assert_eq!(
        c.route_request(None, b"/a.html").err(),
        Some(Reject::Overloaded),
        "limit 8"
    );
    drop(one);
    assert_eq!(
        c.route_request(None, b"/a.html").err(),
        Some(Reject::Overloaded),
        "7 of 8 in flight: the freed slot is owed to the costly class"
    );
    let three = c
        .route_request(None, costly)
        .expect("the costly class takes its slot back");
    drop((two, three, cheap));
    let mut e = farside_admin::Encoder::new();
    c.render_metrics(&mut e);
    let m = e.finish();
    for want in [
        "farside_class_admitted_total{class=\"costly\"} 5",
        "farside_class_rejected_total{class=\"costly\"} 2",
        "farside_class_admitted_total{class=\"default\"} 12",
        "farside_class_rejected_total{class=\"default\"} 2",
        "farside_class_bound{backend=\"127.0.0.1:1\",class=\"costly\"} 2",
        "farside_class_bound{backend=\"127.0.0.1:1\",class=\"default\"} 8",
        "farside_class_guaranteed{backend=\"127.0.0.1:1\",class=\"costly\"} 2",
        "farside_class_cost_us{backend=\"127.0.0.1:1\",class=\"costly\"} ",
        "farside_class_checks_total{verdict=\"over_class_bound\"} 1",
        "farside_class_checks_total{verdict=\"reserved\"} 2",
        "farside_class_inflight{backend=\"127.0.0.1:1\",class=\"costly\"} 0",
    ] {
        assert!(m.contains(want), "{want} in {m}");
    }
}
