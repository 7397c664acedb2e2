//! Large messages over plain TCP without copies in user space. Large sends
//! (`StreamOptions::tcp_lend`, `HCOMM_TCP_LEND`): a `send` of a slice of 64 KiB or
//! more is written to the socket straight from the caller's memory in the call when
//! the connection's writer is idle, and only what the kernel does not take is copied. Receives that land (`StreamOptions::tcp_land`, `HCOMM_TCP_LAND`, from
//! 512 KiB by default, from 64 KiB at the least): a `recv_into` of a message that
//! large, posted before the message comes, reads it from the socket into its buffer
//! itself. Every way of receiving on both sides of the
//! threshold; large and small messages under one tag in flight together; a send
//! dropped before or while the writer sends it, its buffer reused at once; a receive
//! dropped while its message lands. Ranks are tasks of this process, linked by
//! loopback TCP.

use std::time::Duration;

mod common;

use common::{random_bytes, send_and_receive, typed_and_refused};
use hcomm::{Bytes, Communicator, StreamTransport};

/// `HCOMM_TCP_LEND`'s default.
const LEND_MIN: usize = 64 << 10;

fn loans(c: &Communicator<StreamTransport>) -> (u64, u64) {
    c.transport().tcp_loans()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_receive_of_lent_sends_across_the_threshold() {
    let comms = hcomm::local_tcp(2).await.unwrap();
    let (a, b) = (&comms[0], &comms[1]);
    assert_eq!(a.transport_name(), "tcp");
    // Beyond one fragment (512 KiB) and not a multiple of it, too; up to 16 MiB a large
    // message goes as one frame written by the sending task (landing at 512 KiB and
    // 1 MiB), beyond it through the writer in fragments.
    let sizes = [0, 1, 4099, LEND_MIN - 1, LEND_MIN, LEND_MIN + 1, 512 << 10, 1 << 20, 1_048_583, 3_000_017];
    let mut tag = 0;
    for (i, &len) in sizes.iter().enumerate() {
        let data = random_bytes(len, i as u64);
        for recv_kind in 0..3 {
            tag += 1;
            send_and_receive(a, b, tag, &data, false, recv_kind).await;
        }
    }
    // Typed: f32 in, the same count out; another length is refused as a mismatch.
    typed_and_refused(a, b).await;
    // Three receive kinds per large size, and the two f32 sends: all large. (How
    // many the kernel took whole depends on how fast the receiver reads.)
    let large = sizes.iter().filter(|&&l| l >= LEND_MIN).count() as u64;
    assert_eq!(loans(a).0, 3 * large + 2);
    assert_eq!(loans(b), (0, 0));
}

/// Lent and copied messages under one tag, all queued before any is awaited: they
/// arrive in the order of the calls, each whole, and a send of owned bytes is never
/// lent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lent_and_copied_messages_under_one_tag_keep_their_order() {
    let comms = hcomm::local_tcp(2).await.unwrap();
    let (a, b) = (&comms[0], &comms[1]);
    let lens = [2_000_003, 10, LEND_MIN, 70_001, 3, 1_500_000, LEND_MIN - 1, 600_000];
    let msgs: Vec<Vec<u8>> = lens.iter().enumerate().map(|(i, &l)| random_bytes(l, 100 + i as u64)).collect();
    let sends: Vec<_> = msgs.iter().map(|m| a.send(1, 5, m)).collect();
    let owned = a.send_bytes(1, 5, Bytes::from(msgs[0].clone()));
    let recvs = async {
        let mut got = Vec::new();
        for _ in 0..=msgs.len() {
            got.push(b.recv::<u8>(0, 5).await?);
        }
        hcomm::Result::<Vec<Vec<u8>>>::Ok(got)
    };
    let (s, o, r) = futures::join!(futures::future::try_join_all(sends), owned, recvs);
    s.unwrap();
    o.unwrap();
    let got = r.unwrap();
    for (i, m) in msgs.iter().chain([&msgs[0]]).enumerate() {
        assert!(&got[i] == m, "message {i} ({} B) out of order or corrupted", m.len());
    }
    let large = lens.iter().filter(|&&l| l >= LEND_MIN).count() as u64;
    assert_eq!(loans(a).0, large);
}

