//! Attacks through local files and the proxy's data port.
//!
//! - A symlink planted where gatherd will create its region file (`--shm PATH` in
//!   `/dev/shm`, world-writable and sticky: where a local user can plant a name), owned
//!   by an unprivileged user (`nobody`, as a local user's link would be): once at the
//!   region directory (the directory is a link to another one), once at the file
//!   itself (a link to a file elsewhere), the file's directory being sticky and
//!   world-writable too. Success = a file created outside the intended directory.
//!   gatherd runs as it does on a back-end (as root), for a moment, with its
//!   user-space sampler; its region files go through `farside_rt::rundir`, which
//!   refuses another user's symlink.
//! - `GET /farside/metrics` on the proxy's public port from the client-side attacker:
//!   success = the back-ends' addresses are in the answer.

use std::io::{self, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::time::Duration;

use super::dc::{read_response, strings, Dc, ATKC, B0, B1};
use super::outcome::Outcome;
use crate::fabric::procs::Child;

/// How long gatherd runs on the planted path.
const GATHERD_RUN_S: &str = "1.5";
/// Longest wait for it to exit.
const GATHERD_EXIT_MAX: Duration = Duration::from_secs(10);

/// Files in `dir` (names), sorted.
fn listing(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// Run gatherd on `shm` for a moment; the files seen in `outside` while it ran (it
/// removes its region file at exit).
fn run_gatherd(
    dc: &Dc,
    shm: &Path,
    outside: &Path,
    tag: &str,
) -> io::Result<(Vec<String>, String)> {
    let args = strings(&[
        "gatherd",
        "--node-id",
        "9",
        "--shm",
        &shm.display().to_string(),
        "--sampler",
        "user",
        "--duration-s",
        GATHERD_RUN_S,
    ]);
    let mut c = Child::spawn(&format!("gatherd-{tag}"), &dc.exe, &args, &dc.logs)?;
    let t0 = std::time::Instant::now();
    let mut seen = Vec::new();
    while c.exited().is_none() && t0.elapsed() < GATHERD_EXIT_MAX {
        for f in listing(outside) {
            if !seen.contains(&f) {
                seen.push(f);
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    c.stop();
    for f in listing(outside) {
        if !seen.contains(&f) {
            seen.push(f);
        }
    }
    Ok((
        seen,
        crate::fabric::procs::tail(&c.log, 2).replace('\n', " | "),
    ))
}

/// The uid and gid of `nobody`: the local user who plants the links.
const NOBODY: u32 = 65_534;

/// A symlink at `at` to `to`, owned by [`NOBODY`] (`lchown`: the link itself).
fn plant(to: &Path, at: &Path) -> io::Result<()> {
    std::os::unix::fs::symlink(to, at)?;
    std::os::unix::fs::lchown(at, Some(NOBODY), Some(NOBODY))
}

/// Plant the two links, start gatherd on each: files that appeared outside.
pub fn symlink_region(dc: &Dc) -> io::Result<Outcome> {
    use std::os::unix::fs::PermissionsExt;
    let shm = Path::new("/dev/shm");
    let tag = format!("farside-{}-symlink", dc.dc.run_id());
    let base = std::env::temp_dir().join(&tag);
    let _ = std::fs::remove_dir_all(&base);
    let outside = base.join("outside");
    let real = base.join("regions");
    std::fs::create_dir_all(&outside)?;
    std::fs::create_dir_all(&real)?;
    // Like /dev/shm: root's, world-writable, sticky (a local user may plant a name).
    std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o1777))?;
    // 1. The region directory, in /dev/shm, is nobody's link to `outside`.
    let linked_dir = shm.join(&tag);
    let _ = std::fs::remove_file(&linked_dir);
    plant(&outside, &linked_dir)?;
    let (mut found, log1) = run_gatherd(
        dc,
        &linked_dir.join("node9.region"),
        &outside,
        "symlink-dir",
    )?;
    // 2. The region file is a link to a file in `outside`.
    let planted = real.join("node9.region");
    plant(&outside.join("victim-file"), &planted)?;
    let (more, log2) = run_gatherd(dc, &planted, &outside, "symlink-file")?;
    found.extend(more);
    let _ = std::fs::remove_file(&linked_dir);
    let _ = std::fs::remove_dir_all(&base);
    Ok(Outcome {
        succeeded: !found.is_empty(),
        effect: format!(
            "files created outside the region directory through nobody's links: {found:?}; \
             gatherd (dir link): {log1}; gatherd (file link): {log2}"
        ),
        packets: 0,
        bytes: 0,
        answered_bytes: 0,
        tested: true,
    })
}

/// `GET /farside/metrics` on the proxy's public port, from the client side.
pub fn proxy_metrics(dc: &Dc) -> io::Result<Outcome> {
    let to: SocketAddr = dc.proxy_addr();
    let (status, body) = dc.dc.run_in_ns(ATKC, move || {
        let mut s = TcpStream::connect_timeout(&to, Duration::from_secs(2))?;
        s.set_read_timeout(Some(Duration::from_secs(2)))?;
        s.write_all(b"GET /farside/metrics HTTP/1.1\r\nHost: lab\r\n\r\n")?;
        read_response(&mut s)
    })?;
    let text = String::from_utf8_lossy(&body);
    let leaked: Vec<String> = [B0, B1]
        .iter()
        .map(|n| dc.dc.node_ip(n).to_string())
        .filter(|ip| text.contains(ip.as_str()))
        .collect();
    Ok(Outcome {
        succeeded: !leaked.is_empty(),
        effect: format!(
            "HTTP {status}, {} B; back-end addresses in it: {leaked:?}",
            body.len()
        ),
        packets: 1,
        bytes: 0,
        answered_bytes: body.len() as u64,
        tested: true,
    })
}
