//! Sans-IO framing shared by the byte-stream transports (tokio TCP and io_uring TCP):
//! a write queue that turns messages into fragments, and an assembler that turns
//! received bytes back into messages. Neither touches a socket, so both are tested
//! without one and both backends run the same code.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use bytes::{Buf, Bytes, BytesMut};
use hcomm_core::pool::{self, PoolBuf};
use hcomm_core::wire::{HEADER_LEN, Header, PAD, SHORT_LEN, SHORT_MAGIC, SHORT_MAX, WireError};
use hcomm_core::{Error, ErrorKind, Frame, Result};
use tokio::sync::oneshot;

use hcomm_core::landing::{LANDING_MIN, Landing};

/// Fragments up to this size are copied into the write batch; larger ones are written
/// from the caller's buffer directly.
const COPY_LIMIT: usize = 16 << 10;
/// A batch is written once it holds this much.
const BATCH_LIMIT: usize = 256 << 10;
/// How many messages may be interleaved at once.
const MAX_ACTIVE: usize = 8;
/// How far into the pending queue `activate` looks for a message to start.
const SCAN_LIMIT: usize = 64;
/// How many partially received messages a peer may have open at once.
pub(crate) const MAX_PARTIAL: usize = 1024;
/// A reassembly buffer is preallocated up to this size and grows past it only as
/// bytes arrive, so that a header cannot make us allocate without bound.
const MAX_PREALLOC: u64 = 64 << 20;
/// Bytes asked for per read when nothing larger is known to be coming.
const READ_CHUNK: usize = 64 << 10;
/// Fragments of this size and more are read straight into their message's buffer.
const DIRECT_MIN: usize = 32 << 10;

/// A message queued for one peer.
#[derive(Debug)]
pub(crate) struct Outgoing {
    pub header: Header,
    pub payload: Bytes,
    pub done: Option<oneshot::Sender<Result<()>>>,
    /// `payload` is the rest of a frame the sending task began writing to the socket
    /// itself ([`Outgoing::rest`]): written as it is, before anything else.
    pub raw: bool,
}

impl Outgoing {
    /// A message whose payload is here.
    pub(crate) fn new(header: Header, payload: Bytes, done: Option<oneshot::Sender<Result<()>>>) -> Outgoing {
        Outgoing { header, payload, done, raw: false }
    }

    /// The unwritten end of a frame whose start a sending task wrote to the socket
    /// directly: it goes out next, whole, before any queued message.
    pub(crate) fn rest(header: Header, bytes: Bytes, done: Option<oneshot::Sender<Result<()>>>) -> Outgoing {
        Outgoing { header, payload: bytes, done, raw: true }
    }

    fn len(&self) -> usize {
        self.payload.len()
    }
}

#[derive(Debug)]
struct Active {
    header: Header,
    payload: Bytes,
    len: usize,
    offset: usize,
    done: Option<oneshot::Sender<Result<()>>>,
}

fn same_key(a: &Header, b: &Header) -> bool {
    (a.comm, a.seq, a.tag) == (b.comm, b.seq, b.tag)
}

/// Turns queued messages into a stream of fragments. Up to [`MAX_ACTIVE`] messages are
/// interleaved fragment by fragment, so that a small message does not wait behind a
/// large one; a message never starts while another with the same match key is still
/// being sent, so messages with one key arrive in the order they were queued.
#[derive(Debug)]
pub(crate) struct WriteQueue {
    /// Ends of frames begun directly ([`Outgoing::rest`]), written first.
    raw: VecDeque<Outgoing>,
    pending: VecDeque<Outgoing>,
    active: VecDeque<Active>,
    finished: Vec<oneshot::Sender<Result<()>>>,
    /// Messages whose last fragment went into the current batch.
    completed: usize,
    next_msg_id: u64,
    fragment: usize,
}

impl WriteQueue {
    pub fn new(fragment: usize) -> WriteQueue {
        WriteQueue {
            raw: VecDeque::new(),
            pending: VecDeque::new(),
            active: VecDeque::new(),
            finished: Vec::new(),
            completed: 0,
            next_msg_id: 0,
            fragment: fragment.max(1),
        }
    }

    pub fn push(&mut self, o: Outgoing) {
        match o.raw {
            true => self.raw.push_back(o),
            false => self.pending.push_back(o),
        }
    }

    pub fn is_idle(&self) -> bool {
        self.raw.is_empty() && self.pending.is_empty() && self.active.is_empty()
    }

    /// Starts messages from the pending queue, skipping (but keeping in order) any
    /// whose key is held by an active message or by an earlier skipped one.
    fn activate(&mut self) {
        let mut held: Vec<Header> = Vec::new();
        let mut i = 0;
        while self.active.len() < MAX_ACTIVE && i < self.pending.len() && i < SCAN_LIMIT {
            let h = self.pending[i].header;
            if self.active.iter().any(|a| same_key(&a.header, &h)) || held.iter().any(|k| same_key(k, &h)) {
                held.push(h);
                i += 1;
                continue;
            }
            let o = self.pending.remove(i).expect("index is in range");
            let mut header = o.header;
            let len = o.len();
            header.msg_id = self.next_msg_id;
            header.msg_len = len as u64;
            self.next_msg_id = self.next_msg_id.wrapping_add(1);
            self.active.push_back(Active { header, payload: o.payload, len, offset: 0, done: o.done });
        }
    }

