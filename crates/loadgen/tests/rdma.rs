//! `farside loadgen --rdma` against farside-backend `--rdma` on loopback (port 0):
//! every mode delivers every body checked, one RDMA connection per client for the
//! whole run, its set-up counted apart; a body that differs from the file counts in
//! `wrong_bodies`.

use farside_loadgen::rdma::{run, RdmaLoad};
use farside_loadgen::LoadgenArgs;
use std::net::SocketAddr;
use std::path::PathBuf;

struct Dir(PathBuf);

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn docroot(tag: &str) -> Dir {
    let d = std::env::temp_dir().join(format!("farside-lg-rdma-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    for (name, n) in [("a.bin", 1_000usize), ("b.bin", 70_000), ("c.bin", 300_000)] {
        let body: Vec<u8> = (0..n).map(|i| (i * 31 % 253) as u8).collect();
        std::fs::write(d.join(name), body).unwrap();
    }
    Dir(d)
}

fn backend(root: &std::path::Path) -> (SocketAddr, farside_backend::Handle) {
    let mut args = farside_backend::BackendArgs {
        listen: "127.0.0.1:0".parse().unwrap(),
        root: Some(root.to_path_buf()),
        workers: 4,
        ..Default::default()
    };
    args.rdma.rdma = true;
    farside_backend::spawn(args).unwrap()
}

fn args(addr: SocketAddr, root: &std::path::Path, mode: RdmaLoad) -> LoadgenArgs {
    let mut a = LoadgenArgs::new(addr.to_string());
    a.quiet = true;
    a.clients = 3;
    a.duration_s = 30.0;
    a.rdma.rdma = Some(mode);
    a.rdma.root = Some(root.to_path_buf());
    a.rdma.paths = vec!["/a.bin".into(), "/b.bin".into(), "/c.bin".into()];
    a.rdma.requests_per_client = Some(6);
    a
}

#[test]
fn every_mode_delivers_checked_bodies_on_one_rdma_connection_per_client() {
    let root = docroot("modes");
    let (addr, _be) = backend(&root.0);
    for mode in [RdmaLoad::ServerWrites, RdmaLoad::ClientReads, RdmaLoad::Off] {
        let s = run(&args(addr, &root.0, mode)).unwrap();
        assert_eq!(
            (s.requests, s.served, s.wrong_bodies),
            (18, 18, 0),
            "{mode:?}: {s:?}"
        );
        assert_eq!(s.bytes, 6 * (1_000 + 70_000 + 300_000), "{mode:?}");
        assert_eq!(s.http_connections, 3, "{mode:?}: kept alive");
        match mode {
            RdmaLoad::Off => {
                assert_eq!((s.via_tcp, s.rdma_connections, s.connect_count), (18, 0, 0));
                assert!(s.declined.is_empty());
            }
            _ => {
                let rdma = s.via_server_writes + s.via_client_reads;
                assert_eq!((rdma, s.via_tcp), (18, 0), "{mode:?}: {s:?}");
                assert_eq!(s.rdma_connections, 3, "{mode:?}: one per client");
                assert_eq!(s.connect_count, 3);
                assert!(s.connect_max_us > 0.0);
            }
        }
        assert!(s.p99_ms >= s.p50_ms && s.p50_ms > 0.0);
    }
}

#[test]
fn a_body_that_differs_from_the_file_is_a_wrong_body() {
    let served = docroot("served");
    let expected = docroot("expected");
    std::fs::write(expected.0.join("b.bin"), vec![7u8; 70_000]).unwrap();
    let (addr, _be) = backend(&served.0);
    let mut a = args(addr, &expected.0, RdmaLoad::ServerWrites);
    a.clients = 1;
    a.rdma.warmup_requests = 0;
    a.rdma.requests_per_client = Some(3);
    let s = run(&a).unwrap();
    assert_eq!((s.served, s.wrong_bodies), (2, 1), "{s:?}");
    assert!(s.errors[0].contains("wrong body"), "{:?}", s.errors);
}

#[test]
fn bad_flags_are_refused_with_the_flag_named() {
    let root = docroot("flags");
    let addr: SocketAddr = "127.0.0.1:9".parse().unwrap();
    let mut a = args(addr, &root.0, RdmaLoad::ServerWrites);
    a.rdma.paths = vec!["/../etc/passwd".into()];
    assert!(run(&a).unwrap_err().to_string().contains("--rdma-paths"));
    let mut a = args(addr, &root.0, RdmaLoad::ServerWrites);
    a.rdma.root = None;
    assert!(run(&a).unwrap_err().to_string().contains("--rdma-root"));
    let mut a = args(addr, &root.0, RdmaLoad::ServerWrites);
    a.clients = 1000;
    assert!(run(&a).unwrap_err().to_string().contains("--clients"));
    // The HTTP load generator refuses --rdma rather than ignore it.
    let a = args(addr, &root.0, RdmaLoad::ServerWrites);
    assert!(farside_loadgen::run(&a).is_err());
}
