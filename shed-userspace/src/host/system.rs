// SPDX-License-Identifier: MIT OR Apache-2.0
//! Facts about the host the gate needs before it changes anything:
//! privileges, mounted filesystems, interfaces, the tracepoint's layout, and
//! the network namespace to work in.
use std::{
    collections::BTreeMap,
    ffi::{CStr, CString},
    fs,
    os::fd::AsRawFd,
    path::Path,
};

use shed_common::sock_state_tp;

use crate::{error::Error, host::paths};

const CAP_NET_ADMIN: u32 = 12;
const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;
const BPF_FS_MAGIC: i64 = 0xcafe_4a11;
const TRACEFS_MAGIC: i64 = 0x7472_6163;

/// What an operation needs from the kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Need {
    /// Reading and writing pinned maps.
    Maps,
    /// Loading and attaching programs (maps, XDP/TC, tracepoints).
    Attach,
    /// The same, in another network namespace (`--netns`: setns needs CAP_SYS_ADMIN).
    AttachNetns,
}

/// Checks that this process can do `need` from where it runs: not inside
/// `ip netns exec` (see [`check_not_in_ip_netns_exec`]), with the effective
/// capabilities it takes.
pub(crate) fn check_privileges(need: Need) -> Result<(), Error> {
    check_not_in_ip_netns_exec()?;
    let status = fs::read_to_string("/proc/self/status").map_err(|e| Error::io("read", "/proc/self/status", e))?;
    let effective = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .unwrap_or(0);
    let missing = missing_capabilities(effective, need);
    if missing.is_empty() { Ok(()) } else { Err(Error::NotPrivileged { missing: missing.join(", ") }) }
}

/// The capabilities `need` requires that `effective` lacks (CAP_SYS_ADMIN stands in for BPF and PERFMON).
pub(crate) fn missing_capabilities(effective: u64, need: Need) -> Vec<&'static str> {
    let has = |cap: u32| effective & (1 << cap) != 0;
    let admin = has(CAP_SYS_ADMIN);
    let mut missing = Vec::new();
    if !(has(CAP_BPF) || admin) {
        missing.push("CAP_BPF");
    }
    if need == Need::AttachNetns && !admin {
        missing.push("CAP_SYS_ADMIN (for --netns)");
    }
    if matches!(need, Need::Attach | Need::AttachNetns) {
        if !has(CAP_NET_ADMIN) {
            missing.push("CAP_NET_ADMIN");
        }
        if !(has(CAP_PERFMON) || admin) {
            missing.push("CAP_PERFMON");
        }
    }
    missing
}

/// `ip netns exec NS shedctl ...` runs shedctl in the namespace with a /sys of
/// its own (a new mount namespace), where the host's bpffs and the gate's pins
/// are hidden: a gate attached there is invisible to shedctl on the host, and
/// mounting bpffs and tracefs there only hides the problem. Refused, pointing
/// to `--netns`, when the network namespace has a name in /run/netns and both
/// it and the mount namespace differ from those of a process outside: the
/// parent (`ip netns exec NS shedctl`) or init (a shell started by `ip netns
/// exec`). Where neither can be read, nothing is refused.
pub(crate) fn check_not_in_ip_netns_exec() -> Result<(), Error> {
    use std::os::unix::fs::MetadataExt as _;
    let id = |path: &Path| fs::metadata(path).ok().map(|m| (m.dev(), m.ino()));
    let ns = |pid: &str, kind: &str| id(&Path::new("/proc").join(pid).join("ns").join(kind));
    let (Some(net), Some(mnt)) = (ns("self", "net"), ns("self", "mnt")) else { return Ok(()) };
    let parent = std::os::unix::process::parent_id().to_string();
    let outside = [parent.as_str(), "1"]
        .iter()
        .any(|pid| matches!((ns(pid, "net"), ns(pid, "mnt")), (Some(n), Some(m)) if n != net && m != mnt));
    if !outside {
        return Ok(());
    }
    let named = fs::read_dir(paths::NETNS_DIR)
        .into_iter()
        .flatten()
        .flatten()
        .find(|e| id(&e.path()) == Some(net))
        .map(|e| e.file_name().to_string_lossy().into_owned());
    match named {
        Some(name) => Err(Error::InsideIpNetnsExec { name }),
        None => Ok(()),
    }
}

fn fs_magic(path: &str) -> Option<i64> {
    let c = CString::new(path).ok()?;
    // SAFETY: statfs is plain integers, for which all zeroes is a valid value.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: valid C string and out-pointer.
    (unsafe { libc::statfs(c.as_ptr(), &raw mut st) } == 0).then_some(st.f_type as i64)
}

pub(crate) fn check_bpffs() -> Result<(), Error> {
    if fs_magic(paths::BPFFS) == Some(BPF_FS_MAGIC) { Ok(()) } else { Err(Error::BpffsMissing { path: paths::BPFFS }) }
}

