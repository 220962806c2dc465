use super::*;
use std::os::unix::fs::{MetadataExt, PermissionsExt};

/// A fresh directory under the system temp dir (removed first if a run left it).
fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("farside-rundir-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir(&d).unwrap();
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
    d
}

/// Hand `p` (not following a symlink) to the user nobody (root only).
fn give_to_nobody(p: &Path) {
    const NOBODY: u32 = 65534;
    std::os::unix::fs::lchown(p, Some(NOBODY), Some(NOBODY)).unwrap();
}

fn mode(p: &Path) -> u32 {
    std::fs::symlink_metadata(p).unwrap().mode() & 0o7777
}

#[test]
fn makes_a_private_directory_and_private_files() {
    let base = scratch("make");
    let dir = base.join("a/b");
    let f = create_new(&dir.join("x.region"), FILE_MODE).unwrap();
    drop(f);
    assert_eq!(mode(&base.join("a")), DIR_MODE);
    assert_eq!(mode(&dir), DIR_MODE);
    assert_eq!(mode(&dir.join("x.region")), FILE_MODE);
    // Reuse keeps the inode (readers that mapped it keep reading); create_new does not.
    let ino = std::fs::metadata(dir.join("x.region")).unwrap().ino();
    let (_, reused) = SafeDir::create(&dir)
        .unwrap()
        .create_or_reuse(OsStr::new("x.region"), FILE_MODE)
        .unwrap();
    assert!(reused);
    assert_eq!(std::fs::metadata(dir.join("x.region")).unwrap().ino(), ino);
    let _keep = std::fs::File::open(dir.join("x.region")).unwrap();
    create_new(&dir.join("x.region"), FILE_MODE).unwrap();
    assert_ne!(std::fs::metadata(dir.join("x.region")).unwrap().ino(), ino);
    open_file(&dir.join("x.region"), true).unwrap();
    std::fs::remove_dir_all(&base).unwrap();
}

/// The attack: another user plants a symlink at the directory's name.
#[test]
fn a_symlinked_directory_is_refused_and_nothing_lands_in_its_target() {
    if !farside_testkit::root_or_skip(
        "a_symlinked_directory_is_refused_and_nothing_lands_in_its_target",
    ) {
        return;
    }
    let base = scratch("symdir");
    let elsewhere = base.join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    let planted = base.join("farside");
    std::os::unix::fs::symlink(&elsewhere, &planted).unwrap();
    give_to_nobody(&planted);
    let e = create_new(&planted.join("node1.region"), FILE_MODE).unwrap_err();
    assert!(
        e.to_string().contains("a symlink owned by uid 65534"),
        "{e}"
    );
    assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);
    assert!(SafeDir::open(&planted).is_err(), "readers refuse it too");
    assert_eq!(std::fs::read_dir(&elsewhere).unwrap().count(), 0);
    std::fs::remove_dir_all(&base).unwrap();
}

/// A symlink root or we made (systemd's `/var/lib/NAME -> private/NAME`) is a safe
/// transition: followed, and its target checked by the same rules.
#[test]
fn our_own_symlinked_directory_is_followed_and_its_target_checked() {
    let base = scratch("ownsym");
    let private = base.join("private");
    std::fs::create_dir(&private).unwrap();
    let link = base.join("state");
    std::os::unix::fs::symlink("private", &link).unwrap();
    create_new(&link.join("node1.state"), FILE_MODE).unwrap();
    assert!(private.join("node1.state").is_file());
    assert_eq!(SafeDir::open(&link).unwrap().path(), private.as_path());
    // A target others may write is refused even through our own symlink.
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o777)).unwrap();
    let e = create_new(&link.join("x"), FILE_MODE).unwrap_err();
    assert!(e.to_string().contains("others may write"), "{e}");
    std::fs::remove_dir_all(&base).unwrap();
}

#[test]
fn a_symlinked_file_is_never_followed() {
    let base = scratch("symfile");
    let target = base.join("target");
    std::fs::write(&target, b"precious").unwrap();
    std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o600)).unwrap();
    let link = base.join("x.region");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    // A reader does not follow it, whoever made it.
    let e = open_file(&link, true).unwrap_err();
    assert!(e.to_string().contains("symlink"), "{e}");
    // A symlink of ours is unlinked (not followed) before the exclusive create.
    let mut f = create_new(&link, FILE_MODE).unwrap();
    f.write_all(b"new").unwrap();
    assert_eq!(std::fs::read(&target).unwrap(), b"precious");
    assert!(std::fs::symlink_metadata(&link).unwrap().is_file());
    if farside_testkit::root_or_skip("a_symlinked_file_is_never_followed (another user's)") {
        std::fs::remove_file(&link).unwrap();
        std::os::unix::fs::symlink(&target, &link).unwrap();
        give_to_nobody(&link);
        let e = create_new(&link, FILE_MODE).unwrap_err();
        assert!(e.to_string().contains("uid 65534"), "{e}");
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);
        assert!(std::fs::symlink_metadata(&link).unwrap().is_symlink());
        assert_eq!(std::fs::read(&target).unwrap(), b"precious");
    }
    std::fs::remove_dir_all(&base).unwrap();
}

