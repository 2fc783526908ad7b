//! Unit tests of the scheduler: chunking, configuration, DRR by bytes, the capped latency
//! class, the gate, and connection lifecycle.

use byteexpress_flow::sched::{
    Chunk, Chunks, Class, Dropped, Grant, Offer, SchedConfig, SchedError, Scheduler,
};

const KIB: u64 = 1024;

fn yes(_: u32) -> bool {
    true
}

fn sched(quantum: u32, max_chunk: u32, burst: u32) -> Scheduler {
    Scheduler::new(SchedConfig::new(quantum, max_chunk, burst).unwrap())
}

#[test]
fn chunks_cut_at_max_chunk_and_mark_the_last() {
    let c: Vec<Chunk> = Chunks::new(150, 64).collect();
    let want = [(0, 64, false), (64, 64, false), (128, 22, true)];
    assert_eq!(c.len(), 3);
    for (chunk, (offset, len, last)) in c.iter().zip(want) {
        assert_eq!((chunk.offset, chunk.len, chunk.last), (offset, len, last));
    }
    assert_eq!(Chunks::new(128, 64).count(), 2);
    assert_eq!(Chunks::new(0, 64).count(), 0);
    assert_eq!(Chunks::new(5, 0).count(), 5, "max_chunk 0 is taken as 1");
    assert_eq!(Chunks::new(1 << 20, 64 * 1024).size_hint(), (16, Some(16)));
}

#[test]
fn invalid_configurations_are_rejected() {
    assert_eq!(SchedConfig::new(10, 0, 1), Err(SchedError::ZeroChunk));
    assert_eq!(
        SchedConfig::new(10, 11, 1),
        Err(SchedError::QuantumBelowChunk {
            quantum: 10,
            max_chunk: 11
        })
    );
    assert_eq!(
        SchedConfig::new(10, 10, 0),
        Err(SchedError::ZeroLatencyBurst)
    );
    let d = SchedConfig::default();
    assert_eq!(
        (d.quantum(), d.max_chunk(), d.latency_burst()),
        (64 * 1024, 64 * 1024, 8)
    );
}

#[test]
fn large_message_is_granted_in_chunks_in_order() {
    let mut s = Scheduler::new(SchedConfig::default());
    let c = s.open();
    let m = s.enqueue(c, Class::Bulk, 200 * KIB).unwrap();
    let mut offsets = Vec::new();
    while let Some(g) = s.next(yes) {
        assert_eq!((g.conn, g.class, g.msg), (c, Class::Bulk, m));
        offsets.push((g.offset, g.len, g.last));
    }
    assert_eq!(
        offsets,
        [
            (0, 65536, false),
            (65536, 65536, false),
            (131072, 65536, false),
            (196608, 8192, true)
        ]
    );
    assert!(s.is_empty());
}

/// A connection's queue keeps FIFO order and its byte count while it wraps around its
/// storage and grows (also while wrapped), and a close counts what is still queued.
#[test]
fn queue_keeps_fifo_order_through_wraparound_and_growth() {
    let mut s = Scheduler::new(SchedConfig::default());
    let c = s.open();
    let mut queued = std::collections::VecDeque::new();
    let mut len = 1;
    // Rounds of `push` enqueues then `pop` grants: the queue grows to 2, then refills and
    // drains at a standing depth, then grows past several capacities while wrapped.
    for (push, pop) in [(2, 2), (5, 3), (4, 4), (9, 2), (20, 17), (40, 1)] {
        for _ in 0..push {
            queued.push_back((s.enqueue(c, Class::Bulk, len).unwrap(), len));
            len += 1;
        }
        for _ in 0..pop {
            let g = s.next(yes).unwrap();
            let (msg, len) = queued.pop_front().unwrap();
            assert_eq!((g.msg, u64::from(g.len), g.last), (msg, len, true));
        }
        let bytes: u64 = queued.iter().map(|&(_, len)| len).sum();
        assert_eq!(s.queued_bytes(c, Class::Bulk), bytes);
        assert_eq!(s.backlog(Class::Bulk), bytes);
    }
    let bytes = queued.iter().map(|&(_, len)| len).sum();
    let dropped = s.close(c).unwrap();
    assert_eq!(
        dropped,
        Dropped {
            messages: queued.len() as u64,
            bytes
        }
    );
}

