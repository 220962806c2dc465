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

/// The probe finds the device asked for or names the ones there are; without any,
/// every entry point says so.
#[test]
fn the_probe_names_the_devices_there_are() {
    if !lib_or_skip("the_probe_names_the_devices_there_are") {
        return;
    }
    let there = sysfs_devices();
    let e = farside_verbs::probe(Some("farside-no-such-device")).unwrap_err();
    match &e {
        Error::NoDevice { wanted, found } => {
            assert_eq!(wanted.as_deref(), Some("farside-no-such-device"));
            let mut found = found.clone();
            found.sort();
            assert_eq!(found, there);
        }
        other => panic!("{other:?}"),
    }
    assert!(e.to_string().contains("\"farside-no-such-device\""), "{e}");
    if let Some(first) = there.first() {
        // A device is there: the probe opens it and allocates a PD on it.
        let d = farside_verbs::probe(None).expect("probe the first device");
        assert!(there.contains(&d.name), "{d:?}");
        assert_eq!(farside_verbs::probe(Some(first)).unwrap().name, *first);
        return;
    }
    let e = farside_verbs::probe(None).unwrap_err();
    assert!(
        matches!(&e, Error::NoDevice { wanted: None, found } if found.is_empty()),
        "{e:?}"
    );
    assert!(e.to_string().contains("0 devices"), "{e}");
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
        Err(e) => assert!(e.to_string().contains("rdma_"), "{e}"),
        Ok(_) => panic!("listening over no device"),
    }
}
