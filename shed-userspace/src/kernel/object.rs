// SPDX-License-Identifier: MIT OR Apache-2.0
//! The kernel object embedded at build time (see `build.rs`).
use std::path::Path;

use aya::{Ebpf, EbpfLoader};

use shed_common::capacity::{MAX_PORTS, POD_MAX_PORTS};

use crate::error::Error;

static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/shed.bpf.o"));
/// The node agent's shared object for all its pods ([`shed_common::dispatch::SHARED_OBJECT`]).
static SHARED_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/shed-shared.bpf.o"));

/// The embedded object's bytes; empty when the build had no kernel object.
pub fn bytes() -> &'static [u8] {
    OBJECT
}

/// How the object is loaded: the sizes of the maps that grow with the host
/// (neither is preallocated, so a larger size costs nothing until used), and
/// whether the kernel programs may log their rare paths.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoadOptions {
    /// `SHED_SOCKS`: established connections counted (`--max-connections`).
    pub connections: u32,
    /// `SHED_CLIENTS`: clients under a per-client cap (`--max-clients`).
    pub clients: u32,
    /// Ports the gate can protect: the slots of every per-port map (a node's
    /// gate [`MAX_PORTS`], a pod's [`POD_MAX_PORTS`]). The refused requests'
    /// and pending clients' tables are sized in proportion.
    pub slots: u32,
    /// `--kernel-log`: aya-log's level global at warn instead of off (see
    /// shed-ebpf's `rare` module); off, the verifier prunes every log call.
    pub kernel_log: bool,
    /// Which tracepoint counts connections (the regular one only for tests
    /// and hosts whose BTF lacks the socket's layout).
    pub sock_state: SockStateHook,
    /// A node agent's dispatchers' object ([`crate::kernel::dispatch`]):
    /// its dispatch tables full-sized and a gate's maps at one entry, where a
    /// gate's object has it the other way round (a hash map's buckets are
    /// allocated at creation, preallocated or not: 4 MiB at 262,144 entries).
    pub dispatcher: bool,
    /// The dispatchers' object that also judges and counts for every pod
    /// itself: the shared object ([`shed_common::dispatch::SHARED_OBJECT`]),
    /// its `_OF` arrays sized for every gate.
    pub shared: bool,
}

impl LoadOptions {
    /// The dispatchers' object: tables for `connections` sockets.
    pub fn dispatcher(connections: u32, shared: bool, kernel_log: bool) -> Self {
        Self {
            connections,
            clients: 1,
            slots: 1,
            kernel_log,
            sock_state: SockStateHook::Auto,
            dispatcher: true,
            shared,
        }
    }

    /// A pod's gate: [`POD_MAX_PORTS`] slots, and its own tables of
    /// `connections` and `clients` (`--pod-max-connections`, `--pod-max-clients`).
    pub fn pod(connections: u32, clients: u32, kernel_log: bool) -> Self {
        Self {
            connections,
            clients,
            slots: POD_MAX_PORTS,
            kernel_log,
            sock_state: SockStateHook::Auto,
            dispatcher: false,
            shared: false,
        }
    }

