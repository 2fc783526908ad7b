//! UserRegion: application-owned memory for `Pd::reg_user`.

use crate::provider::SharedMemImpl;
use std::sync::Arc;

/// Source of unique [`UserRegion::id`]s.
pub(crate) static NEXT_REGION_ID: std::sync::atomic::AtomicU64 =
    std::sync::atomic::AtomicU64::new(1);

/// Memory the application owns, for [`Pd::reg_user`](crate::Pd::reg_user): a `Vec<u8>`, `bytes::Bytes`, `Arc<[u8]>`,
/// a mapping handle — any owner whose bytes stay put while it lives. The region holds the owner,
/// and every MR over the region holds the region, so the memory cannot be freed or unmapped
/// while it is registered. Clones share the owner and the [`UserRegion::id`].
///
/// The address is read once, from the owner after it was moved into its final heap place (the
/// rule `bytes::Bytes::from_owner` relies on), and the owner is never touched again except to
/// drop it.
#[derive(Debug, Clone)]
pub struct UserRegion {
    pub(crate) inner: Arc<UserMem>,
}

/// The state behind a [`UserRegion`].
pub(crate) struct UserMem {
    pub(crate) ptr: *mut u8,
    pub(crate) len: usize,
    /// Registration may grant the device write access ([`UserRegion::new_mut`], `from_raw`).
    pub(crate) writable: bool,
    pub(crate) id: u64,
    /// Dropped only after every MR over the region (they hold Arcs of this).
    pub(crate) _owner: Option<Box<dyn std::any::Any + Send + Sync>>,
}

impl std::fmt::Debug for UserMem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UserMem")
            .field("addr", &self.ptr)
            .field("len", &self.len)
            .field("writable", &self.writable)
            .field("id", &self.id)
            .field("owned", &self._owner.is_some())
            .finish()
    }
}

// SAFETY: `ptr` is only passed to the device (registration) and used by the soft provider through
// raw-pointer copies, like any registered memory; the owner itself is `Send + Sync` and is only
// dropped, never accessed.
unsafe impl Send for UserMem {}
// SAFETY: as for Send.
unsafe impl Sync for UserMem {}

impl SharedMemImpl for UserMem {
    fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }
    fn len(&self) -> usize {
        self.len
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

impl UserRegion {
    fn build(
        ptr: *mut u8,
        len: usize,
        writable: bool,
        owner: Option<Box<dyn std::any::Any + Send + Sync>>,
    ) -> UserRegion {
        UserRegion {
            inner: Arc::new(UserMem {
                ptr,
                len,
                writable,
                id: NEXT_REGION_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
                _owner: owner,
            }),
        }
    }

    /// A read-only region over the bytes of `owner` (`owner.as_ref()`): it may be the source of
    /// sends and writes and be read remotely, never written by the device.
    pub fn new<T: AsRef<[u8]> + Send + Sync + 'static>(owner: T) -> UserRegion {
        let owner = Box::new(owner);
        let bytes: &[u8] = (*owner).as_ref();
        let (ptr, len) = (bytes.as_ptr().cast_mut(), bytes.len());
        Self::build(ptr, len, false, Some(owner))
    }

    /// A writable region over the bytes of `owner` (`owner.as_mut()`): registration may also
    /// grant `LOCAL_WRITE`/`REMOTE_WRITE`. The owner is out of reach from then on, so the device
    /// writes into memory no Rust reference points at.
    pub fn new_mut<T: AsMut<[u8]> + Send + Sync + 'static>(owner: T) -> UserRegion {
        let mut owner = Box::new(owner);
        let bytes: &mut [u8] = (*owner).as_mut();
        let (ptr, len) = (bytes.as_mut_ptr(), bytes.len());
        Self::build(ptr, len, true, Some(owner))
    }

    /// A writable region over `[addr, addr + len)` with no owner.
    ///
    /// # Safety
    /// The range must stay mapped, readable and writable, with no Rust reference to it that a
    /// device write could invalidate, until every clone of the region and every MR over it are
    /// dropped.
    pub unsafe fn from_raw(addr: *mut u8, len: usize) -> UserRegion {
        Self::build(addr, len, true, None)
    }

    /// Start address in this process.
    pub fn addr(&self) -> u64 {
        self.inner.ptr as u64
    }

    /// Start of the region, for reading it (or writing, when it is writable and no WR uses it).
    pub fn as_ptr(&self) -> *mut u8 {
        self.inner.ptr
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.inner.len
    }

    /// True when the region has no bytes (it cannot be registered).
    pub fn is_empty(&self) -> bool {
        self.inner.len == 0
    }

    /// True for [`UserRegion::new_mut`] and [`UserRegion::from_raw`] regions.
    pub fn is_writable(&self) -> bool {
        self.inner.writable
    }

    /// Identity of the owner: unique per [`UserRegion::new`] / `new_mut` / `from_raw` call in this
    /// process and shared by clones, so a different owner at the same address has another id.
    pub fn id(&self) -> u64 {
        self.inner.id
    }
}
