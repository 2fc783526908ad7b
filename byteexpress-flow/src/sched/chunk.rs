//! Cutting a message into chunks of at most `max_chunk` bytes.

/// One chunk of a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chunk {
    /// Offset of the chunk in its message (unit: bytes).
    pub offset: u64,
    /// Length of the chunk (unit: bytes); at most `max_chunk`, at least 1.
    pub len: u32,
    /// This chunk ends the message.
    pub last: bool,
}

/// Iterator over the chunks of a message of `len` bytes, each at most `max_chunk` bytes, in
/// order, all full-size but the last. A message of 0 bytes has no chunks.
#[derive(Debug, Clone)]
pub struct Chunks {
    len: u64,
    offset: u64,
    max_chunk: u32,
}

impl Chunks {
    /// Default largest chunk: 64 KiB (unit: bytes).
    pub const DEFAULT_MAX_CHUNK: u32 = 64 * 1024;

    /// The chunks of a `len`-byte message at most `max_chunk` bytes each (0 is taken as 1).
    pub fn new(len: u64, max_chunk: u32) -> Self {
        Self {
            len,
            offset: 0,
            max_chunk: max_chunk.max(1),
        }
    }

    /// The chunk at `offset` of a `len`-byte message (`offset < len`), at most `max_chunk`.
    #[inline]
    pub(crate) fn at(len: u64, offset: u64, max_chunk: u32) -> Chunk {
        let rest = len - offset;
        let chunk = rest.min(u64::from(max_chunk)) as u32;
        Chunk {
            offset,
            len: chunk,
            last: u64::from(chunk) == rest,
        }
    }
}

impl Iterator for Chunks {
    type Item = Chunk;

    fn next(&mut self) -> Option<Chunk> {
        if self.offset >= self.len {
            return None;
        }
        let chunk = Self::at(self.len, self.offset, self.max_chunk);
        self.offset += u64::from(chunk.len);
        Some(chunk)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = (self.len - self.offset).div_ceil(u64::from(self.max_chunk));
        let n = usize::try_from(n).unwrap_or(usize::MAX);
        (n, Some(n))
    }
}
