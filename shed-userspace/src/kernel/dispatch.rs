// SPDX-License-Identifier: MIT OR Apache-2.0
//! The node agent's one set of socket-tracepoint programs for all its pods'
//! gates (see [`shed_common::dispatch`]): [`Dispatcher::start`] attaches the
//! dispatchers once, [`Dispatcher::add`] hands a pod's namespace to its
//! gate, and the [`Dispatched`] it returns takes it back when dropped (the
//! pod went, or its gate ended).
//!
//! A shared dispatcher ([`Dispatcher::start_shared`]) also judges: its TC
//! program, verified once, gates every pod ([`Dispatcher::attach_tc`]), and
//! its dispatchers count for every pod themselves. A pod brings only its maps
//! ([`Loaded::maps_only`]), which `add` puts in the object's arrays of maps at
//! the pod's gate number. Otherwise each pod's gate loads its own programs,
//! and the dispatchers tail-call its accounting programs.
use std::{
    collections::BTreeSet,
    os::fd::AsFd as _,
    sync::{Arc, Condvar, Mutex, PoisonError},
    time::Duration,
};

use aya::{
    Ebpf,
    maps::{Array, HashMap, MapData, ProgramArray},
    programs::{RawTracePoint, TcAttachType, links::FdLink, tc::SchedClassifierLink},
};
use shed_common::{NetnsFilter, dispatch, dispatch::DispatchBooks, map, program};

use crate::{
    error::Error,
    host::{rcu::Expedite, system},
    kernel::{
        handover::{self, Inherited, Leaving, Left, PodLink},
        maps as kernel_maps, object,
        programs::{Loaded, SharedJudge},
    },
};

/// The kernel programs' log records, as aya-log reads them into this process's log.
pub type KernelLogger = aya_log::EbpfLogger<&'static dyn log::Log>;

/// The dispatchers, attached; their tables, written as gates come and go.
pub struct Dispatcher {
    tables: Mutex<Tables>,
    /// The object whose programs are attached. A lock of its own: a TC
    /// attachment waits out an RCU grace period under the kernel's rtnl lock
    /// (a burst of pods' set-ups, hundreds of ms each), and pods' set-ups,
    /// `followed` and the agent's looks must not queue behind it for `tables`.
    object: Mutex<Ebpf>,
    /// A shared object's pods' maps by gate ([`Self::start_shared`]): fixed
    /// at the start, read without a lock.
    shared: Option<Shared>,
    /// The pods' turns at attaching the shared TC program.
    turns: Turns,
    /// Set once this agent leaves its shared object to its successor.
    leaving: Leaving,
    /// What the agents before this one left it (a shared object's only).
    inherited: Inherited,
}

struct Tables {
    /// Its programs' log records (`--kernel-log`), until the agent takes them to forward.
    logger: Option<KernelLogger>,
    /// The dispatchers' links, by program: detached when dropped, unless left for a successor.
    tracepoints: Vec<(&'static str, FdLink)>,
    /// Where the programs find namespaces (and the lease of a shared object left behind).
    offsets: Array<MapData, NetnsFilter>,
    targets: ProgramArray<MapData>,
    netns: HashMap<MapData, u32, u32>,
    /// The pods' connections being followed, each with its gate's number.
    socks: HashMap<MapData, u64, u32>,
    /// Each gate's followed and unfollowed connections.
    books: Array<MapData, DispatchBooks>,
    /// Gate numbers not in use.
    free: BTreeSet<u32>,
}

/// The pods' turns at attaching: each pod's interfaces one after another
/// (a pod is gated once its last is), the pods in the order they asked. Each
/// attachment waits out an RCU grace period under the kernel's rtnl lock, so
/// a burst of pods queues here; a plain lock would let newcomers in first
/// and leave an early pod waiting for the whole burst.
/// While a pod waits behind another, the kernel's grace periods are
/// expedited ([`Expedite`]): the line moves at tens of µs an attachment
/// instead of 10-30 ms.
#[derive(Default)]
struct Turns {
    line: Mutex<Line>,
    next: Condvar,
}

#[derive(Default)]
struct Line {
    /// The next ticket to give.
    given: u64,
    /// The ticket whose turn it is.
    serving: u64,
    /// Expedited grace periods while pods wait in line; None with `--no-expedite-rcu`.
    expedite: Option<Expedite>,
}

impl Turns {
    fn expedited(expedite: Expedite) -> Self {
        Self { line: Mutex::new(Line { expedite: Some(expedite), ..Line::default() }), ..Self::default() }
    }

