// SPDX-License-Identifier: MIT OR Apache-2.0
//! The daemon's memory budget (`--memory-budget`). The kernel charges a
//! gate's BPF maps, and the verifier's work while it loads them, to the
//! memory cgroup of the process that creates them: in a container, every
//! gate counts against the container's limit. Past it the OOM killer ends
//! the whole daemon, and every gate it held fails open at once. So a gate
//! that would not fit is refused instead: at attach (too many `--netns`
//! namespaces, exit 4, nothing attached), and for a pod (`--pods`: the pod
//! is left ungated, logged and shown in `shed_pod_refused`, and tried again
//! later, when another pod may have gone).
use crate::host::system::CgroupMemory;

const MIB: u64 = 1 << 20;
/// What one more namespace's gate costs at its peak: its own maps and
/// programs, and the verifier's memory while they load (B10: 91 MiB with
/// one namespace, 223 MiB with three, in a cgroup of 256 MiB).
pub(crate) const PER_NAMESPACE: u64 = 64 * MIB;
/// What one more pod's gate holds once set up (its maps, sized for a pod,
/// its programs, the daemon's share of its bookkeeping; its accounting runs
/// through the node's dispatcher): B10's cgroup held 204 MiB idle at 110
/// pods against 12 MiB at 10, about 2 MiB a pod (20 MiB before the pod-sized
/// objects); twice that, for the object parsed while it waits to load.
pub(crate) const PER_POD: u64 = 4 * MIB;
/// What a gate object costs while the verifier works on it, on top: B10's
/// peak of 157 MiB with one pod (the dispatchers', the pod's and the spare's
/// loads, two at a time) against 6 MiB held after. At most one object per
/// CPU is in the verifier at once (`kernel::programs::verified`).
pub(crate) const VERIFYING: u64 = 80 * MIB;
/// The share of the cgroup's limit the daemon plans to use when no budget
/// is given: the rest is headroom for what the estimates miss.
const OF_LIMIT_PERCENT: u64 = 90;

/// How much memory the daemon may hold, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Budget(pub u64);

impl Budget {
    /// `--memory-budget MIB`, or with 0, 90% of the cgroup's limit; None
    /// when neither is set (no limit to be killed at).
    pub(crate) fn of(flag_mib: u32, cgroup: Option<CgroupMemory>) -> Option<Self> {
        if flag_mib > 0 {
            return Some(Self(u64::from(flag_mib) * MIB));
        }
        cgroup?.limit.map(|limit| Self(limit / 100 * OF_LIMIT_PERCENT))
    }

    /// Whether one more pod's gate fits, beside the gates already running:
    /// `set_up[i]` says whether running gate `i` is set up. The cgroup's
    /// figure (`used`) holds what set-up gates hold; those still setting up
    /// are booked by estimate, with the new one (a burst of pods all see the
    /// same cgroup figure, taken before any of them loads).
    pub(crate) fn room_for_next_pod(
        self,
        set_up: impl IntoIterator<Item = bool>,
        verifiers: u64,
        used: Option<u64>,
    ) -> Result<(), String> {
        let setting_up = set_up.into_iter().filter(|&done| !done).count() as u64;
        self.room_for_pods(setting_up + 1, verifiers, used)
    }

    /// Whether `pods` more pods' gates fit beside what the cgroup holds now
    /// (`used`): each holds [`PER_POD`] once set up, and up to `verifiers`
    /// (one per CPU; none under the node's shared object, where a pod loads
    /// no program) are in the verifier at once, [`VERIFYING`] each; why not.
    pub(crate) fn room_for_pods(self, pods: u64, verifiers: u64, used: Option<u64>) -> Result<(), String> {
        let loading = pods.min(verifiers);
        let each = PER_POD + (loading * VERIFYING).div_ceil(pods.max(1));
        self.room_for(pods, each, used)
    }