    /// Each map this sizes, with its entries: the per-port maps by slot, the
    /// tables of connections and clients, and aya-log's ring (a page while
    /// the kernel programs do not log, where its default is 128 KiB).
    pub fn map_sizes(&self) -> Vec<(&'static str, u32)> {
        use shed_common::{capacity, handshake::STAMPS_PER_PORT, map, ratelimit::PREFIX_BUCKETS_PER_PORT};
        let slots = self.slots.clamp(1, MAX_PORTS);
        let share = |of: u32| (u64::from(of) * u64::from(slots) / u64::from(MAX_PORTS)).max(1) as u32;
        let (socks, pending, dispatch) = if self.dispatcher {
            (1, 1, (shed_common::dispatch::SLOTS, shed_common::dispatch::GATES, self.connections))
        } else {
            (self.connections, share(capacity::MAX_PENDING_CLIENTS), (1, 1, 1))
        };
        let mut sizes: Vec<(&'static str, u32)> = PER_SLOT.iter().map(|&name| (name, slots)).collect();
        sizes.extend([
            (map::STAMPS, slots * STAMPS_PER_PORT),
            (map::RST_PREFIX_BUCKETS, slots * PREFIX_BUCKETS_PER_PORT),
            (map::REFUSED_TURNS, share(capacity::MAX_REFUSED_TURNS)),
            (map::SOCKS, socks),
            (map::CLIENTS, self.clients),
            (map::PENDING_CLIENTS, pending),
            (map::DISPATCH_TARGETS, dispatch.0),
            (map::DISPATCH_NETNS, dispatch.1),
            (map::DISPATCH_SOCKS, dispatch.2),
            (map::DISPATCH_BOOKS, dispatch.1),
        ]);
        // The shared object's arrays of the pods' maps.
        if self.shared {
            sizes.extend(map::GATED.iter().map(|&(_, of)| (of, shed_common::dispatch::GATES)));
        }
        if !self.kernel_log {
            sizes.push((AYA_LOGS, LOG_RING_OFF));
        }
        sizes
    }
}

/// The maps with one entry per slot (port).
const PER_SLOT: [&str; 14] = [
    shed_common::map::PORTS,
    shed_common::map::SLOT_CONFIG,
    shed_common::map::PORT_STATE,
    shed_common::map::USER_STATE,
    shed_common::map::COUNTERS,
    shed_common::map::HANDSHAKES,
    shed_common::map::SILENT,
    shed_common::map::LIMITS,
    shed_common::map::LATENCY,
    shed_common::map::CONTROL,
    shed_common::map::STATUS,
    shed_common::map::RST_BUCKETS,
    shed_common::map::CONTENTION,
    shed_common::map::RESERVE,
];

/// aya-log's ring buffer in the kernel object (aya-log-ebpf names it so).
const AYA_LOGS: &str = "AYA_LOGS";
/// Its size while nothing logs: one page, the least a ring buffer takes.
const LOG_RING_OFF: u32 = 4096;

impl Default for LoadOptions {
    fn default() -> Self {
        Self {
            connections: shed_common::capacity::MAX_SOCKS,
            clients: shed_common::capacity::MAX_CLIENTS,
            slots: MAX_PORTS,
            kernel_log: false,
            sock_state: SockStateHook::Auto,
            dispatcher: false,
            shared: false,
        }
    }
}

/// aya-log's levels: 0 logs nothing, 2 logs warnings and errors.
const LOG_OFF: u8 = 0;
const LOG_WARN: u8 = 2;

/// `strict`: the object must have aya-log's level global (the embedded one
/// does; an older build loaded from disk for comparison may not).
fn loader(options: LoadOptions, strict: bool) -> EbpfLoader<'static> {
    let mut loader = EbpfLoader::new();
    let level: &'static u8 = if options.kernel_log { &LOG_WARN } else { &LOG_OFF };
    // One secret per load (a leak of 8 bytes per load: the loader keeps a reference).
    let secret: &'static u64 = Box::leak(Box::new(flow_secret()));
    let snt_isn: &'static u32 = Box::leak(Box::new(snt_isn_offset()));
    let rcv_nxt: &'static u32 = Box::leak(Box::new(rcv_nxt_offset()));
    let rcv_isn: &'static u32 = Box::leak(Box::new(rcv_isn_offset()));
    let (sk_state, copied_seq) = fin_offsets();
    let sk_state: &'static u32 = Box::leak(Box::new(sk_state));
    let copied_seq: &'static u32 = Box::leak(Box::new(copied_seq));
    let cookie_key: &'static [u64; 2] = Box::leak(Box::new(cookie_key()));
    let layout: &'static shed_common::SockLayout = Box::leak(Box::new(sock_layout()));
    // A dispatcher's per-gate quota of its connections (see shed_common::dispatch).
    let quota: &'static u32 = Box::leak(Box::new((options.connections / shed_common::dispatch::QUOTA_DIVISOR).max(1)));
    for (name, entries) in options.map_sizes() {
        loader.map_max_entries(name, entries);
    }
    loader
        .override_global(aya_log::LEVEL, level, strict)
        .override_global(shed_common::handshake::FLOW_SECRET_GLOBAL, secret, strict)
        .override_global(shed_common::handshake::SNT_ISN_OFFSET_GLOBAL, snt_isn, strict)
        .override_global(shed_common::http::COOKIE_KEY_GLOBAL, cookie_key, strict)
        // Not strict: an older object loaded for comparison has none.
        .override_global(shed_common::handshake::RCV_NXT_OFFSET_GLOBAL, rcv_nxt, false)
        .override_global(shed_common::handshake::RCV_ISN_OFFSET_GLOBAL, rcv_isn, false)
        .override_global(shed_common::SK_STATE_OFFSET_GLOBAL, sk_state, false)
        .override_global(shed_common::COPIED_SEQ_OFFSET_GLOBAL, copied_seq, false)
        .override_global(shed_common::SOCK_LAYOUT_GLOBAL, layout, false)
        .override_global(shed_common::dispatch::QUOTA_GLOBAL, quota, false);
    loader
}

