//! Small sends written to the socket by the sending task itself
//! (`StreamOptions::tcp_direct`, `HCOMM_TCP_DIRECT`, up to 64 KiB by default) when
//! the connection's writer task holds nothing, and large ones (sends of slices from
//! 64 KiB, `tcp_lend`) up to a frame's largest size: they arrive whole and in order
//! among queued ones; a write the kernel takes only in part (a peer that stopped
//! reading) leaves a copy of its rest to the writer, ahead of what is queued later;
//! off, nothing is written directly. Ranks are tasks of this process, linked by loopback TCP.

use std::time::Duration;

mod common;

use common::{free_port, random_bytes};
use hcomm::{Communicator, StreamTransport};

fn direct(c: &Communicator<StreamTransport>) -> (u64, u64) {
    c.transport().tcp_direct_writes()
}

/// Sizes on both sides of the limit, a send and its reply each time (no burst).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_go_directly_and_arrive_whole() {
    for off in [false, true] {
        let comms = hcomm::local_tcp_with(2, |c| {
            assert_eq!(c.stream.tcp_direct, 64 << 10);
            if off {
                c.stream.tcp_direct = 0;
            }
        })
        .await
        .unwrap();
        let (a, b) = (&comms[0], &comms[1]);
        let sizes = [0, 1, 7, 4099, (64 << 10) - 1, 64 << 10, (64 << 10) + 1, 300_007, 1 << 20, (1 << 20) + 1];
        for (i, &len) in sizes.iter().enumerate() {
            let data = random_bytes(len, i as u64);
            let (s, r) = futures::join!(a.send(1, 3, &data), b.recv::<u8>(0, 3));
            s.unwrap();
            assert!(r.unwrap() == data, "{len} B");
            // The reply, as owned bytes.
            let (s, r) = futures::join!(b.send_bytes(0, 4, hcomm::Bytes::from(data.clone())), a.recv::<u8>(1, 4));
            s.unwrap();
            assert!(r.unwrap() == data, "reply of {len} B");
        }
        // A slice of 64 KiB or more is lent (`tcp_lend`), and goes directly up to a
        // frame's largest size (all of these); owned bytes go directly up to 64 KiB.
        let slices = sizes.iter().filter(|&&l| l <= 16 << 20).count() as u64;
        let owned = sizes.iter().filter(|&&l| l <= 64 << 10).count() as u64;
        let (whole_a, part_a) = direct(a);
        let (whole_b, part_b) = direct(b);
        match off {
            true => assert_eq!((whole_a + part_a, whole_b + part_b), (0, 0)),
            // Each send found its writer idle; none above its limit went directly.
            false => assert_eq!((whole_a + part_a, whole_b + part_b), (slices, owned)),
        }
        // Every slice from 64 KiB went from its caller's memory in the call, copied
        // only where the kernel did not take it whole (all of it with direct writes
        // off).
        let large = sizes.iter().filter(|&&l| l >= 64 << 10).count() as u64;
        let copied = if off { large } else { part_a };
        assert_eq!(a.transport().tcp_loans(), (large, copied));
    }
}

fn config(rank: usize, port: u16) -> hcomm::Config {
    let mut c = hcomm::Config::new(rank, 2, format!("127.0.0.1:{port}"));
    c.job_id = format!("tcp-direct-{port}");
    c.secret = Some(String::from("tcp direct test secret"));
    c.shm = false;
    // The receiver's thread is held on purpose below.
    c.stream.peer_timeout = None;
    c
}

/// Each rank on a thread and a runtime of its own. The receiver holds its thread
/// (so that its reader reads nothing) while the sender fills the socket: a direct
/// write is then taken in part, and its rest goes before every later message. All
/// arrive, whole, in the order sent.
#[test]
fn a_direct_write_taken_in_part_keeps_the_stream_in_order() {
    let port = free_port();
    // More than loopback's send and receive buffers hold together.
    let count = 1200;
    let len = |i: usize| 30_000 + (i * 7919) % 30_000;
    let sender = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let comm = config(0, port).connect().await.unwrap();
            for i in 0..count {
                // Apart by more than a burst's gap, so that each may go directly.
                std::thread::sleep(Duration::from_micros(10));
                comm.send(1, 9, &random_bytes(len(i), i as u64)).await.unwrap();
            }
            let counts = comm.transport().tcp_direct_writes();
            comm.finalize().await.unwrap();
            counts
        })
    });
    let receiver = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let comm = config(1, port).connect().await.unwrap();
            std::thread::sleep(Duration::from_millis(300));
            for i in 0..count {
                let got: Vec<u8> = comm.recv(0, 9).await.unwrap();
                assert!(got == random_bytes(len(i), i as u64), "message {i} out of order or corrupted");
            }
            comm.finalize().await.unwrap();
        });
    });
    let (whole, part) = sender.join().unwrap();
    receiver.join().unwrap();
    assert!(part >= 1, "no direct write was taken in part ({whole} whole)");
    assert!(whole >= 100, "{whole} whole direct writes");
}

