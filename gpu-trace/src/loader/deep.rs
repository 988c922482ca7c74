//! Deep hooks on the AMD KFD driver: attach to `amdgpu.ko`'s own functions where the running
//! kernel allows it, per event, cheapest first, and say what was chosen and why the rest was
//! not.
//!
//! | event | trampoline (module BTF) | kprobe | otherwise |
//! |---|---|---|---|
//! | KFD ioctl events (per handler) | `fexit/kfd_ioctl_<cmd>` | kprobe + kretprobe | syscall layer |
//! | queue details at creation | `fexit/pqm_create_queue` | kprobe + kretprobe | (not shown) |
//! | MQD built | never (`init_mqd` has several copies: a trampoline would take one silently) | one kprobe per copy, by address | (not shown) |
//! | queue teardown | `fentry/pqm_uninit` | kprobe | process exit (implicit) |
//!
//! What the kernel programs need (struct offsets, parameter positions, the size of the
//! kernel's `CREATE_QUEUE` arguments) comes from `/sys/kernel/btf/amdgpu` read on top of
//! vmlinux's BTF, and function addresses from `/proc/kallsyms`. Each hook that cannot get what
//! it needs is left out with the reason; none of this stops tracing.

use std::path::Path;

use aya::{Ebpf, programs::KProbe};
use gpu_trace_common::{KfdDeepConfig, amd::nr};

use super::{Hook, err, trampoline::{self, Attached, ModulePrograms, Trampoline}};
use crate::probe::{btf::{Btf, VMLINUX_BTF_PATH}, kallsyms::ModuleSymbols, trial};

/// The driver module the deep hooks attach to.
pub const MODULE: &str = "amdgpu";

/// What the deep hooks could learn about this kernel and driver before load.
pub struct KfdDeepPlan {
    /// For the kernel programs' `KFD_DEEP` global (`ready` is 0 when nothing can attach).
    pub config: KfdDeepConfig,
    /// vmlinux + amdgpu BTF, when the module has BTF.
    btf: Option<Btf>,
    /// Why the module's BTF could not be used (trampolines then cannot attach).
    btf_missing: Option<String>,
    symbols: ModuleSymbols,
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

impl KfdDeepPlan {
    /// Reads the module's BTF and symbols. `None` (with the reason) when `amdgpu` is not loaded.
    pub fn prepare() -> Result<Self, String> {
        let symbols = ModuleSymbols::load(MODULE).map_err(|e| e.to_string())?;
        if symbols.is_empty() {
            return Err(format!("the {MODULE} module is not loaded (no symbols in /proc/kallsyms)"));
        }
        let (btf, btf_missing) = match read_module_btf() {
            Ok(b) => (Some(b), None),
            Err(why) => (None, Some(why)),
        };
        let mut plan = Self {
            config: KfdDeepConfig::default(),
            btf,
            btf_missing,
            symbols,
            queue_config_missing: None,
            release_config_missing: None,
            mqd_config_missing: None,
        };
        plan.resolve();
        plan.config.ready = 1;
        Ok(plan)
    }

    fn resolve(&mut self) {
        let Some(btf) = self.btf.as_ref() else {
            let why = "no module BTF to read offsets from".to_string();
            // The handlers' own arguments need no offsets; the 88/96-byte question is settled
            // by the UAPI size the handler copies: assume the struct the kernel's BTF would
            // give only when it can be read.
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
                return Err(format!("{func}'s {name} is parameter {at}, past the six in registers"));
            }
            Ok(at)
        };
        self.queue_config_missing = props.clone().and_then(|()| {
            c.pqm_create_properties_arg = param("pqm_create_queue", "properties")?;
            c.pqm_create_qid_arg = param("pqm_create_queue", "qid")?;
            Ok(())
        }).err();
        self.mqd_config_missing = props.and_then(|()| {
            c.init_mqd_q_arg = param("init_mqd", "q")?;
            Ok(())
        }).err();
        self.release_config_missing = (|| -> Result<(), String> {
            c.pqm_process = m("process_queue_manager", "process")?;
            c.process_lead_thread = m("kfd_process", "lead_thread")?;
            c.task_tgid = m("task_struct", "tgid")?;
            Ok(())
        })()
        .err();
    }
}

fn read_module_btf() -> Result<Btf, String> {
    let path = format!("/sys/kernel/btf/{MODULE}");
    let bytes = std::fs::read(&path).map_err(|e| {
        format!("{path}: {e} (the module was built without BTF: CONFIG_DEBUG_INFO_BTF_MODULES)")
    })?;
    let base = Btf::from_path(Path::new(VMLINUX_BTF_PATH)).map_err(|e| e.to_string())?;
    Btf::from_split(&base, &bytes).map_err(|e| format!("{path}: {e}"))
}