pub(crate) fn check_tracefs() -> Result<(), Error> {
    if fs_magic(paths::TRACEFS) == Some(TRACEFS_MAGIC) {
        Ok(())
    } else {
        Err(Error::TracefsMissing { path: paths::TRACEFS })
    }
}

/// The oldest kernel shed runs on, and what each older one lacks (newest
/// first): the first feature a kernel below its version misses is named.
pub(crate) const KERNEL_FEATURES: &[((u32, u32), &str)] = &[
    ((6, 6), "the sock:sk_data_ready tracepoint (6.6), which marks each request's arrival"),
    ((6, 3), "the sock:sock_recv_length and sock_send_length tracepoints (6.3), which time each request"),
    ((6, 0), "bpf_tcp_raw_check_syncookie (6.0), which proves a SYN cookie's handshake"),
    ((5, 18), "bpf_xdp_get_buff_len (5.18)"),
];

/// Whether kernel `release` (`uname -r`: "6.18.0-1-amd64") is new enough;
/// else why not, naming the first missing feature.
pub(crate) fn check_kernel_release(release: &str) -> Result<(), Error> {
    let mut numbers = release.split(|c: char| !c.is_ascii_digit()).filter(|p| !p.is_empty()).map(str::parse::<u32>);
    let (Some(Ok(major)), Some(Ok(minor))) = (numbers.next(), numbers.next()) else {
        // A release string we cannot read: the feature checks that follow decide.
        return Ok(());
    };
    match KERNEL_FEATURES.iter().rev().find(|&&(version, _)| (major, minor) < version) {
        Some(&(_, missing)) => {
            // The newest feature's version is the minimum.
            let ((major, minor), _) = KERNEL_FEATURES[0];
            Err(Error::KernelTooOld { release: release.to_owned(), minimum: format!("{major}.{minor}"), missing })
        }
        None => Ok(()),
    }
}

/// [`check_kernel_release`] for the running kernel.
pub(crate) fn check_kernel() -> Result<(), Error> {
    let release = fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    check_kernel_release(release.trim())
}

/// Checks that the socket tracepoints have the field offsets compiled into the kernel programs.
pub(crate) fn check_tracepoint_layouts() -> Result<(), Error> {
    let read = |event: &str| {
        let path = Path::new(paths::TRACEFS).join("events/sock").join(event).join("format");
        fs::read_to_string(&path).map_err(|e| Error::io("read tracepoint format", path, e))
    };
    check_layout(&read("inet_sock_set_state")?, "sock:inet_sock_set_state", &SOCK_STATE_FIELDS)?;
    // The per-request events are raw tracepoints (TP_PROTO arguments, no record
    // layout); they only need to exist.
    for (_, event) in shed_common::program::RAW_TRACEPOINTS {
        read(event)?;
    }
    Ok(())
}
const SOCK_STATE_FIELDS: [(&str, usize); 8] = [
    ("skaddr", sock_state_tp::SKADDR),
    ("oldstate", sock_state_tp::OLDSTATE),
    ("newstate", sock_state_tp::NEWSTATE),
    ("sport", sock_state_tp::SPORT),
    ("dport", sock_state_tp::DPORT),
    ("protocol", sock_state_tp::PROTOCOL),
    ("saddr_v6", sock_state_tp::SADDR_V6),
    ("daddr_v6", sock_state_tp::DADDR_V6),
];

