//! Frames posted lazily (`LocalTransport::post_lazy`, the deferred argument checks'
//! messages): over TCP they wait for the next write to their peer, or for the writer
//! task's delay. Alone, they arrive by the delay; taken along by direct writes and
//! by the writer's batches, they arrive intact, in their order, and leave the stream
//! readable for the messages around them. Ranks are tasks of this process, linked by
//! loopback TCP.

use std::time::Duration;

mod common;

use common::random_bytes;
use hcomm::{Bytes, LocalTransport};
use hcomm_core::{Header, MatchKey, OpKind, Signature};

/// A communicator id no communicator of the test uses.
const COMM: u64 = 0x1a2b_3c4d;

fn header(seq: u64, len: usize) -> Header {
    Header::data(0, COMM, seq, 7, &Signature::bare(OpKind::Barrier, seq), len)
}

fn key(seq: u64) -> MatchKey {
    MatchKey { src: 0, comm: COMM, seq, tag: 7 }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lazy_frames_arrive_alone_and_along_with_other_writes() {
    let comms = hcomm::local_tcp(2).await.unwrap();
    let (a, b) = (&comms[0], &comms[1]);
    let (ta, mb) = (a.transport(), b.transport().mailbox().clone());
    let wait = Duration::from_secs(20);

    // Alone: nothing else goes to rank 1, so only the writer task's delay sends it.
    ta.post_lazy(1, header(1, 5), b"alone");
    let f = tokio::time::timeout(wait, mb.recv(key(1))).await.expect("the delay sends it").unwrap();
    assert_eq!(&f.payload[..], b"alone");
    assert_eq!(f.header.signature(), Signature::bare(OpKind::Barrier, 1));

    // Along with other messages: rounds of lazy frames, each followed by a small
    // point-to-point message (written by the sending task when its writer is idle,
    // with the lazy frames in front) or by a burst (queued to the writer task, which
    // takes them into its batch). Every message and frame must arrive intact.
    let mut seq = 2;
    for round in 0..40u64 {
        let first = seq;
        for i in 0..(round % 4 + 1) {
            let payload = Bytes::from(random_bytes((round * 7 + i) as usize % 40, round * 10 + i));
            ta.post_lazy(1, header(seq, payload.len()), &payload);
            seq += 1;
        }
        let burst = if round % 2 == 0 { 1 } else { 6 };
        let sent: Vec<Vec<u8>> = (0..burst).map(|k| random_bytes(100 + k, round * 100 + k as u64)).collect();
        let sends = futures::future::try_join_all(sent.iter().map(|d| a.send(1, 3, d)));
        let recvs = async {
            let mut got = Vec::new();
            for _ in 0..burst {
                got.push(b.recv::<u8>(0, 3).await?);
            }
            Ok::<_, hcomm::Error>(got)
        };
        let (s, r) = futures::join!(sends, recvs);
        s.unwrap();
        assert_eq!(r.unwrap(), sent, "round {round}: the messages around the lazy frames");
        for (j, s) in (first..seq).enumerate() {
            let f = tokio::time::timeout(wait, mb.recv(key(s))).await.expect("lazy frame").unwrap();
            let want = random_bytes((round * 7 + j as u64) as usize % 40, round * 10 + j as u64);
            assert_eq!(&f.payload[..], &want[..], "round {round}, lazy frame {j}");
        }
    }
    // The point-to-point sends of odd rounds went directly, with lazy frames in front.
    let (whole, _) = a.transport().tcp_direct_writes();
    assert!(whole > 0, "no direct write took place");
}

/// Signature record frames (`RECORDS_SEQ`) posted lazily one after another with the
/// same key leave merged, their records in order; a frame of another key in between
/// starts a new one, and lazy frames of other sequence numbers are never merged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lazy_record_frames_of_one_key_merge_in_order() {
    use hcomm_core::keys::RECORDS_SEQ;
    use hcomm_core::wire::{RECORD_LEN, decode_records, encode_record};
    let comms = hcomm::local_tcp(2).await.unwrap();
    let (ta, mb) = (comms[0].transport(), comms[1].transport().mailbox().clone());
    let wait = Duration::from_secs(20);
    let sig = |seq: u64| Signature::bare(OpKind::Broadcast, seq * 3);
    let post = |comm: u64, seq: u64| {
        let h = Header::data(0, comm, RECORDS_SEQ, 9, &sig(seq), RECORD_LEN);
        ta.post_lazy(1, h, &encode_record(seq, &sig(seq)));
    };
    // 100 records, one of another communicator, 50 more, then two plain lazy frames
    // with one key: within the writer's delay, unless this task is held up.
    (1..=100).for_each(|s| post(COMM, s));
    post(COMM + 1, 1000);
    (101..=150).for_each(|s| post(COMM, s));
    ta.post_lazy(1, header(5, 1), b"a");
    ta.post_lazy(1, header(5, 1), b"b");
    let records_key = |comm| MatchKey { src: 0, comm, seq: RECORDS_SEQ, tag: 9 };
    let (mut frames, mut records) = (0, Vec::new());
    while records.len() < 150 {
        let f = tokio::time::timeout(wait, mb.recv(records_key(COMM))).await.expect("records").unwrap();
        records.extend(decode_records(&f.payload).unwrap());
        frames += 1;
    }
    assert_eq!(records, (1..=150).map(|s| (s, sig(s))).collect::<Vec<_>>());
    // At least the other communicator's record splits them; a writer's delay that
    // ran out while they were posted may split them more, but not into one each.
    assert!((2..150).contains(&frames), "{frames} frames");
    let other = tokio::time::timeout(wait, mb.recv(records_key(COMM + 1))).await.expect("records").unwrap();
    assert_eq!(decode_records(&other.payload).unwrap(), vec![(1000, sig(1000))]);
    for want in [b"a", b"b"] {
        let f = tokio::time::timeout(wait, mb.recv(key(5))).await.expect("lazy frame").unwrap();
        assert_eq!(&f.payload[..], want);
    }
    assert!(mb.take_now(&records_key(COMM)).is_none(), "nothing else under the records' key");
}
