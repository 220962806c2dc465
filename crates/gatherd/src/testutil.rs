//! Helpers shared by the unit tests of several modules.

use std::path::PathBuf;

pub(crate) fn tmp_region(tag: &str) -> PathBuf {
    std::env::temp_dir().join(format!(
        "farside-gatherd-{tag}-{}.region",
        std::process::id()
    ))
}

/// Run `f` on a thread in a fresh network namespace with `lo` up (root only).
pub(crate) fn in_private_netns<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::spawn(move || {
        // SAFETY: unshare affects this thread only (threads it spawns inherit it).
        assert_eq!(unsafe { libc::unshare(libc::CLONE_NEWNET) }, 0, "unshare");
        let up = std::process::Command::new("ip")
            .args(["link", "set", "lo", "up"])
            .status()
            .expect("ip");
        assert!(up.success(), "ip link set lo up");
        f()
    })
    .join()
    .unwrap()
}

/// The tests' rmem keys: a reader (id 1) and a balancer (id 2), random, in key files
/// (0600) of a temp directory, and the `--rmem-key` specs that name them.
pub(crate) struct TestKeys {
    pub(crate) set: farside_rmem::LabKeyset,
    pub(crate) specs: Vec<farside_rmem::KeySpec>,
    /// The reader's key file (a child process reads it too).
    pub(crate) reader_file: PathBuf,
}

pub(crate) fn test_keys() -> &'static TestKeys {
    static K: std::sync::OnceLock<TestKeys> = std::sync::OnceLock::new();
    K.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("farside-gatherd-keys-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let set = farside_rmem::LabKeyset::generate();
        let (r, b) = set.write_files(&dir).expect("key files");
        let specs = vec![
            format!("reader:1:{}", r.display()).parse().expect("spec"),
            format!("balancer:2:{}", b.display()).parse().expect("spec"),
        ];
        TestKeys {
            set,
            specs,
            reader_file: r,
        }
    })
}

/// Client options with the tests' reader key.
pub(crate) fn reader_opts() -> farside_rmem::ClientOptions {
    farside_rmem::ClientOptions {
        key: Some(test_keys().set.reader),
        ..Default::default()
    }
}
