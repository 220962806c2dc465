//! The node's own stats listener (`--coop-stats-listen ADDR`): `GET /coop/stats` answered
//! on a listener of its own, by a thread of its own, so the counters can be read while
//! every worker of the main listener is busy and its accept queue is full (an overloaded
//! node is the one whose counters matter most).
//!
//! It answers exactly what `/coop/stats` on the main listener answers
//! ([`super::Node::stats_text`]) and nothing else: any other path gets 404, any other
//! method 405. The same trust rule as on the main listener: the counters are read-only
//! figures with no secret in them, answered to whoever can reach the address, so bind it
//! where only the operator's tools reach it (the lab binds it inside each node's
//! namespace). Bounded: at most [`STATS_CONNS_MAX`] connections served at once (more are
//! closed unanswered), one request per connection, a head of at most
//! [`STATS_HEAD_BYTES_MAX`] bytes read within [`STATS_IO_TIMEOUT`].

use super::Node;
use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::Duration;

/// Stats connections served at once; more are closed at accept. Rule: a reader polls
/// once a second per node (the lab: one sampler plus one window read), so 4 leaves room
/// for an operator's tool beside it while a flood of connections costs at most 4 threads.
pub const STATS_CONNS_MAX: usize = 4;
/// Time to receive the request head and to write the answer: a local reader sends its
/// few bytes at once; a silent connection holds one of [`STATS_CONNS_MAX`] this long.
pub const STATS_IO_TIMEOUT: Duration = Duration::from_secs(2);
/// Largest request head read, bytes: `GET /coop/stats` with a few headers fits in far less.
pub const STATS_HEAD_BYTES_MAX: usize = 4096;
/// Accepts stats connections until the node stops (the listener is shut down then).
pub(crate) fn serve(listener: TcpListener, node: Arc<Node>) {
    super::accept::accept_bounded(
        &listener,
        &node,
        STATS_CONNS_MAX,
        ("coop-stats-conn", 64 * 1024),
        |s, n| {
            let _ = answer(s, n);
        },
    );
}

/// What one request gets: (status line, body).
pub(crate) fn route(head: &[u8], node: &Node) -> (&'static str, String) {
    let line = head
        .split(|&b| b == b'\r' || b == b'\n')
        .next()
        .unwrap_or(&[]);
    let mut parts = line.split(|&b| b == b' ');
    match (parts.next(), parts.next()) {
        (Some(b"GET"), Some(b"/coop/stats")) => ("200 OK", node.stats_text()),
        (Some(b"GET"), Some(_)) => ("404 Not Found", "only /coop/stats is served here\n".into()),
        _ => (
            "405 Method Not Allowed",
            "only GET /coop/stats is served here\n".into(),
        ),
    }
}

fn answer(mut s: TcpStream, node: &Node) -> io::Result<()> {
    s.set_read_timeout(Some(STATS_IO_TIMEOUT))?;
    s.set_write_timeout(Some(STATS_IO_TIMEOUT))?;
    let mut head = Vec::with_capacity(256);
    let mut buf = [0u8; 512];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = s.read(&mut buf)?;
        if n == 0 {
            return Ok(());
        }
        head.extend_from_slice(&buf[..n]);
        if head.len() > STATS_HEAD_BYTES_MAX {
            let _ = s.write_all(
                b"HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            );
            return Ok(());
        }
    }
    let (status, body) = route(&head, node);
    let reply = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(reply.as_bytes())
}
