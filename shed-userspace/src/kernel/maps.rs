// SPDX-License-Identifier: MIT OR Apache-2.0
//! Typed handles on the gate's maps, opened from a loaded object or from the
//! pins of a running gate. Every reader and writer of maps goes through here.
use std::{collections::BTreeMap, fs, path::Path};

use aya::{
    Ebpf,
    maps::{Array, HashMap, LpmTrie, Map, MapData, PerCpuArray, lpm_trie::Key},
};
use shed_common::{
    ClientKey, Contention, ControlConfig, ControlStatus, GateCounters, HandshakeRing, HandshakeStamp, LocalAddr,
    NetnsFilter, PortConfig, PortCounters, PortLatency, PortState, RefusedTurn, SockEntry, TierReserve, UserPortState,
    capacity::MAX_PORTS, gate_counter, handshake, map, port_table,
};

use crate::{error::Error, host::paths, kernel::options::Cidr};

/// The gate's maps as the kernel shares them, typed. For harnesses and
/// benchmarks that plant a state ([`GateMaps::raw_mut`]): a write here
/// bypasses every write protocol [`GateMaps`] keeps (a config before its
/// slot, a client's count with its socket, a ring's reset with its port).
pub struct RawMaps {
    pub ports: HashMap<MapData, u16, PortConfig>,
    pub state: Array<MapData, PortState>,
    pub user_state: Array<MapData, UserPortState>,
    pub counters: PerCpuArray<MapData, PortCounters>,
    pub handshakes: Array<MapData, HandshakeRing>,
    pub silent: Array<MapData, HandshakeRing>,
    pub stamps: Array<MapData, HandshakeStamp>,
    pub local_addrs: Array<MapData, LocalAddr>,
    pub gate_counters: PerCpuArray<MapData, GateCounters>,
    pub socks: HashMap<MapData, u64, SockEntry>,
    pub limits: Array<MapData, u32>,
    pub latency: PerCpuArray<MapData, PortLatency>,
    pub control: Array<MapData, ControlConfig>,
    pub status: Array<MapData, ControlStatus>,
    pub tiers: LpmTrie<MapData, [u8; 16], u32>,
    pub reserve: Array<MapData, TierReserve>,
    pub clients: HashMap<MapData, ClientKey, i64>,
    /// A client's admissions not yet established (an LRU).
    pub pending_clients: HashMap<MapData, ClientKey, HandshakeRing>,
    pub contention: Array<MapData, Contention>,
    pub netns: Array<MapData, NetnsFilter>,
    /// Each port's slot + 1, a byte a port ([`shed_common::port_table`]).
    pub port_slots: Array<MapData, u64>,
    pub slot_config: Array<MapData, PortConfig>,
    pub refused_turns: HashMap<MapData, u64, RefusedTurn>,
}

/// Every map of one gate, and the only writer of them in the daemon: each
/// write protocol (protect a port, heal a count, reload a setting) is a
/// method here.
pub struct GateMaps {
    raw: RawMaps,
}

/// What a gate's ports do, read cheaply every tick (see [`GateMaps::activity`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Activity {
    /// Counters and socket events summed over the ports: it only grows while anything happens.
    pub events: u64,
    /// Connections that stopped owing an answer (answered, or closed while busy), so far.
    pub answers: u64,
    /// Refusals (every reason and tier, and dry-run's would-be ones), so far.
    pub refusals: u64,
    /// Connections owing an answer now, in any count mode: an idle
    /// connection (kept alive, or not yet sent anything) owes none.
    pub held: u64,
    /// How many ports were read.
    pub ports: u32,
}

/// Everything known about one port at one instant.
#[derive(Clone, Copy, Debug)]
pub struct PortSnapshot {
    pub port: u16,
    pub config: PortConfig,
    pub limit: u32,
    pub control: ControlConfig,
    pub status: ControlStatus,
    pub reserve: TierReserve,
    pub state: PortState,
    pub user: UserPortState,
    /// Handshakes under way, by epoch.
    pub ring: HandshakeRing,
    /// Work-mode connections that have sent nothing yet, by epoch of the silent shift.
    pub silent: HandshakeRing,
    /// When the snapshot was taken (kernel monotonic clock, ns): which ring epochs are live.
    pub now_ns: u64,
    /// Counters summed over CPUs.
    pub counters: PortCounters,
}

impl PortSnapshot {
    pub fn established(&self) -> u64 {
        shed_common::established(&self.state, &self.user)
    }
    /// Handshakes admitted and not yet established, in the live epochs.
    pub fn pending(&self) -> u64 {
        self.ring.outstanding(self.epoch())
    }
    fn epoch(&self) -> u64 {
        self.now_ns >> self.user.shift()
    }
    /// The longest a reservation lives: [`handshake::LIVE_EPOCHS`] epochs.
    pub(crate) fn handshake_window_us(&self) -> u64 {
        (handshake::LIVE_EPOCHS << self.user.shift()) / 1000
    }
    /// Admissions that lapsed without completing, folded or not yet.
    pub fn handshakes_lapsed(&self) -> u64 {
        self.ring.lapsed + self.ring.lapsed_unfolded(self.epoch())
    }
    pub fn busy(&self) -> u64 {
        shed_common::busy(&self.state, &self.user)
    }
    /// Connections accepted within the grace that have sent nothing yet.
    pub fn silent(&self) -> u64 {
        self.silent.outstanding(self.silent_epoch())
    }
    fn silent_epoch(&self) -> u64 {
        self.now_ns >> self.user.silent_shift()
    }
    /// Connections that sent nothing for the whole grace and stopped counting.
    pub fn idle_expired(&self) -> u64 {
        self.silent.lapsed + self.silent.lapsed_unfolded(self.silent_epoch())
    }
    /// How long a silent connection counts at least (ms): three silent epochs.
    pub(crate) fn idle_grace_ms(&self) -> u64 {
        ((handshake::LIVE_EPOCHS - 1) << self.user.silent_shift()) / 1_000_000
    }
    pub fn in_flight(&self) -> u64 {
        shed_common::in_flight(&self.state, self.pending(), self.silent(), &self.user, self.config.count_mode)
    }
    pub fn counter(&self, index: usize) -> u64 {
        self.counters.values[index]
    }
    /// Refusals of every reason (SYNs, handshake-completing ACKs, kept-alive requests).
    pub fn rejected(&self) -> u64 {
        REJECTIONS.iter().map(|&c| self.counter(c)).sum()
    }
}

