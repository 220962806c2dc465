//! A `tcp` region read by the poller: a non-blocking stream per back-end, in the
//! poller's `ppoll` set, at most one READ in flight on it. The read's deadline covers
//! connecting, sending and the whole reply (the blocking client's operation timeout);
//! a read that misses it, or a reply that does not answer it, closes the stream (it
//! may be out of step) and counts as a failed read. Connect failures back off as the
//! blocking client's reconnects.

use crate::watch::MONITOR_READ_BYTES;
use crate::RECONNECT_BACKOFF_MAX;
use farside_rmem::auth::{open_reply, seal_request_to, ClientKey, SenderState};
use farside_rmem::wire::{
    encode_request, Op, RepHeader, ReqHeader, Status, ENVELOPE_BYTES, OP_BYTES_MAX,
    REP_HEADER_BYTES, REQ_HEADER_BYTES,
};
use farside_rmem::RmemError;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd};
use std::time::{Duration, Instant};

/// A read's outcome.
pub(crate) enum Done {
    /// The region's first `MONITOR_READ_BYTES`, and the read's round trip, ns.
    Read(Box<[u8; MONITOR_READ_BYTES]>, u64),
    Failed(RmemError),
}

struct Conn {
    s: TcpStream,
    connected: bool,
    out: Vec<u8>,
    out_off: usize,
    inbuf: Vec<u8>,
}

/// A READ in flight: its sequence number, its envelope's, start and deadline.
#[derive(Clone, Copy)]
struct Pending {
    seq: u64,
    env_seq: u64,
    started: Instant,
    deadline: Instant,
}

/// One back-end read over tcp.
pub(crate) struct TcpSlot {
    addr: SocketAddr,
    key: ClientKey,
    env: SenderState,
    conn: Option<Conn>,
    pending: Option<Pending>,
    backoff: Duration,
    next_connect: Instant,
}

impl TcpSlot {
    pub(crate) fn new(addr: SocketAddr, key: ClientKey) -> TcpSlot {
        TcpSlot {
            addr,
            key,
            env: SenderState::new(),
            conn: None,
            pending: None,
            backoff: Duration::ZERO,
            next_connect: Instant::now(),
        }
    }

    /// The fd and events to poll (fd -1: nothing to wait for).
    pub(crate) fn pollfd(&self) -> (i32, i16) {
        match &self.conn {
            Some(c) if !c.connected || c.out_off < c.out.len() => {
                (c.s.as_raw_fd(), libc::POLLOUT | libc::POLLIN)
            }
            Some(c) => (c.s.as_raw_fd(), libc::POLLIN),
            None => (-1, 0),
        }
    }

    /// The period's step: fail a read past its deadline, or start one (connecting
    /// first if needed) when none is in flight. `seq`: the new read's sequence number.
    pub(crate) fn tick(
        &mut self,
        now: Instant,
        seq: u64,
        read_timeout: Duration,
        period: Duration,
    ) -> Option<Done> {
        if let Some(p) = self.pending {
            if now >= p.deadline {
                return Some(self.fail(RmemError::Timeout));
            }
            return None;
        }
        if self.conn.is_none() {
            if now < self.next_connect {
                return None;
            }
            match connect_nonblocking(self.addr) {
                Ok((s, connected)) => {
                    self.conn = Some(Conn {
                        s,
                        connected,
                        out: Vec::with_capacity(64),
                        out_off: 0,
                        inbuf: Vec::with_capacity(REP_HEADER_BYTES + MONITOR_READ_BYTES),
                    })
                }
                Err(e) => {
                    self.backoff = (self.backoff * 2).clamp(period, RECONNECT_BACKOFF_MAX);
                    self.next_connect = now + self.backoff;
                    return Some(Done::Failed(e.into()));
                }
            }
        }
        let c = self.conn.as_mut().expect("connected above");
        let mut covered = [0u8; REQ_HEADER_BYTES];
        let mut v = Vec::with_capacity(REQ_HEADER_BYTES);
        encode_request(
            &mut v,
            &ReqHeader {
                op: Op::Read as u8,
                flags: 0,
                seq,
                region: 0,
                offset: 0,
                len: MONITOR_READ_BYTES as u32,
            },
            &[],
        );
        covered.copy_from_slice(&v);
        let env_seq = self.env.next_seq();
        c.out.resize(ENVELOPE_BYTES + REQ_HEADER_BYTES, 0);
        seal_request_to(&mut c.out, &self.key, self.env.sender, env_seq, &covered);
        c.out_off = 0;
        self.pending = Some(Pending {
            seq,
            env_seq,
            started: now,
            deadline: now + read_timeout,
        });
        if c.connected {
            return self.progress(0);
        }
        None
    }

    /// The stream is ready (`revents` from poll): connect, send, receive.
    pub(crate) fn on_ready(&mut self, revents: i16) -> Option<Done> {
        self.progress(revents)
    }