#[test]
fn drr_shares_bytes_not_messages() {
    // Conn a sends 1 KiB messages, conn b 16 KiB ones; quantum 16 KiB.
    let mut s = sched(16 * 1024, 16 * 1024, 8);
    let (a, b) = (s.open(), s.open());
    for _ in 0..1000 {
        s.enqueue(a, Class::Bulk, KIB).unwrap();
    }
    for _ in 0..100 {
        s.enqueue(b, Class::Bulk, 16 * KIB).unwrap();
    }
    let (mut bytes_a, mut bytes_b) = (0, 0);
    for _ in 0..170 {
        let g = s.next(yes).unwrap();
        if g.conn == a {
            bytes_a += u64::from(g.len);
        } else {
            bytes_b += u64::from(g.len);
        }
    }
    // 170 grants = 10 rounds of (16 × 1 KiB for a, 1 × 16 KiB for b) + 0.
    assert_eq!((bytes_a, bytes_b), (160 * KIB, 160 * KIB));
}

#[test]
fn latency_message_overtakes_bulk_backlog_after_at_most_one_chunk() {
    let mut s = Scheduler::new(SchedConfig::default());
    let bulk: Vec<_> = (0..3).map(|_| s.open()).collect();
    for &c in &bulk {
        s.enqueue(c, Class::Bulk, 10 << 20).unwrap();
    }
    for _ in 0..5 {
        assert_eq!(s.next(yes).unwrap().class, Class::Bulk);
    }
    let pull = s.open();
    let m = s.enqueue(pull, Class::Latency, 256).unwrap();
    let g = s.next(yes).unwrap();
    assert_eq!((g.msg, g.len, g.last), (m, 256, true));
}

#[test]
fn latency_class_takes_at_most_burst_turns_while_bulk_is_backlogged() {
    let mut s = sched(1000, 1000, 3);
    let (l, b) = (s.open(), s.open());
    for _ in 0..20 {
        s.enqueue(l, Class::Latency, 100).unwrap();
    }
    s.enqueue(b, Class::Bulk, 5000).unwrap();
    let classes: String = (0..12)
        .map(|_| match s.next(yes).unwrap().class {
            Class::Latency => 'L',
            Class::Bulk => 'B',
        })
        .collect();
    assert_eq!(classes, "LLLBLLLBLLLB");
}

#[test]
fn peek_class_names_the_class_of_every_next_grant() {
    let mut s = sched(1000, 1000, 3);
    assert_eq!(s.peek_class(), None);
    let (l, b) = (s.open(), s.open());
    for _ in 0..7 {
        s.enqueue(l, Class::Latency, 100).unwrap();
    }
    s.enqueue(b, Class::Bulk, 5000).unwrap();
    while let Some(class) = s.peek_class() {
        assert_eq!(s.next(yes).unwrap().class, class);
    }
    assert!(s.is_empty());
}

#[test]
fn next_by_class_tells_the_gate_the_class_it_grants_and_a_refusal_changes_nothing() {
    let mut s = sched(1000, 1000, 3);
    let (l, b) = (s.open(), s.open());
    for _ in 0..7 {
        s.enqueue(l, Class::Latency, 100).unwrap();
    }
    s.enqueue(b, Class::Bulk, 5000).unwrap();
    let mut refused = false;
    loop {
        let mut asked = None;
        let g = s.next_by_class(|_, class| {
            asked = Some(class);
            // Refuse every bulk chunk once, as a bulk credit cap would.
            if class == Class::Bulk {
                refused = !refused;
            }
            class == Class::Latency || !refused
        });
        match (g, asked) {
            (Some(g), Some(class)) => assert_eq!(g.class, class),
            (None, Some(Class::Bulk)) => {}
            (None, None) => break,
            other => panic!("{other:?}"),
        }
    }
    assert!(s.is_empty());
}

#[test]
fn latency_class_is_uncapped_when_bulk_is_idle() {
    let mut s = sched(1000, 1000, 2);
    let l = s.open();
    for _ in 0..10 {
        s.enqueue(l, Class::Latency, 100).unwrap();
    }
    for _ in 0..10 {
        assert_eq!(s.next(yes).unwrap().class, Class::Latency);
    }
    assert!(s.next(yes).is_none());
}

