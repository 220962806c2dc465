/* SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0 */
/*
 * Constants of the kernel-resident load sampler (ksamp.bpf.c). The region word
 * indices mirror crates/region/src/layout.rs and the limits crates/xdp/src/ksamp.rs;
 * crates/xdp/tests/consts.rs fails if any value here disagrees with the Rust side.
 */
#ifndef KSAMP_CONSTS_H
#define KSAMP_CONSTS_H

/* Most watched ports (gatherd's WATCHED_PORTS_MAX: four 16-bit ports in one header word). */
#define KSAMP_PORTS_MAX 4
/*
 * CPUs whose busy state is sampled (a power of two, used as a mask). CPUs with a
 * higher id are not counted; the loader refuses a host with more.
 */
#define KSAMP_CPUS_MAX 256
/*
 * Each CPU's utilisation is an exponential average of its 1 ms busy/idle ticks,
 * weight 1/2^KSAMP_EMA_SHIFT per tick: a 16 ms time constant, so one tick moves it
 * by at most 6% and a saturated CPU reads > 95% after 48 ms.
 */
#define KSAMP_EMA_SHIFT 4
/*
 * The CPUs other than the writer tick together at most once every KSAMP_OTHER_SPREAD
 * periods: each every other_stride = KSAMP_OTHER_SPREAD x (CPUs - 1) periods, rounded
 * up to a power of two (the loader computes it; this value is its SAMPLER_OTHER_SPREAD).
 */
#define KSAMP_OTHER_SPREAD 4
/* Utilisation scale: parts per million. */
#define KSAMP_PPM 1000000

/* Region words of the load record (layout::W_*). */
#define KSAMP_W_SEQ_HEAD 8
#define KSAMP_W_SAMPLE_MONO_NS 9
#define KSAMP_W_CPU_UTIL_PPM 10
#define KSAMP_W_RUNNABLE 12
#define KSAMP_W_CONNS_ESTABLISHED 13
#define KSAMP_W_ACCEPT_BACKLOG 14
#define KSAMP_W_NCPU 19
#define KSAMP_W_FLAGS 20
#define KSAMP_W_CONNS_SAMPLED_MONO_NS 22
#define KSAMP_W_SEQ_TAIL 24
#define KSAMP_W_QUEUE_DELAY_US 23
/* layout::FLAG_CONNS: connection counts valid. */
#define KSAMP_FLAG_CONNS 2
/* layout::FLAG_QUEUE_DELAY: KSAMP_W_QUEUE_DELAY_US is measured. */
#define KSAMP_FLAG_QUEUE_DELAY 16

/* TCP states (include/net/tcp_states.h). */
#define KSAMP_TCP_ESTABLISHED 1
#define KSAMP_TCP_SYN_RECV 3
#define KSAMP_TCP_CLOSE 7
#define KSAMP_TCP_LISTEN 10

/* IPPROTO_TCP, as the sock:inet_sock_set_state tracepoint reports it. */
#define KSAMP_IPPROTO_TCP 6

/*
 * Listening sockets on watched ports whose accept queue is read directly (SO_REUSEPORT
 * groups of up to 16 sockets across the four ports); more are counted from the seed.
 */
#define KSAMP_LISTENERS_MAX 16
/*
 * Arrival times kept per listener (a power of two, used as a mask): the accept queue's
 * head is found among the last KSAMP_ARRIVALS_RING arrivals; a longer queue's head is
 * older than all of them, and its age is published as the oldest kept (a lower bound).
 * 64 covers the lab's accept queues at the limits admission keeps them to (<= 2 x 16).
 */
#define KSAMP_ARRIVALS_RING 64

#endif /* KSAMP_CONSTS_H */
