//! The messages cooperating nodes exchange, as pure encoders and decoders (no I/O).
//!
//! Every message is sealed in the `auth` envelope under `Domain::Notify` with the
//! cluster's coop key; its first byte says what it is, so one kind can never be taken
//! for another (the tag covers that byte):
//!
//! ```text
//! directory (UDP, node -> every peer, on change, at most one per publish period):
//!   'D' | node u8 | load u64 | Bloom filter published form (epoch, k, words, epoch)
//! fetch (TCP, initial node -> service node, envelope sender = initial node):
//!   'F' | object u64
//! body (TCP, service node -> initial node; envelope sender and sequence = the fetch's):
//!   'B' | object u64 | present u8 | len u32 | crc32c u32 | body (len bytes)
//! ```
//!
//! With `--coop-directory read` the directory update's bytes (from 'D' on, no envelope)
//! are the node's directory record in its own object arena
//! (`super::arena::DIRECTORY_KEY`), and a peer that reads it accepts it only through
//! [`DirectoryUpdate::judge_read`].
//!
//! A body is accepted only if its object, length and CRC32c match (the CRC computed when
//! the service node read the file from disk): a peer's stale hint gives `present = 0`,
//! never another object's bytes.

use farside_coop::directory::{BloomFilter, BLOOM_BITS_MAX, DIRECTORY_HEAD_BYTES};

/// First byte of a directory update.
pub const KIND_DIRECTORY: u8 = b'D';
/// First byte of a fetch request.
pub const KIND_FETCH: u8 = b'F';
/// First byte of a fetch reply.
pub const KIND_BODY: u8 = b'B';

/// Largest directory message (without the envelope): kind, node, load, and the largest
/// published filter. Fits one UDP datagram (8.2 KB < 65,507 B).
pub const DIRECTORY_BYTES_MAX: usize = 1 + 1 + 8 + DIRECTORY_HEAD_BYTES + BLOOM_BITS_MAX / 8 + 8;
/// Bytes of a fetch request (without the envelope).
pub const FETCH_BYTES: usize = 1 + 8;
/// Bytes of a body reply before the body.
pub const BODY_HEAD_BYTES: usize = 1 + 8 + 1 + 4 + 4;
/// Largest body a peer sends or accepts: 4 MiB. Rule: above the World Cup sample's
/// largest object (2.9 MB); a larger object is read from disk by the node that wants it.
pub const BODY_BYTES_MAX: usize = 4 << 20;

/// A node's directory and load as it publishes them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirectoryUpdate {
    pub node: u8,
    pub load: u64,
    pub epoch: u64,
    pub filter: BloomFilter,
}

impl DirectoryUpdate {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(10 + self.filter.published_bytes());
        out.push(KIND_DIRECTORY);
        out.push(self.node);
        out.extend_from_slice(&self.load.to_le_bytes());
        out.extend_from_slice(&self.filter.to_published(self.epoch));
        out
    }

    /// `None` if not a well-formed directory update.
    pub fn decode(b: &[u8]) -> Option<DirectoryUpdate> {
        if b.len() > DIRECTORY_BYTES_MAX || b.len() < 10 || b[0] != KIND_DIRECTORY {
            return None;
        }
        let load = u64::from_le_bytes(b[2..10].try_into().ok()?);
        let (epoch, filter) = BloomFilter::from_published(&b[10..])?;
        (b.len() == 10 + filter.published_bytes()).then_some(DirectoryUpdate {
            node: b[1],
            load,
            epoch,
            filter,
        })
    }
}

/// Why a directory record read from a peer's arena is not applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordRefusal {
    /// Not a well-formed directory update (kind, lengths, filter's head and tail epochs).
    Malformed,
    /// The record names another node than the one whose arena it was read from.
    WrongNode,
    /// Its epoch is older than the last one accepted from that node.
    Stale,
}

impl DirectoryUpdate {
    /// The verdict on `record`, read from node `from`'s arena, when the last record
    /// accepted from it had epoch `last_epoch`: `Ok(Some(update))` to apply (a newer
    /// epoch), `Ok(None)` if it is the record already applied (same epoch: nothing
    /// changed, and the view does not count as refreshed), or why it is refused. Epochs
    /// grow across the owner's restarts (they start from its clock), so an older one is
    /// a stale copy, never a restarted node.
    pub fn judge_read(
        record: &[u8],
        from: usize,
        last_epoch: Option<u64>,
    ) -> Result<Option<DirectoryUpdate>, RecordRefusal> {
        let update = DirectoryUpdate::decode(record).ok_or(RecordRefusal::Malformed)?;
        if update.node as usize != from {
            return Err(RecordRefusal::WrongNode);
        }
        match last_epoch {
            Some(e) if update.epoch < e => Err(RecordRefusal::Stale),
            Some(e) if update.epoch == e => Ok(None),
            _ => Ok(Some(update)),
        }
    }
}

/// The first directory epoch of a node's run: even, non-zero, from the clock (2 per
/// µs since the epoch), so a restarted node's records are newer than its old ones as
/// long as it publishes less than once per µs.
pub fn first_epoch(unix_us: u64) -> u64 {
    unix_us.saturating_mul(2).max(2)
}

pub fn encode_fetch(object: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(FETCH_BYTES);
    out.push(KIND_FETCH);
    out.extend_from_slice(&object.to_le_bytes());
    out
}

pub fn decode_fetch(b: &[u8]) -> Option<u64> {
    (b.len() == FETCH_BYTES && b[0] == KIND_FETCH)
        .then(|| u64::from_le_bytes(b[1..9].try_into().expect("8 bytes")))
}

