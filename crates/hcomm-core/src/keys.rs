//! The parts of a message's match key ([`crate::mailbox::MatchKey`]) the library
//! reserves: sequence numbers and tags, declared in one place so that no two uses
//! share a key. A test checks that the ranges do not overlap.
//!
//! Sequence numbers: point-to-point messages use [`P2P_SEQ`]; collectives number
//! their operations from [`FIRST_OP_SEQ`]; the top three values are the library's
//! own frames.
//!
//! Tags: point-to-point tags from [`RESERVED_TAGS`] up are the library's. Within one
//! collective operation (its own sequence number) a tag is a [`Phase`] in the top
//! bits, then a step and a column ([`op_tag`]); every algorithm's messages are in the
//! phase it runs, so that algorithms composed in one operation (a reduce-scatter
//! followed by an allgather, the folding of extra ranks around a power-of-two core,
//! the argument agreement beside the data) never share a tag.

use crate::Tag;

/// The sequence number of point-to-point messages.
pub const P2P_SEQ: u64 = 0;

/// The first sequence number of a collective operation; a group numbers them from
/// here, one per operation, up to [`LAST_OP_SEQ`].
pub const FIRST_OP_SEQ: u64 = 1;

/// The last sequence number a collective operation may have.
pub const LAST_OP_SEQ: u64 = ADAPT_SEQ - 1;

/// The sequence number of the frames that carry the adaptive selection's timings
/// between ranks (crate `hcomm-collectives`, module `adapt`), tagged with the
/// number of the agreement they belong to.
pub const ADAPT_SEQ: u64 = u64::MAX - 2;

/// The sequence number of *signature record frames*: data frames whose payload is a
/// run of [`RECORD_LEN`](crate::wire::RECORD_LEN)-byte records, each an operation's
/// sequence number and signature ([`encode_record`](crate::wire::encode_record)).
/// The deferred argument checks of the collectives send them. A transport that holds
/// small frames back ([`post_lazy`](crate::LocalTransport::post_lazy)) may merge two
/// such frames with the same key into one, their payloads concatenated in order: the
/// receiver reads the records, not the frames.
pub const RECORDS_SEQ: u64 = u64::MAX - 1;

/// The sequence number an abort frame carries when it aborts the whole communicator.
pub const COMM_ABORT_SEQ: u64 = u64::MAX;

/// Point-to-point tags from this value up are used by the library itself
/// (calibration round trips); applications use tags below it.
pub const RESERVED_TAGS: Tag = 0xFFFF_FF00;

/// The part of a collective operation a message belongs to: the top bits of its tag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// The algorithm's own steps.
    Steps,
    /// The allgather that follows a reduce-scatter (or a scatter) in one operation.
    Allgather,
    /// Extra ranks handing their data to a partner in the power-of-two core.
    Fold,
    /// The core handing the result back to the extra ranks.
    Unfold,
    /// Stage `k` (from 0) of the hierarchical allreduce, on its way down (`false`)
    /// or up (`true`).
    Hier(u8, bool),
    /// The rounds of a synchronous argument agreement, beside the data.
    Agree,
}

/// Bits of a tag below the phase.
const PHASE_SHIFT: u32 = 26;

/// Bits of a tag below the step.
const STEP_SHIFT: u32 = 8;

/// Steps per phase: `2^18`, enough for a ring of `2^17` ranks.
pub const MAX_STEPS: u32 = 1 << (PHASE_SHIFT - STEP_SHIFT);

/// The most ranks a communicator may have: a ring allreduce takes `2(n - 1)` steps.
pub const MAX_RANKS: usize = (MAX_STEPS / 2) as usize;

/// Columns per step (the pipelined pieces of a ring).
pub const MAX_COLUMNS: u32 = 1 << STEP_SHIFT;

/// Hierarchical stages a tag can tell apart.
pub const MAX_HIER_STAGES: u8 = 29;

