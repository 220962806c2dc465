//! rmem's trust boundary: which keys a server accepts and what each may do, the key a
//! client seals its requests with, and the envelopes (crate `farside_auth`) around
//! every request and reply.
//!
//! ```text
//!  client (ClientKey: key id + key, random sender id, Sequencer)
//!    seal_request: envelope(rmem_request, key id, sender, seq) + header + payload [+ pad]
//!  server (ServerKeys: Keyring with per-key Rights, ReplayTable)
//!    farside_auth::receive ─ unknown key / bad tag ─► BadKey, no reply
//!                          ─ seen before / too old  ─► Replayed, no reply
//!    rights::check(key's rights, op, offset, len)   ─► refusals answered, nothing done
//!    seal_reply: envelope(rmem_reply, the REQUEST's key id, sender and seq) + reply
//!  client
//!    open_reply: the key it used, the reply domain, its own sender id, the seq of one
//!    of the current operation's attempts, then the op seq inside: else not its reply
//! ```
//!
//! Keys come from files only (`farside_auth::keys::load_key`: mode 0600 or a systemd
//! credential, example and weak keys refused). The flags that name them:
//! - servers (gatherd, the proxy's reconfiguration endpoint): `--rmem-key ROLE:ID:PATH`,
//!   repeatable; ROLE is `reader` (READ the region) or `balancer`
//!   (`farside_auth::rights::Rights::balancer`); ID the key id (u32) carried in every
//!   envelope. A second key of the same role becomes the current one and the first its
//!   previous one: both verify (rotation); dropping the flag and restarting, or
//!   [`ServerKeys::revoke`], revokes one.
//! - clients (monitor, balancer, CLI): `ID:PATH` (`--rmem-key ID:PATH`, or a region's
//!   `?key=ID:PATH`).
//!
//! PATH may be omitted (`ROLE:ID`, `ID`): the key is then the systemd credential
//! `rmem-<ID>` in `$CREDENTIALS_DIRECTORY`, which is also looked at first when a path is
//! given.

use crate::wire::{ENVELOPE_BYTES, REP_HEADER_BYTES};
use farside_auth::keys::{self, KeyError, Keyring, Policy};
use farside_auth::mac::{self, Domain, Envelope, KeyId, TagKey};
use farside_auth::replay::{Replay, ReplayTable, Sequencer};
use farside_auth::rights::{Grant, OpSet, Rights, Words};
use farside_auth::siphash::SipKey;
use farside_region::layout;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

pub use farside_auth::keys::Keyring as AuthKeyring;
pub use farside_auth::mac::KeyId as RmemKeyId;

/// The region every key's rights name (a node serves one region, id 0).
pub const REGION_ID: u32 = 0;

/// The credential name of key `id` (`$CREDENTIALS_DIRECTORY/rmem-<id>`).
pub fn credential_name(id: u32) -> String {
    format!("rmem-{id}")
}

/// What a server-side key may do: its rights on the node's region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// READ the whole region (proxies' monitors, the CLI).
    Reader,
    /// READ; CAS the wanted role and the locks; FETCH-ADD the wanted role and the
    /// counters by at most 1 (`Rights::balancer`).
    Balancer,
}

impl Role {
    pub fn parse(s: &str) -> Result<Role, String> {
        match s {
            "reader" => Ok(Role::Reader),
            "balancer" => Ok(Role::Balancer),
            _ => Err(format!("`{s}`: expected reader or balancer")),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Role::Reader => "reader",
            Role::Balancer => "balancer",
        }
    }

    pub fn rights(self) -> Rights {
        match self {
            Role::Reader => Rights::reader(REGION_ID),
            Role::Balancer => Rights::balancer(REGION_ID),
        }
    }
}

/// The rights of a same-host client (shm: whoever may open the region file): READ
/// everything, and every operation on the control words that are not the agent's.
pub fn local_rights() -> Rights {
    let after_role = Words {
        name: "locks_and_counters",
        first: layout::W_ROLE_ERROR + 1,
        end: layout::CONTROL_END_WORD,
    };
    Rights::new(
        REGION_ID,
        &[
            Grant::new(OpSet::READ, farside_auth::rights::words::REGION),
            Grant::new(OpSet::MUTATIONS, farside_auth::rights::words::ROLE_WANTED),
            Grant::new(OpSet::MUTATIONS, after_role),
        ],
    )
    .expect("no agent-owned word")
}

