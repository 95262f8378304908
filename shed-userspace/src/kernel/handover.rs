// SPDX-License-Identifier: MIT OR Apache-2.0
//! A node agent's shared object outliving the agent, for its successor.
//!
//! On SIGTERM (a restart, a rolling update) the agent pins its pods' TC links
//! and its dispatchers' links instead of detaching them ([`Leaving`]), and
//! leases the object for [`HANDOVER_LEASE`] (`NetnsFilter::left_until_ns`):
//! its programs keep judging and counting every pod under its last limits.
//! The next agent, its own programs verified, replaces the program of each
//! pod's link with its own ([`Inherited::take`], `bpf_link_update`: atomic,
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
/// time for a restarted or updated agent to start, verify its programs and
/// take each pod over (B10: 5.8 s at 110 pods); then it passes everything.
pub const HANDOVER_LEASE: Duration = Duration::from_secs(30);

/// The name a pod's TC link on `iface` is left under: by the inode of this
/// thread's network namespace (the pod's, stable while it lives) and the
/// interface.
pub(crate) fn pod_link_name(iface: &str) -> Result<String, Error> {
    let netns = "/proc/thread-self/ns/net";
    let inum = std::fs::metadata(netns).map_err(|e| Error::io("read the namespace of", netns, e))?.ino();
    Ok(format!("tc_{inum}_{iface}"))
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

/// Pins `link` as `dir/name`; said if it cannot be (the link then goes).
pub(crate) fn leave(link: FdLink, dir: &Path, name: &str) -> bool {
    match link.pin(dir.join(name)) {
        Ok(_) => true,
        Err(e) => {
            tracing::warn!("{e}: {name} detached instead of left for the next agent");
            false
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
            leave(link, &dir, &self.name);
        }
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
        let mut dirs = Vec::new();
        let now = system::monotonic_ns();
        for entry in std::fs::read_dir(paths::HANDOVER_PIN_DIR).into_iter().flatten().flatten() {
            let until = entry.file_name().to_str().and_then(|n| n.strip_prefix("until-")?.parse::<u64>().ok());
            match until {
                Some(until) if until > now => dirs.push((entry.path(), until)),
                _ => remove(&entry.path()),
            }
        }
        if !dirs.is_empty() {
            tracing::info!(agents = dirs.len(), "taking over the pods the last agent left judged");
        }
        // The newest first: a pod left twice is taken from the latest.
        dirs.sort_by_key(|&(_, until)| std::cmp::Reverse(until));
        Self { dirs: Mutex::new(dirs) }
    }

    /// The link left under `name`, unpinned (None: none was left).
    pub(crate) fn take(&self, name: &str) -> Option<FdLink> {
        let dirs = self.dirs.lock().unwrap_or_else(PoisonError::into_inner);
        dirs.iter().map(|(dir, _)| dir.join(name)).find(|path| path.exists()).and_then(|path| {
            PinnedLink::from_pin(&path)
                .map_err(|e| tracing::warn!("{e}: the last agent's link {} is not taken over", path.display()))
                .ok()?
                .unpin()
                .map_err(|e| tracing::warn!("{e}: unpin {}", path.display()))
                .ok()
        })
    }

    /// Removes every folder whose pods' links were all taken (or whose lease
    /// is up, or all of them with `all`): its dispatchers' and its untaken
    /// links go, and with the last of them the old object.
    pub(crate) fn finish(&self, all: bool) {
        let now = system::monotonic_ns();
        self.dirs.lock().unwrap_or_else(PoisonError::into_inner).retain(|(dir, until)| {
            let pods_left = std::fs::read_dir(dir)
                .into_iter()
                .flatten()
                .flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with("tc_"))
                .count();
            if all || pods_left == 0 || now >= *until {
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

/// Removes a folder of links left: unpinned, each link goes (detached) unless held.
fn remove(dir: &Path) {
    if let Err(e) = std::fs::remove_dir_all(dir) {
        tracing::warn!("{e}: remove the links left in {}", dir.display());
    }
    // The parent goes with its last folder (ENOTEMPTY otherwise).
    let _ = std::fs::remove_dir(paths::HANDOVER_PIN_DIR);
}

/// Detaches whatever agents before this one left (this agent does not take
/// pods over: it gates them with programs of their own).
pub fn abandon_inherited() {
    let dir = Path::new(paths::HANDOVER_PIN_DIR);
    if dir.exists() {
        tracing::info!("the last agent's programs are detached: this agent loads programs for each pod");
        if let Err(e) = std::fs::remove_dir_all(dir) {
            tracing::warn!("{e}: remove {}", dir.display());
        }
    }
}
