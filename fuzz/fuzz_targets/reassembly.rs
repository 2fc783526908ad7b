//! The RDMA engine's reassembly of chunked messages (stateful, on the heap, no device): fed
//! interleaved first chunks and CONTINUATIONs of a few messages, as decoded by
//! `Header::decode` (what the engine hands it), it agrees at every step with a model: the
//! error a rule-breaking chunk gets, the messages in progress, and each whole message's bytes
//! and header. A message refused for the budget is never delivered.
#![no_main]

use std::collections::HashMap;

use byteexpress_fuzz::Input;
use byteexpress_rpc::fuzzing::{FLAG_MORE, HEADER_LEN, Header, Kind, Reassembler};
use libfuzzer_sys::fuzz_target;

struct Partial {
    first: Header,
    len: usize,
    data: Vec<u8>,
    refused: bool,
}

fuzz_target!(|data: &[u8]| {
    let mut i = Input::new(data);
    let max_message = HEADER_LEN + usize::from(i.u16() % 8192);
    let budget = (i.u8() & 1 == 1).then(|| usize::from(i.u16()));
    let mut r = Reassembler::new(max_message, budget);
    let mut model: HashMap<(u32, u64), Partial> = HashMap::new();
    while !i.is_empty() {
        let op = i.u8();
        let key = (u32::from(op >> 1 & 1), u64::from(op >> 2 & 1));
        let more = op & 8 != 0;
        let first = op & 1 == 0;
        let mut h = Header::new(if first {
            Kind::Request
        } else {
            Kind::Continuation
        });
        (h.conn_id, h.call_id) = key;
        if more {
            h.flags |= FLAG_MORE;
        }
        let n = usize::from(i.u8()) * 4;
        let payload = i.bytes(n).to_vec();
        if first {
            h.meta_len = u32::from(i.u16() % 4096);
            h.body_len = u64::from(i.u16());
            if op & 16 != 0 {
                // a long first chunk (FLAG_LONG, 48-byte header): always over the maximum
                h.body_len += 1 << 32;
            }
        } else {
            h.body_len = payload.len() as u64;
        }
        let mut chunk = h.encode().to_vec();
        chunk.extend_from_slice(&payload);
        // The engine reassembles only what decodes as a chunk.
        let Ok(h) = Header::decode(&chunk) else {
            continue;
        };
        if !h.more() && h.kind != Kind::Continuation {
            continue;
        }
        let got = r.on_chunk(&h, &payload);
        let refused = r.take_refused();
        if first {
            let len = (u64::from(h.meta_len) + h.body_len) as usize;
            if h.message_len() > max_message as u64 {
                assert!(matches!(&got, Err(e) if e.contains("maximum")), "{got:?}");
                return;
            }
            if model.contains_key(&key) {
                assert!(
                    matches!(&got, Err(e) if e.contains("started twice")),
                    "{got:?}"
                );
                return;
            }
            assert_eq!(got, Ok(None));
            assert!(refused.is_empty() || (budget.is_some() && refused == [h]));
            let mut first = h;
            first.flags &= !FLAG_MORE;
            model.insert(
                key,
                Partial {
                    first,
                    len,
                    data: payload,
                    refused: !refused.is_empty(),
                },
            );
        } else {
            assert!(refused.is_empty());
            let Some(p) = model.get_mut(&key) else {
                assert!(
                    matches!(&got, Err(e) if e.contains("never started")),
                    "{got:?}"
                );
                return;
            };
            let have = p.data.len() + payload.len();
            if have > p.len {
                assert!(matches!(&got, Err(e) if e.contains("overruns")), "{got:?}");
                return;
            }
            if !more && have < p.len {
                assert!(
                    matches!(&got, Err(e) if e.contains("ended after")),
                    "{got:?}"
                );
                return;
            }
            p.data.extend_from_slice(&payload);
            if more {
                assert_eq!(got, Ok(None));
            } else {
                let p = model.remove(&key).unwrap();
                match got {
                    Ok(None) => assert!(p.refused, "a whole message was not delivered"),
                    Ok(Some(m)) => {
                        assert!(!p.refused, "a message refused for the budget was delivered");
                        assert_eq!(m.header, p.first);
                        let meta_len = p.first.meta_len as usize;
                        assert_eq!(&m.meta[..], &p.data[..meta_len]);
                        assert_eq!(&m.body[..], &p.data[meta_len..]);
                    }
                    Err(e) => panic!("a well-formed last chunk failed: {e}"),
                }
            }
        }
        assert_eq!(r.in_progress(), model.len());
    }
});
