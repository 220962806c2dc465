/* SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0 */
/* Maps of the rmem XDP responder. Names are what the loader looks up (<= 15 chars). */
#ifndef RMEM_MAPS_H
#define RMEM_MAPS_H

#include "rmem_helpers.h"
#include "rmem_structs.h"

/* The region: one 4096-byte value, mmap'd by gatherd (MAP_SHARED) and written with plain stores. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__uint(map_flags, BPF_F_MMAPABLE);
	__type(key, __u32);
	__type(value, struct rmem_region);
} rmem_region SEC(".maps");

/*
 * The object arena: one chunk per element, mmap'd by the process that owns the objects
 * (farside_arena's seqlock writer); only READ, by arena-reader keys. max_entries is
 * set by the loader to the node's chunk count (at most RMEM_ARENA_CHUNKS_MAX).
 */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, RMEM_ARENA_CHUNKS_MAX);
	__uint(map_flags, BPF_F_MMAPABLE);
	__type(key, __u32);
	__type(value, struct rmem_arena_chunk);
} rmem_arena SEC(".maps");

/* Keys: key id -> SipHash key and rights; requests naming no key are dropped. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, RMEM_KEYS_MAX);
	__type(key, __u32);
	__type(value, struct rmem_key);
} rmem_keys SEC(".maps");

/*
 * Replay windows per (key id, sender): RMEM_REPLAY_BUCKETS buckets of RMEM_REPLAY_WAYS
 * windows each; a new sender in a full bucket evicts the way with the lowest top and
 * raises the bucket's floor to it (see struct rmem_bucket).
 */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, RMEM_REPLAY_BUCKETS);
	__type(key, __u32);
	__type(value, struct rmem_bucket);
} rmem_replay SEC(".maps");

/*
 * Sequence limits of every window, set by gatherd (farside_auth::floor):
 * RMEM_SEQLIM_FLOOR: the restart floor (a new window starts above it);
 * RMEM_SEQLIM_CEILING: the highest seq accepted at all (0: no ceiling).
 */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, RMEM_SEQLIM_ENTRIES);
	__type(key, __u32);
	__type(value, __u64);
} rmem_seqlim SEC(".maps");

/* Duplicate detection: client (the envelope's sender) -> its last mutation; least
 * recently used evicted. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, RMEM_DEDUP_CLIENTS_MAX);
	__type(key, __u64);
	__type(value, struct rmem_dedup);
} rmem_dedup SEC(".maps");

/* Configuration: entry 0 only. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct rmem_config);
} rmem_config SEC(".maps");

/* Counters per CPU, indexed by RMEM_CNT_*; user space sums the CPUs. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, RMEM_COUNTERS);
	__type(key, __u32);
	__type(value, __u64);
} rmem_counters SEC(".maps");

#endif /* RMEM_MAPS_H */
