//! Keys: loaded from files or systemd credentials (never from command lines), checked
//! before use, held in a keyring by key id with their rights, rotated and revoked.
//!
//! A key file holds one 128-bit SipHash key as 32 hexadecimal digits (a trailing newline
//! is fine): `openssl rand -hex 16 > key && chmod 0600 key`. [`load_key`] looks for
//! `$CREDENTIALS_DIRECTORY/<name>` first (systemd's `LoadCredential=<name>:<path>`
//! puts it there), else the configured path, and refuses:
//! - a file others may read: from a path, the owner must be the process's effective
//!   user and the mode exactly 0600 or 0400, with no ACL granting anyone else; from the
//!   credentials directory, also systemd's own form (root-owned 0400, the service user
//!   given read by an ACL entry, which makes `stat` show the ACL mask as mode 0440);
//! - a key that is not exactly 16 bytes, is all zeros, or (outside the lab) equals or
//!   contains a key the repository shows as an example ([`EXAMPLE_KEYS_64`],
//!   [`EXAMPLE_KEYS_128`], a test keeps the list complete), or has fewer than
//!   [`DISTINCT_BYTES_MIN`] distinct bytes (not random: 16 random bytes have fewer
//!   with probability under 2e-12).
//!
//! [`Policy::Lab`] is the escape hatch of loopback labs and tests: example and
//! generated keys ([`generate_key`]) are allowed; file permissions are still checked.
//!
//! A [`Keyring`] maps key ids to keys and their [`Rights`]. Keys are installed under a
//! name (a peer or a role, e.g. `balancer`); per name there is a current key (senders
//! seal with it) and at most one previous key (receivers still verify it). Rotation
//! without downtime: install the new key on every receiver, then on the senders (they
//! switch to it), then revoke the old id; a message under either id verifies in
//! between. Revocation removes a key id at once (call `ReplayTable::forget_key` too).

use crate::mac::KeyId;
use crate::rights::Rights;
use crate::siphash::SipKey;
use std::fmt;
use std::fs::File;
use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Bytes of a key.
pub const KEY_BYTES: usize = 16;
/// Largest key file read: 32 hex digits and some white space; anything longer is not a
/// key file.
pub const KEY_FILE_BYTES_MAX: usize = 256;
/// Most keys in a keyring: a current and a previous key for a few dozen peers or roles.
pub const KEYS_MAX: usize = 64;
/// Fewest distinct byte values a production key must have.
pub const DISTINCT_BYTES_MIN: usize = 8;
/// The environment variable systemd sets for a service with credentials.
pub const CREDENTIALS_DIRECTORY: &str = "CREDENTIALS_DIRECTORY";

/// The 64-bit access keys the repository shows (rmem's default read key, `deploy/`'s
/// examples, docs): refused as either half of a key outside the lab.
pub const EXAMPLE_KEYS_64: [u64; 4] = [
    u64::from_le_bytes(*b"farside0"),
    0x5ec7_e7a1_1d00_d1e5,
    0x7a3f_00c0_ffee_4b1d,
    0x5eed_5eed_5eed_5eed,
];

/// The lab's well-known key (loopback labs and tests, [`Policy::Lab`] only).
pub const LAB_KEY: [u8; KEY_BYTES] = *b"farside-lab-key!";

/// 128-bit keys the repository shows: refused outside the lab.
pub const EXAMPLE_KEYS_128: [[u8; KEY_BYTES]; 2] = [
    LAB_KEY,
    // The vectors' key of the SipHash paper (00 01 .. 0f), used by this crate's tests.
    [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15],
];

/// Which keys are acceptable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// Only keys that look random, from files; the default.
    Production,
    /// Also example, default and generated keys (loopback labs, tests).
    Lab,
}

/// Where a key was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// `$CREDENTIALS_DIRECTORY/<name>`.
    Credential,
    /// The configured path.
    File,
}

/// Why a key was refused. Never contains key material.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyError {
    /// A credential name must be a file name.
    BadName(String),
    /// Neither the credential nor a path exists.
    NotFound {
        name: String,
        looked: Vec<PathBuf>,
    },
    Io {
        path: PathBuf,
        error: String,
    },
    NotRegularFile(PathBuf),
    /// Others may read it (or the owner is not us).
    Exposed {
        path: PathBuf,
        why: String,
    },
    TooLarge {
        path: PathBuf,
        bytes: u64,
    },
    /// Not hexadecimal.
    NotHex {
        path: PathBuf,
    },
    /// Not exactly [`KEY_BYTES`] bytes (`bytes` decoded).
    WrongLength {
        bytes: usize,
    },
    AllZero,
    /// Equals or contains an example key of the repository.
    ExampleKey,
    /// Too few distinct bytes to be random.
    LowEntropy {
        distinct: usize,
    },
    /// Generated keys are for the lab only.
    GeneratedOutsideLab,
    /// The key id already names another key.
    DuplicateId(KeyId),
    TooManyKeys,
}