/// The counters whose sum is a port's refusals.
pub(crate) const REJECTIONS: [usize; 4] = [
    shed_common::counter::REJECTED_LIMIT,
    shed_common::counter::REJECTED_SHARE,
    shed_common::counter::REJECTED_CLIENT_CAP,
    shed_common::counter::REJECTED_CLIENT_SHARE,
];

fn typed<T>(name: &str, map: Map) -> Result<T, Error>
where
    T: TryFrom<Map, Error = aya::maps::MapError>,
{
    T::try_from(map).map_err(|e| Error::map(format!("open map {name}"), e))
}

impl GateMaps {
    /// The maps themselves, to read as the kernel holds them.
    pub fn raw(&self) -> &RawMaps {
        &self.raw
    }

    /// The maps themselves, to plant a state (tests, benchmarks): see [`RawMaps`].
    pub fn raw_mut(&mut self) -> &mut RawMaps {
        &mut self.raw
    }

    /// Takes the maps out of a freshly loaded object, pinning each under `pin_dir` if given.
    pub(crate) fn from_ebpf(ebpf: &mut Ebpf, pin_dir: Option<&Path>) -> Result<Self, Error> {
        Self::created(pin_dir, |name| {
            ebpf.take_map(name).ok_or_else(|| {
                Error::map(format!("find map {name}"), aya::maps::MapError::InvalidName { name: name.into() })
            })
        })
    }

    /// The maps `create` makes by name (each pinned under `pin_dir` when given).
    pub(crate) fn created(
        pin_dir: Option<&Path>,
        mut create: impl FnMut(&str) -> Result<Map, Error>,
    ) -> Result<Self, Error> {
        Self::build(|name| {
            let map = create(name)?;
            if let Some(dir) = pin_dir {
                map.pin(dir.join(name)).map_err(|error| {
                    Error::map(
                        format!("pin map {name}"),
                        aya::maps::MapError::PinError { name: Some(name.into()), error },
                    )
                })?;
            }
            Ok(map)
        })
    }

    /// Opens the maps of the running gate from its pins: the one namespace it
    /// gates (with several, [`Error::SeveralNamespaces`]: pick one with [`Self::open_gates`]).
    pub fn open_pinned() -> Result<Self, Error> {
        let mut gates = Self::open_gates(None)?;
        if gates.len() > 1 {
            let labels = gates.iter().map(|g| g.netns.clone()).collect::<Vec<_>>().join(", ");
            return Err(Error::SeveralNamespaces { labels });
        }
        Ok(gates.remove(0).maps)
    }

    /// Opens the pinned maps of every namespace the running gate protects, by
    /// label (`only`: just that namespace's), in label order.
    pub(crate) fn open_gates(only: Option<&str>) -> Result<Vec<PinnedGate>, Error> {
        let dirs = pinned_gate_dirs().into_iter().map(|(label, dir)| (label, dir, false)).collect();
        Self::open_gate_dirs(dirs, only)
    }

    /// As [`Self::open_gates`], read-only verbs' view: with the pod gates a
    /// stopped node agent left judging for the next (`handing_over`: their
    /// maps are those the left programs judge by, in place of any the next
    /// agent pinned for the pod before it took it over). The running
    /// daemon's gates are read only if one `runs`.
    pub(crate) fn open_judging(only: Option<&str>, runs: bool) -> Result<Vec<PinnedGate>, Error> {
        let left = crate::kernel::handover::handing_over();
        let running = if runs { pinned_gate_dirs() } else { Vec::new() };
        let mut dirs: Vec<(String, std::path::PathBuf, bool)> = running
            .into_iter()
            .filter(|(label, _)| !left.iter().any(|(l, _)| l == label))
            .map(|(label, dir)| (label, dir, false))
            .collect();
        dirs.extend(left.into_iter().map(|(label, dir)| (label, dir, true)));
        dirs.sort();
        Self::open_gate_dirs(dirs, only)
    }

    /// Opens the gates pinned in `dirs` (label, folder, handed over), `only`'s if named.
    fn open_gate_dirs(
        dirs: Vec<(String, std::path::PathBuf, bool)>,
        only: Option<&str>,
    ) -> Result<Vec<PinnedGate>, Error> {
        let mut gates = Vec::new();
        for (netns, dir, handing_over) in &dirs {
            if only.is_none_or(|o| paths::netns_label(Some(o)) == *netns) {
                match Self::open_pinned_at(dir) {
                    Ok(maps) => gates.push(PinnedGate {
                        pod: paths::pod_of(netns),
                        netns: netns.clone(),
                        maps,
                        handing_over: *handing_over,
                    }),
                    // That namespace's gate ended while we looked (its pins go with it).
                    Err(_) if !dir.join(map::PORTS).exists() => {}
                    Err(e) => return Err(e),
                }
            }
        }
        if gates.is_empty() {
            return Err(match only {
                Some(ns) if !dirs.is_empty() => Error::NamespaceNotGated {
                    netns: ns.to_owned(),
                    labels: dirs.into_iter().map(|(l, ..)| l).collect::<Vec<_>>().join(", "),
                },
                _ => Error::NoGate { pin_dir: paths::PIN_DIR.into() },
            });
        }
        Ok(gates)
    }

    /// Opens the maps pinned in `dir` (one gate's folder).
    pub(crate) fn open_pinned_at(dir: &Path) -> Result<Self, Error> {
        if !dir.join(map::PORTS).exists() {
            return Err(Error::NoGate { pin_dir: dir.into() });
        }
        Self::build(|name| {
            let path = dir.join(name);
            let data =
                MapData::from_pin(&path).map_err(|e| Error::map(format!("open pinned map {}", path.display()), e))?;
            Map::from_map_data(data).map_err(|e| Error::map(format!("open pinned map {}", path.display()), e))
        })
    }

