//! BPF trampolines (fentry/fexit) on functions of a kernel **module**, typed by the module's BTF.
//!
//! Aya 0.14 loads fentry/fexit programs against vmlinux BTF only: the kernel also needs the
//! module's BTF object (`attach_btf_obj_fd`) and the function's id in the module's split BTF,
//! and Aya has no way to pass the first. This is the one place that does it:
//!
//! 1. the module's BTF object is found by walking the kernel's BTF objects
//!    (`BPF_BTF_GET_NEXT_ID` → `BPF_BTF_GET_FD_BY_ID` → `BPF_OBJ_GET_INFO_BY_FD`, by name);
//! 2. the function's type id comes from `/sys/kernel/btf/<module>` parsed on top of vmlinux's
//!    BTF ([`crate::probe::btf::Btf::from_split`]);
//! 3. the program's instructions come from the same object file Aya loaded, relocated against
//!    the maps Aya created (so the program writes into the same ring buffer and reads the same
//!    configuration), and are loaded with `BPF_PROG_LOAD`;
//! 4. it is attached with `BPF_RAW_TRACEPOINT_OPEN`; closing the returned descriptors detaches
//!    it. Nothing is pinned.

use std::{
    collections::{HashMap, HashSet},
    ffi::CString,
    io, mem,
    os::fd::{AsFd, AsRawFd, OwnedFd, RawFd},
};

use aya::{Ebpf, maps::Map};
use aya_obj::{
    Object,
    generated::{
        bpf_attach_type, bpf_attr, bpf_btf_info, bpf_cmd, bpf_insn, bpf_prog_info, bpf_prog_type,
    },
};

use crate::probe::trial::{bpf_syscall, errno_name, sys_bpf};

/// fentry or fexit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Trampoline {
    Entry,
    Exit,
}

/// An attached trampoline program: dropping it detaches and unloads it.
#[derive(Debug)]
pub struct Attached {
    /// The program's name in the kernel object.
    pub name: String,
    _link: OwnedFd,
    prog: OwnedFd,
}

impl Attached {
    /// The kernel's counts for the program ([`run_stats`]).
    pub fn run_stats(&self) -> Option<RunStats> {
        run_stats(self.prog.as_raw_fd())
    }
}

/// What the kernel counts for a loaded program.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RunStats {
    /// Runs and their total time (ns): counted only while BPF statistics are on
    /// (`--bpf-stats`).
    pub runs: u64,
    pub run_time_ns: u64,
    /// Runs the kernel skipped because the program was already running on that CPU
    /// (`recursion_misses`, Linux 5.12; always counted): on a kernel whose tracepoint programs
    /// can be preempted, another thread's call on the same CPU goes unseen.
    pub missed: u64,
}

/// [`RunStats`] of the program behind `fd`. aya's `ProgramInfo` has no `recursion_misses`, and
/// the trampolines are loaded outside aya: one `BPF_OBJ_GET_INFO_BY_FD` for both.
pub fn run_stats(fd: RawFd) -> Option<RunStats> {
    // SAFETY: all-zero is a valid bpf_prog_info.
    let mut info: bpf_prog_info = unsafe { mem::zeroed() };
    // SAFETY: all-zero is a valid bpf_attr.
    let mut attr: bpf_attr = unsafe { mem::zeroed() };
    attr.info.bpf_fd = fd as u32;
    attr.info.info_len = mem::size_of::<bpf_prog_info>() as u32;
    attr.info.info = &mut info as *mut bpf_prog_info as u64;
    sys_bpf_rc(bpf_cmd::BPF_OBJ_GET_INFO_BY_FD, &mut attr).ok()?;
    // A kernel older than the field leaves it zero (info_len is the smaller of the two sizes).
    Some(RunStats {
        runs: info.run_cnt,
        run_time_ns: info.run_time_ns,
        missed: info.recursion_misses,
    })
}

/// The kernel programs' instructions, relocated against the maps of a loaded [`Ebpf`].
pub struct ModulePrograms {
    functions: HashMap<String, Vec<bpf_insn>>,
}

