//! The admission window of speculative connection admission (seed 002, §3.2), as a
//! pure state machine: no clock, no sockets, every input an event.
//!
//! A back-end has its server's accept queue (`queue`, Q, e.g. 64) and on top of it an
//! admission window (`window`, W, e.g. 32 or 50): connections that arrive while the
//! server's queue is full are admitted *speculatively* — marked migratory and handed
//! to a less-loaded peer — as long as fewer than the current window size are in
//! flight. Otherwise they are refused (on a real node: the kernel drops the SYN of a
//! full accept queue and the client retries).
//!
//! ```text
//!                       arrival(server queue q)
//!                 q < Q │            │ q ≥ Q
//!                       ▼            ▼
//!                    SERVER     in_flight < size ? ── no ──▶ REFUSE
//!                                    │ yes
//!                                    ▼
//!                       MIGRATE (in_flight += 1)
//!                                    │ resolved: in_flight -= 1
//!        ┌──────────────┬────────────┴──────┬───────────────────┐
//!     migrated      not dumpable       refused by target   target failed
//!     (nothing)     (nothing: the      (served locally;    (served locally;
//!                    connection's       CLOSE: size = 0)    CLOSE: size = 0)
//!                    fault, not the
//!                    target's)
//!
//!   CLOSED ── target notification ("I can take again") ──▶ OPEN (size = W)
//!   CLOSED ── N requests served locally since closing ───▶ OPEN (size = W)
//! ```
//!
//! The paper only names a refusal as closing the window; a target that failed
//! (unreachable, dead, restore error) cannot take connections either and sends no
//! notification, so it closes the window too and the N-local-requests rule is the
//! retry back-off. A connection that could not be dumped is the connection's fault,
//! not the target's, and leaves the window as it is. The window reopens to its full
//! size at once, as the paper's ("grow its window back to the size of the admission
//! queue"). Connections already in flight when the window closes finish their
//! migration; only new admissions stop.

/// The paper's base accept queue (§4.2: "single.128-64", the base of every
/// speculative experiment).
pub const QUEUE_DEFAULT: u32 = 64;
/// The paper's smaller admission window ("cm33": 64 + 32).
pub const WINDOW_DEFAULT: u32 = 32;
/// Upper bound of the queue and the window: Linux caps an accept queue at
/// `net.core.somaxconn` (4096 by default since 5.4); a window larger than any accept
/// queue would only add connections the node cannot hold while they migrate.
pub const QUEUE_WINDOW_MAX: u32 = 4096;

/// The window's sizes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WindowConfig {
    /// Q: the server's accept-queue length at which arrivals stop going to it.
    pub queue: u32,
    /// W: the admission window (most migratory connections in flight).
    pub window: u32,
    /// N: locally served requests after which a closed window reopens without a
    /// notification (lost notifications). The paper: "typically … the size of the
    /// admission queue", so W by default.
    pub reopen_after: u32,
}

impl WindowConfig {
    /// Q and W with the paper's default N = W.
    pub fn new(queue: u32, window: u32) -> Self {
        Self {
            queue,
            window,
            reopen_after: window,
        }
    }

    /// Checks every bound; the message names the offending value.
    pub fn validate(&self) -> Result<(), String> {
        if self.queue == 0 || self.queue > QUEUE_WINDOW_MAX {
            return Err(format!("queue must be in 1..={QUEUE_WINDOW_MAX}"));
        }
        if self.window > QUEUE_WINDOW_MAX {
            return Err(format!("window must be in 0..={QUEUE_WINDOW_MAX}"));
        }
        if self.reopen_after == 0 && self.window > 0 {
            return Err("reopen-after must be at least 1".into());
        }
        Ok(())
    }
}

impl Default for WindowConfig {
    fn default() -> Self {
        Self::new(QUEUE_DEFAULT, WINDOW_DEFAULT)
    }
}

/// Where an arriving connection goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// The server's accept queue has room: it serves the connection.
    Server,
    /// Admitted speculatively: migratory, to be migrated to a peer.
    Migrate,
    /// Neither the queue nor the window has room.
    Refuse,
}

/// Where the steering program sends a SYN in the kernel mode (`bpf/steer.bpf.c`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SynVerdict {
    /// The server's listener (the normal lookup).
    Server,
    /// The daemon's admission listener: admitted speculatively.
    Daemon,
    /// Dropped silently, as at a full accept queue (the client retransmits the SYN).
    Drop,
}