/// Compares a tracepoint `format` text with the compiled offsets.
pub(crate) fn check_layout(
    format: &str,
    tracepoint: &'static str,
    expected: &[(&'static str, usize)],
) -> Result<(), Error> {
    for &(field, offset) in expected {
        let found = field_offset(format, field);
        if found != Some(offset) {
            return Err(Error::TracepointLayout {
                tracepoint,
                field,
                expected: offset,
                found: found.map_or_else(|| "no such field".to_owned(), |o| o.to_string()),
            });
        }
    }
    Ok(())
}

/// Offset of `field` in a tracepoint format ("field:__u16 sport;\toffset:24;...").
fn field_offset(format: &str, field: &str) -> Option<usize> {
    format.lines().find_map(|line| {
        let decl = line.trim().strip_prefix("field:")?;
        let (decl, rest) = decl.split_once(';')?;
        let name = decl.rsplit([' ', '*']).next()?;
        let name = name.split('[').next()?;
        if name != field {
            return None;
        }
        rest.trim().strip_prefix("offset:")?.split(';').next()?.parse().ok()
    })
}

/// Interfaces of the current network namespace.
pub fn interfaces() -> Vec<String> {
    interfaces_indexed().into_iter().map(|(name, _)| name).collect()
}

/// The namespace's interfaces with their indices (an interface deleted and
/// created again under its name gets a new index).
pub(crate) fn interfaces_indexed() -> Vec<(String, u32)> {
    let mut names = Vec::new();
    // SAFETY: if_nameindex returns an array terminated by a zero entry, freed below.
    unsafe {
        let list = libc::if_nameindex();
        if list.is_null() {
            return names;
        }
        let mut entry = list;
        while (*entry).if_index != 0 && !(*entry).if_name.is_null() {
            names.push((CStr::from_ptr((*entry).if_name).to_string_lossy().into_owned(), (*entry).if_index));
            entry = entry.add(1);
        }
        libc::if_freenameindex(list);
    }
    names
}

/// Fails with a clear error for an interface that does not exist here, or
/// whose frames do not start with an Ethernet header (the parser would not
/// find the SYNs in them: they would pass unjudged).
pub(crate) fn check_interface(name: &str) -> Result<(), Error> {
    let c = CString::new(name).map_err(|_| Error::UnknownInterface { name: name.to_owned() })?;
    // SAFETY: valid C string.
    if unsafe { libc::if_nametoindex(c.as_ptr()) } == 0 {
        return Err(Error::UnknownInterface { name: name.to_owned() });
    }
    match link_type(name) {
        Some(ARPHRD_ETHER | ARPHRD_LOOPBACK) | None => Ok(()),
        Some(link_type) => Err(Error::NotEthernet { name: name.to_owned(), link_type }),
    }
}

const ARPHRD_ETHER: u32 = 1;
const ARPHRD_LOOPBACK: u32 = 772;

/// The interface's ARPHRD link type (`None` if it cannot be read). Asked of
/// the kernel (SIOCGIFHWADDR) rather than sysfs: /sys shows the namespace it
/// was mounted in, not the one `--netns` entered.
pub(crate) fn link_type(name: &str) -> Option<u32> {
    const SIOCGIFHWADDR: libc::c_ulong = 0x8927;
    #[repr(C)]
    struct IfReq {
        name: [u8; libc::IFNAMSIZ],
        hwaddr: libc::sockaddr,
        _pad: [u8; 8],
    }
    if name.len() >= libc::IFNAMSIZ {
        return None;
    }
    // SAFETY: a plain datagram socket, closed below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return None;
    }
    // SAFETY: all-zero is a valid ifreq.
    let mut req: IfReq = unsafe { std::mem::zeroed() };
    req.name[..name.len()].copy_from_slice(name.as_bytes());
    // SAFETY: SIOCGIFHWADDR fills the ifreq we own; the fd is ours.
    let r = unsafe { libc::ioctl(fd, SIOCGIFHWADDR, &mut req) };
    // SAFETY: our fd.
    unsafe { libc::close(fd) };
    (r == 0).then_some(u32::from(req.hwaddr.sa_family))
}

/// The namespace's own addresses, as the gate keys them (IPv4-mapped for IPv4):
/// every interface address, and the IPv4 broadcast addresses.
pub(crate) fn local_addresses() -> Result<BTreeMap<[u8; 16], u32>, Error> {
    use shed_common::local_addr::{BROADCAST, UNICAST};
    let mut out = BTreeMap::new();
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: valid out-pointer; the list is freed below.
    if unsafe { libc::getifaddrs(&raw mut list) } != 0 {
        return Err(Error::io("list addresses", "getifaddrs", std::io::Error::last_os_error()));
    }
    let mut entry = list;
    // SAFETY: walking the list getifaddrs returned; sockaddrs are read by their family.
    unsafe {
        while !entry.is_null() {
            let ifa = &*entry;
            entry = ifa.ifa_next;
            let Some(addr) = sockaddr_bytes(ifa.ifa_addr) else { continue };
            out.insert(addr, UNICAST);
            if ifa.ifa_flags & libc::IFF_BROADCAST as u32 != 0
                && let Some(broadcast) = sockaddr_bytes(ifa.ifa_ifu)
                && broadcast != addr
            {
                out.entry(broadcast).or_insert(BROADCAST);
            }
        }
        libc::freeifaddrs(list);
    }
    // The limited broadcast is nobody's client either.
    out.entry(shed_common::ipv4_mapped([255; 4])).or_insert(BROADCAST);
    Ok(out)
}

/// An IPv4 (mapped) or IPv6 address out of a sockaddr, if it is one.
///
/// # Safety
/// `sa` is null or points to a sockaddr of the size its family implies.
unsafe fn sockaddr_bytes(sa: *const libc::sockaddr) -> Option<[u8; 16]> {
    if sa.is_null() {
        return None;
    }
    // SAFETY: the caller's contract; the family says which struct it is.
    unsafe {
        match i32::from((*sa).sa_family) {
            // Read unaligned: a sockaddr promises only 2-byte alignment.
            libc::AF_INET => {
                let v4 = sa.cast::<libc::sockaddr_in>().read_unaligned();
                Some(shed_common::ipv4_mapped(v4.sin_addr.s_addr.to_ne_bytes()))
            }
            libc::AF_INET6 => Some(sa.cast::<libc::sockaddr_in6>().read_unaligned().sin6_addr.s6_addr),
            _ => None,
        }
    }
}

/// Notifications of the calling thread's namespace's links and addresses
/// (rtnetlink multicast groups), so a new interface or address is seen within
/// a control tick instead of at the next once-a-second look.
pub(crate) struct LinkWatch {
    fd: std::os::fd::OwnedFd,
}

impl LinkWatch {
    /// Subscribes; `None` if the kernel refuses (the once-a-second look remains).
    pub(crate) fn open() -> Option<Self> {
        use std::os::fd::FromRawFd as _;
        const RTMGRP_LINK: u32 = 0x1;
        const RTMGRP_IPV4_IFADDR: u32 = 0x10;
        const RTMGRP_IPV6_IFADDR: u32 = 0x100;
        // SAFETY: a plain socket call; the fd is owned below.
        let fd = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
                libc::NETLINK_ROUTE,
            )
        };
        if fd < 0 {
            return None;
        }
        // SAFETY: a fresh fd we own.
        let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
        // SAFETY: a zeroed sockaddr_nl is valid; the fields are set below.
        let mut addr: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        addr.nl_family = libc::AF_NETLINK as u16;
        addr.nl_groups = RTMGRP_LINK | RTMGRP_IPV4_IFADDR | RTMGRP_IPV6_IFADDR;
        // SAFETY: binding our socket to a valid sockaddr_nl.
        let bound = unsafe {
            libc::bind(
                std::os::fd::AsRawFd::as_raw_fd(&fd),
                (&raw const addr).cast(),
                std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
            )
        };
        (bound == 0).then_some(Self { fd })
    }

    /// Whether anything changed since the last call (drains what is queued;
    /// an overflowed queue counts as a change).
    pub(crate) fn changed(&self) -> bool {
        let mut buf = [0u8; 8192];
        let mut any = false;
        loop {
            // SAFETY: reading into our buffer from our non-blocking socket.
            let n = unsafe {
                libc::recv(
                    std::os::fd::AsRawFd::as_raw_fd(&self.fd),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    libc::MSG_DONTWAIT,
                )
            };
            if n > 0 {
                any = true;
                continue;
            }
            if n < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ENOBUFS) {
                any = true;
                continue;
            }
            return any;
        }
    }
}

