//! AMD's deep hooks: attach to `amdgpu.ko`'s own KFD functions where the running kernel
//! allows it, per event, cheapest first, and say what was chosen and why the rest was not
//! (with the kit of [`super::module_hooks`], which NVIDIA's hooks use too).
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

use aya::Ebpf;
use gpu_trace_common::{KfdDeepConfig, amd::nr};

use super::{
    DeepAttach, Hook,
    module_hooks::{Attacher, ModuleHooks, ModuleTargets, kprobe},
    trampoline::Trampoline,
};
use crate::probe::btf::Btf;
use crate::targets::{
    self, DQM_CREATE, DeepTarget, KFD_HANDLERS, MQD_INIT, MQD_INIT_PROGRAM, PQM_UNINIT,
};

/// The driver module the deep hooks attach to.
pub const MODULE: &str = targets::AMD_MODULE;

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

/// Attaches every deep hook this kernel allows. Call after the programs are loaded and before
/// the syscall hook is attached. `handlers` false leaves the ioctl handlers to the syscall
/// layer (`--deny-pid`: a refused call never reaches the driver, and must still be seen).
pub fn attach(ebpf: &mut Ebpf, plan: &KfdDeepPlan, handlers: bool, via: DeepAttach) -> ModuleHooks {
    let mut out = ModuleHooks::default();
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
    out: &mut ModuleHooks,
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
fn attach_mqd_init(ebpf: &mut Ebpf, plan: &KfdDeepPlan, out: &mut ModuleHooks) {
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
