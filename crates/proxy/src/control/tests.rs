use super::table::{Entry, EntryStatus, EntryWriter};
use super::*;
use crate::config::{BackendConfig, ProxyConfig};
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
    cfg.admission.limit = 10;
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
    let mut m = String::new();
    c.render_metrics(&mut m);
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
