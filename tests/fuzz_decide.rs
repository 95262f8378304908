// SPDX-License-Identifier: MIT OR Apache-2.0
//! Differential testing of the packet path: generated frames (valid and
//! malformed) and gate states go through the loaded XDP and TC programs
//! (BPF_PROG_TEST_RUN) and through the reference model in `shed_testkit::model`;
//! verdicts, counter changes and RST bytes must agree. `SHED_FUZZ_CASES`
//! sets the number of cases (CI: 2,000 per hook; `cargo xtask fuzz`: more).
//! The ACK path is fuzzed on real handshakes: ACKs that complete request
//! sockets the kernel holds, against every state of the port and the client;
//! and requests on real kept-alive connections that owe no answer (turns).
mod support;
use aya::{
    TestRun as _, TestRunOptions,
    maps::{Array, PerCpuValues},
};
use proptest::{prelude::*, test_runner::TestRunner};
use shed::{cli::tiers::parse_cidr, kernel::maps::PortSpec, kernel::programs::Loaded};
use shed_common::{
    ClientKey, Contention, ControlConfig, GateCounters, HandshakeCell, HandshakeRing, PortConfig, PortCounters,
    PortState, TierReserve, UserPortState, action, count_mode, counter, gate_counter, handshake, ipv4_mapped,
    local_addr, map, ratelimit::prefix_bucket_index, tier,
};
use shed_testkit::{
    frames::{Spec, frame},
    model::{self, Expected, ModelState, RstBudget},
};

const PORT: u16 = 8080;

/// The namespace's own addresses in the harness; the generator also sends to others.
const LOCAL_V4: [u8; 4] = [10, 200, 0, 1];
const LOCAL_V6: [u8; 16] = [0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];

#[derive(Clone, Debug)]
struct FrameSpec {
    /// An outer 802.1ad tag (QinQ), before `vlan`; a third tag with `extra_tag`.
    outer_vlan: Option<u16>,
    vlan: Option<u16>,
    extra_tag: bool,
    /// IPv6 extension headers before `v6_next` (values, lengths in 8-byte units).
    v6_chain: Vec<(u8, u8)>,
    /// Fragment header offset-and-flags, for a 44 in the chain.
    v6_frag: u16,
    /// Send to a local address (else a forwarded one).
    to_local: bool,
    /// IPv4 total length / IPv6 payload length shortened by this many bytes (tiny fragments).
    short_by: u8,
    /// 0: IPv4, 1: IPv6, 2: ARP, 3: anything
    family: u8,
    ether_other: u16,
    version_ok: bool,
    ihl: u8,
    ip_proto: u8,
    frag: u16,
    v6_next: u8,
    client_v4: [u8; 4],
    client_v6: [u8; 16],
    dport_protected: bool,
    dport_other: u16,
    sport: u16,
    seq: u32,
    doff: u8,
    flags: u8,
    payload: Vec<u8>,
    /// Cut the frame to this many bytes (None: whole).
    cut: Option<usize>,
}

fn frame_spec() -> impl Strategy<Value = FrameSpec> {
    let addr_v4 = prop_oneof![
        Just([10, 1, 2, 3]),
        Just([10, 1, 9, 9]),
        Just(LOCAL_V4),
        Just([224, 0, 0, 5]),
        Just([255, 255, 255, 255]),
        Just([127, 0, 0, 1]),
        any::<[u8; 4]>(),
    ];
    let addr_v6 = prop_oneof![
        Just([0x20, 0x01, 0x0d, 0xb8, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 7]),
        Just([0x20, 0x01, 0x0d, 0xb8, 0, 9, 0, 0, 0, 0, 0, 0, 0, 0, 0, 7]),
        Just(LOCAL_V6),
        Just([0xff, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]),
        any::<[u8; 16]>(),
    ];
    let ext = (
        prop_oneof![3 => Just(0u8), 3 => Just(43), 3 => Just(44), 3 => Just(60), 3 => Just(51), 3 => Just(135), 1 => Just(50), 1 => Just(59)],
        0u8..3,
    );
    let headers = (
        prop::option::weighted(0.15, any::<u16>()),
        prop::bool::weighted(0.05),
        // Chains longer than the 8 headers the gate reads get a branch of their own:
        // drawn only from 3..11, they came out about 18 times in 4,000 cases, too
        // close to the coverage floor (10) to hold on every run.
        prop_oneof![
            4 => prop::collection::vec(ext.clone(), 0..3),
            2 => prop::collection::vec(ext.clone(), 3..11),
            1 => prop::collection::vec(ext, 9..12)
        ],
        prop_oneof![3 => Just(0u16), 3 => Just(1), 1 => Just(0x10), 1 => Just(0x11), 1 => any::<u16>()],
        prop::bool::weighted(0.85),
        prop_oneof![12 => Just(0u8), 1 => 1u8..30, 2 => 40u8..120],
    );
    (
        headers,
        (
            (
                prop::option::weighted(0.2, any::<u16>()),
                prop_oneof![6 => Just(0u8), 3 => Just(1u8), 1 => Just(2u8), 1 => Just(3u8)],
                any::<u16>(),
            ),
            (
                prop::bool::weighted(0.9),
                prop_oneof![8 => Just(5u8), 2 => 0u8..16],
                prop_oneof![9 => Just(6u8), 1 => any::<u8>()],
            ),
            (
                prop_oneof![
                    12 => Just(0x4000u16),
                    2 => Just(0u16),
                    3 => Just(0x2000u16),
                    1 => Just(0x0001u16),
                    1 => Just(0x2001u16),
                    1 => Just(0x0010u16),
                    1 => any::<u16>()
                ],
                prop_oneof![8 => Just(6u8), 1 => Just(0u8), 1 => any::<u8>()],
            ),
            (addr_v4, addr_v6, prop::bool::weighted(0.8), any::<u16>(), any::<u16>(), any::<u32>()),
            (
                prop_oneof![6 => Just(10u8), 2 => Just(5u8), 2 => 0u8..16],
                prop_oneof![6 => Just(0x02u8), 4 => any::<u8>()],
            ),
            (prop::collection::vec(any::<u8>(), 0..48), prop::option::weighted(0.3, 0usize..160)),
        ),
    )
        .prop_map(
            |(
                (outer_vlan, extra_tag, v6_chain, v6_frag, to_local, short_by),
                (
                    (vlan, family, ether_other),
                    (version_ok, ihl, ip_proto),
                    (frag, v6_next),
                    (client_v4, client_v6, dport_protected, dport_other, sport, seq),
                    (doff, flags),
                    (payload, cut),
                ),
            )| FrameSpec {
                outer_vlan,
                vlan,
                extra_tag,
                v6_chain,
                v6_frag,
                to_local,
                short_by,
                family,
                ether_other,
                version_ok,
                ihl,
                ip_proto,
                frag,
                v6_next,
                client_v4,
                client_v6,
                dport_protected,
                dport_other,
                sport,
                seq,
                doff,
                flags,
                payload,
                cut,
            },
        )
}

