//! The cluster keys of one lab run: random keys the lab's daemons authenticate their
//! messages with, as an operator's deployment would (specd's migration protocol, the
//! front-end's one-sided MOVE).
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
        let dir = std::env::temp_dir().join(format!("farside-lab-keys-{}", std::process::id()));
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
}