    /// Appends encoded fragments to `batch` until the batch is full, the queue is
    /// empty, or a fragment too large to copy comes up: then its header ends the
    /// batch and its payload is returned, to be written right after the batch.
    pub fn fill(&mut self, batch: &mut BytesMut) -> Option<Bytes> {
        // A frame's end left by a direct write was queued while nothing else was
        // (the writer was idle), so nothing queued can precede it.
        while let Some(mut r) = self.raw.pop_front() {
            self.completed += 1;
            self.finished.extend(r.done.take());
            if r.payload.len() > COPY_LIMIT {
                return Some(r.payload);
            }
            batch.extend_from_slice(&r.payload);
        }
        loop {
            self.activate();
            let mut a = self.active.pop_front()?;
            let n = (a.len - a.offset).min(self.fragment);
            let mut h = a.header;
            h.offset = a.offset as u64;
            h.frag_len = n as u32;
            batch.extend_from_slice(&h.encode());
            let range = a.offset..a.offset + n;
            let frag = a.payload.slice(range);
            a.offset += n;
            if a.offset == a.len {
                self.completed += 1;
                self.finished.extend(a.done.take());
            } else {
                self.active.push_back(a);
            }
            if n > COPY_LIMIT {
                return Some(frag);
            }
            batch.extend_from_slice(&frag);
            if batch.len() >= BATCH_LIMIT {
                return None;
            }
        }
    }

    /// Everything returned by the last `fill` was written: completes the messages
    /// whose last fragment was in it; returns how many there were.
    pub fn written(&mut self) -> usize {
        for tx in self.finished.drain(..) {
            let _ = tx.send(Ok(()));
        }
        std::mem::take(&mut self.completed)
    }

    /// The connection broke: fails every message not yet completed.
    pub fn fail_all(&mut self, err: &Error) {
        let txs = self
            .finished
            .drain(..)
            .chain(self.raw.drain(..).filter_map(|o| o.done))
            .chain(self.active.drain(..).filter_map(|a| a.done))
            .chain(self.pending.drain(..).filter_map(|o| o.done));
        for tx in txs {
            let _ = tx.send(Err(err.clone()));
        }
    }
}

#[derive(Debug)]
struct Partial {
    header: Header,
    /// When its first fragment's header was read.
    opened: std::time::Instant,
    data: PoolBuf,
    /// The message lands in a receive's buffer instead ([`hcomm_core::landing`]):
    /// `data` stays empty.
    landed: Option<Landed>,
}

/// A message that lands in a receive's buffer: how far it has arrived, and the pieces
/// read elsewhere than into that buffer.
#[derive(Debug)]
struct Landed {
    landing: Arc<Landing>,
    received: usize,
    pieces: Vec<(usize, Bytes)>,
    /// The piece that reads by someone other than the receive go into, and its
    /// offset in the message: consecutive reads fill one piece.
    cur: Option<(usize, PoolBuf)>,
}

impl Landed {
    /// Ends the current piece (it holds everything up to `received`).
    fn flush(&mut self) {
        if let Some((at, buf)) = self.cur.take()
            && !buf.is_empty()
        {
            self.pieces.push((at, buf.freeze()));
        }
    }
}

impl Partial {
    fn received(&self) -> usize {
        self.landed.as_ref().map_or(self.data.len(), |l| l.received)
    }
}

/// Parses received bytes into complete messages, reassembling fragments. Every
/// header is validated ([`Header::decode`]), fragments must arrive in order and fit
/// their message, the source rank must be the connection's peer, and the number of
/// open messages is bounded.
///
/// Small frames are read into one buffer and split off it. A fragment of
/// [`DIRECT_MIN`] bytes or more is read straight into its message's buffer (from the
/// [`pool`](hcomm_core::pool)), so that its bytes are copied once, by the kernel or
/// the shared-memory ring, and never again before the receiver takes them.
#[derive(Debug)]
pub(crate) struct Assembler {
    buf: BytesMut,
    partial: HashMap<u64, Partial>,
    peer: u32,
    /// A fragment being read into its message's buffer: the message's id and the
    /// length its buffer has once the fragment is in.
    direct: Option<(u64, usize)>,
    /// The stream is a shared-memory ring's: short frames and padding between frames
    /// are allowed ([`hcomm_core::wire`]).
    ring: bool,
    /// Where large messages may land in their receive's buffer ([`Assembler::landing`]).
    mailbox: Option<Arc<hcomm_core::Mailbox>>,
    /// Counts of landed messages.
    landed: Option<Arc<LandStats>>,
    /// The least length of a message that lands ([`LANDING_MIN`] or more).
    land_min: usize,
    /// The last fragment begun was read straight into its message
    /// ([`DIRECT_MIN`] bytes or more): the next read takes a header alone, if
    /// `header_alone` (see [`Assembler::read_target`]).
    after_direct: bool,
    /// [`Assembler::header_alone`].
    header_alone: bool,
}

/// Counts of the messages that landed in their receive's buffer
/// ([`crate::StreamTransport::tcp_landed`]).
#[derive(Debug, Default)]
pub(crate) struct LandStats {
    /// Messages that landed.
    pub messages: std::sync::atomic::AtomicU64,
    /// Their bytes that the receive read from the socket into its buffer itself.
    pub own_bytes: std::sync::atomic::AtomicU64,
    /// Their bytes that others read, into pieces the receive copied in.
    pub piece_bytes: std::sync::atomic::AtomicU64,
}

/// Whether the message `h` begins may land in its receive's buffer: a data message
/// of `min` bytes or more.
fn landable(h: &Header, min: usize) -> bool {
    h.kind == hcomm_core::FrameKind::Data && h.msg_len >= min as u64
}

