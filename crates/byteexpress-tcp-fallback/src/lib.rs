//! Length-prefixed message frames over tokio TCP: the ByteExpress fallback transport
