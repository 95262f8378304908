// SPDX-License-Identifier: MIT OR Apache-2.0
//! A reference model of the gate's packet decision, written from the policy in
//! docs/ARCHITECTURE.md ("What is judged"), independently of the kernel code
//! (plain slices, no shared parser or RST builder), for differential testing:
//! the same frame and state through the model and through the loaded
//! programs must give the same verdict, the same counter changes and, for a
//! RST, the same bytes.
//!
//! The policy, as the model states it:
//! - Up to two VLAN tags (802.1Q or 802.1ad) are looked through; a third is not
//!   a frame for a TCP listener (pass).
//! - IPv4: a TCP fragment at offset 8 bytes is dropped (RFC 1858); later
//!   fragments pass (the first carries the flags); a first fragment shorter
//!   than the 20-byte TCP header is dropped (RFC 3128); one that holds it is judged.
//! - IPv6: hop-by-hop, routing, destination options, fragment, AH, mobility,
//!   HIP and shim6 headers are followed, up to 8; a longer chain, or a first
//!   fragment without the whole TCP header, is dropped; a later fragment passes;
//!   ESP, no-next-header and other protocols pass.
//! - TCP: SYN without ACK, RST or FIN is judged; SYN+FIN passes (a Linux
//!   listener discards it); an ACK is judged only if it completes a handshake
//!   (the kernel's socket lookup finds a request socket, or the listener and a
//!   valid cookie). The harness's namespace has a listener on the port and no
//!   handshake under way, and a fuzzed ACK carries no valid cookie: every ACK
//!   passes, untouched and uncounted.
//! - An IPv6 SYN from an IPv4-mapped source passes unjudged (the kernel never
//!   completes such a handshake).
//! - Only a SYN addressed to one of the namespace's addresses (or loopback) is
//!   judged; others count `NOT_LOCAL` and pass.
//! - A judged SYN only reads, and holds nothing when it passes, in this order:
//!   an exempt client passes uncounted; on a tiered port a critical or normal
//!   client passes (judged at its ACK, once its source is proven); at the
//!   limit (held connections plus admissions not yet established) it is rejected; at its
//!   tier's share of the limit, less the room held back for higher tiers, it is
//!   rejected unless it is the trickle (one in 16 such rejections on a CPU is
//!   admitted instead); a client holding its cap of connections is rejected;
//!   else it passes (`SYN_PASSED`). Dry-run passes what it would reject (and
//!   counts it at the ACK: [`decide_ack`]).
//! - A rejection takes the tier's action, else the port's. A reset goes only to
//!   an address that can be a client (not multicast, broadcast, unspecified, nor
//!   this host's own unless it arrived on loopback), and only while the
//!   client's prefix and the port have RST budget (the port's alone for the
//!   port's largest client while it holds connections, on a port counting
//!   clients: a proven source); otherwise it is a drop.
//!
//! The harness varies one protected port, its limit, action, dry-run, tier
//! shares, actions and held-back room, its books (count mode, counts and the
//! healer's adjustment, both epoch rings in every cell state), the client's
//! connections against a cap, the RST buckets, the local addresses and a
//! fixed tier table, and derives who a client is by [`reference`]; the
//! trickle's clock carries over from case to case.
use shed_common::{PortConfig, action, counter, gate_counter, tier};

/// What the model expects the program to do with a frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Expected {
    Pass,
    Drop,
    /// Reply with these bytes (the whole frame).
    Rst(Vec<u8>),
}

/// The state a frame meets.
#[derive(Clone, Debug)]
pub struct ModelState {
    pub port: u16,
    pub config: PortConfig,
    pub limit: u32,
    /// In-flight before the frame: held connections plus handshakes under way.
    pub in_flight: u64,
    /// Connections the frame's client holds (checked against `config.client_cap`).
    pub client_held: i64,
    /// Room held back from each tier for the tiers above it.
    pub held_back: [u16; 4],
    /// Whether the client's prefix bucket and the port's bucket have an RST left
    /// (checked only where `config` sets a rate).
    pub rst_budget: RstBudget,
    /// Share rejections plus trickle admissions so far on the CPU (the trickle's clock).
    pub trickle_seen: u64,
    /// Whether a verified client holding less than its share was refused within
    /// the last second (the client share binds at the ACK).
    pub contended: bool,
    /// What the port's largest client holds, and whether the port may still pass
    /// SYNs to be judged at their ACK this second (100 a second).
    pub largest_held: u64,
    /// Whether the port's largest client is the frame's (by its cap key):
    /// with `largest_held` above 0, a proven source ([`reply`]).
    pub largest_is_client: bool,
    pub deferral_budget: bool,
    /// The initial sequence number of the gate's cookie SYN-ACK, when it
    /// answered a SYN with one: the model does not compute cookies (their key
    /// is the loader's secret), it takes the kernel's and checks the rest of
    /// the frame ([`answered_cookie`]).
    pub syn_cookie: u32,
    /// The namespace's own addresses (IPv4-mapped for IPv4); loopback is always local.
    pub local: Vec<[u8; 16]>,
    /// Longest-prefix tiers: (prefix length over the mapped address, address, tier).
    pub tiers: Vec<(u32, [u8; 16], u8)>,
}

#[derive(Clone, Copy, Debug, Default)]
pub struct RstBudget {
    pub prefix: bool,
    pub port: bool,
}

/// The trickle admits one share rejection in this many.
pub const TRICKLE_EVERY: u64 = 16;

/// The outcome: the verdict and how each counter moved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    pub verdict: Expected,
    pub counters: [u64; counter::COUNT],
    /// Gate-wide counters (see [`gate_counter`]).
    pub gate: [u64; gate_counter::COUNT],
    /// Reservations taken in the port's handshake ring (an admission at the ACK).
    pub reserved: u64,
}

/// What the policy makes of a frame before any port is looked at.
enum Frame {
    Pass,
    /// Dropped and counted under this gate counter.
    Refuse(usize),
    LaterFragment,
    Syn(Syn),
    /// A segment with ACK (and not SYN or RST): judged only if it completes a handshake.
    Ack(Syn),
}

struct Syn {
    l2_len: usize,
    v6: bool,
    client: [u8; 16],
    server: [u8; 16],
    client_port: u16,
    server_port: u16,
    seq: u32,
    ack_seq: u32,
}

fn be16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*b.get(at)?, *b.get(at + 1)?]))
}

fn mapped(v4: &[u8]) -> [u8; 16] {
    let mut a = [0u8; 16];
    a[10] = 0xff;
    a[11] = 0xff;
    a[12..].copy_from_slice(v4);
    a
}