/// Large sends (64-512 KiB slices) to a receiver that holds its thread: they go
/// directly until the kernel's buffers fill, then one is taken in part and a copy of
/// its rest goes to the writer. That send's future is dropped before the writer could
/// finish (the receiver still reads nothing) and its buffer overwritten at once: the
/// receiver still gets every message whole, in order, the dropped one as its buffer
/// held it at the call.
#[test]
fn a_large_direct_write_taken_in_part_leaves_a_copy_of_its_rest() {
    let port = free_port();
    let len = |i: usize| (64 << 10) + (i * 104_729) % (448 << 10);
    let limit = 2000;
    let (count_tx, count_rx) = std::sync::mpsc::channel();
    let sender = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let comm = config(0, port).connect().await.unwrap();
            let mut sent = 0;
            while sent < limit {
                let mut buf = random_bytes(len(sent), 500 + sent as u64);
                let send = comm.send(1, 8, &buf);
                let done = tokio::time::timeout(Duration::from_millis(100), send).await;
                sent += 1;
                if let Ok(r) = done {
                    r.unwrap();
                    continue;
                }
                // Dropped with its rest still with the writer: the buffer is ours again.
                buf.fill(0xEE);
                break;
            }
            count_tx.send(sent).unwrap();
            let counts = (comm.transport().tcp_direct_writes(), comm.transport().tcp_loans());
            comm.finalize().await.unwrap();
            (sent, counts)
        })
    });
    let receiver = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let comm = config(1, port).connect().await.unwrap();
            let count = count_rx.recv().unwrap();
            for i in 0..count {
                let got: Vec<u8> = comm.recv(0, 8).await.unwrap();
                assert!(got == random_bytes(len(i), 500 + i as u64), "message {i} out of order or corrupted");
            }
            comm.finalize().await.unwrap();
        });
    });
    let (sent, ((whole, part), loans)) = sender.join().unwrap();
    receiver.join().unwrap();
    assert!(sent < limit, "{sent} sends of 64-512 KiB never filled the kernel's buffers");
    // Each send found the writer idle and every one before the last went whole; the
    // last went in part (or, if the one before filled the buffers exactly, found no
    // room and went to the writer).
    assert!(part <= 1, "{part} partial direct writes");
    assert_eq!(whole, sent as u64 - 1, "every send before the last went whole");
    assert_eq!(loans, (sent as u64, 1), "all sent from the caller's memory, the last one's rest copied");
}

/// Without eager sends (`tcp_eager` 0), sends awaited one after another go to the
/// socket directly, each right after the last; with them (the default), such a
/// burst of small sends completes at once and the writer task gathers it. A window
/// of sends made before any is awaited goes to the writer task after its first,
/// which gathers the rest into few writes. All arrive whole and in order. One
/// thread, so that the writer task runs only when the sending task waits.
#[tokio::test]
async fn awaited_sends_go_directly_or_eagerly_and_a_window_is_gathered() {
    for eager in [false, true] {
        let comms = hcomm::local_tcp_with(2, |c| {
            c.stream.peer_timeout = None;
            assert_eq!(c.stream.tcp_eager, 8 << 10);
            if !eager {
                c.stream.tcp_eager = 0;
            }
        })
        .await
        .unwrap();
        let (a, b) = (&comms[0], &comms[1]);
        let count = 50;
        let msg = |i: usize| random_bytes(1 + i % 97, 1000 + i as u64);
        let check = async |tag: u32| {
            for i in 0..count {
                let got: Vec<u8> = b.recv(0, tag).await.unwrap();
                assert!(got == msg(i), "message {i} of tag {tag} out of order or corrupted");
            }
        };
        // Awaited one by one.
        let (before, eager_before) = (direct(a).0, a.transport().tcp_eager_sends());
        let send = async {
            for i in 0..count {
                a.send(1, 5, &msg(i)).await.unwrap();
            }
            (direct(a).0 - before, a.transport().tcp_eager_sends() - eager_before)
        };
        let ((sequential, eagerly), ()) = futures::join!(send, check(5));
        match eager {
            // A heartbeat queued meanwhile may send one to the writer; with a fixed
            // gap instead (the sends 1-2 µs apart), about every other one went there.
            false => {
                assert!(sequential >= count as u64 - 3, "{sequential} of {count} awaited sends written directly");
                assert_eq!(eagerly, 0);
            }
            // The first goes directly, the next ones complete at once until
            // `EAGER_BACKLOG` wait for the writer; then one waits for it.
            true => assert!(
                eagerly >= count as u64 / 2 && sequential + eagerly <= count as u64,
                "{eagerly} eager and {sequential} direct sends of {count}"
            ),
        }
        // A window: every future made first, then awaited together.
        let before = direct(a).0;
        let bufs: Vec<Vec<u8>> = (0..count).map(msg).collect();
        let sends: Vec<_> = bufs.iter().map(|m| a.send(1, 6, m)).collect();
        let window = direct(a).0 - before;
        let (sent, ()) = futures::join!(futures::future::try_join_all(sends), check(6));
        sent.unwrap();
        // Only a pause of over 2 µs between making two of them writes another directly.
        assert!(window <= 5, "{window} of a window of {count} written directly");
        futures::future::try_join_all(comms.iter().map(|c| c.finalize())).await.unwrap();
    }
}