fn parse_id(s: &str, spec: &str) -> Result<u32, String> {
    s.parse::<u32>()
        .map_err(|e| format!("`{spec}`: key id `{s}`: expected a number (u32): {e}"))
}

fn load(id: u32, path: Option<&Path>) -> Result<SipKey, String> {
    let name = credential_name(id);
    keys::load_key(&name, path, Policy::Production)
        .map(|k| k.key)
        .map_err(|e: KeyError| format!("rmem key {id}: {e}"))
}

/// The key a client seals its requests with. `Debug` never shows the key. Holds the
/// key prepared for both directions (`TagKey`: SipHash's state after the key and the
/// domain label), so sealing a READ and opening its reply start from there.
#[derive(Clone, Copy)]
pub struct ClientKey {
    pub id: KeyId,
    key: SipKey,
    request: TagKey,
    reply: TagKey,
}

impl PartialEq for ClientKey {
    fn eq(&self, other: &ClientKey) -> bool {
        (self.id, self.key) == (other.id, other.key)
    }
}

impl Eq for ClientKey {}

impl fmt::Debug for ClientKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ClientKey({})", self.id)
    }
}

impl ClientKey {
    pub fn new(id: KeyId, key: SipKey) -> ClientKey {
        ClientKey {
            id,
            key,
            request: TagKey::new(Domain::RmemRequest, &key),
            reply: TagKey::new(Domain::RmemReply, &key),
        }
    }

    /// `ID[:PATH]`: the key id and the key file (without a path: the credential).
    pub fn parse_spec(spec: &str) -> Result<(u32, Option<PathBuf>), String> {
        let (id, path) = match spec.split_once(':') {
            Some((id, p)) if !p.is_empty() => (id, Some(PathBuf::from(p))),
            Some((id, _)) => (id, None),
            None => (spec, None),
        };
        Ok((parse_id(id, spec)?, path))
    }

    /// Load `ID[:PATH]` (see the module doc).
    pub fn load(spec: &str) -> Result<ClientKey, String> {
        let (id, path) = Self::parse_spec(spec)?;
        Ok(ClientKey::new(KeyId(id), load(id, path.as_deref())?))
    }

    pub fn key(&self) -> &SipKey {
        &self.key
    }
}

/// One server key flag: `ROLE:ID[:PATH]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeySpec {
    pub role: Role,
    pub id: u32,
    pub path: Option<PathBuf>,
}

impl KeySpec {
    pub fn parse(spec: &str) -> Result<KeySpec, String> {
        let (role, rest) = spec
            .split_once(':')
            .ok_or_else(|| format!("`{spec}`: expected ROLE:ID[:PATH]"))?;
        let role = Role::parse(role).map_err(|e| format!("`{spec}`: role {e}"))?;
        let (id, path) = ClientKey::parse_spec(rest).map_err(|e| format!("`{spec}`: {e}"))?;
        Ok(KeySpec { role, id, path })
    }
}

impl std::str::FromStr for KeySpec {
    type Err = String;
    fn from_str(s: &str) -> Result<KeySpec, String> {
        KeySpec::parse(s)
    }
}

/// Counters of requests refused before any check of their content.
#[derive(Debug, Default)]
pub struct AuthCounters {
    /// Unknown key id or wrong tag.
    pub bad_key: std::sync::atomic::AtomicU64,
    /// Copies refused by the replay window.
    pub replayed: std::sync::atomic::AtomicU64,
}

/// The keys a server accepts, each with its rights, and the replay windows of their
/// senders. Shared by every server of a node (tcp, udp): one window per (key, sender)
/// whichever server a datagram reaches.
#[derive(Debug)]
pub struct ServerKeys {
    keys: RwLock<Ring>,
    replay: Mutex<ReplayTable>,
}

/// The keyring and, per key, what a request's hot path needs made once: the key
/// prepared for both directions and its rights behind an `Arc` (a request takes a
/// reference count, never a copy of the grants). Rebuilt whenever the ring changes.
#[derive(Debug)]
struct Ring {
    ring: Keyring,
    prepared: Vec<Prepared>,
}