impl fmt::Display for KeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyError::BadName(n) => write!(f, "credential name `{n}`: must be a file name"),
            KeyError::NotFound { name, looked } => {
                write!(f, "key `{name}` not found (looked at")?;
                for p in looked {
                    write!(f, " {}", p.display())?;
                }
                f.write_str(")")
            }
            KeyError::Io { path, error } => write!(f, "{}: {error}", path.display()),
            KeyError::NotRegularFile(p) => write!(f, "{}: not a regular file", p.display()),
            KeyError::Exposed { path, why } => write!(
                f,
                "{}: {why}; a key file must be readable by its owner only (chmod 0600)",
                path.display()
            ),
            KeyError::TooLarge { path, bytes } => write!(
                f,
                "{}: {bytes} bytes, a key file has at most {KEY_FILE_BYTES_MAX}",
                path.display()
            ),
            KeyError::NotHex { path } => write!(
                f,
                "{}: expected {} hexadecimal digits (openssl rand -hex {KEY_BYTES})",
                path.display(),
                2 * KEY_BYTES
            ),
            KeyError::WrongLength { bytes } => {
                write!(f, "key of {bytes} bytes, keys are exactly {KEY_BYTES}")
            }
            KeyError::AllZero => f.write_str("all-zero key"),
            KeyError::ExampleKey => f.write_str(
                "an example key shipped with farside: anyone can read it (allowed in the lab only)",
            ),
            KeyError::LowEntropy { distinct } => write!(
                f,
                "key has {distinct} distinct bytes, fewer than {DISTINCT_BYTES_MIN}: not random"
            ),
            KeyError::GeneratedOutsideLab => {
                f.write_str("generated keys are for the lab only; load keys from files")
            }
            KeyError::DuplicateId(id) => write!(f, "{id} is already installed"),
            KeyError::TooManyKeys => write!(f, "keyring full ({KEYS_MAX} keys)"),
        }
    }
}

impl std::error::Error for KeyError {}

/// Is `key` acceptable under `policy`?
pub fn check_key(key: &[u8; KEY_BYTES], policy: Policy) -> Result<(), KeyError> {
    if key.iter().all(|&b| b == 0) {
        return Err(KeyError::AllZero);
    }
    if policy == Policy::Lab {
        return Ok(());
    }
    let halves = [&key[..8], &key[8..]];
    let example_half = halves.iter().any(|h| {
        let h: [u8; 8] = (*h).try_into().expect("8 bytes");
        EXAMPLE_KEYS_64.contains(&u64::from_le_bytes(h))
            || EXAMPLE_KEYS_64.contains(&u64::from_be_bytes(h))
    });
    if example_half || EXAMPLE_KEYS_128.contains(key) {
        return Err(KeyError::ExampleKey);
    }
    let mut seen = [false; 256];
    key.iter().for_each(|&b| seen[b as usize] = true);
    let distinct = seen.iter().filter(|&&s| s).count();
    if distinct < DISTINCT_BYTES_MIN {
        return Err(KeyError::LowEntropy { distinct });
    }
    Ok(())
}

/// The key of a key file's text: 32 hex digits, white space around them ignored.
pub fn parse_key_text(text: &[u8], path: &Path) -> Result<[u8; KEY_BYTES], KeyError> {
    let digits: Vec<u8> = text
        .iter()
        .copied()
        .skip_while(u8::is_ascii_whitespace)
        .collect();
    let end = digits
        .iter()
        .rposition(|b| !b.is_ascii_whitespace())
        .map_or(0, |i| i + 1);
    let digits = &digits[..end];
    let not_hex = || KeyError::NotHex {
        path: path.to_path_buf(),
    };
    if !digits.iter().all(u8::is_ascii_hexdigit) {
        return Err(not_hex());
    }
    if digits.len() % 2 != 0 {
        return Err(not_hex());
    }
    if digits.len() != 2 * KEY_BYTES {
        return Err(KeyError::WrongLength {
            bytes: digits.len() / 2,
        });
    }
    let mut key = [0u8; KEY_BYTES];
    for (i, pair) in digits.chunks_exact(2).enumerate() {
        let s = std::str::from_utf8(pair).map_err(|_| not_hex())?;
        key[i] = u8::from_str_radix(s, 16).map_err(|_| not_hex())?;
    }
    Ok(key)
}