/// IPv6 extension headers the policy follows, and how long each is.
fn extension_len(next: u8, hdr: &[u8]) -> Option<usize> {
    match next {
        0 | 43 | 60 | 135 | 139 | 140 => Some((usize::from(*hdr.get(1)?) + 1) * 8),
        51 => Some((usize::from(*hdr.get(1)?) + 2) * 4),
        44 => Some(8),
        _ => None,
    }
}

/// (where TCP starts, IPv6?, client, server), or what else the frame is.
fn network(f: &[u8], l3: usize, ethertype: u16) -> Result<(usize, bool, [u8; 16], [u8; 16]), Frame> {
    match ethertype {
        0x0800 => {
            let ip = f.get(l3..l3 + 20).ok_or(Frame::Pass)?;
            let ihl = usize::from(ip[0] & 0x0f) * 4;
            if ip[0] >> 4 != 4 || ihl < 20 || ip[9] != 6 {
                return Err(Frame::Pass);
            }
            let frag = be16(ip, 6).ok_or(Frame::Pass)?;
            let offset = frag & 0x1fff;
            if offset == 1 {
                return Err(Frame::Refuse(gate_counter::OVERLAP_FRAGMENT));
            }
            if offset != 0 {
                return Err(Frame::LaterFragment);
            }
            let more = frag & 0x2000 != 0;
            if more && usize::from(be16(ip, 2).ok_or(Frame::Pass)?).saturating_sub(ihl) < 20 {
                return Err(Frame::Refuse(gate_counter::TINY_FRAGMENT));
            }
            Ok((l3 + ihl, false, mapped(&ip[12..16]), mapped(&ip[16..20])))
        }
        0x86dd => {
            let ip = f.get(l3..l3 + 40).ok_or(Frame::Pass)?;
            if ip[0] >> 4 != 6 {
                return Err(Frame::Pass);
            }
            let payload_end = l3 + 40 + usize::from(be16(ip, 4).ok_or(Frame::Pass)?);
            let client: [u8; 16] = ip[8..24].try_into().expect("16 bytes");
            let server: [u8; 16] = ip[24..40].try_into().expect("16 bytes");
            let (mut next, mut at, mut fragmented) = (ip[6], l3 + 40, false);
            for _ in 0..8 {
                if next == 6 {
                    break;
                }
                let hdr = f.get(at..at + 8).ok_or(Frame::Pass)?;
                let Some(len) = extension_len(next, hdr) else { return Err(Frame::Pass) };
                if next == 44 {
                    if be16(hdr, 2).ok_or(Frame::Pass)? >> 3 != 0 {
                        return Err(Frame::LaterFragment);
                    }
                    fragmented = true;
                }
                next = hdr[0];
                at += len;
            }
            match next {
                6 if fragmented && payload_end < at + 20 => Err(Frame::Refuse(gate_counter::TINY_FRAGMENT)),
                6 => Ok((at, true, client, server)),
                n if extension_len(n, &[0, 0]).is_some() => Err(Frame::Refuse(gate_counter::IPV6_CHAIN_UNPARSED)),
                _ => Err(Frame::Pass),
            }
        }
        _ => Err(Frame::Pass),
    }
}

fn parse(f: &[u8]) -> Frame {
    let Some(mut ethertype) = be16(f, 12) else { return Frame::Pass };
    let mut l3 = 14;
    for _ in 0..2 {
        if ethertype != 0x8100 && ethertype != 0x88a8 {
            break;
        }
        let Some(inner) = be16(f, l3 + 2) else { return Frame::Pass };
        ethertype = inner;
        l3 += 4;
    }
    let (l4, v6, client, server) = match network(f, l3, ethertype) {
        Ok(n) => n,
        Err(other) => return other,
    };
    let Some(tcp) = f.get(l4..l4 + 20) else { return Frame::Pass };
    let flags = tcp[13];
    let (fin, syn, rst, ack) = (flags & 0x01 != 0, flags & 0x02 != 0, flags & 0x04 != 0, flags & 0x10 != 0);
    if tcp[12] >> 4 < 5 || rst {
        return Frame::Pass;
    }
    let segment = Syn {
        l2_len: l3,
        v6,
        client,
        server,
        client_port: u16::from_be_bytes([tcp[0], tcp[1]]),
        server_port: u16::from_be_bytes([tcp[2], tcp[3]]),
        seq: u32::from_be_bytes([tcp[4], tcp[5], tcp[6], tcp[7]]),
        ack_seq: u32::from_be_bytes([tcp[8], tcp[9], tcp[10], tcp[11]]),
    };
    match (syn, ack) {
        (true, false) if !fin => Frame::Syn(segment),
        (false, true) => Frame::Ack(segment),
        _ => Frame::Pass,
    }
}

fn tier_of(tiers: &[(u32, [u8; 16], u8)], addr: &[u8; 16]) -> u8 {
    let matches = |len: u32, net: &[u8; 16]| {
        (0..len as usize).all(|bit| (addr[bit / 8] >> (7 - bit % 8)) & 1 == (net[bit / 8] >> (7 - bit % 8)) & 1)
    };
    tiers.iter().filter(|(len, net, _)| matches(*len, net)).max_by_key(|(len, _, _)| *len).map_or(tier::NORMAL, |t| t.2)
}

/// The reset RFC 793 gives a segment: to a SYN, `SEQ=0, ACK=SEG.SEQ+1, CTL=RST,ACK`;
/// to an ACK, `SEQ=SEG.ACK, CTL=RST`.
fn rst_reply(frame: &[u8], syn: &Syn, to_ack: bool) -> Vec<u8> {
    let (seq, ack, flags) = if to_ack { (syn.ack_seq, 0, 0x04) } else { (0, syn.seq.wrapping_add(1), 0x14) };
    segment_reply(frame, syn, seq, ack, flags, 0, &[])
}

