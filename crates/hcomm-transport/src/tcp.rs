//! A plain TCP connection whose incoming bytes wake the executor only when nothing
//! else is reading them.
//!
//! A receive that awaits a reply reads the socket itself and spins briefly before it
//! parks ([`hcomm_core::mailbox::Progress`]). If the socket were registered with the
//! executor's I/O driver for readability, every packet would still wake the worker
//! thread parked in the driver, and the connection's reader task with it: on a
//! multi-thread runtime that is a wake-up across threads per message, which costs
//! more than a small round trip, and a third busy thread beside the two that spin.
//!
//! So the socket is registered with the driver for writability only. For
//! readability it sits in an epoll instance of its own, which the driver watches and
//! in which the socket is armed (one-shot) only while the reader task waits and no
//! receive spins on the socket, as [`crate::arm`] decides.

use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

use crate::arm::{LINGER, ReadArm, Wait};

/// The events the socket is registered with while armed: one readiness report, then
/// disarmed until armed again.
const ARMED: u32 = (libc::EPOLLIN | libc::EPOLLRDHUP | libc::EPOLLONESHOT) as u32;

/// The events while disarmed: none (the kernel adds errors and hang-ups, reported
/// once).
const DISARMED: u32 = libc::EPOLLONESHOT as u32;

/// One TCP connection, shared by its reader task, its writer task, and the sends and
/// receives that use the socket in their own calls.
pub(crate) struct TcpSock {
    /// The socket (non-blocking), registered with the driver for writability.
    stream: AsyncFd<std::net::TcpStream>,
    /// The epoll instance holding the socket for readability, registered with the
    /// driver for readability.
    epoll: AsyncFd<OwnedFd>,
    /// When the socket is armed (see [`crate::arm`]).
    arm: ReadArm,
}

impl std::fmt::Debug for TcpSock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpSock").field("fd", &self.stream.as_raw_fd()).field("arm", &self.arm).finish()
    }
}

/// The result of a libc call that returns -1 on error.
fn cvt(r: libc::c_int) -> std::io::Result<libc::c_int> {
    if r < 0 { Err(std::io::Error::last_os_error()) } else { Ok(r) }
}

impl TcpSock {
    /// Takes `stream` off the driver's readability interest (see the module docs).
    /// Must be called within a tokio runtime.
    ///
    /// # Errors
    /// The epoll instance could not be made, or the driver refused a registration
    /// (out of file descriptors, most likely).
    #[allow(unsafe_code)]
    pub(crate) fn new(stream: tokio::net::TcpStream) -> std::io::Result<TcpSock> {
        let stream = stream.into_std()?;
        stream.set_nonblocking(true)?;
        // SAFETY: epoll_create1 takes no pointers; a non-negative result is a new
        // descriptor that nothing else owns.
        let epoll = unsafe { OwnedFd::from_raw_fd(cvt(libc::epoll_create1(libc::EPOLL_CLOEXEC))?) };
        let mut ev = libc::epoll_event { events: DISARMED, u64: 0 };
        // SAFETY: both descriptors are open for the call; `ev` is a valid event.
        cvt(unsafe { libc::epoll_ctl(epoll.as_raw_fd(), libc::EPOLL_CTL_ADD, stream.as_raw_fd(), &mut ev) })?;
        // SAFETY: a `TcpStream` and an `OwnedFd` own their descriptor, keep it open
        // until dropped and always return it; neither is taken out of its `AsyncFd`.
        let (stream, epoll) = unsafe {
            (
                AsyncFd::register_with_interest(stream, Interest::WRITABLE)?,
                AsyncFd::register_with_interest(epoll, Interest::READABLE)?,
            )
        };
        Ok(TcpSock { stream, epoll, arm: ReadArm::default() })
    }

    /// Sets the socket's events in the epoll instance. An error here means the
    /// socket is gone (the reader finds out when it reads), so it is ignored.
    #[allow(unsafe_code)]
    fn set_events(&self, events: u32) {
        let mut ev = libc::epoll_event { events, u64: 0 };
        // SAFETY: both descriptors are open while `self` lives; `ev` is a valid event.
        let _ =
            unsafe { libc::epoll_ctl(self.epoll.as_raw_fd(), libc::EPOLL_CTL_MOD, self.stream.as_raw_fd(), &mut ev) };
    }

    /// A receive starts polling the socket itself: its bytes no longer wake the
    /// reader task (see the module docs). Undone by [`TcpSock::release`].
    pub(crate) fn hold(&self) {
        self.arm.hold(|| self.set_events(DISARMED));
    }

    /// Whether a receive polls the socket in a spin right now ([`TcpSock::hold`]).
    pub(crate) fn is_held(&self) -> bool {
        self.arm.is_held()
    }

    /// The receive that called [`TcpSock::hold`] stopped polling the socket; unless
    /// `linger`, the socket is armed at once if the reader task waits.
    pub(crate) fn release(&self, linger: bool) {
        // Bytes already there are reported at once.
        self.arm.release(linger, || self.set_events(ARMED));
    }

