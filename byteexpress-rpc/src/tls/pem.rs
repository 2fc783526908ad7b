//! PEM material for TLS configs: given in memory, or read from a file (again whenever the
//! file changes on disk).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use super::TlsError;

/// Where PEM bytes come from.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Source {
    Bytes(Arc<[u8]>),
    File(PathBuf),
}

/// PEM text: bytes given once, or a file read each time the config is (re)built.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Pem(Source);

/// What identifies a file's version on disk: modification time, length and inode. A file
/// replaced (rewritten or renamed over) gets another stamp.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stamp {
    modified: Option<SystemTime>,
    len: u64,
    ino: u64,
}

impl Pem {
    pub(crate) fn bytes(pem: impl AsRef<[u8]>) -> Pem {
        Pem(Source::Bytes(Arc::from(pem.as_ref())))
    }

    pub(crate) fn file(path: impl AsRef<Path>) -> Pem {
        Pem(Source::File(path.as_ref().to_path_buf()))
    }

    /// The file's stamp (`None` for bytes in memory, or a file that cannot be stat'ed now: the
    /// read that follows reports why).
    pub(crate) fn stamp(&self) -> Option<Stamp> {
        use std::os::unix::fs::MetadataExt;
        let Source::File(path) = &self.0 else {
            return None;
        };
        let m = std::fs::metadata(path).ok()?;
        Some(Stamp {
            modified: m.modified().ok(),
            len: m.len(),
            ino: m.ino(),
        })
    }

    /// Whether the PEM is read from a file.
    pub(crate) fn is_file(&self) -> bool {
        matches!(self.0, Source::File(_))
    }

    /// Where the PEM comes from, for messages: the file's path or `"(in memory)"`.
    pub(crate) fn origin(&self) -> String {
        match &self.0 {
            Source::Bytes(_) => "(in memory)".into(),
            Source::File(p) => p.display().to_string(),
        }
    }

    /// The PEM bytes: those given, or the file's (blocking file I/O: call it off the
    /// runtime). Errors: the file cannot be read, or is no regular file.
    fn read(&self) -> Result<Arc<[u8]>, TlsError> {
        match &self.0 {
            Source::Bytes(b) => Ok(b.clone()),
            Source::File(p) => {
                let err = |source| TlsError::Read {
                    path: p.clone(),
                    source,
                };
                // a named pipe or a device would block the open or the read for as long as
                // nobody writes to it
                if !std::fs::metadata(p).map_err(err)?.is_file() {
                    return Err(err(std::io::Error::new(
                        std::io::ErrorKind::InvalidInput,
                        "not a regular file",
                    )));
                }
                std::fs::read(p).map(Arc::from).map_err(err)
            }
        }
    }

    /// Every certificate in the PEM, in order. Errors: unreadable, not PEM, or none found.
    pub(crate) fn certs(&self) -> Result<Vec<CertificateDer<'static>>, TlsError> {
        let bytes = self.read()?;
        let certs = CertificateDer::pem_slice_iter(&bytes)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|source| TlsError::Pem {
                origin: self.origin(),
                source,
            })?;
        if certs.is_empty() {
            return Err(TlsError::NoCertificate(self.origin()));
        }
        Ok(certs)
    }

    /// The first private key in the PEM (PKCS#8, PKCS#1 or SEC1). Errors: unreadable, not
    /// PEM, or no key found.
    pub(crate) fn key(&self) -> Result<PrivateKeyDer<'static>, TlsError> {
        let bytes = self.read()?;
        PrivateKeyDer::from_pem_slice(&bytes).map_err(|source| match source {
            rustls_pki_types::pem::Error::NoItemsFound => TlsError::NoKey(self.origin()),
            source => TlsError::Pem {
                origin: self.origin(),
                source,
            },
        })
    }
}
