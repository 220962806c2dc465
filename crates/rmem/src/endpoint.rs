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

/// Where a region is and which access key to read it with: an [`Endpoint`] optionally
/// followed by `?key=HEX` (a 64-bit key in hex, `0x` optional), e.g.
/// `udp:10.0.0.2:7000?key=5eed5eed5eed5eed`. Without a key the client's default
/// (`ClientOptions::key`, normally `DEFAULT_READ_KEY`) is used, so every back-end of a
/// proxy can have its own key in the proxy configuration and on its command line.
#[derive(Clone, PartialEq, Eq)]
pub struct Target {
    pub endpoint: Endpoint,
    pub key: Option<u64>,
}

impl Target {
    pub fn parse(s: &str) -> Result<Target, String> {
        let (ep, key) = match s.rsplit_once("?key=") {
            Some((ep, hex)) => {
                let t = hex.strip_prefix("0x").unwrap_or(hex);
                if t.is_empty() || t.len() > 16 {
                    return Err(format!(
                        "`{s}`: ?key= needs 1 to 16 hex digits (a 64-bit key)"
                    ));
                }
                let k = u64::from_str_radix(t, 16)
                    .map_err(|e| format!("`{s}`: ?key=: expected a 64-bit hex key: {e}"))?;
                (ep, Some(k))
            }
            None => (s, None),
        };
        Ok(Target {
            endpoint: Endpoint::parse(ep)?,
            key,
        })
    }

    pub fn transport_name(&self) -> &'static str {
        self.endpoint.transport_name()
    }
}

/// Shows the endpoint and whether a key is set, never the key itself (logs).
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
    fn a_target_carries_its_own_key_and_hides_it_when_shown() {
        let t = Target::parse("udp:127.0.0.1:7000?key=0x5eed").unwrap();
        assert_eq!(t.endpoint, Endpoint::Udp("127.0.0.1:7000".parse().unwrap()));
        assert_eq!(t.key, Some(0x5eed));
        assert!(!t.to_string().contains("5eed"), "{t}");
        let t = Target::parse("shm:/dev/shm/farside/node1.region").unwrap();
        assert_eq!(t.key, None);
        for bad in [
            "tcp:127.0.0.1:1?key=",
            "tcp:127.0.0.1:1?key=xyz",
            "tcp:127.0.0.1:1?key=11112222333344445",
        ] {
            assert!(Target::parse(bad).unwrap_err().contains("key"), "{bad}");
        }
    }
}
