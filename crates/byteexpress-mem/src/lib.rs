//! Registered-memory buffer pool for ByteExpress: zero copy between application and NIC