/// The frame that answers `syn` (its MACs swapped, its VLAN tags kept) with a
/// TCP segment of these fields and no options: IPv4 without options, DF, TTL
/// 64, id 0; IPv6 with hop limit 64.
fn segment_reply(frame: &[u8], syn: &Syn, seq: u32, ack: u32, flags: u8, window: u16, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&frame[6..12]);
    out.extend_from_slice(&frame[0..6]);
    out.extend_from_slice(&frame[12..syn.l2_len]);
    let mut tcp = Vec::new();
    tcp.extend_from_slice(&syn.server_port.to_be_bytes());
    tcp.extend_from_slice(&syn.client_port.to_be_bytes());
    tcp.extend_from_slice(&seq.to_be_bytes());
    tcp.extend_from_slice(&ack.to_be_bytes());
    tcp.extend_from_slice(&[0x50, flags]);
    tcp.extend_from_slice(&window.to_be_bytes());
    tcp.extend_from_slice(&[0, 0, 0, 0]);
    tcp.extend_from_slice(payload);
    let tcp_len = u16::try_from(tcp.len()).expect("a reply fits a segment");
    if syn.v6 {
        let mut ip = vec![0x60, 0, 0, 0];
        ip.extend_from_slice(&tcp_len.to_be_bytes());
        ip.extend_from_slice(&[6, 64]);
        ip.extend_from_slice(&syn.server);
        ip.extend_from_slice(&syn.client);
        let pseudo = [&syn.server[..], &syn.client[..], &[0, 0], &tcp_len.to_be_bytes()[..], &[0, 0, 0, 6]].concat();
        let c = crate::frames::internet_checksum(&[&pseudo, &tcp]);
        tcp[16..18].copy_from_slice(&c.to_be_bytes());
        out.extend_from_slice(&ip);
    } else {
        let mut ip = vec![0x45, 0];
        ip.extend_from_slice(&(20 + tcp_len).to_be_bytes());
        ip.extend_from_slice(&[0, 0, 0x40, 0, 64, 6, 0, 0]);
        ip.extend_from_slice(&syn.server[12..]);
        ip.extend_from_slice(&syn.client[12..]);
        let c = crate::frames::internet_checksum(&[&ip]);
        ip[10..12].copy_from_slice(&c.to_be_bytes());
        let pseudo = [&syn.server[12..], &syn.client[12..], &[0, 6], &tcp_len.to_be_bytes()[..]].concat();
        let c = crate::frames::internet_checksum(&[&pseudo, &tcp]);
        tcp[16..18].copy_from_slice(&c.to_be_bytes());
        out.extend_from_slice(&ip);
    }
    out.extend_from_slice(&tcp);
    out
}

fn is_local(state: &ModelState, addr: &[u8; 16]) -> bool {
    let loopback_v4 = addr[..12] == mapped(&[0; 4])[..12] && addr[12] == 127;
    let loopback_v6 = *addr == std::net::Ipv6Addr::LOCALHOST.octets();
    loopback_v4 || loopback_v6 || state.local.contains(addr)
}

/// Whether a reset may go to `client` (the frame arrives from outside, not on loopback).
fn answerable(state: &ModelState, client: &[u8; 16]) -> bool {
    let special = match std::net::Ipv6Addr::from(*client).to_ipv4_mapped() {
        Some(v4) => v4.is_multicast() || v4.is_broadcast() || v4.is_unspecified() || v4.octets()[0] >= 240,
        None => client[0] == 0xff || client == &[0; 16],
    };
    !special && !is_local(state, client)
}

/// What the gate should do with `frame` in `state`.
pub fn decide(frame: &[u8], state: &ModelState) -> Outcome {
    let mut counters = [0u64; counter::COUNT];
    let mut gate = [0u64; gate_counter::COUNT];
    let syn = match parse(frame) {
        Frame::Syn(syn) if syn.v6 && syn.client[..12] == mapped(&[0; 4])[..12] => {
            return Outcome { verdict: Expected::Pass, counters, gate, reserved: 0 };
        }
        Frame::Syn(syn) => syn,
        // The harness's listener holds no handshake and a fuzzed ACK no valid cookie.
        Frame::Pass | Frame::Ack(_) => return Outcome { verdict: Expected::Pass, counters, gate, reserved: 0 },
        Frame::LaterFragment => {
            gate[gate_counter::LATER_FRAGMENT] += 1;
            return Outcome { verdict: Expected::Pass, counters, gate, reserved: 0 };
        }
        Frame::Refuse(why) => {
            gate[why] += 1;
            return Outcome { verdict: Expected::Drop, counters, gate, reserved: 0 };
        }
    };
    let pass = |counters| Outcome { verdict: Expected::Pass, counters, gate, reserved: 0 };
    if syn.server_port != state.port {
        return pass(counters);
    }
    if !is_local(state, &syn.server) {
        counters[counter::NOT_LOCAL] += 1;
        return pass(counters);
    }
    let c = &state.config;
    counters[counter::SYN_SEEN] += 1;
    let tiered = c.tiered != 0;
    // Tiers, exempt included, apply while the port is tiered (some tier is configured).
    let t = if tiered { tier_of(&state.tiers, &syn.client) } else { tier::NORMAL };
    if t == tier::EXEMPT {
        counters[counter::EXEMPT] += 1;
        return pass(counters);
    }
    // A critical or normal source is unproven at its SYN: judged at its ACK.
    if tiered && t < tier::LOW {
        counters[counter::SYN_PASSED] += 1;
        return pass(counters);
    }
    let reason = judged(state, t, Step::Syn, &mut counters);
    // A full port may be full of one client: a SYN it refuses at the limit from
    // a client under its share, while the largest client holds its share, is
    // passed (within a budget) to be judged at its ACK, where its refusal counts.
    let Some(reason) = reason.filter(|&r| !(r == counter::REJECTED_LIMIT && deferred_to_its_ack(state))) else {
        counters[counter::SYN_PASSED] += 1;
        return pass(counters);
    };
    // Dry run: passes what it would refuse (counted at the handshake-completing ACK: decide_ack).
    if c.dry_run != 0 {
        counters[counter::SYN_PASSED] += 1;
        return pass(counters);
    }
    let verdict = refuse(frame, &syn, state, t, reason, Step::Syn, &mut counters);
    Outcome { verdict, counters, gate, reserved: 0 }
}