/// The landing of the receive waiting for the message `h` begins, if it may land
/// ([`landable`]) and that receive offered a buffer of its length
/// ([`hcomm_core::Mailbox::claim`]).
fn claim_landing(m: &hcomm_core::Mailbox, min: usize, h: &Header) -> Option<Arc<Landing>> {
    let len = usize::try_from(h.msg_len).ok().filter(|_| landable(h, min))?;
    m.claim(&hcomm_core::MatchKey::of(h), len)
}

fn protocol(msg: impl Into<String>) -> Error {
    Error::new(ErrorKind::Protocol, msg)
}

impl Assembler {
    pub fn new(peer: usize) -> Assembler {
        Assembler {
            buf: BytesMut::with_capacity(READ_CHUNK),
            partial: HashMap::new(),
            peer: peer as u32,
            direct: None,
            ring: false,
            mailbox: None,
            landed: None,
            land_min: LANDING_MIN,
            after_direct: false,
            header_alone: false,
        }
    }

    /// An assembler whose large messages may land straight in the buffer of the
    /// receive waiting for them in `mailbox` ([`hcomm_core::landing`]), for a link
    /// that such a receive can read itself ([`Assembler::owner_target`]).
    /// Messages shorter than `min` (or than [`LANDING_MIN`]) never land.
    pub fn landing(peer: usize, mailbox: Arc<hcomm_core::Mailbox>, stats: Arc<LandStats>, min: usize) -> Assembler {
        let land_min = min.max(LANDING_MIN);
        Assembler { mailbox: Some(mailbox), landed: Some(stats), land_min, ..Assembler::new(peer) }
    }

    /// After a fragment read straight into its message, read the next header alone
    /// ([`Assembler::read_target`]), so that the next large fragment is not partly
    /// read here and copied. Only for TCP connections of ranks that do not outnumber
    /// the processors, where it was measured to help (`docs/tuning-rules.md`).
    pub fn header_alone(self, on: bool) -> Assembler {
        Assembler { header_alone: on && !self.ring, ..self }
    }

    /// An assembler for the stream of a shared-memory ring, which also carries short
    /// frames and padding.
    pub fn for_ring(peer: usize) -> Assembler {
        Assembler { ring: true, ..Assembler::new(peer) }
    }

    /// Skips padding at a frame boundary; the short frame or box at the start
    /// of the buffer, if one is there whole (`Ok(None)`: none there, or not whole yet).
    fn short_frame(&mut self) -> Result<Option<Frame>> {
        let pad = self.buf.iter().take_while(|&&b| b == PAD).count();
        self.buf.advance(pad);
        if self.buf.first() == Some(&BOX_MAGIC) {
            if self.buf.len() < SHORT_LEN {
                return Ok(None);
            }
            let h = box_header(&self.buf, self.peer as usize)?;
            let len = box_len(h.frag_len as usize);
            if self.buf.len() < len {
                return Ok(None);
            }
            let first = &self.buf[SHORT_LEN..BOX_LINE - 8];
            let f = Frame::new(h, box_payload(&h, first, &self.buf[BOX_LINE..len]));
            self.buf.advance(len);
            return Ok(Some(f));
        }
        if self.buf.first() != Some(&SHORT_MAGIC) || self.buf.len() < SHORT_LEN {
            return Ok(None);
        }
        let h = Header::decode_short(&self.buf, self.peer).map_err(|e| protocol(e.to_string()))?;
        let n = h.frag_len as usize;
        if self.buf.len() < SHORT_LEN + n {
            return Ok(None);
        }
        self.buf.advance(SHORT_LEN);
        Ok(Some(Frame::new(h, self.buf.split_to(n).freeze())))
    }

    /// The buffer to read into next and the most bytes to read into it, taken by
    /// value (io_uring needs owned buffers); hand it back with [`filled`](Self::filled)
    /// before asking for frames. The buffer has room for at least one byte.
    pub fn read_target(&mut self) -> (BytesMut, usize) {
        if let Some((id, end)) = self.direct {
            let p = self.partial.get_mut(&id).expect("a direct read has its message");
            let left = end - p.received();
            debug_assert!(left > 0, "next_frame ends a direct read once it is complete");
            if let Some(l) = &mut p.landed {
                // Not the receive's own read: into a piece, the current one if it ends
                // where this read begins and has room for the rest of the fragment.
                let fits =
                    matches!(&l.cur, Some((at, b)) if at + b.len() == l.received && b.capacity() - b.len() >= left);
                if !fits {
                    l.flush();
                    l.cur = Some((l.received, pool::take(left)));
                }
                let (_, cur) = l.cur.as_mut().expect("set above");
                return (std::mem::take(&mut **cur), left);
            }
            p.data.reserve(left);
            return (std::mem::take(&mut *p.data), left);
        }
        if self.header_alone && self.after_direct && self.buf.len() < HEADER_LEN {
            // Large fragments come in runs (a collective's pieces, a window of large
            // sends): after one, read the next header alone, so that a large
            // fragment's bytes go straight into its message and no 64 KiB of them
            // is read here and copied over. A small frame after a large one costs
            // a read more.
            let limit = HEADER_LEN - self.buf.len();
            self.buf.reserve(limit);
            return (std::mem::take(&mut self.buf), limit);
        }
        let need = if self.ring && self.buf.first() == Some(&SHORT_MAGIC) {
            SHORT_LEN + SHORT_MAX
        } else if self.ring && self.buf.first() == Some(&BOX_MAGIC) {
            box_len(BOX_MAX)
        } else if self.buf.len() < HEADER_LEN {
            HEADER_LEN
        } else {
            match Header::decode(&self.buf) {
                Ok(h) if (h.frag_len as usize) < DIRECT_MIN => HEADER_LEN + h.frag_len as usize,
                _ => HEADER_LEN,
            }
        };
        let want = need.saturating_sub(self.buf.len()).max(READ_CHUNK);
        self.buf.reserve(want);
        (std::mem::take(&mut self.buf), usize::MAX)
    }