/// The generated frame, through the test kit's one frame builder.
fn build(s: &FrameSpec) -> Vec<u8> {
    let v6 = s.family == 1;
    let (v6_chain, v6_lengths) = s.v6_chain.iter().copied().unzip();
    let ihl = s.ihl & 0x0f;
    frame(&Spec {
        outer_vlan: s.outer_vlan,
        vlan: s.vlan,
        extra_vlan: s.extra_tag.then_some(9),
        ether_type: match s.family {
            0 | 1 => None,
            2 => Some(0x0806),
            _ => Some(s.ether_other),
        },
        v6,
        // The other version's nibble: a header that says it is not what it is.
        ip_version: (!s.version_ok).then_some(if v6 { 4 } else { 6 }),
        ihl: Some(ihl),
        ip_options: usize::from(ihl.max(5)) * 4 - 20,
        v6_chain,
        v6_lengths,
        v6_fragment: s.v6_frag,
        ip_short_by: u16::from(s.short_by),
        server_v4: if s.to_local { LOCAL_V4 } else { [10, 201, 0, 1] },
        server_v6: if s.to_local { LOCAL_V6 } else { [0x20, 0x01, 0x0d, 0xb8, 0, 0xee, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1] },
        protocol: if v6 { s.v6_next } else { s.ip_proto },
        frag: s.frag,
        client_port: s.sport,
        server_port: if s.dport_protected { PORT } else { s.dport_other },
        seq: s.seq,
        ack: 0,
        flags: s.flags,
        tcp_options: usize::from(s.doff.max(5)) * 4 - 20,
        doff: Some(s.doff),
        payload: s.payload.clone(),
        // Never shorter than an Ethernet header and a byte.
        cut: s.cut.map(|cut| cut.max(15)),
        client_v4: s.client_v4,
        client_v6: s.client_v6,
    })
}

/// What the port's books hold: the counts the socket tracepoint keeps, the
/// healer's adjustment, and the two epoch rings, in every state a cell can be in.
#[derive(Clone, Debug)]
struct Books {
    count_mode: u8,
    /// Held by the port's count mode (opened - closed, or busy_enter - busy_exit),
    /// and the healer's adjustment of it.
    counted: u64,
    adjust: i64,
    /// What the other count would hold (busy while counting connections,
    /// established while counting work): it must not matter.
    other: u64,
    /// The handshake ring: the current epoch's cell (admitted, completed), an
    /// earlier live epoch's open handshakes, and an ended epoch's (lapsed).
    current: (u64, u64),
    earlier: u64,
    lapsed: u64,
    /// The next epoch's open handshakes: another CPU's, whose clock read is
    /// already past the edge this frame's has not reached.
    next: u64,
    /// The silent ring (work mode): open in a live epoch, and in an ended one.
    silent: (u64, u64),
}

fn books_spec() -> impl Strategy<Value = Books> {
    (
        prop_oneof![Just(count_mode::CONNECTIONS), Just(count_mode::WORK), Just(count_mode::MULTIPLEXED)],
        (0u64..6, prop_oneof![4 => Just(0i64), 1 => -3i64..=3], 0u64..4),
        (
            (0u64..3).prop_flat_map(|admitted| (Just(admitted), 0..=admitted)),
            prop_oneof![2 => Just(0u64), 1 => 1u64..3],
        ),
        (prop_oneof![2 => Just(0u64), 1 => 1u64..4], prop_oneof![3 => Just(0u64), 1 => 1u64..3]),
        (prop_oneof![2 => Just(0u64), 1 => 1u64..3], prop_oneof![2 => Just(0u64), 1 => 1u64..4]),
    )
        .prop_map(|(count_mode, (counted, adjust, other), (current, earlier), (lapsed, next), silent)| Books {
            count_mode,
            counted,
            adjust,
            other,
            current,
            earlier,
            lapsed,
            next,
            silent,
        })
}

impl Books {
    /// What the port holds by the documented rules: its count (never below
    /// zero after the adjustment), in work mode also the connections still in
    /// their idle grace (silent, live), and the handshakes admitted in the
    /// live epochs (the current one and the three before, and the next one,
    /// where another CPU already is) not yet established.
    fn in_flight(&self) -> u64 {
        let held = (self.counted as i64 + self.adjust).max(0) as u64;
        let silent = if self.count_mode == count_mode::WORK { self.silent.0 } else { 0 };
        held + silent + (self.current.0 - self.current.1) + self.earlier + self.next
    }

    /// Writes the books for `slot`, the rings' cells around the epochs of now.
    fn write(&self, maps: &mut shed::kernel::maps::GateMaps, slot: u32) {
        const BASE: u64 = 1_000;
        let work = self.count_mode == count_mode::WORK;
        let (established, busy) = if work { (self.other, self.counted) } else { (self.counted, self.other) };
        let state = PortState {
            opened: BASE + established,
            closed: BASE,
            busy_enter: BASE + busy,
            busy_exit: BASE,
            ..PortState::default()
        };
        maps.raw_mut().state.set(slot, state, 0).unwrap();
        // Epochs of 2^29 ns (537 ms), the longest either ring allows: the earlier
        // cell (one epoch back) stays live for at least two more epochs after this
        // write, so the kernel sees the books as written unless the program runs
        // over a second after them (at 134 ms epochs, a 270 ms stall of this
        // two-core machine once made the kernel see a handshake lapsed).
        let base = UserPortState { handshake_shift: 29, silent_shift: 29, ..UserPortState::default() };
        let user = if work {
            UserPortState { busy_adjust: self.adjust, ..base }
        } else {
            UserPortState { established_adjust: self.adjust, ..base }
        };
        maps.raw_mut().user_state.set(slot, user, 0).unwrap();
        // The earlier cell one epoch back and the ended one six back: an epoch that
        // begins before the program runs leaves each where it was (live, or ended).
        // The next epoch's cell: an edge the program crosses before it reads
        // the ring only moves it to current (live either way).
        let ring = |now: u64, current: (u64, u64), earlier: u64, ended: u64, next: u64| {
            let mut ring = HandshakeRing::default();
            for (epoch, (admitted, completed)) in
                [(now, current), (now - 1, (earlier, 0)), (now - 6, (ended, 0)), (now + 1, (next, 0))]
            {
                ring.cells[handshake::cell_of(epoch)] = HandshakeCell { epoch, admitted, completed };
            }
            ring
        };
        let now = shed::host::system::monotonic_ns();
        let handshakes = ring(now >> user.shift(), self.current, self.earlier, self.lapsed, self.next);
        maps.raw_mut().handshakes.set(slot, handshakes, 0).unwrap();
        let silent = ring(now >> user.silent_shift(), (self.silent.0, 0), 0, self.silent.1, 0);
        maps.raw_mut().silent.set(slot, silent, 0).unwrap();
    }
}

#[derive(Clone, Debug)]
struct StateSpec {
    limit: u32,
    books: Books,
    act: u8,
    dry_run: bool,
    tiered: bool,
    shares: [u16; 4],
    tier_action: [u8; 4],
    held_back: [u16; 4],
    /// The port's client cap (0: off) and what the frame's client holds.
    client_cap: u32,
    client_held: i64,
    /// RST rates (0: off) of the prefix and the port, and whether each bucket has a reply left.
    rst_rates: (u32, u32),
    rst_budget: (bool, bool),
    /// What the port's largest client holds, whether it is the frame's
    /// client, and whether SYNs may still be passed to their ACK.
    largest_held: u64,
    largest_is_client: bool,
    deferral_budget: bool,
}