/// What a SYN meets at Q without room (`specd --no-room`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum NoRoom {
    /// The server's listener: it waits in the server's own backlog (longer than Q:
    /// `farside backend --backlog`, nginx's 511), served when a worker is free.
    #[default]
    Queue,
    /// Dropped silently at backlog ≥ Q, as the kernel drops a SYN at a full accept
    /// queue (the paper's accept queue is Q once its admission window is shut): the
    /// client retransmits it after 1 s, then 3 s, and each retransmission is decided
    /// afresh.
    Drop,
}

/// The kernel mode's rule per SYN, the program's `verdict()` in user space (the
/// program and this function change together; the unit tests pin it). `backlog`: the
/// server's established connections waiting for accept (`sk_ack_backlog`);
/// `half_open`: its request socks (`icsk_accept_queue.qlen`); `room`: the window is
/// open and has room; `no_room`: what a SYN meets at Q without room.
///
/// - Q counts every connection the server's listener has admitted, half-open ones
///   too: a burst's SYNs arrive before their predecessors' handshakes finish, and
///   counted by the backlog alone they all went to the server, past Q.
/// - Without room, [`NoRoom::Queue`]: the server (the connection waits in its own
///   backlog). [`NoRoom::Drop`]: the paper's enlarged accept queue is back to Q, and
///   the kernel drops a SYN at a full queue: the program drops it at backlog ≥ Q.
///   Only established connections count for that: spoofed SYNs (a SYN flood) make
///   half-open ones, never established ones, so they cannot make the program drop a
///   legitimate SYN (the kernel's own request-queue limit and SYN cookies deal with
///   them at the server's listener).
pub fn syn_verdict(
    queue: u32,
    backlog: u32,
    half_open: u32,
    room: bool,
    no_room: NoRoom,
) -> SynVerdict {
    if room && backlog.saturating_add(half_open) >= queue {
        SynVerdict::Daemon
    } else if !room && no_room == NoRoom::Drop && backlog >= queue {
        SynVerdict::Drop
    } else {
        SynVerdict::Server
    }
}

/// How a migratory connection's migration ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resolution {
    /// The target took it.
    Migrated,
    /// The target refused (its own load): served locally, the window closes.
    Refused,
    /// The target was unreachable, died or failed to restore: served locally, the
    /// window closes.
    TargetFailed,
    /// Its state could not be fully dumped: never offered, served locally; the
    /// window is unchanged.
    NotDumpable,
    /// Every peer's known load said full (`--gate-peer-load`): never offered, served
    /// locally, and the window closes as on a refusal: the source read one-sidedly
    /// what the target would have answered, without paying for the dump and the offer.
    /// It reopens as after a refusal, or when a peer's load shows room for a whole
    /// window ([`Window::on_peer_room`]).
    NoPeerRoom,
}

/// Counters of a window's life (for metrics and the exit summary).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WindowStats {
    /// Arrivals sent to the server.
    pub to_server: u64,
    /// Arrivals admitted speculatively.
    pub migratory: u64,
    /// Arrivals refused.
    pub refused_arrivals: u64,
    /// Resolutions by kind.
    pub migrated: u64,
    /// Migrations the target refused.
    pub target_refusals: u64,
    /// Migrations that failed at the target.
    pub target_failures: u64,
    /// Migratory connections that could not be dumped.
    pub not_dumpable: u64,
    /// Migratory connections kept because no peer had room.
    pub no_peer_room: u64,
    /// Times the window went from open to closed.
    pub closures: u64,
    /// Reopenings by a target's notification.
    pub reopened_by_notification: u64,
    /// Reopenings after N locally served requests.
    pub reopened_by_service: u64,
    /// Reopenings because a peer's load, read one-sidedly, showed room for a whole
    /// window (`--gate-peer-load`).
    pub reopened_by_peer_load: u64,
    /// Connections the local server did not take within the re-offer bound that
    /// became migratory again ([`Window::on_local_wait`]).
    pub reoffered: u64,
}