/// The handlers: (function, fexit program, kretprobe program, KFD command number).
const HANDLERS: [(&str, &str, &str, u32); 4] = [
    ("kfd_ioctl_create_queue", "kfd_create_queue_fexit", "kfd_create_queue_kret", nr::CREATE_QUEUE),
    ("kfd_ioctl_destroy_queue", "kfd_destroy_queue_fexit", "kfd_destroy_queue_kret", nr::DESTROY_QUEUE),
    ("kfd_ioctl_update_queue", "kfd_update_queue_fexit", "kfd_update_queue_kret", nr::UPDATE_QUEUE),
    ("kfd_ioctl_set_cu_mask", "kfd_set_cu_mask_fexit", "kfd_set_cu_mask_kret", nr::SET_CU_MASK),
];

/// Attaches Aya kprobe program `program` to `target` (a symbol, or "" with an address in
/// `addr`), loading it on first use.
fn kprobe(ebpf: &mut Ebpf, program: &str, target: &str, addr: u64) -> Result<(), String> {
    let prog: &mut KProbe = ebpf.program_mut(program).ok_or("program missing")?.try_into().map_err(err)?;
    if prog.fd().is_err() {
        prog.load().map_err(err)?;
    }
    prog.attach(target, addr).map(drop).map_err(err)
}

struct Attacher<'a> {
    plan: &'a KfdDeepPlan,
    /// The module's BTF object and the relocated programs, or why trampolines cannot be used.
    trampolines: Result<(std::os::fd::OwnedFd, ModulePrograms), String>,
    kprobes: Result<(), String>,
}

impl Attacher<'_> {
    /// A trampoline on `func`: refused for names with several copies (the kernel would pick
    /// one of them without saying so).
    fn trampoline(&self, program: &str, kind: Trampoline, func: &str) -> Result<Attached, String> {
        let (fd, programs) = self.trampolines.as_ref().map_err(Clone::clone)?;
        let copies = self.plan.symbols.addresses(func).len();
        if copies > 1 {
            return Err(format!("{copies} functions are named {func}: a trampoline would take one"));
        }
        let btf = self.plan.btf.as_ref().ok_or("no module BTF")?;
        let id = btf.func_id(func).map_err(|e| e.to_string())?;
        programs.attach(program, kind, fd, id)
    }

    fn kprobe_ok(&self, func: &str) -> Result<(), String> {
        self.kprobes.clone()?;
        match self.plan.symbols.addresses(func).len() {
            0 => Err(format!("{func} is not in /proc/kallsyms (inlined or renamed in this build)")),
            1 => Ok(()),
            n => Err(format!("{n} functions are named {func}: by name the kernel refuses it")),
        }
    }
}

