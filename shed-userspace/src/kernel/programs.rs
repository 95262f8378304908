// SPDX-License-Identifier: MIT OR Apache-2.0
//! Loading the kernel programs and attaching them. Used by the daemon, and by
//! the tests that run the programs with BPF_PROG_TEST_RUN.
use std::path::Path;

use aya::{
    Ebpf,
    maps::{Map, MapData},
    programs::{ProgramError, RawTracePoint, SchedClassifier, TcAttachType, TracePoint, Xdp, XdpMode},
};
use shed_common::program;

use crate::{
    error::Error,
    host::system,
    kernel::maps::GateMaps,
    kernel::object,
    kernel::options::{Hook, XdpAttachMode},
};

/// The kernel object with its programs loaded (verified) but not attached.
pub struct Loaded {
    /// A pod's attachments of the node's shared TC program (dropped first:
    /// detached before anything else of the gate goes).
    pub shared_links: Vec<Box<dyn Send>>,
    /// The node's shared object that judges for this pod's gate, once handed
    /// its maps: [`Self::attach_gate`] attaches its TC program.
    pub shared: Option<std::sync::Arc<dyn SharedJudge>>,
    /// Where a pod's gate counts through the node's dispatcher (a
    /// `kernel::dispatch::Dispatched`, held only to be dropped: first, so no
    /// event reaches the programs once they are going; kept opaque here so
    /// that the dispatcher, which loads through this module, is not imported by it).
    pub dispatched: Option<Box<dyn Send>>,
    /// The gate's object (None for a pod's maps under the shared object).
    pub ebpf: Option<Ebpf>,
    pub maps: GateMaps,
    /// The program that counts connections ([`object::SockStateHook::program`]).
    sock_state: &'static str,
    /// The maps a shared object's programs find by gate (`map::GATED`), each
    /// with its `_OF` array: held until handed to the node's dispatcher.
    pub(crate) gated: Vec<(&'static str, MapData)>,
}

impl Loaded {
    /// Loads every program; pins the maps under `pin_dir` when given.
    pub fn new(pin_dir: Option<&Path>) -> Result<Self, Error> {
        Self::sized(pin_dir, object::LoadOptions::default())
    }

    /// [`Self::new`] with the growing maps sized as asked, kernel logging on or off.
    pub fn sized(pin_dir: Option<&Path>, options: object::LoadOptions) -> Result<Self, Error> {
        Self::with(object::load(options)?, pin_dir, options.sock_state)
    }

    /// A gate's object with its programs verified ahead of need, for a
    /// gate that comes later ([`Self::from_prepared`]): the accounting
    /// programs, and the judging program `hook` attaches (the verifier's
    /// second or two on a gate's set-up).
    pub fn prepare(options: object::LoadOptions, hook: Hook) -> Result<Prepared, Error> {
        let mut ebpf = object::load(options)?;
        Self::load_accounting(&mut ebpf, options.sock_state)?;
        match hook {
            Hook::Xdp => drop(Self::loaded_xdp(&mut ebpf, program::XDP, "load XDP program")?),
            Hook::Tc => drop(Self::loaded_tc(&mut ebpf)?),
        }
        Ok(Prepared { ebpf, options, hook })
    }

    /// The gate of a [`Prepared`] object, its maps pinned under `pin_dir` when given.
    pub fn from_prepared(prepared: Prepared, pin_dir: Option<&Path>) -> Result<Self, Error> {
        Self::with(prepared.ebpf, pin_dir, prepared.options.sock_state)
    }

    /// The same from an object file on disk (see [`object::load_file`]).
    pub fn from_file(object: &Path, pin_dir: Option<&Path>) -> Result<Self, Error> {
        Self::with(object::load_file(object)?, pin_dir, object::SockStateHook::Auto)
    }