    /// Takes back the buffer [`read_target`](Self::read_target) handed out, with the
    /// bytes read appended.
    pub fn filled(&mut self, buf: BytesMut) {
        match self.direct {
            Some((id, _)) => {
                let p = self.partial.get_mut(&id).expect("a direct read has its message");
                match &mut p.landed {
                    Some(l) => {
                        let (at, cur) = l.cur.as_mut().expect("read_target gave out a piece");
                        **cur = buf;
                        l.received = *at + cur.len();
                    }
                    None => *p.data = buf,
                }
            }
            None => self.buf = buf,
        }
    }

    /// Where the receive that offered `landing` reads next, straight into its buffer:
    /// (offset, length) of the rest of the fragment being read, if that fragment is
    /// of its message.
    pub fn owner_target(&self, landing: &Landing) -> Option<(usize, usize)> {
        let (id, end) = self.direct?;
        let l = self.partial.get(&id)?.landed.as_ref()?;
        std::ptr::eq(Arc::as_ptr(&l.landing), landing).then(|| (l.received, end - l.received))
    }

    /// The receive read `n` bytes at [`owner_target`](Self::owner_target) into its
    /// buffer.
    pub fn owner_filled(&mut self, n: usize) {
        let (id, _) = self.direct.expect("owner_filled follows owner_target");
        let l = self.partial.get_mut(&id).and_then(|p| p.landed.as_mut()).expect("a landed message");
        l.received += n;
    }

    /// Whether the bytes next in the stream are the rest of a large fragment (read
    /// straight into its message), not frame headers or small frames.
    pub fn in_body(&self) -> bool {
        self.direct.is_some()
    }

    /// The message whose fragment's body comes next in the stream, if it could land
    /// and does not (no receive with a buffer of its length waited when its first
    /// header came).
    fn unlanded(&self) -> Option<(u64, &Partial)> {
        let (id, _) = self.direct?;
        let p = self.partial.get(&id)?;
        let could = self.mailbox.is_some() && p.landed.is_none() && landable(&p.header, self.land_min);
        could.then_some((id, p))
    }

    /// Lands the rest of the message whose body comes next in the stream, if it
    /// could land, did not, and its receive now waits with a buffer of its length
    /// (posted after its first header came): what arrived of it so far becomes a
    /// piece the receive copies in, the rest goes into the receive's buffer.
    /// No other message with its key is partly received (the sender's
    /// [`WriteQueue`] starts none while one is being sent), so the receive is this
    /// message's.
    pub fn claim_late(&mut self) {
        let Some((id, p)) = self.unlanded() else { return };
        let Some(m) = self.mailbox.as_deref() else { return };
        let Some(landing) = claim_landing(m, self.land_min, &p.header) else { return };
        let p = self.partial.get_mut(&id).expect("unlanded found it");
        let data = std::mem::replace(&mut p.data, pool::take(0));
        let received = data.len();
        let pieces = match received {
            0 => Vec::new(),
            _ => vec![(0, data.freeze())],
        };
        p.landed = Some(Landed { landing, received, pieces, cur: None });
    }

    /// Whether the message whose body comes next could land, does not, its first
    /// header came less than `patience(its length)` ago, and no receive waits for it
    /// (one that does waits without a buffer of its length, and is served as usual):
    /// its receive may yet be posted ([`claim_late`](Self::claim_late)).
    pub fn awaits_receive(&self, patience: impl FnOnce(u64) -> std::time::Duration) -> bool {
        let Some((_, p)) = self.unlanded() else { return false };
        let Some(m) = self.mailbox.as_deref() else { return false };
        p.opened.elapsed() < patience(p.header.msg_len) && !m.awaited(&hcomm_core::MatchKey::of(&p.header))
    }

    /// The landing whose message the fragment being read belongs to, if it lands.
    pub fn landed_target(&self) -> Option<&Arc<Landing>> {
        let (id, _) = self.direct?;
        Some(&self.partial.get(&id)?.landed.as_ref()?.landing)
    }

    /// Fails the receives whose messages were landing (the link ended).
    pub fn fail_landed(&mut self, err: &Error) {
        for p in self.partial.values_mut() {
            if let Some(l) = p.landed.take() {
                l.landing.fail(err.clone());
            }
        }
    }

    /// Completes message `id` if it landed whole (`true`: it was a landed message,
    /// whole or not).
    fn complete_landed(&mut self, id: u64) -> bool {
        let p = &self.partial[&id];
        let Some(l) = &p.landed else { return false };
        if l.received as u64 == p.header.msg_len {
            let p = self.partial.remove(&id).expect("present");
            let mut l = p.landed.expect("checked");
            l.flush();
            if let Some(s) = &self.landed {
                use std::sync::atomic::Ordering::Relaxed;
                let pieces: usize = l.pieces.iter().map(|(_, b)| b.len()).sum();
                s.messages.fetch_add(1, Relaxed);
                s.piece_bytes.fetch_add(pieces as u64, Relaxed);
                s.own_bytes.fetch_add((l.received - pieces) as u64, Relaxed);
            }
            l.landing.complete(p.header, l.pieces);
        }
        true
    }