/// `net.ipv4.tcp_fastopen` of the calling thread's namespace, if it lets
/// servers accept TCP Fast Open (bit 0x2), else `None` (also when unreadable).
pub(crate) fn fast_open_for_servers() -> Option<u32> {
    let text = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_fastopen").ok()?;
    fast_open_server_bit(&text)
}

fn fast_open_server_bit(text: &str) -> Option<u32> {
    let mode: u32 = text.trim().parse().ok()?;
    (mode & FAST_OPEN_SERVER != 0).then_some(mode)
}

/// `net.ipv4.tcp_fastopen`'s bit that lets servers accept TCP Fast Open.
const FAST_OPEN_SERVER: u32 = 0x2;
const FAST_OPEN_SYSCTL: &str = "/proc/sys/net/ipv4/tcp_fastopen";

/// Servers' TCP Fast Open turned off in one namespace while a gate judges
/// it; put back as it was when dropped (in the same namespace: the gate's
/// thread drops it on its way out).
#[derive(Debug)]
pub(crate) struct FastOpenOff {
    was: u32,
}

impl FastOpenOff {
    /// Clears the server bit of `net.ipv4.tcp_fastopen` in the calling
    /// thread's namespace, if set (None: it was not).
    pub(crate) fn take() -> Result<Option<Self>, Error> {
        let Some(was) = fast_open_for_servers() else { return Ok(None) };
        let off = was & !FAST_OPEN_SERVER;
        std::fs::write(FAST_OPEN_SYSCTL, off.to_string()).map_err(|source| Error::FastOpen {
            mode: was,
            off,
            source,
        })?;
        Ok(Some(Self { was }))
    }

    /// The value it had, and has now.
    pub(crate) fn values(&self) -> (u32, u32) {
        (self.was, self.was & !FAST_OPEN_SERVER)
    }
}

impl Drop for FastOpenOff {
    fn drop(&mut self) {
        // Only if nobody changed it meanwhile: an operator's own setting wins.
        let now = std::fs::read_to_string(FAST_OPEN_SYSCTL).ok().and_then(|t| t.trim().parse::<u32>().ok());
        if now == Some(self.was & !FAST_OPEN_SERVER)
            && let Err(e) = std::fs::write(FAST_OPEN_SYSCTL, self.was.to_string())
        {
            tracing::warn!(error = %e, tcp_fastopen = self.was, "could not put net.ipv4.tcp_fastopen back");
        }
    }
}