// POSIX ACL extended attribute (linux/posix_acl_xattr.h): a u32 version, then entries
// of (u16 tag, u16 perm, u32 id), little-endian.
const ACL_XATTR_VERSION: u32 = 2;
const ACL_USER_OBJ: u16 = 0x01;
const ACL_USER: u16 = 0x02;
const ACL_GROUP_OBJ: u16 = 0x04;
const ACL_GROUP: u16 = 0x08;
const ACL_MASK: u16 = 0x10;
const ACL_OTHER: u16 = 0x20;
const ACL_READ: u16 = 4;
const ACL_WRITE: u16 = 2;

/// May the file be used as a key file, given its `mode`, `owner`, our `euid` and its
/// access ACL (the raw `system.posix_acl_access` attribute, if any)? `Err` says why
/// not.
pub fn check_access(
    origin: Origin,
    mode: u32,
    owner: u32,
    euid: u32,
    acl: Option<&[u8]>,
) -> Result<(), String> {
    let perm = mode & 0o7777;
    let entries = match acl {
        None => Vec::new(),
        Some(raw) => parse_acl(raw)?,
    };
    let others_in_acl = |allowed_user: Option<u32>| {
        entries.iter().find_map(|&(tag, perm, id)| match tag {
            ACL_USER if Some(id) != allowed_user || perm & ACL_WRITE != 0 => {
                Some(format!("its ACL lets user {id} access it"))
            }
            ACL_GROUP => Some(format!("its ACL lets group {id} access it")),
            ACL_GROUP_OBJ | ACL_OTHER if perm != 0 => {
                Some("its ACL lets its group or others access it".to_string())
            }
            _ => None,
        })
    };
    // The owner's own file, readable by the owner only.
    if owner == euid {
        if perm != 0o600 && perm != 0o400 {
            return Err(format!("mode {perm:04o}, not 0600 or 0400"));
        }
        return match others_in_acl(None) {
            Some(why) => Err(why),
            None => Ok(()),
        };
    }
    // systemd's credential: root's 0400 file, our user given read by an ACL entry (the
    // group bits then show the ACL's mask), or chowned to us where ACLs are missing
    // (the case above).
    if origin == Origin::Credential && owner == 0 && (perm == 0o400 || perm == 0o440) {
        if perm == 0o440 && acl.is_none() {
            return Err("mode 0440 without an ACL: its group may read it".to_string());
        }
        if let Some(why) = others_in_acl(Some(euid)) {
            return Err(why);
        }
        if !entries
            .iter()
            .any(|&(tag, p, id)| tag == ACL_USER && id == euid && p & ACL_READ != 0)
        {
            return Err(format!("owned by root and no ACL lets user {euid} read it"));
        }
        return Ok(());
    }
    Err(format!(
        "owned by user {owner}, not by this process's user {euid}"
    ))
}

fn parse_acl(raw: &[u8]) -> Result<Vec<(u16, u16, u32)>, String> {
    let bad = || "unreadable ACL".to_string();
    if raw.len() < 4 || (raw.len() - 4) % 8 != 0 {
        return Err(bad());
    }
    if u32::from_le_bytes(raw[..4].try_into().expect("4 bytes")) != ACL_XATTR_VERSION {
        return Err(bad());
    }
    Ok(raw[4..]
        .chunks_exact(8)
        .map(|e| {
            (
                u16::from_le_bytes([e[0], e[1]]),
                u16::from_le_bytes([e[2], e[3]]),
                u32::from_le_bytes([e[4], e[5], e[6], e[7]]),
            )
        })
        .filter(|&(tag, ..)| tag != ACL_USER_OBJ && tag != ACL_MASK)
        .collect())
}

/// The access ACL of an open file, if it has one.
fn access_acl(file: &File) -> Result<Option<Vec<u8>>, std::io::Error> {
    let name = c"system.posix_acl_access";
    let mut buf = vec![0u8; 1024];
    // SAFETY: the fd is open for the call; buf is writable for buf.len() bytes.
    let n = unsafe {
        libc::fgetxattr(
            file.as_raw_fd(),
            name.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    if n < 0 {
        let e = std::io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::ENODATA) | Some(libc::EOPNOTSUPP) => Ok(None),
            _ => Err(e),
        };
    }
    buf.truncate(n as usize);
    Ok(Some(buf))
}

/// The process's effective user id.
pub fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// A key read from a file, and where from.
#[derive(Debug, Clone)]
pub struct LoadedKey {
    pub key: SipKey,
    pub path: PathBuf,
    pub origin: Origin,
}

