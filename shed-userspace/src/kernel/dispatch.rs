// SPDX-License-Identifier: MIT OR Apache-2.0
//! The node agent's one set of socket-tracepoint programs for all its pods'
//! gates (see [`shed_common::dispatch`]): [`Dispatcher::start`] attaches the
//! dispatchers once, [`Dispatcher::add`] hands a pod's namespace to its
//! gate's accounting programs, and the [`Dispatched`] it returns takes them
//! back when dropped (the pod went, or its gate ended).
use std::{
    collections::BTreeSet,
    sync::{Arc, Mutex, PoisonError},
};

use aya::{
    Ebpf,
    maps::{Array, HashMap, MapData, ProgramArray},
    programs::RawTracePoint,
};
use shed_common::{NetnsFilter, dispatch, dispatch::DispatchBooks, map, program};

use crate::{
    error::Error,
    host::system,
    kernel::{object, programs::Loaded},
};

/// The dispatchers, attached; their tables, written as gates come and go.
pub struct Dispatcher {
    tables: Mutex<Tables>,
}

struct Tables {
    /// The object whose programs are attached: their links live as long as it.
    _ebpf: Ebpf,
    targets: ProgramArray<MapData>,
    netns: HashMap<MapData, u32, u32>,
    /// The pods' connections being followed, each with its gate's number.
    socks: HashMap<MapData, u64, u32>,
    /// Each gate's followed and unfollowed connections.
    books: Array<MapData, DispatchBooks>,
    /// Gate numbers not in use.
    free: BTreeSet<u32>,
}

impl Dispatcher {
    /// Loads the dispatchers and attaches them to the socket tracepoints of
    /// the host (every namespace's sockets pass them); `connections`: the
    /// pods' connections it can follow at once (the node's `--max-connections`).
    pub fn start(connections: u32) -> Result<Self, Error> {
        let unable = |what: String| Error::Dispatch { what };
        // Where a socket keeps its namespace: the dispatcher hands over by it.
        let filter = system::netns_filter().map_err(|why| unable(format!("tell namespaces apart: {why}")))?;
        let mut ebpf = object::load(object::LoadOptions::dispatcher(connections))?;
        let mut take =
            |name: &str| ebpf.take_map(name).ok_or_else(|| unable(format!("find map {name} in the kernel object")));
        let mut offsets: Array<MapData, NetnsFilter> =
            Array::try_from(take(map::NETNS)?).map_err(|e| Error::map("open the dispatcher's namespace offsets", e))?;
        let targets = ProgramArray::try_from(take(map::DISPATCH_TARGETS)?)
            .map_err(|e| Error::map("open the dispatcher's targets", e))?;
        let netns = HashMap::try_from(take(map::DISPATCH_NETNS)?)
            .map_err(|e| Error::map("open the dispatcher's namespaces", e))?;
        let socks = HashMap::try_from(take(map::DISPATCH_SOCKS)?)
            .map_err(|e| Error::map("open the dispatcher's connections", e))?;
        let books =
            Array::try_from(take(map::DISPATCH_BOOKS)?).map_err(|e| Error::map("open the dispatcher's books", e))?;
        offsets.set(0, filter, 0).map_err(|e| Error::map("write the dispatcher's namespace offsets", e))?;
        for (name, event, _) in program::DISPATCHERS {
            let prog: &mut RawTracePoint = ebpf
                .program_mut(name)
                .ok_or_else(|| unable(format!("find program {name} in the kernel object")))?
                .try_into()
                .map_err(|e| Error::program(format!("open program {name}"), e))?;
            crate::kernel::programs::verified(|| prog.load()).map_err(|e| Error::program(format!("load {name}"), e))?;
            prog.attach(event).map_err(|e| Error::program(format!("attach {name} to sock:{event}"), e))?;
        }
        let free = (0..dispatch::GATES).collect();
        Ok(Self { tables: Mutex::new(Tables { _ebpf: ebpf, targets, netns, socks, books, free }) })
    }

    /// Hands the connections of namespace `inum` to `loaded`'s accounting
    /// programs (loaded, not attached). Nothing is changed on an error.
    pub fn add(self: &Arc<Self>, loaded: &mut Loaded, inum: u32) -> Result<Dispatched, Error> {
        let unable = |what: String| Error::Dispatch { what };
        let programs = loaded.accounting_programs()?;
        let mut tables = self.tables.lock().unwrap_or_else(PoisonError::into_inner);
        if tables.netns.get(&inum, 0).is_ok() {
            return Err(unable(format!("hand over namespace {inum}: another gate has it")));
        }
        let gate = tables
            .free
            .pop_first()
            .ok_or_else(|| unable(format!("take another gate: all {} are in use", dispatch::GATES)))?;
        let mut written = Vec::new();
        let mut wrote = || -> Result<(), Error> {
            for (event, fd) in (0..).zip(&programs) {
                let index = dispatch::target(gate, event);
                tables.targets.set(index, fd, 0).map_err(|e| Error::map("write a dispatcher target", e))?;
                written.push(index);
            }
            // Last: the dispatcher hands nothing over before every program is in place.
            tables.netns.insert(inum, gate, 0).map_err(|e| Error::map("write a dispatched namespace", e))
        };
        if let Err(e) = wrote() {
            for index in written {
                let _ = tables.targets.clear_index(&index);
            }
            tables.free.insert(gate);
            return Err(e);
        }
        Ok(Dispatched { dispatcher: Arc::clone(self), gate, inum })
    }

    /// The pods' connections followed now (each until its close): what the
    /// node's `--max-connections` bounds.
    pub fn followed(&self) -> usize {
        let tables = self.tables.lock().unwrap_or_else(PoisonError::into_inner);
        tables.socks.keys().flatten().count()
    }

    /// `gate`'s books: its connections followed now, and those it was not
    /// (its quota, a quarter of `--max-connections`, reached, or the table full).
    pub fn books(&self, gate: u32) -> DispatchBooks {
        let tables = self.tables.lock().unwrap_or_else(PoisonError::into_inner);
        tables.books.get(&gate, 0).unwrap_or_default()
    }

    /// Gates handed connections now.
    pub fn gates(&self) -> usize {
        dispatch::GATES as usize - self.tables.lock().unwrap_or_else(PoisonError::into_inner).free.len()
    }
}

/// A namespace handed to a gate's programs, until dropped.
pub struct Dispatched {
    dispatcher: Arc<Dispatcher>,
    gate: u32,
    inum: u32,
}

impl Dispatched {
    /// The gate's number at the dispatcher.
    pub fn gate(&self) -> u32 {
        self.gate
    }
}

impl Drop for Dispatched {
    fn drop(&mut self) {
        let mut tables = self.dispatcher.tables.lock().unwrap_or_else(PoisonError::into_inner);
        // The namespace first: no new connection is handed over, then no event.
        if tables.netns.get(&self.inum, 0).ok() == Some(self.gate) {
            let _ = tables.netns.remove(&self.inum);
        }
        for event in 0..dispatch::EVENTS {
            let _ = tables.targets.clear_index(&dispatch::target(self.gate, event));
        }
        // The gate's sockets still listed (closing with their namespace)
        // name a number without programs until it is reused, and then find
        // nothing in the new gate's own maps.
        tables.free.insert(self.gate);
    }
}
