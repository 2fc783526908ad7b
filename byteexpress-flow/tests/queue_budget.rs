//! Unit tests of the send-slot and CQ-entry accounting ([`QueueBudget`]).

use byteexpress_flow::credit::{QueueBudget, QueueConfig, QueueError};

#[test]
fn invalid_sizes_are_rejected() {
    assert_eq!(QueueConfig::new(0, 9, 20), Err(QueueError::ZeroDepth));
    assert_eq!(QueueConfig::new(4, 0, 20), Err(QueueError::ZeroDepth));
    assert_eq!(
        QueueConfig::new(4, 9, 9),
        Err(QueueError::CqTooSmall {
            cq_size: 9,
            rq_depth: 9
        })
    );
}

#[test]
fn sends_stop_at_the_sq_depth_with_a_full_size_cq() {
    let cfg = QueueConfig::new(4, 9, 13).unwrap();
    assert_eq!(cfg.send_limit(), 4);
    let mut q = QueueBudget::new(cfg);
    for _ in 0..4 {
        assert!(q.can_post_send());
        q.try_post_send().unwrap();
    }
    assert!(!q.can_post_send());
    assert_eq!(q.try_post_send(), Err(QueueError::SendFull));
    assert_eq!(q.send_blocked(), 1);
    assert_eq!(q.sends_outstanding(), 4);
    q.on_send_completion().unwrap();
    assert!(q.can_post_send());
}

#[test]
fn a_small_cq_caps_sends_and_keeps_receive_entries_reserved() {
    // 9 receives and 2 sends fill a CQ of 11: the CQ, not the SQ of 8, limits sends.
    let cfg = QueueConfig::new(8, 9, 11).unwrap();
    assert_eq!(cfg.send_limit(), 2);
    let mut q = QueueBudget::new(cfg);
    q.try_post_send().unwrap();
    q.try_post_send().unwrap();
    assert_eq!(q.try_post_send(), Err(QueueError::SendFull));
    // Every receive still finds its entry.
    for _ in 0..9 {
        q.try_post_recv().unwrap();
    }
    assert_eq!(q.try_post_recv(), Err(QueueError::RecvFull));
    assert_eq!(q.cqes_owed(), 11);
    q.on_recv_completion().unwrap();
    assert_eq!(q.cqes_owed(), 10);
    assert!(
        !q.can_post_send(),
        "a receive completion frees a receive entry only"
    );
    q.try_post_recv().unwrap();
}

#[test]
fn completions_without_posts_are_errors_and_change_nothing() {
    let mut q = QueueBudget::new(QueueConfig::new(2, 3, 5).unwrap());
    assert_eq!(q.on_send_completion(), Err(QueueError::NoSendOutstanding));
    assert_eq!(q.on_recv_completion(), Err(QueueError::NoRecvPosted));
    assert_eq!((q.sends_outstanding(), q.recvs_posted()), (0, 0));
}

#[test]
fn a_signaled_completion_frees_the_slots_and_cq_entries_of_the_unsignaled_sends_it_covers() {
    let mut q = QueueBudget::new(QueueConfig::new(4, 3, 7).unwrap());
    for _ in 0..4 {
        q.try_post_send().unwrap();
    }
    // Each send keeps a CQ entry reserved, signaled or not (a failure flushes them all).
    assert_eq!((q.sq_free(), q.send_cqes_free(), q.cqes_owed()), (0, 0, 4));
    assert_eq!(
        q.on_send_completions(5),
        Err(QueueError::NoSendOutstanding),
        "more than are outstanding"
    );
    assert_eq!(q.sends_outstanding(), 4, "nothing freed on error");
    q.on_send_completions(3).unwrap();
    assert_eq!((q.sq_free(), q.send_cqes_free(), q.cqes_owed()), (3, 3, 1));
    q.on_send_completions(1).unwrap();
    assert_eq!(q.sends_outstanding(), 0);
}
