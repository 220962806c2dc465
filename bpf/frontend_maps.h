/* SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0 */
/* Maps of the blind front-end. Names are what the loader looks up (<= 15 chars). */
#ifndef FRONTEND_MAPS_H
#define FRONTEND_MAPS_H

#include "frontend_consts.h"
#include "frontend_structs.h"

#define SEC(name) __attribute__((section(name), used))
#define __uint(name, val) int (*name)[val]
#define __type(name, val) typeof(val) *name

/* Configuration: entry 0 only. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct fe_config);
} fe_config SEC(".maps");

/* Back-ends by index. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, FE_BACKENDS_MAX);
	__type(key, __u32);
	__type(value, struct fe_backend);
} fe_backends SEC(".maps");

/* Back-end address (network byte order) -> index, for the one-sided MOVE. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, FE_BACKENDS_MAX);
	__type(key, __u32);
	__type(value, __u32);
} fe_bip SEC(".maps");

/* Weight table: slot (hash % FE_SLOTS) -> back-end index, filled from the weights. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, FE_SLOTS);
	__type(key, __u32);
	__type(value, __u32);
} fe_table SEC(".maps");

/* Flow table: 4-tuple -> back-end, created by SYNs; least recently used evicted. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, FE_FLOWS_MAX);
	__type(key, struct fe_flow_key);
	__type(value, struct fe_flow);
} fe_flows SEC(".maps");

/* Moved flows: 4-tuple -> back-end, written by MOVE; looked up before fe_flows;
 * never evicted by traffic (a plain hash, bounded: a MOVE into a full one fails). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, FE_MOVED_MAX);
	__type(key, struct fe_flow_key);
	__type(value, struct fe_flow);
} fe_moved SEC(".maps");

/* The one-sided MOVE's keys: key id -> SipHash key (empty: no key configured). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, FE_KEYS_MAX);
	__type(key, __u32);
	__type(value, struct fe_key);
} fe_keys SEC(".maps");

/* The one-sided MOVE's replay check: (key id, sender) -> highest sequence accepted. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, FE_REPLAY_MAX);
	__type(key, struct fe_replay_key);
	__type(value, __u64);
} fe_replay SEC(".maps");

/* The one-sided MOVE's replay floor: a sequence at or below it is refused whatever
 * fe_replay holds. The loader seeds it with the clock floor of its start (every
 * second before it; senders seal with clock sequences), so a MOVE captured before a
 * restart is refused after it although fe_replay starts empty. One entry. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} fe_move_floor SEC(".maps");

/* Per-back-end counters, per CPU; user space sums the CPUs. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, FE_BACKENDS_MAX);
	__type(key, __u32);
	__type(value, struct fe_bstats);
} fe_bstats SEC(".maps");

/* Global counters (FE_CNT_*), per CPU. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, FE_COUNTERS);
	__type(key, __u32);
	__type(value, __u64);
} fe_counters SEC(".maps");

#endif /* FRONTEND_MAPS_H */