/// A burst of small sends that complete at once (eager) and are never followed by
/// a wait of the sending task before it finalizes still reaches the peer, whole and
/// in order: the writer task sends them before the connection closes. Messages over
/// `tcp_eager` (8 KiB, whatever the host's processors) are never eager. Each rank on
/// a thread of its own.
#[test]
fn eager_sends_arrive_in_order_when_the_sender_finalizes_at_once() {
    let port = free_port();
    let count = 300;
    let len = |i: usize| [1, 8, 100, 8192, 8193, 20_000][i % 6];
    let sender = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let mut c = config(0, port);
            c.stream.peer_timeout = Some(Duration::from_secs(5));
            c.auto_eager = false;
            let comm = c.connect().await.unwrap();
            let mut eager_big = 0;
            for i in 0..count {
                let before = comm.transport().tcp_eager_sends();
                comm.send(1, 4, &random_bytes(len(i), 7 + i as u64)).await.unwrap();
                if len(i) > 8192 {
                    eager_big += comm.transport().tcp_eager_sends() - before;
                }
            }
            let eager = comm.transport().tcp_eager_sends();
            comm.finalize().await.unwrap();
            (eager, eager_big)
        })
    });
    let receiver = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let mut c = config(1, port);
            c.stream.peer_timeout = Some(Duration::from_secs(5));
            let comm = c.connect().await.unwrap();
            for i in 0..count {
                let got: Vec<u8> = comm.recv(0, 4).await.unwrap();
                assert!(got == random_bytes(len(i), 7 + i as u64), "message {i} out of order or corrupted");
            }
            comm.finalize().await.unwrap();
        });
    });
    let (eager, eager_big) = sender.join().unwrap();
    receiver.join().unwrap();
    assert_eq!(eager_big, 0, "messages over 8 KiB were sent eagerly");
    assert!(eager >= 10, "only {eager} of {count} sends were eager");
}

/// A receive made after a send to the same peer (the other half of an exchange)
/// reads the socket itself in its first poll, and takes messages there; a rank
/// that only receives (a broadcast's leaf) never does, and neither does anyone on
/// an oversubscribed host (`spin_yield`). Exchanges of sizes on both sides of the
/// direct and landing limits, each rank on a thread of its own, arrive whole and in
/// order.
#[test]
fn an_exchange_reads_in_its_first_poll_and_a_lone_receive_does_not() {
    for crowded in [false, true] {
        let port = free_port();
        let rounds = 300;
        let len = |i: usize| [0, 1, 8, 100, 4099, 70_000, 600_001][i % 7];
        let rank = move |me: usize| {
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
                rt.block_on(async {
                    let mut c = config(me, port);
                    c.auto_spin = false;
                    c.stream.spin_yield = crowded;
                    let comm = c.connect().await.unwrap();
                    let peer = 1 - me;
                    for i in 0..rounds {
                        let mine = random_bytes(len(i), (10 * i + me) as u64);
                        let (s, r) = futures::join!(comm.send(peer, 1, &mine), comm.recv::<u8>(peer, 1));
                        s.unwrap();
                        let theirs = random_bytes(len(i), (10 * i + peer) as u64);
                        assert!(r.unwrap() == theirs, "exchange {i} of rank {me}: wrong bytes");
                    }
                    let exchanged = comm.transport().tcp_first_reads();
                    // Rank 0 sends, rank 1 only receives.
                    for i in 0..rounds {
                        let m = random_bytes(len(i), 5000 + i as u64);
                        match me {
                            0 => comm.send(1, 2, &m).await.unwrap(),
                            _ => assert!(comm.recv::<u8>(0, 2).await.unwrap() == m, "message {i}: wrong bytes"),
                        }
                    }
                    let after = comm.transport().tcp_first_reads();
                    comm.finalize().await.unwrap();
                    (exchanged, after)
                })
            })
        };
        let (a, b) = (rank(0), rank(1));
        let ((a_ex, _), (b_ex, b_after)) = (a.join().unwrap(), b.join().unwrap());
        match crowded {
            true => assert_eq!((a_ex, b_ex, b_after), ((0, 0), (0, 0), (0, 0))),
            false => {
                // An exchange's receive reads unless the reader task delivered its
                // message first (then it polls no link); some found it there.
                assert!(a_ex.0 >= rounds as u64 / 2 && b_ex.0 >= rounds as u64 / 2, "{a_ex:?} {b_ex:?}");
                assert!(a_ex.1 + b_ex.1 > 0, "no first read found bytes: {a_ex:?} {b_ex:?}");
                // At most one: the last exchange's send leaves its mark unread when
                // that exchange's receive found its message delivered already.
                assert!(b_after.0 - b_ex.0 <= 1, "a rank that only receives read in first polls: {b_ex:?} {b_after:?}");
            }
        }
    }
}
