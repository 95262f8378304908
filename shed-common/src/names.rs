// SPDX-License-Identifier: MIT OR Apache-2.0
//! Names and sizes the kernel object and userspace agree on: every map and
//! program by name, and the maps' capacities.

/// Map names, as they appear in the object file and under the pin folder.
pub mod map {
    /// `HashMap<u16 port, PortConfig>`: protected ports. Written by userspace, read by every program.
    pub const PORTS: &str = "SHED_PORTS";
    /// `Array<PortState>` indexed by slot: in-flight accounting. Written only by the kernel (atomics).
    pub const PORT_STATE: &str = "SHED_PORT_STATE";
    /// `Array<UserPortState>` indexed by slot: the daemon's share of the accounting (expired reservations).
    pub const USER_STATE: &str = "SHED_USER_STATE";
    /// `PerCpuArray<PortCounters>` indexed by slot: event counters. Written by the kernel.
    pub const COUNTERS: &str = "SHED_COUNTERS";
    /// `Array<HandshakeRing>` indexed by slot: handshakes admitted and not yet
    /// established, by epoch (see [`crate::handshake`]). Written by the kernel (atomics).
    pub const HANDSHAKES: &str = "SHED_HANDSHAKES";
    /// `Array<HandshakeRing>` indexed by slot: [`crate::count_mode::WORK`]
    /// connections accepted that have sent nothing yet, by epoch of the silent
    /// shift: they count for a grace only. Written by the kernel (atomics).
    pub const SILENT: &str = "SHED_SILENT";
    /// `Array<HandshakeStamp>`, [`crate::handshake::STAMPS_PER_PORT`] per slot:
    /// when each flow was admitted. Written by the kernel.
    pub const STAMPS: &str = "SHED_STAMPS";
    /// `Array<LocalAddr>` of [`local_addr::SLOTS`]: the protected namespace's own
    /// addresses, each in one of its two slots (see [`local_addr::slots`]). Only SYNs
    /// addressed to one of them are judged. Written by the daemon.
    pub const LOCAL_ADDRS: &str = "SHED_LOCAL_ADDRS";
    /// `PerCpuArray<GateCounters>[1]`: what the gate did with packets it could not
    /// tie to a port (fragments, unparsable headers). Written by the kernel.
    pub const GATE_COUNTERS: &str = "SHED_GATE_COUNTERS";
    /// `HashMap<u64 sock address, SockEntry>`: established sockets counted in flight, so each is released once.
    pub const SOCKS: &str = "SHED_SOCKS";
    /// `Array<u32>` indexed by slot: the current concurrency limit. Written by the daemon's
    /// controller and by `shedctl set --limit`; read by the gate.
    pub const LIMITS: &str = "SHED_LIMITS";
    /// `PerCpuArray<PortLatency>` indexed by slot: request latency histograms. Written by the kernel.
    pub const LATENCY: &str = "SHED_LATENCY";
    /// `Array<ControlConfig>` indexed by slot: the controller's settings. Written by `shedctl`, read by the daemon.
    pub const CONTROL: &str = "SHED_CONTROL";
    /// `Array<ControlStatus>` indexed by slot: the controller's last window. Written by the daemon, read by `shedctl stats`.
    pub const STATUS: &str = "SHED_STATUS";
    /// `LpmTrie<[u8; 16], u32>`: client CIDR (IPv4-mapped for IPv4) -> tier. Written by `shedctl`, read by the kernel.
    pub const TIERS: &str = "SHED_TIERS";
    /// `Array<TierReserve>` indexed by slot: room held back from each tier for the tiers above it.
    /// Written by the daemon, read by the gate.
    pub const RESERVE: &str = "SHED_RESERVE";