#[derive(Debug)]
struct Prepared {
    id: KeyId,
    request: TagKey,
    reply: TagKey,
    rights: Arc<Rights>,
}

impl Ring {
    fn new(ring: Keyring) -> Ring {
        let mut r = Ring {
            ring,
            prepared: Vec::new(),
        };
        r.prepare();
        r
    }

    /// At most `farside_auth::keys::KEYS_MAX` entries: a linear search by id is
    /// cheaper than hashing.
    fn prepare(&mut self) {
        self.prepared = self
            .ring
            .iter()
            .map(|e| Prepared {
                id: e.id,
                request: TagKey::new(Domain::RmemRequest, &e.key),
                reply: TagKey::new(Domain::RmemReply, &e.key),
                rights: Arc::new(e.rights.clone()),
            })
            .collect();
    }

    fn get(&self, id: KeyId) -> Option<&Prepared> {
        self.prepared.iter().find(|p| p.id == id)
    }
}

/// An authentic, fresh request: its envelope, its rights, and where its covered bytes
/// are in the buffer.
pub struct Accepted {
    pub envelope: Envelope,
    /// The request's key prepared for its reply (`seal_reply_prepared`).
    pub reply_key: TagKey,
    pub rights: Arc<Rights>,
    /// The covered bytes: `req[ENVELOPE_BYTES..ENVELOPE_BYTES + len]`.
    pub len: usize,
}

impl ServerKeys {
    pub fn new(keys: Keyring) -> ServerKeys {
        ServerKeys {
            keys: RwLock::new(Ring::new(keys)),
            replay: Mutex::new(ReplayTable::default()),
        }
    }

    /// The keys of `specs` (see the module doc), in order: a later key of a role becomes
    /// its current key, the one before its previous key (both verify).
    pub fn load(specs: &[KeySpec]) -> Result<ServerKeys, String> {
        let mut ring = Keyring::new(Policy::Production);
        for s in specs {
            let key = load(s.id, s.path.as_deref())?;
            ring.install(s.role.name(), KeyId(s.id), key, s.role.rights())
                .map_err(|e| format!("rmem key {}: {e}", s.id))?;
        }
        Ok(ServerKeys::new(ring))
    }

    /// Install one more key (a rotation: `name`'s current key becomes its previous).
    pub fn install(
        &self,
        name: &str,
        id: KeyId,
        key: SipKey,
        rights: Rights,
    ) -> Result<(), KeyError> {
        let mut k = self.keys.write().unwrap_or_else(|p| p.into_inner());
        let dropped = k.ring.install(name, id, key, rights);
        k.prepare();
        if let Some(dropped) = dropped? {
            self.forget(dropped);
        }
        Ok(())
    }

    /// Revoke key `id`: nothing under it verifies from now on.
    pub fn revoke(&self, id: KeyId) -> bool {
        let mut k = self.keys.write().unwrap_or_else(|p| p.into_inner());
        let had = k.ring.revoke(id);
        k.prepare();
        self.forget(id);
        had
    }

    fn forget(&self, id: KeyId) {
        let mut r = self.replay.lock().unwrap_or_else(|p| p.into_inner());
        r.forget_key(id);
    }

    /// Replace the whole keyring (a reload of the key files): keys no longer in `ring`
    /// are revoked at once. Returns the ids revoked. Their replay windows stay (a key
    /// id that comes back with the same key must not accept old messages again).
    pub fn replace_keyring(&self, ring: Keyring) -> Vec<KeyId> {
        let mut k = self.keys.write().unwrap_or_else(|p| p.into_inner());
        let gone = k
            .ring
            .iter()
            .map(|e| e.id)
            .filter(|id| ring.get(*id).is_none())
            .collect();
        *k = Ring::new(ring);
        gone
    }

