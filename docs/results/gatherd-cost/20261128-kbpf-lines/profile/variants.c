/*
 * The profiling variants, appended (scratch) to bpf/ksamp.bpf.c of commit c0dd9a81
 * (the tick before this change) and loaded by kprof.rs in place of ksamp_tick
 * (KSAMP_TICK=<name>; crates/xdp/src/ksamp.rs read the tick's program name from that
 * variable for the profile only). kp_full is the old tick; kp_notouch the new one
 * without the early loads of the record's lines (the second profile run).
 */
#define KP_NOLISTEN 1
#define KP_NOZERO 2
#define KP_NOCOUNTS 4
#define KP_NOCPUS 8
/* kp_publish: the old ksamp_publish, with the parts named by fl left out. */
/* kp_tick(fl, publish): the old ksamp_tick, publishing with kp_publish(fl) if publish. */
SEC("perf_event") int kp_noop(void *ctx) { return 0; }
SEC("perf_event") int kp_ktime(void *ctx) { return bpf_ktime_get_ns() == 1; }
SEC("perf_event") int kp_ema(void *ctx) { return kp_tick(0, 0); }          /* busy EMA only */
SEC("perf_event") int kp_full(void *ctx) { return kp_tick(0, 1); }         /* the old tick */
SEC("perf_event") int kp_nolisten(void *ctx) { return kp_tick(KP_NOLISTEN, 1); }
SEC("perf_event") int kp_nozero(void *ctx) { return kp_tick(KP_NOLISTEN | KP_NOZERO, 1); }
SEC("perf_event") int kp_min(void *ctx) { return kp_tick(KP_NOLISTEN | KP_NOZERO | KP_NOCOUNTS | KP_NOCPUS, 1); }