    /// Whether `gates` more gates of `each` bytes fit beside what the cgroup
    /// holds now (`used`; unknown: counted as nothing held yet); why not.
    pub(crate) fn room_for(self, gates: u64, each: u64, used: Option<u64>) -> Result<(), String> {
        let need = used.unwrap_or(0) + gates * each;
        if need <= self.0 {
            return Ok(());
        }
        Err(format!(
            "{gates} more gate(s) need about {} MiB with the {} MiB held, over the memory budget of {} MiB: \
             raise the container's memory limit or --memory-budget, or gate fewer namespaces",
            gates * each / MIB,
            used.unwrap_or(0) / MIB,
            self.0 / MIB
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The cgroup's figure already holds the pods set up: only those still
    /// setting up are booked beside it, and the new one. Booking the set-up
    /// ones again would refuse a node's pods long before its memory is used.
    #[test]
    fn a_pod_is_booked_beside_the_gates_setting_up_not_again_beside_those_set_up() {
        let budget = Budget(100 * MIB);
        // 20 pods set up hold 88 MiB: one more (4 MiB) fits.
        let twenty_set_up = std::iter::repeat_n(true, 20);
        assert_eq!(budget.room_for_next_pod(twenty_set_up.clone(), 0, Some(88 * MIB)), Ok(()));
        // Two still setting up: booked at 4 MiB each with the new one (100 MiB: fits, just).
        let two_setting_up = twenty_set_up.clone().chain([false, false]);
        assert_eq!(budget.room_for_next_pod(two_setting_up, 0, Some(88 * MIB)), Ok(()));
        // Three: 88 + 16 > 100.
        let three = twenty_set_up.chain([false, false, false]);
        let why = budget.room_for_next_pod(three, 0, Some(88 * MIB)).unwrap_err();
        assert!(why.starts_with("4 more gate(s) need about 16 MiB with the 88 MiB held"), "{why}");
        // Where pods load programs, one verifier's worth is booked among those loading.
        assert!(budget.room_for_next_pod([], 1, Some(20 * MIB)).is_err(), "4 + 80 MiB in the verifier beside 20 held");
        assert_eq!(budget.room_for_next_pod([], 1, Some(16 * MIB)), Ok(()), "exactly 100 MiB");
    }

    #[test]
    fn the_budget_is_the_flag_or_most_of_the_cgroup_limit() {
        let cgroup = |limit| Some(CgroupMemory { used: 80 * MIB, limit });
        assert_eq!(Budget::of(300, cgroup(Some(256 * MIB))), Some(Budget(300 * MIB)), "the flag wins");
        assert_eq!(Budget::of(0, cgroup(Some(256 * MIB))), Some(Budget(256 * MIB / 100 * 90)));
        assert_eq!(Budget::of(0, cgroup(None)), None, "no limit: nothing to plan for");
        assert_eq!(Budget::of(0, None), None);
    }

    #[test]
    fn gates_fit_until_the_budget_and_the_refusal_says_what_to_do() {
        let budget = Budget::of(0, Some(CgroupMemory { used: 0, limit: Some(256 * MIB) })).unwrap();
        // A 256 MiB limit (the DaemonSet's before): three namespaces beside
        // 20 MiB held fit (B10 saw them peak at 223 MiB), four do not (five
        // were OOM-killed).
        assert!(budget.room_for(3, PER_NAMESPACE, Some(20 * MIB)).is_ok());
        let why = budget.room_for(4, PER_NAMESPACE, Some(20 * MIB)).unwrap_err();
        assert!(
            why.contains("4 more gate(s) need about 256 MiB with the 20 MiB held") && why.contains("230 MiB"),
            "{why}"
        );
        assert!(why.contains("--memory-budget"), "{why}");
        // Pods: as many as fit beside what is held now, one verified at a time per CPU.
        assert!(budget.room_for_pods(1, 2, Some(146 * MIB)).is_ok(), "146 + 4 + 80 = 230");
        assert!(budget.room_for_pods(1, 2, Some(147 * MIB)).is_err());
        assert!(budget.room_for_pods(10, 2, Some(30 * MIB)).is_ok(), "30 + 40 + 160 = 230");
        let why = budget.room_for_pods(10, 2, Some(31 * MIB)).unwrap_err();
        assert!(why.starts_with("10 more gate(s) need about 200 MiB with the 31 MiB held"), "{why}");
        // More CPUs, more verifying at once.
        assert!(budget.room_for_pods(10, 4, Some(30 * MIB)).is_err());
        // Under the shared object a pod's set-up verifies nothing: its maps alone.
        assert!(budget.room_for_pods(50, 0, Some(30 * MIB)).is_ok(), "30 + 50 x 4 = 230");
        assert!(budget.room_for_pods(51, 0, Some(30 * MIB)).is_err());
    }
}