/// Attaches every deep hook this kernel allows. Call after the programs are loaded and before
/// the syscall hook is attached. `handlers` false leaves the ioctl handlers to the syscall
/// layer (`--deny-pid`: a refused call never reaches the driver, and must still be seen).
pub fn attach(ebpf: &mut Ebpf, plan: &KfdDeepPlan, handlers: bool) -> DeepHooks {
    let mut out = DeepHooks::default();
    let trampolines = match (&plan.btf_missing, trampoline::module_btf_fd(MODULE)) {
        (Some(why), _) => Err(why.clone()),
        (None, Err(why)) => Err(why),
        (None, Ok(fd)) => ModulePrograms::new(super::PROGRAMS, ebpf).map(|p| (fd, p)),
    };
    let kprobes = match trial::kprobe_pmu_type() {
        Some(_) => Ok(()),
        None => Err(format!("no kprobe PMU ({} is missing: CONFIG_KPROBES off)", trial::KPROBE_PMU_TYPE)),
    };
    let a = Attacher { plan, trampolines, kprobes };

    // The ioctl handlers: each one hooked takes its command away from the syscall layer.
    let mut by_trampoline = Vec::new();
    let mut by_kprobe = Vec::new();
    if !handlers {
        out.refused.push(
            "AMD ioctl events: driver handlers not used: --deny-pid refuses calls before they \
             reach the driver, so the syscall layer serves them"
                .into(),
        );
    }
    for (func, fexit, kret, cmd) in HANDLERS.into_iter().filter(|_| handlers) {
        if plan.config.create_args_size == 0 && cmd == nr::CREATE_QUEUE {
            out.refused.push(format!(
                "AMD ioctl events: {func}: the size of struct kfd_ioctl_create_queue_args is \
                 unknown without the module's BTF; the syscall layer serves CREATE_QUEUE"
            ));
            continue;
        }
        match a.trampoline(fexit, Trampoline::Exit, func) {
            Ok(t) => {
                out.trampolines.push(t);
                by_trampoline.push(func);
                out.handler_mask |= 1 << cmd;
                continue;
            }
            Err(why) => out.refused.push(format!("AMD ioctl events: fexit/{func}: {why}")),
        }
        let probes = a.kprobe_ok(func).and_then(|()| {
            kprobe(ebpf, "kfd_handler_entry", func, 0)?;
            kprobe(ebpf, kret, func, 0)
        });
        match probes {
            Ok(()) => {
                by_kprobe.push(func);
                out.handler_mask |= 1 << cmd;
            }
            Err(why) => out.refused.push(format!("AMD ioctl events: kprobe/{func}: {why}")),
        }
    }
    if !by_trampoline.is_empty() {
        out.hooks.push(Hook {
            event: "AMD ioctl events",
            attach: format!("fexit/{{{}}} ({MODULE} BTF)", by_trampoline.join(",")),
        });
    }
    if !by_kprobe.is_empty() {
        out.hooks.push(Hook {
            event: "AMD ioctl events",
            attach: format!("kprobe+kretprobe/{{{}}}", by_kprobe.join(",")),
        });
    }

    // Queue details at creation.
    let func = "pqm_create_queue";
    if let Some(why) = &plan.queue_config_missing {
        out.refused.push(format!("AMD queue details: {func}: {why}"));
    } else {
        match a.trampoline("pqm_create_fexit", Trampoline::Exit, func) {
            Ok(t) => {
                out.trampolines.push(t);
                out.hooks.push(Hook { event: "AMD queue details", attach: format!("fexit/{func}") });
            }
            Err(why) => {
                out.refused.push(format!("AMD queue details: fexit/{func}: {why}"));
                let probes = a.kprobe_ok(func).and_then(|()| {
                    kprobe(ebpf, "pqm_create_entry", func, 0)?;
                    kprobe(ebpf, "pqm_create_kret", func, 0)
                });
                match probes {
                    Ok(()) => out.hooks.push(Hook {
                        event: "AMD queue details",
                        attach: format!("kprobe+kretprobe/{func}"),
                    }),
                    Err(why) => out.refused.push(format!("AMD queue details: kprobe/{func}: {why}")),
                }
            }
        }
    }

    // MQD init: every copy, by address.
    let func = "init_mqd";
    let addrs = plan.symbols.addresses(func).to_vec();
    if let Some(why) = &plan.mqd_config_missing {
        out.refused.push(format!("AMD MQD init: {func}: {why}"));
    } else if let Err(why) = a.kprobes.clone() {
        out.refused.push(format!("AMD MQD init: kprobe/{func}: {why}"));
    } else if addrs.is_empty() {
        out.refused.push(format!("AMD MQD init: {func} is not in /proc/kallsyms"));
    } else {
        let mut attached = Vec::new();
        for &addr in &addrs {
            match kprobe(ebpf, "init_mqd_kprobe", "", addr) {
                Ok(()) => attached.push(addr),
                Err(why) => out.refused.push(format!("AMD MQD init: kprobe/{func}@{addr:#x}: {why}")),
            }
        }
        if !attached.is_empty() {
            let copies: Vec<String> = attached
                .iter()
                .map(|&addr| match plan.symbols.neighbour_below(addr, func) {
                    Some(n) => format!("{addr:#x} near {n}"),
                    None => format!("{addr:#x}"),
                })
                .collect();
            out.hooks.push(Hook {
                event: "AMD MQD init",
                attach: format!(
                    "kprobe/{func} ×{} of {} by address ({})",
                    attached.len(),
                    addrs.len(),
                    copies.join(", ")
                ),
            });
        }
    }

    // Queue teardown.
    let func = "pqm_uninit";
    if let Some(why) = &plan.release_config_missing {
        out.refused.push(format!("AMD queue teardown: {func}: {why}"));
    } else {
        match a.trampoline("pqm_uninit_fentry", Trampoline::Entry, func) {
            Ok(t) => {
                out.trampolines.push(t);
                out.hooks.push(Hook { event: "AMD queue teardown", attach: format!("fentry/{func}") });
            }
            Err(why) => {
                out.refused.push(format!("AMD queue teardown: fentry/{func}: {why}"));
                match a.kprobe_ok(func).and_then(|()| kprobe(ebpf, "pqm_uninit_kprobe", func, 0)) {
                    Ok(()) => out.hooks.push(Hook {
                        event: "AMD queue teardown",
                        attach: format!("kprobe/{func}"),
                    }),
                    Err(why) => out.refused.push(format!("AMD queue teardown: kprobe/{func}: {why}")),
                }
            }
        }
    }
    out
}
