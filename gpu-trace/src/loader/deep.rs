//! Deep hooks on the AMD KFD driver: attach to `amdgpu.ko`'s own functions where the running
//! kernel allows it, per event, cheapest first, and say what was chosen and why the rest was
//! not.
//!
//! | event | trampoline (module BTF) | kprobe | otherwise |
//! |---|---|---|---|
//! | KFD ioctl events (per handler) | `fexit/kfd_ioctl_<cmd>` | kprobe + kretprobe | syscall layer |
//! | queue details at creation (per function) | `fexit/create_queue_cpsch`, `fexit/create_queue_nocpsch` | kprobe + kretprobe | (not shown) |
//! | MQD built | never (`init_mqd`, `init_mqd_sdma` have several copies: a trampoline would take one silently) | one kprobe per copy, by address | (not shown) |
//! | queue teardown | `fentry/pqm_uninit` | kprobe | process exit (implicit) |
//!
//! What the kernel programs need (struct offsets, parameter positions, the size of the
//! kernel's `CREATE_QUEUE` arguments) comes from `/sys/kernel/btf/amdgpu` read on top of
//! vmlinux's BTF, and function addresses from `/proc/kallsyms`. Each hook that cannot get what
//! it needs is left out with the reason; none of this stops tracing.

use aya::{Ebpf, programs::KProbe};
use gpu_trace_common::{KfdDeepConfig, amd::nr};

use super::{
    DeepAttach, Hook, err,
    trampoline::{self, Attached, ModulePrograms, Trampoline},
};
use crate::probe::{
    btf::{self, Btf},
    kallsyms::ModuleSymbols,
    trial,
};
use crate::targets::{
    self, DQM_CREATE, DeepTarget, KFD_HANDLERS, MQD_INIT, MQD_INIT_PROGRAM, PQM_UNINIT,
};

/// The driver module the deep hooks attach to.
pub const MODULE: &str = targets::AMD_MODULE;

/// A loaded module whose functions deep hooks attach to: its symbols and, when it has BTF, its
/// split BTF on vmlinux's.
pub struct ModuleTargets {
    pub module: String,
    /// vmlinux + module BTF, when the module has BTF.
    btf: Option<Btf>,
    /// Why the module's BTF could not be used (trampolines then cannot attach).
    btf_missing: Option<String>,
    symbols: ModuleSymbols,
}

impl ModuleTargets {
    /// Reads `module`'s symbols and BTF (split on `vmlinux`); fails when the module is not
    /// loaded.
    pub fn read(module: &str, vmlinux: &Btf) -> Result<Self, String> {
        let symbols = ModuleSymbols::load(module).map_err(|e| e.to_string())?;
        if symbols.is_empty() {
            return Err(format!(
                "the {module} module is not loaded (no symbols in /proc/kallsyms)"
            ));
        }
        let (btf, btf_missing) = match read_module_btf(module, vmlinux) {
            Ok(b) => (Some(b), None),
            Err(why) => (None, Some(why)),
        };
        Ok(Self {
            module: module.to_string(),
            btf,
            btf_missing,
            symbols,
        })
    }

    /// Whether the module has a text symbol `func`.
    pub fn defines(&self, func: &str) -> bool {
        !self.symbols.addresses(func).is_empty()
    }

    /// Prepares attaching to this module's functions from the loaded programs in `ebpf`.
    pub(super) fn attacher(&self, ebpf: &Ebpf, via: DeepAttach) -> Attacher<'_> {
        let trampolines = match (via, &self.btf_missing) {
            (DeepAttach::Kprobe, _) => Err("not tried (--deep-attach kprobe)".to_string()),
            (_, Some(why)) => Err(why.clone()),
            (_, None) => trampoline::module_btf_fd(&self.module)
                .and_then(|fd| ModulePrograms::new(super::PROGRAMS, ebpf).map(|p| (fd, p))),
        };
        let kprobes = match (via, trial::kprobe_pmu_type()) {
            (DeepAttach::Trampoline, _) => Err("not tried (--deep-attach trampoline)".to_string()),
            (_, Some(_)) => Ok(()),
            (_, None) => Err(format!(
                "no kprobe PMU ({} is missing: CONFIG_KPROBES off)",
                trial::KPROBE_PMU_TYPE
            )),
        };
        Attacher {
            targets: self,
            trampolines,
            kprobes,
        }
    }
}

