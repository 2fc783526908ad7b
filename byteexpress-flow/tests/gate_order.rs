//! The admission gates ([`byteexpress_flow::gate`]): one test per gate (its rule at the
//! boundary, read from the flow crate's own accounts, and named by the composition when it is
//! the only one short), the order when several are short, and a property test of the
//! composition against a model written from the module docs' table.

use byteexpress_flow::credit::{CreditConfig, Credits, MsgKind, QueueBudget, QueueConfig};
use byteexpress_flow::gate::{self, Gate, Refusals, Room, admit_chunk, admit_round, admit_update};
use byteexpress_flow::sched::Class;
use byteexpress_flow::window::{DeviceWindow, Window};
use proptest::prelude::*;

/// Room enough for anything: every gate admits `taken` below 8 and chunks of 4 KiB.
fn plenty() -> Room {
    Room {
        sq_slots: 64,
        send_cqes: 64,
        send_bufs: 64,
        credits: 16,
        latency_reserve: 8,
    }
}

/// A QP window capped at `cap` with `in_flight` bytes posted, and a device window capped at
/// `dev_cap` with `dev_in_flight` (an empty account takes any post: the escape).
fn windows(cap: u64, in_flight: u64, dev_cap: u64, dev_in_flight: u64) -> (Window, DeviceWindow) {
    let mut qp = Window::fixed(cap).unwrap();
    let mut dev = DeviceWindow::new(dev_cap).unwrap();
    if in_flight > 0 {
        let _ = qp
            .try_post(&mut DeviceWindow::unlimited(), in_flight)
            .unwrap();
    }
    if dev_in_flight > 0 {
        let _ = Window::fixed(1)
            .unwrap()
            .try_post(&mut dev, dev_in_flight)
            .unwrap();
    }
    assert_eq!(
        (qp.in_flight(), dev.in_flight()),
        (in_flight, dev_in_flight)
    );
    (qp, dev)
}

/// Both phases of one chunk, as a transport's round asks them.
fn admit(
    room: &Room,
    taken: u32,
    class: Class,
    qp: &Window,
    dev: &DeviceWindow,
    bytes: u64,
) -> Result<gate::Admitted, Gate> {
    admit_round(room, taken)?;
    admit_chunk(room, taken, class, qp, dev, bytes)
}

fn roomy_windows() -> (Window, DeviceWindow) {
    windows(1 << 20, 0, 16 << 20, 0)
}

#[test]
fn sq_slot_gate_refuses_when_the_send_queue_holds_the_rounds_chunks_and_the_outstanding_sends() {
    assert_eq!(gate::sq_slot(3, 2), Ok(()));
    assert_eq!(gate::sq_slot(3, 3), Err(Gate::SqSlot));
    // Read from the queue budget: 4 send WRs, a CQ large enough never to limit.
    let mut q = QueueBudget::new(QueueConfig::new(4, 9, 13).unwrap());
    for _ in 0..3 {
        q.try_post_send().unwrap();
    }
    let credits = Credits::new(CreditConfig::new(16).unwrap());
    let room = Room::new(&q, &credits, 64);
    assert_eq!(room.sq_slots, 1);
    assert_eq!(admit_round(&room, 0), Ok(()));
    assert_eq!(admit_round(&room, 1), Err(Gate::SqSlot));
    q.try_post_send().unwrap();
    let room = Room::new(&q, &credits, 64);
    assert_eq!(admit_round(&room, 0), Err(Gate::SqSlot));
    assert_eq!(admit_update(&room), Err(Gate::SqSlot));
}

#[test]
fn cq_entry_gate_refuses_when_a_small_cq_has_no_entry_left_for_a_send_completion() {
    assert_eq!(gate::cq_entry(1, 0), Ok(()));
    assert_eq!(gate::cq_entry(1, 1), Err(Gate::CqEntry));
    // 8 send WRs, but a CQ of 11 with 9 entries reserved for receives: 2 sends fit.
    let mut q = QueueBudget::new(QueueConfig::new(8, 9, 11).unwrap());
    let credits = Credits::new(CreditConfig::new(16).unwrap());
    let room = Room::new(&q, &credits, 64);
    assert_eq!((room.sq_slots, room.send_cqes), (8, 2));
    assert_eq!(admit_round(&room, 1), Ok(()));
    assert_eq!(admit_round(&room, 2), Err(Gate::CqEntry), "SQ slots left");
    q.try_post_send().unwrap();
    q.try_post_send().unwrap();
    let room = Room::new(&q, &credits, 64);
    assert_eq!(admit_update(&room), Err(Gate::CqEntry));
    assert!(!q.can_post_send(), "the queue budget agrees");
}