#[test]
fn refused_chunk_is_designated_again_and_not_overtaken() {
    let mut s = sched(100, 100, 4);
    let (big, small) = (s.open(), s.open());
    s.enqueue(big, Class::Bulk, 100).unwrap();
    s.enqueue(small, Class::Bulk, 1).unwrap();
    let mut asked = Vec::new();
    assert_eq!(
        s.next(|len| {
            asked.push(len);
            false
        }),
        None
    );
    assert_eq!(
        s.next(|len| len <= 50),
        None,
        "smaller chunk must not overtake"
    );
    assert_eq!(asked, [100]);
    let g: Grant = s.next(yes).unwrap();
    assert_eq!((g.conn, g.len), (big, 100));
    assert_eq!(s.backlog(Class::Bulk), 1);
    assert_eq!(s.next(yes).unwrap().conn, small);
}

#[test]
fn close_drops_queued_bytes_and_invalidates_the_id() {
    let mut s = sched(100, 100, 4);
    let (a, b) = (s.open(), s.open());
    s.enqueue(a, Class::Bulk, 250).unwrap();
    s.enqueue(a, Class::Latency, 10).unwrap();
    s.enqueue(b, Class::Bulk, 30).unwrap();
    assert_eq!(s.next(yes).unwrap().class, Class::Latency);
    let g = s.next(yes).unwrap();
    assert_eq!((g.conn, g.len), (a, 100));
    assert_eq!(s.queued_bytes(a, Class::Bulk), 150);
    assert_eq!(
        s.close(a),
        Ok(Dropped {
            messages: 1,
            bytes: 150
        })
    );
    assert_eq!(s.close(a), Err(SchedError::UnknownConn(a)));
    assert_eq!(
        s.enqueue(a, Class::Bulk, 1),
        Err(SchedError::UnknownConn(a))
    );
    assert_eq!((s.backlog(Class::Bulk), s.backlogged(Class::Bulk)), (30, 1));
    let g = s.next(yes).unwrap();
    assert_eq!((g.conn, g.len), (b, 30));
    // The slot is reused under a new identity.
    let c = s.open();
    assert_eq!(c.index(), a.index());
    assert_ne!(c, a);
    assert!(s.is_empty());
}

#[test]
fn empty_message_is_rejected() {
    let mut s = Scheduler::new(SchedConfig::default());
    let c = s.open();
    assert_eq!(s.enqueue(c, Class::Bulk, 0), Err(SchedError::EmptyMessage));
    assert!(s.is_empty());
}

#[test]
fn offer_on_an_idle_scheduler_ends_a_latency_streak_left_by_a_closed_bulk_backlog() {
    // burst 1: one latency chunk beside a bulk backlog, then bulk's turn.
    let mut s = sched(1000, 1000, 1);
    let (l, b) = (s.open(), s.open());
    s.enqueue(b, Class::Bulk, 5000).unwrap();
    s.enqueue(l, Class::Latency, 10).unwrap();
    assert_eq!(
        s.next(yes).unwrap().class,
        Class::Latency,
        "streak 1 = burst"
    );
    s.close(b).unwrap(); // the bulk backlog goes; nothing is queued now
    assert!(s.is_empty());
    let granted = s.offer(l, Class::Latency, 10, |_, _| true).unwrap();
    assert!(
        matches!(granted, Offer::Granted(_)),
        "bypass on an idle scheduler"
    );
    // As after enqueue + next with no bulk backlog, the streak is over: latency goes first.
    let b2 = s.open();
    s.enqueue(b2, Class::Bulk, 5000).unwrap();
    s.enqueue(l, Class::Latency, 10).unwrap();
    assert_eq!(s.next(yes).unwrap().class, Class::Latency);
}

#[test]
fn a_connection_is_idle_exactly_while_nothing_is_queued_on_it_in_any_class() {
    let mut s = sched(64 * 1024, 64 * 1024, 8);
    let (a, b) = (s.open(), s.open());
    assert!(s.is_idle(a) && s.is_idle(b), "opened with nothing queued");
    s.enqueue(a, Class::Bulk, 100 * KIB).unwrap();
    s.enqueue(b, Class::Latency, KIB).unwrap();
    assert!(!s.is_idle(a) && !s.is_idle(b));
    // The latency message goes first (one grant); `a`'s bulk message takes two chunks.
    assert_eq!(s.next(yes).unwrap().conn, b);
    assert!(s.is_idle(b) && !s.is_idle(a));
    let first = s.next(yes).unwrap();
    assert!(!first.last && !s.is_idle(a), "one chunk still queued");
    assert!(s.next(yes).unwrap().last);
    assert!(s.is_idle(a));
    // A closed connection's id is unknown, so idle.
    s.enqueue(a, Class::Latency, KIB).unwrap();
    s.close(a).unwrap();
    assert!(s.is_idle(a));
}
