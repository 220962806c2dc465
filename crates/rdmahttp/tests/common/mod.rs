//! What the tests' hand-written HTTP servers share: reading one request head.

use farside_rdmahttp::header::NAME;
use std::io::Read;

/// Reads one request head, byte by byte up to its blank line (so nothing of a body or
/// the next request is consumed), and returns it with the value of its `RDMA:` field.
/// Panics when the head has no such field: every request these servers take sends one.
pub fn read_head(s: &mut impl Read) -> (String, String) {
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        s.read_exact(&mut b).unwrap();
        head.push(b[0]);
    }
    let head = String::from_utf8(head).unwrap();
    let field = head
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{NAME}: ")))
        .unwrap()
        .to_string();
    (head, field)
}
