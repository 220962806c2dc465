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