fn map_fd(map: &Map) -> Option<RawFd> {
    let data = match map {
        Map::Array(d)
        | Map::HashMap(d)
        | Map::PerCpuArray(d)
        | Map::PerCpuHashMap(d)
        | Map::RingBuf(d)
        | Map::LruHashMap(d) => d,
        _ => return None,
    };
    Some(data.fd().as_fd().as_raw_fd())
}

impl ModulePrograms {
    /// Parses `object` (the bytes `ebpf` was loaded from) again and relocates its programs
    /// against `ebpf`'s maps.
    pub fn new(object: &[u8], ebpf: &Ebpf) -> Result<Self, String> {
        let mut obj = Object::parse(object).map_err(|e| format!("parsing the programs: {e}"))?;
        let mut maps = Vec::new();
        for (name, map) in &obj.maps {
            let loaded = ebpf
                .map(name)
                .ok_or_else(|| format!("map {name} was not created"))?;
            let fd = map_fd(loaded).ok_or_else(|| format!("map {name} has an unexpected type"))?;
            maps.push((name.clone(), fd, map.clone()));
        }
        let text_sections: HashSet<usize> = obj.functions.keys().map(|(s, _)| *s).collect();
        obj.relocate_maps(
            maps.iter().map(|(n, fd, m)| (n.as_str(), *fd, m)),
            &text_sections,
        )
        .map_err(|e| format!("relocating maps: {e}"))?;
        obj.relocate_calls(&text_sections)
            .map_err(|e| format!("relocating calls: {e}"))?;
        let functions = obj
            .programs
            .iter()
            .filter_map(|(name, prog)| {
                let f = obj.functions.get(&prog.function_key())?;
                Some((name.clone(), f.instructions.clone()))
            })
            .collect();
        Ok(Self { functions })
    }

    /// Loads program `name` as a trampoline on the function with split-BTF id `btf_id` of the
    /// module whose BTF object is `module_btf`, and attaches it.
    pub fn attach(
        &self,
        name: &str,
        kind: Trampoline,
        module_btf: &OwnedFd,
        btf_id: u32,
    ) -> Result<Attached, String> {
        let insns = self
            .functions
            .get(name)
            .ok_or_else(|| format!("program {name} is missing"))?;
        let attach_type = match kind {
            Trampoline::Entry => bpf_attach_type::BPF_TRACE_FENTRY,
            Trampoline::Exit => bpf_attach_type::BPF_TRACE_FEXIT,
        };
        let prog = load(name, insns, attach_type, module_btf, btf_id)?;
        // SAFETY: all-zero is a valid bpf_attr.
        let mut attr: bpf_attr = unsafe { mem::zeroed() };
        attr.raw_tracepoint.prog_fd = prog.as_raw_fd() as u32;
        let link = sys_bpf(bpf_cmd::BPF_RAW_TRACEPOINT_OPEN, &mut attr)
            .map_err(|e| format!("attaching: {}", os_error(&e)))?;
        Ok(Attached {
            name: name.to_string(),
            _link: link,
            prog,
        })
    }
}

fn os_error(e: &io::Error) -> String {
    e.raw_os_error().map_or_else(|| e.to_string(), errno_name)
}