/// Load key `name`: `$CREDENTIALS_DIRECTORY/<name>` if the service manager provided
/// it, else `path`.
pub fn load_key(name: &str, path: Option<&Path>, policy: Policy) -> Result<LoadedKey, KeyError> {
    let creds = std::env::var_os(CREDENTIALS_DIRECTORY).map(PathBuf::from);
    load_key_from(creds.as_deref(), name, path, policy, euid())
}

/// [`load_key`] with the credentials directory and the effective user given.
pub fn load_key_from(
    credentials_dir: Option<&Path>,
    name: &str,
    path: Option<&Path>,
    policy: Policy,
    euid: u32,
) -> Result<LoadedKey, KeyError> {
    if name.is_empty() || name.contains('/') || name == "." || name == ".." {
        return Err(KeyError::BadName(name.to_string()));
    }
    let mut looked = Vec::new();
    if let Some(dir) = credentials_dir {
        let p = dir.join(name);
        if p.exists() {
            return read_key_file(&p, Origin::Credential, policy, euid);
        }
        looked.push(p);
    }
    if let Some(p) = path {
        return read_key_file(p, Origin::File, policy, euid);
    }
    Err(KeyError::NotFound {
        name: name.to_string(),
        looked,
    })
}

/// Open, check the opened file's metadata (no race with a rename), read, parse, check.
fn read_key_file(
    path: &Path,
    origin: Origin,
    policy: Policy,
    euid: u32,
) -> Result<LoadedKey, KeyError> {
    let io = |e: std::io::Error| KeyError::Io {
        path: path.to_path_buf(),
        error: e.to_string(),
    };
    let file = File::open(path).map_err(io)?;
    let meta = file.metadata().map_err(io)?;
    if !meta.file_type().is_file() {
        return Err(KeyError::NotRegularFile(path.to_path_buf()));
    }
    let acl = access_acl(&file).map_err(io)?;
    check_access(origin, meta.mode(), meta.uid(), euid, acl.as_deref()).map_err(|why| {
        KeyError::Exposed {
            path: path.to_path_buf(),
            why,
        }
    })?;
    if meta.len() > KEY_FILE_BYTES_MAX as u64 {
        return Err(KeyError::TooLarge {
            path: path.to_path_buf(),
            bytes: meta.len(),
        });
    }
    let mut text = Vec::with_capacity(KEY_FILE_BYTES_MAX);
    file.take(KEY_FILE_BYTES_MAX as u64 + 1)
        .read_to_end(&mut text)
        .map_err(io)?;
    let key = parse_key_text(&text, path)?;
    check_key(&key, policy)?;
    Ok(LoadedKey {
        key: SipKey::from_bytes(key),
        path: path.to_path_buf(),
        origin,
    })
}

/// A fresh random key from the kernel, for the lab only.
pub fn generate_key(policy: Policy) -> Result<SipKey, KeyError> {
    if policy != Policy::Lab {
        return Err(KeyError::GeneratedOutsideLab);
    }
    let mut b = [0u8; KEY_BYTES];
    let mut filled = 0;
    while filled < KEY_BYTES {
        // SAFETY: the pointer and length describe the unfilled tail of `b`.
        let n = unsafe { libc::getrandom(b[filled..].as_mut_ptr().cast(), KEY_BYTES - filled, 0) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(KeyError::Io {
                path: PathBuf::from("getrandom"),
                error: e.to_string(),
            });
        }
        filled += n as usize;
    }
    Ok(SipKey::from_bytes(b))
}

/// Whether a key is its name's current one (senders use it) or the one before.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Generation {
    Current,
    Previous,
}

/// One installed key.
#[derive(Debug, Clone)]
pub struct KeyEntry {
    pub id: KeyId,
    /// The peer or role it is for.
    pub name: String,
    pub key: SipKey,
    pub rights: Rights,
    pub generation: Generation,
}

/// Keys by id, at most [`KEYS_MAX`]; see the module doc for rotation.
#[derive(Debug, Clone)]
pub struct Keyring {
    policy: Policy,
    entries: Vec<KeyEntry>,
}

impl Keyring {
    pub fn new(policy: Policy) -> Keyring {
        Keyring {
            policy,
            entries: Vec::new(),
        }
    }

    pub fn policy(&self) -> Policy {
        self.policy
    }

