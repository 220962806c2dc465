//! Co-hosted sites (seed 001), the server side: every back-end holds every
//! site's content (`--sites-root DIR`, one sub-directory per site) and serves exactly
//! one of them at a time, switched at run time through a control socket
//! (`--control PATH`) without a restart. The protocol on that socket (request and
//! reply lines, site names, the client gatherd's role agent uses) is
//! [`farside_reconf::sites`]; here a switch takes effect: `site NAME` is answered
//! `ok NAME` once every request routed after the reply uses `DIR/NAME`, and a name
//! that is invalid or names no sub-directory of the sites root is refused (the old
//! site stays).
//!
//! Switching time: every switch to another site is numbered, and the first
//! successful response (status < 400) served from the new site after it is logged once:
//! `backend: first request for site NAME after switch N served_unix_us=T
//! switched_unix_us=S` (the host's wall clock, shared by every process of the lab, which
//! joins it with the balancer's move CAS).

use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use farside_reconf::sites::{
    reply_err, reply_ok, reply_site, valid_site_name, Request, CONTROL_LINE_MAX, SITE_NAME_MAX,
};

/// Time a control client has to send its line: the agent writes it at once, and the
/// single control thread must not be held by a silent client.
const CONTROL_READ_TIMEOUT: Duration = Duration::from_secs(2);

/// The site served now: its name and canonical docroot.
#[derive(Debug, Clone)]
pub(crate) struct Current {
    pub(crate) name: Arc<str>,
    pub(crate) root: Arc<PathBuf>,
    /// Switches to another site so far (0: the site served at start).
    pub(crate) switch: u64,
    /// When that switch took effect, µs since the Unix epoch (0 for the start).
    switched_unix_us: u64,
}

/// The sites root and the site served now.
#[derive(Debug)]
pub(crate) struct Sites {
    root: PathBuf,
    current: RwLock<Current>,
    /// The last switch whose first response was logged.
    first_logged: AtomicU64,
}

/// µs since the Unix epoch by the host's wall clock (0 before 1970).
fn unix_now_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

impl Sites {
    /// Opens `root` (canonicalised) serving `initial`.
    pub(crate) fn new(root: &Path, initial: &str) -> Result<Sites, String> {
        let root = root
            .canonicalize()
            .map_err(|e| format!("--sites-root {}: {e}", root.display()))?;
        let current = Self::resolve(&root, initial).map_err(|e| format!("--site: {e}"))?;
        Ok(Sites {
            root,
            current: RwLock::new(current),
            first_logged: AtomicU64::new(0),
        })
    }

    fn resolve(root: &Path, name: &str) -> Result<Current, String> {
        if !valid_site_name(name) {
            return Err(format!(
                "invalid site name {name:?} (1..={SITE_NAME_MAX} of [A-Za-z0-9._-])"
            ));
        }
        let dir = root.join(name);
        let real = dir
            .canonicalize()
            .map_err(|e| format!("site {name}: {}: {e}", dir.display()))?;
        if !real.starts_with(root) || !real.is_dir() {
            return Err(format!(
                "site {name}: {} is not a directory under {}",
                dir.display(),
                root.display()
            ));
        }
        Ok(Current {
            name: name.into(),
            root: Arc::new(real),
            switch: 0,
            switched_unix_us: 0,
        })
    }

    /// The site served now.
    pub(crate) fn current(&self) -> Current {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Serve `name` from now on; on error the old site stays.
    pub(crate) fn switch(&self, name: &str) -> Result<(), String> {
        let mut next = Self::resolve(&self.root, name)?;
        let mut cur = self.current.write().unwrap_or_else(|p| p.into_inner());
        if *cur.name != *next.name {
            next.switch = cur.switch + 1;
            next.switched_unix_us = unix_now_us();
            log::info!(
                "backend: now serving site {name} ({}) switch={} switched_unix_us={}",
                next.root.display(),
                next.switch,
                next.switched_unix_us
            );
        } else {
            next.switch = cur.switch;
            next.switched_unix_us = cur.switched_unix_us;
        }
        *cur = next;
        Ok(())
    }

    /// A response from the content of switch `switch` was sent (status < 400): logs
    /// the first one after each switch (see the module doc). Returns whether it was.
    pub(crate) fn served(&self, name: &str, switch: u64) -> bool {
        // A plain load first: every response passes here, and all but one per switch
        // stop at it without writing the shared word.
        if switch == 0
            || self.first_logged.load(Ordering::Acquire) >= switch
            || self.first_logged.fetch_max(switch, Ordering::AcqRel) >= switch
        {
            return false;
        }
        let cur = self.current();
        // A later switch may already have happened; its time is not this one's.
        let switched = if cur.switch == switch {
            cur.switched_unix_us.to_string()
        } else {
            "-".into()
        };
        log::info!(
            "backend: first request for site {name} after switch {switch} served_unix_us={} \
             switched_unix_us={switched}",
            unix_now_us()
        );
        true
    }

    /// Answers one control request line.
    fn handle(&self, line: &str) -> String {
        match Request::parse(line) {
            Ok(Request::Site(name)) => match self.switch(name) {
                Ok(()) => reply_ok(name),
                Err(e) => reply_err(&e),
            },
            Ok(Request::Get) => reply_site(&self.current().name),
            Err(e) => reply_err(e),
        }
    }
}

/// Serves the control socket until `stop`; one client at a time.
pub(crate) fn control_loop(listener: UnixListener, sites: Arc<Sites>, stop: Arc<AtomicBool>) {
    for conn in listener.incoming() {
        if stop.load(Ordering::SeqCst) {
            break;
        }
        match conn {
            Ok(stream) => {
                if let Err(e) = control_client(stream, &sites) {
                    log::warn!("backend control: {e}");
                }
            }
            Err(e) => {
                log::warn!("backend control accept: {e}");
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

fn control_client(stream: UnixStream, sites: &Sites) -> io::Result<()> {
    stream.set_read_timeout(Some(CONTROL_READ_TIMEOUT))?;
    stream.set_write_timeout(Some(CONTROL_READ_TIMEOUT))?;
    let mut line = String::new();
    let mut reader = BufReader::new((&stream).take(CONTROL_LINE_MAX as u64 + 1));
    reader.read_line(&mut line)?;
    let reply = if line.len() > CONTROL_LINE_MAX {
        reply_err(&format!("request longer than {CONTROL_LINE_MAX} bytes"))
    } else {
        sites.handle(&line)
    };
    (&stream).write_all(reply.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The first response of each switch is reported once; the start, repeats, and a
    /// late response of an older switch are not.
    #[test]
    fn the_first_response_after_each_switch_is_reported_once() {
        let dir = std::env::temp_dir().join(format!("farside-sites-unit-{}", std::process::id()));
        for s in ["a", "b"] {
            std::fs::create_dir_all(dir.join(s)).unwrap();
        }
        let sites = Sites::new(&dir, "a").unwrap();
        assert_eq!(sites.current().switch, 0);
        assert!(!sites.served("a", 0), "the start is no switch");
        sites.switch("a").unwrap();
        assert_eq!(sites.current().switch, 0, "same site: no switch");
        sites.switch("b").unwrap();
        let b = sites.current();
        assert_eq!(b.switch, 1);
        assert!(b.switched_unix_us > 0);
        assert!(sites.served("b", 1));
        assert!(!sites.served("b", 1), "only the first");
        sites.switch("a").unwrap();
        sites.switch("b").unwrap();
        assert_eq!(sites.current().switch, 3);
        assert!(sites.served("b", 3));
        assert!(!sites.served("a", 2), "an older switch after a newer one");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
