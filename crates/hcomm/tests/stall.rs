//! The stall report: when a rank withholds its part of a collective, the ranks
//! waiting for it say which operation they wait on and name the rank.

mod common;

use std::time::Duration;

use common::Captured;
use futures::future::join_all;
use hcomm::{AllreduceAlgo, ReduceOp};

#[test]
fn a_withheld_part_is_named_by_the_ranks_waiting_for_it() {
    let out = Captured::default();
    let w = out.clone();
    let sub = tracing_subscriber::fmt()
        .with_writer(move || w.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::WARN)
        .finish();
    let _guard = tracing::subscriber::set_default(sub);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let mut comms = hcomm::local(4);
        for c in &mut comms {
            c.set_stall_warn(Some(Duration::from_millis(100)));
        }
        // Recursive doubling on 4 ranks: rank 2 meets rank 3 in the first step,
        // rank 1 in the second; rank 0 meets rank 2, which waits for rank 3.
        let res = join_all(comms.iter().enumerate().map(|(r, c)| async move {
            let mut v = vec![r as f32; 1000];
            if r == 3 {
                tokio::time::sleep(Duration::from_millis(450)).await;
            }
            c.all_reduce_with(&mut v, ReduceOp::Sum, AllreduceAlgo::RecursiveDoubling).await.map(|()| v)
        }))
        .await;
        for r in res {
            assert_eq!(r.unwrap(), vec![6.0; 1000]);
        }
    });
    let log = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
    for line in ["rank 1: allreduce #1 stalled", "rank 2: allreduce #1 stalled"] {
        let hit = log.lines().find(|l| l.contains(line)).unwrap_or_else(|| panic!("no {line:?} in:\n{log}"));
        assert!(hit.contains("ranks [3] have not sent their part"), "{hit}");
    }
    let zero = log.lines().find(|l| l.contains("rank 0: allreduce #1 stalled")).expect("rank 0 reports");
    assert!(zero.contains("ranks [2] have not sent their part"), "{zero}");
    assert!(!log.contains("rank 3:"), "rank 3 never waited:\n{log}");
    // Reported at 100, 200 and 400 ms, not more often.
    let reports = log.lines().filter(|l| l.contains("rank 2: allreduce #1 stalled")).count();
    assert_eq!(reports, 3, "{log}");
}

#[test]
fn no_report_below_the_threshold_or_when_turned_off() {
    let out = Captured::default();
    let w = out.clone();
    let sub = tracing_subscriber::fmt().with_writer(move || w.clone()).with_ansi(false).finish();
    let _guard = tracing::subscriber::set_default(sub);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let comms = hcomm::local(2);
        comms[0].set_stall_warn(None);
        comms[1].set_stall_warn(Some(Duration::from_secs(5)));
        let res = join_all(comms.iter().enumerate().map(|(r, c)| async move {
            tokio::time::sleep(Duration::from_millis(if r == 0 { 0 } else { 200 })).await;
            c.barrier().await
        }))
        .await;
        res.into_iter().for_each(|r| r.unwrap());
    });
    let log = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
    assert!(!log.contains("stalled"), "{log}");
}

/// A deadline and a stall threshold of `Duration::MAX` mean never: operations still
/// complete, with no overflow, and `None` reads back.
#[test]
fn the_longest_waits_are_never_and_do_not_overflow() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let mut comms = hcomm::local(3);
        for (r, c) in comms.iter_mut().enumerate() {
            match r {
                0 => c.set_timeout(Duration::MAX),
                1 => c.set_timeout(None),
                _ => c.set_timeout(Duration::from_secs(1 << 40)),
            }
            c.set_stall_warn(Some(Duration::MAX));
            assert_eq!(c.timeout(), None);
        }
        let res = join_all(comms.iter().enumerate().map(|(r, c)| async move {
            let mut v = vec![r as f64; 7];
            // Rank 2 comes late: the others' timers are armed while they wait.
            if r == 2 {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            c.all_reduce(&mut v, ReduceOp::Sum).await?;
            match r {
                0 => c.send(1, 5, &v).await?,
                1 => assert_eq!(c.recv::<f64>(0, 5).await?, v),
                _ => {}
            }
            Ok::<_, hcomm::Error>(v)
        }))
        .await;
        for r in res {
            assert_eq!(r.unwrap(), vec![3.0; 7]);
        }
        comms[0].set_timeout(Duration::from_secs(7));
        assert_eq!(comms[0].timeout(), Some(Duration::from_secs(7)));
    });
}