    /// `HashMap<ClientKey, i64>`: a client's established connections (opened minus
    /// closed; kernel atomics). Only confirmed handshakes enter it, so forged
    /// sources cannot fill it.
    pub const CLIENTS: &str = "SHED_CLIENTS";
    /// `LruHashMap<ClientKey, HandshakeRing>`: a client's admissions at the ACK
    /// that the kernel has not established yet, in the port's handshake
    /// epochs, so caps and shares count them (they lapse with their epoch,
    /// like the port's own ring). Kernel only.
    pub const PENDING_CLIENTS: &str = "SHED_PENDING_CLIENTS";
    /// `Array<HandshakeRing>` of one zeroed entry: the value a client's first
    /// pending admission inserts (too large for the kernel program's stack). Never written.
    pub const EMPTY_RING: &str = "SHED_EMPTY_RING";
    /// `PerCpuArray<u64>` of one word a kernel program writes and reads back
    /// at once, so the verifier merges the paths that computed the value. Kernel only.
    pub const FORGET: &str = "SHED_FORGET";
    /// `Array<Contention>` indexed by slot: when a client at its share was last
    /// judged and when one under it was last refused (the client share). Kernel-written.
    pub const CONTENTION: &str = "SHED_CONTENTION";
    /// `Array<u64>` indexed by slot: the port's RST budget (a GCRA time, see
    /// [`crate::ratelimit`]). Kernel only.
    pub const RST_BUCKETS: &str = "SHED_RST_BUCKETS";
    /// `Array<u64>`, [`crate::ratelimit::PREFIX_BUCKETS_PER_PORT`] per slot: RST budget
    /// per source prefix, by prefix hash. Kernel only.
    pub const RST_PREFIX_BUCKETS: &str = "SHED_RST_PREFIX";

    /// `Array<NetnsFilter>[1]`: which network namespace's sockets to count. Written by the daemon.
    pub const NETNS: &str = "SHED_NETNS";
    /// `Array<u32>` indexed by port: 0 for an unprotected port, else its slot + 1.
    /// The gate's first lookup for every SYN (an array, not a hash). Written by `shedctl`.
    pub const PORT_SLOTS: &str = "SHED_PORT_SLOTS";
    /// `Array<PortConfig>` indexed by slot: the gate's copy of [`PORTS`], read
    /// with one array lookup. Written by `shedctl` with every config change.
    pub const SLOT_CONFIG: &str = "SHED_SLOT_CONFIG";
    /// `Array<u64>` of [`crate::rare::COUNT`]: when each rare path last logged
    /// (kernel only; see `attach --kernel-log`).
    pub const RARE_STAMPS: &str = "SHED_RARE_STAMPS";
    /// `PerCpuArray<LastPassed>[1]`: the last segment this CPU judged and
    /// passed, so a segment that crosses stacked devices (bridge, VLAN,
    /// macvlan, bond) is judged once (kernel only).
    pub const LAST_PASSED: &str = "SHED_LAST_PASSED";

    /// `ProgramArray` of [`crate::dispatch::SLOTS`]: a node agent's pod gates'
    /// accounting programs, [`crate::dispatch::EVENTS`] per gate (see
    /// [`crate::dispatch`]). Written by the agent; used only by the node's dispatcher.
    pub const DISPATCH_TARGETS: &str = "SHED_DISPATCH_TARGETS";
    /// `HashMap<u32 namespace inode, u32 gate>`: the pods' namespaces the
    /// dispatcher hands connections of. Written by the agent.
    pub const DISPATCH_NETNS: &str = "SHED_DISPATCH_NETNS";
    /// `HashMap<u64 sock address, u32 gate>`: whose gate each accepted
    /// connection of a pod is, from its handshake's end to its close.
    /// Written by the dispatcher.
    pub const DISPATCH_SOCKS: &str = "SHED_DISPATCH_SOCKS";
    /// `Array<DispatchBooks>` of [`crate::dispatch::GATES`]: each gate's
    /// followed and unfollowed connections. Written by the dispatcher.
    pub const DISPATCH_BOOKS: &str = "SHED_DISPATCH_BOOKS";

    /// `LruHashMap<u64 sock address, RefusedTurn>`: requests refused on
    /// kept-alive connections, until the daemon closes their sockets. Written
    /// by the gate, drained by the daemon.
    pub const REFUSED_TURNS: &str = "SHED_REFUSED_TURNS";
    /// `ProgramArray[1]`: the TC gate's turn program (`shed_tc_turn`). Written by userspace at load.
    pub const TURN_TC: &str = "SHED_TURN_TC";
    /// `ProgramArray[1]`: the XDP gate's (`shed_xdp_turn`); a program array serves one program type.
    pub const TURN_XDP: &str = "SHED_TURN_XDP";
    /// `PerCpuArray<u64>[1]`: the socket the gate hands its turn program (kernel only).
    pub const TURN_SOCKET: &str = "SHED_TURN_SOCKET";

