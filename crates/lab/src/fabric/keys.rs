//! The cluster keys of one lab run: random keys the lab's daemons authenticate their
//! messages with, as an operator's deployment would (specd's migration protocol, the
//! front-end's one-sided MOVE, the rmem requests and replies: [`RmemLabKeys`]).
//!
//! Each key is 16 random bytes from the kernel, written as 32 hex digits to a file of
//! mode 0600 in a directory of mode 0700 under the system's temporary directory,
//! never beside the run's results (a kept result folder must not carry a key). The
//! directory is removed when the [`LabKeys`] is dropped.

use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Bytes of a key (SipHash-2-4's 128-bit key).
pub const KEY_BYTES: usize = 16;

/// A run's key files, one per name; removed on drop.
#[derive(Debug)]
pub struct LabKeys {
    dir: PathBuf,
}

impl LabKeys {
    /// A fresh key for each of `names` (file names), in a new private directory.
    pub fn generate(names: &[&str]) -> io::Result<LabKeys> {
        // One directory per instance: a run may hold several sets at once.
        static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "farside-lab-keys-{}-{}",
            std::process::id(),
            N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::DirBuilder::new().mode(0o700).create(&dir)?;
        let keys = LabKeys { dir };
        let mut random = std::fs::File::open("/dev/urandom")?;
        for name in names {
            let mut key = [0u8; KEY_BYTES];
            random.read_exact(&mut key)?;
            let hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(keys.path(name))?;
            f.write_all(format!("{hex}\n").as_bytes())?;
        }
        Ok(keys)
    }

    /// The file of key `name`.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// The directory holding the keys.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

/// The rmem keys of a lab run: a reader key (id [`RmemLabKeys::READER_ID`]: monitors,
/// probes) and a balancer key (id [`RmemLabKeys::BALANCER_ID`]: the reconfiguration
/// balancers), in key files; every gatherd of the run holds both.
#[derive(Debug)]
pub struct RmemLabKeys {
    keys: LabKeys,
}

impl RmemLabKeys {
    pub const READER_ID: u32 = 1;
    pub const BALANCER_ID: u32 = 2;
    const READER: &'static str = "rmem-1.key";
    const BALANCER: &'static str = "rmem-2.key";

    pub fn generate() -> io::Result<RmemLabKeys> {
        Ok(RmemLabKeys {
            keys: LabKeys::generate(&[Self::READER, Self::BALANCER])?,
        })
    }

    /// The process's one set, for experiments whose set-up functions share no state
    /// to hold one: made on first use, its directory removed when the process exits.
    pub fn shared() -> io::Result<&'static RmemLabKeys> {
        static K: std::sync::OnceLock<RmemLabKeys> = std::sync::OnceLock::new();
        static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
        extern "C" fn remove_shared() {
            if let Some(d) = DIR.get() {
                let _ = std::fs::remove_dir_all(d);
            }
        }
        if let Some(k) = K.get() {
            return Ok(k);
        }
        let k = RmemLabKeys::generate()?;
        let dir = k.keys.dir().to_path_buf();
        if K.set(k).is_ok() {
            let _ = DIR.set(dir);
            // SAFETY: registers a plain extern "C" function with no arguments.
            unsafe { libc::atexit(remove_shared) };
        }
        Ok(K.get().expect("just set"))
    }

    /// gatherd's `--rmem-key` flags for both keys.
    pub fn gatherd_args(&self) -> Vec<String> {
        vec![
            "--rmem-key".into(),
            format!(
                "reader:{}:{}",
                Self::READER_ID,
                self.keys.path(Self::READER).display()
            ),
            "--rmem-key".into(),
            format!(
                "balancer:{}:{}",
                Self::BALANCER_ID,
                self.keys.path(Self::BALANCER).display()
            ),
        ]
    }

    /// `ID:PATH` of the reader key (a region's `?key=`, `[monitor] key`).
    pub fn reader_spec(&self) -> String {
        format!(
            "{}:{}",
            Self::READER_ID,
            self.keys.path(Self::READER).display()
        )
    }

    /// `ID:PATH` of the balancer key (`[reconf] key`).
    pub fn balancer_spec(&self) -> String {
        format!(
            "{}:{}",
            Self::BALANCER_ID,
            self.keys.path(Self::BALANCER).display()
        )
    }

    /// `region` with the reader key named (`REGION?key=ID:PATH`).
    pub fn reader_region(&self, region: &str) -> String {
        format!("{region}?key={}", self.reader_spec())
    }

    /// The reader key, for the lab's own clients.
    pub fn reader(&self) -> io::Result<farside_rmem::ClientKey> {
        farside_rmem::ClientKey::load(&self.reader_spec())
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
    }

    /// The balancer key, for the lab's own clients.
    pub fn balancer(&self) -> io::Result<farside_rmem::ClientKey> {
        farside_rmem::ClientKey::load(&self.balancer_spec())
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
    }
}

impl Drop for LabKeys {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn keys_are_private_random_and_removed_on_drop() {
        let keys = LabKeys::generate(&["a", "b"]).unwrap();
        let dir = keys.dir().to_path_buf();
        let a = std::fs::read_to_string(keys.path("a")).unwrap();
        let b = std::fs::read_to_string(keys.path("b")).unwrap();
        assert_eq!(a.trim().len(), 2 * KEY_BYTES);
        assert!(a.trim().chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b, "each name its own key");
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&keys.path("a")), 0o600);
        assert_eq!(mode(&dir), 0o700);
        // The key loader the daemons use accepts them as production keys.
        let k = farside_auth::keys::load_key_from(
            None,
            "a",
            Some(&keys.path("a")),
            farside_auth::keys::Policy::Production,
            // SAFETY: geteuid has no preconditions.
            unsafe { libc::geteuid() },
        );
        assert!(k.is_ok(), "{k:?}");
        drop(keys);
        assert!(!dir.exists());
    }

    #[test]
    fn rmem_keys_load_as_gatherd_and_its_clients_load_them() {
        let k = RmemLabKeys::generate().unwrap();
        let other = RmemLabKeys::generate().unwrap();
        assert_ne!(k.reader_spec(), other.reader_spec(), "one directory each");
        let args = k.gatherd_args();
        let specs: Vec<farside_rmem::KeySpec> = [&args[1], &args[3]]
            .iter()
            .map(|s| s.parse().unwrap())
            .collect();
        let server = farside_rmem::ServerKeys::load(&specs).unwrap();
        assert_eq!(server.keyring().len(), 2);
        assert_eq!(k.reader().unwrap().id.0, RmemLabKeys::READER_ID);
        assert_eq!(k.balancer().unwrap().id.0, RmemLabKeys::BALANCER_ID);
        assert!(k
            .reader_region("udp:10.0.0.2:7000")
            .ends_with(&k.reader_spec()));
    }
}