#[test]
fn send_buf_gate_refuses_when_the_rounds_chunks_hold_every_free_send_buffer() {
    assert_eq!(gate::send_buf(2, 1), Ok(()));
    assert_eq!(gate::send_buf(2, 2), Err(Gate::SendBuf));
    let room = Room {
        send_bufs: 2,
        ..plenty()
    };
    assert_eq!(admit_round(&room, 1), Ok(()));
    assert_eq!(admit_round(&room, 2), Err(Gate::SendBuf));
    assert_eq!(
        admit_update(&Room {
            send_bufs: 0,
            ..plenty()
        }),
        Err(Gate::SendBuf)
    );
}

#[test]
fn credit_gate_refuses_without_a_credit_and_bulk_short_of_the_latency_reserve() {
    assert_eq!(gate::credit(3, 2, 0), Ok(()));
    assert_eq!(gate::credit(3, 3, 0), Err(Gate::Credit));
    assert_eq!(gate::credit(3, 2, 1), Err(Gate::Credit));
    assert_eq!(
        gate::credit(u32::MAX, u32::MAX - 1, u32::MAX),
        Err(Gate::Credit)
    );
    // Read from the credits: a grant of 4 (threshold 2, reserve 2), 2 credits spent.
    let mut credits = Credits::new(CreditConfig::new(4).unwrap());
    credits.try_send_data_batch(2).unwrap();
    let q = QueueBudget::new(QueueConfig::new(64, 5, 69).unwrap());
    let room = Room::new(&q, &credits, 64);
    assert_eq!((room.credits, room.latency_reserve), (2, 2));
    let (qp, dev) = roomy_windows();
    // A latency chunk may take both credits, a bulk chunk neither (the reserve).
    assert!(admit(&room, 1, Class::Latency, &qp, &dev, 100).is_ok());
    assert_eq!(admit_round(&room, 2), Err(Gate::Credit));
    assert_eq!(
        admit(&room, 0, Class::Bulk, &qp, &dev, 100),
        Err(Gate::Credit)
    );
    assert_eq!(credits.can_send_more(1), admit_round(&room, 1).is_ok());
    assert!(!credits.can_send_bulk(), "the credits agree");
    // An update takes no credit: its gates admit it with none left.
    credits.try_send_data_batch(2).unwrap();
    let room = Room::new(&q, &credits, 64);
    assert_eq!(admit_round(&room, 0), Err(Gate::Credit));
    assert_eq!(admit_update(&room), Ok(()));
}

#[test]
fn qp_window_gate_refuses_a_chunk_over_the_qp_cap_unless_the_window_is_empty() {
    assert_eq!(gate::qp_window(0, 100, 500), Ok(true), "escape");
    assert_eq!(gate::qp_window(60, 100, 40), Ok(false));
    assert_eq!(gate::qp_window(60, 100, 41), Err(Gate::QpWindow));
    assert_eq!(gate::qp_window(u64::MAX, u64::MAX, 1), Err(Gate::QpWindow));
    let (qp, dev) = windows(100, 60, 16 << 20, 0);
    assert!(admit(&plenty(), 0, Class::Latency, &qp, &dev, 40).is_ok());
    assert_eq!(
        admit(&plenty(), 0, Class::Latency, &qp, &dev, 41),
        Err(Gate::QpWindow)
    );
    // The same refusal as the window's own post, which charges nothing either.
    let (mut qp, mut dev) = (qp, dev);
    assert!(qp.try_post(&mut dev, 41).is_err());
    assert_eq!(qp.in_flight(), 60);
}

#[test]
fn device_window_gate_refuses_a_chunk_over_the_device_cap_that_the_qp_admits() {
    assert_eq!(gate::device_window(0, 100, 500), Ok(true), "escape");
    assert_eq!(gate::device_window(90, 100, 10), Ok(false));
    assert_eq!(gate::device_window(90, 100, 11), Err(Gate::DeviceWindow));
    // Another QP of the device holds 90 of its 100 bytes; this QP's window is empty.
    let (qp, dev) = windows(1 << 20, 0, 100, 90);
    assert!(admit(&plenty(), 0, Class::Latency, &qp, &dev, 10).is_ok());
    assert_eq!(
        admit(&plenty(), 0, Class::Latency, &qp, &dev, 11),
        Err(Gate::DeviceWindow)
    );
}

