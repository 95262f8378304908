//! A reference model of the gate's packet decision, written independently of
//! the kernel code (plain slices, no shared parser or RST builder), for
//! differential testing: the same frame and state through the model and
//! through the loaded programs must give the same verdict, the same counter
//! changes and, for a RST, the same bytes.
//!
//! The model covers what the fuzz harness varies: one protected port, its
//! limit, action, dry-run, tier shares and actions, pre-existing in-flight,
//! an optional pending reservation for the frame's flow, and a fixed tier
//! table. Client caps and RST caps are off in the harness.
use shed_common::{PortConfig, action, counter, tier};

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
    /// In-flight before the frame (established connections, counted as connections).
    pub in_flight: u64,
    /// Whether the frame's flow already holds a pending reservation.
    pub pending_hit: bool,
    /// Longest-prefix tiers: (prefix length over the mapped address, address, tier).
    pub tiers: Vec<(u32, [u8; 16], u8)>,
}

/// The outcome: the verdict and how each counter moved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    pub verdict: Expected,
    pub counters: [u64; counter::COUNT],
}

struct Syn {
    l2_len: usize,
    v6: bool,
    client: [u8; 16],
    server: [u8; 16],
    client_port: u16,
    server_port: u16,
    seq: u32,
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

fn parse(f: &[u8]) -> Option<Syn> {
    let mut ethertype = be16(f, 12)?;
    let mut l3 = 14;
    if ethertype == 0x8100 || ethertype == 0x88a8 {
        ethertype = be16(f, 16)?;
        l3 = 18;
    }
    let (l4, v6, client, server) = match ethertype {
        0x0800 => {
            let ip = f.get(l3..l3 + 20)?;
            let ihl = usize::from(ip[0] & 0x0f) * 4;
            if ip[0] >> 4 != 4 || ihl < 20 || ip[9] != 6 || be16(ip, 6)? & 0x3fff != 0 {
                return None;
            }
            (l3 + ihl, false, mapped(&ip[12..16]), mapped(&ip[16..20]))
        }
        0x86dd => {
            let ip = f.get(l3..l3 + 40)?;
            if ip[0] >> 4 != 6 || ip[6] != 6 {
                return None;
            }
            (l3 + 40, true, ip[8..24].try_into().ok()?, ip[24..40].try_into().ok()?)
        }
        _ => return None,
    };
    let tcp = f.get(l4..l4 + 20)?;
    let flags = tcp[13];
    if tcp[12] >> 4 < 5 || flags & 0x02 == 0 || flags & 0x10 != 0 || flags & 0x04 != 0 {
        return None;
    }
    Some(Syn {
        l2_len: l3,
        v6,
        client,
        server,
        client_port: be16(tcp, 0)?,
        server_port: be16(tcp, 2)?,
        seq: u32::from_be_bytes(tcp[4..8].try_into().ok()?),
    })
}

fn tier_of(tiers: &[(u32, [u8; 16], u8)], addr: &[u8; 16]) -> u8 {
    let matches = |len: u32, net: &[u8; 16]| {
        (0..len as usize).all(|bit| (addr[bit / 8] >> (7 - bit % 8)) & 1 == (net[bit / 8] >> (7 - bit % 8)) & 1)
    };
    tiers.iter().filter(|(len, net, _)| matches(*len, net)).max_by_key(|(len, _, _)| *len).map_or(tier::NORMAL, |t| t.2)
}

/// RFC 1071, over the concatenation of `parts`.
fn checksum(parts: &[&[u8]]) -> u16 {
    let bytes = parts.concat();
    let mut sum: u64 = bytes.chunks(2).map(|c| u64::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]))).sum();
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

