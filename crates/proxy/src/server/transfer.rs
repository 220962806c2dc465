//! What an exchange moves bytes with: read buffers allocated only while bytes wait
//! (`Buf`), progress through a message body (`Body`), a body transfer's deadlines
//! (`Pace`), and writes bounded by a deadline.

use super::generation::Shared;
use crate::http::{BodyFraming, ChunkError, Chunked};
use crate::metrics::Metrics;
use std::io;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::{timeout_at, Instant};

pub(super) async fn write_all_timeout(
    s: &mut TcpStream,
    data: &[u8],
    limit: Duration,
) -> io::Result<()> {
    write_all_until(s, data, Instant::now() + limit).await
}

pub(super) async fn write_all_until(
    s: &mut TcpStream,
    data: &[u8],
    deadline: Instant,
) -> io::Result<()> {
    match timeout_at(deadline, s.write_all(data)).await {
        Ok(r) => r,
        Err(_) => Err(io::ErrorKind::TimedOut.into()),
    }
}

/// Deadline of one body transfer: a total bound, and after a grace period a minimum
/// average rate (as Apache's mod_reqtimeout `body=20,MinRate=500`). A transfer that has
/// moved `bytes` must move more by `start + grace + bytes / rate`, and must end by
/// `start + total` whatever its rate. Every wait of the transfer is bounded by
/// [`Pace::until`], so a trickling peer cannot hold a client slot, an upstream
/// connection and a back-end worker beyond these.
pub(super) struct Pace {
    pub(super) start: Instant,
    pub(super) total: Duration,
    pub(super) grace: Duration,
    pub(super) rate_bytes_per_s: u64,
    pub(super) bytes: u64,
}

impl Pace {
    pub(super) fn new(sh: &Shared, start: Instant, total: Duration) -> Self {
        Pace {
            start,
            total,
            grace: sh.body_rate_grace,
            rate_bytes_per_s: sh.cfg.http.body_min_rate_bytes_per_s,
            bytes: 0,
        }
    }

    pub(super) fn moved(&mut self, n: usize) {
        self.bytes = self.bytes.saturating_add(n as u64);
    }

    /// When the transfer fails unless it moves more bytes (or ends) first.
    pub(super) fn deadline(&self) -> Instant {
        if self.rate_bytes_per_s == 0 {
            return self.start + self.total;
        }
        let earned_us = u128::from(self.bytes) * 1_000_000 / u128::from(self.rate_bytes_per_s);
        let by_rate = self.grace.saturating_add(Duration::from_micros(
            u64::try_from(earned_us).unwrap_or(u64::MAX),
        ));
        self.start + by_rate.min(self.total)
    }

    /// The deadline of one wait that has its own limit `per_wait` too.
    pub(super) fn until(&self, per_wait: Duration) -> Instant {
        self.deadline().min(Instant::now() + per_wait)
    }
}

/// `write_all` of `a` then `b`, as vectored writes.
pub(super) async fn write_two(
    s: &mut TcpStream,
    a: &[u8],
    b: &[u8],
    deadline: Instant,
) -> io::Result<()> {
    let all = async {
        let (mut a, mut b) = (a, b);
        while !a.is_empty() || !b.is_empty() {
            let n = if a.is_empty() {
                s.write(b).await?
            } else if b.is_empty() {
                s.write(a).await?
            } else {
                s.write_vectored(&[io::IoSlice::new(a), io::IoSlice::new(b)])
                    .await?
            };
            if n == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            let from_a = n.min(a.len());
            a = &a[from_a..];
            b = &b[n - from_a..];
        }
        Ok(())
    };
    match timeout_at(deadline, all).await {
        Ok(r) => r,
        Err(_) => Err(io::ErrorKind::TimedOut.into()),
    }
}

/// A read buffer with a consumed prefix: `data[start..end]` is unread.
pub(super) struct Buf {
    pub(super) data: Vec<u8>,
    pub(super) start: usize,
    pub(super) end: usize,
    /// Size allocated when bytes are ready to read (allocation is deferred: most
    /// connections that never reach a back-end never need the upstream buffer, and a
    /// connection idle between requests holds none, see [`Buf::release`]).
    pub(super) initial: usize,
    /// Where the bytes allocated are accounted (`farside_proxy_connection_buffer_bytes`).
    pub(super) metrics: Arc<Metrics>,
}

impl Buf {
    pub(super) fn new(initial: usize, metrics: Arc<Metrics>) -> Self {
        Buf {
            data: Vec::new(),
            start: 0,
            end: 0,
            initial,
            metrics,
        }
    }

    /// Free the storage if nothing is buffered (a keep-alive connection waiting for its
    /// next request, as nginx frees its buffers then): idle connections cost no buffer.
    pub(super) fn release(&mut self) {
        if self.is_empty() && !self.data.is_empty() {
            self.metrics
                .here()
                .conn_buffer_bytes
                .fetch_sub(self.data.len() as u64, Relaxed);
            self.data = Vec::new();
        }
    }

