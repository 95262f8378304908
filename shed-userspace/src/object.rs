//! The kernel object embedded at build time (see `build.rs`).
use std::path::Path;

use aya::{Ebpf, EbpfLoader};

use crate::Error;

static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/shed.bpf.o"));

/// The embedded object's bytes; empty when the build had no kernel object.
pub fn bytes() -> &'static [u8] {
    OBJECT
}

/// Sizes of the maps that grow with the host: how many entries they may hold
/// (neither is preallocated, so a larger size costs nothing until used).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MapSizes {
    /// `SHED_SOCKS`: established connections counted (`--max-connections`).
    pub connections: u32,
    /// `SHED_CLIENTS`: clients under a per-client cap (`--max-clients`).
    pub clients: u32,
}

impl Default for MapSizes {
    fn default() -> Self {
        Self { connections: shed_common::capacity::MAX_SOCKS, clients: shed_common::capacity::MAX_CLIENTS }
    }
}

fn loader(sizes: MapSizes) -> EbpfLoader<'static> {
    let mut loader = EbpfLoader::new();
    loader
        .map_max_entries(shed_common::map::SOCKS, sizes.connections)
        .map_max_entries(shed_common::map::CLIENTS, sizes.clients);
    loader
}

/// Loads the embedded object into the kernel (maps created, programs not yet loaded).
pub fn load(sizes: MapSizes) -> Result<Ebpf, Error> {
    if OBJECT.is_empty() {
        return Err(Error::EbpfObjectMissing);
    }
    loader(sizes).load(OBJECT).map_err(|source| Error::Load { source: Box::new(source) })
}

/// Loads an object file from disk instead (tools that build the object
/// themselves, such as `cargo xtask bench`, so they never run a stale copy).
pub fn load_file(path: &Path) -> Result<Ebpf, Error> {
    loader(MapSizes::default()).load_file(path).map_err(|source| Error::Load { source: Box::new(source) })
}