/// `offsetof(struct_name, field)` in the running kernel's BTF, or 0 with
/// `warning` logged (the kernel programs then skip the check it serves).
fn btf_offset(struct_name: &str, field: &str, warning: &str) -> u32 {
    let found = crate::host::btf::Btf::from_sys_fs()
        .and_then(|btf| btf.offset_of(struct_name, &[field]))
        .filter(|&offset| offset != 0);
    found.unwrap_or_else(|| {
        tracing::warn!("no {struct_name}.{field} in /sys/kernel/btf/vmlinux: {warning}");
        0
    })
}

/// `offsetof(struct tcp_request_sock, snt_isn)` on the running kernel, so a
/// handshake-completing ACK is judged only if it acknowledges the SYN-ACK (0,
/// with a warning, if the kernel's BTF lacks it: ACKs are then judged on the
/// request socket alone, and a blind forger that sent the SYN can follow it
/// with ACKs that hold a reservation each for the handshake window).
fn snt_isn_offset() -> u32 {
    static OFFSET: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *OFFSET.get_or_init(|| {
        btf_offset(
            "tcp_request_sock",
            "snt_isn",
            "handshake-completing ACKs are judged without checking their ack number (blind forged ACKs can hold reservations)",
        )
    })
}

/// `offsetof(struct tcp_request_sock, rcv_isn)` on the running kernel, so a
/// handshake-completing ACK that the kernel would drop (its sequence number
/// out of the request's window) takes no reservation (0, with a warning, if
/// the kernel's BTF lacks it: one real address could then keep re-taking
/// reservations that lapse).
fn rcv_isn_offset() -> u32 {
    static OFFSET: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *OFFSET.get_or_init(|| {
        btf_offset(
            "tcp_request_sock",
            "rcv_isn",
            "handshake-completing ACKs are judged whatever their sequence number (ACKs the kernel drops can take reservations)",
        )
    })
}

/// `offsetof(struct tcp_sock, rcv_nxt)` on the running kernel, so a request
/// on a kept-alive connection is judged at its first byte only, never at a
/// retransmission of data the socket has (0, with a warning, if the kernel's
/// BTF lacks it: judged on the connection's idle state alone).
fn rcv_nxt_offset() -> u32 {
    static OFFSET: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *OFFSET.get_or_init(|| {
        btf_offset(
            "tcp_sock",
            "rcv_nxt",
            "a kept-alive connection's next request is told by the connection's idle state alone (a late retransmission of an answered request may be judged)",
        )
    })
}

/// `offsetof(struct sock_common, skc_state)` and `offsetof(struct tcp_sock,
/// copied_seq)` on the running kernel, so a client's FIN after its answer is
/// not taken for a request's bytes (0s, with a warning, if the kernel's BTF
/// lacks either: every client-closed connection then counts one abandoned
/// request).
fn fin_offsets() -> (u32, u32) {
    static OFFSETS: std::sync::OnceLock<(u32, u32)> = std::sync::OnceLock::new();
    *OFFSETS.get_or_init(|| {
        const WHY: &str = "a client's FIN after its answer counts as a request its client abandoned";
        // skc_state is not at the socket's start (skc_daddr is): 0 is not found.
        (btf_offset("sock_common", "skc_state", WHY), btf_offset("tcp_sock", "copied_seq", WHY))
    })
}

/// Where the socket keeps what the raw accounting program reads, from the
/// kernel's BTF; unknown (all 0, with a warning once), the regular tracepoint
/// is attached instead ([`sock_state_hook`]).
pub(crate) fn sock_layout() -> shed_common::SockLayout {
    static LAYOUT: std::sync::OnceLock<shed_common::SockLayout> = std::sync::OnceLock::new();
    *LAYOUT.get_or_init(|| {
        crate::host::system::sock_layout().unwrap_or_else(|why| {
            tracing::warn!(
                "{why}: connections are counted from the regular sock:inet_sock_set_state tracepoint, which runs \
                 at most 64 programs (64 gates, node and pods, per host)"
            );
            shed_common::SockLayout::default()
        })
    })
}

