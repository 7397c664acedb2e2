//! Single copy over shared memory (`hcomm_transport::shm`): large messages stay in the
//! sender's memory, lent (a payload the transport owns: handed over, or copied from a
//! borrowed slice), and the receiver copies them out itself. Every way of sending
//! against every way of receiving, on both sides of the size that switches it on; a
//! dropped send; two ranks that both send before they receive; a sender whose side of
//! the link is gone before its message was read. Ranks are tasks of this process,
//! linked by shared-memory rings.

use std::time::Duration;

mod common;

use common::{random_bytes, send_and_receive, typed_and_refused};
use hcomm::{Bytes, Communicator, StreamTransport};

/// `HCOMM_SHM_CMA`'s default: messages of this size and more are lent.
const LEND_MIN: usize = 64 << 10;

fn stats(c: &Communicator<StreamTransport>, peer: usize) -> (hcomm::ShmStats, usize) {
    c.transport().shm_stats(peer).expect("the ranks are linked by shared memory")
}

/// Waits (a bounded while) until rank `c`'s loans to `peer` are all released.
async fn released(c: &Communicator<StreamTransport>, peer: usize) {
    for _ in 0..500 {
        if stats(c, peer).1 == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    panic!("loans of rank {} to rank {peer} never released: {:?}", c.rank(), stats(c, peer));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_send_against_every_receive_across_the_threshold() {
    let comms = hcomm::local_shm(2).await.unwrap();
    let (a, b) = (&comms[0], &comms[1]);
    assert_eq!(a.transport_name(), "shm");
    let sizes = [0, 1, 4099, LEND_MIN - 1, LEND_MIN, LEND_MIN + 1, 1_048_583, 3_000_017];
    let mut tag = 0;
    for (i, &len) in sizes.iter().enumerate() {
        let data = random_bytes(len, i as u64);
        for recv_kind in 0..3 {
            for owned in [false, true] {
                tag += 1;
                send_and_receive(a, b, tag, &data, owned, recv_kind).await;
            }
        }
    }
    // Typed: f32 in, the same count out; another length is refused as a mismatch.
    typed_and_refused(a, b).await;

    let large = sizes.iter().filter(|&&l| l >= LEND_MIN).count() as u64;
    released(a, 1).await;
    let (st, _) = stats(a, 1);
    // Per large size: three receive kinds of each send kind (a borrowed slice lent
    // from its copy); plus the two f32 sends.
    assert_eq!(st.lent, 6 * large + 2, "{st:?}");
    let (st_b, _) = stats(b, 0);
    // Rank 1 copied every lent message out once, straight into its receive or at once
    // when none waited; the refused one only if no receive waited for it yet.
    assert!((6 * large + 1..=6 * large + 2).contains(&st_b.pulled), "{st_b:?}");
}

/// A send future dropped before the receiver copied the message still delivers what
/// the buffer held at the call, even though the buffer changes right after.
#[tokio::test(flavor = "current_thread")]
async fn a_dropped_send_delivers_what_its_buffer_held() {
    let mut comms = hcomm::local_shm(2).await.unwrap();
    comms.iter_mut().for_each(|c| c.set_timeout(Duration::from_secs(20)));
    for (i, len) in [LEND_MIN, 1_048_583].into_iter().enumerate() {
        let mut buf = random_bytes(len, 40 + i as u64);
        let original = buf.clone();
        // Queued (lent out of `buf`) at the call; dropped before anyone ran.
        drop(comms[0].send(1, 3, &buf));
        buf.fill(0xEE);
        let mut out = vec![0u8; len];
        comms[1].recv_into(0, 3, &mut out).await.unwrap();
        assert!(out == original, "{len} B: the receiver got the reused buffer");
    }
    released(&comms[0], 1).await;
}

/// Both ranks send a large message before they receive: a send must not wait for the
/// peer's receive to be posted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_ranks_that_send_before_they_receive_do_not_deadlock() {
    let comms = hcomm::local_shm(2).await.unwrap();
    let exchange = |me: usize| {
        let c = &comms[me];
        async move {
            let mine = random_bytes(2_000_003, me as u64);
            for round in 0..5 {
                c.send(1 - me, round, &mine).await?;
                let theirs = c.recv::<u8>(1 - me, round).await?;
                assert!(theirs == random_bytes(2_000_003, 1 - me as u64));
            }
            hcomm::Result::<()>::Ok(())
        }
    };
    let both = futures::future::try_join(exchange(0), exchange(1));
    tokio::time::timeout(Duration::from_secs(60), both).await.expect("no deadlock").unwrap();
}

/// A rank whose communicator goes away with a lent message unread: its peer's receive
/// fails with a peer-failed error naming it, never returning whatever the memory
/// holds by then. Twice: once with the memory given back to the allocator (the copy
/// finds nothing there), once with the memory still mapped and even intact (a clone
/// of the bytes lives on here), where only the mark the lender left in the ring tells.
#[tokio::test(flavor = "current_thread")]
async fn a_lender_that_goes_first_fails_the_receive() {
    for keep in [false, true] {
        let mut comms = hcomm::local_shm(2).await.unwrap();
        comms.iter_mut().for_each(|c| c.set_timeout(Duration::from_secs(20)));
        let data = Bytes::from(random_bytes(1 << 20, 9));
        comms[0].send_bytes(1, 4, data.clone()).await.unwrap();
        let kept = keep.then_some(data);
        let b = comms.pop().unwrap();
        drop(comms);
        // Let rank 0's tasks end (its side of the links lets go of what it lent).
        tokio::time::sleep(Duration::from_millis(200)).await;
        let e = b.recv_bytes(0, 4).await.unwrap_err();
        assert!(e.is_peer_failed() && e.peer() == Some(0), "{e}");
        if keep {
            assert!(e.to_string().contains("closed its side"), "{e}");
        }
        drop(kept);
    }
}

/// A send writes its frame into the ring at the call, lent or not: a receive polled
/// once, with no other task of this thread run in between (the writer task among
/// them), reads it out of the ring itself and copies the message. (Lent sends went
/// through the writer task once, which a receive that polls the ring, holding the
/// thread, starved until its spin ran out: 123 µs per 64 KiB round trip.)
#[tokio::test(flavor = "current_thread")]
async fn a_send_is_in_the_ring_at_the_call() {
    let comms = hcomm::local_shm(2).await.unwrap();
    for (i, len) in [8, 4096, LEND_MIN, 300_007].into_iter().enumerate() {
        let data = random_bytes(len, 60 + i as u64);
        let mut out = vec![0u8; len];
        {
            let mut recv = std::pin::pin!(comms[1].recv_into(0, 8, &mut out));
            let send = comms[0].send(1, 8, &data);
            match futures::poll!(recv.as_mut()) {
                std::task::Poll::Ready(r) => r.unwrap(),
                std::task::Poll::Pending => panic!("{len} B: the first poll of the receive found nothing"),
            }
            send.await.unwrap();
        }
        assert!(out == data, "{len} B");
    }
}