    /// `PerCpuArray<u32>[2]`: a shared object's gate of the program running
    /// now (+1, 0: none), and the one to restore after a turn program (kernel only).
    pub const GATE_NOW: &str = "SHED_GATE_NOW";

    /// The maps a pod keeps of its own under a shared object (see
    /// [`crate::dispatch`]), each with the `ArrayOfMaps` by gate that the
    /// shared programs find it in.
    pub const GATED: [(&str, &str); 21] = [
        (PORT_SLOTS, "SHED_PORT_SLOTS_OF"),
        (SLOT_CONFIG, "SHED_SLOT_CONFIG_OF"),
        (PORT_STATE, "SHED_PORT_STATE_OF"),
        (USER_STATE, "SHED_USER_STATE_OF"),
        (COUNTERS, "SHED_COUNTERS_OF"),
        (HANDSHAKES, "SHED_HANDSHAKES_OF"),
        (SILENT, "SHED_SILENT_OF"),
        (STAMPS, "SHED_STAMPS_OF"),
        (REFUSED_TURNS, "SHED_REFUSED_TURNS_OF"),
        (LOCAL_ADDRS, "SHED_LOCAL_ADDRS_OF"),
        (GATE_COUNTERS, "SHED_GATE_COUNTERS_OF"),
        (SOCKS, "SHED_SOCKS_OF"),
        (LIMITS, "SHED_LIMITS_OF"),
        (LATENCY, "SHED_LATENCY_OF"),
        (RST_BUCKETS, "SHED_RST_BUCKETS_OF"),
        (RST_PREFIX_BUCKETS, "SHED_RST_PREFIX_OF"),
        (CLIENTS, "SHED_CLIENTS_OF"),
        (PENDING_CLIENTS, "SHED_PENDING_CLIENTS_OF"),
        (CONTENTION, "SHED_CONTENTION_OF"),
        (RESERVE, "SHED_RESERVE_OF"),
        (TIERS, "SHED_TIERS_OF"),
    ];

    /// Every map of the kernel object by name, in one place (the daemon pins
    /// those it opens as `GateMaps`; `RARE_STAMPS` and `LAST_PASSED` are the kernel's alone).
    pub const ALL: [&str; 37] = [
        PORTS,
        PORT_STATE,
        USER_STATE,
        COUNTERS,
        HANDSHAKES,
        SILENT,
        STAMPS,
        LOCAL_ADDRS,
        GATE_COUNTERS,
        SOCKS,
        LIMITS,
        LATENCY,
        CONTROL,
        STATUS,
        TIERS,
        RESERVE,
        CLIENTS,
        PENDING_CLIENTS,
        EMPTY_RING,
        FORGET,
        CONTENTION,
        NETNS,
        RST_BUCKETS,
        RST_PREFIX_BUCKETS,
        PORT_SLOTS,
        SLOT_CONFIG,
        RARE_STAMPS,
        LAST_PASSED,
        DISPATCH_TARGETS,
        DISPATCH_NETNS,
        DISPATCH_SOCKS,
        DISPATCH_BOOKS,
        REFUSED_TURNS,
        TURN_TC,
        TURN_XDP,
        TURN_SOCKET,
        GATE_NOW,
    ];
}