/// What the deep hooks could learn about this kernel and driver before load.
pub struct KfdDeepPlan {
    /// For the kernel programs' `KFD_DEEP` global (`ready` is 0 when nothing can attach).
    pub config: KfdDeepConfig,
    targets: ModuleTargets,
    /// Per hook group: why its configuration could not be resolved.
    queue_config_missing: Option<String>,
    release_config_missing: Option<String>,
    mqd_config_missing: Option<String>,
}

/// What [`attach`] attached.
#[derive(Default)]
pub struct DeepHooks {
    pub hooks: Vec<Hook>,
    pub refused: Vec<String>,
    /// Bit `1 << nr` for each KFD command whose handler is hooked: the syscall layer leaves
    /// these alone.
    pub handler_mask: u32,
    /// Trampolines attached outside Aya (detached when dropped).
    trampolines: Vec<Attached>,
}

impl DeepHooks {
    /// Keeps a trampoline attached for as long as the tracer runs.
    pub(super) fn keep(&mut self, t: Attached) {
        self.trampolines.push(t);
    }

    /// The trampolines attached outside Aya (their programs are not in `Ebpf`'s list).
    pub(super) fn trampolines(&self) -> &[Attached] {
        &self.trampolines
    }

    /// Detaches the trampolines attached outside Aya.
    pub(super) fn detach(&mut self) {
        self.trampolines.clear();
    }
}

impl KfdDeepPlan {
    /// Reads the module's BTF (split on `vmlinux`) and symbols; fails (with the reason) when
    /// `amdgpu` is not loaded.
    pub fn prepare(vmlinux: &Btf) -> Result<Self, String> {
        let mut plan = Self {
            config: KfdDeepConfig::default(),
            targets: ModuleTargets::read(MODULE, vmlinux)?,
            queue_config_missing: None,
            release_config_missing: None,
            mqd_config_missing: None,
        };
        plan.resolve();
        plan.config.ready = 1;
        Ok(plan)
    }

