// SPDX-License-Identifier: MIT OR Apache-2.0
//! A node agent's shared object outliving the agent, for its successor.
//!
//! On SIGTERM (a restart, a rolling update) the agent pins its pods' TC
//! links, its dispatchers' links and its turn programs' array instead of
//! letting them go ([`Leaving`]), and
//! leases the object for [`HANDOVER_LEASE`] (`NetnsFilter::left_until_ns`):
//! its programs keep judging and counting every pod under its last limits.
//! The next agent, its own programs verified and the pod's ports written in
//! its own maps, replaces the program of each pod's link with its own ([`Inherited::take`], `bpf_link_update`: atomic,
//! no packet unjudged) and, once no pod's link is left or the lease is up,
//! unpins the rest ([`Inherited::finish`]): the old object goes. A shared
//! object nobody takes over judges and hands over nothing once its lease is
//! up (fail-open); the next agent to start removes its pins.
use std::{
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use aya::programs::links::{FdLink, PinnedLink};

use crate::{
    error::Error,
    host::{paths, system},
};

/// How long a shared object left for a successor keeps judging without one:
/// time for a restarted or updated agent's container to start (a rolling
/// update's image pull among it: pre-pull it), verify its programs and take
/// each pod over (B10: 2.7 s at 110 pods); then it passes everything. The
/// limits it judges by meanwhile are the last ones the old agent wrote.
pub const HANDOVER_LEASE: Duration = Duration::from_mins(1);

/// The name a pod's TC link on `iface` is left under: by the inode of this
/// thread's network namespace (the pod's, stable while it lives) and the
/// interface.
pub(crate) fn pod_link_name(iface: &str) -> Result<String, Error> {
    Ok(format!("tc_{}_{iface}", this_netns_inum()?))
}

/// The inode of this thread's network namespace (a pod's, stable while it lives).
fn this_netns_inum() -> Result<u64, Error> {
    let netns = "/proc/thread-self/ns/net";
    Ok(std::fs::metadata(netns).map_err(|e| Error::io("read the namespace of", netns, e))?.ino())
}

/// Moves a leaving pod gate's pin folder (its maps) from `pin_dir` into the
/// folder of links left, `left`, named by this thread's namespace (whose
/// links [`handing_over`] looks for) and the gate's `label`: `stats` reads
/// what the left programs judge by there until the next agent takes the pod
/// over, and it goes with the folder. Said and false if it cannot be.
pub(crate) fn leave_pins(pin_dir: &Path, left: &Path, label: &str) -> bool {
    let moved = this_netns_inum().and_then(|inum| {
        let to = left.join(format!("{GATE_PINS}{inum}_{label}"));
        std::fs::rename(pin_dir, &to).map_err(|e| Error::io("move the gate's pins to", &to, e))
    });
    moved.map_err(|e| tracing::warn!("{e}: its counts are not shown while it is handed over")).is_ok()
}

/// The prefix of a left pod gate's pin folder in a folder of links left (see [`leave_pins`]).
const GATE_PINS: &str = "gate_";

/// A left gate's pin folder's name read back: its namespace's inode and label.
fn gate_pins_of(name: &str) -> Option<(u64, &str)> {
    let (inum, label) = name.strip_prefix(GATE_PINS)?.split_once('_')?;
    (!label.is_empty()).then_some((inum.parse().ok()?, label))
}

/// Of a folder of links left's entries (`names`), the gates' pin folders
/// whose namespace still has a link there: each one's label and entry.
fn gates_with_links(names: &[String]) -> Vec<(&str, &str)> {
    names
        .iter()
        .filter_map(|name| {
            let (inum, label) = gate_pins_of(name)?;
            let links = format!("tc_{inum}_");
            names.iter().any(|n| n.starts_with(&links)).then_some((label, name.as_str()))
        })
        .collect()
}

/// The pod gates a stopped agent left judging and no agent has taken over
/// yet: each one's label and pin folder (its maps, as its left programs
/// judge by them), the newest folder's where a pod was left twice. A gate is
/// left while a link of its namespace is (taken over, or gone with its pod,
/// it is not), and only within its folder's lease.
pub fn handing_over() -> Vec<(String, PathBuf)> {
    let mut found: Vec<(String, PathBuf)> = Vec::new();
    let mut folders = left();
    folders.sort_by_key(|&(_, until, _)| std::cmp::Reverse(until));
    for (dir, ..) in folders {
        let names: Vec<String> = std::fs::read_dir(&dir)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        for (label, name) in gates_with_links(&names) {
            if !found.iter().any(|(l, _)| l == label) {
                found.push((label.to_owned(), dir.join(name)));
            }
        }
    }
    found.sort();
    found
}

/// The labels of [`handing_over`]'s gates.
pub(crate) fn handing_over_labels() -> std::collections::BTreeSet<String> {
    handing_over().into_iter().map(|(label, _)| label).collect()
}

/// This agent's side: the folder it leaves its links in, once it is leaving.
#[derive(Clone, Default)]
pub(crate) struct Leaving(Arc<Mutex<Option<PathBuf>>>);

impl Leaving {
    /// The folder, once leaving: what goes now is pinned there, not taken back.
    pub(crate) fn dir(&self) -> Option<PathBuf> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// A new folder for links left until `until_ns`, root's only.
    pub(crate) fn prepare(until_ns: u64) -> Result<PathBuf, Error> {
        let dir = Path::new(paths::HANDOVER_PIN_DIR).join(format!("until-{until_ns}"));
        std::fs::create_dir_all(&dir).map_err(|e| Error::io("create the handover folder", &dir, e))?;
        std::fs::set_permissions(paths::HANDOVER_PIN_DIR, std::os::unix::fs::PermissionsExt::from_mode(0o700))
            .map_err(|e| Error::io("restrict the handover folder", paths::HANDOVER_PIN_DIR, e))?;
        Ok(dir)
    }

    /// From now on, links dropped are pinned in `dir`.
    pub(crate) fn start(&self, dir: PathBuf) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = Some(dir);
    }
}