    fn build(mut open: impl FnMut(&str) -> Result<Map, Error>) -> Result<Self, Error> {
        Ok(Self {
            raw: RawMaps {
                ports: typed(map::PORTS, open(map::PORTS)?)?,
                state: typed(map::PORT_STATE, open(map::PORT_STATE)?)?,
                user_state: typed(map::USER_STATE, open(map::USER_STATE)?)?,
                counters: typed(map::COUNTERS, open(map::COUNTERS)?)?,
                handshakes: typed(map::HANDSHAKES, open(map::HANDSHAKES)?)?,
                silent: typed(map::SILENT, open(map::SILENT)?)?,
                stamps: typed(map::STAMPS, open(map::STAMPS)?)?,
                local_addrs: typed(map::LOCAL_ADDRS, open(map::LOCAL_ADDRS)?)?,
                gate_counters: typed(map::GATE_COUNTERS, open(map::GATE_COUNTERS)?)?,
                socks: typed(map::SOCKS, open(map::SOCKS)?)?,
                limits: typed(map::LIMITS, open(map::LIMITS)?)?,
                latency: typed(map::LATENCY, open(map::LATENCY)?)?,
                control: typed(map::CONTROL, open(map::CONTROL)?)?,
                status: typed(map::STATUS, open(map::STATUS)?)?,
                tiers: typed(map::TIERS, open(map::TIERS)?)?,
                reserve: typed(map::RESERVE, open(map::RESERVE)?)?,
                clients: typed(map::CLIENTS, open(map::CLIENTS)?)?,
                pending_clients: typed(map::PENDING_CLIENTS, open(map::PENDING_CLIENTS)?)?,
                contention: typed(map::CONTENTION, open(map::CONTENTION)?)?,
                netns: typed(map::NETNS, open(map::NETNS)?)?,
                port_slots: typed(map::PORT_SLOTS, open(map::PORT_SLOTS)?)?,
                slot_config: typed(map::SLOT_CONFIG, open(map::SLOT_CONFIG)?)?,
                refused_turns: typed(map::REFUSED_TURNS, open(map::REFUSED_TURNS)?)?,
            },
        })
    }

    /// Takes the requests the gate refused on kept-alive connections with a
    /// reply (`rst`, `http`) since the last call, each once (removed as read),
    /// for the daemon to close their sockets. A `drop` refusal stays, so its
    /// retransmissions are dropped too, until the table's LRU evicts it.
    pub(crate) fn take_refused_turns(&mut self) -> Result<Vec<RefusedTurn>, Error> {
        let found: Vec<(u64, RefusedTurn)> = self
            .raw
            .refused_turns
            .iter()
            .filter(|r| {
                r.as_ref().is_err() || r.as_ref().is_ok_and(|(_, t)| t.action != u32::from(shed_common::action::DROP))
            })
            .collect::<Result<_, _>>()
            .map_err(|e| Error::map("read refused requests", e))?;
        for (sk, _) in &found {
            // Gone already (the LRU evicted it): nothing to take.
            let _ = self.raw.refused_turns.remove(sk);
        }
        Ok(found.into_iter().map(|(_, turn)| turn).collect())
    }

    /// Protected ports and their configuration, by port.
    pub(crate) fn port_configs(&self) -> Result<BTreeMap<u16, PortConfig>, Error> {
        self.raw.ports.iter().collect::<Result<BTreeMap<_, _>, _>>().map_err(|e| Error::map("read protected ports", e))
    }

    pub fn config(&self, port: u16) -> Result<PortConfig, Error> {
        self.raw
            .ports
            .get(&port, 0)
            .map_err(|_| Error::PortNotProtected { port, protected: self.port_list().unwrap_or_default() })
    }

    /// "8080, 9090" for messages.
    pub(crate) fn port_list(&self) -> Result<String, Error> {
        let ports: Vec<String> = self.port_configs()?.keys().map(u16::to_string).collect();
        Ok(if ports.is_empty() { "none".into() } else { ports.join(", ") })
    }

    /// Starts protecting `port` in a free slot with zeroed accounting.
    pub fn protect(&mut self, port: u16, spec: &PortSpec) -> Result<PortConfig, Error> {
        let used: Vec<u32> = self.port_configs()?.values().map(|c| c.slot).collect();
        // The object's own slots: a pod's holds fewer than a node gate's.
        let slots = self.raw.limits.len().min(MAX_PORTS);
        let slot = (0..slots).find(|s| !used.contains(s)).ok_or(Error::TooManyPorts { max: slots })?;
        let cpus =
            aya::util::nr_cpus().map_err(|(_, e)| Error::io("count CPUs", "/sys/devices/system/cpu/possible", e))?;
        let reset = |e| Error::map("reset port state", e);
        self.raw.state.set(slot, PortState::default(), 0).map_err(reset)?;
        // The window's shift before the port is judged: an admission stamped in
        // one shift's epochs and completed in another's counts late and lapses
        // (the first window wrote it, with handshakes under way: the soak, 1 in 10).
        let user = UserPortState { handshake_shift: spec.handshake_shift, ..UserPortState::default() };
        self.raw.user_state.set(slot, user, 0).map_err(reset)?;
        self.raw.handshakes.set(slot, HandshakeRing::default(), 0).map_err(reset)?;
        self.raw.silent.set(slot, HandshakeRing::default(), 0).map_err(reset)?;
        // A slot's last port's largest client must not make this port defer SYNs.
        self.raw.contention.set(slot, Contention::default(), 0).map_err(reset)?;
        let zero =
            aya::maps::PerCpuValues::try_from(vec![PortCounters::default(); cpus]).map_err(|e| reset(e.into()))?;
        self.raw.counters.set(slot, zero, 0).map_err(reset)?;
        let zero =
            aya::maps::PerCpuValues::try_from(vec![PortLatency::default(); cpus]).map_err(|e| reset(e.into()))?;
        self.raw.latency.set(slot, zero, 0).map_err(reset)?;
        self.raw.status.set(slot, ControlStatus::default(), 0).map_err(reset)?;
        self.raw.reserve.set(slot, TierReserve::default(), 0).map_err(reset)?;
        self.raw.control.set(slot, spec.control, 0).map_err(reset)?;
        self.set_limit(slot, spec.limit)?;
        // An operator's global dry-run (`set --all --dry-run`) holds for ports that start meanwhile.
        let dry_run = spec.dry_run || std::path::Path::new(crate::host::paths::DRY_RUN_ALL).exists();
        let mut config = PortConfig::new(slot, spec.action, dry_run, spec.count_mode);
        config.share_permille = spec.share_permille;
        config.tier_action = spec.tier_action;
        config.tiered = u8::from(self.any_tier()?);
        config.client_cap = spec.client_cap;
        config.client_prefix_v6 = spec.client_prefix_v6;
        config.client_share = spec.client_share;
        config.rst_per_sec = spec.rst_per_sec;
        config.rst_per_prefix_per_sec = spec.rst_per_prefix_per_sec;
        config.retry_after_s = spec.retry_after_s;
        // The config first, then the port's slot: the gate never finds a slot without its config.
        self.write_config(port, config)?;
        self.set_port_slot(port, slot as u8 + 1).map_err(|e| Error::map("write port slot", e))?;
        Ok(config)
    }

