//! What the node agent keeps across gatherd restarts: the role it serves (site and
//! version), its switch count (`ROLE_EPOCH`) and a boot epoch, in a small state file
//! (default `/var/lib/farside/node<ID>.state`, `--role-state PATH`).
//!
//! Why: balancers move a node with a CAS that expects the exact role word they read
//! (`site << 48 | version`) and fence it with FETCH-ADD; that is safe only while a
//! node's versions never repeat. A gatherd that restarted at site 0, version 1 moved
//! the node silently and made versions of an earlier life valid again, so a balancer's
//! CAS in flight from before the restart could succeed on the new one.
//!
//! How: every start increments the boot epoch and writes it durably (temporary file,
//! `fsync`, `rename`, directory `fsync`: `farside_rt::rundir::write_atomic`) before the
//! role is published. The boot epoch is folded into the version's high bits: boot `b`
//! starts at [`version_base`]`(b)` = `(b - 1) << VERSION_BOOT_SHIFT | 1`, and the first
//! version is also above every version the previous life persisted. So a restarted
//! node's versions are above every version its earlier lives issued (up to
//! `2^VERSION_BOOT_SHIFT - 1` changes per life), including wanted versions a balancer
//! wrote that the agent had not yet persisted. The served site survives too, so a
//! restart serves what the node served before (`--role-initial` applies only to a
//! node's first start, with no state file).
//!
//! The file is validated on load (format line, every field, the node id, the site in
//! range); a file that fails is refused with its path and the reason, never silently
//! replaced: starting afresh would make earlier versions valid again.

use std::io;
use std::path::{Path, PathBuf};

use farside_reconf::Role;

/// First line of a state file: the format and its version.
const MAGIC: &str = "farside-gatherd-state 1";
/// Bits of a role version below the boot epoch: versions one gatherd life may issue
/// (16.7 M moves and fences: a move or fence a second for 194 days) before they would
/// reach the next life's range.
pub const VERSION_BOOT_SHIFT: u32 = 24;
/// Largest boot epoch: the role version has 48 bits, of which the boot epoch takes the
/// upper 24 (16.7 M restarts).
pub const BOOT_EPOCH_MAX: u64 = (1 << (48 - VERSION_BOOT_SHIFT)) - 1;
/// Largest state file read: a few short lines.
const STATE_BYTES_MAX: usize = 4096;

/// The first version of boot epoch `boot` (1-based): boot 1 starts at 1, as a node
/// without a state file always did.
pub fn version_base(boot: u64) -> u64 {
    ((boot.saturating_sub(1)) << VERSION_BOOT_SHIFT) | 1
}

/// The persisted state of one node's agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RoleState {
    pub node_id: u64,
    /// Starts of this node's gatherd (with the agent), this one included.
    pub boot_epoch: u64,
    /// The site served.
    pub site: u16,
    /// The highest role version seen (served or wanted).
    pub version: u64,
    /// `ROLE_EPOCH`: sites switched to over all lives.
    pub role_epoch: u64,
}

impl RoleState {
    fn encode(&self) -> String {
        format!(
            "{MAGIC}\nnode_id {}\nboot_epoch {}\nsite {}\nversion {}\nrole_epoch {}\n",
            self.node_id, self.boot_epoch, self.site, self.version, self.role_epoch
        )
    }

    fn decode(text: &str) -> Result<RoleState, String> {
        let mut lines = text.lines();
        if lines.next() != Some(MAGIC) {
            return Err(format!(
                "not a gatherd state file (first line is not `{MAGIC}`)"
            ));
        }
        let mut fields = [None::<u64>; 5];
        const NAMES: [&str; 5] = ["node_id", "boot_epoch", "site", "version", "role_epoch"];
        for line in lines {
            let (k, v) = line
                .split_once(' ')
                .ok_or_else(|| format!("line {line:?}: expected `NAME VALUE`"))?;
            let i = NAMES
                .iter()
                .position(|n| *n == k)
                .ok_or_else(|| format!("unknown field {k:?}"))?;
            if fields[i].is_some() {
                return Err(format!("field {k} given twice"));
            }
            fields[i] = Some(v.parse().map_err(|e| format!("{k} {v:?}: {e}"))?);
        }
        let get = |i: usize| fields[i].ok_or_else(|| format!("field {} missing", NAMES[i]));
        let (node_id, boot_epoch, site) = (get(0)?, get(1)?, get(2)?);
        let st = RoleState {
            node_id,
            boot_epoch,
            site: u16::try_from(site).map_err(|_| format!("site {site}: above 65535"))?,
            version: get(3)?,
            role_epoch: get(4)?,
        };
        if st.boot_epoch == 0 || st.boot_epoch > BOOT_EPOCH_MAX {
            return Err(format!(
                "boot_epoch {}: 1..={BOOT_EPOCH_MAX}",
                st.boot_epoch
            ));
        }
        if st.version == 0 || st.version >= 1 << 48 {
            return Err(format!("version {}: 1..2^48", st.version));
        }
        Ok(st)
    }
}

/// The state file of node `node_id` when `--role-state` is not given.
pub fn default_path(node_id: u64) -> PathBuf {
    farside_rt::rundir::default_state_dir().join(format!("node{node_id}.state"))
}