#[test]
fn another_users_file_or_directory_is_refused() {
    if !farside_testkit::root_or_skip("another_users_file_or_directory_is_refused") {
        return;
    }
    let base = scratch("owner");
    let theirs = base.join("x.region");
    std::fs::write(&theirs, b"theirs").unwrap();
    std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o600)).unwrap();
    give_to_nobody(&theirs);
    for e in [
        create_new(&theirs, FILE_MODE).unwrap_err(),
        create_or_reuse(&theirs, FILE_MODE).unwrap_err(),
        SafeDir::open(&base)
            .unwrap()
            .remove_own(OsStr::new("x.region"))
            .unwrap_err(),
    ] {
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}");
        assert!(e.to_string().contains("uid 65534"), "{e}");
    }
    assert_eq!(std::fs::read(&theirs).unwrap(), b"theirs", "left alone");
    let e = open_file(&theirs, false).unwrap_err();
    assert!(e.to_string().contains("owned by uid 65534"), "{e}");
    // Their directory (planted where ours would be) is refused as a whole.
    let dir = base.join("farside");
    std::fs::create_dir(&dir).unwrap();
    give_to_nobody(&dir);
    let e = create_new(&dir.join("node1.region"), FILE_MODE).unwrap_err();
    assert!(
        e.to_string().contains("a directory owned by uid 65534"),
        "{e}"
    );
    // A symlink of theirs on the way is not followed either.
    let hop = base.join("hop");
    std::os::unix::fs::symlink(&base, &hop).unwrap();
    give_to_nobody(&hop);
    let e = create_new(&hop.join("sub/x.region"), FILE_MODE).unwrap_err();
    assert!(
        e.to_string().contains("a symlink owned by uid 65534"),
        "{e}"
    );
    assert!(!base.join("sub").exists());
    std::fs::remove_dir_all(&base).unwrap();
}

#[test]
fn modes_are_checked() {
    let base = scratch("mode");
    // A directory others may write (not sticky) is refused.
    let open_dir = base.join("open");
    std::fs::create_dir(&open_dir).unwrap();
    std::fs::set_permissions(&open_dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let e = create_new(&open_dir.join("x"), FILE_MODE).unwrap_err();
    assert!(e.to_string().contains("others may write (mode 777"), "{e}");
    // A group-writable file is refused to readers; a file with a second link too.
    let f = base.join("f");
    std::fs::write(&f, b"x").unwrap();
    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o620)).unwrap();
    let e = open_file(&f, false).unwrap_err();
    assert!(e.to_string().contains("others may write (mode 620)"), "{e}");
    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
    open_file(&f, false).unwrap();
    std::fs::hard_link(&f, base.join("g")).unwrap();
    let e = open_file(&f, false).unwrap_err();
    assert!(e.to_string().contains("2 hard links"), "{e}");
    // A sticky root directory (as /tmp) is a valid home for files: the system temp
    // dir is one where this runs as root.
    if farside_testkit::is_root() {
        let st = std::fs::metadata(std::env::temp_dir()).unwrap();
        if st.uid() == 0 && st.mode() & 0o1000 != 0 {
            let p = std::env::temp_dir().join(format!("farside-rundir-{}", std::process::id()));
            create_new(&p, FILE_MODE).unwrap();
            std::fs::remove_file(&p).unwrap();
        }
    }
    std::fs::remove_dir_all(&base).unwrap();
}

#[test]
fn atomic_writes_replace_whole_files() {
    let base = scratch("atomic");
    let p = base.join("state/node1.state");
    assert_eq!(read_file(&p).unwrap(), None);
    write_atomic(&p, b"one", FILE_MODE).unwrap();
    assert_eq!(read_file(&p).unwrap().as_deref(), Some(&b"one"[..]));
    write_atomic(&p, b"two two", FILE_MODE).unwrap();
    assert_eq!(read_file(&p).unwrap().as_deref(), Some(&b"two two"[..]));
    assert_eq!(mode(&p), FILE_MODE);
    assert_eq!(
        std::fs::read_dir(base.join("state")).unwrap().count(),
        1,
        "no temporary file left"
    );
    std::fs::remove_dir_all(&base).unwrap();
}

#[test]
fn sockets_bind_in_the_checked_directory_and_are_private() {
    let base = scratch("sock");
    let dir = SafeDir::create(&base.join("run")).unwrap();
    let l = dir.bind_unix(OsStr::new("c.sock")).unwrap();
    let p = dir.check_socket(OsStr::new("c.sock")).unwrap();
    assert_eq!(mode(&p), FILE_MODE);
    std::os::unix::net::UnixStream::connect(&p).unwrap();
    drop(l);
    // A stale socket of ours is replaced.
    let _l = dir.bind_unix(OsStr::new("c.sock")).unwrap();
    std::fs::write(base.join("run/plain"), b"").unwrap();
    assert!(dir.check_socket(OsStr::new("plain")).is_err());
    // Another user's socket is not one to connect to (nor to replace).
    if farside_testkit::root_or_skip(
        "sockets_bind_in_the_checked_directory_and_are_private (another user's)",
    ) {
        give_to_nobody(&p);
        let e = dir.check_socket(OsStr::new("c.sock")).unwrap_err();
        assert!(e.to_string().contains("owned by uid 65534"), "{e}");
        let e = dir.bind_unix(OsStr::new("c.sock")).unwrap_err();
        assert!(e.to_string().contains("uid 65534"), "{e}");
    }
    std::fs::remove_dir_all(&base).unwrap();
}

#[test]
fn names_must_be_single_components() {
    let base = scratch("names");
    let dir = SafeDir::create(&base).unwrap();
    for bad in ["", ".", "..", "a/b"] {
        assert!(
            dir.create_new(OsStr::new(bad), FILE_MODE).is_err(),
            "{bad:?}"
        );
    }
    assert!(create_new(&base.join("../x"), FILE_MODE).is_err());
    std::fs::remove_dir_all(&base).unwrap();
}
