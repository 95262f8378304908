// SPDX-License-Identifier: MIT OR Apache-2.0
//! Netfilter NAT that takes connections past the gate: a `redirect`, or a
//! `dnat` to one of the namespace's own addresses, that sends a port to a
//! protected listener (or a protected port elsewhere). Netfilter rewrites the
//! destination after TC and XDP have seen the packet, so the gate judges the
//! port on the wire and the kernel's socket lookup, made with that port, never
//! finds the handshake the connection completes. Read from `nft -j list
//! ruleset` (nftables, and iptables-nft's rules) and `iptables-legacy-save`.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
    path::Path,
    process::Command,
};

/// One NAT statement that ends at a local listener.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct LocalNat {
    /// Where it is: `nftables table ip nat chain prerouting`, `iptables-legacy nat PREROUTING`.
    pub place: String,
    /// The destination ports it matches (empty: every port).
    pub from_ports: Vec<u16>,
    /// The port it sends to (None: the one the packet had).
    pub to_port: Option<u16>,
}

impl LocalNat {
    /// The protected port among `ports` it takes connections past the gate
    /// of, if any: it rewrites the destination of a protected port's segments
    /// (the kernel's socket lookup, made with the port and address on the
    /// wire, then misses the handshake), or sends another port's to a
    /// protected listener (whose port the gate never sees on the wire).
    pub(crate) fn bypasses(&self, ports: &[u16]) -> Option<u16> {
        let matches = |p: u16| self.from_ports.is_empty() || self.from_ports.contains(&p);
        ports.iter().copied().find(|&p| {
            matches(p)
                || (self.to_port == Some(p) && (self.from_ports.is_empty() || self.from_ports.iter().any(|&f| f != p)))
        })
    }

    /// The statement as an operator would write it.
    pub(crate) fn describe(&self) -> String {
        let from = match self.from_ports.as_slice() {
            [] => "every port".to_owned(),
            [one] => format!("port {one}"),
            many => format!("ports {}", many.iter().map(u16::to_string).collect::<Vec<_>>().join(", ")),
        };
        match self.to_port {
            Some(to) => format!("{}: {from} to local port {to}", self.place),
            None => format!("{}: {from} to a local address", self.place),
        }
    }
}

/// What one look at the calling thread's namespace found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct NatLook {
    /// Every NAT statement that ends at a local listener.
    pub found: Vec<LocalNat>,
    /// Whether any ruleset could be read: false when neither `nft` nor the
    /// legacy iptables tools run here (a NAT rule would then go unseen).
    pub readable: bool,
}

impl NatLook {
    /// The protected ports among `ports` that a statement takes past the
    /// gate, each with the first such statement as an operator would write it.
    pub(crate) fn bypassed(&self, ports: &[u16]) -> std::collections::BTreeMap<u16, String> {
        let mut bypassed = std::collections::BTreeMap::new();
        for nat in &self.found {
            for &port in ports {
                if nat.bypasses(&[port]).is_some() {
                    bypassed.entry(port).or_insert_with(|| nat.describe());
                }
            }
        }
        bypassed
    }
}

/// Reads every NAT statement of the calling thread's namespace that ends at
/// one of its own addresses (or loopback).
pub(crate) fn look() -> NatLook {
    local_nat(&local_addresses())
}

/// [`look`], with the [`NatStamp`] it was taken at (read first: a change
/// made during the look shows in the next stamp).
pub(crate) fn look_stamped() -> (NatLook, NatStamp) {
    let stamp = NatStamp::now();
    (local_nat(&stamp.local), stamp)
}

/// What a look at the namespace's NAT depends on, read without starting a
/// tool: nftables' ruleset generation (every change to the namespace's
/// ruleset bumps it, iptables-nft's rules included), the namespace's
/// addresses (a DNAT to one of them counts), and whether a legacy `nat`
/// table exists (legacy iptables keeps no generation: such a namespace is
/// read in full every look).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct NatStamp {
    generation: Option<u32>,
    local: BTreeSet<IpAddr>,
    legacy_nat: bool,
}