/// A point-to-point receive that waits reports its stall as collectives do (at the
/// threshold, then at twice, four times that), naming the peer and the tag; inside
/// `hcomm::quiet` (a service waiting for its next command) it reports nothing, and
/// its deadline still holds.
#[test]
fn a_waiting_receive_reports_its_stall_unless_quiet() {
    let out = Captured::default();
    let w = out.clone();
    let sub = tracing_subscriber::fmt().with_writer(move || w.clone()).with_ansi(false).finish();
    let _guard = tracing::subscriber::set_default(sub);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let mut comms = hcomm::local(2);
        for c in &mut comms {
            c.set_stall_warn(Some(Duration::from_millis(100)));
        }
        // Rank 1 sends after 450 ms: rank 0's receive reports at 100, 200 and 400 ms.
        let (got, sent) = tokio::join!(comms[0].recv::<u32>(1, 9), async {
            tokio::time::sleep(Duration::from_millis(450)).await;
            comms[1].send(0, 9, &[7u32]).await
        });
        sent.unwrap();
        assert_eq!(got.unwrap(), vec![7]);
        // The same wait, quiet.
        let (got, sent) = tokio::join!(hcomm::quiet(comms[0].recv::<u32>(1, 10)), async {
            tokio::time::sleep(Duration::from_millis(450)).await;
            comms[1].send(0, 10, &[8u32]).await
        });
        sent.unwrap();
        assert_eq!(got.unwrap(), vec![8]);
        // Quiet is not endless: the deadline still ends a receive that never matches.
        comms[0].set_timeout(Duration::from_millis(300));
        let e = hcomm::quiet(comms[0].recv::<u32>(1, 11)).await.unwrap_err();
        assert!(e.is_timeout(), "{e}");
    });
    let log = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
    let reports: Vec<&str> = log.lines().filter(|l| l.contains("stalled")).collect();
    assert_eq!(reports.len(), 3, "{log}");
    for r in &reports {
        assert!(r.contains("rank 0: recv from rank 1 (tag 9) stalled for"), "{r}");
        assert!(r.contains("no matching message has arrived"), "{r}");
    }
}

/// The deadline changes through a shared reference, from another task, for the
/// operations called after the change; one already waiting keeps its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_communicator_changes_its_deadline_for_later_operations() {
    let comms: Vec<std::sync::Arc<_>> = hcomm::local(2).into_iter().map(std::sync::Arc::new).collect();
    let c = comms[0].clone();
    c.set_timeout(Duration::from_millis(200));
    c.set_stall_warn(None);
    assert_eq!(c.stall_warn(), None);
    // Rank 1 never sends tag 7: the receive fails at the deadline it started with,
    // although another task turned the deadline off meanwhile.
    let waiting = tokio::spawn({
        let c = c.clone();
        async move { c.recv::<u8>(1, 7).await }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let other = comms[0].clone();
    tokio::spawn(async move { other.set_timeout(None) }).await.unwrap();
    assert_eq!(c.timeout(), None);
    let e = waiting.await.unwrap().expect_err("the first receive keeps its 200 ms deadline");
    assert!(e.is_timeout(), "{e}");
    // A receive called after the change has no deadline: it is still waiting well
    // after 200 ms, and completes when the message comes.
    let later = tokio::spawn({
        let c = c.clone();
        async move { c.recv::<u8>(1, 8).await }
    });
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(!later.is_finished(), "a receive without a deadline does not time out");
    comms[1].send(0, 8, &[42u8]).await.unwrap();
    assert_eq!(later.await.unwrap().unwrap(), vec![42u8]);
}

/// A deadline for one call (`hcomm::deadline`) overrides the communicator's, for
/// point-to-point operations and collectives alike: shorter, or none at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadline_for_one_call_overrides_the_communicators() {
    let comms: Vec<std::sync::Arc<_>> = hcomm::local(2).into_iter().map(std::sync::Arc::new).collect();
    for c in &comms {
        c.set_stall_warn(None);
    }
    let c = comms[0].clone();
    // Shorter than the communicator's 300 s: a receive and an allreduce rank 1 never
    // joins fail with a timeout error naming the operation.
    let e = hcomm::deadline(Duration::from_millis(100), c.recv::<u8>(1, 7)).await.expect_err("the receive times out");
    assert!(e.is_timeout() && e.op() == Some(hcomm::OpKind::Recv), "{e}");
    let mut v = vec![1.0f32; 3];
    let e = hcomm::deadline(Duration::from_millis(100), c.all_reduce(&mut v, ReduceOp::Sum))
        .await
        .expect_err("the allreduce times out");
    assert!(e.is_timeout() && e.op() == Some(hcomm::OpKind::AllReduce), "{e}");
    // None where the communicator has a short deadline: the receive outlives it and
    // completes when the message comes.
    c.set_timeout(Duration::from_millis(100));
    let later = tokio::spawn({
        let c = c.clone();
        async move { hcomm::deadline(None, c.recv::<u8>(1, 8)).await }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!later.is_finished(), "a receive without a deadline does not time out");
    comms[1].send(0, 8, &[9u8]).await.unwrap();
    assert_eq!(later.await.unwrap().unwrap(), vec![9u8]);
}
