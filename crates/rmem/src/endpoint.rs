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
