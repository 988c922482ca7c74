//! Deep hooks on the AMD KFD driver (`amdgpu.ko`): programs attached to the driver's own
//! functions rather than to the syscall layer. Userspace picks, per event, the cheapest attach
//! type the kernel allows (a BPF trampoline typed by the module's BTF, else a kprobe) and falls
//! back to the syscall layer for what it cannot attach (see `gpu-trace/src/loader/deep.rs`).
//!
//! - The four ioctl handlers (`kfd_ioctl_create_queue`, `_destroy_queue`, `_update_queue`,
//!   `_set_cu_mask`), at exit: the same `KfdIoctlRecord` as the syscall layer, but read from
//!   the driver's own copy of the arguments, and only for calls that reached the handler. Each
//!   command hooked here has its bit set in the `SWITCHES` map (main.rs), and the syscall layer
//!   leaves it alone, so a call is never reported twice.
//! - The device queue manager's `create_queue_cpsch` / `create_queue_nocpsch` (whichever the
//!   scheduling policy uses), at exit: the queue as the driver holds it in its own `struct
//!   queue` ([`KfdQueueRecord`]). (Not `pqm_create_queue`: its `properties` argument is the
//!   handler's copy, which never gets the doorbell or the active state.)
//! - The MQD managers' `init_mqd`, `init_mqd_sdma` and `init_mqd_v9_4_3` (static, one copy per
//!   GPU generation, so only by address): which copy built the queue's hardware descriptor
//!   ([`DeepRecord`], [`deep_hook::INIT_MQD`]).
//! - `pqm_uninit`, at entry: the process's queues are torn down ([`deep_hook::KFD_RELEASE`]),
//!   whoever runs the teardown.
//!
//! Every struct offset and parameter position comes from `KFD_DEEP`, which userspace fills from
//! the module's BTF. Nothing here writes kernel or user memory.

use aya_ebpf::{
    EbpfContext,
    helpers::{bpf_get_current_pid_tgid, generated},
    macros::{fentry, fexit, kprobe, kretprobe, map},
    maps::HashMap,
    programs::{FEntryContext, FExitContext, ProbeContext, RetProbeContext},
};
use gpu_trace_common::{
    DeepRecord, KfdDeepConfig, KfdQueueRecord,
    amd::{self, nr},
    counter, deep_hook, hook_source, kfd_queue_flags, record_kind,
};

use crate::{EVENTS, KfdCallHead, bump, config, emit_kfd, header, kread, send};

/// Filled in by userspace before load, from the module's BTF.
#[unsafe(no_mangle)]
static KFD_DEEP: KfdDeepConfig = KfdDeepConfig {
    create_args_size: 0,
    pqm_process: 0,
    process_lead_thread: 0,
    task_tgid: 0,
    qp_type: 0,
    qp_format: 0,
    qp_queue_id: 0,
    qp_queue_address: 0,
    qp_queue_size: 0,
    qp_priority: 0,
    qp_percent: 0,
    qp_doorbell_off: 0,
    qp_is_active: 0,
    qp_vmid: 0,
    dqm_create_q_arg: 0,
    queue_properties: 0,
    init_mqd_q_arg: 0,
    ready: 0,
};

#[inline(always)]
fn deep_config() -> KfdDeepConfig {
    // SAFETY: a plain read of our own global (volatile: userspace rewrites it before load).
    unsafe { core::ptr::read_volatile(&KFD_DEEP) }
}

/// Kprobe variant only: what the entry probe saw, by thread, for the return probe.
#[repr(C)]
#[derive(Clone, Copy)]
struct EntryArgs {
    a: u64,
    b: u64,
}

/// Handler kprobes: `filep` and `data` at entry, by pid_tgid.
#[map]
static KFD_HANDLER_ARGS: HashMap<u64, EntryArgs> = HashMap::with_max_entries(4096, 0);

/// DQM `create_queue_*` kprobe: the `struct queue *` at entry, by pid_tgid.
#[map]
static DQM_CREATE_ARGS: HashMap<u64, u64> = HashMap::with_max_entries(4096, 0);

/// Whether the current process passes the `--pid` and cgroup filters.
#[inline(always)]
fn wanted(tgid: u32) -> bool {
    let cfg = config();
    cfg.ready != 0
        && deep_config().ready != 0
        && (cfg.filter_tgid == 0 || cfg.filter_tgid == tgid)
        && crate::cgroup::wanted(&cfg)
}

