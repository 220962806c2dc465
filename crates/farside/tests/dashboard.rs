//! The live dashboard in a real browser: a proxy with two back-ends (each with its
//! gatherd publishing load in a shm region), some requests, then the page opened in
//! headless Chromium, driven by the DevTools protocol (`--remote-debugging-pipe`).
//! Through the DOM: both back-end rows, their freshness (record age) and the admitted
//! decision counter appear, and change between two looks at the same live page (more
//! requests in between). A screenshot is saved as `$CARGO_TARGET_DIR/dashboard.png`
//! (path printed).
//!
//! Without Chromium (Debian's `chromium`, installed by scripts/setup.sh; or the binary
//! named by `FARSIDE_CHROMIUM`) the browser part is skipped with the reason printed;
//! the page, its assets and the event stream are still checked over plain HTTP.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

mod common;
use common::{free_addr, get_raw, spawn, strings, Dir};

/// Longest one DevTools command may take (Chromium starting, a page loading, a
/// screenshot) on a busy CI machine before the test fails instead of hanging.
const BROWSER_TIMEOUT: Duration = Duration::from_secs(60);
/// Longest the page may take to show live data after it was opened.
const LIVE_TIMEOUT: Duration = Duration::from_secs(30);

/// The Chromium binary, or why there is none.
fn chromium() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("FARSIDE_CHROMIUM") {
        return Ok(PathBuf::from(p));
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    for name in ["chromium", "chromium-browser", "google-chrome"] {
        for dir in std::env::split_paths(&path) {
            let p = dir.join(name);
            if p.is_file() {
                return Ok(p);
            }
        }
    }
    Err(
        "no chromium, chromium-browser or google-chrome on PATH and FARSIDE_CHROMIUM \
         unset (Debian: apt-get install chromium; scripts/setup.sh installs it)"
            .into(),
    )
}

fn pipe() -> (OwnedFd, OwnedFd) {
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two new descriptors into `fds`, which we then own.
    unsafe {
        assert_eq!(libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC), 0);
        (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1]))
    }
}

/// Headless Chromium driven by the DevTools protocol over `--remote-debugging-pipe`
/// (JSON messages ending in NUL; it reads fd 3 and writes fd 4): one page, kept open,
/// so that one live page is looked at twice.
struct Browser {
    child: std::process::Child,
    to: std::fs::File,
    from: mpsc::Receiver<serde_json::Value>,
    next_id: u64,
    session: String,
}