/// A send future dropped before the writer ran: what the kernel did not take at the
/// call was copied then, so the receiver gets what the buffer held at the call
/// although it is overwritten right after the drop.
#[tokio::test(flavor = "current_thread")]
async fn a_send_dropped_before_the_writer_ran_delivers_what_its_buffer_held() {
    let mut comms = hcomm::local_tcp(2).await.unwrap();
    comms.iter_mut().for_each(|c| c.set_timeout(Duration::from_secs(20)));
    for (i, len) in [LEND_MIN, 1_048_583, 5_000_011].into_iter().enumerate() {
        let mut buf = random_bytes(len, 40 + i as u64);
        let original = buf.clone();
        // Written or copied at the call; dropped before any task ran.
        drop(comms[0].send(1, 3, &buf));
        buf.fill(0xEE);
        let mut out = vec![0u8; len];
        comms[1].recv_into(0, 3, &mut out).await.unwrap();
        assert!(out == original, "{len} B: the receiver got the reused buffer");
    }
    let (whole, _) = comms[0].transport().tcp_direct_writes();
    assert_eq!(loans(&comms[0]), (3, 3 - whole));
}

/// The same while the writer is sending: a message of 64 MiB, dropped once the writer
/// has begun (the receiver reads nothing yet, so the kernel's buffers fill and the
/// writer waits mid-message), then the buffer overwritten. Whatever the writer had
/// sent from the buffer and whatever it sends from the copy, the message is whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_send_dropped_while_the_writer_sends_delivers_what_its_buffer_held() {
    let mut comms = hcomm::local_tcp(2).await.unwrap();
    comms.iter_mut().for_each(|c| c.set_timeout(Duration::from_secs(30)));
    let len = 64 << 20;
    let mut buf = random_bytes(len, 77);
    let original = buf.clone();
    {
        let send = comms[0].send(1, 4, &buf);
        let mut send = std::pin::pin!(send);
        // Let the writer start; the send cannot be complete yet (64 MiB at a few GB/s).
        let polled = tokio::time::timeout(Duration::from_millis(3), send.as_mut()).await;
        assert!(polled.is_err(), "a 64 MiB send completed within 3 ms");
    }
    buf.fill(0xEE);
    let mut out = vec![0u8; len];
    comms[1].recv_into(0, 4, &mut out).await.unwrap();
    assert!(out == original, "the receiver got bytes of the reused buffer");
    assert_eq!(loans(&comms[0]), (1, 1));
}

/// `HCOMM_TCP_LEND=0` (here `Config::stream.tcp_lend`) turns large sends off: the same
/// sends are copied at the call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loans_can_be_turned_off() {
    let comms = hcomm::local_tcp_with(2, |c| c.stream.tcp_lend = 0).await.unwrap();
    let data = random_bytes(1 << 20, 5);
    let (s, r) = futures::join!(comms[0].send(1, 1, &data), comms[1].recv::<u8>(0, 1));
    s.unwrap();
    assert!(r.unwrap() == data);
    assert_eq!(loans(&comms[0]), (0, 0));
}

fn landed(c: &Communicator<StreamTransport>) -> (u64, u64, u64) {
    c.transport().tcp_landed()
}