#[inline(always)]
fn current_tgid() -> u32 {
    (bpf_get_current_pid_tgid() >> 32) as u32
}

/// The kernel's own size of the argument struct of handler `nr`.
#[inline(always)]
fn kernel_arg_size(nr: u32, deep: &KfdDeepConfig) -> u32 {
    match nr {
        nr::CREATE_QUEUE => deep.create_args_size,
        nr::DESTROY_QUEUE => amd::size::DESTROY_QUEUE,
        nr::UPDATE_QUEUE => amd::size::UPDATE_QUEUE,
        _ => amd::size::SET_CU_MASK,
    }
}

/// A KFD ioctl handler returned `ret`; `filep` and `data` are its first and third arguments.
#[inline(always)]
fn handler_exit(nr: u32, filep: u64, data: u64, ret: i64, source: u32) {
    let tgid = current_tgid();
    if !wanted(tgid) {
        return;
    }
    let cfg = config();
    let deep = deep_config();
    // SAFETY: kernel reads through the helper.
    let rdev: u32 = unsafe {
        match kread::<u64>(filep, cfg.file_inode) {
            Ok(inode) => kread::<u32>(inode, cfg.inode_rdev).unwrap_or(0),
            Err(()) => 0,
        }
    };
    let head = KfdCallHead {
        fd: -1,
        ioctl_cmd: 0,
        rdev,
        nr,
        arg_size: kernel_arg_size(nr, &deep),
        ret,
        source,
    };
    emit_kfd(head, data, tgid);
}

/// Handler signature: `int kfd_ioctl_*(struct file *filep, struct kfd_process *p, void *data)`.
macro_rules! handler_programs {
    ($fexit:ident, $kret:ident, $func:literal, $nr:expr) => {
        #[fexit(function = $func)]
        pub fn $fexit(ctx: FExitContext) -> i32 {
            let filep: u64 = ctx.arg(0);
            let data: u64 = ctx.arg(2);
            let ret: i64 = ctx.ret::<i32>().unwrap_or(0) as i64;
            handler_exit($nr, filep, data, ret, hook_source::TRAMPOLINE);
            0
        }

        #[kretprobe]
        pub fn $kret(ctx: RetProbeContext) -> u32 {
            let key = bpf_get_current_pid_tgid();
            // SAFETY: map value copied out before removal.
            let Some(args) = (unsafe { KFD_HANDLER_ARGS.get(&key) }).copied() else {
                return 0;
            };
            let _ = KFD_HANDLER_ARGS.remove(&key);
            let ret: i32 = ctx.ret();
            handler_exit($nr, args.a, args.b, ret as i64, hook_source::KPROBE);
            0
        }
    };
}

handler_programs!(
    kfd_create_queue_fexit,
    kfd_create_queue_kret,
    "kfd_ioctl_create_queue",
    nr::CREATE_QUEUE
);
handler_programs!(
    kfd_destroy_queue_fexit,
    kfd_destroy_queue_kret,
    "kfd_ioctl_destroy_queue",
    nr::DESTROY_QUEUE
);
handler_programs!(
    kfd_update_queue_fexit,
    kfd_update_queue_kret,
    "kfd_ioctl_update_queue",
    nr::UPDATE_QUEUE
);
handler_programs!(
    kfd_set_cu_mask_fexit,
    kfd_set_cu_mask_kret,
    "kfd_ioctl_set_cu_mask",
    nr::SET_CU_MASK
);

/// Entry probe shared by the four handlers (attached once per handler): keeps `filep` and
/// `data` for the return probe, which cannot see the arguments.
#[kprobe]
pub fn kfd_handler_entry(ctx: ProbeContext) -> u32 {
    if !wanted(current_tgid()) {
        return 0;
    }
    let (Some(filep), Some(data)) = (ctx.arg::<u64>(0), ctx.arg::<u64>(2)) else {
        return 0;
    };
    let _ = KFD_HANDLER_ARGS.insert(
        &bpf_get_current_pid_tgid(),
        &EntryArgs { a: filep, b: data },
        0,
    );
    0
}

/// Value `n` (0..=5) of `args`. The callers load all six arguments first with volatile loads,
/// each at a constant context offset, so that the compiler cannot fold the choice into one load
/// at a computed context offset, which the verifier refuses ("dereference of modified ctx
/// ptr").
#[inline(always)]
fn pick(n: u32, args: [u64; 6]) -> Option<u64> {
    match n {
        0 => Some(args[0]),
        1 => Some(args[1]),
        2 => Some(args[2]),
        3 => Some(args[3]),
        4 => Some(args[4]),
        5 => Some(args[5]),
        _ => None,
    }
}

