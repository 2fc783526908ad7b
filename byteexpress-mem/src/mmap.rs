//! [`AnonMap`]: an anonymous private mapping owned by a handle, so it can be the owner of a
//! [`byteexpress_verbs::UserRegion`] and stay mapped while an MR (or the [`crate::MrCache`])
//! holds it. It is the verbs crate's one helper for anonymous memory, re-exported here.

pub use byteexpress_verbs::AnonMap;