    /// Run `f` on the replay table (a restart's floor, the ceiling:
    /// `farside_auth::floor`).
    pub fn with_replay<R>(&self, f: impl FnOnce(&mut ReplayTable) -> R) -> R {
        let mut r = self.replay.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut r)
    }

    /// A copy of the keyring (the XDP loader fills its map from it).
    pub fn keyring(&self) -> Keyring {
        self.keys
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .ring
            .clone()
    }

    /// Authenticate `req` (`farside_auth::receive`): the envelope, its key's tag, the
    /// replay window. `Err` is `BadKey` (malformed envelope, unknown key, wrong tag) or
    /// `Replayed`: never answered.
    pub fn receive(&self, req: &[u8]) -> Result<Accepted, crate::wire::Status> {
        use crate::wire::Status;
        // farside_auth::receive's order (parse, key by id, tag, then the window), with
        // the key prepared once.
        let parsed = mac::parse(req).map_err(|_| Status::BadKey)?;
        let keys = self.keys.read().unwrap_or_else(|p| p.into_inner());
        let key = keys.get(parsed.envelope.key_id).ok_or(Status::BadKey)?;
        let opened = key.request.verify(&parsed).map_err(|_| Status::BadKey)?;
        let env = opened.envelope;
        let mut replay = self.replay.lock().unwrap_or_else(|p| p.into_inner());
        replay
            .accept(env.key_id, env.sender, env.seq)
            .map_err(|_| Status::Replayed)?;
        Ok(Accepted {
            envelope: env,
            reply_key: key.reply,
            rights: Arc::clone(&key.rights),
            len: opened.message.len(),
        })
    }
}

/// Seal `covered` (header + payload) as a request into `out` (cleared first).
pub fn seal_request(out: &mut Vec<u8>, key: &ClientKey, sender: u64, seq: u64, covered: &[u8]) {
    out.clear();
    out.resize(ENVELOPE_BYTES + covered.len(), 0);
    seal_request_to(out, key, sender, seq, covered);
}

/// Seal `covered` as a request into the front of `out` without allocating (a poller's
/// send buffers); returns the bytes written. `out` must hold
/// `ENVELOPE_BYTES + covered.len()`.
pub fn seal_request_to(
    out: &mut [u8],
    key: &ClientKey,
    sender: u64,
    seq: u64,
    covered: &[u8],
) -> usize {
    let n = ENVELOPE_BYTES + covered.len();
    out[ENVELOPE_BYTES..n].copy_from_slice(covered);
    let env = Envelope {
        key_id: key.id,
        sender,
        seq,
    };
    let tag = key.request.tag(&env, covered);
    out[0..8].copy_from_slice(&tag.to_le_bytes());
    out[8..12].copy_from_slice(&key.id.0.to_le_bytes());
    out[12..16].copy_from_slice(&(covered.len() as u32).to_le_bytes());
    out[16..24].copy_from_slice(&sender.to_le_bytes());
    out[24..32].copy_from_slice(&seq.to_le_bytes());
    n
}

/// Seal the reply whose covered bytes are `reply[ENVELOPE_BYTES..]` in place: write its
/// envelope (the request's key id, sender and seq) into `reply[..ENVELOPE_BYTES]`.
pub fn seal_reply_in_place(reply: &mut [u8], key: &SipKey, request: &Envelope) {
    seal_reply_prepared(reply, &TagKey::new(Domain::RmemReply, key), request);
}

/// [`seal_reply_in_place`] with the key prepared for the reply domain (a server's hot
/// path: [`Accepted::reply_key`]).
pub fn seal_reply_prepared(reply: &mut [u8], key: &TagKey, request: &Envelope) {
    let covered_len = reply.len() - ENVELOPE_BYTES;
    let tag = key.tag(request, &reply[ENVELOPE_BYTES..]);
    reply[0..8].copy_from_slice(&tag.to_le_bytes());
    reply[8..12].copy_from_slice(&request.key_id.0.to_le_bytes());
    reply[12..16].copy_from_slice(&(covered_len as u32).to_le_bytes());
    reply[16..24].copy_from_slice(&request.sender.to_le_bytes());
    reply[24..32].copy_from_slice(&request.seq.to_le_bytes());
}

/// Why a reply was not taken for the answer to the client's request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplyRefusal {
    /// Not a well-formed envelope, another key, or a tag that does not verify.
    NotAuthentic,
    /// Authentic, but for another sender or none of the current attempts.
    NotOurs,
}