/// Argument `n` (a register argument, 0..=5) of a kprobe.
#[inline(always)]
fn probe_arg(ctx: &ProbeContext, n: u32) -> Option<u64> {
    #[cfg(bpf_target_arch = "x86_64")]
    {
        let r = ctx.regs;
        // SAFETY: loads from the pt_regs the kernel passes to the kprobe.
        let args = unsafe {
            use core::ptr::{addr_of, read_volatile};
            [
                read_volatile(addr_of!((*r).rdi)),
                read_volatile(addr_of!((*r).rsi)),
                read_volatile(addr_of!((*r).rdx)),
                read_volatile(addr_of!((*r).rcx)),
                read_volatile(addr_of!((*r).r8)),
                read_volatile(addr_of!((*r).r9)),
            ]
        };
        pick(n, args)
    }
    #[cfg(not(bpf_target_arch = "x86_64"))]
    {
        let a = |i| ctx.arg::<u64>(i).unwrap_or(0);
        pick(n, [a(0), a(1), a(2), a(3), a(4), a(5)])
    }
}

/// Argument `n` (0..=2) of a trampoline program. Only the first three are loaded: the verifier
/// checks each context load against the function's BTF, and 6.1 refuses loads of arguments it
/// cannot type (`const void *restore_mqd`, argument 4 of the DQM's `create_queue_*`: "type
/// UNKNOWN is not a struct", seen in the lab).
#[inline(always)]
fn fexit_arg3(ctx: &FExitContext, n: u32) -> Option<u64> {
    let p = ctx.as_ptr() as *const u64;
    // SAFETY: the trampoline context is an array of the function's arguments (at least three
    // here), each 8 bytes.
    let args = unsafe {
        use core::ptr::read_volatile;
        [
            read_volatile(p),
            read_volatile(p.add(1)),
            read_volatile(p.add(2)),
            0,
            0,
            0,
        ]
    };
    if n > 2 {
        return None;
    }
    pick(n, args)
}

/// The DQM's `create_queue_*` returned `ret`; `q` is its `struct queue *`.
#[inline(always)]
fn queue_built(q: u64, ret: i32, source: u32) {
    if !wanted(current_tgid()) {
        return;
    }
    let d = deep_config();
    let props = q + d.queue_properties as u64;
    crate::cgroup::note(current_tgid());
    let Some(mut entry) = EVENTS.reserve::<KfdQueueRecord>(0) else {
        bump(counter::DROPPED);
        return;
    };
    let rec = entry.as_mut_ptr();
    let mut flags = 0u32;
    // SAFETY: kernel reads through the helper into a reserved, exclusively owned record; every
    // field is written before submit.
    unsafe {
        (*rec).hdr = header(record_kind::KFD_QUEUE);
        (*rec).source = source;
        (*rec).ret = ret;
        (*rec)._pad = 0;
        let fields = (
            kread::<u32>(props, d.qp_type),
            kread::<u32>(props, d.qp_format),
            kread::<u32>(props, d.qp_queue_id),
            kread::<u32>(props, d.qp_priority),
            kread::<u32>(props, d.qp_percent),
            kread::<u32>(props, d.qp_doorbell_off),
            kread::<u8>(props, d.qp_is_active),
            kread::<u32>(props, d.qp_vmid),
            kread::<u64>(props, d.qp_queue_size),
            kread::<u64>(props, d.qp_queue_address),
        );
        if let (
            Ok(t),
            Ok(f),
            Ok(id),
            Ok(prio),
            Ok(pct),
            Ok(db),
            Ok(active),
            Ok(vmid),
            Ok(size),
            Ok(addr),
        ) = fields
        {
            (*rec).q_type = t;
            (*rec).q_format = f;
            (*rec).queue_id = id;
            (*rec).priority = prio;
            (*rec).percent = pct;
            (*rec).doorbell_off = db;
            (*rec).is_active = active as u32;
            (*rec).vmid = vmid;
            (*rec).queue_size = size;
            (*rec).queue_address = addr;
        } else {
            flags |= kfd_queue_flags::PROPS_READ_FAILED;
            (*rec).q_type = 0;
            (*rec).q_format = 0;
            (*rec).queue_id = 0;
            (*rec).priority = 0;
            (*rec).percent = 0;
            (*rec).doorbell_off = 0;
            (*rec).is_active = 0;
            (*rec).vmid = 0;
            (*rec).queue_size = 0;
            (*rec).queue_address = 0;
        }
        (*rec).flags = flags;
    }
    entry.submit(0);
    if flags != 0 {
        bump(counter::READ_FAILED);
    }
    bump(counter::EMITTED);
}