    /// Writes `port`'s byte of its word in `SHED_PORT_SLOTS` (0: unprotected).
    /// A read-modify-write of eight ports' word: the writers of another
    /// process hold [`crate::daemon::ConfigLock`] (`set`, `tier`, `detach`, a
    /// reload), and a gate's set-up writes its maps before any other can.
    fn set_port_slot(&mut self, port: u16, slot_plus_one: u8) -> Result<(), aya::maps::MapError> {
        let word = self.raw.port_slots.get(&port_table::word_of(port), 0)?;
        self.raw.port_slots.set(port_table::word_of(port), port_table::with_slot(word, port, slot_plus_one), 0)
    }

    /// `port`'s slot + 1 as the gate finds it (0: unprotected).
    pub fn port_slot(&self, port: u16) -> Result<u32, Error> {
        let word =
            self.raw.port_slots.get(&port_table::word_of(port), 0).map_err(|e| Error::map("read port slot", e))?;
        Ok(port_table::slot_plus_one(word, port))
    }

    /// A port's limit now.
    pub(crate) fn limit(&self, slot: u32) -> Result<u32, Error> {
        self.raw.limits.get(&slot, 0).map_err(|e| Error::map("read limit", e))
    }

    /// A port's largest client and when a client under its share was last refused.
    pub(crate) fn contention_of(&self, slot: u32) -> Result<Contention, Error> {
        self.raw.contention.get(&slot, 0).map_err(|e| Error::map("read contention", e))
    }

    /// Counts `n` refused requests' sockets closed on the port in `slot` (see `daemon::refused`).
    pub(crate) fn add_refused_closed(&mut self, slot: u32, n: u64) -> Result<(), Error> {
        self.update_user_state(slot, "count refused requests closed", |user| {
            user.refused_closed = user.refused_closed.wrapping_add(n);
            n != 0
        })
    }

    /// Counts requests the daemon closed for a client over its share (see `daemon::stalled`).
    pub(crate) fn add_stalled_closed(&mut self, slot: u32, n: u32) -> Result<(), Error> {
        self.update_user_state(slot, "write stalled requests closed", |user| {
            user.stalled_closed = user.stalled_closed.wrapping_add(n);
            true
        })
    }

    pub fn set_limit(&mut self, slot: u32, limit: u32) -> Result<(), Error> {
        self.raw.limits.set(slot, limit, 0).map_err(|e| Error::map("write limit", e))
    }

    pub(crate) fn write_control(&mut self, slot: u32, control: ControlConfig) -> Result<(), Error> {
        self.raw.control.set(slot, control, 0).map_err(|e| Error::map("write controller settings", e))
    }

    pub(crate) fn write_reserve(&mut self, slot: u32, reserve: TierReserve) -> Result<(), Error> {
        self.raw.reserve.set(slot, reserve, 0).map_err(|e| Error::map("write tier reserve", e))
    }

    pub(crate) fn write_status(&mut self, slot: u32, status: ControlStatus) -> Result<(), Error> {
        self.raw.status.set(slot, status, 0).map_err(|e| Error::map("write controller status", e))
    }

    /// The port's latency histograms, summed over CPUs (cumulative since attach).
    pub fn latency(&self, slot: u32) -> Result<PortLatency, Error> {
        let per_cpu = self.raw.latency.get(&slot, 0).map_err(|e| Error::map("read latency histograms", e))?;
        let mut sum = PortLatency::default();
        for cpu in per_cpu.iter() {
            for (total, part) in [
                (&mut sum.queue_wait, &cpu.queue_wait),
                (&mut sum.service, &cpu.service),
                (&mut sum.sojourn, &cpu.sojourn),
                (&mut sum.handshake, &cpu.handshake),
            ] {
                for (t, v) in total.iter_mut().zip(part) {
                    *t = t.wrapping_add(*v);
                }
            }
        }
        Ok(sum)
    }

    /// Writes a port's config: the authoritative hash and the gate's copy by slot.
    pub fn write_config(&mut self, port: u16, config: PortConfig) -> Result<(), Error> {
        self.raw.ports.insert(port, config, 0).map_err(|e| Error::map(format!("write config of port {port}"), e))?;
        self.raw
            .slot_config
            .set(config.slot, config, 0)
            .map_err(|e| Error::map(format!("write config of port {port}"), e))
    }

    /// Stops protecting `port`. Its sockets still release their counts as they close.
    pub fn unprotect(&mut self, port: u16) -> Result<(), Error> {
        // The slot first: the gate stops judging the port before its config goes.
        self.set_port_slot(port, 0).map_err(|e| Error::map(format!("remove port {port}"), e))?;
        self.raw.ports.remove(&port).map_err(|e| Error::map(format!("remove port {port}"), e))
    }

    /// A port's controller settings.
    pub fn control(&self, slot: u32) -> Result<ControlConfig, Error> {
        self.raw.control.get(&slot, 0).map_err(|e| Error::map("read controller settings", e))
    }

    pub fn snapshot(&self, port: u16, config: PortConfig) -> Result<PortSnapshot, Error> {
        let slot = config.slot;
        let limit = self.limit(slot)?;
        let control = self.control(slot)?;
        let status = self.raw.status.get(&slot, 0).map_err(|e| Error::map("read controller status", e))?;
        let reserve = self.raw.reserve.get(&slot, 0).map_err(|e| Error::map("read tier reserve", e))?;
        let state = self.raw.state.get(&slot, 0).map_err(|e| Error::map("read port state", e))?;
        let user = self.user_state(slot)?;
        let ring = self.raw.handshakes.get(&slot, 0).map_err(|e| Error::map("read handshakes", e))?;
        let silent = self.raw.silent.get(&slot, 0).map_err(|e| Error::map("read silent connections", e))?;
        let now_ns = crate::host::system::monotonic_ns();
        let counters = self.counters(slot)?;
        Ok(PortSnapshot { port, config, limit, control, status, reserve, state, user, ring, silent, now_ns, counters })
    }

    /// A port's counters, summed over the CPUs.
    fn counters(&self, slot: u32) -> Result<PortCounters, Error> {
        let per_cpu = self.raw.counters.get(&slot, 0).map_err(|e| Error::map("read counters", e))?;
        let mut counters = PortCounters::default();
        for cpu in per_cpu.iter() {
            for (sum, v) in counters.values.iter_mut().zip(cpu.values) {
                *sum = sum.wrapping_add(v);
            }
        }
        Ok(counters)
    }