    /// Whether no message is partly received: no bytes of a frame held, none of a
    /// fragmented message.
    pub fn at_rest(&self) -> bool {
        self.idle() && self.partial.is_empty()
    }

    /// Whether the parser holds no bytes of a frame (a message may be partly received:
    /// fragments of other messages may come first), so that what follows in the stream
    /// may be parsed elsewhere.
    pub fn idle(&self) -> bool {
        self.buf.is_empty() && self.direct.is_none()
    }

    /// Bytes received and not yet parsed (those of a fragment read straight into its
    /// message not counted).
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// Messages begun and not yet complete.
    pub fn open_messages(&self) -> usize {
        self.partial.len()
    }

    /// The message `h` is a fragment of, opened if `h` starts it; checks that `h`
    /// continues it.
    fn message_of<'a>(
        partial: &'a mut HashMap<u64, Partial>,
        h: &Header,
        mailbox: Option<(&hcomm_core::Mailbox, usize)>,
    ) -> Result<&'a mut Partial> {
        let open = partial.len();
        match partial.entry(h.msg_id) {
            Entry::Vacant(v) => {
                if h.offset != 0 {
                    return Err(protocol(format!("message {} starts at offset {}", h.msg_id, h.offset)));
                }
                if open >= MAX_PARTIAL {
                    return Err(protocol(format!("more than {MAX_PARTIAL} partial messages open")));
                }
                // A data message large enough, whose receive waits with a buffer of
                // its length: it lands there.
                let landing = mailbox.and_then(|(m, min)| claim_landing(m, min, h));
                if let Some(landing) = landing {
                    let landed = Landed { landing, received: 0, pieces: Vec::new(), cur: None };
                    let opened = std::time::Instant::now();
                    return Ok(v.insert(Partial { header: *h, opened, data: pool::take(0), landed: Some(landed) }));
                }
                let data = pool::take(h.msg_len.min(MAX_PREALLOC) as usize);
                Ok(v.insert(Partial { header: *h, opened: std::time::Instant::now(), data, landed: None }))
            }
            Entry::Occupied(o) => {
                let p = o.into_mut();
                if p.header.msg_len != h.msg_len || p.received() as u64 != h.offset || !same_key(&p.header, h) {
                    return Err(protocol(format!(
                        "fragment {}+{} of message {} does not continue it ({} of {} bytes received)",
                        h.offset,
                        h.frag_len,
                        h.msg_id,
                        p.received(),
                        p.header.msg_len
                    )));
                }
                Ok(p)
            }
        }
    }

    /// The message `id`, removed if it is complete.
    fn take_if_whole(&mut self, id: u64) -> Option<Frame> {
        let p = &self.partial[&id];
        if p.data.len() as u64 != p.header.msg_len {
            return None;
        }
        let p = self.partial.remove(&id).expect("present");
        Some(Frame::new(p.header, p.data.freeze()))
    }

    /// The next complete message in the bytes received so far.
    ///
    /// # Errors
    /// A protocol error for anything that breaks the framing rules; the connection
    /// cannot be trusted after it.
    pub fn next_frame(&mut self) -> Result<Option<Frame>> {
        if let Some((id, end)) = self.direct {
            if self.partial[&id].received() < end {
                return Ok(None);
            }
            self.direct = None;
            if !self.complete_landed(id)
                && let Some(f) = self.take_if_whole(id)
            {
                return Ok(Some(f));
            }
        }
        loop {
            if self.ring {
                if let Some(f) = self.short_frame()? {
                    return Ok(Some(f));
                }
                if matches!(self.buf.first(), Some(&SHORT_MAGIC | &BOX_MAGIC)) {
                    // Not whole yet.
                    return Ok(None);
                }
            }
            if self.buf.len() < HEADER_LEN {
                return Ok(None);
            }
            let h = Header::decode(&self.buf).map_err(|e: WireError| protocol(e.to_string()))?;
            if h.src != self.peer {
                return Err(protocol(format!(
                    "frame claims source rank {} on the connection of rank {}",
                    h.src, self.peer
                )));
            }
            let n = h.frag_len as usize;
            let arrived = self.buf.len() >= HEADER_LEN + n;
            if n < DIRECT_MIN {
                self.after_direct = false;
                if !arrived {
                    return Ok(None);
                }
            }
            if arrived && h.offset == 0 && u64::from(h.frag_len) == h.msg_len {
                // A whole message in the read buffer: split off, no copy.
                self.buf.advance(HEADER_LEN);
                return Ok(Some(Frame::new(h, self.buf.split_to(n).freeze())));
            }
            let p = Self::message_of(&mut self.partial, &h, self.mailbox.as_deref().map(|m| (m, self.land_min)))?;
            // Validated: consume the header and what arrived of the fragment.
            let here = n.min(self.buf.len() - HEADER_LEN);
            let end = match &mut p.landed {
                Some(l) => {
                    self.buf.advance(HEADER_LEN);
                    if here > 0 {
                        l.pieces.push((l.received, self.buf.split_to(here).freeze()));
                        l.received += here;
                    }
                    l.received + (n - here)
                }
                None => {
                    p.data.extend_from_slice(&self.buf[HEADER_LEN..HEADER_LEN + here]);
                    self.buf.advance(HEADER_LEN + here);
                    p.data.len() + (n - here)
                }
            };
            if here < n {
                // The rest is read straight into the message (or its receive's buffer).
                self.direct = Some((h.msg_id, end));
                self.after_direct = true;
                return Ok(None);
            }
            if !self.complete_landed(h.msg_id)
                && let Some(f) = self.take_if_whole(h.msg_id)
            {
                return Ok(Some(f));
            }
        }
    }
}