/// The pin of the shared object's turn programs' array in a folder of links left.
pub(crate) const TURN_PIN: &str = "turn_tc";

/// The pin of dispatcher `program`'s link in a folder of links left.
pub(crate) fn dispatcher_pin(program: &str) -> String {
    format!("sock_{program}")
}

/// Pins `link` at `path`; said if it cannot be (the link then goes).
pub(crate) fn leave(link: FdLink, path: &Path) -> bool {
    match link.pin(path) {
        Ok(_) => true,
        Err(e) => {
            tracing::warn!("{e}: {} detached instead of left for the next agent", path.display());
            false
        }
    }
}

/// The link pinned at `path`, unpinned (None: none there, or unreadable: said).
pub(crate) fn take_back(path: &Path) -> Option<FdLink> {
    let mut left = open_left(path.to_path_buf())?;
    let link = left.link();
    left.done();
    link
}

/// The link pinned at `path`, opened and still pinned (None: none there, or
/// it cannot be opened: said, and its pin removed, not left judging beside
/// whatever attaches anew).
fn open_left(path: PathBuf) -> Option<Left> {
    if !path.exists() {
        return None;
    }
    match PinnedLink::from_pin(&path) {
        Ok(pinned) => Some(Left { link: Some(FdLink::from(pinned)), path }),
        Err(e) => {
            tracing::warn!("{e}: the link left at {} is not taken", path.display());
            let _ = std::fs::remove_file(&path);
            None
        }
    }
}

/// A pod's link to the shared TC program: detached when dropped, or pinned
/// for the next agent if this one is leaving.
pub(crate) struct PodLink {
    link: Option<FdLink>,
    name: String,
    leaving: Leaving,
}

impl PodLink {
    pub(crate) fn new(link: FdLink, name: String, leaving: Leaving) -> Self {
        Self { link: Some(link), name, leaving }
    }
}

impl Drop for PodLink {
    fn drop(&mut self) {
        if let (Some(dir), Some(link)) = (self.leaving.dir(), self.link.take()) {
            leave(link, &dir.join(&self.name));
        }
    }
}

/// Whether the link pinned at `path` is attached to no device any more (its
/// pod's namespace went, and its interfaces with it): `ifindex: 0` in a tcx
/// link's fdinfo. False if it cannot be read.
fn detached(path: &Path) -> bool {
    use std::os::{fd::FromRawFd as _, unix::ffi::OsStrExt as _};
    /// `union bpf_attr`'s `BPF_OBJ_GET` member.
    #[repr(C)]
    struct ObjAttr {
        pathname: u64,
        bpf_fd: u32,
        file_flags: u32,
        path_fd: i32,
        /// Zero: the kernel refuses an attribute with anything set past its last field.
        pad: u32,
    }
    const BPF_OBJ_GET: libc::c_long = 7;
    let Ok(name) = std::ffi::CString::new(path.as_os_str().as_bytes()) else { return false };
    let mut attr = ObjAttr { pathname: name.as_ptr() as u64, bpf_fd: 0, file_flags: 0, path_fd: 0, pad: 0 };
    // SAFETY: BPF_OBJ_GET reads `attr` (a NUL-terminated path that outlives the call).
    let fd = unsafe { libc::syscall(libc::SYS_bpf, BPF_OBJ_GET, (&raw mut attr).cast::<u8>(), size_of::<ObjAttr>()) };
    let Ok(fd) = i32::try_from(fd) else { return false };
    if fd < 0 {
        return false;
    }
    // SAFETY: a file descriptor the kernel just gave us, owned from here.
    let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
    use std::os::fd::AsRawFd as _;
    std::fs::read_to_string(format!("/proc/self/fdinfo/{}", fd.as_raw_fd())).is_ok_and(|info| on_no_device(&info))
}