/// The kernel driver behind an interface ("veth", "virtio_net", ...), from ETHTOOL_GDRVINFO.
pub(crate) fn driver(iface: &str) -> Option<String> {
    const SIOCETHTOOL: libc::c_ulong = 0x8946;
    const ETHTOOL_GDRVINFO: u32 = 3;
    #[repr(C)]
    struct DrvInfo {
        cmd: u32,
        driver: [u8; 32],
        rest: [u8; 160],
    }
    #[repr(C)]
    struct IfReq {
        name: [u8; 16],
        data: *mut DrvInfo,
        _pad: [u8; 16],
    }
    let mut info = DrvInfo { cmd: ETHTOOL_GDRVINFO, driver: [0; 32], rest: [0; 160] };
    let mut req = IfReq { name: [0; 16], data: &raw mut info, _pad: [0; 16] };
    let bytes = iface.as_bytes();
    if bytes.len() >= req.name.len() {
        return None;
    }
    req.name[..bytes.len()].copy_from_slice(bytes);
    // SAFETY: a datagram socket for the ioctl, closed below; req/info outlive the call.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return None;
        }
        let rc = libc::ioctl(fd, SIOCETHTOOL, &mut req);
        libc::close(fd);
        if rc != 0 {
            return None;
        }
    }
    let end = info.driver.iter().position(|&b| b == 0).unwrap_or(info.driver.len());
    Some(String::from_utf8_lossy(&info.driver[..end]).into_owned())
}

/// The namespace file of an `ip netns` name, or the path itself.
pub(crate) fn netns_path(name_or_path: &str) -> std::path::PathBuf {
    if name_or_path.contains('/') {
        Path::new(name_or_path).to_path_buf()
    } else {
        Path::new(paths::NETNS_DIR).join(name_or_path)
    }
}

/// Moves this thread into a network namespace, by `ip netns` name or by path
/// (threads it starts later inherit it).
pub(crate) fn enter_netns(name_or_path: &str) -> Result<(), Error> {
    let path = netns_path(name_or_path);
    let file = fs::File::open(&path).map_err(|e| Error::io("open network namespace", &path, e))?;
    // SAFETY: a valid namespace fd.
    if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(Error::io("enter network namespace", &path, std::io::Error::last_os_error()));
    }
    Ok(())
}

/// The namespace filter for the current thread's network namespace, or a
/// disabled one (with the reason) when the kernel's BTF lacks the fields.
pub(crate) fn netns_filter() -> Result<shed_common::NetnsFilter, String> {
    use std::os::unix::fs::MetadataExt as _;
    let inum =
        fs::metadata("/proc/thread-self/ns/net").map_err(|e| format!("stat /proc/thread-self/ns/net: {e}"))?.ino();
    // The kernel's, the same for every namespace: read once (a parse of its
    // BTF is a tenth of a second, and a node agent sets up a gate per pod).
    type Offsets = (u32, u32, u32, u32);
    static OFFSETS: std::sync::OnceLock<Result<Offsets, String>> = std::sync::OnceLock::new();
    let (skc_net, net_inum, skb_dev, dev_net) = OFFSETS
        .get_or_init(|| {
            let btf = crate::host::btf::Btf::from_sys_fs().ok_or("no readable BTF at /sys/kernel/btf/vmlinux")?;
            let skc_net = btf.offset_of("sock_common", &["skc_net"]).ok_or("BTF has no sock_common.skc_net")?;
            let net_inum = btf.offset_of("net", &["ns", "inum"]).ok_or("BTF has no net.ns.inum")?;
            // Only a shared object needs these (0: it cannot start, see kernel::dispatch).
            let skb_dev = btf.offset_of("sk_buff", &["dev"]).unwrap_or(0);
            let dev_net = btf.offset_of("net_device", &["nd_net", "net"]).unwrap_or(0);
            Ok((skc_net, net_inum, skb_dev, dev_net))
        })
        .clone()?;
    Ok(shed_common::NetnsFilter {
        enabled: 1,
        inum: u32::try_from(inum).map_err(|_| format!("namespace inode {inum} does not fit 32 bits"))?,
        skc_net_offset: skc_net,
        net_inum_offset: net_inum,
        skb_dev_offset: skb_dev,
        dev_net_offset: dev_net,
        left_until_ns: 0,
    })
}

/// Where `struct sock` keeps what `sock:inet_sock_set_state`'s record copies,
/// from the running kernel's BTF: all of it, or the reason it is not there.
pub(crate) fn sock_layout() -> Result<shed_common::SockLayout, String> {
    let btf = crate::host::btf::Btf::from_sys_fs().ok_or("no readable BTF at /sys/kernel/btf/vmlinux")?;
    sock_layout_in(&btf)
}

