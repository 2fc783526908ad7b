//! A completion slot of the soft ring as read from shared memory the peer writes: a slot the
//! owner accepts names the completion it was read for, has 0/1 flags and a known source, and
//! its canonical words (what an honest peer writes) decode to the same completion and agree
//! with what was read in every word the owner uses.
#![no_main]

use byteexpress_fuzz::Input;
use byteexpress_verbs::fuzzing::decode_comp_slot;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut i = Input::new(data);
    let seq = i.u64();
    let words: [u32; 9] = std::array::from_fn(|_| i.u32());
    let (tag, addr) = (i.u64(), i.u64());
    let Some(c) = decode_comp_slot(seq, words, tag, addr) else {
        return;
    };
    let [
        opcode,
        status,
        byte_len,
        has_imm,
        imm,
        src,
        key,
        has_inv,
        inv,
    ] = words;
    assert_eq!(tag, seq.wrapping_add(1), "names the completion read");
    assert!(has_imm <= 1 && has_inv <= 1 && src <= 2);
    let canon_words = [c[0], c[1], c[2], c[3], c[4], c[5], c[7], c[9], c[10]].map(|w| w as u32);
    assert_eq!(
        decode_comp_slot(seq, canon_words, c[6], c[8]),
        Some(c),
        "idempotent"
    );
    assert_eq!(
        (c[0], c[1], c[2], c[3], c[5], c[6], c[9]),
        (
            opcode.into(),
            status.into(),
            byte_len.into(),
            has_imm.into(),
            src.into(),
            tag,
            has_inv.into()
        )
    );
    if has_imm == 1 {
        assert_eq!(c[4], u64::from(imm));
    }
    if has_inv == 1 {
        assert_eq!(c[10], u64::from(inv));
    }
    if src == 1 {
        assert_eq!(c[7], u64::from(key));
    }
    if src != 0 {
        assert_eq!(c[8], addr);
    }
});