#[test]
fn when_several_gates_refuse_the_first_in_the_documented_order_is_named() {
    // Every resource short at once; relieve them one by one in order.
    let (full_qp, full_dev) = windows(100, 100, 100, 100);
    let (room_qp, room_dev) = roomy_windows();
    let mut room = Room {
        sq_slots: 0,
        send_cqes: 0,
        send_bufs: 0,
        credits: 0,
        latency_reserve: 0,
    };
    let mut named = Vec::new();
    let mut refusals = Refusals::default();
    for step in 0..7 {
        let (qp, dev) = match step {
            6 => (&room_qp, &room_dev),
            5 => (&room_qp, &full_dev),
            _ => (&full_qp, &full_dev),
        };
        match admit(&room, 0, Class::Latency, qp, dev, 50) {
            Err(g) => {
                refusals.record(g);
                named.push(g);
            }
            Ok(a) => assert_eq!((a.bytes(), a.over_cap()), (50, false)),
        }
        match step {
            0 => room.sq_slots = 1,
            1 => room.send_cqes = 1,
            2 => room.send_bufs = 1,
            3 => room.credits = 1,
            _ => {}
        }
    }
    assert_eq!(
        named,
        Gate::ALL[..6],
        "the order of Gate::ALL (a SEND's six gates)"
    );
    assert!(
        refusals
            .iter()
            .all(|(g, n)| n == u64::from(g != Gate::ReadDepth))
    );
    assert_eq!(refusals.total(), 6);
    let names: Vec<_> = Gate::ALL.iter().map(|g| g.name()).collect();
    assert_eq!(
        names,
        [
            "sq_slot",
            "cq_entry",
            "send_buf",
            "credit",
            "qp_window",
            "device_window",
            "read_depth"
        ]
    );
}

/// A rendezvous READ passes the SQ slot, the CQ entry, the device's outstanding READs, then
/// the two windows, and names the first that refuses; it needs no send buffer and no credit.
#[test]
fn a_read_names_sq_slot_cq_entry_read_depth_then_the_windows_in_that_order() {
    let (full_qp, full_dev) = windows(100, 100, 100, 100);
    let (room_qp, room_dev) = roomy_windows();
    let mut room = Room {
        sq_slots: 0,
        send_cqes: 0,
        send_bufs: 0,
        credits: 0,
        latency_reserve: 0,
    };
    let mut outstanding = 4;
    let mut named = Vec::new();
    for step in 0..6 {
        let (qp, dev) = match step {
            5 => (&room_qp, &room_dev),
            4 => (&room_qp, &full_dev),
            _ => (&full_qp, &full_dev),
        };
        match gate::admit_read(&room, outstanding, 4, qp, dev, 50) {
            Err(g) => named.push(g),
            Ok(a) => assert_eq!((a.bytes(), a.over_cap()), (50, false)),
        }
        match step {
            0 => room.sq_slots = 1,
            1 => room.send_cqes = 1,
            2 => outstanding = 3,
            _ => {}
        }
    }
    assert_eq!(
        named,
        [
            Gate::SqSlot,
            Gate::CqEntry,
            Gate::ReadDepth,
            Gate::QpWindow,
            Gate::DeviceWindow
        ]
    );
}

#[test]
fn charging_what_the_gates_admitted_is_the_windows_own_post() {
    let (mut qp, mut dev) = windows(1000, 300, 5000, 2000);
    let (mut qp2, mut dev2) = (qp.clone(), dev.clone());
    let a = admit_chunk(&plenty(), 0, Class::Latency, &qp, &dev, 700).unwrap();
    let ticket = qp.charge(&mut dev, a);
    assert_eq!(ticket, qp2.try_post(&mut dev2, 700).unwrap());
    assert_eq!((qp.in_flight(), dev.in_flight()), (1000, 2700));
    assert_eq!(qp.stats(), qp2.stats());
    assert_eq!(dev, dev2);
}