fn sock_layout_in(btf: &crate::host::btf::Btf) -> Result<shed_common::SockLayout, String> {
    let common = |field: &str| btf.offset_of("sock_common", &[field]).ok_or(format!("BTF has no sock_common.{field}"));
    let layout = shed_common::SockLayout {
        family: common("skc_family")?,
        protocol: btf.offset_of("sock", &["sk_protocol"]).ok_or("BTF has no sock.sk_protocol")?,
        local_port: common("skc_num")?,
        remote_port: common("skc_dport")?,
        local_v4: common("skc_rcv_saddr")?,
        remote_v4: common("skc_daddr")?,
        local_v6: common("skc_v6_rcv_saddr")?,
        remote_v6: common("skc_v6_daddr")?,
    };
    // `sock_common` is `struct sock`'s first member: its offsets are the socket's.
    if btf.offset_of("sock", &["__sk_common"]) != Some(0) {
        return Err("BTF puts sock.__sk_common away from the socket's start".into());
    }
    if !layout.known() {
        return Err("BTF puts sock.sk_protocol at the socket's start".into());
    }
    Ok(layout)
}

/// What a wait on the terminal's input saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TerminalInput {
    /// Keys to read.
    Ready,
    /// Nothing before the wait ran out.
    Quiet,
    /// The terminal hung up: nothing will ever come.
    HungUp,
}

/// The terminal a full-screen view reads its keys from (stdin when it is
/// one, else `/dev/tty`, as crossterm picks), watched for its hang-up. A
/// process whose terminal hangs up is sent SIGHUP only when it leads the
/// session or the leader exits: under a shell that ignores SIGHUP (nohup's,
/// inherited) neither happens, and crossterm's event poll spins on the
/// hung-up terminal, which reads as ready and empty at once.
pub struct TerminalWatch {
    opened: Option<std::fs::File>,
}

impl TerminalWatch {
    pub fn open() -> std::io::Result<Self> {
        // SAFETY: isatty on a descriptor number.
        if unsafe { libc::isatty(libc::STDIN_FILENO) } == 1 {
            return Ok(Self { opened: None });
        }
        Ok(Self { opened: Some(std::fs::File::open("/dev/tty")?) })
    }

    /// Waits up to `wait` for input or the hang-up.
    pub fn wait(&self, wait: std::time::Duration) -> std::io::Result<TerminalInput> {
        let fd = self.opened.as_ref().map_or(libc::STDIN_FILENO, AsRawFd::as_raw_fd);
        let mut watched = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
        let ms = i32::try_from(wait.as_millis()).unwrap_or(i32::MAX);
        // SAFETY: one valid pollfd for the call's length.
        match unsafe { libc::poll(&raw mut watched, 1, ms) } {
            -1 if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted => Ok(TerminalInput::Quiet),
            -1 => Err(std::io::Error::last_os_error()),
            0 => Ok(TerminalInput::Quiet),
            _ if watched.revents & (libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0 => Ok(TerminalInput::HungUp),
            _ => Ok(TerminalInput::Ready),
        }
    }
}

/// CLOCK_MONOTONIC in milliseconds: the daemon's clock for pending reservations.
/// The kernel's monotonic clock in ns (what `bpf_ktime_get_ns` reads).
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: valid out-pointer; CLOCK_MONOTONIC cannot fail.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &raw mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_kernel_older_than_the_minimum_is_refused_naming_what_it_lacks() {
        use super::check_kernel_release as check;
        for ok in ["6.6.0", "6.18.0-1-amd64", "7.0", "6.12.9+bpo-amd64", "weird"] {
            assert!(check(ok).is_ok(), "{ok}");
        }
        for (old, lacks) in [
            ("6.5.13", "sk_data_ready"),
            ("6.1.0-28-amd64", "sock_recv_length"),
            ("5.19.2", "bpf_tcp_raw_check_syncookie"),
            ("5.10.0-33-amd64", "bpf_xdp_get_buff_len"),
        ] {
            let e = check(old).unwrap_err().to_string();
            assert!(e.contains(old) && e.contains("older than 6.6") && e.contains(lacks), "{old}: {e}");
        }
    }

    #[test]
    fn fast_open_for_servers_is_the_0x2_bit() {
        assert_eq!(super::fast_open_server_bit("1\n"), None, "the default: clients only");
        assert_eq!(super::fast_open_server_bit("3\n"), Some(3));
        assert_eq!(super::fast_open_server_bit("0x2"), None, "unreadable: no warning");
        assert_eq!(super::fast_open_server_bit("1026"), Some(1026));
    }

    use super::*;