fn load(
    name: &str,
    insns: &[bpf_insn],
    attach_type: bpf_attach_type,
    module_btf: &OwnedFd,
    btf_id: u32,
) -> Result<OwnedFd, String> {
    // Without a log first: a full verifier log of a long program does not fit a small buffer
    // (ENOSPC). Only a refused load is repeated with the log, to say why.
    let attempt = |log: Option<&mut Vec<u8>>| {
        let license = c"GPL";
        // SAFETY: all-zero is a valid bpf_attr.
        let mut attr: bpf_attr = unsafe { mem::zeroed() };
        // SAFETY: writing the PROG_LOAD member of the union, which is what BPF_PROG_LOAD reads.
        let u = unsafe { &mut attr.__bindgen_anon_3 };
        u.prog_type = bpf_prog_type::BPF_PROG_TYPE_TRACING as u32;
        u.expected_attach_type = attach_type as u32;
        u.insn_cnt = insns.len() as u32;
        u.insns = insns.as_ptr() as u64;
        u.license = license.as_ptr() as u64;
        u.attach_btf_id = btf_id;
        u.__bindgen_anon_1.attach_btf_obj_fd = module_btf.as_raw_fd() as u32;
        for (dst, src) in u.prog_name.iter_mut().take(15).zip(name.bytes()) {
            *dst = src as libc::c_char;
        }
        if let Some(log) = log {
            u.log_level = 1;
            u.log_size = log.len() as u32;
            u.log_buf = log.as_mut_ptr() as u64;
        }
        sys_bpf(bpf_cmd::BPF_PROG_LOAD, &mut attr)
    };
    match attempt(None) {
        Ok(fd) => Ok(fd),
        Err(e) => {
            let mut log = vec![0u8; 4 << 20];
            let _ = attempt(Some(&mut log));
            let text = String::from_utf8_lossy(&log);
            let text = text.split('\0').next().unwrap_or_default();
            let last: Vec<&str> = text.lines().rev().take(3).collect();
            let why = last.into_iter().rev().collect::<Vec<_>>().join(" | ");
            Err(if why.is_empty() {
                format!("loading: {}", os_error(&e))
            } else {
                format!("loading: {} ({why})", os_error(&e))
            })
        }
    }
}

/// `bpf(cmd, attr)` for a command that returns 0 or -1.
fn sys_bpf_rc(cmd: bpf_cmd, attr: &mut bpf_attr) -> io::Result<()> {
    bpf_syscall(cmd, attr).map(drop)
}

/// The kernel's BTF object of module `module` (its `/sys/kernel/btf/<module>` blob), found by
/// name among the loaded BTF objects.
pub fn module_btf_fd(module: &str) -> Result<OwnedFd, String> {
    let wanted = CString::new(module).map_err(|_| "bad module name".to_string())?;
    let mut id = 0u32;
    loop {
        // SAFETY: all-zero is a valid bpf_attr.
        let mut attr: bpf_attr = unsafe { mem::zeroed() };
        attr.__bindgen_anon_6.__bindgen_anon_1.start_id = id;
        match sys_bpf_rc(bpf_cmd::BPF_BTF_GET_NEXT_ID, &mut attr) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                return Err(format!(
                    "the kernel has no loaded BTF object named {module}"
                ));
            }
            Err(e) => return Err(format!("BPF_BTF_GET_NEXT_ID: {}", os_error(&e))),
        }
        // SAFETY: the kernel wrote next_id in the same union member.
        id = unsafe { attr.__bindgen_anon_6.next_id };
        // SAFETY: all-zero is a valid bpf_attr.
        let mut attr: bpf_attr = unsafe { mem::zeroed() };
        attr.__bindgen_anon_6.__bindgen_anon_1.btf_id = id;
        let Ok(fd) = sys_bpf(bpf_cmd::BPF_BTF_GET_FD_BY_ID, &mut attr) else {
            continue; // unloaded meanwhile
        };
        let mut name = [0u8; 64];
        // SAFETY: all-zero is a valid bpf_btf_info.
        let mut info: bpf_btf_info = unsafe { mem::zeroed() };
        info.name = name.as_mut_ptr() as u64;
        info.name_len = name.len() as u32;
        // SAFETY: all-zero is a valid bpf_attr.
        let mut attr: bpf_attr = unsafe { mem::zeroed() };
        attr.info.bpf_fd = fd.as_raw_fd() as u32;
        attr.info.info_len = mem::size_of::<bpf_btf_info>() as u32;
        attr.info.info = &mut info as *mut bpf_btf_info as u64;
        if sys_bpf_rc(bpf_cmd::BPF_OBJ_GET_INFO_BY_FD, &mut attr).is_err() {
            continue;
        }
        let len = name.iter().position(|&b| b == 0).unwrap_or(name.len());
        if name[..len] == *wanted.as_bytes() {
            return Ok(fd);
        }
    }
}
