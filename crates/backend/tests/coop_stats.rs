//! `--coop-stats-listen`: `/coop/stats` on a listener of its own answers while the main
//! listener's only worker is held by a kept-alive connection, with the same counters the
//! main listener answers once it is free; other paths and methods are refused. And,
//! watched through it: a second request for an object whose disk read is under way
//! takes that read's body instead of reading it again.

use farside_backend::coop::CoopArgs;
use farside_backend::{spawn, BackendArgs};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};

struct Dir(std::path::PathBuf);
impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// One request on a fresh connection, `Connection: close`: (status, body).
fn request(addr: SocketAddr, line: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    write!(s, "{line} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
    let mut all = Vec::new();
    s.read_to_end(&mut all).unwrap();
    let text = String::from_utf8_lossy(&all).into_owned();
    let status = text[9..12].parse().unwrap();
    let body = text.split_once("\r\n\r\n").unwrap().1.to_string();
    (status, body)
}

/// Reads one response with a Content-Length from a kept-alive connection: its body.
fn read_response(r: &mut BufReader<TcpStream>) -> Vec<u8> {
    let mut len = 0usize;
    loop {
        let mut line = String::new();
        r.read_line(&mut line).unwrap();
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        if let Some((k, v)) = line.split_once(':') {
            if k.eq_ignore_ascii_case("content-length") {
                len = v.trim().parse().unwrap();
            }
        }
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body).unwrap();
    body
}

fn stat(text: &str, key: &str) -> Option<u64> {
    text.lines()
        .filter_map(|l| l.split_once(' '))
        .find(|(k, _)| *k == key)
        .and_then(|(_, v)| v.parse().ok())
}

#[test]
fn stats_answer_on_their_own_listener_while_the_only_worker_is_held() {
    let dir = std::env::temp_dir().join(format!("farside-coop-stats-{}", std::process::id()));
    let _guard = Dir(dir.clone());
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("a"), vec![42u8; 3_000]).unwrap();
    let (main, node) = spawn(BackendArgs {
        listen: "127.0.0.1:0".parse().unwrap(),
        root: Some(dir.clone()),
        workers: 1,
        // The held connection stays held for the whole test.
        header_timeout_ms: 600_000,
        coop: CoopArgs {
            coop: true,
            policy: farside_backend::coop::CoopPolicy::Rr,
            disk_latency_us: 0,
            stats_listen: Some("127.0.0.1:0".parse().unwrap()),
            ..CoopArgs::default()
        },
        ..BackendArgs::default()
    })
    .unwrap();
    let stats_addr = node.coop_stats_addr().expect("a bound stats address");

    // The only worker serves one request on a kept-alive connection and then waits on
    // it for the next: it is held until the connection closes.
    let held = TcpStream::connect(main).unwrap();
    let mut held = BufReader::new(held);
    write!(held.get_mut(), "GET /a HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    assert_eq!(read_response(&mut held), vec![42u8; 3_000]);

    // The stats listener answers meanwhile, with the read just made.
    let (status, text) = request(stats_addr, "GET /coop/stats");
    assert_eq!(status, 200, "{text}");
    assert_eq!(stat(&text, "misses"), Some(1), "{text}");
    assert_eq!(stat(&text, "disk_reads"), Some(1), "{text}");
    assert_eq!(stat(&text, "inflight"), Some(0), "{text}");
    assert_eq!(stat(&text, "inflight_max"), Some(1), "{text}");
    assert!(stat(&text, "cache_used_bytes").is_some(), "{text}");
    // Only GET /coop/stats is served there.
    assert_eq!(request(stats_addr, "GET /a").0, 404);
    assert_eq!(request(stats_addr, "POST /coop/stats").0, 405);

    // A stats read queued on the main listener is answered once the worker is free,
    // with the same counters.
    let mut queued = TcpStream::connect(main).unwrap();
    write!(
        queued,
        "GET /coop/stats HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    drop(held);
    let mut all = String::new();
    queued.read_to_string(&mut all).unwrap();
    let main_text = all.split_once("\r\n\r\n").unwrap().1;
    for key in ["misses", "disk_reads", "local_hits", "cache_used_bytes"] {
        assert_eq!(stat(main_text, key), stat(&text, key), "{key}: {main_text}");
    }
    node.stop();
}

#[test]
fn the_stats_listener_is_off_unless_asked_for() {
    let dir = std::env::temp_dir().join(format!("farside-coop-nostats-{}", std::process::id()));
    let _guard = Dir(dir.clone());
    std::fs::create_dir_all(&dir).unwrap();
    let (_, node) = spawn(BackendArgs {
        listen: "127.0.0.1:0".parse().unwrap(),
        root: Some(dir.clone()),
        workers: 1,
        coop: CoopArgs {
            coop: true,
            policy: farside_backend::coop::CoopPolicy::Rr,
            ..CoopArgs::default()
        },
        ..BackendArgs::default()
    })
    .unwrap();
    assert_eq!(node.coop_stats_addr(), None);
    node.stop();
}

/// Waits until the stats at `addr` satisfy `cond` (no time bound asserted: the test
/// harness's own timeout catches a hang).
fn wait_stats(addr: SocketAddr, cond: impl Fn(&str) -> bool) -> String {
    loop {
        let (_, text) = request(addr, "GET /coop/stats");
        if cond(&text) {
            return text;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

#[test]
fn a_request_behind_a_read_of_the_same_object_takes_its_body() {
    let dir = std::env::temp_dir().join(format!("farside-coop-fill-{}", std::process::id()));
    let _guard = Dir(dir.clone());
    std::fs::create_dir_all(&dir).unwrap();
    let body: String = (0..4_000u32)
        .map(|i| (b'a' + (i % 26) as u8) as char)
        .collect();
    std::fs::write(dir.join("slow"), &body).unwrap();
    let (main, node) = spawn(BackendArgs {
        listen: "127.0.0.1:0".parse().unwrap(),
        root: Some(dir.clone()),
        workers: 4,
        coop: CoopArgs {
            coop: true,
            policy: farside_backend::coop::CoopPolicy::Rr,
            // A cache too small for the file: without the fill table the second
            // request would read it again, however late it came.
            cache_bytes: 1,
            // 4,000 B at 2,000 B/s: the first read holds the disk 2 s, so the second
            // request arrives during it on any host that answers within that.
            disk_latency_us: 0,
            disk_bytes_per_s: 2_000,
            stats_listen: Some("127.0.0.1:0".parse().unwrap()),
            ..CoopArgs::default()
        },
        ..BackendArgs::default()
    })
    .unwrap();
    let stats_addr = node.coop_stats_addr().unwrap();
    let first = std::thread::spawn(move || request(main, "GET /slow"));
    wait_stats(stats_addr, |t| stat(t, "disk_queue") == Some(1));
    let second = std::thread::spawn(move || request(main, "GET /slow"));
    let (a, b) = (first.join().unwrap(), second.join().unwrap());
    assert_eq!((a.0, b.0), (200, 200));
    assert_eq!(a.1, body);
    assert_eq!(b.1, body);
    let text = wait_stats(stats_addr, |t| stat(t, "inflight") == Some(0));
    let (reads, followed) = (stat(&text, "disk_reads"), stat(&text, "fill_followed"));
    // Both requests came while the one read was under way (the second was sent once the
    // first sat in the disk, which holds it 2 s), unless the host stalled the second
    // for those 2 s: then it read again, which the counters show and the test names.
    assert_eq!(
        (reads, followed),
        (Some(1), Some(1)),
        "one read, one follower: {text}"
    );
    assert_eq!(stat(&text, "misses"), Some(1), "{text}");
    assert_eq!(stat(&text, "local_hits"), Some(1), "the follower: {text}");
    node.stop();
}