/// What the gate should do with `frame`, an ACK that completes a handshake the
/// kernel holds (a request socket whose ISN + 1 it acknowledges: the harness
/// guarantees it), in `state`. The policy (docs/DESIGN.md, "Handshake-completing
/// ACK"): the source is proven, so here every tier is judged; an exempt client
/// passes (counted as admitted by its tier, taking no slot); critical and
/// normal meet their tier's share here, having passed their SYN unjudged (low's
/// and an untiered port's share was judged at the SYN, and is not judged twice);
/// a client holding its share of the limit is refused while clients holding
/// less are being refused (contention); a refusal is counted as refused at the
/// ACK and by verified tier, and answered with a reset (`rst`, and `http`: the
/// kernel's handshake is under way) or dropped; dry run admits what it would
/// refuse and counts it; an admission takes one reservation. Each handshake is
/// judged once: `held`, an ACK of a handshake admitted before whose
/// reservation still lives (a duplicate ACK), passes, counted nowhere; a
/// refused one is judged afresh.
pub fn decide_ack(frame: &[u8], state: &ModelState, held: bool) -> Outcome {
    let mut counters = [0u64; counter::COUNT];
    let gate = [0u64; gate_counter::COUNT];
    let Frame::Ack(ack) = parse(frame) else { panic!("decide_ack is for ACK frames") };
    let c = &state.config;
    let t = if c.tiered != 0 { tier_of(&state.tiers, &ack.client) } else { tier::NORMAL };
    let admitted_by_tier = counter::ADMITTED_BY_TIER + usize::from(t);
    if t == tier::EXEMPT {
        counters[admitted_by_tier] += 1;
        return Outcome { verdict: Expected::Pass, counters, gate, reserved: 0 };
    }
    if held {
        return Outcome { verdict: Expected::Pass, counters, gate, reserved: 0 };
    }
    let reason = judged(state, t, Step::Ack, &mut counters);
    if let Some(reason) = reason
        && c.dry_run == 0
    {
        counters[counter::REFUSED_AT_ACK] += 1;
        counters[counter::VERIFIED_REJECTED_BY_TIER + usize::from(t)] += 1;
        let verdict = refuse(frame, &ack, state, t, reason, Step::Ack, &mut counters);
        return Outcome { verdict, counters, gate, reserved: 0 };
    }
    if reason.is_some() {
        counters[counter::DRY_RUN_WOULD_REJECT] += 1;
    }
    counters[counter::ADMITTED] += 1;
    counters[admitted_by_tier] += 1;
    Outcome { verdict: Expected::Pass, counters, gate, reserved: 1 }
}

/// What the gate should do with `frame`, the first segment of the next
/// request on a kept-alive connection whose server socket owes no answer (the
/// harness guarantees it: an idle socket in the gate's books, and the
/// segment's first byte the next the socket expects), in `state`.
/// `refused_before`: the reason this very request (the same first byte) was
/// refused with before, if it was. The policy (docs/OPERATIONS.md, "Requests
/// on kept-alive connections"): only a port that counts work judges its
/// requests; an exempt client passes uncounted; a request refused before gets
/// the same answer again, counted as again and nothing else; otherwise it is
/// judged as a new connection at its handshake (limit, its tier's share with
/// the trickle, the client cap, the client share while contended) against
/// what the port holds; dry run passes what it would refuse, counted. A
/// refusal is counted as a refused request, with its reason and tier. What the
/// client is sent: the tier's action, else the port's; under `http` a request
/// that may be HTTP/1.x (not a TLS record, not HTTP/2's preface) gets a `503`
/// with FIN at the client's acknowledgment number, acknowledging the segment
/// (its FIN included); anything else under `http`, or `rst`, a reset at the
/// acknowledgment number; `drop` nothing. An answer or reset goes only where
/// a reset may go ([`reply`]'s rules).
pub fn decide_turn(frame: &[u8], state: &ModelState, refused_before: Option<usize>) -> Outcome {
    let mut counters = [0u64; counter::COUNT];
    let gate = [0u64; gate_counter::COUNT];
    let Frame::Ack(seg) = parse(frame) else { panic!("decide_turn is for data segments with ACK") };
    let pass = |counters| Outcome { verdict: Expected::Pass, counters, gate, reserved: 0 };
    let c = &state.config;
    if c.count_mode != shed_common::count_mode::WORK {
        return pass(counters);
    }
    let t = if c.tiered != 0 { tier_of(&state.tiers, &seg.client) } else { tier::NORMAL };
    if t == tier::EXEMPT {
        return pass(counters);
    }
    let reason = if let Some(reason) = refused_before {
        counters[counter::REQUEST_REFUSED_AGAIN] += 1;
        reason
    } else {
        let Some(reason) = judged(state, t, Step::Turn, &mut counters) else {
            counters[counter::REQUEST_ADMITTED] += 1;
            return pass(counters);
        };
        if c.dry_run != 0 {
            counters[counter::DRY_RUN_WOULD_REJECT] += 1;
            return pass(counters);
        }
        counters[counter::REFUSED_REQUEST] += 1;
        counters[reason] += 1;
        counters[counter::REJECTED_BY_TIER + usize::from(t)] += 1;
        counters[counter::VERIFIED_REJECTED_BY_TIER + usize::from(t)] += 1;
        reason
    };
    let (payload, fin) = tcp_payload(frame, &seg);
    let own = c.tier_action[usize::from(t)];
    let act = if own == tier::ACTION_DEFAULT { c.action } else { own };
    let tls_or_h2 = payload.len() >= 8 && (payload[0] == 0x16 || payload.starts_with(b"PRI "));
    if act != action::HTTP || tls_or_h2 {
        let verdict = answer(frame, &seg, state, t, Step::Turn, false, &mut counters);
        return Outcome { verdict, counters, gate, reserved: 0 };
    }
    let verdict = match reply(state, t, &seg.client, Step::Turn) {
        Reply::Drop => unreachable!("an http port answers"),
        Reply::Withheld(why) => {
            counters[why] += 1;
            Expected::Drop
        }
        Reply::Rst => {
            counters[counter::HTTP_ANSWERED] += 1;
            let text = http_503(c.retry_after_s, reason, t);
            let end = seg.seq.wrapping_add(payload.len() as u32).wrapping_add(u32::from(fin));
            Expected::Rst(segment_reply(frame, &seg, seg.ack_seq, end, 0x19, 65_535, &text))
        }
    };
    Outcome { verdict, counters, gate, reserved: 0 }
}

/// The `503` a refusal for `reason` of a client of tier `t` gets: Retry-After
/// the port's seconds held to 1 through 999 (the harness sets them), the
/// reason and tier named.
fn http_503(retry_after_s: u16, reason: usize, t: u8) -> Vec<u8> {
    assert_ne!(retry_after_s, 0, "the harness sets the port's Retry-After (else the daemon's derived value is sent)");
    let why = match reason {
        counter::REJECTED_SHARE => "share",
        counter::REJECTED_CLIENT_CAP => "client-cap",
        counter::REJECTED_CLIENT_SHARE => "client-share",
        _ => "limit",
    };
    let tier = ["exempt", "critical", "normal", "low"][usize::from(t)];
    format!(
        "HTTP/1.1 503 Service Unavailable\r\nRetry-After: {:03}\r\nConnection: close\r\nContent-Length: 0\r\nShed: kernel; reason={why}; tier={tier}\r\n\r\n",
        retry_after_s.min(999)
    )
    .into_bytes()
}