    /// What the ports of `configs` do (see [`Activity`]): two map reads a
    /// port, where a snapshot takes nine.
    pub fn activity<'a>(&self, configs: impl IntoIterator<Item = &'a PortConfig>) -> Result<Activity, Error> {
        let mut activity = Activity::default();
        for config in configs {
            let slot = config.slot;
            let counters = self.counters(slot)?;
            activity.events = counters.values.iter().fold(activity.events, |s, &v| s.wrapping_add(v));
            activity.refusals = REJECTIONS
                .iter()
                .chain(&[shed_common::counter::DRY_RUN_WOULD_REJECT])
                .fold(activity.refusals, |s, &c| s.wrapping_add(counters.values[c]));
            let state = self.raw.state.get(&slot, 0).map_err(|e| Error::map("read port state", e))?;
            activity.events = [state.opened, state.closed, state.busy_enter, state.busy_exit, state.clients_added]
                .iter()
                .fold(activity.events, |s, &v| s.wrapping_add(v));
            activity.answers = activity.answers.wrapping_add(state.busy_exit);
            // Read apart, the two counts may cross by an event: never below nothing.
            activity.held += u64::try_from(state.busy_enter.wrapping_sub(state.busy_exit) as i64).unwrap_or(0);
            activity.ports += 1;
        }
        Ok(activity)
    }

    /// Snapshots of every protected port (or just `only`), by port.
    pub fn snapshots(&self, only: Option<u16>) -> Result<Vec<PortSnapshot>, Error> {
        let configs = self.port_configs()?;
        if let Some(port) = only {
            let config = self.config(port)?;
            return Ok(vec![self.snapshot(port, config)?]);
        }
        configs.into_iter().map(|(port, config)| self.snapshot(port, config)).collect()
    }

    /// Every client network with a tier.
    pub(crate) fn tier_entries(&self) -> Result<BTreeMap<Cidr, u8>, Error> {
        self.raw
            .tiers
            .iter()
            .map(|r| r.map(|(k, t)| (Cidr { prefix_len: k.prefix_len(), addr: k.data() }, t as u8)))
            .collect::<Result<_, _>>()
            .map_err(|e| Error::map("read tiers", e))
    }

    pub fn set_tier(&mut self, cidr: Cidr, tier: u8) -> Result<(), Error> {
        self.raw
            .tiers
            .insert(&Key::new(cidr.prefix_len, cidr.addr), u32::from(tier), 0)
            .map_err(|e| Error::map(format!("write tier of {cidr}"), e))?;
        self.sync_tiered()
    }

    pub fn remove_tier(&mut self, cidr: Cidr) -> Result<(), Error> {
        self.raw
            .tiers
            .remove(&Key::new(cidr.prefix_len, cidr.addr))
            .map_err(|e| Error::map(format!("remove tier of {cidr}"), e))?;
        self.sync_tiered()
    }

    /// Whether any client network has a tier: one step into the trie, not a
    /// walk of it (a walk per insert made loading n tiers quadratic).
    fn any_tier(&self) -> Result<bool, Error> {
        self.raw.tiers.keys().next().transpose().map(|k| k.is_some()).map_err(|e| Error::map("read tiers", e))
    }

    /// Tier shares apply on every port exactly while some client has a tier.
    pub(crate) fn sync_tiered(&mut self) -> Result<(), Error> {
        let tiered = u8::from(self.any_tier()?);
        for (port, mut config) in self.port_configs()? {
            if config.tiered != tiered {
                config.tiered = tiered;
                self.write_config(port, config)?;
            }
        }
        Ok(())
    }

    /// Clients of `slot` with what they hold against the cap, most first.
    pub fn client_counts(&self, slot: u32) -> Result<Vec<(ClientKey, i64)>, Error> {
        let mut out: Vec<(ClientKey, i64)> =
            self.raw.clients.iter().filter_map(Result::ok).filter(|(k, _)| k.slot == slot).collect();
        out.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        Ok(out)
    }

    /// Bounds each of `slots` (every port of the gate) to its quota of the
    /// shared connection and client maps ([`shed_common::map_quota`]).
    pub(crate) fn set_quotas(&mut self, slots: &[u32]) -> Result<(), Error> {
        use aya::maps::IterableMap as _;
        let capacity =
            |map: &MapData| map.info().map(|info| info.max_entries()).map_err(|e| Error::map("read map size", e));
        let (connections, clients) = (capacity(self.raw.socks.map())?, capacity(self.raw.clients.map())?);
        let quotas = (shed_common::map_quota(connections, slots.len()), shed_common::map_quota(clients, slots.len()));
        for &slot in slots {
            self.update_user_state(slot, "write map quotas", |user| {
                let changed = (user.connection_quota, user.client_quota) != quotas;
                (user.connection_quota, user.client_quota) = quotas;
                changed
            })?;
        }
        Ok(())
    }

    /// Forgets clients that held nothing at the last sweep and still hold nothing,
    /// so the maps shrink back when clients go away. Returns the idle clients now.
    /// (A client seen idle twice in a row cannot be mid-admission except in a
    /// microsecond race; losing that one count only loosens its cap by one.)
    pub(crate) fn forget_idle_clients(
        &mut self,
        idle_before: &std::collections::HashSet<ClientKey>,
    ) -> Result<std::collections::HashSet<ClientKey>, Error> {
        // Sets, not lists: with every client counted (the client share is on by
        // default) the map may hold tens of thousands, and a list lookup per
        // entry made the sweep quadratic on the control loop's thread.
        let mut idle = std::collections::HashSet::new();
        let mut forgotten: std::collections::BTreeMap<u32, u64> = std::collections::BTreeMap::new();
        for (key, held) in self.raw.clients.iter().filter_map(Result::ok).collect::<Vec<_>>() {
            if held > 0 {
                continue;
            }
            if idle_before.contains(&key) {
                if self.raw.clients.remove(&key).is_ok() {
                    *forgotten.entry(key.slot).or_default() += 1;
                }
            } else {
                idle.insert(key);
            }
        }
        // Counted against what the port's connections added, for its client quota.
        for (slot, n) in forgotten {
            self.update_user_state(slot, "write forgotten clients", |user| {
                user.clients_forgotten += n;
                true
            })?;
        }
        Ok(idle)
    }

    /// Every tracked socket, read in batches (one syscall per few thousand
    /// entries; the per-entry iterator costs two syscalls an entry, which at
    /// 100,000 connections is most of a healing pass).
    pub fn tracked_sockets(&self) -> Result<std::collections::HashMap<u64, SockEntry>, Error> {
        use std::os::fd::{AsFd as _, AsRawFd as _};

        use aya::maps::IterableMap as _;
        let fd = self.raw.socks.map().fd().as_fd().as_raw_fd();
        match lookup_batch::<u64, SockEntry>(fd) {
            Ok(entries) => Ok(entries.into_iter().collect()),
            // Kernels without batch lookups for hash maps: one entry at a time.
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                self.raw.socks.iter().collect::<Result<_, _>>().map_err(|e| Error::map("read tracked sockets", e))
            }
            Err(e) => Err(Error::io("read", "tracked sockets (BPF_MAP_LOOKUP_BATCH)", e)),
        }
    }

    /// Forgets a tracked socket whose close the gate missed (the healer found
    /// it gone from the kernel's table): its entry, and the count its client
    /// still holds for it. Returns whether the entry was there. (The client's
    /// count is read, lowered and written: a kernel add racing it, on a
    /// connection whose close was missed, would be lost, loosening that
    /// client's cap by one.)
    pub(crate) fn forget_socket(&mut self, key: u64, entry: &SockEntry) -> bool {
        if self.raw.socks.remove(&key).is_err() {
            return false;
        }
        if entry.capped != 0 {
            let client = ClientKey { slot: entry.slot, addr: entry.client };
            if let Ok(held) = self.raw.clients.get(&client, 0) {
                let _ = self.raw.clients.insert(client, (held - 1).max(0), 0);
            }
        }
        true
    }

    /// Tracks a connection the gate missed opening (the healer found it in the
    /// kernel's table), under `key`, unless the key is taken. Returns whether
    /// it was added.
    pub(crate) fn adopt_socket(&mut self, key: u64, entry: SockEntry) -> bool {
        const BPF_NOEXIST: u64 = 1;
        self.raw.socks.insert(key, entry, BPF_NOEXIST).is_ok()
    }

    /// The tier of the client at `addr` (its longest prefix), if it has one.
    pub(crate) fn tier_of(&self, addr: [u8; 16]) -> Option<u8> {
        self.raw.tiers.get(&Key::new(128, addr), 0).ok().map(|t| t as u8)
    }

    /// Takes a drift out of a port's counts (established, busy), counted in
    /// `drift_corrected` as the larger of the two.
    pub(crate) fn correct_drift(&mut self, slot: u32, drift: (i64, i64)) -> Result<(), Error> {
        self.update_user_state(slot, "write drift correction", |user| {
            user.established_adjust -= drift.0;
            user.busy_adjust -= drift.1;
            user.drift_corrected += drift.0.unsigned_abs().max(drift.1.unsigned_abs());
            true
        })
    }

    /// Counts `adopted` connections (tracked by the healer, their opening
    /// unseen) as established on the port in `slot`.
    pub(crate) fn count_adopted(&mut self, slot: u32, adopted: i64) -> Result<(), Error> {
        self.update_user_state(slot, "count adopted connections", |user| {
            user.established_adjust += adopted;
            adopted != 0
        })
    }

    /// Kernel memory the gate's maps hold now, in bytes (the `memlock` the
    /// kernel reports for each; the connection and client maps are not
    /// preallocated, so theirs grows with what they hold).
    pub fn memory_bytes(&self) -> u64 {
        use std::os::fd::{AsFd as _, AsRawFd as _};

        use aya::maps::IterableMap as _;
        let fds = [
            self.raw.ports.map(),
            self.raw.state.map(),
            self.raw.user_state.map(),
            self.raw.counters.map(),
            self.raw.handshakes.map(),
            self.raw.silent.map(),
            self.raw.stamps.map(),
            self.raw.local_addrs.map(),
            self.raw.gate_counters.map(),
            self.raw.socks.map(),
            self.raw.limits.map(),
            self.raw.latency.map(),
            self.raw.control.map(),
            self.raw.status.map(),
            self.raw.tiers.map(),
            self.raw.reserve.map(),
            self.raw.clients.map(),
            self.raw.pending_clients.map(),
            self.raw.contention.map(),
            self.raw.netns.map(),
            self.raw.port_slots.map(),
            self.raw.slot_config.map(),
            self.raw.refused_turns.map(),
        ]
        .map(|m| m.fd().as_fd().as_raw_fd());
        fds.iter().filter_map(|fd| memlock_of(*fd)).sum()
    }

    pub(crate) fn set_netns_filter(&mut self, filter: NetnsFilter) -> Result<(), Error> {
        self.raw.netns.set(0, filter, 0).map_err(|e| Error::map("write namespace filter", e))
    }

    /// Writes the namespace's own addresses (see [`shed_common::local_addr`]):
    /// lays out the two-choice table, then rewrites only the slots that
    /// change. Returns whether anything changed; an address that finds no slot
    /// (hundreds of addresses) is reported and left out, so SYNs to it pass unjudged.
    pub fn set_local_addrs(&mut self, addrs: &BTreeMap<[u8; 16], u32>) -> Result<bool, Error> {
        let (table, left_out) = local_addr_table(addrs);
        for addr in &left_out {
            tracing::warn!(address = %std::net::Ipv6Addr::from(*addr), "no room for this address: SYNs to it are not judged");
        }
        let mut changed = false;
        for (slot, entry) in table.iter().enumerate() {
            let slot = slot as u32;
            if self.raw.local_addrs.get(&slot, 0).ok().as_ref() != Some(entry) {
                self.raw.local_addrs.set(slot, *entry, 0).map_err(|e| Error::map("write local addresses", e))?;
                changed = true;
            }
        }
        Ok(changed)
    }

    /// The namespace's addresses as the gate holds them, by kind.
    pub fn local_addrs(&self) -> Result<BTreeMap<[u8; 16], u32>, Error> {
        let mut out = BTreeMap::new();
        for slot in 0..shed_common::local_addr::SLOTS {
            let entry = self.raw.local_addrs.get(&slot, 0).map_err(|e| Error::map("read local addresses", e))?;
            if entry.kind != 0 {
                out.insert(entry.addr, entry.kind);
            }
        }
        Ok(out)
    }

    /// Sets the epoch shift of a port's handshake ring (its reservation lifetime).
    pub fn set_handshake_shift(&mut self, slot: u32, shift: u32) -> Result<(), Error> {
        self.update_user_state(slot, "write handshake window", |user| {
            std::mem::replace(&mut user.handshake_shift, shift) != shift
        })
    }

    /// Sets the Retry-After a port's `http` answers give when it sets none.
    pub(crate) fn set_retry_after(&mut self, slot: u32, seconds: u32) -> Result<(), Error> {
        self.update_user_state(slot, "write retry-after", |user| {
            std::mem::replace(&mut user.retry_after_s, seconds) != seconds
        })
    }

    /// A port's `UserPortState` (the daemon's own adjustments and settings).
    pub(crate) fn user_state(&self, slot: u32) -> Result<UserPortState, Error> {
        self.raw.user_state.get(&slot, 0).map_err(|e| Error::map("read port state", e))
    }

    /// Reads a port's `UserPortState`, lets `change` edit it, and writes it
    /// back only if `change` says it changed (`what` names the write in errors).
    fn update_user_state(
        &mut self,
        slot: u32,
        what: &'static str,
        change: impl FnOnce(&mut UserPortState) -> bool,
    ) -> Result<(), Error> {
        let mut user = self.user_state(slot)?;
        if change(&mut user) {
            self.raw.user_state.set(slot, user, 0).map_err(|e| Error::map(what, e))?;
        }
        Ok(())
    }

    /// Gate-wide counters summed over CPUs, by [`gate_counter`] index.
    pub fn gate_counters(&self) -> Result<[u64; gate_counter::COUNT], Error> {
        let per_cpu = self.raw.gate_counters.get(&0, 0).map_err(|e| Error::map("read gate counters", e))?;
        let mut sum = [0u64; gate_counter::COUNT];
        for cpu in per_cpu.iter() {
            for (s, v) in sum.iter_mut().zip(cpu.values) {
                *s = s.wrapping_add(v);
            }
        }
        Ok(sum)
    }

    /// Empties the port's handshake ring (tests and benchmarks resetting a gate
    /// that carries no traffic, so one case's admissions do not hold the next one's slots).
    pub fn clear_handshakes(&mut self) {
        for slot in self.port_configs().unwrap_or_default().values().map(|c| c.slot) {
            let _ = self.raw.handshakes.set(slot, HandshakeRing::default(), 0);
        }
    }
}