    /// Install `key` as `name`'s current key. `name`'s current key becomes its
    /// previous one; its former previous key is removed and its id returned (forget its
    /// replay windows). Refuses an id in use, a full ring, or a key the policy refuses.
    pub fn install(
        &mut self,
        name: &str,
        id: KeyId,
        key: SipKey,
        rights: Rights,
    ) -> Result<Option<KeyId>, KeyError> {
        check_key(&key.to_bytes(), self.policy)?;
        if self.entries.iter().any(|e| e.id == id) {
            return Err(KeyError::DuplicateId(id));
        }
        let dropped = self
            .entries
            .iter()
            .find(|e| e.name == name && e.generation == Generation::Previous)
            .map(|e| e.id);
        let has_current = self
            .entries
            .iter()
            .any(|e| e.name == name && e.generation == Generation::Current);
        let len_after = self.entries.len() + 1 - usize::from(has_current && dropped.is_some());
        if len_after > KEYS_MAX {
            return Err(KeyError::TooManyKeys);
        }
        if has_current {
            self.entries
                .retain(|e| !(e.name == name && e.generation == Generation::Previous));
        }
        for e in self.entries.iter_mut().filter(|e| e.name == name) {
            e.generation = Generation::Previous;
        }
        self.entries.push(KeyEntry {
            id,
            name: name.to_string(),
            key,
            rights,
            generation: Generation::Current,
        });
        Ok(if has_current { dropped } else { None })
    }

    /// Remove key `id` (whatever its generation). Returns whether it was installed.
    pub fn revoke(&mut self, id: KeyId) -> bool {
        let before = self.entries.len();
        self.entries.retain(|e| e.id != id);
        self.entries.len() != before
    }

    /// The key a receiver verifies `id` with, current or previous.
    pub fn get(&self, id: KeyId) -> Option<&KeyEntry> {
        self.entries.iter().find(|e| e.id == id)
    }

    /// The key a sender seals with for `name`.
    pub fn current(&self, name: &str) -> Option<&KeyEntry> {
        self.entries
            .iter()
            .find(|e| e.name == name && e.generation == Generation::Current)
    }

    /// For [`crate::mac::open`]: the key of an id.
    pub fn key_of(&self, id: KeyId) -> Option<SipKey> {
        self.get(id).map(|e| e.key)
    }

