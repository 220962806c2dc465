//! Who reads the disk on a node: one read per object at a time (a "fill", as nginx's
//! `proxy_cache_lock` has), and a bound on the reads queued.
//!
//! - **Fills**: while a read of an object is under way, a second request for the same
//!   object waits for it and takes its body instead of queueing another read of the
//!   same bytes behind it on the node's one disk arm.
//! - **The queue bound**: a request that would add a read to a disk queue already
//!   holding `queue_max` reads is refused at once ([`Join::Shed`]: the node answers
//!   503) instead of waiting. A node serves every request on a worker thread, and a
//!   request waiting for the disk holds its worker: without the bound, past the disk's
//!   capacity every worker ends up in the disk queue, the node's hits (local, and the
//!   bodies its peers fetch over tcp) wait behind the misses for a worker, the accept
//!   queue overflows and clients' connects back off for seconds. With it, the disk
//!   stays busy (`queue_max` reads queued) and the other workers keep serving hits. A
//!   request following a read under way adds no read and is never refused.
//!
//! Pure: the node keeps a [`Fills`] under a lock and a condition variable and passes
//! its disk's queue length; this module only decides who reads, who waits, who is
//! refused and who gets what.

use std::collections::HashMap;

/// Objects being read at once at most: a node has at most its workers' requests in
/// flight (`farside backend --workers`, 64 in the lab, at most 4,096); past this bound a
/// request reads on its own ([`Join::Full`]) rather than grow the table.
pub const FILLS_MAX: usize = 4096;

/// What a request for an object it does not hold does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Join {
    /// No read of it is under way: this request reads it and then [`Fills::finish`]es.
    Lead,
    /// A read is under way: wait ([`Fills::poll`]) for its body.
    Follow,
    /// The table is full: read it without the table.
    Full,
    /// The disk queue is at its bound: refuse the request (503) without reading.
    Shed,
}

/// What a waiting request finds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Poll<T> {
    /// The read is still under way.
    Pending,
    /// The read ended: its body, or `None` when it failed (then read it yourself).
    Ready(Option<T>),
}

#[derive(Debug)]
enum Entry<T> {
    Reading { followers: u32 },
    Done { value: T, left: u32 },
}

/// The reads under way on one node and the bodies waiting for their followers.
#[derive(Debug)]
pub struct Fills<T> {
    entries: HashMap<u64, Entry<T>>,
    /// Requests that took a body from another's read (`fill_followed` in the stats).
    pub followed: u64,
}

impl<T: Clone> Default for Fills<T> {
    fn default() -> Self {
        Fills {
            entries: HashMap::new(),
            followed: 0,
        }
    }
}

impl<T: Clone> Fills<T> {
    /// A request for `object` asks to read it, with `queued` reads in the node's disk
    /// queue now and at most `queue_max` allowed there (0: no bound).
    pub fn join(&mut self, object: u64, queued: u64, queue_max: u64) -> Join {
        let full = self.entries.len() >= FILLS_MAX;
        let shed = queue_max > 0 && queued >= queue_max;
        match self.entries.get_mut(&object) {
            Some(Entry::Reading { followers }) => {
                *followers += 1;
                Join::Follow
            }
            // The read just ended and its body is still being handed out: take it too.
            Some(Entry::Done { left, .. }) => {
                *left += 1;
                Join::Follow
            }
            None if shed => Join::Shed,
            None if full => Join::Full,
            None => {
                self.entries.insert(object, Entry::Reading { followers: 0 });
                Join::Lead
            }
        }
    }

    /// The leader's read ended with `value` (`None`: it failed). Its followers find it
    /// on their next [`Fills::poll`]; the number of followers waiting.
    pub fn finish(&mut self, object: u64, value: Option<T>) -> u32 {
        let Some(Entry::Reading { followers }) = self.entries.remove(&object) else {
            return 0;
        };
        if let (Some(value), true) = (value, followers > 0) {
            self.entries.insert(
                object,
                Entry::Done {
                    value,
                    left: followers,
                },
            );
        }
        followers
    }

    /// A follower looks for the body of `object`.
    pub fn poll(&mut self, object: u64) -> Poll<T> {
        match self.entries.get_mut(&object) {
            Some(Entry::Reading { .. }) => Poll::Pending,
            Some(Entry::Done { value, left }) => {
                let v = value.clone();
                *left -= 1;
                if *left == 0 {
                    self.entries.remove(&object);
                }
                self.followed += 1;
                Poll::Ready(Some(v))
            }
            // The read failed (or its body was handed out to as many as waited).
            None => Poll::Ready(None),
        }
    }

