//! The one error type of every BPF program's user-space side. Each error names the
//! program (a label given when its object is loaded, e.g. "the rmem XDP program") and
//! the step that failed; lack of privilege is recognised wherever the kernel says it
//! (EPERM/EACCES anywhere in the error's chain) and becomes [`Error::NoPrivilege`],
//! except a verifier refusal, which keeps its log ([`Error::Load`]).

use std::fmt;
use std::io;

/// What failed.
#[derive(Debug)]
pub enum Error {
    /// The kernel refused `step` for lack of privilege (CAP_BPF, CAP_NET_ADMIN: root in
    /// practice).
    NoPrivilege { program: &'static str, step: String },
    /// Creating the maps or loading (verifying) a program failed; `detail` carries the
    /// error's chain, the verifier's log included.
    Load {
        program: &'static str,
        detail: String,
    },
    /// The object has no program or map of that name and type.
    Missing {
        program: &'static str,
        /// "program" or "map".
        kind: &'static str,
        name: String,
        /// Why the item found does not do (another type), or empty.
        detail: String,
    },
    /// No network interface of that name in the calling thread's namespace.
    NoInterface(String),
    /// Attaching or detaching failed; `hint` (may be empty) says what to try instead.
    Attach {
        program: &'static str,
        /// Where: "lo in native mode", "eth0's tc ingress", "the network namespace".
        target: String,
        detail: String,
        hint: &'static str,
    },
    /// Reading or writing a map failed; `detail` names the map.
    Map {
        program: &'static str,
        detail: String,
    },
    /// A system call around the program failed (mmap, a socket for an ioctl).
    Os {
        program: &'static str,
        step: String,
        source: io::Error,
    },
    /// Bad arguments: the message says which, as it is (a control port replies with it).
    Config(String),
    /// BPF_PROG_TEST_RUN failed.
    TestRun(io::Error),
}

/// Results of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::NoPrivilege { program, step } => write!(
                f,
                "{program} needs CAP_BPF/CAP_NET_ADMIN (run as root): {step} was refused"
            ),
            Error::Load { program, detail } => write!(f, "loading {program} failed: {detail}"),
            Error::Missing {
                program,
                kind,
                name,
                detail,
            } => {
                if detail.is_empty() {
                    write!(f, "{program}: no {kind} {name} in the object")
                } else {
                    write!(f, "{program}: {kind} {name}: {detail}")
                }
            }
            Error::NoInterface(i) => write!(f, "no network interface {i:?} in this namespace"),
            Error::Attach {
                program,
                target,
                detail,
                hint,
            } => write!(f, "attaching {program} to {target} failed: {detail}{hint}"),
            Error::Map { program, detail } => write!(f, "{program} map: {detail}"),
            Error::Os {
                program,
                step,
                source,
            } => write!(f, "{program}: {step}: {source}"),
            Error::Config(m) => f.write_str(m),
            Error::TestRun(e) => write!(f, "BPF_PROG_TEST_RUN failed: {e}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Os { source, .. } | Error::TestRun(source) => Some(source),
            _ => None,
        }
    }
}

/// For callers whose API speaks `io::Error`: the kind says privilege, absence or
/// bad input where the error does; the message is this error's.
impl From<Error> for io::Error {
    fn from(e: Error) -> io::Error {
        let kind = match &e {
            Error::NoPrivilege { .. } => io::ErrorKind::PermissionDenied,
            Error::NoInterface(_) | Error::Missing { .. } => io::ErrorKind::NotFound,
            Error::Config(_) => io::ErrorKind::InvalidInput,
            Error::Os { source, .. } | Error::TestRun(source) => source.kind(),
            _ => io::ErrorKind::Other,
        };
        io::Error::new(kind, e)
    }
}

impl Error {
    /// `e` from `step` of `program`: [`Error::NoPrivilege`] if the kernel refused for
    /// lack of privilege, else what `other` makes of the step and the error's chain.
    pub fn classify(
        program: &'static str,
        step: &str,
        e: &(dyn std::error::Error + 'static),
        other: impl FnOnce(String) -> Error,
    ) -> Error {
        if is_permission_error(e) {
            Error::NoPrivilege {
                program,
                step: step.to_string(),
            }
        } else {
            other(format!("{step}: {}", error_chain(e)))
        }
    }

    /// A failed map read or write of `program` (privilege recognised).
    pub fn map(program: &'static str, step: &str, e: &(dyn std::error::Error + 'static)) -> Error {
        Error::classify(program, step, e, |detail| Error::Map { program, detail })
    }

    /// A failed system call of `program` (privilege recognised).
    pub fn os(program: &'static str, step: &str, source: io::Error) -> Error {
        if is_permission_error(&source) {
            Error::NoPrivilege {
                program,
                step: step.to_string(),
            }
        } else {
            Error::Os {
                program,
                step: step.to_string(),
                source,
            }
        }
    }

    /// Whether the kernel refused for lack of privilege.
    pub fn is_no_privilege(&self) -> bool {
        matches!(self, Error::NoPrivilege { .. })
    }
}

/// True if any error in the chain is EPERM or EACCES from the kernel.
pub fn is_permission_error(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if let Some(io) = err.downcast_ref::<io::Error>() {
            if matches!(io.raw_os_error(), Some(libc::EPERM) | Some(libc::EACCES)) {
                return true;
            }
        }
        cur = err.source();
    }
    false
}

/// `e` and its sources, `: `-separated, each source once (aya repeats a source in its
/// own message at times; the verifier's log is a source of aya's load error).
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(err) = cur {
        let m = err.to_string();
        if !s.contains(&m) {
            s.push_str(": ");
            s.push_str(&m);
        }
        cur = err.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eperm_anywhere_in_the_chain_is_no_privilege() {
        let e = io::Error::from_raw_os_error(libc::EPERM);
        let c = Error::classify("the test program", "BPF_PROG_LOAD", &e, |detail| {
            Error::Load {
                program: "the test program",
                detail,
            }
        });
        assert!(c.is_no_privilege());
        let m = c.to_string();
        assert!(
            m.contains("run as root") && m.contains("BPF_PROG_LOAD"),
            "{m}"
        );
        let other = io::Error::from_raw_os_error(libc::EINVAL);
        let c = Error::map("the test program", "writing k", &other);
        assert!(matches!(c, Error::Map { .. }), "{c}");
        assert!(c.to_string().contains("writing k"), "{c}");
    }

    #[test]
    fn io_errors_keep_the_kind_and_the_message() {
        let e: io::Error = Error::NoInterface("nosuch0".into()).into();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        assert!(e.to_string().contains("\"nosuch0\""), "{e}");
        let e: io::Error = Error::Config("port 0".into()).into();
        assert_eq!(e.to_string(), "port 0");
    }
}