/// Which program counts connections: the raw tracepoint where the socket's
/// layout is known, else the regular one (whose record has the fields).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SockStateHook {
    /// The raw tracepoint if the layout is known.
    #[default]
    Auto,
    /// The regular tracepoint, whatever the BTF has.
    Tracepoint,
}

impl SockStateHook {
    /// The program this hook loads and attaches.
    pub fn program(self) -> &'static str {
        if self == Self::Auto && sock_layout().known() {
            shed_common::program::SOCK_STATE_RAW
        } else {
            shed_common::program::SOCK_STATE
        }
    }
}

/// The `http` answer's cookie key: 128 random bits per load (SipHash's key).
fn cookie_key() -> [u64; 2] {
    let mut key = [0u8; 16];
    // SAFETY: getrandom writes at most `key.len()` bytes into the buffer.
    let got = unsafe { libc::getrandom(key.as_mut_ptr().cast(), key.len(), 0) };
    if got != key.len() as isize {
        tracing::warn!("getrandom failed; the HTTP answer's cookie key is taken from the clock");
        return [flow_secret(), flow_secret().rotate_left(29) ^ u64::from(std::process::id())];
    }
    let (a, b) = key.split_at(8);
    [u64::from_ne_bytes(a.try_into().unwrap_or_default()), u64::from_ne_bytes(b.try_into().unwrap_or_default())]
}

/// A fresh secret for the handshake stamps' flow hash, from the kernel's
/// random pool (falling back on the clock: a weaker key beats no gate).
fn flow_secret() -> u64 {
    let mut key = [0u8; 8];
    // SAFETY: getrandom writes at most `key.len()` bytes into the buffer.
    let got = unsafe { libc::getrandom(key.as_mut_ptr().cast(), key.len(), 0) };
    if got == key.len() as isize {
        return u64::from_ne_bytes(key);
    }
    tracing::warn!("getrandom failed; the handshake stamps' secret is taken from the clock");
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64)
}

/// Loads the embedded object into the kernel (maps created, programs not yet loaded).
pub fn load(options: LoadOptions) -> Result<Ebpf, Error> {
    let object = if options.shared { SHARED_OBJECT } else { OBJECT };
    if object.is_empty() {
        return Err(Error::EbpfObjectMissing);
    }
    loader(options, true).load(object).map_err(|source| Error::Load { source: Box::new(source) })
}

/// Creates map `name` of the gate's object on its own, at the size
/// `options` give it: a pod's maps under the node's shared object, which no
/// program of the pod's object reads. The object is parsed once per process
/// (a load parses it again, with every program, each time: 20 ms a pod).
pub(crate) fn create_map(options: &LoadOptions, name: &str) -> Result<aya::maps::MapData, Error> {
    static PARSED: std::sync::OnceLock<Option<aya_obj::Object>> = std::sync::OnceLock::new();
    let parsed = PARSED.get_or_init(|| aya_obj::Object::parse(OBJECT).ok());
    let Some(object) = parsed else {
        // Parsed again for its error (an empty placeholder: the build had no object).
        return Err(match aya_obj::Object::parse(OBJECT) {
            Err(e) if !OBJECT.is_empty() => Error::Load { source: Box::new(aya::EbpfError::ParseError(e)) },
            _ => Error::EbpfObjectMissing,
        });
    };
    let found = object.maps.get(name).ok_or_else(|| {
        Error::map(
            format!("find map {name} in the kernel object"),
            aya::maps::MapError::InvalidName { name: name.into() },
        )
    })?;
    let entries = options.map_sizes().iter().find(|(sized, _)| *sized == name).map_or(found.max_entries(), |s| s.1);
    // Its shape alone: no program reads its BTF types, which are the object's.
    let definition = aya_obj::Map::new_from_params(
        found.map_type(),
        found.key_size(),
        found.value_size(),
        entries,
        found.map_flags(),
    );
    aya::maps::MapData::create(definition, name, None).map_err(|e| Error::map(format!("create map {name}"), e))
}

/// Loads an object file from disk instead (another build's object, such as
/// the benchmarks' `SHED_BENCH_OBJECT` for an A/B of two builds in one run).
pub(crate) fn load_file(path: &Path) -> Result<Ebpf, Error> {
    loader(LoadOptions::default(), false).load_file(path).map_err(|source| Error::Load { source: Box::new(source) })
}

#[cfg(test)]
mod tests {
    use shed_common::{capacity, map};

