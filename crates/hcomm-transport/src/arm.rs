//! When a link's incoming bytes wake its reader task.
//!
//! A receive that waits for a message polls its link itself and spins briefly before
//! it parks ([`hcomm_core::mailbox::Progress`]). While it spins, a wake-up of the
//! reader task for the same bytes is pure cost: over shared memory the peer pays a
//! system call to ring the doorbell, and on a multi-thread runtime the reader task
//! runs on another thread and races the receive. So the link's wake source (the
//! ring's "reader waits" flag, or the socket's one-shot readiness) is armed only
//! while the reader task waits and is needed:
//!
//! - never while a receive spins on the link ([`ReadArm::hold`]);
//! - at once while a receive waits to be woken ([`ReadArm::park_rx`]), or when the
//!   reader task has work that cannot wait (over TCP, bodies no receive reads);
//! - otherwise, after receives completed recently, within [`LINGER`]: the next
//!   receive most often follows within microseconds and reads the link itself, and
//!   what nobody awaits (a heartbeat, a message posted early, a writer waiting for
//!   room) can wait that long. The reader task waits with that timeout, and arms the
//!   source once a whole period passed without receives.

use std::time::Duration;

use parking_lot::Mutex;

/// How long bytes may wait unread, after the last receive on a link completed,
/// before the reader task arms the wake source again: the same order as the delay a
/// lazily posted frame waits to leave, which is what a rank that only receives
/// tolerates for what nobody awaits.
pub(crate) const LINGER: Duration = Duration::from_millis(1);

/// A link's arming state; the wake source itself is set through the closures each
/// method takes, called under the lock so that arming and disarming stay in order.
#[derive(Debug, Default)]
pub(crate) struct ReadArm(Mutex<State>);

#[derive(Debug, Default)]
struct State {
    /// Receives spinning on the link.
    holders: usize,
    /// Receives parked until the link's reader wakes them.
    parked: usize,
    /// Whether the reader task waits.
    waiting: bool,
    /// Whether its wait ends after [`LINGER`] at the latest.
    timed: bool,
    /// Whether the wake source is armed (as far as this side set it).
    armed: bool,
    /// A receive held the link since the reader task last began to wait.
    held: bool,
    /// A receive completed with no other holding the link since the reader task last
    /// began to wait.
    linger: bool,
}

/// How the reader task waits ([`ReadArm::wait`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wait {
    /// Until the wake source fires.
    Armed,
    /// For [`LINGER`] at most (the source may be armed meanwhile).
    Timed,
}

impl ReadArm {
    /// A receive starts spinning on the link: the source is disarmed.
    pub(crate) fn hold(&self, disarm: impl FnOnce()) {
        let mut s = self.0.lock();
        s.holders += 1;
        s.held = true;
        if s.armed {
            s.armed = false;
            disarm();
        }
    }

    /// Whether a receive spins on the link now.
    pub(crate) fn is_held(&self) -> bool {
        self.0.lock().holders > 0
    }

    /// The receive that called [`ReadArm::hold`] stopped spinning. If it was the last
    /// one, the source is armed at once where a receive is parked, the reader task
    /// waits without a timeout, or the link may not linger now (`linger` false: the
    /// reader task has work that cannot wait, such as bodies no receive reads);
    /// otherwise the reader task arms it when its timed wait ends.
    pub(crate) fn release(&self, linger: bool, arm: impl FnOnce()) {
        let mut s = self.0.lock();
        s.holders = s.holders.saturating_sub(1);
        if s.holders > 0 {
            return;
        }
        if s.waiting && !s.armed && (!s.timed || s.parked > 0 || !linger) {
            s.armed = true;
            arm();
        } else if linger {
            s.linger = true;
        }
    }

    /// A receive waits to be woken (undone by [`ReadArm::unpark_rx`]): the source
    /// is armed unless a receive spins on the link, which arms it when it stops.
    pub(crate) fn park_rx(&self, arm: impl FnOnce()) {
        let mut s = self.0.lock();
        s.parked += 1;
        if s.holders == 0 && s.waiting && !s.armed {
            s.armed = true;
            arm();
        }
    }

    /// A receive counted by [`ReadArm::park_rx`] was polled again, completed or
    /// went away.
    pub(crate) fn unpark_rx(&self) {
        let mut s = self.0.lock();
        s.parked = s.parked.saturating_sub(1);
    }