/// Open a reply: authentic under `key` in the reply domain, for `sender`, and bound to
/// a request whose envelope seq is in `seqs` (the current operation's attempts).
/// Returns the covered bytes (reply header and payload).
pub fn open_reply<'a>(
    reply: &'a [u8],
    key: &ClientKey,
    sender: u64,
    seqs: std::ops::RangeInclusive<u64>,
) -> Result<&'a [u8], ReplyRefusal> {
    let parsed = mac::parse(reply).map_err(|_| ReplyRefusal::NotAuthentic)?;
    if parsed.envelope.key_id != key.id {
        return Err(ReplyRefusal::NotAuthentic);
    }
    let o = key
        .reply
        .verify(&parsed)
        .map_err(|_| ReplyRefusal::NotAuthentic)?;
    if o.envelope.sender != sender || !seqs.contains(&o.envelope.seq) {
        return Err(ReplyRefusal::NotOurs);
    }
    if o.message.len() < REP_HEADER_BYTES {
        return Err(ReplyRefusal::NotAuthentic);
    }
    Ok(o.message)
}

/// A client's envelope state: its random sender id and sequence numbers.
#[derive(Debug, Clone)]
pub struct SenderState {
    pub sender: u64,
    seq: Sequencer,
}

impl Default for SenderState {
    fn default() -> Self {
        SenderState::new()
    }
}

impl SenderState {
    /// A random sender id (never 0).
    pub fn new() -> SenderState {
        SenderState {
            sender: crate::random_u64().max(1),
            seq: Sequencer::new(),
        }
    }

    /// The next envelope seq (restart-safe: `Sequencer`). At `u64::MAX` a new sender id.
    pub fn next_seq(&mut self) -> u64 {
        match self.seq.next(coarse_unix_s()) {
            Some(s) => s,
            None => {
                *self = SenderState::new();
                self.seq.next(coarse_unix_s()).expect("fresh")
            }
        }
    }
}

/// Seconds since the Unix epoch from `CLOCK_REALTIME_COARSE` (the last tick's time: a
/// few ns where `SystemTime::now` reads the clock source, on every READ a monitor
/// sends). The sequencer needs seconds: a tick (≤ 10 ms) late changes nothing but
/// the moment its seconds turn over.
pub fn coarse_unix_s() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid timespec for the call to fill.
    let r = unsafe { libc::clock_gettime(libc::CLOCK_REALTIME_COARSE, &mut ts) };
    if r != 0 || ts.tv_sec < 0 {
        return Sequencer::unix_s();
    }
    ts.tv_sec as u64
}

/// Why a replay window refused: for logs.
pub fn replay_name(r: Replay) -> &'static str {
    match r {
        Replay::Zero => "zero",
        Replay::Duplicate => "duplicate",
        Replay::TooOld { .. } => "too_old",
        Replay::AboveCeiling { .. } => "above_ceiling",
    }
}

/// Fresh random keys for tests and loopback labs, installed as a server would: a
/// reader (key id 1) and a balancer (key id 2).
pub struct LabKeyset {
    pub reader: ClientKey,
    pub balancer: ClientKey,
}

impl LabKeyset {
    pub const READER_ID: u32 = 1;
    pub const BALANCER_ID: u32 = 2;

    pub fn generate() -> LabKeyset {
        let g = || keys::generate_key(Policy::Lab).expect("getrandom");
        LabKeyset {
            reader: ClientKey::new(KeyId(Self::READER_ID), g()),
            balancer: ClientKey::new(KeyId(Self::BALANCER_ID), g()),
        }
    }

    /// The server's keyring for these keys.
    pub fn keyring(&self) -> Keyring {
        let mut k = Keyring::new(Policy::Production);
        k.install(
            "reader",
            self.reader.id,
            self.reader.key,
            Role::Reader.rights(),
        )
        .expect("random keys");
        k.install(
            "balancer",
            self.balancer.id,
            self.balancer.key,
            Role::Balancer.rights(),
        )
        .expect("random keys");
        k
    }

    pub fn server(&self) -> std::sync::Arc<ServerKeys> {
        std::sync::Arc::new(ServerKeys::new(self.keyring()))
    }