/// Lays addresses out in the two-choice table: each in one of its two slots,
/// moving earlier ones to their other slot when both are taken (a few rounds,
/// as cuckoo hashing does). Returns the table and the addresses left out.
pub(crate) fn local_addr_table(addrs: &BTreeMap<[u8; 16], u32>) -> (Vec<LocalAddr>, Vec<[u8; 16]>) {
    use shed_common::local_addr::{SLOTS, slots};
    let mut table = vec![LocalAddr::default(); SLOTS as usize];
    let mut left_out = Vec::new();
    for (&addr, &kind) in addrs {
        let mut entry = LocalAddr { addr, kind };
        let mut slot = slots(&addr).0;
        let mut placed = false;
        for _ in 0..32 {
            let (a, b) = slots(&entry.addr);
            if let Some(free) = [a, b].into_iter().find(|&s| table[s as usize].kind == 0) {
                table[free as usize] = entry;
                placed = true;
                break;
            }
            // Both taken: evict the one in `slot` and move it to its other choice next round.
            std::mem::swap(&mut table[slot as usize], &mut entry);
            let (a, b) = slots(&entry.addr);
            slot = if a == slot { b } else { a };
        }
        if !placed {
            left_out.push(entry.addr);
        }
    }
    (table, left_out)
}

/// Everything `protect` needs to know about a new port.
#[derive(Clone, Copy, Debug, Default)]
pub struct PortSpec {
    pub limit: u32,
    /// Most connections per client (0: no cap), IPv6 counted per prefix of `client_prefix_v6`.
    pub client_cap: u32,
    pub client_prefix_v6: u8,
    /// Percent of the limit one client may hold while others are refused (0: no share).
    pub client_share: u8,
    /// RST caps (per second; 0: none): the port's, and per source prefix.
    pub rst_per_sec: u32,
    pub rst_per_prefix_per_sec: u32,
    /// Seconds an `http` answer's Retry-After says; 0: derived from the controller each window.
    pub retry_after_s: u16,
    /// The handshake ring's epoch shift from the first judgement on (0: the
    /// kernel's default until the daemon's first window writes it).
    pub handshake_shift: u32,
    pub share_permille: [u16; shed_common::tier::COUNT],
    pub tier_action: [u8; shed_common::tier::COUNT],
    pub action: u8,
    pub dry_run: bool,
    pub count_mode: u8,
    pub control: ControlConfig,
}

