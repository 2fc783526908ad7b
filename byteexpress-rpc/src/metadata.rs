//! Call metadata: gRPC's custom metadata (HTTP/2 headers and trailers on the gRPC path).

use bytes::Bytes;

/// Ordered metadata entries. Keys are lowercase ASCII (`a-z 0-9 - _ .`, as gRPC requires);
/// values are bytes (ASCII for ordinary keys, arbitrary for keys ending in `-bin`). A key may
/// repeat. Names reserved by gRPC (`grpc-*`, `:*`, `content-type`, `te`) are the transport's
/// own and are not carried here.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Metadata {
    entries: Vec<(String, Bytes)>,
}

impl Metadata {
    /// Empty metadata.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends an entry. Errors when the key is not a valid gRPC metadata key.
    pub fn insert(
        &mut self,
        key: impl Into<String>,
        value: impl Into<Bytes>,
    ) -> Result<(), String> {
        let key = key.into();
        if !valid_key(&key) {
            return Err(format!("invalid metadata key {key:?}"));
        }
        self.entries.push((key, value.into()));
        Ok(())
    }

    /// First value of `key`.
    pub fn get(&self, key: &str) -> Option<&Bytes> {
        self.entries.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// All entries in order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Bytes)> {
        self.entries.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when there are no entries.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub(crate) fn push_unchecked(&mut self, key: String, value: Bytes) {
        self.entries.push((key, value));
    }
}

/// gRPC metadata key rule: non-empty, `0-9 a-z _ - .`.
pub fn valid_key(key: &str) -> bool {
    !key.is_empty()
        && key
            .bytes()
            .all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'z' | b'_' | b'-' | b'.'))
}
