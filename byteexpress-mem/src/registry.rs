//! The address ranges of every registered chunk of this process, to tell whether bytes the
//! application holds are still the registered buffer they arrived in (zero copy) or a copy.

use std::collections::BTreeMap;

use parking_lot::Mutex;

/// Start address → length in bytes.
static RANGES: Mutex<BTreeMap<usize, usize>> = Mutex::new(BTreeMap::new());

pub(crate) fn add(start: usize, len: usize) {
    RANGES.lock().insert(start, len);
}

pub(crate) fn remove(start: usize) {
    RANGES.lock().remove(&start);
}

/// True when `ptr` points into memory of a live [`crate::Pool`] (or [`crate::BufPool`]) of this
/// process: bytes there were written by the device (or the encoder) in place, not copied out.
pub fn is_pool_memory(ptr: *const u8) -> bool {
    let p = ptr as usize;
    RANGES
        .lock()
        .range(..=p)
        .next_back()
        .is_some_and(|(&s, &len)| p - s < len)
}