    use super::*;

    fn size(options: &LoadOptions, name: &str) -> Option<u32> {
        options.map_sizes().iter().find(|(n, _)| *n == name).map(|&(_, e)| e)
    }

    #[test]
    fn a_pods_object_holds_an_eighth_of_a_node_gates_slots_and_its_own_tables() {
        let node = LoadOptions::default();
        let pod = LoadOptions::pod(2_048, 512, false);
        for name in PER_SLOT {
            assert_eq!((size(&node, name), size(&pod, name)), (Some(MAX_PORTS), Some(POD_MAX_PORTS)), "{name}");
        }
        assert_eq!(size(&node, map::STAMPS), Some(64 * 1024));
        assert_eq!(size(&pod, map::STAMPS), Some(8 * 1024));
        assert_eq!(size(&pod, map::RST_PREFIX_BUCKETS), Some(8 * 1024));
        assert_eq!((size(&node, map::REFUSED_TURNS), size(&pod, map::REFUSED_TURNS)), (Some(8_192), Some(1_024)));
        assert_eq!((size(&node, map::PENDING_CLIENTS), size(&pod, map::PENDING_CLIENTS)), (Some(1_024), Some(128)));
        assert_eq!((size(&node, map::SOCKS), size(&pod, map::SOCKS)), (Some(capacity::MAX_SOCKS), Some(2_048)));
        assert_eq!((size(&node, map::CLIENTS), size(&pod, map::CLIENTS)), (Some(capacity::MAX_CLIENTS), Some(512)));
        // A gate's dispatch tables are a placeholder entry each.
        for name in [map::DISPATCH_TARGETS, map::DISPATCH_NETNS, map::DISPATCH_SOCKS, map::DISPATCH_BOOKS] {
            assert_eq!((size(&node, name), size(&pod, name)), (Some(1), Some(1)), "{name}");
        }
    }

    #[test]
    fn the_dispatchers_object_has_its_tables_and_one_slot() {
        for shared in [false, true] {
            let dispatcher = LoadOptions::dispatcher(100_000, shared, false);
            assert_eq!(size(&dispatcher, map::DISPATCH_SOCKS), Some(100_000));
            assert_eq!(size(&dispatcher, map::DISPATCH_TARGETS), Some(shed_common::dispatch::SLOTS));
            assert_eq!(size(&dispatcher, map::DISPATCH_NETNS), Some(shed_common::dispatch::GATES));
            assert_eq!((size(&dispatcher, map::SOCKS), size(&dispatcher, map::LIMITS)), (Some(1), Some(1)));
            assert_eq!(size(&dispatcher, map::STAMPS), Some(shed_common::handshake::STAMPS_PER_PORT));
            // The shared object's arrays of the pods' maps: one entry per gate; other objects have none.
            for (_, of) in map::GATED {
                let want = shared.then_some(shed_common::dispatch::GATES);
                assert_eq!(size(&dispatcher, of), want, "{of}");
                assert_eq!(size(&LoadOptions::pod(1, 1, false), of), None, "{of}");
            }
        }
    }

    /// A pod's maps under the shared object are created from the object's
    /// definitions at a pod's sizes, which the shared object's inner maps
    /// (its arrays' templates) are declared with: an array of another length
    /// would be refused by the kernel when the agent puts it in.
    #[test]
    fn a_pods_per_slot_maps_are_as_long_as_the_shared_objects_templates() {
        let pod = LoadOptions::pod(16_384, 4_096, false);
        for name in PER_SLOT {
            assert_eq!(size(&pod, name), Some(POD_MAX_PORTS), "{name}");
        }
        assert_eq!(size(&pod, map::STAMPS), Some(POD_MAX_PORTS * shed_common::handshake::STAMPS_PER_PORT));
        assert_eq!(
            size(&pod, map::RST_PREFIX_BUCKETS),
            Some(POD_MAX_PORTS * shed_common::ratelimit::PREFIX_BUCKETS_PER_PORT)
        );
    }

    #[test]
    fn the_log_ring_is_a_page_unless_the_programs_log() {
        assert_eq!(size(&LoadOptions::default(), AYA_LOGS), Some(4096));
        let logging = LoadOptions { kernel_log: true, ..LoadOptions::default() };
        assert_eq!(size(&logging, AYA_LOGS), None, "the object's own size");
        assert_eq!(size(&LoadOptions::pod(1, 1, true), AYA_LOGS), None);
    }
}