/// The model: the first gate of the docs' table whose rule fails, from the raw counts.
#[allow(clippy::too_many_arguments)]
fn model(
    room: &Room,
    taken: u32,
    class: Class,
    qp: (u64, u64),
    dev: (u64, u64),
    bytes: u64,
) -> Option<Gate> {
    let t = u64::from(taken);
    let reserve = if class == Class::Bulk {
        u64::from(room.latency_reserve)
    } else {
        0
    };
    let window_full = |(in_flight, cap): (u64, u64)| {
        in_flight != 0 && u128::from(in_flight) + u128::from(bytes) > u128::from(cap)
    };
    let refused = [
        u64::from(room.sq_slots) <= t,
        u64::from(room.send_cqes) <= t,
        room.send_bufs as u64 <= t,
        u64::from(room.credits) <= t + reserve,
        window_full(qp),
        window_full(dev),
    ];
    Gate::ALL
        .iter()
        .zip(refused)
        .find(|(_, r)| *r)
        .map(|(g, _)| *g)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    /// The composition names exactly the first gate whose rule fails, in the documented
    /// order, and admits when none does; what it admits, charged, is the window's own post.
    #[test]
    fn the_composition_names_the_first_failing_gate_in_order(
        sq in 0u32..6, cq in 0u32..6, bufs in 0usize..6, credits in 0u32..8,
        reserve in 0u32..4, taken in 0u32..6, bulk: bool,
        qp_cap in 1u64..300, qp_in in prop_oneof![Just(0u64), 1u64..400],
        dev_cap in 1u64..600, dev_extra in prop_oneof![Just(0u64), 1u64..400],
        bytes in 1u64..300,
    ) {
        let class = if bulk { Class::Bulk } else { Class::Latency };
        let room = Room { sq_slots: sq, send_cqes: cq, send_bufs: bufs, credits, latency_reserve: reserve };
        // The device holds the QP's bytes and maybe other QPs'.
        let dev_in = qp_in + dev_extra;
        let (mut qp, mut dev) = windows(qp_cap, qp_in, dev_cap, dev_in);
        let got = admit(&room, taken, class, &qp, &dev, bytes);
        let want = model(&room, taken, class, (qp_in, qp_cap), (dev_in, dev_cap), bytes);
        prop_assert_eq!(got.err(), want);
        if let Ok(a) = got {
            let mut qp2 = qp.clone();
            let mut dev2 = dev.clone();
            let ticket = qp.charge(&mut dev, a);
            prop_assert_eq!(Ok(ticket), qp2.try_post(&mut dev2, bytes).map_err(|_| ()));
            prop_assert_eq!(qp.in_flight(), qp2.in_flight());
            prop_assert_eq!(dev.in_flight(), dev2.in_flight());
        }
    }

    /// Read from live accounts, gates 1-4 agree with the accounts' own checks after any
    /// sequence of posts, completions and credit events: a round admits exactly while the
    /// queue budget has a send slot and the credits a credit for one more.
    #[test]
    fn the_round_gates_agree_with_the_queue_budget_and_the_credits(
        ops in proptest::collection::vec(0u8..4, 0..60),
        grant in 1u32..9,
    ) {
        let cfg = CreditConfig::new(grant).unwrap();
        let mut credits = Credits::new(cfg);
        let mut peer = Credits::new(cfg);
        let rq = cfg.posted_receives();
        let mut q = QueueBudget::new(QueueConfig::new(6, rq, rq + 4).unwrap());
        for op in ops {
            match op {
                0 => if q.can_post_send() && credits.can_send() {
                    q.try_post_send().unwrap();
                    let pb = credits.try_send_data().unwrap();
                    peer.on_receive(MsgKind::Data, pb).unwrap();
                    peer.on_reposted(MsgKind::Data).unwrap();
                },
                1 => { let _ = q.on_send_completion(); }
                _ => if let Some(pb) = peer.try_send_data() {
                    credits.on_receive(MsgKind::Data, pb).unwrap();
                    credits.on_reposted(MsgKind::Data).unwrap();
                },
            }
            let room = Room::new(&q, &credits, 64);
            for taken in 0..4 {
                prop_assert_eq!(
                    admit_round(&room, taken).is_ok(),
                    q.free_sends() > taken && credits.can_send_more(taken)
                );
            }
            prop_assert_eq!(admit_update(&room).is_ok(), q.can_post_send());
        }
    }
}