    /// A pod's gate under the node's shared object (see
    /// [`shed_common::dispatch::SHARED_OBJECT`]): its maps only, each created
    /// on its own at the sizes `options` say, and no program (the shared
    /// object's judge and count for it once
    /// [`crate::kernel::dispatch::Dispatcher::add`] has its maps).
    pub fn maps_only(pin_dir: Option<&Path>, options: object::LoadOptions) -> Result<Self, Error> {
        use std::os::fd::AsFd as _;
        let mut held: Vec<(&'static str, MapData)> = Vec::new();
        let create = |name: &str| -> Result<MapData, Error> { object::create_map(&options, name) };
        let maps = GateMaps::created(pin_dir, |name| {
            let data = create(name)?;
            // A descriptor of its own for each the shared object finds by gate.
            if let Some(&(gated, _)) = shed_common::map::GATED.iter().find(|(gated, _)| *gated == name) {
                let fd =
                    data.fd().as_fd().try_clone_to_owned().map_err(|e| Error::io("duplicate the fd of", name, e))?;
                held.push((gated, MapData::from_fd(fd).map_err(|e| Error::map(format!("open map {name} again"), e))?));
            }
            Map::from_map_data(data).map_err(|e| Error::map(format!("open map {name}"), e))
        })?;
        // In the shared object's order; those the daemon does not read, created here alone.
        let gated = shed_common::map::GATED
            .iter()
            .map(|&(name, of)| match held.iter().position(|(h, _)| *h == name) {
                Some(at) => Ok((of, held.swap_remove(at).1)),
                None => create(name).map(|data| (of, data)),
            })
            .collect::<Result<Vec<_>, Error>>()?;
        Ok(Self {
            shared_links: Vec::new(),
            shared: None,
            dispatched: None,
            ebpf: None,
            maps,
            sock_state: program::SOCK_STATE_RAW,
            gated,
        })
    }

    fn with(mut ebpf: Ebpf, pin_dir: Option<&Path>, hook: object::SockStateHook) -> Result<Self, Error> {
        let maps = GateMaps::from_ebpf(&mut ebpf, pin_dir)?;
        // The gate's XDP and TC programs load when first used (see
        // [`Self::xdp`]): each takes the verifier seconds, and a gate runs one
        // of them on most hosts.
        let sock_state = Self::load_accounting(&mut ebpf, hook)?;
        Ok(Self {
            shared_links: Vec::new(),
            shared: None,
            dispatched: None,
            ebpf: Some(ebpf),
            maps,
            sock_state,
            gated: Vec::new(),
        })
    }

    /// Loads the accounting programs not loaded yet; returns the one that counts connections.
    fn load_accounting(ebpf: &mut Ebpf, hook: object::SockStateHook) -> Result<&'static str, Error> {
        // An older build's object (benchmarks load one from disk) has only the regular tracepoint.
        let sock_state =
            Some(hook.program()).filter(|&name| ebpf.program(name).is_some()).unwrap_or(program::SOCK_STATE);
        if sock_state == program::SOCK_STATE {
            let prog = Self::program::<TracePoint>(ebpf, sock_state)?;
            if prog.fd().is_ok() { Ok(()) } else { verified(|| prog.load()) }
        } else {
            let prog = Self::program::<RawTracePoint>(ebpf, sock_state)?;
            if prog.fd().is_ok() { Ok(()) } else { verified(|| prog.load()) }
        }
        .map_err(|e| Error::program(format!("load tracepoint program {sock_state}"), e))?;
        for (name, _) in program::RAW_TRACEPOINTS {
            let prog = Self::program::<RawTracePoint>(ebpf, name)?;
            if prog.fd().is_err() {
                verified(|| prog.load())
                    .map_err(|e| Error::program(format!("load raw tracepoint program {name}"), e))?;
            }
        }
        Ok(sock_state)
    }

    /// The gate's object, for its programs (a pod's maps under the shared object have none).
    fn object(&mut self) -> Result<&mut Ebpf, Error> {
        self.ebpf.as_mut().ok_or_else(|| Error::Dispatch {
            what: "load a program of a pod's gate: its programs are the node's shared object's".into(),
        })
    }

    /// The program that counts connections: `shed_sock_state_raw`, or
    /// `shed_sock_state` where the kernel's BTF lacks the socket's layout.
    pub fn sock_state_program(&self) -> &'static str {
        self.sock_state
    }

    fn program<'a, T>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut T, Error>
    where
        &'a mut T: TryFrom<&'a mut aya::programs::Program, Error = aya::programs::ProgramError>,
    {
        let prog = ebpf
            .program_mut(name)
            .ok_or_else(|| Error::program(format!("find program {name}"), aya::programs::ProgramError::NotLoaded))?;
        prog.try_into().map_err(|e| Error::program(format!("open program {name}"), e))
    }