impl PortSpec {
    /// A port with the default tier shares and the port's action for every tier.
    pub fn new(limit: u32, action: u8, dry_run: bool, count_mode: u8, control: ControlConfig) -> Self {
        Self {
            limit,
            client_cap: 0,
            client_prefix_v6: 64,
            client_share: shed_common::DEFAULT_CLIENT_SHARE,
            rst_per_sec: shed_common::DEFAULT_RST_PER_SEC,
            rst_per_prefix_per_sec: shed_common::DEFAULT_RST_PER_PREFIX_PER_SEC,
            retry_after_s: 0,
            handshake_shift: 0,
            share_permille: shed_common::tier::DEFAULT_SHARE_PERMILLE,
            tier_action: [shed_common::tier::ACTION_DEFAULT; shed_common::tier::COUNT],
            action,
            dry_run,
            count_mode,
            control,
        }
    }
}

/// Removes the pin folder and everything in it.
/// One namespace's gate, opened from its pins.
pub(crate) struct PinnedGate {
    /// The namespace's label (see [`paths::netns_label`]).
    pub netns: String,
    /// The pod it serves (`namespace/name`), for a pod's gate (`attach --pods`).
    pub pod: Option<String>,
    pub maps: GateMaps,
    /// Left judging by a stopped node agent for the next, not yet taken over.
    pub handing_over: bool,
}

/// The gates among `gates` that protect `port`; when none does, the error
/// that names the port and what is protected.
pub(crate) fn protecting(gates: Vec<PinnedGate>, port: u16) -> Result<Vec<PinnedGate>, Error> {
    let (with, without): (Vec<_>, Vec<_>) = gates.into_iter().partition(|g| g.maps.config(port).is_ok());
    match (with.is_empty(), without.first()) {
        (true, Some(gate)) => Err(gate.maps.config(port).expect_err("no gate protects the port")),
        _ => Ok(with),
    }
}