/// Whether a tcx link's fdinfo says it is attached to no device.
fn on_no_device(fdinfo: &str) -> bool {
    fdinfo.lines().any(|l| l.split_whitespace().eq(["ifindex:", "0"]))
}

/// The lease's end a folder of left links is named by (`until-<ns>`).
fn lease_end(name: &str) -> Option<u64> {
    name.strip_prefix("until-")?.parse().ok()
}

/// A pod's link the last agent left, opened and still pinned (it judges
/// until [`Left::done`]).
pub(crate) struct Left {
    link: Option<FdLink>,
    path: PathBuf,
}

impl Left {
    /// The link itself, to take over (its pin stays until [`Left::done`]).
    pub(crate) fn link(&mut self) -> Option<FdLink> {
        self.link.take()
    }

    /// Unpins it: taken over, it now runs this agent's program; not taken
    /// over, it goes (detached) now that the pod's new link judges.
    pub(crate) fn done(self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Links that agents before this one left: a folder each, with its lease's end.
#[derive(Default)]
pub(crate) struct Inherited {
    dirs: Mutex<Vec<(PathBuf, u64)>>,
}

impl Inherited {
    /// The folders left for this agent; any whose lease is up already goes
    /// now (its programs judge nothing any more).
    pub(crate) fn find() -> Self {
        let mut dirs = remove_lapsed();
        // The newest first: a pod left twice is taken from the latest.
        dirs.sort_by_key(|&(_, until)| std::cmp::Reverse(until));
        let inherited = Self { dirs: Mutex::new(dirs) };
        // Those whose pods all went since go now.
        inherited.finish();
        if inherited.pending() {
            tracing::info!("taking over the pods the last agent left judged");
        }
        inherited
    }

    /// The link left under `name`, still pinned: [`Left::done`] unpins it
    /// once the pod's new link judges (None: none was left, or it cannot be
    /// opened: then its pin is removed, not left judging beside a new link).
    pub(crate) fn take(&self, name: &str) -> Option<Left> {
        let dirs = self.dirs.lock().unwrap_or_else(PoisonError::into_inner);
        dirs.iter().map(|(dir, _)| dir.join(name)).find(|path| path.exists()).and_then(open_left)
    }

    /// Whether a link was left under `name`.
    pub(crate) fn has(&self, name: &str) -> bool {
        self.dirs.lock().unwrap_or_else(PoisonError::into_inner).iter().any(|(dir, _)| dir.join(name).exists())
    }

    /// Removes every folder whose pods' links were all taken (or whose lease
    /// is up): its dispatchers' and its untaken links go, and with the last
    /// of them the old object.
    pub(crate) fn finish(&self) {
        let now = system::monotonic_ns();
        self.dirs.lock().unwrap_or_else(PoisonError::into_inner).retain(|(dir, until)| {
            // A pod gone since has nothing to take over: its link goes now.
            let pods_left =
                pod_links(dir).filter(|link| !(detached(link) && std::fs::remove_file(link).is_ok())).count();
            if pods_left == 0 || now >= *until {
                if pods_left > 0 {
                    tracing::info!(links = pods_left, "the last agent's links of pods not taken over are detached");
                }
                remove(dir);
                false
            } else {
                true
            }
        });
    }

    /// Whether links are still left to take.
    pub(crate) fn pending(&self) -> bool {
        !self.dirs.lock().unwrap_or_else(PoisonError::into_inner).is_empty()
    }
}

/// Removes the folders of links left whose lease is up (their programs judge
/// nothing any more: they only cost their memory); returns the others, each
/// with its lease's end. Any daemon's start does this.
pub fn remove_lapsed() -> Vec<(PathBuf, u64)> {
    let mut live = Vec::new();
    let now = system::monotonic_ns();
    for entry in std::fs::read_dir(paths::HANDOVER_PIN_DIR).into_iter().flatten().flatten() {
        let until = entry.file_name().to_str().and_then(lease_end);
        match until {
            Some(until) if until > now => live.push((entry.path(), until)),
            _ => remove(&entry.path()),
        }
    }
    live
}

/// The folders of links left for a successor, each with its lease's end and
/// the pods' links in it (what a stopped agent leaves judging).
pub fn left() -> Vec<(PathBuf, u64, usize)> {
    let now = system::monotonic_ns();
    std::fs::read_dir(paths::HANDOVER_PIN_DIR)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let until = entry.file_name().to_str().and_then(lease_end)?;
            let pods = pod_links(&entry.path()).count();
            (until > now).then(|| (entry.path(), until, pods))
        })
        .collect()
}

