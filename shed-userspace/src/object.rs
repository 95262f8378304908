//! The kernel object embedded at build time (see `build.rs`).
use std::path::Path;

use aya::{Ebpf, EbpfLoader};

use crate::Error;

static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/shed.bpf.o"));

/// The embedded object's bytes; empty when the build had no kernel object.
pub fn bytes() -> &'static [u8] {
    OBJECT
}

/// Loads the embedded object into the kernel (maps created, programs not yet loaded).
pub fn load() -> Result<Ebpf, Error> {
    if OBJECT.is_empty() {
        return Err(Error::EbpfObjectMissing);
    }
    EbpfLoader::new().load(OBJECT).map_err(|source| Error::Load { source: Box::new(source) })
}

/// Loads an object file from disk instead (tools that build the object
/// themselves, such as `cargo xtask bench`, so they never run a stale copy).
pub fn load_file(path: &Path) -> Result<Ebpf, Error> {
    EbpfLoader::new().load_file(path).map_err(|source| Error::Load { source: Box::new(source) })
}