fn rst_reply(frame: &[u8], syn: &Syn) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&frame[6..12]);
    out.extend_from_slice(&frame[0..6]);
    out.extend_from_slice(&frame[12..syn.l2_len]);
    let mut tcp = Vec::new();
    tcp.extend_from_slice(&syn.server_port.to_be_bytes());
    tcp.extend_from_slice(&syn.client_port.to_be_bytes());
    tcp.extend_from_slice(&[0, 0, 0, 0]);
    tcp.extend_from_slice(&syn.seq.wrapping_add(1).to_be_bytes());
    tcp.extend_from_slice(&[0x50, 0x14, 0, 0, 0, 0, 0, 0]);
    if syn.v6 {
        let mut ip = vec![0x60, 0, 0, 0, 0, 20, 6, 64];
        ip.extend_from_slice(&syn.server);
        ip.extend_from_slice(&syn.client);
        let pseudo = [&syn.server[..], &syn.client[..], &[0, 0, 0, 20, 0, 0, 0, 6]].concat();
        let c = checksum(&[&pseudo, &tcp]);
        tcp[16..18].copy_from_slice(&c.to_be_bytes());
        out.extend_from_slice(&ip);
    } else {
        let mut ip = vec![0x45, 0, 0, 40, 0, 0, 0x40, 0, 64, 6, 0, 0];
        ip.extend_from_slice(&syn.server[12..]);
        ip.extend_from_slice(&syn.client[12..]);
        let c = checksum(&[&ip]);
        ip[10..12].copy_from_slice(&c.to_be_bytes());
        let pseudo = [&syn.server[12..], &syn.client[12..], &[0, 6, 0, 20]].concat();
        let c = checksum(&[&pseudo, &tcp]);
        tcp[16..18].copy_from_slice(&c.to_be_bytes());
        out.extend_from_slice(&ip);
    }
    out.extend_from_slice(&tcp);
    out
}

/// The flow of a frame's SYN, as the pending map keys it (None: not a SYN).
pub fn flow_key(frame: &[u8]) -> Option<shed_common::FlowKey> {
    let syn = parse(frame)?;
    Some(shed_common::FlowKey {
        client_addr: syn.client,
        server_addr: syn.server,
        client_port: syn.client_port,
        server_port: syn.server_port,
    })
}

/// What the gate should do with `frame` in `state`.
pub fn decide(frame: &[u8], state: &ModelState) -> Outcome {
    let mut counters = [0u64; counter::COUNT];
    let pass = |counters| Outcome { verdict: Expected::Pass, counters };
    let Some(syn) = parse(frame) else { return pass(counters) };
    if syn.server_port != state.port {
        return pass(counters);
    }
    let c = &state.config;
    counters[counter::SYN_SEEN] += 1;
    // Tiers, exempt included, apply while the port is tiered (some tier is configured).
    let t = if c.tiered != 0 { tier_of(&state.tiers, &syn.client) } else { tier::NORMAL };
    if t == tier::EXEMPT {
        counters[counter::EXEMPT] += 1;
        counters[counter::ADMITTED_BY_TIER + t as usize] += 1;
        return pass(counters);
    }
    if state.pending_hit {
        counters[counter::SYN_RETRANSMIT] += 1;
        return pass(counters);
    }
    let share = if c.tiered == 0 { 1000 } else { u64::from(c.share_permille[t as usize]) };
    let reason = if state.in_flight >= u64::from(state.limit) {
        Some(counter::REJECTED_LIMIT)
    } else if state.in_flight >= u64::from(state.limit) * share / 1000 {
        // Fresh counters: the trickle admits the 16th share rejection, never the first.
        Some(counter::REJECTED_SHARE)
    } else {
        None
    };
    if let Some(reason) = reason {
        if c.dry_run == 0 {
            counters[reason] += 1;
            counters[counter::REJECTED_BY_TIER + t as usize] += 1;
            let act =
                if c.tier_action[t as usize] != tier::ACTION_DEFAULT { c.tier_action[t as usize] } else { c.action };
            if act != action::RST {
                return Outcome { verdict: Expected::Drop, counters };
            }
            counters[counter::RST_SENT] += 1;
            return Outcome { verdict: Expected::Rst(rst_reply(frame, &syn)), counters };
        }
        counters[counter::DRY_RUN_WOULD_REJECT] += 1;
    }
    counters[counter::ADMITTED] += 1;
    counters[counter::ADMITTED_BY_TIER + t as usize] += 1;
    pass(counters)
}