/// The admission window. See the module doc for the state machine.
#[derive(Clone, Debug)]
pub struct Window {
    cfg: WindowConfig,
    /// Current size: `cfg.window` when open, 0 when closed.
    size: u32,
    /// Migratory connections admitted and not yet resolved.
    in_flight: u32,
    /// Migratory connections that stayed here and wait for the local server to take
    /// them ([`Window::on_fell_back`]).
    falling_back: u32,
    /// Requests served locally since the window closed.
    served_since_close: u64,
    stats: WindowStats,
}

impl Window {
    /// An open window (the paper starts with the full admission queue).
    pub fn new(cfg: WindowConfig) -> Self {
        Self {
            cfg,
            size: cfg.window,
            in_flight: 0,
            falling_back: 0,
            served_since_close: 0,
            stats: WindowStats::default(),
        }
    }

    /// The configuration.
    pub fn config(&self) -> WindowConfig {
        self.cfg
    }

    /// Current window size (0 when closed).
    pub fn size(&self) -> u32 {
        self.size
    }

    /// Whether the window is open (a configured window of 0 is never open).
    pub fn is_open(&self) -> bool {
        self.size > 0
    }

    /// Migratory connections in flight.
    pub fn in_flight(&self) -> u32 {
        self.in_flight
    }

    /// Migratory connections resolved here and not yet taken by the local server.
    pub fn falling_back(&self) -> u32 {
        self.falling_back
    }

    /// Whether one more connection could be admitted speculatively now: the window
    /// bounds every speculatively admitted connection no server has taken yet, those
    /// migrating and those that fell back and wait for the local server.
    pub fn has_room(&self) -> bool {
        self.in_flight + self.falling_back < self.size
    }

    /// Whether an arrival now would go to the daemon rather than the server: the
    /// server's queue is at `Q` and the window has room. This is what steering
    /// (the sk_lookup program's flag) follows.
    pub fn diverts(&self, server_queue: u32) -> bool {
        server_queue >= self.cfg.queue && self.has_room()
    }

    /// Counters so far.
    pub fn stats(&self) -> WindowStats {
        self.stats
    }

    /// A connection arrives while the server's accept queue holds `server_queue`.
    pub fn on_arrival(&mut self, server_queue: u32) -> Decision {
        if server_queue < self.cfg.queue {
            self.stats.to_server += 1;
            Decision::Server
        } else if self.has_room() {
            self.in_flight += 1;
            self.stats.migratory += 1;
            Decision::Migrate
        } else {
            self.stats.refused_arrivals += 1;
            Decision::Refuse
        }
    }

    /// A migratory connection's migration ended. A resolution without a connection
    /// in flight is a caller bug: it is ignored (and asserted in debug builds).
    pub fn on_resolved(&mut self, r: Resolution) {
        debug_assert!(
            self.in_flight > 0,
            "resolution {r:?} with nothing in flight"
        );
        if self.in_flight == 0 {
            return;
        }
        self.in_flight -= 1;
        self.count(r);
    }

    /// A migratory connection was not moved (`r`: refused, failed, not dumpable, no
    /// peer with room) and is handed to the local server: resolved as by
    /// [`Window::on_resolved`] (the window closes on a refusal or a failure), but it
    /// keeps its place in the window until [`Window::on_handed_locally`]. So when the
    /// local server cannot take its fall-backs (both nodes saturated), they stop
    /// further admissions instead of piling up in front of it: the window bounds what
    /// speculation holds on this node. A resolution without a connection in flight
    /// is a caller bug: ignored (asserted in debug builds).
    pub fn on_fell_back(&mut self, r: Resolution) {
        debug_assert!(
            self.in_flight > 0 && r != Resolution::Migrated,
            "fall-back {r:?} with {} in flight",
            self.in_flight
        );
        if self.in_flight == 0 || r == Resolution::Migrated {
            return;
        }
        self.in_flight -= 1;
        self.falling_back += 1;
        self.count(r);
    }

    /// A connection that fell back was taken by the local server (or closed): its
    /// place in the window is free.
    pub fn on_handed_locally(&mut self) {
        debug_assert!(self.falling_back > 0, "hand-off with nothing falling back");
        self.falling_back = self.falling_back.saturating_sub(1);
    }

    fn count(&mut self, r: Resolution) {
        match r {
            Resolution::Migrated => self.stats.migrated += 1,
            Resolution::NotDumpable => self.stats.not_dumpable += 1,
            Resolution::NoPeerRoom => {
                self.stats.no_peer_room += 1;
                self.close();
            }
            Resolution::Refused => {
                self.stats.target_refusals += 1;
                self.close();
            }
            Resolution::TargetFailed => {
                self.stats.target_failures += 1;
                self.close();
            }
        }
    }