/// A TCP segment's payload (to the IP length's end) and whether it carries FIN
/// (IPv4, or IPv6 without extension headers: the turn harness sends no others).
fn tcp_payload<'a>(frame: &'a [u8], seg: &Syn) -> (&'a [u8], bool) {
    let l3 = seg.l2_len;
    let (l4, end) = if seg.v6 {
        (l3 + 40, l3 + 40 + usize::from(be16(frame, l3 + 4).unwrap_or(0)))
    } else {
        let ihl = usize::from(frame[l3] & 0x0f) * 4;
        (l3 + ihl, l3 + usize::from(be16(frame, l3 + 2).unwrap_or(0)))
    };
    let doff = usize::from(frame[l4 + 12] >> 4) * 4;
    let fin = frame[l4 + 13] & 0x01 != 0;
    (frame.get(l4 + doff..end.min(frame.len())).unwrap_or(&[]), fin)
}

/// Where a connection is judged: its SYN (an unproven source) or the ACK that completes its handshake.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    Syn,
    Ack,
    /// The first segment of the next request on a kept-alive connection that owes no answer.
    Turn,
}

/// The counter of the rule that refuses a client of tier `t` at `step`, if one
/// does (the trickle counted as it lets one through).
fn judged(state: &ModelState, t: u8, step: Step, counters: &mut [u64; counter::COUNT]) -> Option<usize> {
    match refusal(state, t, step) {
        Refusal::None => None,
        Refusal::ShareTrickled => {
            counters[counter::TRICKLE] += 1;
            // Let through its tier's share, a connection still meets its client's
            // cap and share where it is admitted (at the ACK, the client's charge).
            if step == Step::Ack { reason_of(client_refusal(state, step)) } else { None }
        }
        other => reason_of(other),
    }
}

/// The counter of a refusal (None: admitted).
fn reason_of(refusal: Refusal) -> Option<usize> {
    match refusal {
        Refusal::None | Refusal::ShareTrickled => None,
        Refusal::Limit => Some(counter::REJECTED_LIMIT),
        Refusal::Share => Some(counter::REJECTED_SHARE),
        Refusal::ClientCap => Some(counter::REJECTED_CLIENT_CAP),
        Refusal::ClientShare => Some(counter::REJECTED_CLIENT_SHARE),
    }
}

/// A refusal for `reason`, counted with its tier, and what it sends.
fn refuse(
    frame: &[u8],
    segment: &Syn,
    state: &ModelState,
    t: u8,
    reason: usize,
    step: Step,
    counters: &mut [u64; counter::COUNT],
) -> Expected {
    counters[reason] += 1;
    counters[counter::REJECTED_BY_TIER + usize::from(t)] += 1;
    // Past the deferral budget (forged SYNs spend it) a SYN refused at the
    // limit whose client the share waits on gets a cookie SYN-ACK of the
    // gate's, even under `rst`: a real client's ACK proves it, and its refusal
    // there makes the share bind.
    let proved = step == Step::Syn && reason == counter::REJECTED_LIMIT && proved_at_its_ack(state);
    answer(frame, segment, state, t, step, proved, counters)
}

/// What a refusal at `step` sends, and the counters of what it sent;
/// `proved`: a SYN the share answers with the gate's cookie ([`proved_at_its_ack`]).
fn answer(
    frame: &[u8],
    segment: &Syn,
    state: &ModelState,
    t: u8,
    step: Step,
    proved: bool,
    counters: &mut [u64; counter::COUNT],
) -> Expected {
    match reply(state, t, &segment.client, step) {
        Reply::Drop => Expected::Drop,
        Reply::Withheld(why) => {
            counters[why] += 1;
            Expected::Drop
        }
        Reply::Rst if proved => {
            counters[counter::HTTP_SYN_ACK] += 1;
            let syn_ack = 0x12;
            Expected::Rst(segment_reply(
                frame,
                segment,
                state.syn_cookie,
                segment.seq.wrapping_add(1),
                syn_ack,
                65_535,
                &[],
            ))
        }
        Reply::Rst => {
            counters[counter::RST_SENT] += 1;
            Expected::Rst(rst_reply(frame, segment, step != Step::Syn))
        }
    }
}

/// Why a client of tier `t` is refused at `step`, by the policy's rules,
/// each stated on its own and then ranked (docs/DESIGN.md, "The policy, ranked"):
/// the whole limit is a hard stop; a tier's share of the limit, less the room
/// held back for the tiers above it, sheds lower tiers first, except that every
/// 16th such refusal on a CPU is let through (the trickle); a client holding its
/// cap is refused; at the ACK, a client holding its share of the limit is refused
/// while others are being refused. One the trickle lets through passes the
/// client rules too, except at the ACK, where its client is charged
/// ([`judged`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    None,
    Limit,
    Share,
    /// Over its tier's share, and let through by the trickle.
    ShareTrickled,
    ClientCap,
    ClientShare,
}

fn refusal(state: &ModelState, t: u8, step: Step) -> Refusal {
    let c = &state.config;
    let limit = i128::from(state.limit);
    let in_flight = i128::from(state.in_flight);
    // An untiered port is one tier, normal, whose share is the whole limit.
    let share_permille = if c.tiered == 0 { 1000 } else { i128::from(c.share_permille[usize::from(t)]) };
    // Room in signed arithmetic: a tier's allowance is its share of the limit
    // rounded down, less what is held back for the tiers above; no room is left
    // once what the port holds reaches it.
    let port_room = limit - in_flight;
    let tier_room = (limit * share_permille).div_euclid(1000) - i128::from(state.held_back[usize::from(t)]) - in_flight;
    // A tier's share is judged once per connection: where its tier is judged.
    // A request on a kept-alive connection is a new piece of work: its tier's share is judged each time.
    let share_judged = match step {
        Step::Syn | Step::Turn => true,
        Step::Ack => c.tiered != 0 && t < tier::LOW,
    };
    let trickle_turn = (state.trickle_seen + 1).is_multiple_of(TRICKLE_EVERY);
    let rules = [
        (port_room <= 0, Refusal::Limit),
        (share_judged && tier_room <= 0, if trickle_turn { Refusal::ShareTrickled } else { Refusal::Share }),
    ];
    rules.into_iter().find(|(broken, _)| *broken).map_or_else(|| client_refusal(state, step), |(_, why)| why)
}

/// The client rules, ranked: a client holding its cap; past the SYN, a client
/// holding its share of the limit while others are being refused.
fn client_refusal(state: &ModelState, step: Step) -> Refusal {
    let c = &state.config;
    let at_cap = c.client_cap != 0 && state.client_held >= i64::from(c.client_cap);
    let over_its_share = step != Step::Syn
        && state.contended
        && client_share_cap(c.client_share, state.limit).is_some_and(|cap| state.client_held >= cap);
    if at_cap {
        Refusal::ClientCap
    } else if over_its_share {
        Refusal::ClientShare
    } else {
        Refusal::None
    }
}