/// Feeds `bytes` to `a` as reads would, respecting its read limits, and collects the
/// messages that come out.
///
/// # Errors
/// The first protocol error.
pub(crate) fn push(a: &mut Assembler, mut bytes: &[u8], out: &mut Vec<Frame>) -> Result<()> {
    while let Some(f) = a.next_frame()? {
        out.push(f);
    }
    while !bytes.is_empty() {
        let (mut b, limit) = a.read_target();
        let k = bytes.len().min(limit);
        b.extend_from_slice(&bytes[..k]);
        a.filled(b);
        bytes = &bytes[k..];
        while let Some(f) = a.next_frame()? {
            out.push(f);
        }
    }
    Ok(())
}

/// First byte of a box: a data message of at most [`BOX_MAX`] bytes on whole cache
/// lines of a shared-memory ring, stamped in the last 8 bytes of its first line (see
/// the shared-memory transport's `Ring::push_box`). The first line holds the short
/// header (its magic byte replaced by this one), the payload's first
/// [`BOX_FIRST`] bytes, then the stamp; the rest of the payload follows on the next
/// lines, whose last one is padded to its end.
pub(crate) const BOX_MAGIC: u8 = 0xB6;
/// A cache line, the unit of a box.
pub(crate) const BOX_LINE: usize = 64;
/// The payload bytes on a box's first line.
pub(crate) const BOX_FIRST: usize = BOX_LINE - SHORT_LEN - 8;
/// The most payload a box holds: a short frame's.
pub(crate) const BOX_MAX: usize = SHORT_MAX;

/// The bytes a box of `payload` bytes takes in the ring: whole lines.
pub(crate) fn box_len(payload: usize) -> usize {
    BOX_LINE + payload.saturating_sub(BOX_FIRST).next_multiple_of(BOX_LINE)
}

/// The header of the box whose first line starts `first` (at least [`SHORT_LEN`]
/// bytes) from rank `peer`, checked.
pub(crate) fn box_header(first: &[u8], peer: usize) -> Result<Header> {
    let mut head = [0u8; SHORT_LEN];
    head.copy_from_slice(&first[..SHORT_LEN]);
    if head[0] != BOX_MAGIC {
        return Err(protocol(format!("a box starting with {:#04x}", head[0])));
    }
    head[0] = SHORT_MAGIC;
    let h = Header::decode_short(&head, peer as u32).map_err(|e| protocol(e.to_string()))?;
    if h.frag_len as usize > BOX_MAX {
        return Err(protocol(format!("a box of {} bytes of payload", h.frag_len)));
    }
    Ok(h)
}