    /// The accounting programs (loaded, not attached) in the dispatcher's
    /// event order ([`program::DISPATCHERS`]), for a pod's gate that counts
    /// through the node's dispatcher; only the raw tracepoint's can be a
    /// tail call's target.
    pub(crate) fn accounting_programs(&mut self) -> Result<Vec<aya::programs::ProgramFd>, Error> {
        if self.sock_state != program::SOCK_STATE_RAW {
            return Err(Error::Dispatch {
                what: format!("hand connections to {}: only a raw tracepoint's program can be", self.sock_state),
            });
        }
        program::DISPATCHERS
            .iter()
            .map(|&(_, _, name)| {
                let prog: &mut RawTracePoint = Self::program(self.object()?, name)?;
                let fd = prog.fd().map_err(|e| Error::program(format!("find program {name}'s fd"), e))?;
                fd.try_clone().map_err(|e| Error::io("duplicate the fd of", name, e))
            })
            .collect()
    }

    /// The gate's XDP program, loaded into the kernel on first use.
    pub fn xdp(&mut self) -> Result<&mut Xdp, Error> {
        Self::loaded_xdp(self.object()?, program::XDP, "load XDP program")
    }

    /// The gate's TC program, loaded into the kernel on first use.
    pub fn tc(&mut self) -> Result<&mut SchedClassifier, Error> {
        Self::loaded_tc(self.object()?)
    }

    /// `ebpf`'s TC program (and its turn program, installed), loaded into the kernel on first use.
    pub(crate) fn loaded_tc(ebpf: &mut Ebpf) -> Result<&mut SchedClassifier, Error> {
        if ebpf.program(program::TC_TURN).is_some() {
            let turn: &mut SchedClassifier = Self::program(ebpf, program::TC_TURN)?;
            if turn.fd().is_err() {
                verified(|| turn.load()).map_err(|e| Error::program("load TC turn program", e))?;
                Self::install_tc_turn(ebpf)?;
            }
        }
        let prog: &mut SchedClassifier = Self::program(ebpf, program::TC)?;
        if prog.fd().is_err() {
            verified(|| prog.load()).map_err(|e| Error::program("load TC program", e))?;
        }
        Ok(prog)
    }

    /// Puts the loaded TC turn program where the TC gate's tail call finds it.
    pub(crate) fn install_tc_turn(ebpf: &mut Ebpf) -> Result<(), Error> {
        Self::install_loaded_turn(ebpf, program::TC_TURN, shed_common::map::TURN_TC)
    }

    /// Puts turn program `turn`, loaded, in program array `array`.
    fn install_loaded_turn(ebpf: &mut Ebpf, turn: &str, array: &str) -> Result<(), Error> {
        let missing = || Error::program(format!("find program {turn}"), ProgramError::NotLoaded);
        let fd =
            ebpf.program(turn).ok_or_else(missing)?.fd().map_err(|e| Error::program(format!("find {turn}'s fd"), e))?;
        let fd = fd.try_clone().map_err(|e| Error::io("duplicate the fd of", turn, e))?;
        Self::install_turn(ebpf, array, &fd)
    }

    /// Puts a turn program where its gate's tail call finds it (an older
    /// build's object, loaded for comparison, has neither).
    fn install_turn(ebpf: &mut Ebpf, array: &str, fd: &aya::programs::ProgramFd) -> Result<(), Error> {
        let Some(map) = ebpf.map_mut(array) else { return Ok(()) };
        let mut programs =
            aya::maps::ProgramArray::try_from(map).map_err(|e| Error::map(format!("open map {array}"), e))?;
        programs.set(0, fd, 0).map_err(|e| Error::map(format!("install the turn program in {array}"), e))
    }

    /// The pass-everything XDP program (for the peer of an XDP-gated veth, and as a benchmark baseline).
    pub fn xdp_pass(&mut self) -> Result<&mut Xdp, Error> {
        Self::loaded_xdp(self.object()?, program::XDP_PASS, "load XDP pass program")
    }

    /// The drop-everything XDP program (a benchmark baseline; never attached by `shedctl`).
    pub fn xdp_drop(&mut self) -> Result<&mut Xdp, Error> {
        Self::loaded_xdp(self.object()?, program::XDP_DROP, "load XDP drop program")
    }

