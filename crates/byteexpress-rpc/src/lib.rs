//! ByteExpress RPC.
