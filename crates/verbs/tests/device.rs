//! rdma-core loaded at run time and the host's devices enumerated, checked against
//! sysfs; on a host without a device, every entry point says so instead of failing
//! obscurely. (Transfers over a device: `crates/rdmahttp/tests/verbs.rs`, feature
//! `verbs`.)

use farside_verbs::{sys::Lib, Conn, Error, Listener};
use std::time::Duration;

/// rdma-core loaded, or a skip naming the package (the set-up installs it).
fn lib_or_skip(test: &str) -> bool {
    match Lib::load() {
        Ok(_) => true,
        Err(e) => {
            farside_testkit::skip(test, &e.to_string());
            false
        }
    }
}

/// The devices the kernel lists, by name.
fn sysfs_devices() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir("/sys/class/infiniband")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

#[test]
fn enumeration_matches_the_kernels_devices() {
    if !lib_or_skip("enumeration_matches_the_kernels_devices") {
        return;
    }
    let mut names: Vec<String> = farside_verbs::devices()
        .expect("enumerate")
        .into_iter()
        .map(|d| d.name)
        .collect();
    names.sort();
    eprintln!("verbs devices: {names:?}");
    assert_eq!(names, sysfs_devices());
}

#[test]
fn without_a_device_every_entry_point_says_so() {
    if !lib_or_skip("without_a_device_every_entry_point_says_so") {
        return;
    }
    if !sysfs_devices().is_empty() {
        farside_testkit::skip(
            "without_a_device_every_entry_point_says_so",
            "this host has an RDMA device",
        );
        return;
    }
    let e = farside_verbs::probe(None).unwrap_err();
    assert!(
        matches!(&e, Error::NoDevice { wanted: None, found } if found.is_empty()),
        "{e:?}"
    );
    assert!(e.to_string().contains("0 devices"), "{e}");
    let e = farside_verbs::probe(Some("siw0")).unwrap_err();
    assert!(e.to_string().contains("\"siw0\""), "{e}");
    let e = match Conn::connect(
        "127.0.0.1:9".parse().unwrap(),
        None,
        Duration::from_millis(100),
    ) {
        Err(e) => e,
        Ok(c) => panic!("connected over no device to {}", c.peer()),
    };
    assert!(matches!(e, Error::NoDevice { .. }), "{e:?}");
    // No rdma_cm device file without a device: the listener's error says which call.
    match Listener::bind("127.0.0.1:0".parse().unwrap()) {
        Err(e) => eprintln!("listener without a device: {e}"),
        Ok(_) => panic!("listening over no device"),
    }
}