    /// Programs that do nothing at every hook the gate uses: a TC classifier
    /// that passes, attached to `iface`'s ingress, and a raw tracepoint
    /// program on each socket event the gate counts from
    /// ([`program::DISPATCHERS`]). A benchmark baseline (the cost of running
    /// any program there); never attached by `shedctl`.
    pub fn attach_do_nothing(&mut self, iface: &str) -> Result<(), Error> {
        let ebpf = self.object()?;
        let tc: &mut SchedClassifier = Self::program(ebpf, program::TC_PASS)?;
        verified(|| tc.load()).map_err(|e| Error::program("load the TC pass program", e))?;
        tc.attach(iface, TcAttachType::Ingress)
            .map_err(|e| Error::program(format!("attach TC ingress to {iface}"), e))?;
        let hook: &mut RawTracePoint = Self::program(ebpf, program::HOOK_NOTHING)?;
        verified(|| hook.load()).map_err(|e| Error::program("load the do-nothing tracepoint program", e))?;
        for (_, event, _) in program::DISPATCHERS {
            hook.attach(event).map_err(|e| Error::program(format!("attach to sock:{event}"), e))?;
        }
        Ok(())
    }

    fn loaded_xdp<'a>(ebpf: &'a mut Ebpf, name: &str, what: &str) -> Result<&'a mut Xdp, Error> {
        if name == program::XDP && ebpf.program(program::XDP_TURN).is_some() {
            let turn: &mut Xdp = Self::program(ebpf, program::XDP_TURN)?;
            if turn.fd().is_err() {
                verified(|| turn.load()).map_err(|e| Error::program("load XDP turn program", e))?;
                Self::install_loaded_turn(ebpf, program::XDP_TURN, shed_common::map::TURN_XDP)?;
            }
        }
        let prog: &mut Xdp = Self::program(ebpf, name)?;
        if prog.fd().is_err() {
            verified(|| prog.load()).map_err(|e| Error::program(what, e))?;
        }
        Ok(prog)
    }

    /// Starts in-flight accounting and latency measurement. Attach before any
    /// gate so no admitted connection is established unseen.
    pub fn attach_accounting(&mut self) -> Result<(), Error> {
        if self.sock_state == program::SOCK_STATE {
            Self::program::<TracePoint>(self.object()?, program::SOCK_STATE)?
                .attach("sock", "inet_sock_set_state")
                .map(drop)
        } else {
            let sock_state = self.sock_state;
            Self::program::<RawTracePoint>(self.object()?, sock_state)?.attach("inet_sock_set_state").map(drop)
        }
        .map_err(|e| Error::program(format!("attach {} to sock:inet_sock_set_state", self.sock_state), e))?;
        for (name, event) in program::RAW_TRACEPOINTS {
            Self::program::<RawTracePoint>(self.object()?, name)?
                .attach(event)
                .map_err(|e| Error::program(format!("attach raw tracepoint sock:{event}"), e))?;
        }
        Ok(())
    }

    /// Under a node's shared object, attaches its program (TC, which tells
    /// the pods' namespaces apart) to every one of `ifaces` in one turn among
    /// the pods: a pod is gated once its last is, and no later pod's come
    /// between. False without a shared object (nothing attached).
    pub(crate) fn attach_shared(&mut self, ifaces: &[&str]) -> Result<bool, Error> {
        let Some(shared) = &self.shared else { return Ok(false) };
        self.shared_links.extend(shared.attach_tc(ifaces)?);
        Ok(true)
    }

    /// Attaches the gate to `iface`. Links are owned by this process: when it
    /// exits, however it exits, the kernel detaches them and traffic flows
    /// ungated (fail-open).
    pub(crate) fn attach_gate(&mut self, iface: &str, hook: Hook, xdp_mode: XdpAttachMode) -> Result<(), Error> {
        system::check_interface(iface)?;
        if self.attach_shared(&[iface])? {
            return Ok(());
        }
        let mode = match xdp_mode {
            XdpAttachMode::Auto => XdpMode::Default,
            XdpAttachMode::Native => XdpMode::Driver,
            XdpAttachMode::Generic => XdpMode::Skb,
        };
        match hook {
            Hook::Xdp => {
                let attached = self.xdp()?.attach(iface, mode);
                let attached = match attached {
                    // auto: a driver that has native XDP but refuses it here (virtio_net
                    // while the guest's offloads are on, the most common cloud NIC; a
                    // veth whose MTU is too large) gets generic XDP, which every device
                    // has: the same program and decisions, after the kernel's skb.
                    Err(native) if xdp_mode == XdpAttachMode::Auto => {
                        tracing::warn!(
                            iface = %iface,
                            driver = %system::driver(iface).unwrap_or_default(),
                            "native XDP refused ({}); gating with generic XDP instead (--xdp-mode generic says so, --hook tc uses TC)",
                            crate::error::chain(&native)
                        );
                        self.xdp()?.attach(iface, XdpMode::Skb)
                    }
                    other => other,
                };
                attached.map_err(|e| {
                    Error::program(
                        format!(
                            "attach XDP (--xdp-mode {}) to {iface} (if its driver has no native XDP, use --xdp-mode generic or --hook tc)",
                            crate::named::Named::name(xdp_mode)
                        ),
                        e,
                    )
                })?;
            }
            Hook::Tc => {
                self.tc()?
                    .attach(iface, TcAttachType::Ingress)
                    .map_err(|e| Error::program(format!("attach TC ingress to {iface}"), e))?;
            }
        }
        Ok(())
    }
}

