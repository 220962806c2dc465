//! A restored socket's buffers are the source's sizes only within the system's
//! bounds: the sizes come from the peer, and `SO_*BUFFORCE` would let it pin any
//! amount of this host's memory. Needs root (TCP_REPAIR): `cargo test -p
//! farside-migrate -- --include-ignored`.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;

use farside_migrate::{close_silently, freeze_and_dump, restore};

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

fn sysctl(name: &str) -> i64 {
    std::fs::read_to_string(format!("/proc/sys/net/core/{name}"))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

fn sockopt(s: &TcpStream, opt: libc::c_int) -> i64 {
    let mut v: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: an int-sized getsockopt into a local.
    let r = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            opt,
            (&mut v as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    assert_eq!(r, 0, "{}", std::io::Error::last_os_error());
    i64::from(v)
}

#[test]
#[ignore = "needs root (TCP_REPAIR): run with `cargo test -p farside-migrate -- --include-ignored` as root"]
fn a_restored_socket_s_buffers_stay_within_the_sysctl_maxima() {
    assert!(is_root(), "needs root");
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let mut c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (s, _) = l.accept().unwrap();
    let mut st = freeze_and_dump(&s).unwrap();
    // A peer asking for 1 GiB each way.
    st.sndbuf = 1 << 30;
    st.rcvbuf = 1 << 30;
    close_silently(s).unwrap();
    let mut s = restore(&st).unwrap();
    // getsockopt reports the doubled value the kernel keeps.
    assert!(sockopt(&s, libc::SO_SNDBUF) <= 2 * sysctl("wmem_max"));
    assert!(sockopt(&s, libc::SO_RCVBUF) <= 2 * sysctl("rmem_max"));
    // And the connection works.
    s.write_all(b"ping").unwrap();
    let mut b = [0u8; 4];
    c.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"ping");
}