    /// A receive waits to be woken by the reader task; undone by
    /// [`TcpSock::unpark_rx`].
    pub(crate) fn park_rx(&self) {
        self.arm.park_rx(|| self.set_events(ARMED));
    }

    /// A receive counted by [`TcpSock::park_rx`] waits no more.
    pub(crate) fn unpark_rx(&self) {
        self.arm.unpark_rx();
    }

    /// Waits until the socket has something to read (bytes, its end, or an error),
    /// as the reader task does once it has read everything, with the socket armed
    /// as [`crate::arm`] decides: unless it is armed, the wait ends after
    /// [`LINGER`] without a report.
    ///
    /// # Errors
    /// The driver failed, or the epoll instance did.
    pub(crate) async fn readable(&self) -> std::io::Result<()> {
        let how = self.arm.wait(|| self.set_events(ARMED));
        match how {
            Wait::Armed => self.reported().await,
            Wait::Timed => tokio::time::timeout(LINGER, self.reported()).await.unwrap_or(Ok(())),
        }
    }

    /// The wait of [`TcpSock::readable`], the socket armed or not.
    #[allow(unsafe_code)]
    async fn reported(&self) -> std::io::Result<()> {
        let mut done = WaitDone { sock: self, reported: false };
        loop {
            let mut guard = self.epoll.readable().await?;
            let mut ev = libc::epoll_event { events: 0, u64: 0 };
            // SAFETY: `ev` is valid for one event; a zero timeout never blocks.
            let n = unsafe { libc::epoll_wait(self.epoll.as_raw_fd(), &mut ev, 1, 0) };
            match n {
                // Reported and, being one-shot, disarmed.
                1.. => {
                    done.reported = true;
                    return Ok(());
                }
                // A report a holder's disarming made stale: the readiness is cleared
                // (unless the driver saw a newer one since), and the wait goes on.
                0 => guard.clear_ready(),
                _ => {
                    let e = std::io::Error::last_os_error();
                    if e.kind() != std::io::ErrorKind::Interrupted {
                        return Err(e);
                    }
                }
            }
        }
    }

    /// One `recv(2)` of at most `len` bytes into `dst`, without waiting; `flags` are
    /// added to `MSG_DONTWAIT`.
    ///
    /// # Safety
    /// `dst` must be valid for writes of `len` bytes.
    #[allow(unsafe_code)]
    pub(crate) unsafe fn recv(&self, dst: *mut u8, len: usize, flags: libc::c_int) -> std::io::Result<usize> {
        // SAFETY: the caller's promise; the descriptor is open while `self` lives.
        let n = unsafe { libc::recv(self.stream.as_raw_fd(), dst.cast(), len, libc::MSG_DONTWAIT | flags) };
        if n < 0 { Err(std::io::Error::last_os_error()) } else { Ok(n as usize) }
    }

    /// Whether the socket holds bytes to read (or its end) now.
    #[allow(unsafe_code)]
    pub(crate) fn has_bytes(&self) -> bool {
        let mut b = 0u8;
        // SAFETY: `b` is one writable byte.
        !matches!(unsafe { self.recv(&mut b, 1, libc::MSG_PEEK) }, Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
    }

    /// Writes as much of `parts` as the kernel takes now, without waiting.
    ///
    /// # Errors
    /// `WouldBlock` if it takes nothing; the socket's error.
    pub(crate) fn try_write_vectored(&self, parts: &[std::io::IoSlice<'_>]) -> std::io::Result<usize> {
        self.stream.get_ref().write_vectored(parts)
    }

    /// Writes all of `buf`, waiting for room.
    ///
    /// # Errors
    /// The socket's error.
    pub(crate) async fn write_all(&self, mut buf: &[u8]) -> std::io::Result<()> {
        while !buf.is_empty() {
            let mut guard = self.stream.writable().await?;
            match guard.try_io(|s| s.get_ref().write(buf)) {
                Ok(Ok(0)) => return Err(std::io::ErrorKind::WriteZero.into()),
                Ok(Ok(n)) => buf = &buf[n..],
                Ok(Err(e)) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Ok(Err(e)) => return Err(e),
                // Full: the readiness is cleared and the wait goes on.
                Err(_would_block) => {}
            }
        }
        Ok(())
    }

    /// Shuts both directions down: the connection is of no more use.
    pub(crate) fn shutdown_both(&self) {
        let _ = self.stream.get_ref().shutdown(std::net::Shutdown::Both);
    }

    /// Shuts the sending direction down (the peer reads its end after what was
    /// written).
    pub(crate) fn shutdown_write(&self) {
        let _ = self.stream.get_ref().shutdown(std::net::Shutdown::Write);
    }
}

/// Marks the reader task as no longer waiting, however its wait ends (a report, an
/// error, or its future dropped), and disarms the socket unless the report did.
struct WaitDone<'a> {
    sock: &'a TcpSock,
    reported: bool,
}

impl Drop for WaitDone<'_> {
    fn drop(&mut self) {
        // A report disarmed the one-shot registration already.
        let reported = self.reported;
        self.sock.arm.woke(|| {
            if !reported {
                self.sock.set_events(DISARMED);
            }
        });
    }
}
