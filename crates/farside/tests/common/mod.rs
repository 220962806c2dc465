//! Helpers shared by the `farside` integration tests: the binary under test, free
//! loopback ports, per-test temporary directories, spawning the binary, polling, and
//! plain HTTP/1.1 GETs.

// Every test binary compiles its own copy of this module and uses only some of it.
#![allow(dead_code)]

use farside_lab::fabric::procs::Child;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Read timeout of [`get_raw`]: a loopback answer that takes longer is a failure.
const GET_TIMEOUT: Duration = Duration::from_secs(5);
/// Pause between the checks of [`eventually`].
const POLL_EVERY: Duration = Duration::from_millis(5);

/// The `farside` binary under test.
pub fn exe() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_farside"))
}

/// Run `farside lab ARGS --out OUT` with the shipped trace data; asserts it succeeded
/// and returns its output and stderr.
#[allow(dead_code)] // not every test binary runs the lab
pub fn run_lab(args: &[&str], out: &Path) -> (std::process::Output, String) {
    let st = std::process::Command::new(exe())
        .arg("lab")
        .args(args)
        .arg("--out")
        .arg(out)
        .env(
            "FARSIDE_DATA",
            concat!(env!("CARGO_MANIFEST_DIR"), "/../../data"),
        )
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&st.stderr).into_owned();
    assert!(st.status.success(), "lab failed:\n{stderr}");
    (st, stderr)
}

/// A loopback address whose port was free a moment ago.
pub fn free_addr() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// A temporary directory, named after the test binary, `tag` and this process, removed
/// on drop.
pub struct Dir(pub PathBuf);

impl Dir {
    pub fn new(tag: &str) -> Dir {
        let d = std::env::temp_dir().join(format!(
            "farside-{}-{tag}-{}",
            env!("CARGO_CRATE_NAME"),
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Dir(d)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Start `farside ARGS`, logging into `dir`.
pub fn spawn<S: AsRef<str>>(name: &str, args: &[S], dir: &Dir) -> Child {
    let args: Vec<String> = args.iter().map(|s| s.as_ref().to_string()).collect();
    Child::spawn(name, exe(), &args, &dir.0).unwrap()
}

/// Owned copies of `v`.
pub fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

/// Poll until `f` holds, up to `limit`.
pub fn eventually(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        std::thread::sleep(POLL_EVERY);
    }
}

/// One `GET path` through `addr` on a fresh connection (`Connection: close`); the whole
/// raw response. Panics if the connection or the exchange fails.
pub fn get_raw(addr: SocketAddr, path: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(GET_TIMEOUT)).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

/// The raw response to `GET /metrics` from the admin listener `admin`: empty if the
/// connection fails, what arrived if the exchange breaks off.
pub fn metrics_raw(admin: SocketAddr) -> String {
    let Ok(mut s) = TcpStream::connect(admin) else {
        return String::new();
    };
    let _ = s.write_all(b"GET /metrics HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n");
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}
