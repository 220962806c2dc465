//! The live dashboard in a real browser: a proxy with two back-ends (each with its
//! gatherd publishing load in a shm region), some requests, then the page opened in
//! headless Chromium twice. Through the DOM: both back-end rows, their freshness (record
//! age) and the admitted-decision counter appear, and change between the two looks. A
//! screenshot is saved as `$CARGO_TARGET_DIR/dashboard.png` (path printed).
//!
//! Without Chromium (Debian's `chromium`, installed by scripts/setup.sh; or the binary
//! named by `FARSIDE_CHROMIUM`) the browser part is skipped with the reason printed;
//! the page, its assets and the event stream are still checked over plain HTTP.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::{free_addr, get_raw, spawn, strings, Dir};

/// Longest one Chromium run may take (start, load, run the page's JS, dump, exit) on a
/// busy CI machine before the test fails instead of hanging.
const BROWSER_TIMEOUT: Duration = Duration::from_secs(90);
/// Virtual time the page runs before the DOM is dumped: enough for several snapshots at
/// the default 10 a second.
const PAGE_RUN_MS: u32 = 2500;

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
    Err("no chromium, chromium-browser or google-chrome on PATH and FARSIDE_CHROMIUM \
         unset (Debian: apt-get install chromium; scripts/setup.sh installs it)"
        .into())
}

/// Run headless Chromium on `url` with `extra` flags; its stdout.
fn browse(chrome: &Path, profile: &Path, url: &str, extra: &[&str]) -> String {
    let mut c = Command::new(chrome)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--hide-scrollbars",
            "--window-size=1500,1100",
            &format!("--virtual-time-budget={PAGE_RUN_MS}"),
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(extra)
        .arg(url)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start chromium");
    let mut out = c.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let deadline = Instant::now() + BROWSER_TIMEOUT;
    loop {
        if c.try_wait().unwrap().is_some() {
            break;
        }
        if Instant::now() > deadline {
            let _ = c.kill();
            let _ = c.wait();
            panic!("chromium took more than {BROWSER_TIMEOUT:?} on {url}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    reader.join().unwrap()
}

/// What the test reads off the page's DOM.
#[derive(Debug)]
struct Look {
    updates: u64,
    /// Per back-end row: (address, state cell, record age cell).
    rows: Vec<(String, String, String)>,
    admitted_total: u64,
}

/// The text of the first `<td class="CLASS…">` after `from` in `html`.
fn cell<'a>(html: &'a str, class: &str) -> Option<&'a str> {
    let i = html.find(&format!("<td class=\"{class}"))?;
    let rest = &html[i..];
    let start = rest.find('>')? + 1;
    let end = rest.find("</td>")?;
    Some(&rest[start..end])
}

fn look(dom: &str) -> Look {
    let attr = |s: &str, name: &str| -> Option<String> {
        let i = s.find(&format!("{name}=\""))? + name.len() + 2;
        Some(s[i..i + s[i..].find('"')?].to_string())
    };
    let updates = attr(dom, "data-updates")
        .and_then(|u| u.parse().ok())
        .unwrap_or(0);
    let mut rows = Vec::new();
    for part in dom.split("<tr class=\"backend\"").skip(1) {
        let row = &part[..part.find("</tr>").unwrap_or(part.len())];
        rows.push((
            attr(row, "data-addr").unwrap_or_default(),
            cell(row, "state").unwrap_or_default().to_string(),
            cell(row, "age").unwrap_or_default().to_string(),
        ));
    }
    let admitted_total = dom
        .find("<tr id=\"dec-admit\"")
        .and_then(|i| cell(&dom[i..], "total"))
        .map(|t| t.replace(',', ""))
        .and_then(|t| t.parse().ok())
        .unwrap_or(0);
    Look {
        updates,
        rows,
        admitted_total,
    }
}

/// `n` requests through the proxy, each answered 200.
fn requests(proxy: SocketAddr, n: usize) {
    for _ in 0..n {
        let r = get_raw(proxy, "/");
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
    s.write_all(b"GET /events HTTP/1.1\r\nHost: a\r\n\r\n").unwrap();
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
    assert!(head.contains("Content-Type: text/event-stream\r\n"), "{head}");
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
        assert!(b["v"]["farside_backend_routed_total"].as_u64().unwrap() > 0, "{event}");
    }

    let chrome = match chromium() {
        Ok(c) => c,
        Err(why) => {
            eprintln!("SKIPPED the browser part of dashboard_shows_live_backends_in_a_browser: {why}");
            return;
        }
    };
    let url = format!("http://{admin}/");
    let profile = dir.0.join("chromium");
    let first = look(&browse(&chrome, &profile, &url, &["--dump-dom"]));
    eprintln!("first look: {first:?}");
    assert!(first.updates >= 2, "the page got live data: {first:?}");
    assert_eq!(first.rows.len(), 2, "two back-end rows: {first:?}");
    for (addr, state, age) in &first.rows {
        assert!(addrs.contains(&addr.as_str()), "{first:?}");
        // Fresh normally; a record may be seen stale on a CI machine starved of CPU.
        assert!(["fresh", "stale"].contains(&state.as_str()), "{first:?}");
        assert!(age.ends_with(" ms"), "freshness shown: {first:?}");
    }
    assert!(first.admitted_total >= 20, "decision counter: {first:?}");

    requests(proxy, 30);
    let second = look(&browse(&chrome, &profile, &url, &["--dump-dom"]));
    eprintln!("second look: {second:?}");
    assert_eq!(second.rows.len(), 2, "{second:?}");
    assert!(
        second.admitted_total >= first.admitted_total + 30,
        "the decision counter moved: {first:?} -> {second:?}"
    );
    assert_ne!(
        first.rows.iter().map(|r| &r.2).collect::<Vec<_>>(),
        second.rows.iter().map(|r| &r.2).collect::<Vec<_>>(),
        "the freshness moved"
    );

    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target")
        });
    std::fs::create_dir_all(&target).unwrap();
    let png = target.join("dashboard.png");
    let _ = std::fs::remove_file(&png);
    browse(
        &chrome,
        &profile,
        &url,
        &[&format!("--screenshot={}", png.display())],
    );
    let size = std::fs::metadata(&png).map(|m| m.len()).unwrap_or(0);
    assert!(size > 10_000, "screenshot written: {} ({size} bytes)", png.display());
    eprintln!("dashboard screenshot: {}", png.display());
}