    /// A follower stops waiting (its wait bound passed) without the body.
    pub fn leave(&mut self, object: u64) {
        match self.entries.get_mut(&object) {
            Some(Entry::Reading { followers }) => *followers = followers.saturating_sub(1),
            Some(Entry::Done { left, .. }) => {
                *left -= 1;
                if *left == 0 {
                    self.entries.remove(&object);
                }
            }
            None => {}
        }
    }

    /// Objects with a read under way or a body not yet handed out.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_read_per_object_and_every_follower_gets_its_body() {
        let mut f: Fills<&str> = Fills::default();
        assert_eq!(f.join(7, 0, 0), Join::Lead);
        assert_eq!(f.join(7, 0, 0), Join::Follow);
        assert_eq!(f.join(7, 0, 0), Join::Follow);
        assert_eq!(
            f.join(8, 0, 0),
            Join::Lead,
            "another object reads on its own"
        );
        assert_eq!(f.poll(7), Poll::Pending);
        assert_eq!(f.finish(7, Some("body")), 2);
        assert_eq!(f.poll(7), Poll::Ready(Some("body")));
        assert_eq!(f.poll(7), Poll::Ready(Some("body")));
        assert_eq!(f.followed, 2);
        assert_eq!(f.len(), 1, "7 handed out to both and gone; 8 still read");
        assert_eq!(f.finish(8, Some("b8")), 0);
        assert!(f.is_empty(), "nobody waited for 8: nothing kept");
        assert_eq!(f.join(7, 0, 0), Join::Lead, "a later request reads again");
    }

    #[test]
    fn past_the_queue_bound_a_new_read_is_refused_but_a_follower_is_not() {
        let mut f: Fills<u8> = Fills::default();
        assert_eq!(f.join(1, 3, 4), Join::Lead, "below the bound");
        assert_eq!(f.join(2, 4, 4), Join::Shed, "at the bound: no new read");
        assert_eq!(f.join(1, 9, 4), Join::Follow, "following adds no read");
        assert_eq!(f.join(3, 1_000, 0), Join::Lead, "0: no bound");
        assert_eq!(f.len(), 2, "a refused request leaves nothing in the table");
    }

    #[test]
    fn a_failed_read_sends_its_followers_to_read_themselves() {
        let mut f: Fills<u8> = Fills::default();
        assert_eq!(f.join(1, 0, 0), Join::Lead);
        assert_eq!(f.join(1, 0, 0), Join::Follow);
        assert_eq!(f.finish(1, None), 1);
        assert_eq!(f.poll(1), Poll::Ready(None));
        assert!(f.is_empty());
    }

    #[test]
    fn a_follower_that_leaves_is_not_waited_for() {
        let mut f: Fills<u8> = Fills::default();
        f.join(1, 0, 0);
        f.join(1, 0, 0);
        f.join(1, 0, 0);
        f.leave(1);
        assert_eq!(f.finish(1, Some(5)), 1);
        assert_eq!(f.poll(1), Poll::Ready(Some(5)));
        assert!(f.is_empty(), "the one left got it; nothing kept");
        // Leaving after the read ended releases the body too.
        f.join(2, 0, 0);
        f.join(2, 0, 0);
        f.finish(2, Some(6));
        f.leave(2);
        assert!(f.is_empty());
    }

    #[test]
    fn a_full_table_reads_without_it_and_a_body_being_handed_out_is_shared() {
        let mut f: Fills<u8> = Fills::default();
        for o in 0..FILLS_MAX as u64 {
            assert_eq!(f.join(o, 0, 0), Join::Lead);
        }
        assert_eq!(f.join(u64::MAX, 0, 0), Join::Full);
        assert_eq!(
            f.join(0, 0, 0),
            Join::Follow,
            "a read under way is still joined"
        );
        f.finish(0, Some(1));
        assert_eq!(f.join(0, 0, 0), Join::Follow, "handing out: take it too");
        assert_eq!(f.poll(0), Poll::Ready(Some(1)));
        assert_eq!(f.poll(0), Poll::Ready(Some(1)));
        assert_eq!(f.poll(0), Poll::Ready(None), "all handed out");
        assert_eq!(f.finish(u64::MAX, Some(1)), 0, "a read not in the table");
    }
}