    fn resolve(&mut self) {
        let Some(btf) = self.targets.btf.as_ref() else {
            let why = "no module BTF to read offsets from".to_string();
            // Without BTF only the handlers can still be hooked (by kprobe): their arguments
            // need no offsets. CREATE_QUEUE's stays on the syscall layer, since the size of the
            // kernel's copy of its arguments (88 or 96 bytes) is unknown (`create_args_size` 0).
            self.queue_config_missing = Some(why.clone());
            self.release_config_missing = Some(why.clone());
            self.mqd_config_missing = Some(why);
            return;
        };
        let c = &mut self.config;
        let m = |s: &str, f: &str| btf.member_offset(s, f).map_err(|e| e.to_string());
        c.create_args_size = btf.struct_size("kfd_ioctl_create_queue_args").unwrap_or(0);
        let props = (|| -> Result<(), String> {
            c.qp_type = m("queue_properties", "type")?;
            c.qp_format = m("queue_properties", "format")?;
            c.qp_queue_id = m("queue_properties", "queue_id")?;
            c.qp_queue_address = m("queue_properties", "queue_address")?;
            c.qp_queue_size = m("queue_properties", "queue_size")?;
            c.qp_priority = m("queue_properties", "priority")?;
            c.qp_percent = m("queue_properties", "queue_percent")?;
            c.qp_doorbell_off = m("queue_properties", "doorbell_off")?;
            c.qp_is_active = m("queue_properties", "is_active")?;
            c.qp_vmid = m("queue_properties", "vmid")?;
            Ok(())
        })();
        let param = |func: &str, name: &str| -> Result<u32, String> {
            let (at, _) = btf.func_param(func, name).map_err(|e| e.to_string())?;
            if at > 5 {
                return Err(format!(
                    "{func}'s {name} is parameter {at}, past the six in registers"
                ));
            }
            Ok(at)
        };
        self.queue_config_missing = props
            .clone()
            .and_then(|()| {
                c.queue_properties = m("queue", "properties")?;
                // Both DQM implementations share the `create_queue` op's prototype.
                let at = param(DQM_CREATE[0].func, "q")?;
                if let Ok(other) = param(DQM_CREATE[1].func, "q")
                    && other != at
                {
                    return Err(format!(
                        "{} and {} take `q` at different positions",
                        DQM_CREATE[0].func, DQM_CREATE[1].func
                    ));
                }
                if at > 2 {
                    return Err(format!(
                        "{}'s `q` is parameter {at}; the programs read the first three",
                        DQM_CREATE[0].func
                    ));
                }
                c.dqm_create_q_arg = at;
                Ok(())
            })
            .err();
        self.mqd_config_missing = props
            .and_then(|()| {
                // From init_mqd's own BTF; where BTF has no such function (newer pahole leaves
                // out a static function several files define: Debian's 7.2 kernel), from the
                // MQD manager's `init_mqd` operation, which every copy implements.
                c.init_mqd_q_arg = param(MQD_INIT[0], "q").or_else(|own| {
                    match btf.member_fn_param("mqd_manager", MQD_INIT[0], "queue_properties") {
                        Ok((at, _)) if at <= 5 => Ok(at),
                        Ok((at, _)) => Err(format!(
                            "mqd_manager.{}'s q is parameter {at}, past the six in registers",
                            MQD_INIT[0]
                        )),
                        Err(e) => Err(format!("{own}; {e}")),
                    }
                })?;
                Ok(())
            })
            .err();
        self.release_config_missing = (|| -> Result<(), String> {
            c.pqm_process = m("process_queue_manager", "process")?;
            c.process_lead_thread = m("kfd_process", "lead_thread")?;
            c.task_tgid = m("task_struct", "tgid")?;
            Ok(())
        })()
        .err();
    }
}

fn read_module_btf(module: &str, base: &Btf) -> Result<Btf, String> {
    let path = btf::module_btf_path(module);
    let bytes = btf::read_module_btf(module).map_err(|e| {
        format!("{path}: {e} (the module was built without BTF: CONFIG_DEBUG_INFO_BTF_MODULES)")
    })?;
    Btf::from_split(base, &bytes).map_err(|e| format!("{path}: {e}"))
}

/// Attaches Aya kprobe program `program` to `target` (a symbol, or "" with an address in
/// `addr`), loading it on first use.
fn kprobe(ebpf: &mut Ebpf, program: &str, target: &str, addr: u64) -> Result<(), String> {
    let prog: &mut KProbe = ebpf
        .program_mut(program)
        .ok_or("program missing")?
        .try_into()
        .map_err(err)?;
    if prog.fd().is_err() {
        prog.load().map_err(err)?;
    }
    prog.attach(target, addr).map(drop).map_err(err)
}

pub(super) struct Attacher<'a> {
    targets: &'a ModuleTargets,
    /// The module's BTF object and the relocated programs, or why trampolines cannot be used.
    trampolines: Result<(std::os::fd::OwnedFd, ModulePrograms), String>,
    kprobes: Result<(), String>,
}

