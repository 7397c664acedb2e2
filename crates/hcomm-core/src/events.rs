//! The `tracing` events every operation and message emits: one schema that every
//! sink reads (`HCOMM_STATS` builds its statistics from them; a log subscriber
//! prints them). With no subscriber interested, an event costs a relaxed atomic load.
//!
//! - target [`OP_TARGET`], level DEBUG, one per finished operation: `rank` (world
//!   rank), `op` (kind name), `seq` (collective sequence number, 0 for point to
//!   point), `algo`, `bytes` (the call's size: elements × element size; for the
//!   v-variants and point to point, the bytes this rank sent and received),
//!   `elapsed_ns`, `peer` (point to point, else -1), `ok`.
//! - target [`MSG_TARGET`], level TRACE, one per message an operation sends or
//!   receives: `rank`, `peer` (world ranks), `op`, `send` (true for sent, false for
//!   received), `bytes`, `wait_ns` (for a receive, from posting it to the data's
//!   arrival; 0 for a send).
//! - target [`BUF_TARGET`], level DEBUG, once per transport with registered memory
//!   (RDMA) when it closes: `rank`, `transport`, and counters as `u64` fields
//!   (`eager_sent`, `rendezvous_sent`, `zero_copy_sent`, `copied_bytes`,
//!   `registered_peak`, `pooled`, `registrations`).

use std::time::{Duration, Instant};

use crate::OpKind;

/// The start of something an event will report the duration of: the clock is read
/// only when a subscriber listens to operation or message events, so that an
/// operation with statistics off reads no clock for them (a clock read costs tens of
/// nanoseconds on a virtual machine, a share of a small message's path).
#[derive(Debug, Clone, Copy)]
pub struct Stopwatch(Option<Instant>);

impl Stopwatch {
    /// Starts now if anyone listens.
    #[inline]
    pub fn start() -> Stopwatch {
        // `event_enabled!`: a filter that passes events alone (the statistics' does)
        // refuses the bare hint `enabled!` asks with, and this stopwatch never started.
        let listening = op_listened() || tracing::event_enabled!(target: MSG_TARGET, tracing::Level::TRACE);
        Stopwatch(listening.then(Instant::now))
    }

    /// Time since the start (zero if no one listened then).
    #[inline]
    pub fn elapsed(&self) -> Duration {
        self.0.map_or(Duration::ZERO, |t| t.elapsed())
    }
}

/// Target of the per-operation events.
pub const OP_TARGET: &str = "hcomm::op";
/// Target of the per-message events.
pub const MSG_TARGET: &str = "hcomm::msg";
/// Target of the registered-memory report of a closing transport.
pub const BUF_TARGET: &str = "hcomm::buffers";

/// What a transport with registered memory did with it, reported when it closes.
#[derive(Debug, Clone, Copy, Default)]
pub struct BufferUse {
    pub eager_sent: u64,
    pub rendezvous_sent: u64,
    pub zero_copy_sent: u64,
    pub copied_bytes: u64,
    pub registered_peak: u64,
    pub pooled: u64,
    pub registrations: u64,
}

/// Emits the registered-memory report of `rank`'s closing `transport`.
pub fn buffers(rank: u32, transport: &str, b: BufferUse) {
    tracing::debug!(
        target: BUF_TARGET,
        rank,
        transport,
        eager_sent = b.eager_sent,
        rendezvous_sent = b.rendezvous_sent,
        zero_copy_sent = b.zero_copy_sent,
        copied_bytes = b.copied_bytes,
        registered_peak = b.registered_peak,
        pooled = b.pooled,
        registrations = b.registrations,
    );
}

/// What one finished operation reports.
#[derive(Debug, Clone, Copy)]
pub struct OpDone<'a> {
    pub rank: u32,
    pub op: OpKind,
    pub seq: u64,
    pub algo: &'a str,
    pub bytes: u64,
    pub elapsed: Duration,
    pub peer: Option<u32>,
    pub ok: bool,
}

/// Whether anyone listens to the per-operation events (so that callers read the
/// clock only then).
#[inline]
pub fn op_listened() -> bool {
    tracing::event_enabled!(target: OP_TARGET, tracing::Level::DEBUG)
}

/// Emits the event of a finished operation.
#[inline]
pub fn op_done(d: OpDone<'_>) {
    tracing::debug!(
        target: OP_TARGET,
        rank = d.rank,
        op = d.op.name(),
        seq = d.seq,
        algo = d.algo,
        bytes = d.bytes,
        elapsed_ns = d.elapsed.as_nanos() as u64,
        peer = d.peer.map_or(-1, i64::from),
        ok = d.ok,
    );
}

/// Emits the event of one message sent (`send`) or received.
#[inline]
pub fn message(rank: u32, peer: u32, op: OpKind, send: bool, bytes: u64, wait: Duration) {
    tracing::trace!(
        target: MSG_TARGET,
        rank,
        peer,
        op = op.name(),
        send,
        bytes,
        wait_ns = wait.as_nanos() as u64
    );
}