/// Attached (each loaded on its own) to `create_queue_cpsch` and `create_queue_nocpsch`.
#[fexit(function = "create_queue_cpsch")]
pub fn dqm_create_fexit(ctx: FExitContext) -> i32 {
    let Some(q) = fexit_arg3(&ctx, deep_config().dqm_create_q_arg) else {
        return 0;
    };
    let ret = ctx.ret::<i32>().unwrap_or(0);
    queue_built(q, ret, hook_source::TRAMPOLINE);
    0
}

#[kprobe]
pub fn dqm_create_entry(ctx: ProbeContext) -> u32 {
    if !wanted(current_tgid()) {
        return 0;
    }
    let Some(q) = probe_arg(&ctx, deep_config().dqm_create_q_arg) else {
        return 0;
    };
    let _ = DQM_CREATE_ARGS.insert(&bpf_get_current_pid_tgid(), &q, 0);
    0
}

#[kretprobe]
pub fn dqm_create_kret(ctx: RetProbeContext) -> u32 {
    let key = bpf_get_current_pid_tgid();
    // SAFETY: map value copied out before removal.
    let Some(q) = (unsafe { DQM_CREATE_ARGS.get(&key) }).copied() else {
        return 0;
    };
    let _ = DQM_CREATE_ARGS.remove(&key);
    queue_built(q, ctx.ret(), hook_source::KPROBE);
    0
}

/// A copy of an MQD manager's `init_mqd*` (attached by address, every copy) is building the
/// hardware descriptor of the queue whose `queue_properties` is its argument `init_mqd_q_arg`
/// (the queue's own copy).
#[kprobe]
pub fn init_mqd_kprobe(ctx: ProbeContext) -> u32 {
    if !wanted(current_tgid()) {
        return 0;
    }
    let d = deep_config();
    let Some(props) = probe_arg(&ctx, d.init_mqd_q_arg) else {
        return 0;
    };
    // SAFETY: kernel read through the helper; the helper takes the kprobe context.
    let (queue_id, ip) = unsafe {
        (
            kread::<u32>(props, d.qp_queue_id),
            generated::bpf_get_func_ip(ctx.as_ptr()),
        )
    };
    let queue_id = match queue_id {
        Ok(q) => q,
        Err(()) => {
            bump(counter::READ_FAILED);
            u32::MAX
        }
    };
    emit_deep(deep_hook::INIT_MQD, queue_id, ip, hook_source::KPROBE);
    0
}

/// `pqm_uninit(pqm)`: the queues of `pqm->process` are being torn down. The owner is read from
/// the process (`lead_thread->tgid`), not from the current task, which may be a worker thread.
#[inline(always)]
fn kfd_release(pqm: u64, source: u32) {
    let cfg = config();
    let d = deep_config();
    if cfg.ready == 0 || d.ready == 0 {
        return;
    }
    // SAFETY: kernel reads through the helper.
    let owner: Result<u32, ()> = unsafe {
        match kread::<u64>(pqm, d.pqm_process) {
            Ok(process) => match kread::<u64>(process, d.process_lead_thread) {
                Ok(task) => kread::<u32>(task, d.task_tgid),
                Err(()) => Err(()),
            },
            Err(()) => Err(()),
        }
    };
    let Ok(owner) = owner else {
        bump(counter::READ_FAILED);
        return;
    };
    if cfg.filter_tgid != 0 && cfg.filter_tgid != owner {
        return;
    }
    emit_deep(deep_hook::KFD_RELEASE, owner, 0, source);
}

#[fentry(function = "pqm_uninit")]
pub fn pqm_uninit_fentry(ctx: FEntryContext) -> i32 {
    kfd_release(ctx.arg(0), hook_source::TRAMPOLINE);
    0
}

#[kprobe]
pub fn pqm_uninit_kprobe(ctx: ProbeContext) -> u32 {
    if let Some(pqm) = ctx.arg::<u64>(0) {
        kfd_release(pqm, hook_source::KPROBE);
    }
    0
}

#[inline(always)]
fn emit_deep(hook: u32, value: u32, addr: u64, source: u32) {
    send(&DeepRecord {
        hdr: header(record_kind::DEEP),
        hook,
        value,
        addr,
        source,
        _pad: 0,
    });
}
