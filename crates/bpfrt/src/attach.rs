//! Attaching an object's programs: XDP on an interface in a mode, tc (cls_bpf,
//! direct action) on an interface's ingress, sk_lookup on the calling thread's network
//! namespace. The links belong to the process and are pinned nowhere, so a process
//! that dies leaves nothing attached (except a tc filter attached through netlink on
//! kernels before 6.6, which stays with its qdisc).

use aya::programs::sk_lookup::SkLookupLinkId;
use aya::programs::tc::{SchedClassifierLinkId, TcAttachType};
use aya::programs::xdp::XdpLinkId;
use aya::programs::{ProgramError, SchedClassifier, SkLookup, Xdp};

use crate::error::{error_chain, is_permission_error, Error, Result};
use crate::object::Object;

/// How an XDP program is attached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum XdpMode {
    /// In the driver (veth needs an XDP program on its peer too, even a bare XDP_PASS).
    Native,
    /// In the generic network stack path: works on any interface, a bit slower.
    Generic,
}

impl XdpMode {
    /// "native" or "generic".
    pub fn name(self) -> &'static str {
        match self {
            XdpMode::Native => "native",
            XdpMode::Generic => "generic",
        }
    }
}

/// An attach error: privilege, a missing interface, or what the kernel said.
fn attach_error(
    label: &'static str,
    ifname: &str,
    target: String,
    hint: &'static str,
    e: ProgramError,
) -> Error {
    if let ProgramError::UnknownInterface { name } = &e {
        return Error::NoInterface(name.clone());
    }
    if is_permission_error(&e) {
        return Error::NoPrivilege {
            program: label,
            step: format!("attaching to {ifname}"),
        };
    }
    Error::Attach {
        program: label,
        target,
        detail: error_chain(&e),
        hint,
    }
}

impl Object {
    /// Attach loaded XDP program `prog` to `ifname` (in the calling thread's network
    /// namespace) in `mode`. A refusal in native mode suggests generic mode.
    pub fn attach_xdp(&mut self, prog: &str, ifname: &str, mode: XdpMode) -> Result<XdpLinkId> {
        let label = self.label();
        let aya_mode = match mode {
            XdpMode::Native => aya::programs::XdpMode::Driver,
            XdpMode::Generic => aya::programs::XdpMode::Skb,
        };
        let p: &mut Xdp = self.program_mut(prog)?;
        p.attach(ifname, aya_mode).map_err(|e| {
            let hint = if mode == XdpMode::Native {
                " (try generic mode)"
            } else {
                ""
            };
            attach_error(
                label,
                ifname,
                format!("{ifname} in {} mode", mode.name()),
                hint,
                e,
            )
        })
    }

    /// Detach XDP program `prog`'s `link` (to `ifname`, for errors).
    pub fn detach_xdp(&mut self, prog: &str, link: XdpLinkId, ifname: &str) -> Result<()> {
        let label = self.label();
        let p: &mut Xdp = self.program_mut(prog)?;
        p.detach(link).map_err(|e| Error::Attach {
            program: label,
            target: format!("{ifname} (detaching)"),
            detail: error_chain(&e),
            hint: "",
        })
    }

    /// Attach loaded tc program `prog` to `ifname`'s ingress: a TCX link (Linux 6.6+),
    /// else a filter on a clsact qdisc (added if missing).
    pub fn attach_tc_ingress(&mut self, prog: &str, ifname: &str) -> Result<SchedClassifierLinkId> {
        let label = self.label();
        let p: &mut SchedClassifier = self.program_mut(prog)?;
        p.attach(ifname, TcAttachType::Ingress)
            .or_else(|e| {
                // Kernels before 6.6 (no TCX) attach through a clsact qdisc.
                if aya::programs::tc::qdisc_add_clsact(ifname).is_ok() {
                    p.attach(ifname, TcAttachType::Ingress)
                } else {
                    Err(e)
                }
            })
            .map_err(|e| attach_error(label, ifname, format!("{ifname}'s tc ingress"), "", e))
    }

    /// Detach tc program `prog`'s `link` (to `ifname`'s ingress, for errors).
    pub fn detach_tc(
        &mut self,
        prog: &str,
        link: SchedClassifierLinkId,
        ifname: &str,
    ) -> Result<()> {
        let label = self.label();
        let p: &mut SchedClassifier = self.program_mut(prog)?;
        p.detach(link).map_err(|e| Error::Attach {
            program: label,
            target: format!("{ifname}'s tc ingress (detaching)"),
            detail: error_chain(&e),
            hint: "",
        })
    }

    /// Attach loaded sk_lookup program `prog` to the calling thread's network namespace.
    pub fn attach_sk_lookup(&mut self, prog: &str) -> Result<SkLookupLinkId> {
        let label = self.label();
        let netns = std::fs::File::open("/proc/thread-self/ns/net")
            .map_err(|e| Error::os(label, "opening /proc/thread-self/ns/net", e))?;
        let p: &mut SkLookup = self.program_mut(prog)?;
        p.attach(&netns).map_err(|e| {
            if is_permission_error(&e) {
                Error::NoPrivilege {
                    program: label,
                    step: "attaching to the network namespace".into(),
                }
            } else {
                Error::Attach {
                    program: label,
                    target: "the network namespace".into(),
                    detail: error_chain(&e),
                    hint: "",
                }
            }
        })
    }
}
