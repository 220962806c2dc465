//! The lab's reads of a node's `/coop/stats` (the cooperating node's counters, and
//! the anchor's origins'): one GET on a fresh connection, bounded.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// Time for one read or write: far above a loaded node's latency, it only unsticks the
/// lab from a dead node (whose counters then read as empty).
const STATS_IO_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest response head accepted.
const HEAD_BYTES_MAX: usize = 16 * 1024;
/// Largest `/coop/stats` body read.
const STATS_BYTES_MAX: u64 = 64 * 1024;

/// The value of counter `key` in a `/coop/stats` text (0 if absent).
pub fn stat(text: &str, key: &str) -> u64 {
    text.lines()
        .filter_map(|l| l.split_once(' '))
        .find(|(k, _)| *k == key)
        .and_then(|(_, v)| v.trim().parse().ok())
        .unwrap_or(0)
}

fn get(addr: SocketAddr, path: &str) -> io::Result<Vec<u8>> {
    let s = TcpStream::connect_timeout(&addr, STATS_IO_TIMEOUT)?;
    s.set_read_timeout(Some(STATS_IO_TIMEOUT))?;
    s.set_write_timeout(Some(STATS_IO_TIMEOUT))?;
    let mut r = BufReader::new(s);
    write!(
        r.get_mut(),
        "GET {path} HTTP/1.1\r\nHost: farside\r\nConnection: close\r\n\r\n"
    )?;
    let bad = |m: &str| io::Error::new(io::ErrorKind::InvalidData, m.to_string());
    let (mut len, mut head) = (None, 0usize);
    loop {
        let mut line = String::new();
        let n = r.read_line(&mut line)?;
        head += n;
        if n == 0 || head > HEAD_BYTES_MAX {
            return Err(bad("closed or oversized head"));
        }
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        if let Some((k, v)) = line.split_once(':') {
            if k.trim().eq_ignore_ascii_case("content-length") {
                len = Some(v.trim().parse::<u64>().map_err(|_| bad("content-length"))?);
            }
        }
    }
    let len = len.ok_or_else(|| bad("no content-length"))?;
    if len > STATS_BYTES_MAX {
        return Err(bad("body too large"));
    }
    let mut body = vec![0u8; len as usize];
    r.read_exact(&mut body)?;
    Ok(body)
}

/// The node's `/coop/stats` text; empty if it cannot be read.
pub fn stats(addr: SocketAddr) -> String {
    get(addr, "/coop/stats")
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_lines_parse() {
        let t = "local_hits 5\nremote_hits 7\n";
        assert_eq!(stat(t, "remote_hits"), 7);
        assert_eq!(stat(t, "misses"), 0);
    }
}
