//! The site protocol: how a node agent tells the local web server which co-hosted site
//! to serve (seed 001). Every back-end holds every site's content and serves
//! exactly one at a time; the agent ([`crate::agent`], run by gatherd) switches it
//! when the node's role changes, without a restart. The server side is the test web
//! server's `--control PATH` (`farside_backend::sites`); the client side is here.
//!
//! Transport: a Unix stream socket, so only local processes with file access reach
//! it. One request line per connection, at most [`CONTROL_LINE_MAX`] bytes, answered
//! by one line.
//!
//! ```text
//! site NAME\n   ──► ok NAME\n        NAME is served from now on (every request routed
//!                                    after this reply uses the site's content)
//!               ──► err REASON\n     unknown or invalid name: the old site stays
//! get\n         ──► site NAME\n
//! ```
//!
//! A site name is 1..=[`SITE_NAME_MAX`] bytes of `[A-Za-z0-9._-]`, not `.` or `..`
//! ([`valid_site_name`]); the server also requires it to name one of its sites.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

/// Longest control request line: `site ` and a name of [`SITE_NAME_MAX`] bytes fit.
pub const CONTROL_LINE_MAX: usize = 128;
/// Longest site name (a directory name; the proxy's `[[sites]]` names are the same).
pub const SITE_NAME_MAX: usize = 64;
// The longest request line (`site NAME\n`) fits the bound.
const _: () = assert!("site ".len() + SITE_NAME_MAX < CONTROL_LINE_MAX);

/// Is `name` a valid site name (see the module doc)?
pub fn valid_site_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= SITE_NAME_MAX
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// One control request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Request<'a> {
    /// `site NAME`: serve NAME from now on (the name is not checked here).
    Site(&'a str),
    /// `get`: which site is served now.
    Get,
}

impl<'a> Request<'a> {
    /// Parses one request line (its line end, `\n` or `\r\n`, included or not).
    /// `Err` is the reason to answer with [`reply_err`].
    pub fn parse(line: &'a str) -> Result<Request<'a>, &'static str> {
        let line = line.trim_end_matches(['\r', '\n']);
        match line.split_once(' ') {
            Some(("site", name)) => Ok(Request::Site(name)),
            None if line == "get" => Ok(Request::Get),
            _ => Err("unknown request (expected `site NAME` or `get`)"),
        }
    }
}

/// The answer to a `site NAME` that took effect.
pub fn reply_ok(name: &str) -> String {
    format!("ok {name}\n")
}

/// The answer to a request refused for `reason` (the old site stays).
pub fn reply_err(reason: &str) -> String {
    format!("err {reason}\n")
}

/// The answer to `get`: the site served now.
pub fn reply_site(name: &str) -> String {
    format!("site {name}\n")
}

/// Client side: asks the web server at `socket` to serve `site` and checks its answer.
/// Used by gatherd's role agent and by tests.
pub fn request_site(socket: &Path, site: &str, timeout: Duration) -> Result<(), String> {
    let reply = control_request(socket, &format!("site {site}\n"), timeout)?;
    match reply.strip_prefix("ok ") {
        Some(n) if n == site => Ok(()),
        _ => Err(format!("backend control {}: {reply}", socket.display())),
    }
}

/// Client side: the site the web server at `socket` serves now.
pub fn query_site(socket: &Path, timeout: Duration) -> Result<String, String> {
    let reply = control_request(socket, "get\n", timeout)?;
    reply
        .strip_prefix("site ")
        .map(str::to_owned)
        .ok_or_else(|| format!("backend control {}: {reply}", socket.display()))
}

fn control_request(socket: &Path, line: &str, timeout: Duration) -> Result<String, String> {
    let ctx = |e: io::Error| format!("backend control {}: {e}", socket.display());
    let mut s = UnixStream::connect(socket).map_err(ctx)?;
    s.set_read_timeout(Some(timeout)).map_err(ctx)?;
    s.set_write_timeout(Some(timeout)).map_err(ctx)?;
    s.write_all(line.as_bytes()).map_err(ctx)?;
    let mut reply = String::new();
    BufReader::new(s.take(CONTROL_LINE_MAX as u64 * 4))
        .read_line(&mut reply)
        .map_err(ctx)?;
    Ok(reply.trim_end().to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn site_names_are_bounded_words_of_a_safe_alphabet() {
        for ok in ["a", "site-1", "a.b_c", &"x".repeat(SITE_NAME_MAX)] {
            assert!(valid_site_name(ok), "{ok:?}");
        }
        for bad in [
            "",
            ".",
            "..",
            "a/b",
            "a b",
            "é",
            &"x".repeat(SITE_NAME_MAX + 1),
        ] {
            assert!(!valid_site_name(bad), "{bad:?}");
        }
    }

    #[test]
    fn requests_parse_with_or_without_their_line_end() {
        assert_eq!(Request::parse("site a\n"), Ok(Request::Site("a")));
        assert_eq!(Request::parse("site a\r\n"), Ok(Request::Site("a")));
        assert_eq!(Request::parse("get"), Ok(Request::Get));
        for bad in ["", "get x", "sites a", "site"] {
            assert!(Request::parse(bad).is_err(), "{bad:?}");
        }
        assert_eq!(reply_ok("a"), "ok a\n");
        assert_eq!(reply_err("no"), "err no\n");
        assert_eq!(reply_site("b"), "site b\n");
    }

    /// The client against a one-shot server speaking the protocol: a switch is
    /// confirmed only by `ok NAME` for the name asked; `get` returns the name.
    #[test]
    fn the_client_accepts_only_the_answer_for_the_site_it_asked() {
        use std::os::unix::net::UnixListener;
        let path = std::env::temp_dir().join(format!("farside-sites-{}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let l = UnixListener::bind(&path).unwrap();
        let server = std::thread::spawn(move || {
            for (i, c) in l.incoming().take(3).enumerate() {
                let c = c.unwrap();
                let mut line = String::new();
                BufReader::new(&c).read_line(&mut line).unwrap();
                let reply = match (i, Request::parse(&line)) {
                    (0, Ok(Request::Site(n))) => reply_ok(n),
                    (1, Ok(Request::Site(_))) => reply_ok("other"),
                    (_, Ok(Request::Get)) => reply_site("b"),
                    (_, r) => reply_err(&format!("{r:?}")),
                };
                (&c).write_all(reply.as_bytes()).unwrap();
            }
        });
        let t = Duration::from_secs(5);
        request_site(&path, "a", t).unwrap();
        let e = request_site(&path, "a", t).unwrap_err();
        assert!(e.contains("ok other"), "{e}");
        assert_eq!(query_site(&path, t).unwrap(), "b");
        server.join().unwrap();
        let _ = std::fs::remove_file(&path);
    }
}
