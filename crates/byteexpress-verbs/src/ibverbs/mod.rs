//! The rdma-core provider (being written).
use crate::{Context, Error, Result};
pub(crate) fn open(_name: &str) -> Result<Context> {
    Err(Error::Unsupported("ibverbs provider not built yet".into()))
}
pub(crate) fn device_names() -> Result<Vec<String>> {
    Err(Error::NoDevice("not built yet".into()))
}