    const FORMAT: &str = "name: inet_sock_set_state
ID: 2287
format:
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;
\tfield:const void * skaddr;\toffset:8;\tsize:8;\tsigned:0;
\tfield:int oldstate;\toffset:16;\tsize:4;\tsigned:1;
\tfield:int newstate;\toffset:20;\tsize:4;\tsigned:1;
\tfield:__u16 sport;\toffset:24;\tsize:2;\tsigned:0;
\tfield:__u16 dport;\toffset:26;\tsize:2;\tsigned:0;
\tfield:__u16 family;\toffset:28;\tsize:2;\tsigned:0;
\tfield:__u16 protocol;\toffset:30;\tsize:2;\tsigned:0;
\tfield:__u8 saddr[4];\toffset:32;\tsize:4;\tsigned:0;
\tfield:__u8 daddr[4];\toffset:36;\tsize:4;\tsigned:0;
\tfield:__u8 saddr_v6[16];\toffset:40;\tsize:16;\tsigned:0;
\tfield:__u8 daddr_v6[16];\toffset:56;\tsize:16;\tsigned:0;
";

    #[test]
    fn layout_matches_known_format() {
        check_layout(FORMAT, "sock:inet_sock_set_state", &SOCK_STATE_FIELDS).expect("6.x layout accepted");
    }

    #[test]
    fn layout_mismatch_is_named() {
        let moved = FORMAT.replace("sport;\toffset:24", "sport;\toffset:28");
        let err = check_layout(&moved, "sock:inet_sock_set_state", &SOCK_STATE_FIELDS).unwrap_err().to_string();
        assert!(err.contains("sport") && err.contains("24") && err.contains("28"), "{err}");
        let missing = FORMAT.replace("daddr_v6[16]", "other[16]");
        assert!(
            check_layout(&missing, "sock:inet_sock_set_state", &SOCK_STATE_FIELDS)
                .unwrap_err()
                .to_string()
                .contains("no such field")
        );
    }

    #[test]
    fn capabilities() {
        let all = (1u64 << CAP_BPF) | (1 << CAP_NET_ADMIN) | (1 << CAP_PERFMON);
        assert!(missing_capabilities(all, Need::Attach).is_empty());
        assert!(missing_capabilities((1 << CAP_SYS_ADMIN) | (1 << CAP_NET_ADMIN), Need::Attach).is_empty());
        assert_eq!(missing_capabilities(0, Need::Maps), ["CAP_BPF"]);
        assert_eq!(missing_capabilities(0, Need::Attach), ["CAP_BPF", "CAP_NET_ADMIN", "CAP_PERFMON"]);
    }

    /// The raw accounting program reads these fields where the record's
    /// `TP_fast_assign` does; include/net/sock.h fixes how they sit together.
    #[test]
    fn the_sockets_layout_is_found_on_this_kernel() {
        let layout = super::sock_layout().expect("this kernel has BTF");
        assert!(layout.known());
        assert_eq!(layout.remote_v4, 0, "skc_daddr opens sock_common (skc_addrpair)");
        assert_eq!(layout.local_v4, 4, "skc_rcv_saddr follows it");
        assert_eq!(layout.local_port, layout.remote_port + 2, "skc_num follows skc_dport (skc_portpair)");
        assert_eq!(layout.family, layout.local_port + 2, "skc_family follows skc_num");
        assert!(layout.remote_v6 > layout.family && layout.local_v6 == layout.remote_v6 + 16, "{layout:?}");
        assert!(
            layout.protocol > layout.local_v6 && layout.protocol < 1024,
            "sk_protocol past sock_common: {layout:?}"
        );
    }
}

/// The daemon's memory cgroup as the kernel accounts it: what it holds
/// (bytes; the kernel charges BPF maps to the cgroup of the process that
/// creates them, so every gate counts) and its limit (None: unlimited).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CgroupMemory {
    pub used: u64,
    pub limit: Option<u64>,
}

/// [`CgroupMemory`] of this process (cgroup v2, else v1's memory
/// controller); None where neither can be read.
pub(crate) fn cgroup_memory() -> Option<CgroupMemory> {
    let own = fs::read_to_string("/proc/self/cgroup").ok()?;
    cgroup_memory_in(&own, std::path::Path::new("/sys/fs/cgroup"))
}

