//! The address ranges of every live pool of this process, to tell whether bytes the application
//! holds are still the registered buffer they arrived in (zero copy) or a copy.

use parking_lot::Mutex;

static RANGES: Mutex<Vec<(usize, usize)>> = Mutex::new(Vec::new());

pub(crate) fn add(start: usize, len: usize) {
    RANGES.lock().push((start, len));
}

pub(crate) fn remove(start: usize) {
    RANGES.lock().retain(|&(s, _)| s != start);
}

/// True when `ptr` points into the memory of a live [`crate::BufPool`] of this process: bytes
/// there were written by the device (or the encoder) in place, not copied out.
pub fn is_pool_memory(ptr: *const u8) -> bool {
    let p = ptr as usize;
    RANGES
        .lock()
        .iter()
        .any(|&(s, len)| (s..s + len).contains(&p))
}