impl Browser {
    fn open(chrome: &Path, profile: &Path, url: &str) -> Browser {
        let (their_in, our_out) = pipe();
        let (our_in, their_out) = pipe();
        let (r, w) = (their_in.as_raw_fd(), their_out.as_raw_fd());
        let mut cmd = Command::new(chrome);
        cmd.args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--hide-scrollbars",
            "--window-size=1500,1150",
            "--remote-debugging-pipe",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg("about:blank")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
        // SAFETY: only async-signal-safe calls (fcntl, dup2) between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                // Move both ends above 4 first, so neither dup2 overwrites the other.
                let (r, w) = (
                    libc::fcntl(r, libc::F_DUPFD, 10),
                    libc::fcntl(w, libc::F_DUPFD, 10),
                );
                if r < 0 || w < 0 || libc::dup2(r, 3) < 0 || libc::dup2(w, 4) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd.spawn().expect("start chromium");
        drop((their_in, their_out));
        let (tx, from) = mpsc::channel();
        let mut input = std::fs::File::from(our_in);
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            let mut chunk = [0u8; 65536];
            while let Ok(n) = input.read(&mut chunk) {
                if n == 0 {
                    break;
                }
                buf.extend_from_slice(&chunk[..n]);
                while let Some(end) = buf.iter().position(|&b| b == 0) {
                    let msg: Vec<u8> = buf.drain(..=end).collect();
                    if let Ok(v) = serde_json::from_slice(&msg[..msg.len() - 1]) {
                        if tx.send(v).is_err() {
                            return;
                        }
                    }
                }
            }
        });
        let mut b = Browser {
            child,
            to: std::fs::File::from(our_out),
            from,
            next_id: 0,
            session: String::new(),
        };
        let t = b.call("Target.createTarget", serde_json::json!({ "url": url }));
        let target = t["targetId"].as_str().unwrap().to_string();
        let s = b.call(
            "Target.attachToTarget",
            serde_json::json!({ "targetId": target, "flatten": true }),
        );
        b.session = s["sessionId"].as_str().unwrap().to_string();
        b
    }

    /// One DevTools command (on the page's session once attached); its result.
    fn call(&mut self, method: &str, params: serde_json::Value) -> serde_json::Value {
        self.next_id += 1;
        let id = self.next_id;
        let mut msg = serde_json::json!({ "id": id, "method": method, "params": params });
        if !self.session.is_empty() {
            msg["sessionId"] = self.session.clone().into();
        }
        let mut bytes = serde_json::to_vec(&msg).unwrap();
        bytes.push(0);
        self.to.write_all(&bytes).expect("write to chromium");
        let deadline = Instant::now() + BROWSER_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let v = self
                .from
                .recv_timeout(left)
                .unwrap_or_else(|e| panic!("chromium: no answer to {method}: {e}"));
            if v["id"].as_u64() == Some(id) {
                assert!(v["error"].is_null(), "{method}: {v}");
                return v["result"].clone();
            }
        }
    }

    /// Evaluate `expr` in the page; its value (JSON).
    fn eval(&mut self, expr: &str) -> serde_json::Value {
        let r = self.call(
            "Runtime.evaluate",
            serde_json::json!({ "expression": expr, "returnByValue": true }),
        );
        assert!(r["exceptionDetails"].is_null(), "{expr}: {r}");
        r["result"]["value"].clone()
    }

    /// A PNG of the page.
    fn screenshot(&mut self) -> Vec<u8> {
        let r = self.call(
            "Page.captureScreenshot",
            serde_json::json!({ "format": "png", "captureBeyondViewport": true }),
        );
        base64_decode(r["data"].as_str().unwrap())
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn base64_decode(s: &str) -> Vec<u8> {
    let val = |c: u8| -> u32 {
        match c {
            b'A'..=b'Z' => u32::from(c - b'A'),
            b'a'..=b'z' => u32::from(c - b'a') + 26,
            b'0'..=b'9' => u32::from(c - b'0') + 52,
            b'+' => 62,
            b'/' => 63,
            _ => panic!("bad base64 byte {c}"),
        }
    };
    let bytes: Vec<u8> = s.bytes().filter(|&c| c != b'=').collect();
    let mut out = Vec::with_capacity(bytes.len() * 3 / 4);
    for chunk in bytes.chunks(4) {
        let mut n = 0u32;
        for (i, &c) in chunk.iter().enumerate() {
            n |= val(c) << (18 - 6 * i);
        }
        out.extend_from_slice(&n.to_be_bytes()[1..chunk.len()]);
    }
    out
}

/// What the test reads off the page's DOM.
#[derive(Debug)]
struct Look {
    updates: u64,
    /// Per back-end row: [address, state cell, record age cell].
    rows: Vec<[String; 3]>,
    /// The "admitted" row's total, as shown.
    admitted: String,
}

impl Look {
    fn admitted_total(&self) -> u64 {
        self.admitted.replace(',', "").parse().unwrap_or(0)
    }
}

/// Read the page through its DOM (before the page has loaded there is no body yet: it
/// reads as no update and no rows, and [`look_until`] looks again).
const LOOK: &str = r#"JSON.stringify({
  updates: Number((document.body && document.body.dataset.updates) || 0),
  rows: [...document.querySelectorAll('#backends tr.backend')].map((tr) =>
    [tr.dataset.addr, tr.querySelector('td.state').textContent,
     tr.querySelector('td.age').textContent]),
  admitted: (document.querySelector('#dec-admit td.total') || {}).textContent || '',
})"#;

fn look(b: &mut Browser) -> Look {
    let v: serde_json::Value = serde_json::from_str(b.eval(LOOK).as_str().unwrap()).unwrap();
    let text = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_string();
    Look {
        updates: v["updates"].as_u64().unwrap_or(0),
        rows: v["rows"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| [text(&r[0]), text(&r[1]), text(&r[2])])
            .collect(),
        admitted: text(&v["admitted"]),
    }
}