/// Program names (the function names in `shed-ebpf`).
pub mod program {
    pub const XDP: &str = "shed_xdp";
    pub const TC: &str = "shed_tc";
    /// `sock:inet_sock_set_state` as a regular tracepoint: only where BTF lacks the socket's layout.
    pub const SOCK_STATE: &str = "shed_sock_state";
    /// `sock:inet_sock_set_state` as a raw tracepoint, reading the socket at BTF offsets.
    pub const SOCK_STATE_RAW: &str = "shed_sock_state_raw";
    /// `sock:sk_data_ready`: request bytes reached a tracked socket.
    pub const DATA_READY: &str = "shed_data_ready";
    /// `sock:sock_recv_length`: the application read them.
    pub const RECV: &str = "shed_recv";
    /// `sock:sock_send_length`: the application answered.
    pub const SEND: &str = "shed_send";
    /// The TC gate's tail call for the first segment of a kept-alive connection's next request.
    pub const TC_TURN: &str = "shed_tc_turn";
    /// The XDP gate's.
    pub const XDP_TURN: &str = "shed_xdp_turn";
    /// XDP_PASS only: for the peer of a veth gated with XDP, so XDP_TX replies are delivered.
    pub const XDP_PASS: &str = "shed_xdp_pass";
    /// XDP_DROP only: the cheapest possible verdict, a benchmark baseline.
    pub const XDP_DROP: &str = "shed_xdp_drop";
    /// TC_ACT_OK only: with [`HOOK_NOTHING`], a benchmark baseline.
    pub const TC_PASS: &str = "shed_tc_pass";
    /// A raw tracepoint program that does nothing, attached to every event of
    /// [`DISPATCHERS`]: what running any program at shed's hooks costs (a benchmark baseline).
    pub const HOOK_NOTHING: &str = "shed_hook_nothing";
    /// The node agent's dispatchers: one per socket tracepoint for all the
    /// pods' gates, each handing the event to the gate of the socket's pod.
    pub const DISPATCH_SOCK_STATE: &str = "shed_dispatch_sock_state";
    pub const DISPATCH_DATA_READY: &str = "shed_dispatch_data_ready";
    pub const DISPATCH_RECV: &str = "shed_dispatch_recv";
    pub const DISPATCH_SEND: &str = "shed_dispatch_send";
    /// Each dispatcher, the `sock:` event it attaches to, and the gate's
    /// program it hands over to, in [`crate::dispatch`]'s event order.
    pub const DISPATCHERS: [(&str, &str, &str); 4] = [
        (DISPATCH_SOCK_STATE, "inet_sock_set_state", SOCK_STATE_RAW),
        (DISPATCH_DATA_READY, "sk_data_ready", DATA_READY),
        (DISPATCH_RECV, "sock_recv_length", RECV),
        (DISPATCH_SEND, "sock_send_length", SEND),
    ];
    /// The raw tracepoint programs and the `sock:` events they attach to.
    pub const RAW_TRACEPOINTS: [(&str, &str); 3] =
        [(DATA_READY, "sk_data_ready"), (RECV, "sock_recv_length"), (SEND, "sock_send_length")];
}

/// Capacities of the kernel maps.
pub mod capacity {
    /// Ports one gate can protect at once (slots in the per-port arrays).
    pub const MAX_PORTS: u32 = 64;
    /// TCP port numbers: the maps indexed by port have one entry each.
    pub const PORT_NUMBERS: u32 = 1 << 16;
    /// Established sockets tracked across all ports, by default (`--max-connections`).
    /// Its entries are not preallocated (about 200 bytes each as they come),
    /// its buckets are: 16 bytes per entry of this size, 4 MiB.
    pub const MAX_SOCKS: u32 = 262_144;
    /// Refused requests awaiting the daemon's close (it drains them every tick).
    pub const MAX_REFUSED_TURNS: u32 = 8_192;
    /// Client CIDRs with a tier.
    pub const MAX_TIER_ENTRIES: u32 = 16_384;
    /// Clients counted against a per-client cap, across ports, by default
    /// (`--max-clients`). Not preallocated either.
    pub const MAX_CLIENTS: u32 = 65_536;
    /// Clients with admissions still pending: a handshake window is
    /// milliseconds (8 ms by default: 1,024 clients is 128,000 new clients a
    /// second). An LRU, preallocated (about 200 KiB), so a flood of real
    /// clients evicts the least recent, whose pending admissions then count
    /// only once established.
    pub const MAX_PENDING_CLIENTS: u32 = 1_024;
    /// Ports one pod's gate can protect: a pod's object is sized for this
    /// many slots, an eighth of a node gate's, so its per-port maps cost an
    /// eighth too (`shed.io/ports` lists at most this many).
    pub const POD_MAX_PORTS: u32 = 8;
    /// Established sockets one pod's gate tracks, by default
    /// (`--pod-max-connections`). A hash map's buckets are allocated when
    /// it is created, used or not (16 bytes each): 256 KiB here, where the
    /// node's 262,144 cost 4 MiB in every pod.
    pub const POD_MAX_CONNECTIONS: u32 = 16_384;
    /// Clients one pod's gate counts against a cap, by default (`--pod-max-clients`).
    pub const POD_MAX_CLIENTS: u32 = 4_096;
}