impl NatStamp {
    /// The calling thread's namespace's, now.
    pub(crate) fn now() -> Self {
        Self {
            generation: nft_generation().ok(),
            local: local_addresses(),
            legacy_nat: LEGACY.iter().any(|&(tool, _, tables)| installed(tool) && legacy_table(tables, "nat")),
        }
    }

    /// Whether a look taken at `self` still holds at `now`: nothing it read can have changed.
    pub(crate) fn still_holds(&self, now: &Self) -> bool {
        self.generation.is_some() && !self.legacy_nat && self == now
    }
}

fn local_addresses() -> BTreeSet<IpAddr> {
    crate::host::system::local_addresses().map(|addrs| own_addresses(addrs.keys())).unwrap_or_default()
}

const NETLINK_NETFILTER: libc::c_int = 12;
const NFNL_SUBSYS_NFTABLES: u16 = 10;
const NFT_MSG_GETGEN: u16 = 16;
const NFT_MSG_NEWGEN: u16 = 15;
const NFTA_GEN_ID: u16 = 1;
/// nlmsghdr, then nfgenmsg.
const GEN_HEADER: usize = 16 + 4;

/// nftables' ruleset generation in the calling thread's namespace
/// (`NFT_MSG_GETGEN`, as `nft` asks it before each change).
fn nft_generation() -> std::io::Result<u32> {
    use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};
    // SAFETY: plain socket(2); the fd is owned below.
    let fd = unsafe { libc::socket(libc::AF_NETLINK, libc::SOCK_RAW | libc::SOCK_CLOEXEC, NETLINK_NETFILTER) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a fresh fd nobody else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // The kernel answers at once; a second bounds a wait that should not happen.
    let timeout = libc::timeval { tv_sec: 1, tv_usec: 0 };
    // SAFETY: setting a timeval option on our socket.
    unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&raw const timeout).cast(),
            size_of::<libc::timeval>() as libc::socklen_t,
        );
    }
    let mut request = [0u8; GEN_HEADER];
    request[0..4].copy_from_slice(&(GEN_HEADER as u32).to_ne_bytes());
    request[4..6].copy_from_slice(&((NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_GETGEN).to_ne_bytes());
    request[6..8].copy_from_slice(&(libc::NLM_F_REQUEST as u16).to_ne_bytes());
    request[8..12].copy_from_slice(&1u32.to_ne_bytes());
    // The rest zero: port id 0 (the kernel's to fill), nfgenmsg AF_UNSPEC, version 0, resource 0.
    // SAFETY: sending a buffer we own on our socket (a netlink socket's default peer is the kernel).
    if unsafe { libc::send(fd.as_raw_fd(), request.as_ptr().cast(), request.len(), 0) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut reply = [0u8; 512];
    // SAFETY: receiving into a buffer we own, of its length.
    let n = unsafe { libc::recv(fd.as_raw_fd(), reply.as_mut_ptr().cast(), reply.len(), 0) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    generation_of(&reply[..n as usize])
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidData, "no generation in nftables' answer"))
}

