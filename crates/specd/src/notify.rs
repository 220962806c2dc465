//! The target's notification to a source (seed 002 §3.2): "I can take migrations
//! again". One UDP datagram, sent to the source daemon's `--listen` address (its
//! migration listener's port, UDP): `magic "FSNT" | version u8 (1) | kind u8 (1)`.
//! Losing one is harmless: the source reopens its window after N locally served
//! requests anyway. A source accepts notifications only from its configured peers.

use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;

/// Magic of a notification datagram.
pub const MAGIC: &[u8; 4] = b"FSNT";
/// Format version.
pub const VERSION: u8 = 1;
/// Kind: the target can take migrations again.
pub const KIND_CAN_TAKE: u8 = 1;
/// Length of a notification datagram.
pub const NOTIFY_BYTES: usize = 6;

/// The datagram.
pub fn encode() -> [u8; NOTIFY_BYTES] {
    [
        MAGIC[0],
        MAGIC[1],
        MAGIC[2],
        MAGIC[3],
        VERSION,
        KIND_CAN_TAKE,
    ]
}

/// Whether `b` is a valid "can take again" notification.
pub fn is_can_take(b: &[u8]) -> bool {
    b.len() == NOTIFY_BYTES && &b[..4] == MAGIC && b[4] == VERSION && b[5] == KIND_CAN_TAKE
}

/// Sends one notification from `sock` to `to`.
pub fn send(sock: &UdpSocket, to: SocketAddr) -> io::Result<()> {
    sock.send_to(&encode(), to).map(|_| ())
}

/// Receives one datagram into `buf`: `Ok(Some((len, from)))`, or `Ok(None)` when the
/// read returned without a sender (the wake-up of `shutdown(SHUT_RD)` on stop: 0 bytes,
/// no address). `UdpSocket::recv_from` asserts on that address and panics, which is why
/// this goes to recvfrom(2) itself.
pub fn recv(sock: &UdpSocket, buf: &mut [u8]) -> io::Result<Option<(usize, SocketAddr)>> {
    // SAFETY: all-zero is a valid sockaddr_storage.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    // SAFETY: buf and ss are valid for the lengths passed; len is in/out.
    let n = unsafe {
        libc::recvfrom(
            sock.as_raw_fd(),
            buf.as_mut_ptr().cast(),
            buf.len(),
            0,
            (&mut ss as *mut libc::sockaddr_storage).cast(),
            &mut len,
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    // Neither IPv4 nor IPv6 (or cut short): not a peer's notification.
    if (len as usize) < size_of::<libc::sockaddr_in>() {
        return Ok(None);
    }
    let Some(from) = farside_rt::sockaddr::from_storage(&ss) else {
        return Ok(None);
    };
    Ok(Some((n as usize, from)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recv_gives_the_sender_and_survives_a_shutdown_wake_up() {
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        send(&tx, rx.local_addr().unwrap()).unwrap();
        let mut b = [0u8; 64];
        let (n, from) = recv(&rx, &mut b).unwrap().unwrap();
        assert!(is_can_take(&b[..n]));
        assert_eq!(from, tx.local_addr().unwrap());
        // What a stopping daemon does to wake its reader: std's recv_from panics here.
        // SAFETY: shutdown(2) on a socket this test owns.
        unsafe { libc::shutdown(rx.as_raw_fd(), libc::SHUT_RD) };
        assert!(recv(&rx, &mut b).unwrap().is_none());
    }

    #[test]
    fn only_the_exact_datagram_is_a_notification() {
        assert!(is_can_take(&encode()));
        assert!(!is_can_take(b"FSNT\x01"));
        assert!(!is_can_take(b"FSNT\x02\x01"));
        assert!(!is_can_take(b"FSNT\x01\x02"));
        assert!(!is_can_take(b"XSNT\x01\x01"));
        assert!(!is_can_take(b"FSNT\x01\x01\x00"));
    }
}