    /// The reader task has read everything and is about to wait: arms the source
    /// unless receives spin on the link or completed recently (and none is parked),
    /// and says how to wait. [`ReadArm::woke`] must follow the wait.
    pub(crate) fn wait(&self, arm: impl FnOnce()) -> Wait {
        let mut s = self.0.lock();
        s.waiting = true;
        s.timed = s.held || s.linger;
        let arm_now = s.holders == 0 && (s.parked > 0 || !s.linger);
        s.held = false;
        s.linger = false;
        if arm_now && !s.armed {
            s.armed = true;
            arm();
        }
        if s.timed { Wait::Timed } else { Wait::Armed }
    }

    /// The reader task's wait ended: the source is disarmed if it is still armed.
    pub(crate) fn woke(&self, disarm: impl FnOnce()) {
        let mut s = self.0.lock();
        s.waiting = false;
        s.timed = false;
        if s.armed {
            s.armed = false;
            disarm();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    /// The source as the closures leave it.
    struct Source(Cell<bool>);

    impl Source {
        fn arm(&self) -> impl FnOnce() + '_ {
            || self.0.set(true)
        }
        fn disarm(&self) -> impl FnOnce() + '_ {
            || self.0.set(false)
        }
    }

    #[test]
    fn an_idle_reader_arms_and_a_spinning_receive_disarms() {
        let (a, src) = (ReadArm::default(), Source(Cell::new(false)));
        assert_eq!(a.wait(src.arm()), Wait::Armed);
        assert!(src.0.get());
        a.hold(src.disarm());
        assert!(!src.0.get());
        // The first release while the reader waits without a timeout arms at once:
        // nothing else would.
        a.release(true, src.arm());
        assert!(src.0.get());
        a.woke(src.disarm());
        assert!(!src.0.get());
    }

    #[test]
    fn after_recent_receives_the_reader_waits_timed_and_arms_once_they_stop() {
        let (a, src) = (ReadArm::default(), Source(Cell::new(false)));
        a.hold(src.disarm());
        a.release(true, src.arm());
        // The reader ran meanwhile: a receive completed, so it waits timed, unarmed.
        assert_eq!(a.wait(src.arm()), Wait::Timed);
        assert!(!src.0.get());
        a.hold(src.disarm());
        a.release(true, src.arm());
        assert!(!src.0.get(), "a completed receive leaves a timed reader unarmed");
        a.woke(src.disarm());
        // The period saw a receive: timed again, still unarmed (one completed).
        assert_eq!(a.wait(src.arm()), Wait::Timed);
        assert!(!src.0.get());
        a.woke(src.disarm());
        // A whole period without receives: armed, untimed.
        assert_eq!(a.wait(src.arm()), Wait::Armed);
        assert!(src.0.get());
    }

    #[test]
    fn a_parked_receive_arms_at_once_and_when_the_last_holder_stops() {
        let (a, src) = (ReadArm::default(), Source(Cell::new(false)));
        a.hold(src.disarm());
        a.release(true, src.arm());
        assert_eq!(a.wait(src.arm()), Wait::Timed);
        a.park_rx(src.arm());
        assert!(src.0.get(), "a parked receive needs the wake-up");
        a.hold(src.disarm());
        assert!(!src.0.get());
        a.release(true, src.arm());
        assert!(src.0.get(), "the parked receive still waits");
        a.unpark_rx();
        a.woke(src.disarm());
        a.park_rx(src.arm());
        assert!(!src.0.get(), "the reader runs: it arms when it waits");
        // A receive held the link this period, so the wait is timed, but armed for
        // the parked one.
        assert_eq!(a.wait(src.arm()), Wait::Timed);
        assert!(src.0.get());
    }

    #[test]
    fn a_release_that_may_not_linger_arms_a_timed_reader_at_once() {
        let (a, src) = (ReadArm::default(), Source(Cell::new(false)));
        a.hold(src.disarm());
        a.release(true, src.arm());
        assert_eq!(a.wait(src.arm()), Wait::Timed);
        a.hold(src.disarm());
        a.release(false, src.arm());
        assert!(src.0.get(), "the reader has work that cannot wait for its timer");
    }
}