    /// A connection the local server has not taken within the re-offer bound (it
    /// waits in the hand-off queue: the server's workers are all held) may be offered
    /// to a peer instead of waiting on: it is, and becomes migratory again (in
    /// flight; `true`), if the window is open and has room for it, counting the place
    /// it already holds when it is a fall-back (`holds_place`: resolved here and not
    /// yet taken, [`Window::on_fell_back`]). Otherwise nothing changes (`false`): it
    /// keeps waiting for the local server (or for the window to reopen).
    pub fn on_local_wait(&mut self, holds_place: bool) -> bool {
        if !self.is_open() {
            return false;
        }
        if holds_place && self.falling_back > 0 {
            self.falling_back -= 1;
        } else if !self.has_room() {
            return false;
        }
        self.in_flight += 1;
        self.stats.reoffered += 1;
        true
    }

    /// A target notified that it can take connections again.
    pub fn on_notification(&mut self) {
        if !self.is_open() && self.cfg.window > 0 {
            self.size = self.cfg.window;
            self.stats.reopened_by_notification += 1;
        }
    }

    /// A peer's load, read one-sidedly, shows room for a whole window (its accept
    /// backlog plus the migrations to it in flight plus W below its admission bound):
    /// a closed window reopens, as on that peer's notification.
    pub fn on_peer_room(&mut self) {
        if !self.is_open() && self.cfg.window > 0 {
            self.size = self.cfg.window;
            self.stats.reopened_by_peer_load += 1;
        }
    }

    /// `n` requests were served locally (by the server, or connections that fell
    /// back to it). Reopens a closed window once `N` were served since it closed.
    pub fn on_served_locally(&mut self, n: u64) {
        if self.is_open() || self.cfg.window == 0 {
            return;
        }
        self.served_since_close = self.served_since_close.saturating_add(n);
        if self.served_since_close >= u64::from(self.cfg.reopen_after) {
            self.size = self.cfg.window;
            self.stats.reopened_by_service += 1;
        }
    }

