//! What `cargo xtask bench` needs from the kernel side besides gpu-trace itself: the empty
//! "floor" programs on the hooks gpu-trace uses, and the kernel's statistics of loaded BPF
//! programs (instruction counts, run counts and run time). The floor programs are a crate of
//! their own (`test/bench-ebpf`, built by xtask's build.rs), not part of gpu-trace: its object
//! does not contain them.

use std::os::fd::OwnedFd;

use aya::{
    Btf, Ebpf, EbpfLoader,
    programs::{BtfTracePoint, ProgramError, RawTracePoint, TracePoint, loaded_programs},
    sys::{Stats, enable_stats},
};
use thiserror::Error;

use gpu_trace::{
    loader::SyscallHook,
    probe::system,
    targets::{SYS_EXIT, SYSCALL_TRACEPOINTS},
};

/// The floor programs' kernel object (`test/bench-ebpf`, built by xtask's build.rs).
static FLOOR_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/bench-floor"));

#[derive(Debug, Error)]
pub enum BenchError {
    #[error(transparent)]
    System(#[from] system::SystemError),
    #[error("loading the kernel object of the floor programs failed: {0}. Rebuild xtask")]
    Load(#[source] aya::EbpfError),
    #[error(
        "attaching the empty floor program to {attach} failed: {why}. The kernel refuses this \
             hook: leave it out of the comparison (gpu-trace cannot use it either)"
    )]
    Attach { attach: &'static str, why: String },
    #[error("reading the kernel's BPF program list failed: {0}. Run as root")]
    Programs(#[source] ProgramError),
    #[error(
        "turning on BPF run-time statistics failed: {0}. Needs root and Linux ≥ 5.8; or set \
             /proc/sys/kernel/bpf_stats_enabled to 1 by hand"
    )]
    Stats(#[source] std::io::Error),
}

/// The floor programs' names in their kernel object (test/bench-ebpf/src/floor.rs).
pub const FLOOR_RAW_TP: &str = "bench_floor_raw";
pub const FLOOR_TP_BTF: &str = "bench_floor_btf";
pub const FLOOR_TRACEPOINT: &str = "bench_floor_tp";

/// An empty program attached where gpu-trace's syscall hook goes; detached on drop.
pub struct Floor {
    _ebpf: Ebpf,
}

fn first_line(e: impl std::fmt::Display) -> String {
    e.to_string().lines().next().unwrap_or_default().to_string()
}

impl Floor {
    /// Loads the empty program for `hook` and attaches it.
    pub fn attach(hook: SyscallHook) -> Result<Self, BenchError> {
        system::check_privileges()?;
        let mut ebpf = EbpfLoader::new()
            .load(FLOOR_OBJECT)
            .map_err(BenchError::Load)?;
        let attach = match hook {
            SyscallHook::RawTp => "raw_tp/sys_exit",
            SyscallHook::TpBtf => "tp_btf/sys_exit",
            SyscallHook::Tracepoint => "tracepoint/syscalls:sys_{enter,exit}_{ioctl,close}",
        };
        let fail = |why: String| BenchError::Attach { attach, why };
        match hook {
            SyscallHook::RawTp => {
                let prog: &mut RawTracePoint = program(&mut ebpf, FLOOR_RAW_TP).map_err(fail)?;
                prog.load().map_err(|e| fail(first_line(e)))?;
                prog.attach(SYS_EXIT.name)
                    .map_err(|e| fail(first_line(e)))?;
            }
            SyscallHook::TpBtf => {
                let btf = Btf::from_sys_fs().map_err(|e| fail(first_line(e)))?;
                let prog: &mut BtfTracePoint = program(&mut ebpf, FLOOR_TP_BTF).map_err(fail)?;
                prog.load(SYS_EXIT.name, &btf)
                    .map_err(|e| fail(first_line(e)))?;
                prog.attach().map_err(|e| fail(first_line(e)))?;
            }
            SyscallHook::Tracepoint => {
                system::ensure_tracefs()?;
                let prog: &mut TracePoint = program(&mut ebpf, FLOOR_TRACEPOINT).map_err(fail)?;
                prog.load().map_err(|e| fail(first_line(e)))?;
                // The classic tracepoints gpu-trace's fallback attaches to: the floor takes
                // the same four.
                for tp in SYSCALL_TRACEPOINTS {
                    prog.attach(tp.category, tp.name)
                        .map_err(|e| fail(first_line(e)))?;
                }
            }
        }
        Ok(Self { _ebpf: ebpf })
    }
}

fn program<'a, T>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut T, String>
where
    &'a mut T: TryFrom<&'a mut aya::programs::Program, Error = ProgramError>,
{
    let prog = ebpf.program_mut(name).ok_or_else(|| {
        format!("program {name} is missing from the kernel object (rebuild xtask)")
    })?;
    prog.try_into().map_err(first_line)
}

/// One loaded BPF program as the kernel describes it (`bpf_prog_info`).
#[derive(Clone, Debug)]
pub struct ProgramStats {
    pub id: u32,
    /// The name the kernel keeps (at most 15 bytes).
    pub name: String,
    /// Bytes of BPF code after the verifier (8 bytes per instruction).
    pub xlated_bytes: Option<u32>,
    /// Bytes of native code.
    pub jited_bytes: u32,
    /// Instructions the verifier walked (all paths).
    pub verified_insns: Option<u32>,
    /// Runs and total run time, counted only while statistics are on ([`RunTimeStats`]).
    pub run_count: u64,
    pub run_time_ns: u64,
}

/// The program was unloaded between listing its id and opening it.
fn vanished<T>(info: &Result<T, ProgramError>) -> bool {
    match info {
        Err(ProgramError::SyscallError(e)) => e.io_error.kind() == std::io::ErrorKind::NotFound,
        _ => false,
    }
}

/// Every BPF program loaded in the kernel now (any process's). A program unloaded between
/// listing and opening it (another process's, gone) is left out.
pub fn loaded_program_stats() -> Result<Vec<ProgramStats>, BenchError> {
    loaded_programs()
        .filter(|info| !vanished(info))
        .map(|info| {
            let info = info.map_err(BenchError::Programs)?;
            Ok(ProgramStats {
                id: info.id(),
                name: info.name_as_str().unwrap_or("?").to_string(),
                xlated_bytes: info.size_translated(),
                jited_bytes: info.size_jitted(),
                verified_insns: info.verified_instruction_count(),
                run_count: info.run_count(),
                run_time_ns: info.run_time().as_nanos() as u64,
            })
        })
        .collect()
}

/// Keeps the kernel's BPF run-time statistics on (`BPF_ENABLE_STATS`) while alive. Counting
/// costs two clock reads per program run: never leave it on while timing.
pub struct RunTimeStats(#[allow(dead_code)] OwnedFd);

impl RunTimeStats {
    pub fn enable() -> Result<Self, BenchError> {
        enable_stats(Stats::RunTime)
            .map(Self)
            .map_err(|e| BenchError::Stats(e.io_error))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_floor_object_holds_the_three_floor_programs() {
        let object = aya_obj::Object::parse(FLOOR_OBJECT).expect("the floor object parses");
        let mut names: Vec<&str> = object.programs.keys().map(String::as_str).collect();
        names.sort_unstable();
        assert_eq!(names, [FLOOR_TP_BTF, FLOOR_RAW_TP, FLOOR_TRACEPOINT]);
    }
}