/// The generation in the kernel's answer to `NFT_MSG_GETGEN` (None: an error, or another message).
fn generation_of(reply: &[u8]) -> Option<u32> {
    let u16_at = |at: usize| reply.get(at..at + 2).map(|b| u16::from_ne_bytes([b[0], b[1]]));
    let len = u32::from_ne_bytes(reply.get(0..4)?.try_into().ok()?) as usize;
    if u16_at(4)? != (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_NEWGEN || len > reply.len() {
        return None;
    }
    let mut at = GEN_HEADER;
    while at + 4 <= len {
        let (attr_len, kind) = (usize::from(u16_at(at)?), u16_at(at + 2)? & 0x3fff);
        if attr_len < 4 || at + attr_len > len {
            return None;
        }
        if kind == NFTA_GEN_ID && attr_len >= 8 {
            return Some(u32::from_be_bytes(reply[at + 4..at + 8].try_into().ok()?));
        }
        at += (attr_len + 3) & !3;
    }
    None
}

/// The iptables-nft save tools, by the nftables family their tables are in,
/// and the tool as a rule's place names it.
const NFT_COMPAT: [(&str, &str, &str); 2] =
    [("ip", "iptables-nft-save", "iptables-nft"), ("ip6", "ip6tables-nft-save", "ip6tables-nft")];

/// The families of `nft -j list ruleset` output whose rules hold an xtables
/// target (iptables-nft's REDIRECT, DNAT, ...).
pub(crate) fn xt_families(json: &str) -> BTreeSet<String> {
    let Ok(value) = serde_json::from_str::<serde_json::Value>(json) else { return BTreeSet::new() };
    let rules = value["nftables"].as_array().into_iter().flatten().filter_map(|i| i.get("rule"));
    rules
        .filter(|rule| rule["expr"].as_array().into_iter().flatten().any(|e| e["xt"]["type"] == "target"))
        .filter_map(|rule| rule["family"].as_str().map(str::to_owned))
        .collect()
}

/// The legacy iptables tools: the save tool, the family it is named as, and
/// the kernel's list of the namespace's tables of that family.
const LEGACY: [(&str, &str, &str); 2] = [
    ("iptables-legacy-save", "iptables-legacy", "ip_tables_names"),
    ("ip6tables-legacy-save", "ip6tables-legacy", "ip6_tables_names"),
];

/// The namespace's addresses as the rules spell them: the gate's table keeps
/// IPv4 mapped into IPv6 (`::ffff:10.0.0.1`), a rule writes `10.0.0.1`.
fn own_addresses<'a>(table: impl IntoIterator<Item = &'a [u8; 16]>) -> BTreeSet<IpAddr> {
    table.into_iter().map(|a| std::net::Ipv6Addr::from(*a).to_canonical()).collect()
}

/// Reads every NAT statement of this namespace that ends at a local
/// listener; a tool that is not installed contributes nothing.
fn local_nat(local: &BTreeSet<IpAddr>) -> NatLook {
    let mut look = NatLook::default();
    if let Some(json) = run("nft", &["-j", "list", "ruleset"]) {
        look.readable = true;
        // iptables-nft's and ip6tables-nft's targets as they wrote them
        // (nft shows an xtables target without its ports or address).
        for family in xt_families(&json) {
            let Some(&(_, tool, name)) = NFT_COMPAT.iter().find(|(f, _, _)| *f == family) else { continue };
            if installed(tool)
                && let Some(text) = run(tool, &["-t", "nat"])
            {
                look.found.extend(from_iptables_save(&text, name, local));
            }
        }
        look.found.extend(from_nft_json(&json, local));
    }
    for (tool, family, tables) in LEGACY {
        if !installed(tool) {
            continue;
        }
        // The kernel lists the namespace's legacy tables: without a `nat`
        // one there is nothing to read (and no process to start every look).
        if !legacy_table(tables, "nat") {
            look.readable = true;
            continue;
        }
        if let Some(text) = run(tool, &["-t", "nat"]) {
            look.readable = true;
            look.found.extend(from_iptables_save(&text, family, local));
        }
    }
    look
}

/// Whether this namespace has legacy iptables table `table`: listed in
/// `/proc/thread-self/net/{ip,ip6}_tables_names` (absent while the module
/// is not loaded, when no namespace has one).
fn legacy_table(names: &str, table: &str) -> bool {
    std::fs::read_to_string(Path::new("/proc/thread-self/net").join(names)).is_ok_and(|listed| lists(&listed, table))
}

/// Whether the kernel's list of table names (one a line) holds `table`.
fn lists(listed: &str, table: &str) -> bool {
    listed.lines().any(|l| l.trim() == table)
}

/// Whether `program` is on the PATH (looked up once per process).
fn installed(program: &'static str) -> bool {
    static FOUND: std::sync::Mutex<BTreeMap<&'static str, bool>> = std::sync::Mutex::new(BTreeMap::new());
    let mut found = FOUND.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    *found.entry(program).or_insert_with(|| {
        std::env::var_os("PATH").is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(program).is_file()))
    })
}