/// The node's shared object, as a pod's gate sees it (kept a trait here so
/// that this module, which the dispatcher loads through, does not import it).
pub trait SharedJudge: Send + Sync {
    /// Attaches the shared TC program to `ifaces` of this thread's
    /// namespace, in one turn among the pods; each until what it returns
    /// for it is dropped.
    fn attach_tc(&self, ifaces: &[&str]) -> Result<Vec<Box<dyn Send>>, Error>;
}

/// A gate's kernel object, its programs verified and its maps not yet
/// pinned or written: [`Loaded::prepare`], for [`Loaded::from_prepared`]. A
/// node agent keeps one for the next pod, so a new pod's gate is set up in
/// the time it takes to attach, not to verify.
pub struct Prepared {
    ebpf: Ebpf,
    options: object::LoadOptions,
    hook: Hook,
}

impl Prepared {
    /// Whether it is what a gate loaded with `options` and attached at `hook` would load.
    pub fn fits(&self, options: object::LoadOptions, hook: Hook) -> bool {
        self.options == options && self.hook == hook
    }
}

/// The hook for an interface when the operator did not pick one: XDP where
/// it runs before the stack; TC on loopback (generic XDP there sees the skb
/// anyway) and on veth (XDP_TX replies reach the peer only if the peer runs
/// an XDP program, which shed cannot promise).
pub(crate) fn default_hook(iface: &str) -> Hook {
    let driver = system::driver(iface);
    if iface == "lo" || driver.as_deref() == Some("veth") { Hook::Tc } else { Hook::Xdp }
}

/// How often a load is tried when signals keep interrupting the verifier (libbpf's count).
const VERIFIER_ATTEMPTS: u32 = 5;

/// Loads a program through the verifier, with this thread's signals held,
/// and again when it was interrupted anyway. The verifier gives up with EAGAIN
/// when a signal is pending on the loading thread (it checks between
/// instructions), and a gate's programs take it a second or more. A node
/// agent setting up many pods at once saw one pod in fifty left ungated by
/// it (B10): each gate thread runs `nft` and `iptables-save`, glibc's
/// posix_spawn holds every signal while it starts one, so a SIGCHLD that
/// would be ignored is queued meanwhile and handed to another thread, maybe
/// one in the verifier. libbpf and cilium/ebpf try again; aya 0.14 does not.
///
/// At most one program per CPU is in the verifier at once, process-wide: a
/// node agent starting beside a node's pods sets up every pod's gate at once,
/// and verifiers that outnumber the CPUs take more CPU each, not less time
/// (one gate object: 1.6 CPU-s alone, 1.75 each two at a time, 2.4 each
/// eight at a time, on 2 CPUs).
pub(crate) fn verified(mut load: impl FnMut() -> Result<(), ProgramError>) -> Result<(), ProgramError> {
    let _turn = VerifierTurn::take();
    let _held = SignalsHeld::new();
    let mut attempt = 1;
    loop {
        match load() {
            Err(ProgramError::LoadError { io_error, .. })
                if io_error.kind() == std::io::ErrorKind::WouldBlock && attempt < VERIFIER_ATTEMPTS =>
            {
                tracing::debug!(attempt, "the verifier was interrupted (a signal): loading again");
                attempt += 1;
            }
            done => return done,
        }
    }
}

/// A turn in the verifier (see [`verified`]), given back when dropped.
struct VerifierTurn;

/// Programs in the verifier now, and the wake-up of a thread waiting for a turn.
static IN_VERIFIER: std::sync::Mutex<usize> = std::sync::Mutex::new(0);
static TURN_FREED: std::sync::Condvar = std::sync::Condvar::new();