/// Whether the share waits on this SYN's client to prove itself: the port's
/// largest client holds its share and this one less (an untiered port: on a
/// tiered one critical and normal are judged at their ACK already).
fn share_waits_on_its_client(state: &ModelState) -> bool {
    state.config.tiered == 0
        && client_share_cap(state.config.client_share, state.limit)
            .is_some_and(|cap| state.largest_held >= cap as u64 && state.client_held < cap)
}

/// Whether a SYN refused at the limit passes instead, to be judged at its ACK
/// (within the budget).
fn deferred_to_its_ack(state: &ModelState) -> bool {
    state.deferral_budget && share_waits_on_its_client(state)
}

/// Whether a SYN refused at the limit is answered with the gate's cookie so
/// that its ACK proves its client: the budget spent.
fn proved_at_its_ack(state: &ModelState) -> bool {
    !state.deferral_budget && share_waits_on_its_client(state)
}

/// The cookie (initial sequence number) of the gate's SYN-ACK `reply` to
/// `frame` (0 if `frame` is not a segment or `reply` too short): replies
/// carry no IP options, so the TCP header follows the frame's own tags.
pub fn answered_cookie(frame: &[u8], reply: &[u8]) -> u32 {
    let (Frame::Syn(syn) | Frame::Ack(syn)) = parse(frame) else { return 0 };
    let at = syn.l2_len + if syn.v6 { 40 } else { 20 } + 4;
    reply.get(at..at + 4).map_or(0, |b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
}

/// What one client may hold while others are refused (`--client-share`, a
/// percentage of the limit): at least one connection, and no bound at all if
/// that is the whole limit, or the share is 0 (off).
fn client_share_cap(percent: u8, limit: u32) -> Option<i64> {
    if percent == 0 {
        return None;
    }
    let cap = (i64::from(limit) * i64::from(percent) / 100).max(1);
    (cap < i64::from(limit)).then_some(cap)
}

/// What a refusal sends.
enum Reply {
    Drop,
    /// A reset was due but may not go: counted under this counter, dropped.
    Withheld(usize),
    Rst,
}

/// The tier's own action, else the port's; a reset only to an address that can
/// be a client, and only while the client's prefix and the port have budget.
/// At the ACK an `http` port resets too (the kernel's handshake is under way);
/// its answer at the SYN is not modelled (the program tests compare it whole).
fn reply(state: &ModelState, t: u8, client: &[u8; 16], step: Step) -> Reply {
    let c = &state.config;
    let own = c.tier_action[usize::from(t)];
    let action = if own == tier::ACTION_DEFAULT { c.action } else { own };
    assert!(step != Step::Syn || action != action::HTTP, "the model does not cover the http answer at the SYN");
    if action != action::RST && action != action::HTTP {
        return Reply::Drop;
    }
    if !answerable(state, client) {
        return Reply::Withheld(counter::RST_SUPPRESSED);
    }
    let spent = |rate: u32, has_budget: bool| rate != 0 && !has_budget;
    // The port's largest client, while it holds connections, is no forged
    // source (a proxy's many users): only the port's budget applies to it.
    let proven = c.counts_clients() && state.largest_held > 0 && state.largest_is_client;
    if (!proven && spent(c.rst_per_prefix_per_sec, state.rst_budget.prefix))
        || spent(c.rst_per_sec, state.rst_budget.port)
    {
        return Reply::Withheld(counter::RST_RATE_LIMITED);
    }
    Reply::Rst
}

#[cfg(test)]
mod rules {
    use super::*;

    fn refusal_at_syn(state: &ModelState, t: u8) -> Refusal {
        refusal(state, t, Step::Syn)
    }

    fn untiered() -> PortConfig {
        PortConfig::new(0, action::DROP, false, shed_common::count_mode::CONNECTIONS)
    }

    fn state(limit: u32, in_flight: u64) -> ModelState {
        ModelState {
            port: 80,
            config: PortConfig { tiered: 1, share_permille: [1000, 1000, 500, 250], ..untiered() },
            limit,
            in_flight,
            client_held: 0,
            held_back: [0; 4],
            rst_budget: RstBudget { prefix: true, port: true },
            trickle_seen: 0,
            contended: false,
            largest_held: 0,
            largest_is_client: false,
            deferral_budget: false,
            syn_cookie: 0,
            local: Vec::new(),
            tiers: Vec::new(),
        }
    }

    #[test]
    fn the_limit_is_a_hard_stop() {
        // critical's share is the whole limit.
        assert_eq!(refusal_at_syn(&state(10, 9), tier::CRITICAL), Refusal::None);
        assert_eq!(refusal_at_syn(&state(10, 10), tier::CRITICAL), Refusal::Limit);
        assert_eq!(refusal_at_syn(&state(0, 0), tier::CRITICAL), Refusal::Limit, "a limit of 0 admits nothing");
        // The limit outranks a full share and the trickle's turn.
        let s = ModelState { trickle_seen: 15, ..state(10, 10) };
        assert_eq!(refusal_at_syn(&s, tier::LOW), Refusal::Limit);
    }

    #[test]
    fn a_share_is_rounded_down_less_the_room_held_back() {
        // low: 25% of 10 is 2.5, so 2.
        assert_eq!(refusal_at_syn(&state(10, 1), tier::LOW), Refusal::None);
        assert_eq!(refusal_at_syn(&state(10, 2), tier::LOW), Refusal::Share);
        // normal: 50% of 10 is 5; one slot held back for critical leaves 4.
        let held = ModelState { held_back: [0, 0, 1, 0], ..state(10, 4) };
        assert_eq!(refusal_at_syn(&held, tier::NORMAL), Refusal::Share);
        assert_eq!(refusal_at_syn(&ModelState { in_flight: 3, ..held.clone() }, tier::NORMAL), Refusal::None);
        // More held back than the share: no room at all, even with nothing held.
        let all = ModelState { held_back: [0, 0, 0, 9], ..state(10, 0) };
        assert_eq!(refusal_at_syn(&all, tier::LOW), Refusal::Share);
        // An untiered port is one tier with the whole limit.
        let untiered = ModelState { config: untiered(), ..state(10, 9) };
        assert_eq!(refusal_at_syn(&untiered, tier::NORMAL), Refusal::None);
    }

    #[test]
    fn every_sixteenth_share_refusal_is_let_through_and_asked_nothing_more() {
        let full =
            ModelState { client_held: 9, config: PortConfig { client_cap: 1, ..state(10, 2).config }, ..state(10, 2) };
        let turns: Vec<bool> = (0..32)
            .map(|seen| {
                refusal_at_syn(&ModelState { trickle_seen: seen, ..full.clone() }, tier::LOW) == Refusal::ShareTrickled
            })
            .collect();
        assert_eq!(turns.iter().filter(|t| **t).count(), 2);
        assert!(turns[15] && turns[31]);
        // Under its share the cap applies.
        assert_eq!(refusal_at_syn(&ModelState { in_flight: 0, ..full }, tier::LOW), Refusal::ClientCap);
    }

    /// The trickle lets a connection through its tier's share and asks the
    /// rules nothing more; where it is admitted, at the ACK, its client is
    /// still charged, and a client at its cap, or at its share while the port
    /// is contended, is refused there.
    #[test]
    fn a_trickled_ack_still_meets_its_clients_cap_and_share() {
        // Normal (50% of 10) over its share on a tiered port: judged at the ACK; the 16th is trickled.
        let mut s = ModelState { trickle_seen: 15, ..state(10, 6) };
        let mut counters = [0u64; counter::COUNT];
        assert_eq!(refusal(&s, tier::NORMAL, Step::Ack), Refusal::ShareTrickled);
        assert_eq!(judged(&s, tier::NORMAL, Step::Ack, &mut counters), None, "no cap: let through");
        s.config.client_cap = 2;
        s.client_held = 1;
        assert_eq!(judged(&s, tier::NORMAL, Step::Ack, &mut counters), None, "under its cap");
        s.client_held = 2;
        assert_eq!(judged(&s, tier::NORMAL, Step::Ack, &mut counters), Some(counter::REJECTED_CLIENT_CAP));
        assert_eq!(counters[counter::TRICKLE], 3, "each was trickled");
        // A kept-alive request is not charged: the trickle asks nothing more of it.
        assert_eq!(judged(&s, tier::NORMAL, Step::Turn, &mut counters), None);
        // The client share (30% of 10: 3), under its cap.
        s.config.client_cap = 0;
        s.config.client_share = 30;
        s.client_held = 3;
        assert_eq!(judged(&s, tier::NORMAL, Step::Ack, &mut counters), None, "uncontended: let through");
        s.contended = true;
        assert_eq!(judged(&s, tier::NORMAL, Step::Ack, &mut counters), Some(counter::REJECTED_CLIENT_SHARE));
        s.client_held = 2;
        assert_eq!(judged(&s, tier::NORMAL, Step::Ack, &mut counters), None, "under its share");
        s.client_held = 3;
        assert_eq!(judged(&s, tier::NORMAL, Step::Turn, &mut counters), None, "a request is not charged");
    }

    #[test]
    fn the_client_cap_counts_what_the_client_holds() {
        let capped = |held| ModelState {
            client_held: held,
            config: PortConfig { client_cap: 2, ..state(10, 0).config },
            ..state(10, 0)
        };
        assert_eq!(refusal_at_syn(&capped(1), tier::CRITICAL), Refusal::None);
        assert_eq!(refusal_at_syn(&capped(2), tier::CRITICAL), Refusal::ClientCap);
        let off = ModelState { client_held: 100, ..state(10, 0) };
        assert_eq!(refusal_at_syn(&off, tier::CRITICAL), Refusal::None, "a cap of 0 is off");
    }

    #[test]
    fn at_the_ack_a_share_is_judged_only_where_the_syn_did_not_judge_it() {
        // normal (50% of 10) and low (25%) both over their share, well under the limit.
        let s = state(10, 6);
        assert_eq!(refusal(&s, tier::NORMAL, Step::Ack), Refusal::Share, "normal passed its SYN unjudged");
        assert_eq!(refusal(&s, tier::LOW, Step::Ack), Refusal::None, "low's share was judged at its SYN");
        let untiered = ModelState { config: untiered(), held_back: [0, 0, 9, 0], ..state(10, 6) };
        assert_eq!(refusal(&untiered, tier::NORMAL, Step::Ack), Refusal::None);
        assert_eq!(refusal(&untiered, tier::NORMAL, Step::Syn), Refusal::Share);
    }

    #[test]
    fn at_the_ack_a_client_at_its_share_is_refused_only_under_contention() {
        let mut s = state(10, 0);
        s.config.client_share = 50;
        s.client_held = 5;
        assert_eq!(refusal(&s, tier::CRITICAL, Step::Ack), Refusal::None, "alone, a client gets the whole port");
        s.contended = true;
        assert_eq!(refusal(&s, tier::CRITICAL, Step::Ack), Refusal::ClientShare);
        assert_eq!(refusal(&s, tier::CRITICAL, Step::Syn), Refusal::None, "never on an unproven source");
        s.client_held = 4;
        assert_eq!(refusal(&s, tier::CRITICAL, Step::Ack), Refusal::None);
        // At least one; none when that would be the whole limit.
        assert_eq!(client_share_cap(10, 3), Some(1));
        assert_eq!(client_share_cap(50, 1), None);
        assert_eq!(client_share_cap(0, 100), None);
        assert_eq!(client_share_cap(30, 10), Some(3));
    }

    #[test]
    fn past_the_budget_a_newcomer_under_its_share_is_refused_with_a_cookie() {
        // Untiered, full (limit 10), the largest client at its share (5), this client under it.
        let mut s = ModelState {
            config: PortConfig { tiered: 0, client_share: 50, action: action::RST, ..state(10, 10).config },
            largest_held: 5,
            client_held: 1,
            ..state(10, 10)
        };
        s.deferral_budget = true;
        assert!(deferred_to_its_ack(&s) && !proved_at_its_ack(&s), "within the budget: passed to its ACK");
        s.deferral_budget = false;
        assert!(proved_at_its_ack(&s), "past it: a cookie, whose ACK proves the client");
        assert!(
            !proved_at_its_ack(&ModelState { client_held: 5, ..s.clone() }),
            "a client at its share: no proof owed"
        );
        assert!(!proved_at_its_ack(&ModelState { largest_held: 4, ..s.clone() }), "nobody at the share");
        let tiered = ModelState { config: PortConfig { tiered: 1, ..s.config }, ..s.clone() };
        assert!(!proved_at_its_ack(&tiered), "tiered: judged at the ACK already");
    }

    #[test]
    fn a_reset_needs_an_answerable_client_and_budget() {
        let client = mapped(&[192, 0, 2, 1]);
        let rst = ModelState { config: PortConfig { action: action::RST, ..state(1, 1).config }, ..state(1, 1) };
        assert!(matches!(reply(&rst, tier::LOW, &client, Step::Syn), Reply::Rst));
        assert!(matches!(
            reply(&rst, tier::LOW, &mapped(&[224, 0, 0, 1]), Step::Syn),
            Reply::Withheld(counter::RST_SUPPRESSED)
        ));
        let mut dropping = rst.clone();
        dropping.config.tier_action[usize::from(tier::LOW)] = action::DROP;
        assert!(matches!(reply(&dropping, tier::LOW, &client, Step::Syn), Reply::Drop));
        assert!(
            matches!(reply(&dropping, tier::NORMAL, &client, Step::Syn), Reply::Rst),
            "the port's action for the others"
        );
        let mut spent = rst.clone();
        spent.config.rst_per_sec = 5;
        spent.rst_budget.port = false;
        assert!(matches!(reply(&spent, tier::LOW, &client, Step::Syn), Reply::Withheld(counter::RST_RATE_LIMITED)));
        spent.config.rst_per_sec = 0;
        assert!(matches!(reply(&spent, tier::LOW, &client, Step::Syn), Reply::Rst), "no rate, no cap");
        // The prefix's budget spent: a source with connections on the port
        // (clients counted) is answered within the port's alone.
        let mut prefix = rst.clone();
        prefix.config.rst_per_prefix_per_sec = 5;
        prefix.config.client_share = 50;
        prefix.rst_budget.prefix = false;
        (prefix.largest_held, prefix.largest_is_client) = (3, false);
        assert!(
            matches!(reply(&prefix, tier::LOW, &client, Step::Syn), Reply::Withheld(counter::RST_RATE_LIMITED)),
            "another client is the largest"
        );
        (prefix.largest_held, prefix.largest_is_client) = (0, true);
        assert!(
            matches!(reply(&prefix, tier::LOW, &client, Step::Syn), Reply::Withheld(counter::RST_RATE_LIMITED)),
            "the largest holds nothing"
        );
        prefix.largest_held = 1;
        assert!(matches!(reply(&prefix, tier::LOW, &client, Step::Syn), Reply::Rst), "a proven source");
        prefix.rst_budget.port = false;
        prefix.config.rst_per_sec = 5;
        assert!(
            matches!(reply(&prefix, tier::LOW, &client, Step::Syn), Reply::Withheld(counter::RST_RATE_LIMITED)),
            "the port's budget still binds it"
        );
        prefix.rst_budget.port = true;
        prefix.config.client_share = 0;
        assert!(
            matches!(reply(&prefix, tier::LOW, &client, Step::Syn), Reply::Withheld(counter::RST_RATE_LIMITED)),
            "clients uncounted: nothing proves it"
        );
    }
}

/// The policy's own derivations of who a client is, written from
/// docs/DESIGN.md and OPERATIONS.md, not from shed-common's helpers: the
/// harness builds the kernel's inputs with these, so a bug in the shared
/// helpers (an IPv6 key cut at the wrong bit, a wrong RST prefix, a CIDR
/// misread) makes the kernel and the model disagree.
pub mod reference {
    use std::net::IpAddr;

    /// Whether an address is IPv4 as the gate stores it (`::ffff:a.b.c.d`).
    pub fn is_v4(addr: &[u8; 16]) -> bool {
        addr[..10].iter().all(|&b| b == 0) && addr[10] == 0xff && addr[11] == 0xff
    }

    /// The first `bits` bits of `addr`, the rest zero.
    fn keep_bits(addr: &[u8; 16], bits: u32) -> [u8; 16] {
        let mut out = [0u8; 16];
        for bit in 0..bits.min(128) as usize {
            out[bit / 8] |= addr[bit / 8] & (0x80 >> (bit % 8));
        }
        out
    }

    /// A client as the per-client cap counts it: an IPv4 address whole, an
    /// IPv6 one by its first `v6_prefix` bits (`--client-prefix-v6`, 64 by default).
    pub fn client_addr(addr: &[u8; 16], v6_prefix: u8) -> [u8; 16] {
        if is_v4(addr) { *addr } else { keep_bits(addr, u32::from(v6_prefix)) }
    }

    /// The prefix the per-prefix RST cap counts: IPv4 /24, IPv6 /48.
    pub fn rst_prefix(addr: &[u8; 16]) -> [u8; 16] {
        keep_bits(addr, if is_v4(addr) { 96 + 24 } else { 48 })
    }

    /// A tier's network, `a.b.c.d/n` or `x::/n`, as (prefix length over the
    /// 128-bit address, IPv4 mapped; network): None if it is not one.
    pub fn cidr(s: &str) -> Option<(u32, [u8; 16])> {
        let (addr, len) = s.split_once('/')?;
        let len: u32 = len.parse().ok()?;
        let (bytes, len) = match addr.parse::<IpAddr>().ok()? {
            IpAddr::V4(v4) if len <= 32 => {
                let mut b = [0u8; 16];
                b[10] = 0xff;
                b[11] = 0xff;
                b[12..].copy_from_slice(&v4.octets());
                (b, 96 + len)
            }
            IpAddr::V6(v6) if len <= 128 => (v6.octets(), len),
            _ => return None,
        };
        (keep_bits(&bytes, len) == bytes).then_some((len, bytes))
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        fn v6(s: &str) -> [u8; 16] {
            s.parse::<std::net::Ipv6Addr>().unwrap().octets()
        }

        #[test]
        fn clients_and_prefixes_by_the_documented_rules() {
            let host = v6("2001:db8:1:2:3:4:5:6");
            assert_eq!(client_addr(&host, 64), v6("2001:db8:1:2::"));
            assert_eq!(client_addr(&host, 56), v6("2001:db8:1::"));
            assert_eq!(client_addr(&host, 128), host);
            assert_eq!(rst_prefix(&host), v6("2001:db8:1::"));
            let v4 = v6("::ffff:192.0.2.77");
            assert!(is_v4(&v4) && !is_v4(&host));
            assert_eq!(client_addr(&v4, 64), v4, "an IPv4 client is its whole address");
            assert_eq!(rst_prefix(&v4), v6("::ffff:192.0.2.0"));
        }

        #[test]
        fn cidrs_by_the_documented_rules() {
            assert_eq!(cidr("10.1.0.0/16"), Some((112, v6("::ffff:10.1.0.0"))));
            assert_eq!(cidr("2001:db8:1::/48"), Some((48, v6("2001:db8:1::"))));
            assert_eq!(cidr("10.1.2.3/32"), Some((128, v6("::ffff:10.1.2.3"))));
            assert_eq!(cidr("10.1.0.1/16"), None, "host bits set");
            assert_eq!(cidr("10.0.0.0/33"), None);
            assert_eq!(cidr("10.0.0.0"), None);
        }
    }
}
