//! A thread per back-end for transports the poller does not drive (`tcp`, the
//! two-sided baseline: a blocking request/response stream per back-end): it reads the
//! region every period through the blocking client, with the same accounting as the
//! poller ([`crate::watch::WatchState`]).

use crate::watch::{WatchState, MONITOR_READ_BYTES};
use crate::{MonitorOptions, ReadStats, Watch, RECONNECT_BACKOFF_MAX};
use farside_region::Words;
use farside_rmem::{connect_target, ClientOptions};
use farside_rt::{mono_ns, Pacer};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Poll `w` every `opts.period` until `stop`.
pub(crate) fn poll_loop(
    w: Watch,
    table: &dyn Words,
    opts: &MonitorOptions,
    stop: &AtomicBool,
    stats: &ReadStats,
) {
    let mut st = WatchState::new(table, w.index, w.name.clone(), w.region.to_string());
    let mut client = None;
    let mut backoff = Duration::ZERO;
    let mut next_connect = Instant::now();
    let mut bytes = [0u8; MONITOR_READ_BYTES];
    let copts = ClientOptions {
        key: opts.key,
        timeout: opts.read_timeout,
        ..Default::default()
    };
    farside_rt::apply_thread_nice(&format!("monitor: {}", w.name), opts.nice);
    let mut pacer = Pacer::new(opts.period);
    while !stop.load(Ordering::Relaxed) {
        pacer.wait();
        if client.is_none() {
            if Instant::now() < next_connect {
                continue;
            }
            match connect_target(&w.region, &copts) {
                Ok(c) => {
                    client = Some(c);
                    backoff = Duration::ZERO;
                }
                Err(err) => {
                    st.on_error(&err);
                    st.publish(mono_ns(), opts.stale_after);
                    backoff = (backoff * 2).clamp(opts.period, RECONNECT_BACKOFF_MAX);
                    next_connect = Instant::now() + backoff;
                    continue;
                }
            }
        }
        let c = client.as_mut().expect("connected above");
        let t0 = Instant::now();
        let result = c.read(0, &mut bytes);
        let now = mono_ns();
        match result {
            Ok(()) => st.on_read(&bytes, t0.elapsed().as_nanos() as u64, now, stats),
            Err(err) => {
                st.on_error(&err);
                if c.transport() != "shm" {
                    // Reconnect: a tcp stream may be out of step after a timeout.
                    client = None;
                }
            }
        }
        st.publish(now, opts.stale_after);
    }
}