/// Receives into buffers of 64 KiB and more, posted before their messages come, land:
/// every byte is read into the buffer by the receive itself or by the reader (and
/// copied in), and the data is whole. A message of the buffer's length but another
/// element type lands too, and is refused all the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_receives_land_in_their_buffer() {
    let comms = hcomm::local_tcp_with(2, |c| c.stream.tcp_land = 1).await.unwrap();
    let (a, b) = (&comms[0], &comms[1]);
    // Up to 1 MiB each message is one frame the sending task wrote; beyond, fragments.
    let sizes = [LEND_MIN - 1, LEND_MIN, LEND_MIN + 1, 512 << 10, 1 << 20, 1_048_583, 3_000_017, 9_000_001];
    for (i, &len) in sizes.iter().enumerate() {
        let data = random_bytes(len, 200 + i as u64);
        let mut out = vec![0u8; len];
        let recv = b.recv_into(0, 7, &mut out);
        let (r, s) = futures::join!(recv, a.send(1, 7, &data));
        s.unwrap();
        r.unwrap_or_else(|e| panic!("{len} B: {e}"));
        assert!(out == data, "{len} B: wrong bytes");
    }
    let large: Vec<usize> = sizes.iter().copied().filter(|&l| l >= LEND_MIN).collect();
    let (messages, own, pieces) = landed(b);
    assert_eq!(messages, large.len() as u64, "{:?}", landed(b));
    assert_eq!(own + pieces, large.iter().sum::<usize>() as u64, "{:?}", landed(b));
    // 65 536 f32 sent, 65 536 u32 expected: the same bytes, another type.
    let floats = vec![1.5f32; 1 << 16];
    let mut ints = vec![0u32; 1 << 16];
    let (r, s) = futures::join!(b.recv_into(0, 8, &mut ints), a.send(1, 8, &floats));
    s.unwrap();
    assert!(r.unwrap_err().is_mismatch());
    assert_eq!(landed(b).0, large.len() as u64 + 1);
    // And the link goes on: a collective over it is right.
    let (mut v, mut w) = (vec![1.0f32; 300_001], vec![1.0f32; 300_001]);
    let (x, y) = futures::join!(a.all_reduce(&mut v, hcomm::ReduceOp::Sum), b.all_reduce(&mut w, hcomm::ReduceOp::Sum));
    x.unwrap();
    y.unwrap();
    assert!(v.iter().chain(&w).all(|&x| x == 2.0));
}

/// A receive dropped while its 64 MiB message lands loses that message (as the
/// mailbox's cancel-safety rule says), and nothing else: a later receive with the same
/// tag gets a whole message, never a mix of two, and the link goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receive_dropped_while_its_message_lands() {
    let mut comms = hcomm::local_tcp_with(2, |c| c.stream.tcp_land = 1).await.unwrap();
    comms.iter_mut().for_each(|c| c.set_timeout(Duration::from_secs(30)));
    let (a, b) = (&comms[0], &comms[1]);
    let len = 64 << 20;
    let first = vec![0xA1u8; len];
    let second = vec![0xB2u8; len];
    let sends = async {
        a.send(1, 9, &first).await?;
        a.send(1, 9, &second).await
    };
    let recvs = async {
        let mut out = vec![0u8; len];
        {
            let recv = b.recv_into(0, 9, &mut out);
            // Dropped while the first message comes (or before it does).
            let early = tokio::time::timeout(Duration::from_millis(3), recv).await;
            assert!(early.is_err(), "64 MiB arrived within 3 ms");
        }
        b.recv_into(0, 9, &mut out).await?;
        let got_first = out == first;
        assert!(got_first || out == second, "a receive got a mix of two messages");
        if got_first {
            // The dropped receive had not claimed the first: the second follows.
            b.recv_into(0, 9, &mut out).await?;
            assert!(out == second);
        }
        hcomm::Result::<()>::Ok(())
    };
    let (s, r) = futures::join!(sends, recvs);
    s.unwrap();
    r.unwrap();
    let (x, y) = futures::join!(a.barrier(), b.barrier());
    x.unwrap();
    y.unwrap();
}

/// By default, messages of 512 KiB and more land and shorter ones do not; with
/// `HCOMM_TCP_LAND=0` (here `Config::stream.tcp_land`) nothing lands: the same
/// receives copy out of the reader's buffers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_lands_by_default_and_when_off() {
    for off in [false, true] {
        let comms = hcomm::local_tcp_with(2, |c| {
            assert_eq!(c.stream.tcp_land, 512 << 10);
            if off {
                c.stream.tcp_land = 0;
            }
        })
        .await
        .unwrap();
        for len in [(512 << 10) - 1, 512 << 10, 1 << 20] {
            let data = random_bytes(len, 6);
            let mut out = vec![0u8; len];
            let (r, s) = futures::join!(comms[1].recv_into(0, 1, &mut out), comms[0].send(1, 1, &data));
            s.unwrap();
            r.unwrap();
            assert!(out == data, "{len} B");
        }
        let (messages, own, pieces) = landed(&comms[1]);
        match off {
            true => assert_eq!((messages, own, pieces), (0, 0, 0)),
            false => assert_eq!((messages, own + pieces), (2, (512 << 10) + (1 << 20)), "{:?}", landed(&comms[1])),
        }
    }
}

