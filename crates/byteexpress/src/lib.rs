//! ByteExpress facade.