    fn progress(&mut self, revents: i16) -> Option<Done> {
        let c = self.conn.as_mut()?;
        if !c.connected {
            if revents & (libc::POLLOUT | libc::POLLERR | libc::POLLHUP) == 0 {
                return None;
            }
            match c.s.take_error() {
                Ok(None) => {
                    c.connected = true;
                    self.backoff = Duration::ZERO;
                }
                Ok(Some(e)) | Err(e) => return Some(self.fail_connect(e)),
            }
        }
        while c.out_off < c.out.len() {
            match c.s.write(&c.out[c.out_off..]) {
                Ok(n) => c.out_off += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Some(self.fail(e.into())),
            }
        }
        let mut buf = [0u8; 1024];
        loop {
            match c.s.read(&mut buf) {
                Ok(0) => {
                    return Some(self.fail(RmemError::Io(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "connection closed by the region's server",
                    ))))
                }
                Ok(n) => {
                    c.inbuf.extend_from_slice(&buf[..n]);
                    if c.inbuf.len() > ENVELOPE_BYTES + REP_HEADER_BYTES + OP_BYTES_MAX {
                        break;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Some(self.fail(e.into())),
            }
        }
        // The envelope frames the reply; its tag is checked once it is whole.
        if c.inbuf.len() < ENVELOPE_BYTES {
            return None;
        }
        let covered = u32::from_le_bytes(c.inbuf[12..16].try_into().expect("4 bytes")) as usize;
        if !(REP_HEADER_BYTES..=REP_HEADER_BYTES + OP_BYTES_MAX).contains(&covered) {
            return Some(self.fail(RmemError::Protocol(format!(
                "reply length {covered} outside {REP_HEADER_BYTES}..={}",
                REP_HEADER_BYTES + OP_BYTES_MAX
            ))));
        }
        let need = ENVELOPE_BYTES + covered;
        if c.inbuf.len() < need {
            return None;
        }
        let Some(p) = self.pending else {
            return Some(self.fail(RmemError::Protocol("reply with no read pending".into())));
        };
        let body = match open_reply(
            &c.inbuf[..need],
            &self.key,
            self.env.sender,
            p.env_seq..=p.env_seq,
        ) {
            Ok(b) => b,
            Err(r) => return Some(self.fail(RmemError::Protocol(format!("reply refused: {r:?}")))),
        };
        let h = match RepHeader::decode(body) {
            Ok(h) => h,
            Err(_) => return Some(self.fail(RmemError::Protocol("malformed reply".into()))),
        };
        if h.seq != p.seq || h.op != Op::Read as u8 {
            return Some(self.fail(RmemError::Protocol(format!(
                "reply for seq {} op {}, expected seq {} op {}",
                h.seq,
                h.op,
                p.seq,
                Op::Read as u8
            ))));
        }
        if h.status != Status::Ok {
            let st = h.status;
            c.inbuf.drain(..need);
            self.pending = None;
            return Some(Done::Failed(RmemError::Refused(st)));
        }
        if h.len as usize != MONITOR_READ_BYTES
            || body.len() != REP_HEADER_BYTES + MONITOR_READ_BYTES
        {
            return Some(self.fail(RmemError::Protocol(format!(
                "reply carries {} bytes, expected {MONITOR_READ_BYTES}",
                h.len
            ))));
        }
        let mut out = Box::new([0u8; MONITOR_READ_BYTES]);
        out.copy_from_slice(&body[REP_HEADER_BYTES..]);
        c.inbuf.drain(..need);
        self.pending = None;
        Some(Done::Read(out, p.started.elapsed().as_nanos() as u64))
    }

    /// The read failed: the stream may be out of step, so it is closed.
    fn fail(&mut self, e: RmemError) -> Done {
        self.conn = None;
        self.pending = None;
        Done::Failed(e)
    }

    fn fail_connect(&mut self, e: io::Error) -> Done {
        let now = Instant::now();
        self.backoff = (self.backoff * 2).clamp(Duration::from_millis(1), RECONNECT_BACKOFF_MAX);
        self.next_connect = now + self.backoff;
        self.fail(e.into())
    }
}

/// Start a non-blocking connect to `addr`: the stream, and whether it is connected
/// already (loopback may complete at once).
fn connect_nonblocking(addr: SocketAddr) -> io::Result<(TcpStream, bool)> {
    let family = if addr.is_ipv4() {
        libc::AF_INET
    } else {
        libc::AF_INET6
    };
    // SAFETY: plain socket(2) call.
    let fd = unsafe {
        libc::socket(
            family,
            libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh socket this function owns; TcpStream closes it on drop.
    let s = unsafe { TcpStream::from_raw_fd(fd) };
    s.set_nodelay(true)?;
    let (ss, len) = farside_rt::sockaddr::to_storage(&addr);
    // SAFETY: ss holds a valid sockaddr of `len` bytes for fd's family.
    let rc = unsafe { libc::connect(fd, (&ss as *const libc::sockaddr_storage).cast(), len) };
    if rc == 0 {
        return Ok((s, true));
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EINPROGRESS) {
        Ok((s, false))
    } else {
        Err(e)
    }
}