/// The pin folders of the running gate, by namespace label, in label order:
/// the daemon's own namespace in [`paths::PIN_DIR`], each `--netns` in
/// [`paths::NETNS_PIN_DIR`].
pub(crate) fn pinned_gate_dirs() -> Vec<(String, std::path::PathBuf)> {
    let mut dirs = Vec::new();
    if Path::new(paths::PIN_DIR).join(map::PORTS).exists() {
        dirs.push((paths::OWN_NETNS_LABEL.to_owned(), Path::new(paths::PIN_DIR).to_path_buf()));
    }
    if let Ok(entries) = fs::read_dir(paths::NETNS_PIN_DIR) {
        for entry in entries.flatten() {
            if entry.path().join(map::PORTS).exists() {
                dirs.push((entry.file_name().to_string_lossy().into_owned(), entry.path()));
            }
        }
    }
    dirs.sort();
    dirs
}

pub fn remove_pins(dir: &Path) -> Result<(), Error> {
    match fs::remove_dir_all(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io("remove pins", dir, e)),
    }
}

/// The `memlock:` line of a BPF object's fdinfo.
fn memlock_of(fd: i32) -> Option<u64> {
    let info = fs::read_to_string(format!("/proc/self/fdinfo/{fd}")).ok()?;
    info.lines().find_map(|l| l.strip_prefix("memlock:")).and_then(|v| v.trim().parse().ok())
}

/// Sets entry `index` of an array of maps to `inner` (`Some`) or deletes it
/// (`None`: the kernel drops its reference to the inner map). Raw, as aya
/// 0.14's `ArrayOfMaps` has no delete: and the kernel waits out an RCU grace
/// period in each (tens of ms), so callers run them side by side.
pub(crate) fn set_index(
    map: std::os::fd::BorrowedFd<'_>,
    index: u32,
    inner: Option<std::os::fd::BorrowedFd<'_>>,
) -> std::io::Result<()> {
    use std::os::fd::AsRawFd as _;
    /// `union bpf_attr`'s map element member.
    #[repr(C)]
    struct ElemAttr {
        map_fd: u32,
        _pad: u32,
        key: u64,
        value: u64,
        flags: u64,
    }
    const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
    const BPF_MAP_DELETE_ELEM: libc::c_long = 3;
    let value: u32 = inner.map_or(0, |fd| fd.as_raw_fd() as u32);
    let (command, value_at) = match inner {
        Some(_) => (BPF_MAP_UPDATE_ELEM, (&raw const value) as u64),
        None => (BPF_MAP_DELETE_ELEM, 0),
    };
    let mut attr =
        ElemAttr { map_fd: map.as_raw_fd() as u32, _pad: 0, key: (&raw const index) as u64, value: value_at, flags: 0 };
    // SAFETY: the kernel reads the attr, a u32 key at `key` and a u32 fd at `value`.
    let ret = unsafe { libc::syscall(libc::SYS_bpf, command, (&raw mut attr).cast::<u8>(), size_of::<ElemAttr>()) };
    if ret < 0 { Err(std::io::Error::last_os_error()) } else { Ok(()) }
}

/// All entries of a hash map through BPF_MAP_LOOKUP_BATCH.
fn lookup_batch<K: aya::Pod, V: aya::Pod>(map_fd: i32) -> std::io::Result<Vec<(K, V)>> {
    /// `union bpf_attr`'s `batch` member.
    #[repr(C)]
    #[derive(Default)]
    struct BatchAttr {
        in_batch: u64,
        out_batch: u64,
        keys: u64,
        values: u64,
        count: u32,
        map_fd: u32,
        elem_flags: u64,
        flags: u64,
    }
    const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;
    // Larger than any hash bucket can get, so a batch always fits one bucket.
    const CHUNK: usize = 4096;
    let mut keys: Vec<K> = Vec::with_capacity(CHUNK);
    let mut values: Vec<V> = Vec::with_capacity(CHUNK);
    let mut out = Vec::new();
    // A hash map's batch token is a bucket index (u32).
    let (mut token, mut next) = (0u32, 0u32);
    let mut first = true;
    loop {
        let mut attr = BatchAttr {
            in_batch: if first { 0 } else { (&raw const token) as u64 },
            out_batch: (&raw mut next) as u64,
            keys: keys.as_mut_ptr() as u64,
            values: values.as_mut_ptr() as u64,
            count: CHUNK as u32,
            map_fd: map_fd as u32,
            ..Default::default()
        };
        // SAFETY: the kernel writes at most `count` keys and values into buffers of
        // that capacity, and the token into `next`.
        let ret = unsafe {
            libc::syscall(libc::SYS_bpf, BPF_MAP_LOOKUP_BATCH, (&raw mut attr).cast::<u8>(), size_of::<BatchAttr>())
        };
        let err = (ret < 0).then(std::io::Error::last_os_error);
        let got = attr.count as usize;
        // SAFETY: the kernel filled the first `got` (<= CHUNK) entries of each.
        unsafe {
            keys.set_len(got.min(CHUNK));
            values.set_len(got.min(CHUNK));
        }
        out.extend(keys.drain(..).zip(values.drain(..)));
        match err {
            None => {}
            // The end of the map (the last batch may carry entries).
            Some(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(out),
            Some(e) => return Err(e),
        }
        token = next;
        first = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_address_finds_one_of_its_two_slots() {
        use shed_common::local_addr::{SLOTS, slots};
        // Far more addresses than a host has: 1,500 in 4,096 slots.
        let addrs: BTreeMap<[u8; 16], u32> =
            (0..1500u32).map(|i| (shed_common::ipv4_mapped((0x0a00_0000 + i * 7).to_be_bytes()), 1)).collect();
        let (table, left_out) = local_addr_table(&addrs);
        assert!(left_out.is_empty(), "{} left out", left_out.len());
        assert_eq!(table.len(), SLOTS as usize);
        for (addr, kind) in &addrs {
            let (a, b) = slots(addr);
            let found = [a, b].iter().any(|&s| table[s as usize].addr == *addr && table[s as usize].kind == *kind);
            assert!(found, "{addr:?} is in one of its slots");
        }
        assert_eq!(table.iter().filter(|e| e.kind != 0).count(), 1500, "each address once");
    }
}