/// A `recv_into` posted after its message began to arrive lands the rest of it: the
/// reader leaves a large message's bytes in the socket a while for its receive, then
/// reads on into a buffer of its own, and what it read becomes a piece the receive
/// copies in once posted. Here the receive comes 3 ms after the send of 64 MiB began
/// (past the reader's patience); the data is whole, the message landed, and the link
/// goes on. A later message under the same tag, received without a buffer of its
/// length, is not held for one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receive_posted_late_lands_the_rest_of_its_message() {
    let mut comms = hcomm::local_tcp_with(2, |_| {}).await.unwrap();
    comms.iter_mut().for_each(|c| c.set_timeout(Duration::from_secs(30)));
    let (a, b) = (&comms[0], &comms[1]);
    let len = 64 << 20;
    let data = random_bytes(len, 77);
    let next = random_bytes(1 << 20, 78);
    let sends = async {
        a.send(1, 3, &data).await?;
        a.send(1, 3, &next).await
    };
    let recvs = async {
        tokio::time::sleep(Duration::from_millis(3)).await;
        let mut out = vec![0u8; len];
        b.recv_into(0, 3, &mut out).await?;
        assert!(out == data, "wrong bytes");
        let second: Vec<u8> = b.recv(0, 3).await?;
        assert!(second == next, "wrong bytes in the message after");
        hcomm::Result::<()>::Ok(())
    };
    let (s, r) = futures::join!(sends, recvs);
    s.unwrap();
    r.unwrap();
    let (messages, own, pieces) = landed(b);
    assert_eq!((messages, own + pieces), (1, len as u64), "{:?}", landed(b));
    let (x, y) = futures::join!(a.barrier(), b.barrier());
    x.unwrap();
    y.unwrap();
}

/// Where ranks outnumber the processors (`spin_yield`), the reader leaves a large
/// message's bytes in the socket for its receive about a millisecond per MiB (a relay
/// posts its next receive only once it has forwarded the last message), and no
/// longer: a small message sent behind a 64 MiB one whose receive is not posted still
/// comes, once the reader's patience runs out and it reads the large one into buffers
/// of its own, and the large one is then received whole from those. (How much a
/// large message's own receive reads when it is posted within the patience depends on
/// the load, so it is measured by the benchmarks, not asserted.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_crowded_host_a_message_behind_an_unclaimed_large_one_still_comes() {
    let mut comms = hcomm::local_tcp_with(2, |c| {
        c.auto_spin = false;
        c.stream.spin_yield = true;
    })
    .await
    .unwrap();
    comms.iter_mut().for_each(|c| c.set_timeout(Duration::from_secs(30)));
    let (a, b) = (&comms[0], &comms[1]);
    let len = 64 << 20;
    let data = random_bytes(len, 79);
    let small = random_bytes(1000, 80);
    let sends = async {
        a.send(1, 4, &data).await?;
        a.send(1, 5, &small).await
    };
    let recvs = async {
        // The small message first: it is behind the large one in the stream.
        let got: Vec<u8> = b.recv(0, 5).await?;
        assert!(got == small, "wrong bytes in the small message");
        let mut out = vec![0u8; len];
        b.recv_into(0, 4, &mut out).await?;
        assert!(out == data, "wrong bytes in the large message");
        hcomm::Result::<()>::Ok(())
    };
    let (s, r) = futures::join!(sends, recvs);
    s.unwrap();
    r.unwrap();
    // Read whole before its receive came: nothing landed.
    assert_eq!(landed(b), (0, 0, 0));
    let (x, y) = futures::join!(a.barrier(), b.barrier());
    x.unwrap();
    y.unwrap();
}
