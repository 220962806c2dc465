use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;

/// Where a region can be reached: `shm:PATH`, `tcp:HOST:PORT` or `udp:HOST:PORT`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// Same host: a shared file mapped into memory.
    Shm(PathBuf),
    /// Two-sided baseline: the gatherer process answers over TCP.
    Tcp(SocketAddr),
    /// One request/reply datagram per operation, answered by XDP or the gatherer.
    Udp(SocketAddr),
}

impl Endpoint {
    pub fn parse(s: &str) -> Result<Endpoint, String> {
        let (kind, rest) = s
            .split_once(':')
            .ok_or_else(|| format!("`{s}`: expected shm:PATH, tcp:HOST:PORT or udp:HOST:PORT"))?;
        let addr = || {
            rest.parse::<SocketAddr>()
                .map_err(|e| format!("`{s}`: bad address `{rest}`: {e}"))
        };
        match kind {
            "shm" if !rest.is_empty() => Ok(Endpoint::Shm(PathBuf::from(rest))),
            "shm" => Err(format!("`{s}`: shm needs a path")),
            "tcp" => Ok(Endpoint::Tcp(addr()?)),
            "udp" => Ok(Endpoint::Udp(addr()?)),
            other => Err(format!(
                "`{s}`: unknown transport `{other}` (expected shm, tcp or udp)"
            )),
        }
    }

    pub fn transport_name(&self) -> &'static str {
        match self {
            Endpoint::Shm(_) => "shm",
            Endpoint::Tcp(_) => "tcp",
            Endpoint::Udp(_) => "udp",
        }
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Endpoint::Shm(p) => write!(f, "shm:{}", p.display()),
            Endpoint::Tcp(a) => write!(f, "tcp:{a}"),
            Endpoint::Udp(a) => write!(f, "udp:{a}"),
        }
    }
}

impl std::str::FromStr for Endpoint {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Endpoint::parse(s)
    }
}

/// Where a region is and which key to seal requests to it with: an [`Endpoint`]
/// optionally followed by `?key=ID:PATH` (a key id and its key file, 0600; `?key=ID`:
/// the systemd credential `rmem-ID`), e.g.
/// `udp:10.0.0.2:7000?key=3:/etc/farside/rmem-3.key`. Without one the client's default
/// (`ClientOptions::key`) is used, so every back-end of a proxy can have its own key.
/// The key itself is never in the string: it is read from the file when connecting.
#[derive(Clone, PartialEq, Eq)]
pub struct Target {
    pub endpoint: Endpoint,
    /// `ID[:PATH]`, checked for form when parsed.
    pub key: Option<String>,
}

impl Target {
    pub fn parse(s: &str) -> Result<Target, String> {
        let (ep, key) = match s.rsplit_once("?key=") {
            Some((ep, spec)) => {
                crate::auth::ClientKey::parse_spec(spec).map_err(|e| {
                    format!("`{s}`: ?key= needs ID:PATH (a key id and its key file): {e}")
                })?;
                (ep, Some(spec.to_string()))
            }
            None => (s, None),
        };
        Ok(Target {
            endpoint: Endpoint::parse(ep)?,
            key,
        })
    }

    /// `opts` with this target's key, loaded from its file, if it names one.
    pub fn options(&self, opts: &crate::ClientOptions) -> Result<crate::ClientOptions, String> {
        match &self.key {
            Some(spec) => Ok(crate::ClientOptions {
                key: Some(crate::auth::ClientKey::load(spec)?),
                ..opts.clone()
            }),
            None => Ok(opts.clone()),
        }
    }

    pub fn transport_name(&self) -> &'static str {
        self.endpoint.transport_name()
    }
}

/// Shows the endpoint and whether a key is named (logs).
impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.key {
            Some(_) => write!(f, "{}?key=(set)", self.endpoint),
            None => write!(f, "{}", self.endpoint),
        }
    }
}

impl fmt::Debug for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl std::str::FromStr for Target {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Target::parse(s)
    }
}

impl From<Endpoint> for Target {
    fn from(endpoint: Endpoint) -> Self {
        Target {
            endpoint,
            key: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_target_names_its_key_file_and_hides_it_when_shown() {
        let t = Target::parse("udp:127.0.0.1:7000?key=3:/etc/farside/rmem-3.key").unwrap();
        assert_eq!(t.endpoint, Endpoint::Udp("127.0.0.1:7000".parse().unwrap()));
        assert_eq!(t.key.as_deref(), Some("3:/etc/farside/rmem-3.key"));
        assert!(!t.to_string().contains("rmem-3"), "{t}");
        let t = Target::parse("shm:/dev/shm/farside/node1.region").unwrap();
        assert_eq!(t.key, None);
        for bad in [
            "tcp:127.0.0.1:1?key=",
            "tcp:127.0.0.1:1?key=xyz:/k",
            "tcp:127.0.0.1:1?key=5eed5eed",
        ] {
            assert!(Target::parse(bad).unwrap_err().contains("key"), "{bad}");
        }
    }
}