    /// Every installed key, current and previous (a loader copying the ring into a
    /// BPF map).
    pub fn iter(&self) -> impl Iterator<Item = &KeyEntry> {
        self.entries.iter()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::siphash::tests::Rng;
    use std::os::unix::fs::PermissionsExt;
    use std::sync::atomic::{AtomicU32, Ordering};

    /// A fresh directory under the system's temp dir, removed on drop.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new() -> TempDir {
            static N: AtomicU32 = AtomicU32::new(0);
            let p = std::env::temp_dir().join(format!(
                "farside-auth-keys-{}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            ));
            std::fs::create_dir_all(&p).unwrap();
            TempDir(p)
        }

        fn file(&self, name: &str, text: &str, mode: u32) -> PathBuf {
            let p = self.0.join(name);
            std::fs::write(&p, text).unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
            p
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    const GOOD_HEX: &str = "8f3a61c2d94e07b5a1c83d6e2f904b17";

    fn good() -> [u8; KEY_BYTES] {
        parse_key_text(GOOD_HEX.as_bytes(), Path::new("k")).unwrap()
    }

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    #[test]
    fn key_text_is_32_hex_digits_with_white_space_around() {
        let p = Path::new("k");
        assert_eq!(hex(&good()), GOOD_HEX);
        let upper = format!("  {}\n", GOOD_HEX.to_uppercase());
        assert_eq!(parse_key_text(upper.as_bytes(), p), Ok(good()));
        assert_eq!(
            parse_key_text(b"5ec7e7a11d00d1e5\n", p),
            Err(KeyError::WrongLength { bytes: 8 })
        );
        let long = format!("{GOOD_HEX}00");
        assert_eq!(
            parse_key_text(long.as_bytes(), p),
            Err(KeyError::WrongLength { bytes: 17 })
        );
        for bad in ["farside0farside0", "8f3a 61c2", "abc", ""] {
            let r = parse_key_text(bad.as_bytes(), p);
            assert!(
                matches!(
                    r,
                    Err(KeyError::NotHex { .. } | KeyError::WrongLength { .. })
                ),
                "{bad:?}: {r:?}"
            );
        }
    }

    #[test]
    fn weak_and_example_keys_are_refused_outside_the_lab() {
        assert_eq!(check_key(&good(), Policy::Production), Ok(()));
        let mut doubled = [0u8; KEY_BYTES];
        doubled[..8].copy_from_slice(b"farside0");
        doubled[8..].copy_from_slice(b"farside0");
        let mut hex_typed = good();
        hex_typed[8..].copy_from_slice(&0x5ec7_e7a1_1d00_d1e5u64.to_be_bytes());
        let mut le_half = good();
        le_half[..8].copy_from_slice(&0x7a3f_00c0_ffee_4b1du64.to_le_bytes());
        for example in [doubled, hex_typed, le_half, LAB_KEY, EXAMPLE_KEYS_128[1]] {
            assert_eq!(
                check_key(&example, Policy::Production),
                Err(KeyError::ExampleKey),
                "{}",
                hex(&example)
            );
            assert_eq!(check_key(&example, Policy::Lab), Ok(()));
        }
        for weak in [
            [0x11u8; KEY_BYTES],
            *b"abababababababab",
            *b"0123012301230123",
        ] {
            assert!(matches!(
                check_key(&weak, Policy::Production),
                Err(KeyError::LowEntropy { .. })
            ));
        }
        for policy in [Policy::Production, Policy::Lab] {
            assert_eq!(check_key(&[0; KEY_BYTES], policy), Err(KeyError::AllZero));
        }
        // Random keys pass (the entropy rule refuses fewer than one in 5e11).
        let mut rng = Rng(0x6b);
        for _ in 0..10_000 {
            let k = SipKey::from_halves(rng.next(), rng.next()).to_bytes();
            assert_eq!(check_key(&k, Policy::Production), Ok(()));
        }
    }

    /// An ACL attribute as the kernel stores it.
    fn acl(entries: &[(u16, u16, u32)]) -> Vec<u8> {
        let mut b = ACL_XATTR_VERSION.to_le_bytes().to_vec();
        for &(tag, perm, id) in entries {
            b.extend_from_slice(&tag.to_le_bytes());
            b.extend_from_slice(&perm.to_le_bytes());
            b.extend_from_slice(&id.to_le_bytes());
        }
        b
    }

    #[test]
    fn only_the_owner_may_read_a_key_file() {
        let f = Origin::File;
        assert_eq!(check_access(f, 0o100600, 1000, 1000, None), Ok(()));
        assert_eq!(check_access(f, 0o100400, 1000, 1000, None), Ok(()));
        for mode in [0o640, 0o644, 0o604, 0o700, 0o660, 0o200, 0o4600] {
            assert!(check_access(f, mode, 1000, 1000, None).is_err(), "{mode:o}");
        }
        assert!(check_access(f, 0o600, 0, 1000, None).is_err(), "not ours");
        assert!(
            check_access(f, 0o600, 1001, 1000, None).is_err(),
            "not ours"
        );
        // An ACL granting someone else, on a 0600 file.
        let extra_user = acl(&[(ACL_USER_OBJ, 6, 0), (ACL_USER, 4, 33), (ACL_MASK, 4, 0)]);
        assert!(check_access(f, 0o600, 1000, 1000, Some(&extra_user)).is_err());
        let group = acl(&[(ACL_USER_OBJ, 6, 0), (ACL_GROUP, 4, 50), (ACL_MASK, 4, 0)]);
        assert!(check_access(f, 0o600, 1000, 1000, Some(&group)).is_err());
        assert!(check_access(f, 0o600, 1000, 1000, Some(b"junk")).is_err());
    }

    #[test]
    fn systemd_credentials_are_accepted_in_the_form_systemd_writes_them() {
        let c = Origin::Credential;
        let me = 61234;
        // Root-owned 0400, `user:me:r--`: stat shows the mask as group bits, 0440.
        let systemd = acl(&[
            (ACL_USER_OBJ, 4, 0),
            (ACL_USER, 4, me),
            (ACL_GROUP_OBJ, 0, 0),
            (ACL_MASK, 4, 0),
            (ACL_OTHER, 0, 0),
        ]);
        assert_eq!(check_access(c, 0o100440, 0, me, Some(&systemd)), Ok(()));
        // Chowned to us where the file system has no ACLs.
        assert_eq!(check_access(c, 0o100400, me, me, None), Ok(()));
        // Not: the same from an ordinary path, a group-readable root file, an ACL for
        // someone else or with write, others' bits.
        assert!(check_access(Origin::File, 0o440, 0, me, Some(&systemd)).is_err());
        assert!(check_access(c, 0o440, 0, me, None).is_err());
        let other = acl(&[(ACL_USER, 4, me + 1), (ACL_MASK, 4, 0)]);
        assert!(check_access(c, 0o440, 0, me, Some(&other)).is_err());
        let write = acl(&[(ACL_USER, 6, me), (ACL_MASK, 6, 0)]);
        assert!(check_access(c, 0o460, 0, me, Some(&write)).is_err());
        let group_reads = acl(&[(ACL_USER, 4, me), (ACL_GROUP_OBJ, 4, 0), (ACL_MASK, 4, 0)]);
        assert!(check_access(c, 0o440, 0, me, Some(&group_reads)).is_err());
        assert!(check_access(c, 0o444, 0, me, Some(&systemd)).is_err());
    }

    #[test]
    fn keys_load_from_the_credentials_directory_first_then_the_path() {
        let d = TempDir::new();
        let creds = TempDir::new();
        let path = d.file("key", &format!("{GOOD_HEX}\n"), 0o600);
        let me = euid();
        let k = load_key_from(None, "balancer", Some(&path), Policy::Production, me).unwrap();
        assert_eq!(
            (k.key, k.origin),
            (SipKey::from_bytes(good()), Origin::File)
        );
        // With a credential of that name, it wins.
        let other = "0f1e2d3c4b5a69788796a5b4c3d2e1f0";
        creds.file("balancer", other, 0o400);
        let k = load_key_from(
            Some(&creds.0),
            "balancer",
            Some(&path),
            Policy::Production,
            me,
        )
        .unwrap();
        assert_eq!(k.origin, Origin::Credential);
        assert_eq!(hex(&k.key.to_bytes()), other);
        // Without one, the path.
        let k = load_key_from(
            Some(&creds.0),
            "monitor",
            Some(&path),
            Policy::Production,
            me,
        )
        .unwrap();
        assert_eq!(k.origin, Origin::File);
        // Neither.
        assert_eq!(
            load_key_from(Some(&creds.0), "monitor", None, Policy::Production, me).unwrap_err(),
            KeyError::NotFound {
                name: "monitor".into(),
                looked: vec![creds.0.join("monitor")]
            }
        );
        for bad in ["", ".", "..", "a/b", "../key"] {
            assert_eq!(
                load_key_from(Some(&creds.0), bad, Some(&path), Policy::Production, me)
                    .unwrap_err(),
                KeyError::BadName(bad.into())
            );
        }
    }

    #[test]
    fn exposed_odd_or_weak_key_files_are_refused() {
        let d = TempDir::new();
        let me = euid();
        let load = |p: &Path, policy| load_key_from(None, "k", Some(p), policy, me);
        let readable = d.file("readable", GOOD_HEX, 0o644);
        assert!(matches!(
            load(&readable, Policy::Production),
            Err(KeyError::Exposed { .. })
        ));
        // Policy::Lab still wants a private file.
        assert!(matches!(
            load(&readable, Policy::Lab),
            Err(KeyError::Exposed { .. })
        ));
        let good = d.file("good", GOOD_HEX, 0o600);
        assert!(matches!(
            load_key_from(None, "k", Some(&good), Policy::Production, me + 1),
            Err(KeyError::Exposed { .. })
        ));
        assert!(matches!(
            load(&d.0, Policy::Production),
            Err(KeyError::NotRegularFile(_))
        ));
        let big = d.file("big", &"0".repeat(KEY_FILE_BYTES_MAX + 1), 0o600);
        assert!(matches!(
            load(&big, Policy::Production),
            Err(KeyError::TooLarge { .. })
        ));
        let short = d.file("short", "5ec7e7a11d00d1e5", 0o600);
        assert_eq!(
            load(&short, Policy::Lab).unwrap_err(),
            KeyError::WrongLength { bytes: 8 }
        );
        let lab = d.file("lab", &hex(&LAB_KEY), 0o600);
        assert_eq!(
            load(&lab, Policy::Production).unwrap_err(),
            KeyError::ExampleKey
        );
        assert!(load(&lab, Policy::Lab).is_ok());
        let missing = d.0.join("missing");
        assert!(matches!(
            load(&missing, Policy::Production),
            Err(KeyError::Io { .. })
        ));
    }

    #[test]
    fn generated_keys_are_for_the_lab_only() {
        assert_eq!(
            generate_key(Policy::Production),
            Err(KeyError::GeneratedOutsideLab)
        );
        let a = generate_key(Policy::Lab).unwrap();
        let b = generate_key(Policy::Lab).unwrap();
        assert_ne!(a, b);
    }

    #[test]
    fn rotation_keeps_the_previous_key_verifying_until_revoked() {
        let mut ring = Keyring::new(Policy::Production);
        let mut rng = Rng(0x7e7);
        let mut key = || SipKey::from_halves(rng.next(), rng.next());
        let (k1, k2, k3) = (key(), key(), key());
        let r = || Rights::balancer(0);
        assert_eq!(ring.install("balancer", KeyId(1), k1, r()), Ok(None));
        assert_eq!(ring.current("balancer").unwrap().id, KeyId(1));
        // Rotate: 2 is current, 1 still verifies.
        assert_eq!(ring.install("balancer", KeyId(2), k2, r()), Ok(None));
        assert_eq!(ring.current("balancer").unwrap().id, KeyId(2));
        assert_eq!(ring.get(KeyId(1)).unwrap().generation, Generation::Previous);
        assert_eq!(ring.key_of(KeyId(1)), Some(k1));
        // Rotate again: 1 is dropped (and reported), 2 previous, 3 current.
        assert_eq!(
            ring.install("balancer", KeyId(3), k3, r()),
            Ok(Some(KeyId(1)))
        );
        assert_eq!(ring.key_of(KeyId(1)), None);
        assert_eq!(ring.len(), 2);
        // Revocation is immediate.
        assert!(ring.revoke(KeyId(2)));
        assert!(!ring.revoke(KeyId(2)));
        assert_eq!(ring.key_of(KeyId(2)), None);
        assert_eq!(ring.current("balancer").unwrap().id, KeyId(3));
        // Another name is independent; ids are unique across names.
        assert_eq!(
            ring.install("monitor", KeyId(3), key(), Rights::reader(0))
                .unwrap_err(),
            KeyError::DuplicateId(KeyId(3))
        );
        assert_eq!(
            ring.install("monitor", KeyId(4), key(), Rights::reader(0)),
            Ok(None)
        );
        assert_eq!(ring.current("balancer").unwrap().id, KeyId(3));
    }

    #[test]
    fn the_keyring_is_bounded_and_follows_its_policy() {
        let mut ring = Keyring::new(Policy::Production);
        assert_eq!(
            ring.install(
                "lab",
                KeyId(0),
                SipKey::from_bytes(LAB_KEY),
                Rights::reader(0)
            ),
            Err(KeyError::ExampleKey)
        );
        let mut rng = Rng(9);
        for i in 0..KEYS_MAX as u32 {
            let k = SipKey::from_halves(rng.next(), rng.next());
            ring.install(&format!("peer{i}"), KeyId(i), k, Rights::reader(0))
                .unwrap();
        }
        let k = SipKey::from_halves(rng.next(), rng.next());
        assert_eq!(
            ring.install("one more", KeyId(999), k, Rights::reader(0)),
            Err(KeyError::TooManyKeys)
        );
        // Rotating a name that has no previous key would grow the ring: refused too.
        assert_eq!(
            ring.install("peer0", KeyId(999), k, Rights::reader(0)),
            Err(KeyError::TooManyKeys)
        );
        let mut lab = Keyring::new(Policy::Lab);
        assert!(lab
            .install(
                "lab",
                KeyId(0),
                SipKey::from_bytes(LAB_KEY),
                Rights::reader(0)
            )
            .is_ok());
    }

    /// Every 64-bit key the repository shows as `key=HEX` or `-key HEX` (deploy files,
    /// docs, sources) is in [`EXAMPLE_KEYS_64`], so none of them passes as a key half.
    #[test]
    fn every_example_key_in_the_repository_is_refused() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let mut files = Vec::new();
        let mut dirs = vec![root.join("deploy"), root.join("crates"), root.join("docs")];
        files.push(root.join("README.md"));
        while let Some(dir) = dirs.pop() {
            let Ok(rd) = std::fs::read_dir(&dir) else {
                continue;
            };
            for e in rd.flatten() {
                let p = e.path();
                let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
                if p.is_dir() {
                    // Kept result files are data, not examples.
                    if name != "results" && name != "target" {
                        dirs.push(p);
                    }
                } else if [".rs", ".md", ".toml", ".env", ".service", ".sh"]
                    .iter()
                    .any(|s| name.ends_with(s))
                {
                    files.push(p);
                }
            }
        }
        // Markers seen (the scan works) and 64-bit hex keys after them (each must be
        // listed). rmem keys are files now (`?key=ID:PATH`, `--rmem-key ROLE:ID:PATH`):
        // the repository may show none in hex any more.
        let (mut markers, mut found) = (0, 0);
        for f in files {
            let Ok(text) = std::fs::read_to_string(&f) else {
                continue;
            };
            for marker in ["key=", "-key "] {
                for (i, _) in text.match_indices(marker) {
                    markers += 1;
                    let digits: String = text[i + marker.len()..]
                        .chars()
                        .take_while(char::is_ascii_hexdigit)
                        .collect();
                    if digits.len() != 16 {
                        continue;
                    }
                    let v = u64::from_str_radix(&digits, 16).unwrap();
                    found += 1;
                    assert!(
                        EXAMPLE_KEYS_64.contains(&v),
                        "{}: example key {digits} missing from EXAMPLE_KEYS_64",
                        f.display()
                    );
                }
            }
        }
        assert!(
            markers >= 4,
            "found {markers} key markers ({found} hex keys): is the scan broken?"
        );
    }
}