/// Reads the memory cgroup that `proc_self_cgroup` (its `/proc/self/cgroup`) names under `root`.
fn cgroup_memory_in(proc_self_cgroup: &str, root: &std::path::Path) -> Option<CgroupMemory> {
    let read = |path: std::path::PathBuf| fs::read_to_string(path).ok().map(|s| s.trim().to_owned());
    let number = |s: String| s.parse::<u64>().ok();
    // v1: `4:memory:/path`, its files under root/memory; a limit this large is v1's "none".
    if let Some(path) = proc_self_cgroup.lines().find_map(|l| {
        let mut f = l.splitn(3, ':');
        let (_, controllers, path) = (f.next()?, f.next()?, f.next()?);
        controllers.split(',').any(|c| c == "memory").then_some(path)
    }) {
        // In a container without a cgroup namespace the path is the host's,
        // and the container's own cgroup is what is mounted: then it is the root.
        let dir = [root.join("memory").join(path.trim_start_matches('/')), root.join("memory")]
            .into_iter()
            .find(|d| d.join("memory.usage_in_bytes").exists())?;
        let used = number(read(dir.join("memory.usage_in_bytes"))?)?;
        let limit = number(read(dir.join("memory.limit_in_bytes"))?).filter(|&l| l < 1 << 60);
        return Some(CgroupMemory { used, limit });
    }
    // v2: `0::/path`, memory.current and memory.max (`max`: none).
    let path = proc_self_cgroup.lines().find_map(|l| l.strip_prefix("0::"))?;
    let dir = [root.join(path.trim_start_matches('/')), root.to_owned()]
        .into_iter()
        .find(|d| d.join("memory.current").exists())?;
    let used = number(read(dir.join("memory.current"))?)?;
    let limit = read(dir.join("memory.max")).and_then(number);
    Some(CgroupMemory { used, limit })
}

#[cfg(test)]
mod cgroup_tests {
    use super::*;

    #[test]
    fn v1_and_v2_memory_cgroups_are_read_and_unlimited_is_none() {
        let root = tempfile::tempdir().unwrap();
        let v1 = root.path().join("memory/agent");
        fs::create_dir_all(&v1).unwrap();
        fs::write(v1.join("memory.usage_in_bytes"), "104857600\n").unwrap();
        fs::write(v1.join("memory.limit_in_bytes"), "268435456\n").unwrap();
        let v1_cgroup = "9:name=systemd:/\n4:memory:/agent\n0::/\n";
        assert_eq!(
            cgroup_memory_in(v1_cgroup, root.path()),
            Some(CgroupMemory { used: 100 << 20, limit: Some(256 << 20) })
        );
        fs::write(v1.join("memory.limit_in_bytes"), "9223372036854771712\n").unwrap();
        assert_eq!(cgroup_memory_in(v1_cgroup, root.path()).unwrap().limit, None, "v1's no limit");
        let v2 = root.path().join("kubepods/pod1");
        fs::create_dir_all(&v2).unwrap();
        fs::write(v2.join("memory.current"), "52428800\n").unwrap();
        fs::write(v2.join("memory.max"), "268435456\n").unwrap();
        assert_eq!(
            cgroup_memory_in("0::/kubepods/pod1\n", root.path()),
            Some(CgroupMemory { used: 50 << 20, limit: Some(256 << 20) })
        );
        fs::write(v2.join("memory.max"), "max\n").unwrap();
        assert_eq!(cgroup_memory_in("0::/kubepods/pod1\n", root.path()).unwrap().limit, None);
        assert_eq!(cgroup_memory_in("0::/nowhere\n", root.path()), None, "unreadable: none");
        // A v1 container without a cgroup namespace: /proc names the host's
        // path, and its own cgroup is mounted at the controller's root.
        let mounted = tempfile::tempdir().unwrap();
        fs::create_dir_all(mounted.path().join("memory")).unwrap();
        fs::write(mounted.path().join("memory/memory.usage_in_bytes"), "1048576\n").unwrap();
        fs::write(mounted.path().join("memory/memory.limit_in_bytes"), "1073741824\n").unwrap();
        assert_eq!(
            cgroup_memory_in("4:memory:/kubepods/burstable/pod9/abc\n", mounted.path()),
            Some(CgroupMemory { used: 1 << 20, limit: Some(1 << 30) })
        );
    }
}

/// Hands the heap's free pages back to the system. Loading a gate parses the
/// kernel's BTF and the object (tens of MiB, freed once loaded), and glibc
/// keeps freed memory for reuse: without this each pod's gate left the agent
/// holding megabytes it no longer used.
pub(crate) fn release_freed_memory() {
    // SAFETY: malloc_trim only walks the allocator's own free lists.
    unsafe { libc::malloc_trim(0) };
}

/// Most heaps glibc's malloc keeps for the daemon's threads. By default it
/// makes one per thread up to eight per core; a gate's thread loads its
/// object in its own, and each such heap kept about 10 MiB of the load's
/// freed memory for the thread's life (B10: 165 MiB at 10 pods, 64 MiB with
/// two heaps). The daemon allocates little once running, so two are ample.
const MALLOC_ARENAS: i32 = 2;

/// Caps glibc's malloc heaps at [`MALLOC_ARENAS`]: called first, before any thread starts.
pub fn limit_malloc_arenas() {
    // SAFETY: mallopt only sets an allocator parameter.
    unsafe { libc::mallopt(libc::M_ARENA_MAX, MALLOC_ARENAS) };
}