fn state_spec() -> impl Strategy<Value = StateSpec> {
    (
        (0u32..6, books_spec()),
        prop_oneof![Just(action::DROP), Just(action::RST)],
        prop::bool::weighted(0.15),
        any::<bool>(),
        (1u16..=1000, 1u16..=1000, 1u16..=1000).prop_map(|(c, n, l)| [1000, c, n, l]),
        prop::array::uniform4(
            prop_oneof![3 => Just(tier::ACTION_DEFAULT), 1 => Just(action::DROP), 1 => Just(action::RST)],
        ),
        prop::array::uniform4(prop_oneof![4 => Just(0u16), 1 => 1u16..3]),
        // Half the ports capped: with a third, the cap branch came out 19 times in
        // 4,000 cases on one CI run, under the coverage floor (20); with half, 37 to
        // 46 times in five runs.
        (prop_oneof![1 => Just(0u32), 1 => 1u32..4], 0i64..5),
        (
            (prop_oneof![Just(0u32), Just(5)], prop_oneof![Just(0u32), Just(5)]),
            (prop::bool::weighted(0.5), prop::bool::weighted(0.5)),
        ),
        (prop_oneof![2 => Just(0u64), 1 => 1u64..5], any::<bool>(), prop::bool::weighted(0.7)),
    )
        .prop_map(
            |(
                (limit, books),
                act,
                dry_run,
                tiered,
                shares,
                tier_action,
                held_back,
                (client_cap, client_held),
                (rst_rates, rst_budget),
                (largest_held, largest_is_client, deferral_budget),
            )| StateSpec {
                limit,
                books,
                act,
                dry_run,
                tiered,
                shares,
                tier_action,
                held_back,
                client_cap,
                client_held,
                rst_rates,
                rst_budget,
                largest_held,
                largest_is_client,
                deferral_budget,
            },
        )
}

impl StateSpec {
    /// The state the model judges in: this spec's, with the port's `config`,
    /// the trickle's clock, contention, the local addresses and the tier table.
    fn model(
        &self,
        config: PortConfig,
        trickle_seen: u64,
        contended: bool,
        local: Vec<[u8; 16]>,
        tiers: Vec<(u32, [u8; 16], u8)>,
    ) -> ModelState {
        ModelState {
            port: PORT,
            config,
            limit: self.limit,
            in_flight: self.books.in_flight(),
            client_held: self.client_held,
            held_back: self.held_back,
            rst_budget: RstBudget { prefix: self.rst_budget.0, port: self.rst_budget.1 },
            trickle_seen,
            contended,
            largest_held: self.largest_held,
            largest_is_client: self.largest_is_client,
            deferral_budget: self.deferral_budget,
            syn_cookie: 0,
            local,
            tiers,
        }
    }

    /// Writes the generated state for the port at `slot` (into `config` too) and
    /// what `client` holds, keyed by the model's own derivation of the client
    /// (not shed-common's); returns that key, to remove after the case.
    fn write(&self, loaded: &mut Loaded, slot: u32, config: &mut PortConfig, client: &[u8; 16]) -> ClientKey {
        config.action = self.act;
        config.dry_run = u8::from(self.dry_run);
        config.tiered = u8::from(self.tiered);
        config.share_permille = self.shares;
        config.tier_action = self.tier_action;
        config.client_cap = self.client_cap;
        config.count_mode = self.books.count_mode;
        (config.rst_per_prefix_per_sec, config.rst_per_sec) = self.rst_rates;
        loaded.maps.write_config(PORT, *config).unwrap();
        loaded.maps.set_limit(slot, self.limit).unwrap();
        loaded.maps.raw_mut().reserve.set(slot, TierReserve { held_back: self.held_back }, 0).unwrap();
        self.books.write(&mut loaded.maps, slot);
        // What the client holds, as the socket tracepoint would have counted it.
        let client_key = ClientKey { slot, addr: model::reference::client_addr(client, config.client_prefix_v6) };
        loaded.maps.raw_mut().clients.insert(client_key, self.client_held, 0).unwrap();
        let bucket = |has_budget: bool| if has_budget { 0 } else { exhausted_bucket() };
        let prefix_index = prefix_bucket_index(slot, &model::reference::rst_prefix(client));
        let mut port_buckets: Array<_, u64> =
            Array::try_from(loaded.ebpf.as_mut().expect("the gate's object").map_mut(map::RST_BUCKETS).unwrap())
                .unwrap();
        port_buckets.set(slot, bucket(self.rst_budget.1), 0).unwrap();
        let mut prefix_buckets: Array<_, u64> =
            Array::try_from(loaded.ebpf.as_mut().expect("the gate's object").map_mut(map::RST_PREFIX_BUCKETS).unwrap())
                .unwrap();
        prefix_buckets.set(prefix_index, bucket(self.rst_budget.0), 0).unwrap();
        let contention = Contention {
            largest: if self.largest_is_client { client_key.addr } else { [0; 16] },
            largest_held: self.largest_held,
            deferred_tat: if self.deferral_budget { 0 } else { exhausted_bucket() },
            ..Contention::default()
        };
        loaded.maps.raw_mut().contention.set(slot, contention, 0).unwrap();
        client_key
    }
}

/// One test run of `hook`'s program.
fn run_on(
    loaded: &mut Loaded,
    hook: &str,
    opts: TestRunOptions<'_>,
) -> Result<aya::programs::TestRunResult, aya::programs::ProgramError> {
    if hook == "xdp" { loaded.xdp().unwrap().test_run(opts) } else { loaded.tc().unwrap().test_run(opts) }
}

/// Forgets the stamp the gate keyed by `hash` in `slot`'s block (the flow's
/// handshake is then judged afresh).
fn forget_stamp(loaded: &mut Loaded, slot: u32, hash: u32) {
    use shed_common::{HandshakeStamp, handshake::STAMPS_PER_PORT};
    for i in slot * STAMPS_PER_PORT..(slot + 1) * STAMPS_PER_PORT {
        if loaded.maps.raw().stamps.get(&i, 0).unwrap().flow == hash {
            loaded.maps.raw_mut().stamps.set(i, HandshakeStamp::default(), 0).unwrap();
        }
    }
}

/// The hash of the one admitted stamp in `slot`'s block not among `known`
/// (other flows'): the flow just admitted.
fn admitted_stamp(loaded: &Loaded, slot: u32, known: &[u32]) -> Option<u32> {
    use shed_common::handshake::{STAMPS_PER_PORT, stamp_state};
    let fresh: Vec<u32> = (slot * STAMPS_PER_PORT..(slot + 1) * STAMPS_PER_PORT)
        .map(|i| loaded.maps.raw().stamps.get(&i, 0).unwrap())
        .filter(|s| s.state == stamp_state::ADMITTED && !known.contains(&s.flow))
        .map(|s| s.flow)
        .collect();
    assert_eq!(fresh.len(), 1, "one new admitted stamp: {fresh:?}");
    fresh.first().copied()
}

