//! The kit every vendor's hooks on a driver module's own functions use ("deep hooks": AMD's
//! `amdgpu`, NVIDIA's `nvidia` entry points and gpu_ext hooks): the module's symbols and split
//! BTF ([`ModuleTargets`]), a trampoline (fentry/fexit on the module's BTF) else a kprobe per
//! function, refused per function with the reason ([`Attacher::attach_each`]), and what was
//! attached ([`ModuleHooks`]).

use aya::{Ebpf, programs::KProbe};

use super::{
    DeepAttach, Hook, err,
    trampoline::{self, Attached, ModulePrograms, Trampoline},
};
use crate::probe::{
    btf::{self, Btf},
    kallsyms::ModuleSymbols,
    trial,
};
use crate::targets::DeepTarget;

/// A loaded driver module whose functions hooks attach to: its symbols and, when it has BTF, its
/// split BTF on vmlinux's.
pub struct ModuleTargets {
    pub module: String,
    /// vmlinux + module BTF, when the module has BTF.
    pub(super) btf: Option<Btf>,
    /// Why the module's BTF could not be used (trampolines then cannot attach).
    btf_missing: Option<String>,
    pub(super) symbols: ModuleSymbols,
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

/// What a vendor's module hooks attached (`amd::attach`, `nvidia::entry`, `nvidia::gpu_ext`).
#[derive(Default)]
pub struct ModuleHooks {
    pub hooks: Vec<Hook>,
    pub refused: Vec<String>,
    /// AMD: bit `1 << nr` for each KFD command whose handler is hooked: the syscall layer
    /// leaves these alone.
    pub handler_mask: u32,
    /// Trampolines attached outside Aya (detached when dropped).
    trampolines: Vec<Attached>,
}

impl ModuleHooks {
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

fn read_module_btf(module: &str, base: &Btf) -> Result<Btf, String> {
    let path = btf::module_btf_path(module);
    let bytes = btf::read_module_btf(module).map_err(|e| {
        format!("{path}: {e} (the module was built without BTF: CONFIG_DEBUG_INFO_BTF_MODULES)")
    })?;
    Btf::from_split(base, &bytes).map_err(|e| format!("{path}: {e}"))
}

/// Attaches Aya kprobe program `program` to `target` (a symbol, or "" with an address in
/// `addr`), loading it on first use.
pub(super) fn kprobe(
    ebpf: &mut Ebpf,
    program: &str,
    target: &str,
    addr: u64,
) -> Result<(), String> {
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
    pub(super) kprobes: Result<(), String>,
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
        out: &mut ModuleHooks,
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