impl VerifierTurn {
    /// Waits until fewer programs than CPUs are in the verifier.
    fn take() -> Self {
        let most = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
        let mut busy = IN_VERIFIER.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        while *busy >= most {
            busy = TURN_FREED.wait(busy).unwrap_or_else(std::sync::PoisonError::into_inner);
        }
        *busy += 1;
        Self
    }
}

impl Drop for VerifierTurn {
    fn drop(&mut self) {
        let mut busy = IN_VERIFIER.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        *busy = busy.saturating_sub(1);
        TURN_FREED.notify_one();
    }
}

/// This thread's signals blocked until dropped: a signal for the process
/// goes to another thread meanwhile (the daemon's SIGTERM and SIGHUP are
/// handled by whichever thread takes them), one for this thread waits.
/// SIGKILL cannot be blocked, so a killed loader still stops at once.
struct SignalsHeld(Option<libc::sigset_t>, std::marker::PhantomData<*const ()>);

impl SignalsHeld {
    fn new() -> Self {
        // SAFETY: sigset_t is plain data that sigfillset initialises, and
        // pthread_sigmask only reads `all` and writes `before`.
        unsafe {
            let mut all: libc::sigset_t = std::mem::zeroed();
            let mut before: libc::sigset_t = std::mem::zeroed();
            libc::sigfillset(&raw mut all);
            let held = libc::pthread_sigmask(libc::SIG_BLOCK, &raw const all, &raw mut before) == 0;
            Self(held.then_some(before), std::marker::PhantomData)
        }
    }
}

impl Drop for SignalsHeld {
    fn drop(&mut self) {
        if let Some(before) = self.0 {
            // SAFETY: restores the mask read in `new`, on the same thread (the guard is not Send).
            unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &raw const before, std::ptr::null_mut()) };
        }
    }
}

#[cfg(test)]
mod tests {
    use std::{cell::Cell, io};

    use super::*;

    fn load_error(errno: i32) -> ProgramError {
        ProgramError::LoadError {
            io_error: io::Error::from_raw_os_error(errno),
            verifier_log: aya_obj::VerifierLog::new(String::new()),
        }
    }

    #[test]
    fn an_interrupted_verifier_is_tried_again() {
        let calls = Cell::new(0);
        let outcome = verified(|| {
            calls.set(calls.get() + 1);
            if calls.get() < 3 { Err(load_error(libc::EAGAIN)) } else { Ok(()) }
        });
        assert!(outcome.is_ok(), "{outcome:?}");
        assert_eq!(calls.get(), 3);
    }

    /// Whether `signal` is blocked on this thread.
    fn blocked(signal: i32) -> bool {
        // SAFETY: reads this thread's mask into a zeroed set.
        unsafe {
            let mut now: libc::sigset_t = std::mem::zeroed();
            libc::pthread_sigmask(libc::SIG_BLOCK, std::ptr::null(), &raw mut now);
            libc::sigismember(&raw const now, signal) == 1
        }
    }

    #[test]
    fn signals_wait_while_the_verifier_runs() {
        assert!(!blocked(libc::SIGCHLD) && !blocked(libc::SIGTERM), "the test thread starts with none held");
        let held_during = std::cell::Cell::new((false, false));
        verified(|| {
            held_during.set((blocked(libc::SIGCHLD), blocked(libc::SIGHUP)));
            Ok(())
        })
        .unwrap();
        assert_eq!(held_during.get(), (true, true), "held while loading");
        assert!(!blocked(libc::SIGCHLD) && !blocked(libc::SIGHUP), "given back after");
    }

    #[test]
    fn the_tries_are_bounded_and_other_errors_are_final() {
        let calls = Cell::new(0);
        let always_interrupted = verified(|| {
            calls.set(calls.get() + 1);
            Err(load_error(libc::EAGAIN))
        });
        assert!(matches!(always_interrupted, Err(ProgramError::LoadError { .. })));
        assert_eq!(calls.get(), VERIFIER_ATTEMPTS);
        calls.set(0);
        let refused = verified(|| {
            calls.set(calls.get() + 1);
            Err(load_error(libc::EACCES))
        });
        assert!(refused.is_err());
        assert_eq!(calls.get(), 1, "a verdict of the verifier is not asked twice");
    }
}