fn run(program: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(program).args(args).output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

fn is_local(addr: &str, local: &BTreeSet<IpAddr>) -> bool {
    addr.parse::<IpAddr>().is_ok_and(|a| a.is_loopback() || local.contains(&a))
}

/// The statements of `nft -j list ruleset` output.
pub(crate) fn from_nft_json(json: &str, local: &BTreeSet<IpAddr>) -> Vec<LocalNat> {
    let Ok(value) = serde_json::from_str::<serde_json::Value>(json) else { return Vec::new() };
    let Some(items) = value["nftables"].as_array() else { return Vec::new() };
    let mut found = Vec::new();
    for rule in items.iter().filter_map(|i| i.get("rule")) {
        let Some(exprs) = rule["expr"].as_array() else { continue };
        let mut from_ports = Vec::new();
        for e in exprs {
            let m = &e["match"];
            if m["left"]["payload"]["field"] == "dport" && m["op"] == "==" {
                match &m["right"] {
                    serde_json::Value::Number(n) => from_ports.extend(n.as_u64().map(|p| p as u16)),
                    right => from_ports.extend(
                        right["set"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .filter_map(serde_json::Value::as_u64)
                            .map(|p| p as u16),
                    ),
                }
            }
            let to_port = |stmt: &serde_json::Value| stmt["port"].as_u64().map(|p| p as u16);
            let local_target = if let Some(r) = e.get("redirect") {
                Some(to_port(r))
            } else if e["xt"]["type"] == "target" && e["xt"]["name"] == "REDIRECT" {
                // iptables-nft's REDIRECT, kept as the xtables target: nft
                // shows no port (the family's save tool does, read besides).
                Some(None)
            } else if let Some(d) = e.get("dnat") {
                d["addr"].as_str().filter(|a| is_local(a, local)).map(|_| to_port(d))
            } else {
                None
            };
            if let Some(to_port) = local_target {
                let place = format!(
                    "nftables table {} {} chain {}",
                    rule["family"].as_str().unwrap_or("?"),
                    rule["table"].as_str().unwrap_or("?"),
                    rule["chain"].as_str().unwrap_or("?")
                );
                found.push(LocalNat { place, from_ports: from_ports.clone(), to_port });
            }
        }
    }
    found
}

/// The statements of `iptables-save -t nat` output (`-j REDIRECT --to-ports`,
/// `-j DNAT --to-destination ADDR[:PORT]`).
pub(crate) fn from_iptables_save(text: &str, tool: &str, local: &BTreeSet<IpAddr>) -> Vec<LocalNat> {
    let mut found = Vec::new();
    for line in text.lines().filter(|l| l.starts_with("-A ")) {
        let words: Vec<&str> = line.split_whitespace().collect();
        let after = |flag: &str| words.iter().position(|w| *w == flag).and_then(|i| words.get(i + 1)).copied();
        let from_ports: Vec<u16> = after("--dport")
            .or_else(|| after("--dports"))
            .map(|p| p.split(',').filter_map(|p| p.parse().ok()).collect())
            .unwrap_or_default();
        let to_port = match after("-j") {
            Some("REDIRECT") => Some(after("--to-ports").and_then(|p| p.split('-').next()?.parse().ok())),
            Some("DNAT") => after("--to-destination").and_then(|d| {
                let (addr, port) = split_destination(d);
                is_local(addr, local).then(|| port.and_then(|p| p.split('-').next()?.parse().ok()))
            }),
            _ => None,
        };
        if let Some(to_port) = to_port {
            let place = format!("{tool} nat {}", words.get(1).unwrap_or(&"?"));
            found.push(LocalNat { place, from_ports, to_port });
        }
    }
    found
}

/// `ADDR[:PORT]`, `[V6]:PORT` or a bare IPv6 address.
fn split_destination(d: &str) -> (&str, Option<&str>) {
    if let Some(rest) = d.strip_prefix('[') {
        let (addr, tail) = rest.split_once(']').unwrap_or((rest, ""));
        return (addr, tail.strip_prefix(':'));
    }
    match d.split_once(':') {
        Some((addr, port)) if !port.contains(':') => (addr, Some(port)),
        _ => (d, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An `NFT_MSG_NEWGEN` answer as the kernel writes it: the generation,
    /// then the pid and name of the process that made it.
    fn newgen(generation: u32) -> Vec<u8> {
        let mut attrs = Vec::new();
        attrs.extend_from_slice(&8u16.to_ne_bytes());
        attrs.extend_from_slice(&NFTA_GEN_ID.to_ne_bytes());
        attrs.extend_from_slice(&generation.to_be_bytes());
        attrs.extend_from_slice(&8u16.to_ne_bytes());
        attrs.extend_from_slice(&2u16.to_ne_bytes());
        attrs.extend_from_slice(&4242u32.to_be_bytes());
        let mut msg = Vec::new();
        msg.extend_from_slice(&((GEN_HEADER + attrs.len()) as u32).to_ne_bytes());
        msg.extend_from_slice(&((NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_NEWGEN).to_ne_bytes());
        msg.extend_from_slice(&[0; 10]);
        msg.extend_from_slice(&[0, 0, (generation >> 8) as u8, generation as u8]);
        msg.extend_from_slice(&attrs);
        msg
    }

    #[test]
    fn the_generation_is_read_from_nftables_answer_and_nothing_else() {
        assert_eq!(generation_of(&newgen(0x0102_0304)), Some(0x0102_0304));
        // Another attribute first: skipped by its length.
        let mut later = newgen(7);
        let first = later[GEN_HEADER..GEN_HEADER + 8].to_vec();
        later.copy_within(GEN_HEADER + 8..GEN_HEADER + 16, GEN_HEADER);
        later[GEN_HEADER + 8..GEN_HEADER + 16].copy_from_slice(&first);
        assert_eq!(generation_of(&later), Some(7));
        // An error answer, a cut one, one that claims more than it has: none.
        let mut error = newgen(7);
        error[4..6].copy_from_slice(&2u16.to_ne_bytes());
        assert_eq!(generation_of(&error), None);
        assert_eq!(generation_of(&newgen(7)[..GEN_HEADER + 6]), None);
        let mut long = newgen(7);
        long[0..4].copy_from_slice(&400u32.to_ne_bytes());
        assert_eq!(generation_of(&long), None);
        let mut bad_attr = newgen(7);
        bad_attr[GEN_HEADER..GEN_HEADER + 2].copy_from_slice(&2u16.to_ne_bytes());
        assert_eq!(generation_of(&bad_attr), None, "an attribute shorter than its header");
        assert_eq!(generation_of(&[]), None);
    }

    #[test]
    fn a_look_holds_only_while_its_generation_and_addresses_do_and_no_legacy_table_exists() {
        let stamp = |generation: Option<u32>, local: &[&str], legacy_nat: bool| NatStamp {
            generation,
            local: local.iter().map(|a| a.parse().unwrap()).collect(),
            legacy_nat,
        };
        let taken = stamp(Some(5), &["10.0.0.2"], false);
        assert!(taken.still_holds(&stamp(Some(5), &["10.0.0.2"], false)));
        assert!(!taken.still_holds(&stamp(Some(6), &["10.0.0.2"], false)), "the ruleset changed");
        assert!(!taken.still_holds(&stamp(Some(5), &["10.0.0.2", "10.0.0.3"], false)), "a new address");
        assert!(!taken.still_holds(&stamp(Some(5), &["10.0.0.2"], true)), "a legacy nat table appeared");
        let legacy = stamp(Some(5), &["10.0.0.2"], true);
        assert!(!legacy.still_holds(&legacy.clone()), "legacy iptables keeps no generation: read in full");
        let unasked = stamp(None, &["10.0.0.2"], false);
        assert!(!unasked.still_holds(&unasked.clone()), "no generation to compare");
    }

    /// The generation in this (the test's) namespace, as the kernel keeps
    /// it: a change to the ruleset moves it, and reading it changes nothing.
    #[test]
    fn nftables_generation_moves_with_a_change_to_the_ruleset() {
        // SAFETY: geteuid cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            return;
        }
        // In a namespace of its own (this thread's, and nft's, which it starts): the host's ruleset is not touched.
        std::thread::spawn(generation_in_a_new_namespace).join().unwrap();
    }

    fn generation_in_a_new_namespace() {
        // SAFETY: unshare(2) of this thread's network namespace.
        assert_eq!(unsafe { libc::unshare(libc::CLONE_NEWNET) }, 0, "{}", std::io::Error::last_os_error());
        let before = nft_generation().expect("NFT_MSG_GETGEN (root, nf_tables)");
        assert_eq!(nft_generation().unwrap(), before, "asking is no change");
        let nft = |rules: &str| {
            let mut child = Command::new("nft").args(["-f", "-"]).stdin(std::process::Stdio::piped()).spawn().unwrap();
            std::io::Write::write_all(child.stdin.as_mut().unwrap(), rules.as_bytes()).unwrap();
            assert!(child.wait().unwrap().success());
        };
        nft("table inet shedgentest { }\n");
        let after = nft_generation().unwrap();
        nft("delete table inet shedgentest\n");
        assert_ne!(after, before, "a new table is a new generation");
    }

    #[test]
    fn a_legacy_table_is_read_only_where_the_kernel_lists_it() {
        assert!(super::lists("filter\nnat\n", "nat"));
        assert!(!super::lists("filter\nmangle\n", "nat"));
        assert!(!super::lists("", "nat"), "no table at all");
        assert!(!super::lists("natural\n", "nat"), "a whole name, not a prefix");
    }

    const RULESET: &str = r#"{"nftables": [{"metainfo": {"version": "1.0.6"}},
      {"table": {"family": "ip", "name": "nat", "handle": 1}},
      {"rule": {"family": "ip", "table": "nat", "chain": "prerouting", "handle": 3, "expr": [
        {"match": {"op": "==", "left": {"payload": {"protocol": "tcp", "field": "dport"}}, "right": 80}},
        {"redirect": {"port": 8080}}]}},
      {"rule": {"family": "ip", "table": "nat", "chain": "prerouting", "handle": 4, "expr": [
        {"match": {"op": "==", "left": {"payload": {"protocol": "tcp", "field": "dport"}}, "right": 8081}},
        {"dnat": {"addr": "10.244.1.5", "port": 8080}}]}},
      {"rule": {"family": "ip", "table": "nat", "chain": "prerouting", "handle": 6, "expr": [
        {"match": {"op": "==", "left": {"payload": {"protocol": "tcp", "field": "dport"}}, "right": {"set": [443, 8443]}}},
        {"dnat": {"addr": "127.0.0.1"}}]}},
      {"rule": {"family": "ip", "table": "filter", "chain": "input", "handle": 9, "expr": [
        {"match": {"op": "==", "left": {"payload": {"protocol": "tcp", "field": "dport"}}, "right": 8080}},
        {"accept": null}]}}]}"#;

    fn local() -> BTreeSet<IpAddr> {
        ["10.200.0.1".parse().unwrap()].into()
    }

    #[test]
    fn nft_statements_that_end_at_a_local_listener() {
        let found = from_nft_json(RULESET, &local());
        assert_eq!(found.len(), 2, "the DNAT to another host and the filter rule are not local NAT: {found:?}");
        assert_eq!(
            found[0],
            LocalNat {
                place: "nftables table ip nat chain prerouting".into(),
                from_ports: vec![80],
                to_port: Some(8080)
            }
        );
        assert_eq!((found[1].from_ports.clone(), found[1].to_port), (vec![443, 8443], None));
        assert_eq!(found[0].bypasses(&[8080]), Some(8080), "port 80 reaches 8080 unjudged");
        assert_eq!(found[0].bypasses(&[80]), Some(80), "port 80's segments go to another port");
        assert_eq!(found[0].bypasses(&[9090]), None);
        assert_eq!(found[1].bypasses(&[8080]), None, "it rewrites other ports only");
        assert_eq!(
            found[1].bypasses(&[8443]),
            Some(8443),
            "a new destination address: the lookup misses the handshake"
        );
        assert!(found[0].describe().contains("port 80 to local port 8080"), "{}", found[0].describe());
        assert!(from_nft_json("not json", &local()).is_empty());
    }

    /// iptables-nft keeps REDIRECT and DNAT as xtables targets, which nft
    /// shows without ports or address (as `nft -j` printed ip6tables-nft's
    /// and iptables-nft's rules): the REDIRECT of a protected port is still
    /// seen from nft alone, and both families are named for their save tools.
    #[test]
    fn iptables_nft_targets_are_seen_and_their_families_named() {
        let rule = |family: &str, chain: &str, port: u16, target: &str| {
            format!(
                r#"{{"rule": {{"family": "{family}", "table": "nat", "chain": "{chain}", "handle": 2, "expr": [
                {{"match": {{"op": "==", "left": {{"payload": {{"protocol": "tcp", "field": "dport"}}}}, "right": {port}}}}},
                {{"counter": {{"packets": 0, "bytes": 0}}}}, {{"xt": {{"type": "target", "name": "{target}"}}}}]}}}}"#
            )
        };
        let json = format!(
            r#"{{"nftables": [{{"metainfo": {{"json_schema_version": 1}}}}, {}, {}, {}]}}"#,
            rule("ip6", "PREROUTING", 8080, "REDIRECT"),
            rule("ip6", "OUTPUT", 9000, "DNAT"),
            rule("ip", "OUTPUT", 8080, "REDIRECT")
        );
        let found = from_nft_json(&json, &local());
        assert_eq!(found.len(), 2, "the two REDIRECTs, not the DNAT whose address nft does not show: {found:?}");
        assert_eq!(
            found[0],
            LocalNat { place: "nftables table ip6 nat chain PREROUTING".into(), from_ports: vec![8080], to_port: None }
        );
        assert_eq!(found[0].bypasses(&[8080]), Some(8080));
        assert_eq!(found[1].place, "nftables table ip nat chain OUTPUT");
        assert_eq!(xt_families(&json), ["ip".to_owned(), "ip6".to_owned()].into());
        assert!(
            xt_families(&format!(r#"{{"nftables": [{}]}}"#, rule("inet", "x", 1, "x").replace("xt", "zz"))).is_empty()
        );
        // Read by their save tools: the ports and address are there.
        let saved = "*nat\n-A PREROUTING -p tcp -m tcp --dport 8080 -j REDIRECT --to-ports 8081\n\
                     -A OUTPUT -p tcp -m tcp --dport 9000 -j DNAT --to-destination [::1]:8080\nCOMMIT\n";
        let found = from_iptables_save(saved, "ip6tables-nft", &local());
        assert_eq!(found.len(), 2, "{found:?}");
        assert_eq!((found[1].from_ports.clone(), found[1].to_port), (vec![9000], Some(8080)));
        assert_eq!(found[1].bypasses(&[8080]), Some(8080), "port 9000 reaches the listener of 8080 unjudged");
    }

    /// Each form of the namespace's own addresses, read from the table the
    /// gate keeps (IPv4 mapped into IPv6), is what a rule's target is checked
    /// against: a DNAT to the IPv4 address, the IPv6 one, or loopback, and a
    /// redirect with or without a port, all end at a local listener.
    #[test]
    fn a_dnat_to_each_form_of_an_own_address_is_local() {
        let table =
            [shed_common::ipv4_mapped([10, 200, 0, 1]), "fd00:5ed::1".parse::<std::net::Ipv6Addr>().unwrap().octets()];
        let own = own_addresses(&table);
        let dnat = |addr: &str| {
            format!(
                r#"{{"nftables": [{{"rule": {{"family": "inet", "table": "t", "chain": "c", "expr": [
                {{"match": {{"op": "==", "left": {{"payload": {{"protocol": "tcp", "field": "dport"}}}}, "right": 8081}}}},
                {{"dnat": {{"addr": "{addr}", "port": 8080}}}}]}}}}]}}"#
            )
        };
        for addr in ["10.200.0.1", "fd00:5ed::1", "127.0.0.1", "127.0.0.53", "::1"] {
            let found = from_nft_json(&dnat(addr), &own);
            assert_eq!(found.len(), 1, "nft dnat to {addr} ends here");
            assert_eq!(found[0].bypasses(&[8080]), Some(8080), "{addr}");
            let text = format!("-A PREROUTING -p tcp -m tcp --dport 8081 -j DNAT --to-destination {addr}\n");
            let text = if addr.contains(':') { text.replace(addr, &format!("[{addr}]:8080")) } else { text };
            assert_eq!(
                from_iptables_save(&text, "iptables-legacy", &own).len(),
                1,
                "iptables DNAT to {addr} ends here"
            );
        }
        for addr in ["10.200.0.2", "fd00:5ed::2", "::ffff:10.200.0.2"] {
            assert!(from_nft_json(&dnat(addr), &own).is_empty(), "{addr} is another host");
        }
        let redirect = r#"{"nftables": [{"rule": {"family": "ip", "table": "t", "chain": "c", "expr": [
            {"match": {"op": "==", "left": {"payload": {"protocol": "tcp", "field": "dport"}}, "right": 8080}},
            {"redirect": null}]}}]}"#;
        let found = from_nft_json(redirect, &own);
        assert_eq!((found.len(), found[0].to_port), (1, None), "a redirect without a port: {found:?}");
        assert_eq!(found[0].bypasses(&[8080]), Some(8080), "its address changes under the gate");
        let found =
            from_iptables_save("-A PREROUTING -p tcp -m tcp --dport 8080 -j REDIRECT\n", "iptables-legacy", &own);
        assert_eq!((found.len(), found[0].bypasses(&[8080])), (1, Some(8080)), "REDIRECT without --to-ports");
    }

    #[test]
    fn iptables_save_statements() {
        let text = "*nat\n:PREROUTING ACCEPT [0:0]\n\
            -A PREROUTING -p tcp -m tcp --dport 80 -j REDIRECT --to-ports 8080\n\
            -A PREROUTING -d 10.200.0.1/32 -p tcp -m tcp --dport 8443 -j DNAT --to-destination 10.200.0.1:8080\n\
            -A DOCKER ! -i docker0 -p tcp -m tcp --dport 5000 -j DNAT --to-destination 172.17.0.2:5000\n\
            -A OUTPUT -p tcp -j REDIRECT --to-ports 3128\n\
            -A PREROUTING -p tcp -m multiport --dports 81,82 -j DNAT --to-destination [::1]:8080\nCOMMIT\n";
        let found = from_iptables_save(text, "iptables-legacy", &local());
        assert_eq!(found.len(), 4, "{found:?}");
        assert_eq!((found[0].from_ports.clone(), found[0].to_port), (vec![80], Some(8080)));
        assert_eq!((found[1].from_ports.clone(), found[1].to_port), (vec![8443], Some(8080)));
        assert_eq!((found[2].from_ports.clone(), found[2].to_port), (vec![], Some(3128)));
        assert_eq!((found[3].from_ports.clone(), found[3].to_port), (vec![81, 82], Some(8080)));
        assert_eq!(found[2].bypasses(&[8080]), Some(8080), "every port to 3128 takes 8080's segments away");
        assert_eq!(found[2].bypasses(&[3128]), Some(3128), "every other port reaches 3128 unjudged");
        assert_eq!(found[0].place, "iptables-legacy nat PREROUTING");
        assert_eq!(split_destination("fd00::1"), ("fd00::1", None));
    }
}