impl Attacher<'_> {
    /// A trampoline on `func`: refused for names with several copies (the kernel would pick
    /// one of them without saying so).
    pub(super) fn trampoline(
        &self,
        program: &str,
        kind: Trampoline,
        func: &str,
    ) -> Result<Attached, String> {
        let (fd, programs) = self.trampolines.as_ref().map_err(Clone::clone)?;
        let copies = self.targets.symbols.addresses(func).len();
        if copies > 1 {
            return Err(format!(
                "{copies} functions are named {func}: a trampoline would take one"
            ));
        }
        let btf = self.targets.btf.as_ref().ok_or("no module BTF")?;
        let id = btf.func_id(func).map_err(|e| e.to_string())?;
        programs.attach(program, kind, fd, id)
    }

    pub(super) fn kprobe_ok(&self, func: &str) -> Result<(), String> {
        self.kprobes.clone()?;
        match self.targets.symbols.addresses(func).len() {
            0 => Err(format!(
                "{func} is not in /proc/kallsyms (inlined or renamed in this build)"
            )),
            1 => Ok(()),
            n => Err(format!(
                "{n} functions are named {func}: by name the kernel refuses it"
            )),
        }
    }
}

impl Attacher<'_> {
    /// Hooks each target, a trampoline of `kind` first, else its kprobes, and reports under
    /// `event`: one hook line per attach type used, one refusal line per attach type refused.
    /// Returns the functions hooked, in order.
    pub(super) fn attach_each(
        &self,
        ebpf: &mut Ebpf,
        out: &mut DeepHooks,
        event: &'static str,
        kind: Trampoline,
        targets: &[DeepTarget],
    ) -> Vec<&'static str> {
        let tramp = match kind {
            Trampoline::Entry => "fentry",
            Trampoline::Exit => "fexit",
        };
        let mut by_trampoline = Vec::new();
        let mut by_kprobe = Vec::new();
        let mut probe_label = "kprobe";
        for t in targets {
            match self.trampoline(t.trampoline, kind, t.func) {
                Ok(a) => {
                    out.keep(a);
                    by_trampoline.push(t.func);
                    continue;
                }
                Err(why) => out
                    .refused
                    .push(format!("{event}: {tramp}/{}: {why}", t.func)),
            }
            let probes = self.kprobe_ok(t.func).and_then(|()| {
                t.kprobes
                    .iter()
                    .try_for_each(|p| kprobe(ebpf, p, t.func, 0))
            });
            match probes {
                Ok(()) => by_kprobe.push(t.func),
                Err(why) => out
                    .refused
                    .push(format!("{event}: kprobe/{}: {why}", t.func)),
            }
            if t.kprobes.len() > 1 {
                probe_label = "kprobe+kretprobe";
            }
        }
        let module = &self.targets.module;
        if !by_trampoline.is_empty() {
            out.hooks.push(Hook {
                event,
                attach: format!("{tramp}/{{{}}} ({module} BTF)", by_trampoline.join(",")),
            });
        }
        if !by_kprobe.is_empty() {
            out.hooks.push(Hook {
                event,
                attach: format!("{probe_label}/{{{}}} (in {module})", by_kprobe.join(",")),
            });
        }
        by_trampoline.into_iter().chain(by_kprobe).collect()
    }
}

/// Attaches every deep hook this kernel allows. Call after the programs are loaded and before
/// the syscall hook is attached. `handlers` false leaves the ioctl handlers to the syscall
/// layer (`--deny-pid`: a refused call never reaches the driver, and must still be seen).
pub fn attach(ebpf: &mut Ebpf, plan: &KfdDeepPlan, handlers: bool, via: DeepAttach) -> DeepHooks {
    let mut out = DeepHooks::default();
    let a = plan.targets.attacher(ebpf, via);

    attach_ioctl_handlers(ebpf, &a, plan, handlers, &mut out);

    // Queue details at creation: both DQM implementations (only one runs).
    if let Some(why) = &plan.queue_config_missing {
        out.refused.push(format!(
            "AMD queue details: {}: {why}",
            DQM_CREATE.map(|t| t.func).join(", ")
        ));
    } else {
        a.attach_each(
            ebpf,
            &mut out,
            "AMD queue details",
            Trampoline::Exit,
            &DQM_CREATE,
        );
    }

    // MQD init: every copy of every builder, by address.
    if let Some(why) = &plan.mqd_config_missing {
        out.refused.push(format!("AMD MQD init: {why}"));
    } else if let Err(why) = a.kprobes.clone() {
        out.refused.push(format!("AMD MQD init: kprobes: {why}"));
    } else {
        attach_mqd_init(ebpf, plan, &mut out);
    }

    // Queue teardown.
    if let Some(why) = &plan.release_config_missing {
        out.refused
            .push(format!("AMD queue teardown: {}: {why}", PQM_UNINIT.func));
    } else {
        a.attach_each(
            ebpf,
            &mut out,
            "AMD queue teardown",
            Trampoline::Entry,
            &[PQM_UNINIT],
        );
    }
    out
}