/// Read and validate the state at `path`; `Ok(None)` if there is none (a first start).
pub fn load(path: &Path, node_id: u64) -> io::Result<Option<RoleState>> {
    let bad = |why: String| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "--role-state {}: {why}; refusing to start (removing it makes versions of \
                 earlier lives valid again: do so only with no balancer running)",
                path.display()
            ),
        )
    };
    let Some(bytes) = farside_rt::rundir::read_file(path)? else {
        return Ok(None);
    };
    if bytes.len() > STATE_BYTES_MAX {
        return Err(bad(format!(
            "{} bytes, at most {STATE_BYTES_MAX}",
            bytes.len()
        )));
    }
    let text = std::str::from_utf8(&bytes).map_err(|_| bad("not UTF-8".into()))?;
    let st = RoleState::decode(text).map_err(bad)?;
    if st.node_id != node_id {
        return Err(bad(format!(
            "the state of node {}, this is node {node_id}",
            st.node_id
        )));
    }
    Ok(Some(st))
}

/// Write `st` to `path` atomically and durably (0600; the directory made 0700).
pub fn save(path: &Path, st: &RoleState) -> io::Result<()> {
    farside_rt::rundir::write_atomic(path, st.encode().as_bytes(), farside_rt::rundir::FILE_MODE)
        .map_err(|e| io::Error::new(e.kind(), format!("--role-state: {e}")))
}

/// This start's state, from the previous one (`None`: a first start serving
/// `initial_site`): the boot epoch incremented, the previous site, and a first version
/// above both the new boot's base and everything the previous life persisted.
pub fn next_boot(
    prev: Option<RoleState>,
    node_id: u64,
    initial_site: u16,
) -> io::Result<RoleState> {
    let Some(p) = prev else {
        return Ok(RoleState {
            node_id,
            boot_epoch: 1,
            site: initial_site,
            version: version_base(1),
            role_epoch: 1,
        });
    };
    let boot_epoch = p.boot_epoch + 1;
    if boot_epoch > BOOT_EPOCH_MAX {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("boot epoch {boot_epoch} above {BOOT_EPOCH_MAX}: role versions would repeat"),
        ));
    }
    let version = version_base(boot_epoch).max(p.version + 1);
    if version >= 1 << 48 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("role version {version} above 48 bits: versions would repeat"),
        ));
    }
    Ok(RoleState {
        node_id,
        boot_epoch,
        site: p.site,
        version,
        role_epoch: p.role_epoch + 1,
    })
}

impl RoleState {
    /// The role word this state serves.
    pub fn role(&self) -> Role {
        Role::new(self.site, self.version)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("farside-state-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn a_state_round_trips_and_each_boot_starts_above_the_last() {
        let dir = tmp("rt");
        let p = dir.join("node7.state");
        assert_eq!(load(&p, 7).unwrap(), None);
        let first = next_boot(None, 7, 3).unwrap();
        assert_eq!(first.role(), Role::new(3, 1), "a first start is as before");
        save(&p, &first).unwrap();
        let back = load(&p, 7).unwrap().unwrap();
        assert_eq!(back, first);
        // The previous life moved to site 5 and reached version 40.
        let moved = RoleState {
            site: 5,
            version: 40,
            role_epoch: 2,
            ..first
        };
        let second = next_boot(Some(moved), 7, 3).unwrap();
        assert_eq!(second.boot_epoch, 2);
        assert_eq!(
            second.site, 5,
            "the served site survives; --role-initial does not apply"
        );
        assert_eq!(second.version, version_base(2));
        assert!(second.version > 40 && second.role_epoch > 2);
        // A life that used more versions than its range: the next starts above them.
        let busy = RoleState {
            version: version_base(3) + 9,
            ..second
        };
        assert_eq!(
            next_boot(Some(busy), 7, 0).unwrap().version,
            version_base(3) + 10
        );
        use std::os::unix::fs::MetadataExt;
        assert_eq!(std::fs::metadata(&p).unwrap().mode() & 0o777, 0o600);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_bad_state_file_is_refused_with_the_reason() {
        let dir = tmp("bad");
        let p = dir.join("node1.state");
        save(&p, &next_boot(None, 1, 0).unwrap()).unwrap();
        let e = load(&p, 2).unwrap_err().to_string();
        assert!(e.contains("the state of node 1, this is node 2"), "{e}");
        for (text, why) in [
            ("hello\n", "not a gatherd state file"),
            ("farside-gatherd-state 1\nnode_id 1\n", "field boot_epoch missing"),
            (
                "farside-gatherd-state 1\nnode_id 1\nboot_epoch 1\nsite 70000\nversion 1\nrole_epoch 1\n",
                "above 65535",
            ),
            (
                "farside-gatherd-state 1\nnode_id 1\nboot_epoch 0\nsite 0\nversion 1\nrole_epoch 1\n",
                "boot_epoch 0",
            ),
            (
                "farside-gatherd-state 1\nnode_id 1\nnode_id 1\n",
                "given twice",
            ),
        ] {
            farside_rt::rundir::write_atomic(&p, text.as_bytes(), 0o600).unwrap();
            let e = load(&p, 1).unwrap_err().to_string();
            assert!(e.contains(why) && e.contains("refusing to start"), "{e}");
        }
        let e = next_boot(
            Some(RoleState {
                node_id: 1,
                boot_epoch: BOOT_EPOCH_MAX,
                site: 0,
                version: 1,
                role_epoch: 1,
            }),
            1,
            0,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("would repeat"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