/// The payload of the box with header `h`: from `first` (the first line's
/// [`BOX_FIRST`] payload bytes) and `rest` (the lines after it, at least the rest of
/// the payload).
pub(crate) fn box_payload(h: &Header, first: &[u8], rest: &[u8]) -> Bytes {
    let len = h.frag_len as usize;
    let head = len.min(BOX_FIRST);
    if len <= BOX_FIRST {
        return Bytes::copy_from_slice(&first[..head]);
    }
    let mut b = BytesMut::with_capacity(len);
    b.extend_from_slice(&first[..head]);
    b.extend_from_slice(&rest[..len - head]);
    b.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;
    use hcomm_core::{OpKind, Signature};
    use proptest::prelude::*;

    fn msg(tag: u32, len: usize, fill: u8) -> Outgoing {
        let h = Header::data(1, 0, 0, tag, &Signature::bare(OpKind::Send, len as u64), len);
        Outgoing::new(h, Bytes::from(vec![fill; len]), None)
    }

    /// The bytes a queue writes for `msgs`.
    fn encode(msgs: Vec<Outgoing>, fragment: usize) -> Vec<u8> {
        let mut q = WriteQueue::new(fragment);
        msgs.into_iter().for_each(|m| q.push(m));
        let mut wire = Vec::new();
        let mut batch = BytesMut::new();
        while !q.is_idle() {
            let big = q.fill(&mut batch);
            wire.extend_from_slice(&batch);
            batch.clear();
            if let Some(b) = big {
                wire.extend_from_slice(&b);
            }
            q.written();
        }
        wire
    }

    /// Runs messages through a queue and an assembler, returning (tag, payload) in
    /// delivery order.
    fn pump(msgs: Vec<Outgoing>, fragment: usize, read_size: usize) -> Vec<(u32, Vec<u8>)> {
        let wire = encode(msgs, fragment);
        let mut a = Assembler::new(1);
        let mut out = Vec::new();
        for piece in wire.chunks(read_size.max(1)) {
            push(&mut a, piece, &mut out).unwrap();
        }
        out.into_iter().map(|f| (f.header.tag, f.payload.to_vec())).collect()
    }

    #[test]
    fn small_and_large_interleave_but_same_key_keeps_order() {
        let out = pump(vec![msg(1, 100_000, 1), msg(1, 10, 2), msg(2, 10, 3), msg(3, 0, 4)], 4096, 1000);
        let tags: Vec<u32> = out.iter().map(|o| o.0).collect();
        // Tag 2 and 3 overtake the large message; the second tag-1 message does not.
        assert_eq!(tags, vec![2, 3, 1, 1]);
        assert_eq!(out[2].1, vec![1; 100_000]);
        assert_eq!(out[3].1, vec![2; 10]);
        assert!(out[1].1.is_empty());
    }

    /// After a fragment read straight into its message, the next read takes a header
    /// alone, so that a large fragment after it goes whole into its message; after a
    /// small frame, reads take 64 KiB again. The messages come out whole either way.
    #[test]
    fn after_a_large_fragment_the_next_header_is_read_alone() {
        let wire = encode(vec![msg(1, 100_000, 1), msg(2, 100_000, 2), msg(3, 10, 3), msg(4, 10, 4)], 1 << 20);
        let reads = |mut a: Assembler| {
            let (mut out, mut limits, mut rest) = (Vec::new(), Vec::new(), &wire[..]);
            while !rest.is_empty() {
                let (mut b, limit) = a.read_target();
                // A read returns what the socket holds, up to the limit.
                let k = rest.len().min(limit).min(b.capacity() - b.len());
                limits.push(limit);
                b.extend_from_slice(&rest[..k]);
                a.filled(b);
                rest = &rest[k..];
                while let Some(f) = a.next_frame().unwrap() {
                    out.push((f.header.tag, f.payload.len()));
                }
            }
            assert_eq!(out, vec![(1, 100_000), (2, 100_000), (3, 10), (4, 10)]);
            limits
        };
        // Off (the default, and on a shared-memory ring): 64 KiB reads after a large one.
        assert!(reads(Assembler::new(1))[2] > HEADER_LEN);
        assert!(reads(Assembler::for_ring(1).header_alone(true))[2] > HEADER_LEN);
        let limits = reads(Assembler::new(1).header_alone(true));
        // The first read is 64 KiB or more (header and the start of message 1), then
        // message 1's rest straight in, then message 2's header alone, its payload
        // whole, then message 3's header alone, and 64 KiB or more again.
        assert!(limits[0] > HEADER_LEN, "{limits:?}");
        assert_eq!(limits[1], 100_000 - (limits[0].min(READ_CHUNK) - HEADER_LEN), "{limits:?}");
        assert_eq!(&limits[2..5], &[HEADER_LEN, 100_000, HEADER_LEN], "{limits:?}");
        assert!(limits[5] > HEADER_LEN, "{limits:?}");
    }

    /// A frame whose start a sending task wrote itself (as a direct write taken in
    /// part): its rest, queued before messages queued later, goes out first and
    /// whole, whatever its size, and the stream parses as if one writer wrote it all.
    #[test]
    fn the_rest_of_a_direct_write_goes_first() {
        let cuts = [(10, 3), (10, HEADER_LEN + 4), (100_000, HEADER_LEN + 20_000), (0, 1), (100_000, 7)];
        for (len, cut) in cuts {
            let mut h = Header::data(1, 0, 0, 7, &Signature::bare(OpKind::Send, len as u64), len);
            (h.msg_id, h.msg_len, h.offset, h.frag_len) = (u64::MAX, len as u64, 0, len as u32);
            let payload: Vec<u8> = (0..len).map(|i| i as u8).collect();
            let whole = [&h.encode()[..], &payload].concat();
            let (sent, rest) = whole.split_at(cut);
            let (tx, mut rx) = oneshot::channel();
            let rest = Outgoing::rest(h, Bytes::copy_from_slice(rest), Some(tx));
            // Queued after the rest: a large message and a small one.
            let wire = encode(vec![rest, msg(8, 70_000, 5), msg(9, 3, 6)], 4096);
            let mut a = Assembler::new(1);
            let mut out = Vec::new();
            push(&mut a, &[sent, &wire].concat(), &mut out).unwrap();
            let got: Vec<(u32, Vec<u8>)> = out.into_iter().map(|f| (f.header.tag, f.payload.to_vec())).collect();
            assert_eq!(got, vec![(7, payload), (9, vec![6; 3]), (8, vec![5; 70_000])], "{len} B cut at {cut}");
            assert!(matches!(rx.try_recv(), Ok(Ok(()))), "the rest's sender learns it was written");
        }
    }

    #[test]
    fn rejects_spoofed_source_and_out_of_order_fragments() {
        let mut a = Assembler::new(2);
        let h = Header::data(1, 0, 0, 0, &Signature::bare(OpKind::Send, 0), 0);
        assert!(push(&mut a, &h.encode(), &mut Vec::new()).unwrap_err().is_protocol());

        let mut a = Assembler::new(1);
        let mut h = Header::data(1, 0, 0, 0, &Signature::bare(OpKind::Send, 0), 10);
        h.offset = 5;
        h.frag_len = 5;
        let mut wire = h.encode().to_vec();
        wire.extend_from_slice(&[0; 5]);
        assert!(push(&mut a, &wire, &mut Vec::new()).unwrap_err().is_protocol());
    }

    /// What a shared-memory ring carries for `msgs` (`(short, len)`): whole frames as
    /// the writer task writes them, or short frames (or boxes) as a sending task
    /// writes them, with `pads[i]` bytes of padding before each.
    fn ring_stream(msgs: &[(bool, usize)], pads: &[usize]) -> Vec<u8> {
        let mut wire = Vec::new();
        for (i, &(short, len)) in msgs.iter().enumerate() {
            wire.extend(std::iter::repeat_n(PAD, pads[i % pads.len().max(1)] % 64));
            let m = msg(5, len, i as u8);
            let mut h = m.header;
            h.frag_len = len as u32;
            h.msg_id = u64::MAX;
            match h.encode_short().filter(|_| short) {
                // Every other small one as a box, with a stamp the parser
                // does not read.
                Some(mut b) if len <= BOX_MAX && i % 2 == 0 => {
                    b[0] = BOX_MAGIC;
                    let at = wire.len();
                    let head = len.min(BOX_FIRST);
                    wire.extend_from_slice(&b);
                    wire.extend_from_slice(&m.payload[..head]);
                    wire.resize(at + BOX_LINE - 8, 0);
                    wire.extend_from_slice(&(i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15).to_le_bytes());
                    wire.extend_from_slice(&m.payload[head..]);
                    // The last line's padding: whatever the ring held.
                    wire.resize(at + box_len(len), 0xEE);
                }
                Some(b) => {
                    wire.extend_from_slice(&b);
                    wire.extend_from_slice(&m.payload);
                }
                None => wire.extend(encode(vec![m], 1 << 20)),
            }
        }
        wire
    }

    proptest! {
        /// A ring's mix of short and whole frames and padding, read in any pieces,
        /// gives every message whole and in order.
        #[test]
        fn ring_streams_with_short_frames_reassemble(
            msgs in proptest::collection::vec((any::<bool>(), prop_oneof![0usize..=BOX_FIRST, 0usize..300, 0usize..5000, 0usize..70_000]), 1..20),
            pads in proptest::collection::vec(0usize..64, 1..8),
            read_size in 1usize..9000,
        ) {
            let wire = ring_stream(&msgs, &pads);
            let mut a = Assembler::for_ring(1);
            let mut out = Vec::new();
            for piece in wire.chunks(read_size) {
                push(&mut a, piece, &mut out).unwrap();
            }
            prop_assert_eq!(out.len(), msgs.len());
            for (i, (f, &(_, len))) in out.iter().zip(&msgs).enumerate() {
                prop_assert_eq!(f.header.tag, 5);
                prop_assert_eq!(f.header.src, 1);
                prop_assert_eq!(&f.payload[..], &vec![i as u8; len][..]);
            }
        }

        /// The same stream with damage: the parser never panics, and what it returns
        /// before a protocol error is whole.
        #[test]
        fn mutated_ring_streams_are_refused_or_whole(
            msgs in proptest::collection::vec((any::<bool>(), prop_oneof![0usize..=BOX_FIRST, 0usize..300]), 1..8),
            pads in proptest::collection::vec(0usize..64, 1..4),
            flips in proptest::collection::vec((any::<proptest::sample::Index>(), 1u8..=255), 1..4),
        ) {
            let mut wire = ring_stream(&msgs, &pads);
            for (at, x) in &flips {
                let i = at.index(wire.len());
                wire[i] ^= x;
            }
            let mut a = Assembler::for_ring(1);
            let mut out = Vec::new();
            match push(&mut a, &wire, &mut out) {
                Ok(()) => prop_assert!(out.len() <= msgs.len() + 8),
                Err(e) => prop_assert!(e.is_protocol(), "{e}"),
            }
            for f in &out {
                prop_assert_eq!(f.payload.len() as u64, f.header.msg_len);
            }
        }

        #[test]
        fn any_split_reassembles(
            lens in proptest::collection::vec(0usize..150_000, 1..12),
            fragment in 1usize..100_000,
            read_size in 1usize..70_000,
        ) {
            let msgs = lens.iter().enumerate().map(|(i, &l)| msg(i as u32, l, i as u8)).collect();
            let mut out = pump(msgs, fragment, read_size);
            out.sort_by_key(|o| o.0);
            prop_assert_eq!(out.len(), lens.len());
            for (i, (tag, data)) in out.into_iter().enumerate() {
                prop_assert_eq!(tag as usize, i);
                prop_assert_eq!(data, vec![i as u8; lens[i]]);
            }
        }

        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..4096)) {
            let mut a = Assembler::new(0);
            let _ = push(&mut a, &bytes, &mut Vec::new());
        }

        /// A valid stream of interleaved fragments, then mutated: bytes flipped, a
        /// stretch cut out, a stretch repeated. The parser returns the messages before
        /// the damage and then either more whole messages or a protocol error; it never
        /// panics, never returns a message of the wrong length, and stays bounded.
        #[test]
        fn mutated_frames_are_refused_or_whole(
            lens in proptest::collection::vec(0usize..3000, 1..6),
            fragment in 1usize..700,
            flips in proptest::collection::vec((any::<proptest::sample::Index>(), 1u8..=255), 0..4),
            cut in proptest::option::of((any::<proptest::sample::Index>(), 1usize..200)),
            repeat in proptest::option::of((any::<proptest::sample::Index>(), 1usize..200)),
            reads in proptest::collection::vec(1usize..500, 0..8),
        ) {
            let msgs = lens.iter().enumerate().map(|(i, &l)| msg(i as u32, l, i as u8)).collect();
            let mut wire = encode(msgs, fragment);
            for (at, x) in &flips {
                let i = at.index(wire.len());
                wire[i] ^= x;
            }
            if let Some((at, n)) = cut {
                let i = at.index(wire.len());
                wire.drain(i..(i + n).min(wire.len()));
            }
            if let (Some((at, n)), false) = (repeat, wire.is_empty()) {
                let i = at.index(wire.len());
                let piece: Vec<u8> = wire[i..(i + n).min(wire.len())].to_vec();
                wire.splice(i..i, piece);
            }
            match crate::fuzzing::feed(1, &wire, &reads) {
                // A repeated stretch of under 200 bytes holds at most two whole frames.
                Ok(n) => prop_assert!(n <= lens.len() + 2),
                Err(e) => prop_assert!(e.is_protocol(), "{e}"),
            }
        }
    }
}
