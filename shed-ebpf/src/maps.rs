//! The kernel maps. Names and layouts come from `shed_common`; the statics are
//! named exactly like `shed_common::map::*` (the `#[map]` macro needs a literal).
use aya_ebpf::{
    macros::map,
    maps::{Array, HashMap, LpmTrie, LruHashMap, PerCpuArray},
};
use shed_common::{
    ClientKey, ControlConfig, ControlStatus, FlowKey, NetnsFilter, PendingEntry, PortBits, PortConfig, PortCounters,
    PortLatency, PortState, RstBucket, RstPrefixKey, SockEntry, TierReserve, UserPortState,
    capacity::{MAX_CLIENTS, MAX_PENDING, MAX_PORTS, MAX_SOCKS, MAX_TIER_ENTRIES},
};

#[map]
pub static SHED_PORTS: HashMap<u16, PortConfig> = HashMap::with_max_entries(MAX_PORTS, 0);

#[map]
pub static SHED_PORT_STATE: Array<PortState> = Array::with_max_entries(MAX_PORTS, 0);

#[map]
pub static SHED_USER_STATE: Array<UserPortState> = Array::with_max_entries(MAX_PORTS, 0);

#[map]
pub static SHED_COUNTERS: PerCpuArray<PortCounters> = PerCpuArray::with_max_entries(MAX_PORTS, 0);

#[map]
pub static SHED_PENDING: HashMap<FlowKey, PendingEntry> = HashMap::with_max_entries(MAX_PENDING, 0);

#[map]
pub static SHED_SOCKS: HashMap<u64, SockEntry> = HashMap::with_max_entries(MAX_SOCKS, 0);

#[map]
pub static SHED_CLOCK: Array<u64> = Array::with_max_entries(1, 0);

#[map]
pub static SHED_LIMITS: Array<u32> = Array::with_max_entries(MAX_PORTS, 0);

#[map]
pub static SHED_LATENCY: PerCpuArray<PortLatency> = PerCpuArray::with_max_entries(MAX_PORTS, 0);

// Userspace-only (controller settings and status); defined here so one object
// creates every map the gate pins.
#[map]
pub static SHED_CONTROL: Array<ControlConfig> = Array::with_max_entries(MAX_PORTS, 0);

#[map]
pub static SHED_STATUS: Array<ControlStatus> = Array::with_max_entries(MAX_PORTS, 0);

#[map]
pub static SHED_RST_BUCKETS: Array<RstBucket> = Array::with_max_entries(MAX_PORTS, 0);

/// LRU: a flood from many prefixes evicts old buckets instead of failing.
#[map]
pub static SHED_RST_PREFIX: LruHashMap<RstPrefixKey, RstBucket> = LruHashMap::with_max_entries(65_536, 0);

#[map]
pub static SHED_PORT_BITS: Array<PortBits> = Array::with_max_entries(1, 0);

/// Whether `port` may be protected (its bit is set); a miss means "not protected".
#[inline(always)]
pub fn maybe_protected(port: u16) -> bool {
    let Some(bits) = SHED_PORT_BITS.get_ptr(0) else { return false };
    // Verifier: the byte index is masked into the 8 KiB value explicitly.
    let byte = usize::from(port >> 3) & 8191;
    // SAFETY: map value of 8192 bytes; `byte` < 8192.
    unsafe { (*bits).bits[byte] & (1 << (port & 7)) != 0 }
}

#[map]
pub static SHED_NETNS: Array<NetnsFilter> = Array::with_max_entries(1, 0);

#[map]
pub static SHED_CLIENTS: HashMap<ClientKey, i64> = HashMap::with_max_entries(MAX_CLIENTS, 0);

#[map]
pub static SHED_CLIENT_EXPIRED: HashMap<ClientKey, i64> = HashMap::with_max_entries(MAX_CLIENTS, 0);

#[map]
pub static SHED_RESERVE: Array<TierReserve> = Array::with_max_entries(MAX_PORTS, 0);

#[map]
pub static SHED_TIERS: LpmTrie<[u8; 16], u32> = LpmTrie::with_max_entries(MAX_TIER_ENTRIES, 0);

/// The tier of a client address (IPv4-mapped for IPv4); unlisted sources are normal.
#[inline(always)]
pub fn tier_of(addr: &[u8; 16]) -> u8 {
    let key = aya_ebpf::maps::lpm_trie::Key::new(128, *addr);
    match SHED_TIERS.get(&key) {
        Some(&t) if (t as usize) < shed_common::tier::COUNT => t as u8,
        _ => shed_common::tier::NORMAL,
    }
}