/// Look until `ok` holds (the page is live), up to [`LIVE_TIMEOUT`].
fn look_until(b: &mut Browser, what: &str, ok: impl Fn(&Look) -> bool) -> Look {
    let deadline = Instant::now() + LIVE_TIMEOUT;
    loop {
        let l = look(b);
        if ok(&l) {
            return l;
        }
        assert!(Instant::now() < deadline, "page never showed {what}: {l:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `n` requests through the proxy, each answered 200.
fn requests(proxy: SocketAddr, n: usize) {
    for _ in 0..n {
        let r = get_raw(proxy, "/healthz");
        assert!(r.starts_with("HTTP/1.1 200"), "{r}");
    }
}

#[test]
fn dashboard_shows_live_backends_in_a_browser() {
    let dir = Dir::new("dash");
    let mut keep = Vec::new();
    let mut specs = Vec::new();
    for i in 0..2 {
        let be = free_addr();
        let mut b = spawn(
            &format!("backend{i}"),
            &strings(&["backend", "--listen", &be.to_string(), "--workers", "2"]),
            &dir,
        );
        b.wait_port(be).unwrap();
        let region = dir.0.join(format!("node{i}.region"));
        let mut g = spawn(
            &format!("gatherd{i}"),
            &strings(&[
                "gatherd",
                "--watch-port",
                &be.port().to_string(),
                "--shm",
                region.to_str().unwrap(),
            ]),
            &dir,
        );
        g.wait_file(&region).unwrap();
        specs.push(format!("{be},region=shm:{}", region.display()));
        keep.extend([b, g]);
    }
    let (proxy, admin) = (free_addr(), free_addr());
    let mut args = strings(&[
        "proxy",
        "--listen",
        &proxy.to_string(),
        "--admin-listen",
        &admin.to_string(),
        "--admission",
        "--limit",
        "64",
    ]);
    for s in &specs {
        args.extend(strings(&["--backend", s]));
    }
    let mut p = spawn("proxy", &args, &dir);
    p.wait_port(admin).unwrap();
    requests(proxy, 20);

    // Over plain HTTP: the page, its chart library, and one event naming both back-ends.
    let page = get_raw(admin, "/");
    assert!(page.starts_with("HTTP/1.1 200"), "{page}");
    assert!(page.contains("<table id=\"backends\">"), "{page}");
    let lib = get_raw(admin, "/vendor/uplot/uPlot.iife.min.js");
    assert!(lib.starts_with("HTTP/1.1 200") && lib.len() > 40_000);
    let mut s = TcpStream::connect(admin).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(b"GET /events HTTP/1.1\r\nHost: a\r\n\r\n")
        .unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 8192];
    let event = loop {
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0, "event stream closed");
        got.extend_from_slice(&buf[..n]);
        let t = String::from_utf8_lossy(&got);
        if let Some(e) = t.split("\n\n").find(|e| e.starts_with("data: {")) {
            if t.contains("data: {") && t[t.find("data: {").unwrap()..].contains("\n\n") {
                break e.to_string();
            }
        }
    };
    drop(s);
    let head = String::from_utf8_lossy(&got);
    assert!(
        head.contains("Content-Type: text/event-stream\r\n"),
        "{head}"
    );
    let snap: serde_json::Value = serde_json::from_str(&event["data: ".len()..]).unwrap();
    let addrs: Vec<&str> = snap["backends"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["addr"].as_str().unwrap())
        .collect();
    assert_eq!(addrs.len(), 2, "{event}");
    for b in snap["backends"].as_array().unwrap() {
        assert_eq!(b["transport"], "shm", "{event}");
        assert!(b["v"]["farside_monitor_record_age_ns"].is_u64(), "{event}");
        assert!(
            b["v"]["farside_backend_routed_total"].as_u64().unwrap() > 0,
            "{event}"
        );
    }

    let chrome = match chromium() {
        Ok(c) => c,
        Err(why) => {
            farside_testkit::skip(
                "dashboard_shows_live_backends_in_a_browser (its browser part)",
                &why.to_string(),
            );
            return;
        }
    };
    let url = format!("http://{admin}/");
    let mut browser = Browser::open(&chrome, &dir.0.join("chromium"), &url);
    let first = look_until(&mut browser, "two back-ends and 20 admitted", |l| {
        l.updates >= 2 && l.rows.len() == 2 && l.admitted_total() >= 20
    });
    eprintln!("first look: {first:?}");
    for [addr, state, age] in &first.rows {
        assert!(addrs.contains(&addr.as_str()), "{first:?}");
        // Fresh normally; a record may be seen stale on a CI machine starved of CPU.
        assert!(["fresh", "stale"].contains(&state.as_str()), "{first:?}");
        assert!(age.ends_with(" ms"), "freshness shown: {first:?}");
    }

    requests(proxy, 30);
    let want = first.admitted_total() + 30;
    let second = look_until(&mut browser, "the decision counter move", |l| {
        l.admitted_total() >= want && l.updates > first.updates
    });
    eprintln!("second look: {second:?}");
    assert_eq!(second.rows.len(), 2, "{second:?}");
    let ages = |l: &Look| l.rows.iter().map(|r| r[2].clone()).collect::<Vec<_>>();
    let moved = look_until(&mut browser, "the freshness change", |l| {
        ages(l) != ages(&first)
    });
    assert_eq!(moved.rows.len(), 2, "{moved:?}");
    // Let the charts gather a few seconds of history for the screenshot.
    requests(proxy, 30);
    std::thread::sleep(Duration::from_secs(2));

    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target"));
    std::fs::create_dir_all(&target).unwrap();
    let png = target.join("dashboard.png");
    let shot = browser.screenshot();
    assert!(
        shot.starts_with(b"\x89PNG") && shot.len() > 10_000,
        "{} bytes",
        shot.len()
    );
    std::fs::write(&png, shot).unwrap();
    eprintln!("dashboard screenshot: {}", png.display());
}
