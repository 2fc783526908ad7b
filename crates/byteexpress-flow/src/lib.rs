//! Flow control for ByteExpress: receiver credits, software window, QP-sharing scheduler (pure, no I/O)