/// The reply to a fetch of `object`: its body, or absent.
pub fn encode_body(object: u64, body: Option<(&[u8], u32)>) -> Vec<u8> {
    let mut out = Vec::with_capacity(BODY_HEAD_BYTES + body.map_or(0, |(b, _)| b.len()));
    out.push(KIND_BODY);
    out.extend_from_slice(&object.to_le_bytes());
    match body {
        Some((b, crc)) => {
            out.push(1);
            out.extend_from_slice(&(b.len() as u32).to_le_bytes());
            out.extend_from_slice(&crc.to_le_bytes());
            out.extend_from_slice(b);
        }
        None => {
            out.push(0);
            out.extend_from_slice(&[0; 8]);
        }
    }
    out
}

/// Why a body reply was not accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyRefusal {
    Malformed,
    /// The reply is for another object.
    WrongObject,
    /// The length field and the bytes disagree, or the body is too large.
    WrongLength,
    /// The body's CRC32c is not the one sent with it.
    WrongCrc,
}

/// The body of a reply to a fetch of `object`: `Some(bytes)` if the peer had it (length
/// and CRC32c checked), `None` if it did not.
pub fn decode_body(object: u64, b: &[u8]) -> Result<Option<&[u8]>, BodyRefusal> {
    if b.len() < BODY_HEAD_BYTES || b[0] != KIND_BODY {
        return Err(BodyRefusal::Malformed);
    }
    let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
    if u64::from_le_bytes(b[1..9].try_into().expect("8 bytes")) != object {
        return Err(BodyRefusal::WrongObject);
    }
    let (len, crc) = (u32_at(10) as usize, u32_at(14));
    let body = &b[BODY_HEAD_BYTES..];
    match b[9] {
        0 if len == 0 && body.is_empty() => Ok(None),
        1 if len == body.len() && len <= BODY_BYTES_MAX => {
            if crc32c::crc32c(body) == crc {
                Ok(Some(body))
            } else {
                Err(BodyRefusal::WrongCrc)
            }
        }
        1 => Err(BodyRefusal::WrongLength),
        _ => Err(BodyRefusal::Malformed),
    }
}

/// The object id of a request path: FNV-1a 64 of its bytes (the same path always names
/// the same object on every node).
pub fn object_id(path: &str) -> u64 {
    path.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directory_updates_round_trip_and_reject_garbage() {
        let mut f = BloomFilter::for_objects(100, 0.01);
        f.insert(7);
        let u = DirectoryUpdate {
            node: 3,
            load: 12,
            epoch: 8,
            filter: f,
        };
        let b = u.encode();
        assert!(b.len() <= DIRECTORY_BYTES_MAX);
        assert_eq!(DirectoryUpdate::decode(&b), Some(u.clone()));
        let mut bad = b.clone();
        bad[0] = KIND_FETCH;
        assert_eq!(DirectoryUpdate::decode(&bad), None);
        assert_eq!(DirectoryUpdate::decode(&b[..b.len() - 1]), None, "torn");
        let mut longer = b.clone();
        longer.push(0);
        assert_eq!(DirectoryUpdate::decode(&longer), None, "trailing bytes");
        let mut odd = b;
        odd[10] ^= 1; // the head epoch no longer matches the tail
        assert_eq!(DirectoryUpdate::decode(&odd), None);
    }

    #[test]
    fn a_read_record_is_applied_only_if_newer_and_from_its_own_node() {
        let mut f = BloomFilter::for_objects(10, 0.01);
        f.insert(5);
        let at = |epoch| {
            DirectoryUpdate {
                node: 2,
                load: 1,
                epoch,
                filter: f.clone(),
            }
            .encode()
        };
        let judge = DirectoryUpdate::judge_read;
        assert_eq!(judge(&at(10), 2, None).unwrap().unwrap().epoch, 10);
        assert_eq!(judge(&at(12), 2, Some(10)).unwrap().unwrap().epoch, 12);
        assert_eq!(judge(&at(10), 2, Some(10)), Ok(None), "unchanged");
        assert_eq!(
            judge(&at(8), 2, Some(10)),
            Err(RecordRefusal::Stale),
            "an older epoch is refused"
        );
        assert_eq!(judge(&at(12), 3, None), Err(RecordRefusal::WrongNode));
        let r = at(12);
        assert_eq!(
            judge(&r[..r.len() - 1], 2, None),
            Err(RecordRefusal::Malformed)
        );
        assert!(first_epoch(1).is_multiple_of(2) && first_epoch(0) == 2);
        assert!(first_epoch(1_000_001) > first_epoch(1_000_000));
    }

    #[test]
    fn bodies_are_checked_for_object_length_and_crc() {
        let body = b"hello, world".as_slice();
        let crc = crc32c::crc32c(body);
        let msg = encode_body(5, Some((body, crc)));
        assert_eq!(decode_body(5, &msg), Ok(Some(body)));
        assert_eq!(decode_body(6, &msg), Err(BodyRefusal::WrongObject));
        let mut flipped = msg.clone();
        *flipped.last_mut().unwrap() ^= 0x20;
        assert_eq!(decode_body(5, &flipped), Err(BodyRefusal::WrongCrc));
        assert_eq!(
            decode_body(5, &msg[..msg.len() - 1]),
            Err(BodyRefusal::WrongLength)
        );
        assert_eq!(decode_body(5, &encode_body(5, None)), Ok(None));
        assert_eq!(decode_body(5, b"F"), Err(BodyRefusal::Malformed));
        assert_eq!(decode_fetch(&encode_fetch(99)), Some(99));
        assert_eq!(decode_fetch(&msg), None);
    }

    #[test]
    fn object_ids_are_fnv1a() {
        assert_eq!(object_id(""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(object_id("a"), 0xaf63_dc4c_8601_ec8c);
        assert_ne!(object_id("/o/1"), object_id("/o/2"));
    }
}