impl Phase {
    /// The phase's number, the top bits of its tags.
    const fn code(self) -> u32 {
        match self {
            Phase::Steps => 0,
            Phase::Allgather => 1,
            Phase::Fold => 2,
            Phase::Unfold => 3,
            Phase::Hier(k, up) => 4 + 2 * k as u32 + up as u32,
            Phase::Agree => 63,
        }
    }
}

/// The tag of step `step`, column `column`, of `phase` in a collective operation.
///
/// # Panics
/// If `step` is [`MAX_STEPS`] or more, `column` [`MAX_COLUMNS`] or more, or a
/// hierarchical stage [`MAX_HIER_STAGES`] or more: the algorithms keep within these
/// for communicators of at most [`MAX_RANKS`] ranks, and larger ones are refused
/// when they are made.
pub const fn op_tag(phase: Phase, step: u32, column: u32) -> Tag {
    assert!(step < MAX_STEPS && column < MAX_COLUMNS, "a collective's step or column out of its tag's range");
    if let Phase::Hier(k, _) = phase {
        assert!(k < MAX_HIER_STAGES, "a hierarchical stage out of its tag's range");
    }
    (phase.code() << PHASE_SHIFT) | (step << STEP_SHIFT) | column
}

/// The tag of step `step` of `phase`, with no columns.
pub const fn step_tag(phase: Phase, step: u32) -> Tag {
    op_tag(phase, step, 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn phases() -> Vec<Phase> {
        let mut p = vec![Phase::Steps, Phase::Allgather, Phase::Fold, Phase::Unfold, Phase::Agree];
        for k in 0..MAX_HIER_STAGES {
            p.push(Phase::Hier(k, false));
            p.push(Phase::Hier(k, true));
        }
        p
    }

    #[test]
    fn sequence_ranges_do_not_overlap() {
        let ranges = [
            (P2P_SEQ, P2P_SEQ),
            (FIRST_OP_SEQ, LAST_OP_SEQ),
            (ADAPT_SEQ, ADAPT_SEQ),
            (RECORDS_SEQ, RECORDS_SEQ),
            (COMM_ABORT_SEQ, COMM_ABORT_SEQ),
        ];
        for w in ranges.windows(2) {
            assert!(w[0].0 <= w[0].1 && w[0].1 < w[1].0, "{:?} and {:?} overlap", w[0], w[1]);
        }
        assert_eq!(ranges.last().unwrap().1, u64::MAX);
    }

    #[test]
    fn phases_own_disjoint_tag_ranges() {
        // Each phase's tags, from its smallest to its largest, lie in a range no
        // other phase's tags reach.
        let mut ranges: Vec<(Tag, Tag, Phase)> =
            phases().into_iter().map(|p| (op_tag(p, 0, 0), op_tag(p, MAX_STEPS - 1, MAX_COLUMNS - 1), p)).collect();
        ranges.sort_by_key(|r| (r.0, r.1));
        for w in ranges.windows(2) {
            assert!(w[0].1 < w[1].0, "{:?} and {:?} overlap", w[0], w[1]);
        }
        // Within a phase, step and column are one-to-one with the tag.
        let mut seen = std::collections::HashSet::new();
        for p in [Phase::Steps, Phase::Hier(3, true), Phase::Agree] {
            for step in [0, 1, 2, 255, 256, 4095, 4096, MAX_STEPS - 1] {
                for column in [0, 1, 63, MAX_COLUMNS - 1] {
                    assert!(seen.insert(op_tag(p, step, column)), "{p:?} {step} {column}");
                }
            }
        }
    }

    #[test]
    #[should_panic(expected = "out of its tag's range")]
    fn a_step_past_the_range_is_refused() {
        let _ = step_tag(Phase::Steps, MAX_STEPS);
    }

    #[test]
    #[should_panic(expected = "out of its tag's range")]
    fn a_stage_past_the_range_is_refused() {
        let _ = step_tag(Phase::Hier(MAX_HIER_STAGES, false), 0);
    }
}
