//! The receiving end of a stream (stateful): STREAM_MESSAGE numbers in any order, ends with
//! any count, takes by the application. Against a model: messages come out in number order,
//! each once, none before the headers of its predecessors, the end only after every message
//! it counts; a number received twice fails INTERNAL, a message past the window with bytes
//! outstanding RESOURCE_EXHAUSTED, nothing else fails; the window granted back never exceeds
//! what the application took.
#![no_main]

use std::collections::BTreeSet;

use byteexpress_fuzz::Input;
use byteexpress_rpc::Code;
use byteexpress_rpc::fuzzing::{HEADER_LEN, StreamIn};
use bytes::Bytes;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut i = Input::new(data);
    let window = u64::from(i.u16()) + 1;
    let mut s = StreamIn::new(window);
    let mut received: BTreeSet<u64> = BTreeSet::new();
    let mut next = 0u64; // model: next number the application gets
    let mut buffered = 0u64; // bytes arrived, not yet taken
    let mut taken_cost = 0u64;
    let mut granted = 0u64;
    let mut end_at: Option<u64> = None;
    while !i.is_empty() {
        match i.u8() % 4 {
            0 | 1 => {
                let seq = u64::from(i.u8() % 32);
                let len = usize::from(i.u8());
                let mut body = seq.to_le_bytes().to_vec();
                body.resize(8 + len, 0);
                let cost = (HEADER_LEN + body.len()) as u64;
                let got = s.on_message(seq, Bytes::from(body));
                if end_at.is_some_and(|e| seq >= e) {
                    assert_eq!(got, Ok(()), "past the end: ignored");
                } else if buffered > 0 && buffered + cost > window {
                    assert_eq!(got, Err(Code::ResourceExhausted));
                    return;
                } else if seq < next || received.contains(&seq) {
                    assert_eq!(got, Err(Code::Internal));
                    return;
                } else {
                    assert_eq!(got, Ok(()));
                    received.insert(seq);
                    buffered += cost;
                }
            }
            2 => {
                let count = u64::from(i.u8() % 32);
                s.on_end(count);
                end_at.get_or_insert(count);
            }
            _ => match s.take() {
                Some(Ok(Some(b))) => {
                    let seq = u64::from_le_bytes(b[..8].try_into().unwrap());
                    assert_eq!(seq, next, "delivered in number order");
                    assert!(received.remove(&seq));
                    next += 1;
                    let cost = (HEADER_LEN + b.len()) as u64;
                    buffered -= cost;
                    taken_cost += cost;
                }
                Some(Ok(None)) => {
                    let e = end_at.expect("an end arrived");
                    assert!(next >= e, "end after its {e} messages, {next} taken");
                    assert!(
                        !received.contains(&next),
                        "a message was left before the end"
                    );
                }
                Some(Err(c)) => panic!("take failed {c:?} on a stream that did not fail"),
                None => {
                    assert!(!received.contains(&next), "message {next} is there");
                    assert!(end_at.is_none_or(|e| next < e), "the end is due");
                }
            },
        }
        granted += s.granted();
        assert!(
            granted <= taken_cost,
            "granted {granted} > taken {taken_cost}"
        );
    }
});