/// The kernel object with both hooks' programs loaded. Loading verifies a
/// program, which takes seconds here: longer than the four 537 ms epochs a
/// case's books live (`Books::write`). Loaded lazily, inside the first case
/// of each hook, it made that case's kernel read its cells lapsed (the port
/// holding nothing) where the model counted them.
fn loaded_for_both_hooks() -> Loaded {
    let mut loaded = Loaded::new(None).expect("load the kernel object (root, after `cargo xtask build-ebpf`)");
    loaded.xdp().expect("load the XDP program");
    loaded.tc().expect("load the TC program");
    loaded
}

/// One run of `hook`'s program on `frame` arriving on `ifindex`: its
/// verdict, and the bytes it sent out.
fn judge(loaded: &mut Loaded, hook: &str, frame: &[u8], ifindex: u32) -> (Expected, Vec<u8>) {
    let mut out = vec![0u8; frame.len() + 256];
    let ctx = if hook == "xdp" {
        support::outside::xdp_ctx(ifindex, frame.len())
    } else {
        support::outside::skb_ctx(ifindex)
    };
    let opts =
        TestRunOptions { data_in: Some(frame), data_out: Some(&mut out), ctx_in: Some(&ctx), ..Default::default() };
    let run = run_on(loaded, hook, opts).unwrap_or_else(|e| panic!("{hook}: test run failed: {e:?}"));
    let verdict = verdict_of(hook, &run, &mut out);
    (verdict, out)
}

/// Zeroes `slot`'s counters on every CPU (the trickle's clock starts at 0).
fn zero_port_counters(loaded: &mut Loaded, slot: u32) {
    let cpus = aya::util::nr_cpus().unwrap();
    let zero = PerCpuValues::try_from(vec![PortCounters::default(); cpus]).unwrap();
    loaded.maps.raw_mut().counters.set(slot, zero, 0).unwrap();
}

/// What a run did with its frame (`out`, cut to the bytes it sent out).
fn verdict_of(hook: &str, run: &aya::programs::TestRunResult, out: &mut Vec<u8>) -> Expected {
    out.truncate(run.data_size_out as usize);
    match (hook, run.return_value) {
        ("xdp", 2) | ("tc", 0) => Expected::Pass,
        ("xdp", 1) | ("tc", 2) => Expected::Drop,
        ("xdp", 3) | ("tc", 7) => Expected::Rst(out.clone()),
        (_, other) => panic!("{hook}: unexpected verdict {other}"),
    }
}

/// Every named counter moved in at least `floor` cases.
fn assert_reached(reached: &[u64], floor: u64, names: &[(&str, usize)]) {
    for &(name, index) in names {
        assert!(reached[index] >= floor, "the generator reached {name} only {} times (floor {floor})", reached[index]);
    }
}

/// The client address of a generated frame, as the gate keys it (IPv4-mapped for IPv4).
fn client_of(fs: &FrameSpec) -> [u8; 16] {
    if fs.family == 1 { fs.client_v6 } else { ipv4_mapped(fs.client_v4) }
}

/// The trickle's clock as the kernel holds it on CPU 0 (the test thread's):
/// share refusals plus trickle admissions so far.
fn trickle_clock(loaded: &Loaded, slot: u32) -> u64 {
    let values = loaded.maps.raw().counters.get(&slot, 0).unwrap();
    values[0].values[counter::REJECTED_SHARE] + values[0].values[counter::TRICKLE]
}

/// A runner whose cases share the kernel's state (the trickle's clock, the
/// gate's records): no shrinking, for a shrunk case would meet another state.
fn carried_runner(cases: u32) -> TestRunner {
    TestRunner::new(proptest::test_runner::Config {
        cases,
        failure_persistence: None,
        max_shrink_iters: 0,
        ..Default::default()
    })
}

/// Gives the client `tier` in the tier table, or no entry. Written before the
/// case's config: writing the table marks every port tiered, and the case's
/// config then sets whether this one is.
fn set_client_tier(loaded: &mut Loaded, cidr: shed::kernel::options::Cidr, tier: Option<u8>) {
    match tier {
        Some(t) => loaded.maps.set_tier(cidr, t).unwrap(),
        None => {
            let _ = loaded.maps.remove_tier(cidr);
        }
    }
}

/// A GCRA bucket value with no reply left for the next few seconds.
fn exhausted_bucket() -> u64 {
    shed::host::system::monotonic_ns() + 5_000_000_000
}

const TIERS: [(&str, u8); 5] = [
    ("10.0.0.0/8", tier::LOW),
    ("10.1.0.0/16", tier::CRITICAL),
    ("10.1.2.3/32", tier::EXEMPT),
    ("2001:db8::/32", tier::LOW),
    ("2001:db8:1::/48", tier::CRITICAL),
];

/// One fuzzer at a time. Each pins itself to CPU 0 and writes time-dependent
/// state (RST buckets refilling at 5 a second, ring epochs) just before its
/// program runs; three of them at once on one CPU preempted each other
/// between the write and the run long enough for a bucket to refill, and
/// the kernel then disagreed with the model it was not wrong about (seen in
/// about one run in four, never with one fuzzer running alone).
static ONE_FUZZER: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_fuzzer() -> std::sync::MutexGuard<'static, ()> {
    ONE_FUZZER.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[test]