    /// Waits for the caller's turn, which lasts until what it returns is dropped.
    fn wait(&self) -> Turn<'_> {
        let mut line = self.line.lock().unwrap_or_else(PoisonError::into_inner);
        let mine = line.given;
        line.given += 1;
        // Someone attaching ahead of this pod: a burst.
        if line.given - line.serving > 1
            && let Some(expedite) = &mut line.expedite
        {
            expedite.on();
        }
        while line.serving != mine {
            line = self.next.wait(line).unwrap_or_else(PoisonError::into_inner);
        }
        Turn(self)
    }
}

/// A turn of [`Turns`]: the next ticket's once dropped, however its holder ends.
struct Turn<'a>(&'a Turns);

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        let mut line = self.0.line.lock().unwrap_or_else(PoisonError::into_inner);
        line.serving += 1;
        // Nobody left in line.
        if line.serving == line.given
            && let Some(expedite) = &mut line.expedite
        {
            expedite.off();
        }
        drop(line);
        self.0.next.notify_all();
    }
}

/// A shared object's tables of its pods: each gated map's array of the
/// pods' own (`map::GATED`'s order), by name (their gates by namespace are
/// the tables' `netns`).
struct Shared {
    arrays: Vec<(&'static str, MapData)>,
}

impl SharedJudge for Dispatcher {
    /// Attaches the shared object's TC program to `ifaces` of this thread's
    /// namespace, one after another in the pod's turn (see [`Turns`]);
    /// each detached when what it returns is dropped. A link the last agent
    /// left on an interface is taken over instead: its program replaced with
    /// this one's, atomically.
    fn attach_tc(&self, ifaces: &[&str]) -> Result<Vec<Box<dyn Send>>, Error> {
        if self.shared.is_none() {
            return Err(Error::Dispatch {
                what: format!("attach to {}: the dispatcher's object does not judge", ifaces.join(", ")),
            });
        }
        // Checked before the turn: it is for the kernel's attachments alone.
        let names = ifaces
            .iter()
            .map(|iface| system::check_interface(iface).and_then(|()| handover::pod_link_name(iface)))
            .collect::<Result<Vec<_>, Error>>()?;
        let _turn = self.turns.wait();
        let mut object = self.object.lock().unwrap_or_else(PoisonError::into_inner);
        ifaces.iter().zip(names).map(|(iface, name)| self.attach_one(&mut object, iface, &name)).collect()
    }
}

impl Dispatcher {
    /// [`SharedJudge::attach_tc`] for one interface, `name`d for the handover.
    fn attach_one(&self, object: &mut Ebpf, iface: &str, name: &str) -> Result<Box<dyn Send>, Error> {
        let prog = Loaded::loaded_tc(object)?;
        // Still pinned while taken over: a take-over that fails leaves it
        // judging until the new link is attached.
        let mut left = self.inherited.take(name);
        let taken = left.as_mut().and_then(Left::link).and_then(|link| {
            SchedClassifierLink::try_from(link)
                .map_err(|e| Error::Dispatch { what: format!("take over the last agent's TC link of {iface}: {e}") })
                .and_then(|link| {
                    prog.attach_to_link(link)
                        .map_err(|e| Error::program(format!("take over the last agent's TC link of {iface}"), e))
                })
                .map_err(|e| tracing::warn!("{}: attached anew", crate::error::chain(&e)))
                .ok()
        });
        let id = match taken {
            Some(id) => {
                tracing::info!(iface = %iface, "took over the last agent's TC link: judged throughout");
                id
            }
            None => prog
                .attach(iface, TcAttachType::Ingress)
                .map_err(|e| Error::program(format!("attach the shared TC program to {iface}"), e))?,
        };
        let link = prog.take_link(id).map_err(|e| Error::program(format!("hold the TC link of {iface}"), e))?;
        let link = FdLink::try_from(link)
            .map_err(|e| Error::Dispatch { what: format!("hold the TC link of {iface} as a BPF link: {e}") })?;
        if let Some(left) = left {
            left.done();
        }
        Ok(Box::new(PodLink::new(link, name.to_owned(), self.leaving.clone())))
    }
}

/// Loads `wanted` of `ebpf`'s programs, each on a thread of its own.
fn load_side_by_side(ebpf: &mut Ebpf, wanted: &[&str]) -> Result<(), Error> {
    use aya::programs::Program;
    std::thread::scope(|scope| {
        let loading: Vec<_> = ebpf
            .programs_mut()
            .filter(|(name, _)| wanted.contains(name))
            .map(|(name, prog)| {
                scope.spawn(move || {
                    let loaded = match prog {
                        Program::SchedClassifier(p) => crate::kernel::programs::verified(|| p.load()),
                        Program::RawTracePoint(p) => crate::kernel::programs::verified(|| p.load()),
                        _ => Ok(()),
                    };
                    loaded.map_err(|e| Error::program(format!("load {name}"), e))
                })
            })
            .collect();
        loading.into_iter().try_for_each(|t| t.join().unwrap_or_else(|_| Ok(())))
    })
}

/// Sets (`Some`, in `arrays`' order) or deletes entry `gate` of every
/// array, side by side: the kernel waits out an RCU grace period in each,
/// and waits that overlap end together (one after another, 21 of them held
/// up a pod's set-up, and with it every other pod's, by a third of a second).
fn set_all(
    arrays: &[(&'static str, MapData)],
    gate: u32,
    inner: Option<&[(&'static str, MapData)]>,
) -> Result<(), Error> {
    std::thread::scope(|scope| {
        let running: Vec<_> = arrays
            .iter()
            .enumerate()
            .map(|(i, (of, fd))| {
                let inner = inner.map(|maps| maps[i].1.fd().as_fd());
                scope.spawn(move || {
                    kernel_maps::set_index(fd.fd().as_fd(), gate, inner)
                        .map_err(|e| Error::io("put a pod's map in the shared object's", of, e))
                })
            })
            .collect();
        running.into_iter().map(|t| t.join().unwrap_or_else(|_| Ok(()))).collect::<Result<Vec<()>, Error>>()
    })
    .map(drop)
}

impl Dispatcher {
    /// Loads the dispatchers and attaches them to the socket tracepoints of
    /// the host (every namespace's sockets pass them); `connections`: the
    /// pods' connections it can follow at once (the node's `--max-connections`).
    pub fn start(connections: u32) -> Result<Self, Error> {
        Self::started(connections, false, false, false)
    }

    /// [`Self::start`], as the shared object that judges and counts for
    /// every pod itself (its TC program verified now, once); with
    /// `kernel_log`, its programs' rare paths are logged
    /// ([`Self::take_kernel_log`]); with `expedite_rcu`, a burst of pods
    /// waiting to attach has the kernel's grace periods expedited ([`Turns`]).
    pub fn start_shared(connections: u32, kernel_log: bool, expedite_rcu: bool) -> Result<Self, Error> {
        Self::started(connections, true, kernel_log, expedite_rcu)
    }

    fn started(connections: u32, shared: bool, kernel_log: bool, expedite_rcu: bool) -> Result<Self, Error> {
        let unable = |what: String| Error::Dispatch { what };
        // Where a socket keeps its namespace: the dispatcher hands over by it.
        let filter = system::netns_filter().map_err(|why| unable(format!("tell namespaces apart: {why}")))?;
        if shared && (filter.skb_dev_offset == 0 || filter.dev_net_offset == 0) {
            return Err(unable(
                "judge for every pod: the kernel's BTF lacks sk_buff.dev or net_device.nd_net, by which the shared \
                 TC program tells a packet's namespace"
                    .into(),
            ));
        }
        let mut ebpf = object::load(object::LoadOptions::dispatcher(connections, shared, kernel_log))?;
        // Its records' ring, taken before anything is attached (said if unavailable).
        let logger = kernel_log
            .then(|| {
                aya_log::EbpfLogger::init(&mut ebpf)
                    .map_err(|e| {
                        tracing::warn!(
                            "kernel log of the shared programs unavailable ({e}): the rare paths are still counted in stats"
                        );
                    })
                    .ok()
            })
            .flatten();
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
        let shared = if shared {
            let arrays = map::GATED
                .iter()
                // Held as long as the object: its programs, loaded later, name it by this descriptor.
                .map(|&(_, of)| match take(of)? {
                    aya::maps::Map::ArrayOfMaps(data) => Ok((of, data)),
                    _ => Err(unable(format!("open map {of}: not an array of maps"))),
                })
                .collect::<Result<Vec<_>, Error>>()?;
            Some(Shared { arrays })
        } else {
            None
        };
        // Its programs through the verifier side by side (one per CPU at
        // once, see `verified`): the agent's start, and every pod's gate,
        // wait for them. All before any attaches: a kernel that refuses one
        // leaves nothing attached.
        let mut wanted: Vec<&str> = program::DISPATCHERS.iter().map(|&(name, _, _)| name).collect();
        if shared.is_some() {
            wanted.extend([program::TC, program::TC_TURN]);
        }
        load_side_by_side(&mut ebpf, &wanted)?;
        if shared.is_some() {
            // The judge's turn program where its tail call finds it.
            Loaded::install_tc_turn(&mut ebpf)?;
        }
        let mut tracepoints = Vec::new();
        for (name, event, _) in program::DISPATCHERS {
            let prog: &mut RawTracePoint = ebpf
                .program_mut(name)
                .ok_or_else(|| unable(format!("find program {name} in the kernel object")))?
                .try_into()
                .map_err(|e| Error::program(format!("open program {name}"), e))?;
            let id = prog.attach(event).map_err(|e| Error::program(format!("attach {name} to sock:{event}"), e))?;
            let link = prog.take_link(id).map_err(|e| Error::program(format!("hold the link of {name}"), e))?;
            tracepoints.push((name, FdLink::from(link)));
        }
        let free = (0..dispatch::GATES).collect();
        // Only a shared object takes the last agent's pods over; without one,
        // its programs judge beside each pod's own until their lease is up
        // (detaching them now would leave every pod ungated until its own
        // programs are verified, a second or so each).
        let inherited = Inherited::find();
        let tables = Tables { logger, tracepoints, offsets, targets, netns, socks, books, free };
        let turns = if shared.is_some() {
            // Whether or not this agent expedites: one that died holding the switch on left it so.
            let expedite = Expedite::system();
            expedite.recover();
            if expedite_rcu { Turns::expedited(expedite) } else { Turns::default() }
        } else {
            Turns::default()
        };
        Ok(Self {
            tables: Mutex::new(tables),
            object: Mutex::new(ebpf),
            shared,
            turns,
            leaving: Leaving::default(),
            inherited,
        })
    }

    /// Leaves the shared object running for the next agent (on SIGTERM: a
    /// restart or a rolling update): its turn programs' array and its
    /// dispatchers' links pinned now, and each pod's TC link as its gate
    /// ends, instead of detached; its lease set for `lease` (the agent's
    /// [`handover::HANDOVER_LEASE`]), after which it judges nothing. A
    /// dispatcher that does not judge leaves nothing; one that cannot leave
    /// everything takes back what it left (every pod is detached as its gate
    /// ends, as without a handover).
    pub fn leave_for_successor(&self, lease: Duration) -> Result<(), Error> {
        if self.shared.is_none() {
            return Ok(());
        }
        // The object first: waiting there (a pod's attachments in their turn)
        // holds up no pod's set-up, which needs only the tables.
        let object = self.object.lock().unwrap_or_else(PoisonError::into_inner);
        let mut tables = self.tables.lock().unwrap_or_else(PoisonError::into_inner);
        // Every dispatcher, or a left pod's counts would miss its events (a
        // second SIGTERM after a failed leave holds fewer).
        if tables.tracepoints.len() != program::DISPATCHERS.len() {
            return Err(Error::Dispatch {
                what: "leave for the next agent: a dispatcher is no longer attached".into(),
            });
        }
        let until = system::monotonic_ns() + u64::try_from(lease.as_nanos()).unwrap_or(u64::MAX / 2);
        let dir = Leaving::prepare(until)?;
        if let Err(e) = Self::leave_in(&mut tables, &object, &dir, until) {
            // Taken back: the dispatchers keep counting while the pods' gates end.
            for (name, ..) in program::DISPATCHERS {
                if let Some(link) = handover::take_back(&dir.join(handover::dispatcher_pin(name))) {
                    tables.tracepoints.push((name, link));
                }
            }
            let _ = std::fs::remove_dir_all(&dir);
            return Err(e);
        }
        self.leaving.start(dir);
        tracing::info!(
            lease_s = lease.as_secs(),
            "leaving every pod judged for the next agent: it takes each over, or they pass everything once the lease is up"
        );
        Ok(())
    }

    /// Leases the object until `until` (ns), then pins in `dir` what the
    /// pods' TC links need besides the object's maps, which its programs
    /// hold: the turn programs' array (the kernel empties a program array
    /// once no process or pin holds it) and the dispatchers' links (without
    /// them the pods' counts would stop while their TC links judge on). On an
    /// error the lease is lifted again.
    fn leave_in(tables: &mut Tables, object: &Ebpf, dir: &std::path::Path, until: u64) -> Result<(), Error> {
        let filter = tables.offsets.get(&0, 0).map_err(|e| Error::map("read the dispatcher's namespace offsets", e))?;
        // The lease first: nothing is ever left that would judge past it.
        let lease_to =
            |tables: &mut Tables, left_until_ns| tables.offsets.set(0, NetnsFilter { left_until_ns, ..filter }, 0);
        lease_to(tables, until).map_err(|e| Error::map("lease the shared object", e))?;
        let pinned = Self::pin_what_pods_need(tables, object, dir);
        if pinned.is_err() {
            let _ = lease_to(tables, 0);
        }
        pinned
    }

    /// The pins of [`Self::leave_in`].
    fn pin_what_pods_need(tables: &mut Tables, object: &Ebpf, dir: &std::path::Path) -> Result<(), Error> {
        let turn = object
            .map(map::TURN_TC)
            .ok_or_else(|| Error::Dispatch { what: format!("find map {} in the kernel object", map::TURN_TC) })?;
        turn.pin(dir.join(handover::TURN_PIN))
            .map_err(|e| Error::Dispatch { what: format!("leave the turn programs' array for the next agent: {e}") })?;
        // Every one tried (one dropped unpinned is detached, and on an error
        // the others are taken back).
        let lost: Vec<&str> = std::mem::take(&mut tables.tracepoints)
            .into_iter()
            .filter_map(|(name, link)| {
                (!handover::leave(link, &dir.join(handover::dispatcher_pin(name)))).then_some(name)
            })
            .collect();
        match lost.as_slice() {
            [] => Ok(()),
            lost => Err(Error::Dispatch { what: format!("leave dispatchers {} for the next agent", lost.join(", ")) }),
        }
    }

    /// The shared programs' log records (with `--kernel-log`), once: the
    /// agent forwards them to its own log.
    pub fn take_kernel_log(&self) -> Option<KernelLogger> {
        self.tables.lock().unwrap_or_else(PoisonError::into_inner).logger.take()
    }

    /// Whether the last agent left a link on `iface` of this thread's namespace to take over.
    pub fn inherits(&self, iface: &str) -> bool {
        handover::pod_link_name(iface).is_ok_and(|name| self.inherited.has(&name))
    }

    /// Whether this agent leaves its pods judged for the next ([`Self::leave_for_successor`]).
    pub fn leaving(&self) -> bool {
        self.leaving.dir().is_some()
    }

    /// Whether links the last agent left are still to be taken over.
    pub(crate) fn inheriting(&self) -> bool {
        self.inherited.pending()
    }

    /// The folder this agent leaves its pods' links in, once it is leaving.
    pub(crate) fn leaving_dir(&self) -> Option<std::path::PathBuf> {
        self.leaving.dir()
    }

    /// Detaches what the last agent left once every pod it gated is taken
    /// over, or its lease is up.
    pub fn finish_takeover(&self) {
        if self.inherited.pending() {
            self.inherited.finish();
        }
    }

    /// How many instructions the verifier walked to load program `name` of
    /// this dispatcher's object (None: not loaded, or the kernel does not say).
    pub fn verified_instructions(&self, name: &str) -> Option<u32> {
        let object = self.object.lock().unwrap_or_else(PoisonError::into_inner);
        let info = match object.program(name)? {
            aya::programs::Program::SchedClassifier(p) => p.info(),
            aya::programs::Program::RawTracePoint(p) => p.info(),
            _ => return None,
        };
        info.ok()?.verified_instruction_count()
    }

    /// Whether this dispatcher's object judges and counts for every pod ([`Self::start_shared`]).
    pub fn shared(&self) -> bool {
        self.shared.is_some()
    }

    /// Hands namespace `inum` to `loaded`: to its accounting
    /// programs (loaded, not attached), or with a shared object to the
    /// object's, `loaded`'s maps put at its gate. Nothing is changed on an error.
    pub fn add(self: &Arc<Self>, loaded: &mut Loaded, inum: u32) -> Result<Dispatched, Error> {
        let unable = |what: String| Error::Dispatch { what };
        let arrays = self.shared.as_ref().map(|s| s.arrays.as_slice());
        let (gate, programs) = {
            let mut tables = self.tables.lock().unwrap_or_else(PoisonError::into_inner);
            let programs = if arrays.is_some() { Vec::new() } else { loaded.accounting_programs()? };
            if tables.netns.get(&inum, 0).is_ok() {
                return Err(unable(format!("hand over namespace {inum}: another gate has it")));
            }
            let gate = tables
                .free
                .pop_first()
                .ok_or_else(|| unable(format!("take another gate: all {} are in use", dispatch::GATES)))?;
            (gate, programs)
        };
        // The pod's maps, outside the lock: other pods' set-ups go on meanwhile.
        let gated = std::mem::take(&mut loaded.gated);
        let mut wrote = match arrays {
            Some(arrays) if gated.len() != arrays.len() => Err(unable(format!(
                "hand over namespace {inum}: its gate has {} of the {} maps a shared object finds by gate",
                gated.len(),
                arrays.len()
            ))),
            Some(arrays) => set_all(arrays, gate, Some(&gated)),
            None => Ok(()),
        };
        if wrote.is_ok() {
            let mut tables = self.tables.lock().unwrap_or_else(PoisonError::into_inner);
            wrote = (|| {
                for (event, fd) in (0..).zip(&programs) {
                    let index = dispatch::target(gate, event);
                    tables.targets.set(index, fd, 0).map_err(|e| Error::map("write a dispatcher target", e))?;
                }
                // Last: nothing is judged or handed over before every map or program is in place.
                tables.netns.insert(inum, gate, 0).map_err(|e| Error::map("write a dispatched namespace", e))
            })();
        }
        if let Err(e) = wrote {
            self.take_back(gate, inum);
            return Err(e);
        }
        if arrays.is_some() {
            loaded.shared = Some(Arc::clone(self) as Arc<dyn SharedJudge>);
        }
        Ok(Dispatched { dispatcher: Arc::clone(self), gate, inum })
    }

    /// Takes back everything `gate` was given: its namespace first (no new
    /// connection is handed over, no packet judged), then its programs or
    /// maps (outside the lock), then the number.
    fn take_back(&self, gate: u32, inum: u32) {
        {
            let mut tables = self.tables.lock().unwrap_or_else(PoisonError::into_inner);
            if tables.netns.get(&inum, 0).ok() == Some(gate) {
                let _ = tables.netns.remove(&inum);
            }
            for event in 0..dispatch::EVENTS {
                let _ = tables.targets.clear_index(&dispatch::target(gate, event));
            }
        }
        if let Some(shared) = &self.shared
            && let Err(e) = set_all(&shared.arrays, gate, None)
        {
            tracing::warn!("{}: a pod's maps stay referenced until its gate number is reused", crate::error::chain(&e));
        }
        // The gate's sockets still listed (closing with their namespace)
        // name a number without programs or maps until it is reused, and
        // then find nothing in the new gate's own maps.
        self.tables.lock().unwrap_or_else(PoisonError::into_inner).free.insert(gate);
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

/// A namespace handed to a gate, until dropped.
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
        // Left for the next agent: the shared object keeps judging the pod by it.
        if self.dispatcher.leaving() {
            return;
        }
        self.dispatcher.take_back(self.gate, self.inum);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pods' turns at attaching go in the order they were asked for,
    /// whoever is woken first, and a turn ended by an error passes on.
    #[test]
    fn pods_attach_in_the_order_they_asked() {
        let turns = Arc::new(Turns::default());
        let order = Arc::new(Mutex::new(Vec::new()));
        let first = turns.wait();
        let waiting = |n: u64| {
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            while turns.line.lock().unwrap().given < n {
                assert!(std::time::Instant::now() < deadline, "ticket {n} never taken");
                std::thread::sleep(Duration::from_millis(1));
            }
        };
        let mut pods = Vec::new();
        for pod in 1..=4u64 {
            let (turns, order) = (turns.clone(), order.clone());
            pods.push(std::thread::spawn(move || {
                let _turn = turns.wait();
                order.lock().unwrap().push(pod);
                // The second pod's set-up fails in its turn: the next still gets its own.
                assert_ne!(pod, 2, "a failed attach");
            }));
            // Each asks only once the one before it holds its ticket.
            waiting(pod + 1);
        }
        assert!(order.lock().unwrap().is_empty(), "nobody attaches during another's turn");
        drop(first);
        // A turn never given back would leave the rest waiting: a failure, not a hang.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !pods.iter().all(std::thread::JoinHandle::is_finished) {
            assert!(std::time::Instant::now() < deadline, "turns after {:?} never came", order.lock().unwrap());
            std::thread::sleep(Duration::from_millis(1));
        }
        let ended: Vec<bool> = pods.into_iter().map(|p| p.join().is_ok()).collect();
        assert_eq!(ended, [true, false, true, true]);
        assert_eq!(*order.lock().unwrap(), [1, 2, 3, 4]);
        let line = turns.line.lock().unwrap();
        assert_eq!((line.given, line.serving), (5, 5), "every turn given back");
    }

    /// Grace periods are expedited while a pod waits behind another, and
    /// normal again once the line is empty; a pod alone never expedites.
    #[test]
    fn grace_periods_are_expedited_while_pods_wait_in_line() {
        let dir = tempfile::tempdir().unwrap();
        let (switch, mark) = (dir.path().join("rcu_expedited"), dir.path().join("mark"));
        std::fs::write(&switch, "0\n").unwrap();
        let on = || std::fs::read_to_string(&switch).unwrap().trim() == "1";
        let turns = Arc::new(Turns::expedited(Expedite::at(&switch, &mark)));
        drop(turns.wait());
        drop(turns.wait());
        assert!(!on(), "one pod at a time: normal grace periods");
        let first = turns.wait();
        assert!(!on(), "nobody waits yet");
        let second = {
            let turns = turns.clone();
            std::thread::spawn(move || drop(turns.wait()))
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while turns.line.lock().unwrap().given < 4 {
            assert!(std::time::Instant::now() < deadline, "the second pod never asked");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(on() && mark.exists(), "a pod waits behind the first: expedited");
        drop(first);
        second.join().unwrap();
        assert!(!on() && !mark.exists(), "the line is empty: normal again");
    }
}
