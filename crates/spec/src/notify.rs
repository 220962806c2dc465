//! The target's notification to a source (seed 002 §3.2): "I can take migrations
//! again". One UDP datagram, sent to the source daemon's `--listen` address (its
//! migration listener's port, UDP): `magic "FSNT" | version u8 (1) | kind u8 (1)`.
//! Losing one is harmless: the source reopens its window after N locally served
//! requests anyway. A source accepts notifications only from its configured peers.

use std::io;
use std::net::{SocketAddr, UdpSocket};

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

#[cfg(test)]
mod tests {
    use super::*;

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