fn kernel_and_model_agree_on_every_frame() {
    let _one = one_fuzzer();
    let cases: u32 = std::env::var("SHED_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(4_000);
    // Frames arrive on a real interface, not loopback (the test runner's default),
    // as an attacker's would: replies to this host's own addresses are then withheld.
    let (_bed, ifindex) = support::outside::enter("shedfz");
    // A listener on the protected port (both families): every fuzzed ACK to it takes the
    // gate's handshake path (the socket lookup finds the listener, the cookie check runs)
    // and, carrying no valid cookie, must pass untouched and uncounted.
    let _listener = std::net::TcpListener::bind(("::", PORT)).expect("listen on the protected port");
    // The trickle's clock is a per-CPU count carried from case to case: stay on one CPU.
    support::pin_to_cpu(0);
    let skb_ctx = support::outside::skb_ctx(ifindex);
    let mut loaded = loaded_for_both_hooks();
    let judged = std::cell::RefCell::new([0u64; 3]); // pass, drop, rst
    let reached = std::cell::RefCell::new([0u64; counter::COUNT]);
    let reached_gate = std::cell::RefCell::new([0u64; gate_counter::COUNT]);
    let refused = std::cell::Cell::new(0u64);
    let spec = PortSpec {
        rst_per_sec: 0,
        rst_per_prefix_per_sec: 0,
        ..PortSpec::new(1, action::RST, false, count_mode::CONNECTIONS, ControlConfig::default())
    };
    let slot = loaded.maps.protect(PORT, &spec).unwrap().slot;
    let local = vec![ipv4_mapped(LOCAL_V4), LOCAL_V6];
    loaded.maps.set_local_addrs(&local.iter().map(|&a| (a, local_addr::UNICAST)).collect()).unwrap();
    let mut tiers = Vec::new();
    for (cidr, t) in TIERS {
        // The model reads the table by its own derivation; the gate's parser must agree.
        let (prefix_len, addr) = model::reference::cidr(cidr).unwrap();
        let c = parse_cidr(cidr).unwrap();
        assert_eq!((c.prefix_len, c.addr), (prefix_len, addr), "{cidr}");
        loaded.maps.set_tier(c, t).unwrap();
        tiers.push((prefix_len, addr, t));
    }
    zero_port_counters(&mut loaded, slot);
    loaded
        .maps
        .raw_mut()
        .gate_counters
        .set(0, PerCpuValues::try_from(vec![GateCounters::default(); aya::util::nr_cpus().unwrap()]).unwrap(), 0)
        .unwrap();
    // Share rejections and trickle admissions so far, as the model counts them.
    let trickle_seen = std::cell::Cell::new(0u64);
    // SYNs a full port passed to be judged at their ACK (one client holding its share).
    let deferred = std::cell::Cell::new(0u64);
    let mut disagreements = 0u32;
    let loaded = std::cell::RefCell::new(loaded);
    for hook in ["xdp", "tc"] {
        let mut runner = TestRunner::new(proptest::test_runner::Config {
            cases,
            failure_persistence: None,
            max_global_rejects: cases * 4,
            // The state carries over between cases: a shrunk case would meet another state.
            max_shrink_iters: 0,
            ..Default::default()
        });
        let result = runner.run(&(frame_spec(), state_spec()), |(fs, ss)| {
            let mut loaded = loaded.borrow_mut();
            let frame = build(&fs);
            // The kernel state the model is told about.
            let mut config = loaded.maps.config(PORT).unwrap();
            let client_key = ss.write(&mut loaded, slot, &mut config, &client_of(&fs));
            let state = ss.model(config, trickle_seen.get(), false, local.clone(), tiers.clone());
            let expected = model::decide(&frame, &state);
            let full = state.in_flight >= u64::from(state.limit) && config.dry_run == 0;
            if full
                && expected.counters[counter::SYN_PASSED] == 1
                && expected.counters[counter::EXEMPT] == 0
                && config.tiered == 0
            {
                deferred.set(deferred.get() + 1);
            }
            trickle_seen.set(
                trickle_seen.get() + expected.counters[counter::REJECTED_SHARE] + expected.counters[counter::TRICKLE],
            );
            let counters_before = loaded.maps.snapshot(PORT, config).unwrap().counters.values;
            let gate_before = loaded.maps.gate_counters().unwrap();

            let mut out = vec![0u8; frame.len() + 256];
            let xdp_ctx = support::outside::xdp_ctx(ifindex, frame.len());
            let ctx = if hook == "xdp" { &xdp_ctx } else { &skb_ctx };
            let opts = TestRunOptions {
                data_in: Some(&frame),
                data_out: Some(&mut out),
                ctx_in: Some(ctx),
                ..Default::default()
            };
            let run = match run_on(&mut loaded, hook, opts) {
                Ok(run) => run,
                // The skb test runner refuses frames that end inside the Ethernet or IP header
                // (EINVAL, before the program runs); the XDP run of the same case set judges
                // them. Anything else is a failure.
                Err(e) if hook == "tc" && frame_ends_in_l2_or_l3(&frame) => {
                    let _ = e;
                    refused.set(refused.get() + 1);
                    return Ok(());
                }
                Err(e) => panic!("{hook}: test run failed on {frame:02x?}: {e:?}"),
            };
            let verdict = verdict_of(hook, &run, &mut out);
            // A cookie SYN-ACK's cookie is the kernel's to draw (a loader's
            // secret keys it): the model takes it and checks the rest.
            let expected = match &verdict {
                Expected::Rst(reply) if expected.counters[counter::HTTP_SYN_ACK] == 1 => {
                    model::decide(&frame, &ModelState { syn_cookie: model::answered_cookie(&frame, reply), ..state })
                }
                _ => expected,
            };
            loaded.maps.raw_mut().clients.remove(&client_key).unwrap();
            let after = loaded.maps.snapshot(PORT, config).unwrap().counters.values;
            let counters: [u64; counter::COUNT] = std::array::from_fn(|i| after[i] - counters_before[i]);
            prop_assert_eq!(
                &verdict,
                &expected.verdict,
                "{} verdict for {:?} / {:?}, frame {:02x?}",
                hook,
                fs,
                ss,
                frame
            );
            if verdict == Expected::Pass {
                prop_assert_eq!(&out, &frame, "{}: a passed frame is untouched", hook);
            }
            prop_assert_eq!(counters, expected.counters, "{} counters for {:?} / {:?}", hook, fs, ss);
            let gate_after = loaded.maps.gate_counters().unwrap();
            let gate: [u64; gate_counter::COUNT] = std::array::from_fn(|i| gate_after[i] - gate_before[i]);
            prop_assert_eq!(gate, expected.gate, "{} gate counters for {:?} / {:?}", hook, fs, ss);
            for (i, &n) in counters.iter().enumerate() {
                if n > 0 {
                    reached.borrow_mut()[i] += 1;
                }
            }
            for (i, &n) in gate.iter().enumerate() {
                if n > 0 {
                    reached_gate.borrow_mut()[i] += 1;
                }
            }
            judged.borrow_mut()[match verdict {
                Expected::Pass => 0,
                Expected::Drop => 1,
                Expected::Rst(_) => 2,
            }] += 1;
            Ok(())
        });
        if let Err(e) = result {
            disagreements += 1;
            eprintln!("{hook}: {e}");
        }
    }
    let judged = judged.into_inner();
    let (reached, reached_gate) = (reached.into_inner(), reached_gate.into_inner());
    println!(
        "fuzz: {cases} cases per hook; verdicts pass/drop/rst = {judged:?}; counters reached {reached:?}; gate {reached_gate:?}; TC runs refused by the kernel {}; disagreements {disagreements}",
        refused.get()
    );
    assert_eq!(disagreements, 0, "kernel and model disagree (see above)");
    // Every branch of the policy is exercised, each by a share of the cases.
    let floor = u64::from(cases) / 200;
    assert_reached(
        &reached,
        floor,
        &[
            ("passed (holding nothing)", counter::SYN_PASSED),
            ("rejected at the limit", counter::REJECTED_LIMIT),
            ("rejected at a share", counter::REJECTED_SHARE),
            ("RST sent", counter::RST_SENT),
            ("exempt", counter::EXEMPT),
            ("not local", counter::NOT_LOCAL),
            ("RST suppressed", counter::RST_SUPPRESSED),
            ("rejected at the client cap", counter::REJECTED_CLIENT_CAP),
            ("RST rate-limited", counter::RST_RATE_LIMITED),
        ],
    );
    assert_reached(
        &reached_gate,
        floor,
        &[
            ("tiny fragment", gate_counter::TINY_FRAGMENT),
            ("overlapping fragment", gate_counter::OVERLAP_FRAGMENT),
            ("long IPv6 chain", gate_counter::IPV6_CHAIN_UNPARSED),
            ("later fragment", gate_counter::LATER_FRAGMENT),
        ],
    );
    assert!(judged[1] > 0 && judged[2] > 0, "the generator must reach drops and RSTs: {judged:?}");
    // One share rejection in 16 becomes the trickle.
    assert!(
        reached[counter::TRICKLE] >= (floor / 16).max(1),
        "the trickle was reached {} times",
        reached[counter::TRICKLE]
    );
    // Refused TC runs are bounded: they are only frames cut inside their headers.
    assert!(refused.get() <= u64::from(cases) / 3, "{} TC runs refused", refused.get());
}

/// Whether the skb test runner refuses the frame before the program runs: shorter
/// than an Ethernet header, or an untagged IP frame whose fixed IP header is cut.
fn frame_ends_in_l2_or_l3(frame: &[u8]) -> bool {
    if frame.len() < 14 {
        return true;
    }
    match u16::from_be_bytes([frame[12], frame[13]]) {
        0x0800 => frame.len() < 14 + 20,
        0x86dd => frame.len() < 14 + 40,
        _ => false,
    }
}

/// What an ACK's case adds to the port's state: the client's tier (None: no
/// tier entry), the client share, whether the port is contended, and an
/// `http` port (refused at the ACK with a reset).
#[derive(Clone, Debug)]
struct AckSpec {
    flow: usize,
    tier: Option<u8>,
    client_share: u8,
    contended: bool,
    http: bool,
    /// Whether the gate's stamp of this flow's handshake is forgotten first
    /// (else an ACK of a handshake admitted before is a duplicate).
    forget: bool,
}

fn ack_spec(flows: usize) -> impl Strategy<Value = AckSpec> {
    (
        0..flows,
        prop_oneof![
            2 => Just(None),
            1 => Just(Some(tier::EXEMPT)),
            2 => Just(Some(tier::CRITICAL)),
            2 => Just(Some(tier::NORMAL)),
            2 => Just(Some(tier::LOW)),
        ],
        prop_oneof![Just(0u8), Just(30), Just(50)],
        any::<bool>(),
        prop::bool::weighted(0.2),
        prop::bool::weighted(0.7),
    )
        .prop_map(|(flow, tier, client_share, contended, http, forget)| AckSpec {
            flow,
            tier,
            client_share,
            contended,
            http,
            forget,
        })
}

/// The ACK path on real handshakes: each case sends the ACK that completes one
/// of a few request sockets the kernel holds (a `TCP_DEFER_ACCEPT` listener
/// keeps them), in a generated port state, to the loaded programs and to the
/// model's `decide_ack`; verdicts, reset bytes, counters and the reservation
/// taken must agree. The gate's stamps carry over between cases: an ACK of a
/// handshake admitted in an earlier case is a duplicate, unless the case
/// forgets the flow's stamp first (the harness's own record says which:
/// admitted, by the model, within the last second). The trickle's clock is
/// the harness's own too, counted from the model's refusals.
#[test]
fn kernel_and_model_agree_on_handshake_completing_acks() {
    let _one = one_fuzzer();
    use shed_common::{HandshakeStamp, handshake::STAMPS_PER_PORT};
    let cases: u32 =
        std::env::var("SHED_FUZZ_CASES").ok().and_then(|v| v.parse::<u32>().ok()).map_or(1_000, |n| (n / 4).max(200));
    let (bed, ifindex) = support::outside::enter("shedfa");
    let _listener = support::handshake::deferring_listener(std::net::SocketAddr::from((bed.server_v4, PORT)));
    let flows: Vec<_> = (0..4).map(|_| support::handshake::held(&bed, PORT)).collect();
    support::pin_to_cpu(0);
    let mut loaded = loaded_for_both_hooks();
    let spec = PortSpec {
        rst_per_sec: 0,
        rst_per_prefix_per_sec: 0,
        ..PortSpec::new(1, action::RST, false, count_mode::CONNECTIONS, ControlConfig::default())
    };
    let slot = loaded.maps.protect(PORT, &spec).unwrap().slot;
    // No local table: an ACK is judged whatever its destination (the kernel found its socket);
    // its counters start at zero (`protect`).
    let client = ipv4_mapped(flows[0].spec.client_v4);
    let client_cidr = parse_cidr(&format!("{}/32", std::net::Ipv4Addr::from(flows[0].spec.client_v4))).unwrap();
    let reached = std::cell::RefCell::new([0u64; counter::COUNT]);
    let (admitted, refused, duplicates) =
        (std::cell::Cell::new(0u64), std::cell::Cell::new(0u64), std::cell::Cell::new(0u64));
    // Refusals of an `http` port at the ACK, answered with a reset.
    let http_resets = std::cell::Cell::new(0u64);
    let mut disagreements = 0u32;
    for i in slot * STAMPS_PER_PORT..(slot + 1) * STAMPS_PER_PORT {
        loaded.maps.raw_mut().stamps.set(i, HandshakeStamp::default(), 0).unwrap();
    }
    // The harness's own books: when each flow's handshake was last admitted
    // (by the model), and the stamp hash the gate keys it by (learned at its
    // first admission, to forget it); the trickle's clock on this CPU.
    let admitted_at = std::cell::RefCell::new([None::<std::time::Instant>; 4]);
    let hash_of = std::cell::RefCell::new([None::<u32>; 4]);
    let trickle_seen = std::cell::Cell::new(trickle_clock(&loaded, slot));
    let loaded = std::cell::RefCell::new(loaded);
    // A reservation lives 4 epochs of 537 ms (at least 1.6 s): a flow admitted
    // within the last second still holds its handshake, one older is forgotten.
    const HELD_FOR: std::time::Duration = std::time::Duration::from_secs(1);
    for hook in ["xdp", "tc"] {
        let mut runner = carried_runner(cases);
        let result = runner.run(&(state_spec(), ack_spec(flows.len())), |(ss, a)| {
            let mut loaded = loaded.borrow_mut();
            let flow = &flows[a.flow];
            set_client_tier(&mut loaded, client_cidr, a.tier);
            let since = admitted_at.borrow()[a.flow].map(|at| at.elapsed());
            if a.forget || since.is_some_and(|s| s >= HELD_FOR) {
                if let Some(hash) = hash_of.borrow()[a.flow] {
                    forget_stamp(&mut loaded, slot, hash);
                }
                admitted_at.borrow_mut()[a.flow] = None;
            }
            let held = admitted_at.borrow()[a.flow].is_some();
            let mut config = loaded.maps.config(PORT).unwrap();
            config.client_share = a.client_share;
            let client_key = ss.write(&mut loaded, slot, &mut config, &client);
            if a.http {
                config.action = action::HTTP;
                loaded.maps.write_config(PORT, config).unwrap();
            }
            let now = shed::host::system::monotonic_ns();
            let mut contention = loaded.maps.raw().contention.get(&slot, 0).unwrap();
            contention.refused_ns = if a.contended { now } else { 0 };
            loaded.maps.raw_mut().contention.set(slot, contention, 0).unwrap();
            let tiers = a.tier.map(|t| (128, client, t)).into_iter().collect();
            let state = ss.model(config, trickle_seen.get(), a.contended, Vec::new(), tiers);
            let expected = model::decide_ack(&flow.ack, &state, held);
            let ring_before = loaded.maps.raw().handshakes.get(&slot, 0).unwrap();
            let counters_before = loaded.maps.snapshot(PORT, config).unwrap().counters.values;
            let (verdict, out) = judge(&mut loaded, hook, &flow.ack, ifindex);
            loaded.maps.raw_mut().clients.remove(&client_key).unwrap();
            // An admission charged to the client stays pending for the handshake
            // window: the next case judges the client afresh.
            let _ = loaded.maps.raw_mut().pending_clients.remove(&client_key);
            let after = loaded.maps.snapshot(PORT, config).unwrap().counters.values;
            let counters: [u64; counter::COUNT] = std::array::from_fn(|i| after[i] - counters_before[i]);
            // What the cells gained (an epoch that began between the write and
            // the run opens a fresh cell: it held nothing before).
            let ring_after = loaded.maps.raw().handshakes.get(&slot, 0).unwrap();
            let reserved: u64 = ring_after
                .cells
                .iter()
                .zip(&ring_before.cells)
                .map(|(now, was)| if now.epoch == was.epoch { now.admitted - was.admitted } else { now.admitted })
                .sum();
            trickle_seen.set(
                trickle_seen.get() + expected.counters[counter::REJECTED_SHARE] + expected.counters[counter::TRICKLE],
            );
            prop_assert_eq!(&verdict, &expected.verdict, "{} verdict for {:?} / {:?}", hook, ss, a);
            if verdict == Expected::Pass {
                prop_assert_eq!(&out, &flow.ack, "{}: a passed ACK is untouched", hook);
            }
            prop_assert_eq!(counters, expected.counters, "{} counters for {:?} / {:?}", hook, ss, a);
            prop_assert_eq!(reserved, expected.reserved, "{} reservations for {:?} / {:?}", hook, ss, a);
            if expected.reserved == 1 {
                admitted_at.borrow_mut()[a.flow] = Some(std::time::Instant::now());
                if hash_of.borrow()[a.flow].is_none() {
                    let known: Vec<u32> = hash_of.borrow().iter().flatten().copied().collect();
                    hash_of.borrow_mut()[a.flow] = admitted_stamp(&loaded, slot, &known);
                }
            }
            // A duplicate judged as one (an exempt client passes before its stamp is looked at).
            if held && counters.iter().all(|&n| n == 0) {
                duplicates.set(duplicates.get() + 1);
            }
            for (i, &n) in counters.iter().enumerate() {
                if n > 0 {
                    reached.borrow_mut()[i] += 1;
                }
            }
            if a.http && matches!(expected.verdict, Expected::Rst(_)) {
                http_resets.set(http_resets.get() + 1);
            }
            admitted.set(admitted.get() + expected.reserved);
            refused.set(refused.get() + expected.counters[counter::REFUSED_AT_ACK]);
            Ok(())
        });
        if let Err(e) = result {
            disagreements += 1;
            eprintln!("{hook}: {e}");
        }
    }
    let reached = reached.into_inner();
    println!(
        "ack fuzz: {cases} cases per hook; admitted {}, refused {}, duplicates {}; counters reached {reached:?}; disagreements {disagreements}",
        admitted.get(),
        refused.get(),
        duplicates.get(),
    );
    assert_eq!(disagreements, 0, "kernel and model disagree on an ACK (see above)");
    // Every rule of the ACK is exercised.
    let floor = u64::from(cases) / 100;
    assert_reached(
        &reached,
        floor,
        &[
            ("admitted", counter::ADMITTED),
            ("refused at the ACK", counter::REFUSED_AT_ACK),
            ("rejected at the limit", counter::REJECTED_LIMIT),
            ("rejected at a share", counter::REJECTED_SHARE),
            ("rejected at the client cap", counter::REJECTED_CLIENT_CAP),
            ("rejected at the client share", counter::REJECTED_CLIENT_SHARE),
            ("dry run", counter::DRY_RUN_WOULD_REJECT),
            ("RST sent", counter::RST_SENT),
            ("RST rate-limited", counter::RST_RATE_LIMITED),
            ("exempt", counter::ADMITTED_BY_TIER + tier::EXEMPT as usize),
        ],
    );
    assert_reached(&reached, (floor / 16).max(1), &[("the trickle at the ACK", counter::TRICKLE)]);
    // Over both hooks: at least 1% of their cases.
    assert!(
        duplicates.get() >= 2 * floor,
        "{} duplicate ACKs of an admitted handshake (floor {})",
        duplicates.get(),
        2 * floor
    );
    assert!(http_resets.get() >= floor, "an http port reset {} refused ACKs (floor {floor})", http_resets.get());
}

/// What a kept-alive request's case adds to the port's state: the client's
/// tier, the client share, contention, an `http` port with its Retry-After,
/// the request's payload (HTTP or a TLS record) and FIN, and whether the
/// gate's record of this request's last refusal is forgotten first.
#[derive(Clone, Debug)]
struct TurnSpec {
    flow: usize,
    tier: Option<u8>,
    client_share: u8,
    contended: bool,
    http: bool,
    retry_after_s: u16,
    tls: bool,
    fin: bool,
    forget: bool,
}

fn turn_spec(flows: usize) -> impl Strategy<Value = TurnSpec> {
    (
        (0..flows, prop_oneof![2 => Just(None), 1 => Just(Some(tier::EXEMPT)), 2 => (1u8..4).prop_map(Some)]),
        // The client share binds only under the limit, contended, with a share set: often enough.
        (prop_oneof![1 => Just(0u8), 2 => Just(30), 2 => Just(50)], prop::bool::weighted(0.7)),
        (prop::bool::weighted(0.4), 1u16..1200),
        (prop::bool::weighted(0.2), prop::bool::weighted(0.2), prop::bool::weighted(0.5)),
    )
        .prop_map(|((flow, tier), (client_share, contended), (http, retry_after_s), (tls, fin, forget))| {
            TurnSpec { flow, tier, client_share, contended, http, retry_after_s, tls, fin, forget }
        })
}

/// Requests on kept-alive connections: each case sends the first segment of
/// the next request on one of a few real connections whose server sockets
/// owe no answer (idle in the gate's books, as its own accounting programs
/// recorded them), in a generated port state, to the loaded programs and to
/// the model's `decide_turn`; verdicts, the bytes of every answer and reset,
/// and counters must agree. The gate's record of a refused request carries
/// over between cases (a retransmission is answered again, identically),
/// unless the case forgets it.
#[test]
fn kernel_and_model_agree_on_kept_alive_requests() {
    let _one = one_fuzzer();
    use support::kept::{IdleKeptAlive, REQUEST};
    let cases: u32 =
        std::env::var("SHED_FUZZ_CASES").ok().and_then(|v| v.parse::<u32>().ok()).map_or(2_000, |n| (n / 2).max(200));
    let (bed, ifindex) = support::outside::enter("shedft");
    let mut loaded = loaded_for_both_hooks();
    let spec = PortSpec::new(100, action::RST, false, count_mode::WORK, ControlConfig::default());
    let slot = loaded.maps.protect(PORT, &spec).unwrap().slot;
    loaded.attach_accounting().expect("attach the accounting programs");
    let listener = std::net::TcpListener::bind((bed.server_v4, PORT)).expect("listen");
    let flows: Vec<IdleKeptAlive> = (0..4)
        .map(|_| {
            IdleKeptAlive::open(&listener, |to| {
                shed_testkit::testbed::run_in(&bed.client_ns, move || std::net::TcpStream::connect(to)).unwrap()
            })
            .expect("a kept-alive connection")
        })
        .collect();
    assert!(support::kept::wait_idle(&loaded.maps, PORT, flows.len()), "the connections idle in the books");
    support::pin_to_cpu(0);
    zero_port_counters(&mut loaded, slot);
    let client = ipv4_mapped(flows[0].next.client_v4);
    let client_cidr = parse_cidr(&format!("{}/32", std::net::Ipv4Addr::from(flows[0].next.client_v4))).unwrap();
    let hello = [0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03, 0x03];
    let reached = std::cell::RefCell::new([0u64; counter::COUNT]);
    let mut disagreements = 0u32;
    let loaded = std::cell::RefCell::new(loaded);
    // The policy's own book of refusals, by connection: the reason each was
    // refused with, kept from case to case as the gate's record is (the
    // oracle never reads the kernel's record to predict it).
    let book = std::cell::RefCell::new(std::collections::HashMap::<usize, usize>::new());
    for hook in ["xdp", "tc"] {
        let mut runner = carried_runner(cases);
        let result = runner.run(&(state_spec(), turn_spec(flows.len())), |(ss, t)| {
            let mut loaded = loaded.borrow_mut();
            let flow = &flows[t.flow];
            set_client_tier(&mut loaded, client_cidr, t.tier);
            let mut config = loaded.maps.config(PORT).unwrap();
            config.client_share = t.client_share;
            let client_key = ss.write(&mut loaded, slot, &mut config, &client);
            if t.http {
                config.action = action::HTTP;
            }
            config.retry_after_s = t.retry_after_s;
            loaded.maps.write_config(PORT, config).unwrap();
            let now = shed::host::system::monotonic_ns();
            let mut contention = loaded.maps.raw().contention.get(&slot, 0).unwrap();
            contention.refused_ns = if t.contended { now } else { 0 };
            loaded.maps.raw_mut().contention.set(slot, contention, 0).unwrap();
            // The gate's record of this request's last refusal goes when the
            // case forgets it (as its daemon closes the socket); the book's too.
            let record_of = |loaded: &Loaded| {
                let records: Vec<_> = loaded.maps.raw().refused_turns.iter().filter_map(Result::ok).collect();
                records.into_iter().find(|(_, r)| r.flow.client_port == flow.next.client_port)
            };
            if t.forget {
                book.borrow_mut().remove(&t.flow);
                if let Some((sk, _)) = record_of(&loaded) {
                    loaded.maps.raw_mut().refused_turns.remove(&sk).unwrap();
                }
            }
            let refused_before = book.borrow().get(&t.flow).copied();
            let payload = if t.tls { hello.to_vec() } else { REQUEST.to_vec() };
            let flags = flow.next.flags | u8::from(t.fin);
            let segment = frame(&Spec { payload, flags, ..flow.next.clone() });
            let tiers = t.tier.map(|tier| (128, client, tier)).into_iter().collect();
            let state = ss.model(config, trickle_clock(&loaded, slot), t.contended, Vec::new(), tiers);
            let expected = model::decide_turn(&segment, &state, refused_before);
            let counters_before = loaded.maps.snapshot(PORT, config).unwrap().counters.values;
            let (verdict, out) = judge(&mut loaded, hook, &segment, ifindex);
            loaded.maps.raw_mut().clients.remove(&client_key).unwrap();
            // An admitted request made its connection busy at once (the books'
            // `busy_enter` are rewritten by the next case); it is idle again
            // for the next, as once its answer is sent.
            let busy = loaded
                .maps
                .tracked_sockets()
                .unwrap()
                .into_iter()
                .find(|(_, e)| e.flow.client_port == flow.next.client_port && e.busy != 0);
            prop_assert_eq!(
                busy.is_some(),
                expected.counters[counter::REQUEST_ADMITTED] == 1,
                "{} busy once admitted",
                hook
            );
            if let Some((sk, entry)) = busy {
                loaded.maps.raw_mut().socks.insert(sk, shed_common::SockEntry { busy: 0, ..entry }, 0).unwrap();
            }
            // A new refusal is booked with its reason (the one counted); the
            // gate's record must say the same, for this very request.
            if expected.counters[counter::REFUSED_REQUEST] == 1 {
                let reasons = [
                    counter::REJECTED_LIMIT,
                    counter::REJECTED_SHARE,
                    counter::REJECTED_CLIENT_CAP,
                    counter::REJECTED_CLIENT_SHARE,
                ];
                let reason = reasons.into_iter().find(|&r| expected.counters[r] == 1).expect("a refusal has a reason");
                book.borrow_mut().insert(t.flow, reason);
            }
            let record = record_of(&loaded).map(|(_, r)| (r.reason as usize, r.seq));
            let booked = book.borrow().get(&t.flow).map(|&reason| (reason, flow.next.seq));
            prop_assert_eq!(record, booked, "{} record of refusal for {:?} / {:?}", hook, ss, t);
            let after = loaded.maps.snapshot(PORT, config).unwrap().counters.values;
            let counters: [u64; counter::COUNT] = std::array::from_fn(|i| after[i] - counters_before[i]);
            prop_assert_eq!(&verdict, &expected.verdict, "{} verdict for {:?} / {:?}", hook, ss, t);
            if verdict == Expected::Pass {
                prop_assert_eq!(&out, &segment, "{}: a passed request is untouched", hook);
            }
            prop_assert_eq!(counters, expected.counters, "{} counters for {:?} / {:?}", hook, ss, t);
            for (i, &n) in counters.iter().enumerate() {
                if n > 0 {
                    reached.borrow_mut()[i] += 1;
                }
            }
            Ok(())
        });
        if let Err(e) = result {
            disagreements += 1;
            eprintln!("{hook}: {e}");
        }
    }
    let reached = reached.into_inner();
    println!(
        "kept-alive request fuzz: {cases} cases per hook; counters reached {reached:?}; disagreements {disagreements}"
    );
    assert_eq!(disagreements, 0, "kernel and model disagree on a kept-alive request (see above)");
    let floor = u64::from(cases) / 100;
    assert_reached(
        &reached,
        floor,
        &[
            ("admitted", counter::REQUEST_ADMITTED),
            ("refused", counter::REFUSED_REQUEST),
            ("refused again", counter::REQUEST_REFUSED_AGAIN),
            ("rejected at the limit", counter::REJECTED_LIMIT),
            ("rejected at a share", counter::REJECTED_SHARE),
            ("dry run", counter::DRY_RUN_WOULD_REJECT),
            ("503 answered", counter::HTTP_ANSWERED),
            ("RST sent", counter::RST_SENT),
            ("RST rate-limited", counter::RST_RATE_LIMITED),
        ],
    );
    // The client cap binds in 0.55-1.1% of 2,000 runs (a request under the
    // limit and every share, its client at its cap: 11-22 times in 1,000
    // cases per hook over twelve runs here, 4 once in a fresh-clone run, under
    // that floor of 10, hence twice the cases and half the floor); the
    // client share in about 0.7% (a contended port under its limit, a client
    // over its share); the trickle in one share refusal in 16.
    assert_reached(&reached, (floor / 2).max(1), &[("rejected at the client cap", counter::REJECTED_CLIENT_CAP)]);
    assert_reached(&reached, (floor / 4).max(1), &[("rejected at the client share", counter::REJECTED_CLIENT_SHARE)]);
    assert_reached(&reached, (floor / 16).max(1), &[("the trickle", counter::TRICKLE)]);
    drop(flows);
}