/// The KFD ioctl handlers: each one hooked takes its command away from the syscall layer
/// (its bit in `handler_mask`).
fn attach_ioctl_handlers(
    ebpf: &mut Ebpf,
    a: &Attacher<'_>,
    plan: &KfdDeepPlan,
    handlers: bool,
    out: &mut DeepHooks,
) {
    if !handlers {
        out.refused.push(
            "AMD ioctl events: driver handlers not used: --deny-pid refuses calls before they \
             reach the driver, so the syscall layer serves them"
                .into(),
        );
    }
    // CREATE_QUEUE's record needs the kernel's size of its arguments, from the module's BTF.
    let create_unknown = plan.config.create_args_size == 0;
    if handlers && create_unknown {
        out.refused.push(
            "AMD ioctl events: kfd_ioctl_create_queue: the size of struct \
             kfd_ioctl_create_queue_args is unknown without the module's BTF; the syscall layer \
             serves CREATE_QUEUE"
                .into(),
        );
    }
    let targets: Vec<DeepTarget> = KFD_HANDLERS
        .iter()
        .filter(|h| handlers && !(create_unknown && h.cmd == nr::CREATE_QUEUE))
        .map(|h| h.target)
        .collect();
    for func in a.attach_each(ebpf, out, "AMD ioctl events", Trampoline::Exit, &targets) {
        if let Some(h) = KFD_HANDLERS.iter().find(|h| h.target.func == func) {
            out.handler_mask |= 1 << h.cmd;
        }
    }
}

/// The MQD builders, by kprobe on every copy's address; one hook line naming, per copy, the
/// nearest unique symbol below it (which generation's it is).
fn attach_mqd_init(ebpf: &mut Ebpf, plan: &KfdDeepPlan, out: &mut DeepHooks) {
    let mut parts = Vec::new();
    for func in MQD_INIT {
        let addrs = plan.targets.symbols.addresses(func).to_vec();
        if addrs.is_empty() {
            out.refused.push(format!(
                "AMD MQD init: {func} is not in /proc/kallsyms (not in this build, or inlined)"
            ));
            continue;
        }
        let mut attached = 0;
        for &addr in &addrs {
            match kprobe(ebpf, MQD_INIT_PROGRAM, "", addr) {
                Ok(()) => attached += 1,
                Err(why) => out
                    .refused
                    .push(format!("AMD MQD init: kprobe/{func}@{addr:#x}: {why}")),
            }
        }
        if attached > 0 {
            parts.push(format!("{func} ×{attached}/{}", addrs.len()));
        }
    }
    if parts.is_empty() {
        return;
    }
    let near: Vec<String> = plan
        .targets
        .symbols
        .addresses(MQD_INIT[0])
        .iter()
        .map(
            |&addr| match plan.targets.symbols.neighbour_below(addr, MQD_INIT[0]) {
                Some(n) => format!("{addr:#x} near {n}"),
                None => format!("{addr:#x}"),
            },
        )
        .collect();
    out.hooks.push(Hook {
        event: "AMD MQD init",
        attach: format!(
            "kprobe by address: {} ({} copies: {})",
            parts.join(", "),
            MQD_INIT[0],
            near.join(", ")
        ),
    });
}