    pub(super) fn filled(&self) -> &[u8] {
        &self.data[self.start..self.end]
    }

    pub(super) fn len(&self) -> usize {
        self.end - self.start
    }

    pub(super) fn is_empty(&self) -> bool {
        self.start == self.end
    }

    pub(super) fn consume(&mut self, n: usize) {
        debug_assert!(n <= self.len());
        self.start += n;
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
    }

    pub(super) fn clear(&mut self) {
        self.start = 0;
        self.end = 0;
    }

    /// Read once from `s`, growing up to `limit` bytes if full. `Ok(0)` is EOF; a full
    /// buffer at `limit` is an error (callers check their limits before).
    pub(super) async fn read_from(&mut self, s: &mut TcpStream, limit: usize) -> io::Result<usize> {
        if self.data.is_empty() {
            // Allocate only once there is something to read.
            s.readable().await?;
            self.data = vec![0; self.initial.min(limit.max(1))];
            self.metrics
                .here()
                .conn_buffer_bytes
                .fetch_add(self.data.len() as u64, Relaxed);
        }
        if self.end == self.data.len() {
            if self.start > 0 {
                self.data.copy_within(self.start..self.end, 0);
                self.end -= self.start;
                self.start = 0;
            } else if self.data.len() < limit {
                let grown = (self.data.len() * 2).min(limit);
                self.metrics
                    .here()
                    .conn_buffer_bytes
                    .fetch_add((grown - self.data.len()) as u64, Relaxed);
                self.data.resize(grown, 0);
            } else {
                return Err(io::Error::other("read buffer full"));
            }
        }
        let n = s.read(&mut self.data[self.end..]).await?;
        self.end += n;
        Ok(n)
    }
}

impl Drop for Buf {
    fn drop(&mut self) {
        self.metrics
            .here()
            .conn_buffer_bytes
            .fetch_sub(self.data.len() as u64, Relaxed);
    }
}

/// Progress through a message body.
pub(super) enum Body {
    Done,
    Length(u64),
    Chunked { scan: Chunked, decode: bool },
    UntilClose,
}

impl Body {
    pub(super) fn new(framing: BodyFraming, decode: bool) -> Self {
        match framing {
            BodyFraming::None => Body::Done,
            BodyFraming::Length(n) => Body::Length(n),
            BodyFraming::Chunked => Body::Chunked {
                scan: Chunked::new(),
                decode,
            },
            BodyFraming::Close => Body::UntilClose,
        }
    }

    pub(super) fn is_done(&self) -> bool {
        matches!(self, Body::Done)
    }

    pub(super) fn decodes(&self) -> bool {
        matches!(self, Body::Chunked { decode: true, .. })
    }

    /// How many leading bytes of `input` belong to the body; afterwards `is_done` says
    /// whether it is complete. A decoding body appends its payload to `decoded`.
    pub(super) fn advance(
        &mut self,
        input: &[u8],
        decoded: &mut Vec<u8>,
    ) -> Result<usize, ChunkError> {
        let n = match self {
            Body::Done => 0,
            Body::UntilClose => input.len(),
            Body::Length(rest) => {
                let n = usize::try_from(*rest)
                    .unwrap_or(usize::MAX)
                    .min(input.len());
                *rest -= n as u64;
                if *rest == 0 {
                    *self = Body::Done;
                }
                n
            }
            Body::Chunked { scan, decode } => {
                let end = if *decode {
                    scan.feed(input, &mut |d| decoded.extend_from_slice(d))?
                } else {
                    scan.feed(input, &mut |_| {})?
                };
                match end {
                    Some(n) => {
                        *self = Body::Done;
                        n
                    }
                    None => input.len(),
                }
            }
        };
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pace(total_ms: u64, grace_ms: u64, rate_bytes_per_s: u64) -> Pace {
        Pace {
            start: Instant::now(),
            total: Duration::from_millis(total_ms),
            grace: Duration::from_millis(grace_ms),
            rate_bytes_per_s,
            bytes: 0,
        }
    }

    #[test]
    fn pace_deadline_is_grace_plus_earned_time_capped_by_total() {
        let mut p = pace(10_000, 1_000, 1_000);
        assert_eq!(p.deadline() - p.start, Duration::from_secs(1));
        p.moved(500);
        assert_eq!(p.deadline() - p.start, Duration::from_millis(1_500));
        p.moved(1_000_000);
        assert_eq!(
            p.deadline() - p.start,
            Duration::from_secs(10),
            "total caps it"
        );
        // Huge byte counts saturate instead of overflowing.
        p.moved(usize::MAX);
        p.moved(usize::MAX);
        assert_eq!(p.deadline() - p.start, Duration::from_secs(10));
        // Rate 0: the total alone.
        let p = pace(10_000, 1_000, 0);
        assert_eq!(p.deadline() - p.start, Duration::from_secs(10));
        // A wait's own limit applies when it is sooner.
        let p = pace(10_000, 1_000, 0);
        assert!(p.until(Duration::from_millis(5)) < p.start + Duration::from_secs(1));
    }
}