    fn close(&mut self) {
        if self.is_open() {
            self.stats.closures += 1;
        }
        self.size = 0;
        self.served_since_close = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kernel_rule_counts_half_open_connections_and_drops_only_on_established_ones() {
        use SynVerdict::*;
        let v = |b, h, room| syn_verdict(4, b, h, room, NoRoom::Drop);
        // Below Q: the server, with or without room.
        assert_eq!(v(3, 0, true), Server);
        assert_eq!(v(3, 0, false), Server);
        // A burst: 1 established and 3 half-open make Q: the daemon.
        assert_eq!(v(1, 3, true), Daemon);
        assert_eq!(v(0, 4, true), Daemon);
        assert_eq!(v(4, 0, true), Daemon);
        // Without room: dropped once the established ones alone reach Q…
        assert_eq!(v(4, 0, false), Drop);
        assert_eq!(v(9, 7, false), Drop);
        // …but half-open ones (a SYN flood's spoofed SYNs) never make it drop.
        assert_eq!(v(3, 1000, false), Server);
        assert_eq!(v(0, u32::MAX, false), Server);
        // No overflow at the extremes.
        assert_eq!(v(u32::MAX, u32::MAX, true), Daemon);
        // The window's own view agrees where half-open is 0.
        let w = Window::new(WindowConfig::new(4, 2));
        for q in 0..8 {
            assert_eq!(v(q, 0, w.has_room()) == Daemon, w.diverts(q));
        }
    }

    #[test]
    fn without_room_the_default_leaves_every_syn_to_the_server() {
        use SynVerdict::*;
        assert_eq!(NoRoom::default(), NoRoom::Queue);
        for (b, h) in [(0, 0), (3, 1), (4, 0), (9, 7), (u32::MAX, u32::MAX)] {
            assert_eq!(syn_verdict(4, b, h, false, NoRoom::Queue), Server);
        }
        // With room the choice changes nothing.
        assert_eq!(syn_verdict(4, 1, 3, true, NoRoom::Queue), Daemon);
        assert_eq!(syn_verdict(4, 3, 0, true, NoRoom::Queue), Server);
    }

    fn win(q: u32, w: u32) -> Window {
        Window::new(WindowConfig::new(q, w))
    }

    #[test]
    fn a_connection_the_local_server_does_not_take_is_offered_again_only_while_open() {
        let mut w = Window::new(WindowConfig {
            queue: 4,
            window: 2,
            reopen_after: 2,
        });
        // A migration refused: the window closes, the fall-back keeps its place.
        assert_eq!(w.on_arrival(4), Decision::Migrate);
        w.on_fell_back(Resolution::Refused);
        assert!(!w.is_open());
        assert_eq!((w.in_flight(), w.falling_back()), (0, 1));
        // Closed: the fall-back waits on for the local server, nothing changes.
        assert!(!w.on_local_wait(true));
        assert_eq!((w.in_flight(), w.falling_back()), (0, 1));
        // A stale divert (no place) is not admitted while closed either.
        assert!(!w.on_local_wait(false));
        // Reopened by the target's notification: the fall-back's place moves to in
        // flight (no new place is taken), and it can be offered again.
        w.on_notification();
        assert!(w.on_local_wait(true));
        assert_eq!((w.in_flight(), w.falling_back()), (1, 0));
        // A stale divert takes a new place while there is room...
        assert!(w.on_local_wait(false));
        assert_eq!(w.in_flight(), 2);
        // ...and not past W.
        assert!(!w.on_local_wait(false));
        assert_eq!(w.in_flight(), 2);
        assert_eq!(w.stats().reoffered, 2);
        // Both resolve as any migration does: a second refusal closes it again.
        w.on_resolved(Resolution::Migrated);
        w.on_resolved(Resolution::Migrated);
        assert_eq!((w.in_flight(), w.falling_back()), (0, 0));
    }

    #[test]
    fn a_full_window_still_lets_a_fall_back_be_offered_again_in_its_own_place() {
        let mut w = Window::new(WindowConfig {
            queue: 4,
            window: 1,
            reopen_after: 1,
        });
        assert_eq!(w.on_arrival(9), Decision::Migrate);
        w.on_fell_back(Resolution::NotDumpable);
        // The window is open and full (its one place is this fall-back's).
        assert!(w.is_open() && !w.has_room());
        assert!(w.on_local_wait(true));
        assert_eq!((w.in_flight(), w.falling_back()), (1, 0));
    }

    #[test]
    fn fall_backs_hold_their_place_until_the_local_server_takes_them() {
        let mut w = Window::new(WindowConfig {
            queue: 64,
            window: 2,
            reopen_after: 2,
        });
        assert_eq!(w.on_arrival(64), Decision::Migrate);
        assert_eq!(w.on_arrival(64), Decision::Migrate);
        // Not dumpable: the window stays open, but the connection waits for the local
        // server and keeps its place.
        w.on_fell_back(Resolution::NotDumpable);
        assert!(w.is_open());
        assert_eq!((w.in_flight(), w.falling_back()), (1, 1));
        assert!(!w.has_room());
        assert_eq!(w.on_arrival(64), Decision::Refuse);
        w.on_handed_locally();
        assert!(w.has_room() && w.diverts(64));
        // Refused: the window closes as on_resolved closes it; after it reopens, the
        // waiting fall-back still counts against it.
        w.on_fell_back(Resolution::Refused);
        assert!(!w.is_open());
        assert_eq!(w.stats().target_refusals, 1);
        w.on_notification();
        assert!(w.is_open());
        assert_eq!(w.on_arrival(64), Decision::Migrate);
        assert_eq!(w.on_arrival(64), Decision::Refuse);
        w.on_handed_locally();
        assert_eq!(w.on_arrival(64), Decision::Migrate);
        assert_eq!((w.in_flight(), w.falling_back()), (2, 0));
    }

    #[test]
    fn arrivals_go_to_the_server_while_its_queue_has_room() {
        let mut w = win(64, 32);
        for q in 0..64 {
            assert_eq!(w.on_arrival(q), Decision::Server);
        }
        assert_eq!(w.in_flight(), 0);
    }

    #[test]
    fn a_full_queue_admits_exactly_the_window_then_refuses() {
        let mut w = win(64, 32);
        for _ in 0..32 {
            assert_eq!(w.on_arrival(64), Decision::Migrate);
        }
        assert_eq!(w.in_flight(), 32);
        assert!(!w.diverts(64));
        assert_eq!(w.on_arrival(64), Decision::Refuse);
        w.on_resolved(Resolution::Migrated);
        assert!(w.diverts(64));
        assert_eq!(w.on_arrival(100), Decision::Migrate);
        assert_eq!(w.stats().refused_arrivals, 1);
    }

    #[test]
    fn a_refusal_closes_the_window_and_a_notification_reopens_it() {
        let mut w = win(64, 32);
        assert_eq!(w.on_arrival(64), Decision::Migrate);
        assert_eq!(w.on_arrival(64), Decision::Migrate);
        w.on_resolved(Resolution::Refused);
        assert!(!w.is_open());
        assert_eq!(w.size(), 0);
        // The one still in flight finishes; nothing new is admitted.
        assert_eq!(w.on_arrival(64), Decision::Refuse);
        w.on_resolved(Resolution::Migrated);
        assert_eq!(w.on_arrival(64), Decision::Refuse);
        // The server's queue still works while the window is closed.
        assert_eq!(w.on_arrival(10), Decision::Server);
        w.on_notification();
        assert!(w.is_open());
        assert_eq!(w.size(), 32);
        assert_eq!(w.on_arrival(64), Decision::Migrate);
        let s = w.stats();
        assert_eq!((s.closures, s.reopened_by_notification), (1, 1));
    }

    #[test]
    fn a_full_peer_closes_the_window_and_its_room_reopens_it() {
        let mut w = win(64, 32);
        assert_eq!(w.on_arrival(64), Decision::Migrate);
        w.on_resolved(Resolution::NoPeerRoom);
        assert!(!w.is_open(), "the gate closes as a refusal would");
        assert_eq!(w.on_arrival(64), Decision::Refuse);
        w.on_peer_room();
        assert!(w.is_open());
        assert_eq!(w.size(), 32);
        // Room reported to an open window changes nothing.
        w.on_peer_room();
        let s = w.stats();
        assert_eq!(
            (s.no_peer_room, s.closures, s.reopened_by_peer_load),
            (1, 1, 1)
        );
    }

    #[test]
    fn a_closed_window_reopens_after_n_locally_served_requests() {
        let mut w = Window::new(WindowConfig {
            queue: 64,
            window: 50,
            reopen_after: 50,
        });
        w.on_arrival(64);
        w.on_resolved(Resolution::TargetFailed);
        assert!(!w.is_open());
        w.on_served_locally(49);
        assert!(!w.is_open());
        w.on_served_locally(1);
        assert!(w.is_open());
        assert_eq!(w.size(), 50);
        assert_eq!(w.stats().reopened_by_service, 1);
        // Served requests while open do not bank credit for the next closure.
        w.on_served_locally(1000);
        w.on_arrival(64);
        w.on_resolved(Resolution::Refused);
        w.on_served_locally(49);
        assert!(!w.is_open());
    }

    #[test]
    fn an_undumpable_connection_leaves_the_window_open() {
        let mut w = win(64, 32);
        w.on_arrival(64);
        w.on_resolved(Resolution::NotDumpable);
        assert!(w.is_open());
        assert_eq!(w.in_flight(), 0);
    }

    #[test]
    fn a_notification_to_an_open_window_changes_nothing() {
        let mut w = win(64, 32);
        w.on_notification();
        assert_eq!(w.stats().reopened_by_notification, 0);
        assert_eq!(w.size(), 32);
    }

    #[test]
    fn a_zero_window_is_plain_acc_q() {
        let mut w = win(64, 0);
        assert_eq!(w.on_arrival(64), Decision::Refuse);
        w.on_notification();
        w.on_served_locally(100);
        assert_eq!(w.on_arrival(64), Decision::Refuse);
        assert_eq!(w.on_arrival(63), Decision::Server);
    }

    #[test]
    fn config_bounds_are_checked() {
        assert!(WindowConfig::new(64, 32).validate().is_ok());
        assert!(WindowConfig::new(0, 32).validate().is_err());
        assert!(WindowConfig::new(64, QUEUE_WINDOW_MAX + 1)
            .validate()
            .is_err());
        let mut c = WindowConfig::new(64, 32);
        c.reopen_after = 0;
        assert!(c.validate().is_err());
    }
}
