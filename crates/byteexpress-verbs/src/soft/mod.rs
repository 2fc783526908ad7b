//! The software provider (being written).
use crate::{Context, Error, Result};
pub(crate) const DEVICE_NAME: &str = "soft0";
pub(crate) fn open() -> Result<Context> {
    Err(Error::Unsupported("soft provider not built yet".into()))
}
