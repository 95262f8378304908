// SPDX-License-Identifier: MIT OR Apache-2.0
//! Expedited RCU grace periods while a burst of pods queues to attach.
//!
//! Each TC (tcx) attachment waits out an RCU grace period under the kernel's
//! rtnl lock, one after another across the node: a normal grace period is
//! 10-30 ms here, so 110 pods started together (220 attachments, a pod's
//! loopback and veth) queued for seconds. The kernel's switch
//! `/sys/kernel/rcu_expedited` makes every grace period an expedited one
//! (tens of µs, for an interrupt to each busy CPU). The agent turns it on
//! only while pods wait in line to attach and back off when the line is
//! empty; one it finds on (the operator's, or the boot's) it leaves alone.
//! A mark file says the agent holds it on, so an agent that dies holding it
//! has the next one turn it off ([`Expedite::recover`]).
use std::{
    fs,
    path::{Path, PathBuf},
};

use crate::host::paths;

/// The switch, as this agent holds it.
pub(crate) struct Expedite {
    switch: PathBuf,
    mark: PathBuf,
    /// On because this agent turned it on.
    ours: bool,
    /// A switch that cannot be written (a read-only /sys) is said once.
    said: bool,
    /// Its first turn on is said.
    told: bool,
}

impl Expedite {
    /// The kernel's switch, with the agent's mark beside its other state.
    pub(crate) fn system() -> Self {
        Self::at(Path::new(paths::RCU_EXPEDITED), Path::new(paths::RCU_EXPEDITED_MARK))
    }

    pub(crate) fn at(switch: &Path, mark: &Path) -> Self {
        Self { switch: switch.to_owned(), mark: mark.to_owned(), ours: false, said: false, told: false }
    }

    /// Turns the switch off where an agent that died left it on (its mark says so).
    pub(crate) fn recover(&self) {
        if !self.mark.exists() {
            return;
        }
        let off = match self.read() {
            Some(true) => {
                let off = self.turn_off();
                if off {
                    tracing::info!(
                        switch = %self.switch.display(),
                        "RCU grace periods normal again: the agent before this one died while pods queued to attach"
                    );
                }
                off
            }
            _ => true,
        };
        // Kept while the switch stays on: the next agent tries again.
        if off {
            let _ = fs::remove_file(&self.mark);
        }
    }

    /// On for a burst of pods, unless it is on already (then not this agent's to turn off).
    pub(crate) fn on(&mut self) {
        if self.ours || self.read() != Some(false) {
            return;
        }
        // The mark first: an agent killed between the two writes leaves the
        // switch off and a mark the next one merely removes.
        let written = fs::create_dir_all(self.mark.parent().unwrap_or(Path::new("/")))
            .and_then(|()| fs::write(&self.mark, std::process::id().to_string()))
            .and_then(|()| fs::write(&self.switch, "1"));
        match written {
            Ok(()) => {
                self.ours = true;
                // A burst turns it on and off again each time the line empties: said once.
                if !std::mem::replace(&mut self.told, true) {
                    tracing::info!(
                        switch = %self.switch.display(),
                        "pods queue to attach: RCU grace periods expedited while they wait, normal again once the line is empty (said once; --no-expedite-rcu keeps them normal)"
                    );
                }
            }
            Err(e) => {
                let _ = fs::remove_file(&self.mark);
                if !std::mem::replace(&mut self.said, true) {
                    tracing::warn!(
                        switch = %self.switch.display(),
                        "cannot expedite RCU grace periods ({e}): pods started together attach one normal grace period each"
                    );
                }
            }
        }
    }

    /// Off again once the line is empty, if this agent turned it on.
    pub(crate) fn off(&mut self) {
        if !std::mem::replace(&mut self.ours, false) {
            return;
        }
        if self.turn_off() {
            tracing::debug!("every pod in line attached: RCU grace periods normal again");
            let _ = fs::remove_file(&self.mark);
        }
    }

    /// Writes the switch off; false (said) where it cannot.
    fn turn_off(&self) -> bool {
        let written = fs::write(&self.switch, "0");
        if let Err(e) = &written {
            tracing::warn!(switch = %self.switch.display(), "cannot turn expedited RCU grace periods off: {e}");
        }
        written.is_ok()
    }

    /// Whether the switch is on; None where it cannot be read (no such kernel knob).
    fn read(&self) -> Option<bool> {
        match fs::read_to_string(&self.switch).ok()?.trim() {
            "0" => Some(false),
            "" => None,
            _ => Some(true),
        }
    }
}

impl Drop for Expedite {
    fn drop(&mut self) {
        self.off();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(switch: &str) -> (tempfile::TempDir, PathBuf, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let (s, m) = (dir.path().join("rcu_expedited"), dir.path().join("run/rcu-expedited"));
        fs::write(&s, switch).unwrap();
        (dir, s, m)
    }

    fn value(path: &Path) -> String {
        fs::read_to_string(path).unwrap().trim().to_owned()
    }

    #[test]
    fn the_switch_is_on_while_held_and_off_after_with_its_mark_gone() {
        let (_dir, switch, mark) = files("0\n");
        let mut held = Expedite::at(&switch, &mark);
        held.on();
        assert_eq!((value(&switch).as_str(), mark.exists()), ("1", true));
        held.on();
        held.off();
        assert_eq!((value(&switch).as_str(), mark.exists()), ("0", false));
        held.on();
        drop(held);
        assert_eq!((value(&switch).as_str(), mark.exists()), ("0", false), "off when dropped");
    }

    #[test]
    fn a_switch_found_on_is_left_on() {
        let (_dir, switch, mark) = files("1\n");
        let mut held = Expedite::at(&switch, &mark);
        held.on();
        assert!(!mark.exists(), "not this agent's");
        held.off();
        drop(held);
        assert_eq!(value(&switch), "1", "the operator's setting stays");
    }

    #[test]
    fn the_next_agent_turns_off_what_a_dead_one_left_on_and_nothing_else() {
        let (_dir, switch, mark) = files("0\n");
        let mut died = Expedite::at(&switch, &mark);
        died.on();
        std::mem::forget(died);
        Expedite::at(&switch, &mark).recover();
        assert_eq!((value(&switch).as_str(), mark.exists()), ("0", false));
        // No mark: an operator's switch stays as it is.
        fs::write(&switch, "1").unwrap();
        Expedite::at(&switch, &mark).recover();
        assert_eq!(value(&switch), "1");
    }

    #[test]
    fn a_kernel_without_the_switch_or_a_mark_that_cannot_be_kept_turns_nothing_on() {
        let (dir, switch, _) = files("0\n");
        let mut held = Expedite::at(&dir.path().join("no-such-switch"), &dir.path().join("mark"));
        held.on();
        assert!(!held.ours && !dir.path().join("mark").exists());
        // The mark's folder is a file: without a mark the switch is never turned on.
        fs::write(dir.path().join("run"), "").unwrap();
        let mut held = Expedite::at(&switch, &dir.path().join("run/mark"));
        held.on();
        assert_eq!((value(&switch).as_str(), held.ours), ("0", false));
    }
}