    /// Write the keys as key files (0600) into `dir`: `rmem-1.key` (reader) and
    /// `rmem-2.key` (balancer); returns their paths.
    pub fn write_files(&self, dir: &Path) -> std::io::Result<(PathBuf, PathBuf)> {
        Ok((
            write_key_file(dir, "rmem-1.key", &self.reader.key)?,
            write_key_file(dir, "rmem-2.key", &self.balancer.key)?,
        ))
    }
}

/// Write `key` as a key file (32 hex digits, mode 0600) named `name` in `dir`.
pub fn write_key_file(dir: &Path, name: &str, key: &SipKey) -> std::io::Result<PathBuf> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let p = dir.join(name);
    let _ = std::fs::remove_file(&p);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&p)?;
    let hex: String = key.to_bytes().iter().map(|b| format!("{b:02x}")).collect();
    writeln!(f, "{hex}")?;
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_coarse_clock_tells_the_same_second_as_the_system_clock() {
        let (a, c, b) = (Sequencer::unix_s(), coarse_unix_s(), Sequencer::unix_s());
        // The coarse clock lags by at most a tick: the same second, or the one before.
        assert!(c + 1 >= a && c <= b, "{a} {c} {b}");
    }

    #[test]
    fn prepared_keys_seal_and_open_as_the_generic_envelope_does() {
        let k = SipKey::from_halves(0x1234, 0x5678);
        let ck = ClientKey::new(KeyId(9), k);
        let covered: Vec<u8> = (0..56u8).collect();
        let mut a = Vec::new();
        seal_request(&mut a, &ck, 77, 1 << 40, &covered);
        let env = Envelope {
            key_id: KeyId(9),
            sender: 77,
            seq: 1 << 40,
        };
        let mut b = Vec::new();
        mac::seal(&mut b, Domain::RmemRequest, &k, &env, &covered).unwrap();
        assert_eq!(a, b);
        let mut rep = vec![0u8; ENVELOPE_BYTES + REP_HEADER_BYTES + 192];
        seal_reply_in_place(&mut rep, &k, &env);
        let o = mac::open(Domain::RmemReply, &rep, |_| Some(k)).unwrap();
        assert_eq!(o.envelope, env);
        assert!(open_reply(&rep, &ck, 77, 1..=u64::MAX).is_ok());
        rep[40] ^= 1;
        assert_eq!(
            open_reply(&rep, &ck, 77, 1..=u64::MAX),
            Err(ReplyRefusal::NotAuthentic)
        );
    }

    #[test]
    fn specs_parse_and_name_their_role_and_id() {
        let s = KeySpec::parse("balancer:7:/etc/farside/b.key").unwrap();
        assert_eq!(s.role, Role::Balancer);
        assert_eq!(s.id, 7);
        assert_eq!(s.path.as_deref(), Some(Path::new("/etc/farside/b.key")));
        assert_eq!(KeySpec::parse("reader:3").unwrap().path, None);
        assert!(KeySpec::parse("writer:1:/x").is_err());
        assert!(KeySpec::parse("reader:x:/x").is_err());
        assert!(KeySpec::parse("reader").is_err());
        assert_eq!(
            ClientKey::parse_spec("9:/k").unwrap(),
            (9, Some("/k".into()))
        );
    }

    #[test]
    fn keys_load_from_0600_files_only_and_example_keys_are_refused() {
        let dir = std::env::temp_dir().join(format!("rmem-auth-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let set = LabKeyset::generate();
        let (reader, _) = set.write_files(&dir).unwrap();
        let k = ClientKey::load(&format!("1:{}", reader.display())).unwrap();
        assert_eq!(k, set.reader);
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&reader, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = ClientKey::load(&format!("1:{}", reader.display())).unwrap_err();
        assert!(e.contains("0600"), "{e}");
        let lab = write_key_file(
            &dir,
            "lab.key",
            &SipKey::from_bytes(farside_auth::keys::LAB_KEY),
        )
        .unwrap();
        let e =
            ServerKeys::load(&[KeySpec::parse(&format!("reader:1:{}", lab.display())).unwrap()])
                .unwrap_err();
        assert!(e.contains("example"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