/// Removes every folder of links left for a successor, lease or not (an
/// operator's emergency stop): the pods they judged pass at once. Returns
/// how many pods' links went.
pub fn remove_all() -> usize {
    let mut pods = 0;
    for (dir, _, n) in left() {
        remove(&dir);
        pods += n;
    }
    remove_lapsed();
    pods
}

/// The pods' TC links left in a folder (named by [`pod_link_name`]).
fn pod_links(dir: &Path) -> impl Iterator<Item = PathBuf> {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("tc_"))
        .map(|e| e.path())
}

/// Removes a folder of links left: unpinned, each link goes (detached) unless held.
fn remove(dir: &Path) {
    if let Err(e) = std::fs::remove_dir_all(dir) {
        tracing::warn!("{e}: remove the links left in {}", dir.display());
    }
    // The parent goes with its last folder (ENOTEMPTY otherwise).
    let _ = std::fs::remove_dir(paths::HANDOVER_PIN_DIR);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tcx_link_on_no_device_reads_ifindex_0() {
        let left = "link_type:\ttcx\nlink_id:\t14909\nprog_id:\t49006\nifindex:\t0\nattach_type:\t46 (ingress)\n";
        assert!(on_no_device(left));
        assert!(!on_no_device(&left.replace("ifindex:\t0", "ifindex:\t10")));
        assert!(!on_no_device(&left.replace("ifindex:\t0", "ifindex:\t100")), "not a prefix match");
        assert!(!on_no_device("link_type:\traw_tracepoint\n"), "no ifindex: not known to be gone");
    }

    #[test]
    fn each_dispatcher_is_left_under_a_name_of_its_own_apart_from_the_pods() {
        let names: Vec<String> =
            shed_common::program::DISPATCHERS.iter().map(|(name, ..)| dispatcher_pin(name)).collect();
        for (i, name) in names.iter().enumerate() {
            assert!(!name.is_empty() && !name.contains('/'), "{name}");
            assert!(!name.starts_with("tc_") && !name.starts_with(GATE_PINS) && name != TURN_PIN, "{name}");
            assert!(!names[..i].contains(name), "{name} twice: {names:?}");
        }
        assert!(names.len() >= 2, "{names:?}");
    }

    #[test]
    fn a_left_gates_pins_are_named_by_its_namespaces_inode_and_label() {
        assert_eq!(gate_pins_of("gate_4026532712_cni-4f1e_x"), Some((4_026_532_712, "cni-4f1e_x")));
        for other in ["gate_", "gate_12", "gate_12_", "gate_x_cni", "tc_12_eth0", "turn_tc", "12_cni"] {
            assert_eq!(gate_pins_of(other), None, "{other}");
        }
    }

    #[test]
    fn a_left_gate_is_shown_while_a_link_of_its_namespace_is_left() {
        let names: Vec<String> =
            ["gate_1_a", "tc_1_eth0", "tc_1_lo", "gate_2_b", "tc_12_eth0", "gate_3_c", "tc_3_lo", "turn_tc", "sock_x"]
                .map(str::to_owned)
                .into();
        // b's links were all taken (or went with its pod); tc_12_eth0 is another namespace's.
        assert_eq!(gates_with_links(&names), [("a", "gate_1_a"), ("c", "gate_3_c")]);
        assert!(gates_with_links(&["gate_1_a".to_owned()]).is_empty(), "no link left");
    }

    #[test]
    fn a_left_folder_is_named_by_its_lease_end() {
        assert_eq!(lease_end("until-33711728486135"), Some(33_711_728_486_135));
        assert_eq!(lease_end(&format!("until-{}", u64::MAX)), Some(u64::MAX));
        for other in ["until-", "until-x", "until--1", "33711728486135", "sock_x"] {
            assert_eq!(lease_end(other), None, "{other}");
        }
    }
}
