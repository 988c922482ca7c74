//! gpu_ext's scheduling-hook contexts, pinned to the patched driver's own source
//! (`eunomia-bpf/gpu_ext-kernel-modules`), not to gpu-trace's constants or the lab's stand-in:
//!
//! - the context structs below are copied from the fork's headers (field names, types and order
//!   as in C) at commit `0f2d5047378551695f4bf1dd3fd0195ce8c54445` ("version C"):
//!   `struct nv_gpu_task_init_ctx` from `kernel-open/common/inc/nv-gpu-transition-validator.h`,
//!   the bind, token-request and task-destroy contexts from
//!   `src/nvidia/arch/nvalloc/unix/include/nv-gpu-sched-hooks.h`; their `#[repr(C)]` layout is
//!   the C layout on x86-64, and gpu-trace-common's offsets must equal it;
//! - the encodings are those of the C code that FILLS the contexts, at the same commit:
//!   `kchangrpapiConstruct_IMPL` (`src/nvidia/src/kernel/gpu/fifo/kernel_channel_group_api.c`)
//!   sets `decision.input.engine_type = pKernelChannelGroup->engineType`, which it set from
//!   `gpuGetRmEngineType(pAllocParams->engineType)`: RM's internal `RM_ENGINE_TYPE` numbering
//!   (`RM_ENGINE_TYPE_NULL` 0, `_GR0` 1 … `_GR7` 8, `_COPY0` 9 …), and
//!   `decision.input.default_interleave = pKernelChannelGroup->pInterleaveLevel[subdevInst]`
//!   right after `kchangrpSetInterleaveLevel(pGpu, pKernelChannelGroup,
//!   NVA06C_CTRL_INTERLEAVE_LEVEL_MEDIUM)`; `kchangrpSetInterleaveLevel_IMPL`
//!   (`kernel_channel_group.c`) stores the `NVA06C_CTRL_INTERLEAVE_LEVEL_*` value itself (it
//!   accepts only LOW, MEDIUM, HIGH = 0, 1, 2 in `ctrla06c.h`), and
//!   `kchangrpapiCtrlCmdGpFifoSchedule_IMPL` copies the same `pInterleaveLevel[subdevInst]` into
//!   the bind context's `interleave_level`. The fork's transition validator accepts 0..=2 for
//!   the same reason. Header comments elsewhere in the fork that number GRAPHICS 0 or LOW 1,
//!   MEDIUM 2, HIGH 3 do not match that code.
//!
//! The lab's stand-in module (`lab/modules/nvlab/nvlab.c`) is checked against the same copies.

use std::mem::{offset_of, size_of};

use gpu_trace::{
    event::Interleave,
    source::nvidia::gpu_ext::{self, GxHook},
};
use gpu_trace_common::{
    NvSchedRecord, RecordHeader, hook_source,
    nvidia::gpu_ext::{self as abi, CTX_MAX, bind, hook, task_destroy, task_init, token_request},
    record_kind,
};

// ---- Copied from the fork (commit 0f2d504), NvU64 = u64, NvU32 = u32. ------------------------

/// `struct nv_gpu_task_init_ctx` (nv-gpu-transition-validator.h).
#[repr(C)]
#[allow(dead_code)]
struct NvGpuTaskInitCtx {
    tsg_id: u64,
    engine_type: u32,
    default_timeslice: u64,
    default_interleave: u32,
    runlist_id: u32,
}

/// `struct nv_gpu_bind_ctx` (nv-gpu-sched-hooks.h).
#[repr(C)]
#[allow(dead_code)]
struct NvGpuBindCtx {
    tsg_id: u64,
    runlist_id: u32,
    channel_count: u32,
    timeslice_us: u64,
    interleave_level: u32,
    allow: u32,
}

/// `struct nv_gpu_token_request_ctx` (nv-gpu-sched-hooks.h).
#[repr(C)]
#[allow(dead_code)]
struct NvGpuTokenRequestCtx {
    channel_id: u32,
    tsg_id: u64,
    token: u32,
}

/// `struct nv_gpu_task_destroy_ctx` (nv-gpu-sched-hooks.h).
#[repr(C)]
#[allow(dead_code)]
struct NvGpuTaskDestroyCtx {
    tsg_id: u64,
}

/// The same declarations as C text (normalized: one `type name;` per field), to compare with
/// the lab's stand-in module.
const FORK_STRUCTS: [(&str, &[&str]); 4] = [
    (
        "nv_gpu_task_init_ctx",
        &[
            "u64 tsg_id",
            "u32 engine_type",
            "u64 default_timeslice",
            "u32 default_interleave",
            "u32 runlist_id",
        ],
    ),
    (
        "nv_gpu_bind_ctx",
        &[
            "u64 tsg_id",
            "u32 runlist_id",
            "u32 channel_count",
            "u64 timeslice_us",
            "u32 interleave_level",
            "u32 allow",
        ],
    ),
    (
        "nv_gpu_token_request_ctx",
        &["u32 channel_id", "u64 tsg_id", "u32 token"],
    ),
    ("nv_gpu_task_destroy_ctx", &["u64 tsg_id"]),
];

// ---- Encodings, from the driver code that fills the contexts (see the module comment). --------

/// `RM_ENGINE_TYPE_GR0` (`src/nvidia/inc/kernel/gpu/gpu_engine_type.h`).
const RM_ENGINE_TYPE_GR0: u32 = 1;
/// `RM_ENGINE_TYPE_COPY0`.
const RM_ENGINE_TYPE_COPY0: u32 = 9;
/// `NVA06C_CTRL_INTERLEAVE_LEVEL_{LOW,MEDIUM,HIGH}` (`ctrl/ctrla06c.h`).
const INTERLEAVE_LOW: u32 = 0;
const INTERLEAVE_MEDIUM: u32 = 1;
const INTERLEAVE_HIGH: u32 = 2;

#[test]
fn gpu_trace_common_offsets_are_the_fork_header_layout() {
    // task_init: the whole 32-byte struct of version C (A and B share this prefix).
    assert_eq!(task_init::TSG_ID, offset_of!(NvGpuTaskInitCtx, tsg_id));
    assert_eq!(
        task_init::ENGINE_TYPE,
        offset_of!(NvGpuTaskInitCtx, engine_type)
    );
    assert_eq!(
        task_init::DEFAULT_TIMESLICE,
        offset_of!(NvGpuTaskInitCtx, default_timeslice)
    );
    assert_eq!(
        task_init::DEFAULT_INTERLEAVE,
        offset_of!(NvGpuTaskInitCtx, default_interleave)
    );
    assert_eq!(
        task_init::RUNLIST_ID,
        offset_of!(NvGpuTaskInitCtx, runlist_id)
    );
    assert_eq!(task_init::LEN as usize, size_of::<NvGpuTaskInitCtx>());

    assert_eq!(bind::TSG_ID, offset_of!(NvGpuBindCtx, tsg_id));
    assert_eq!(bind::RUNLIST_ID, offset_of!(NvGpuBindCtx, runlist_id));
    assert_eq!(bind::CHANNEL_COUNT, offset_of!(NvGpuBindCtx, channel_count));
    assert_eq!(bind::TIMESLICE_US, offset_of!(NvGpuBindCtx, timeslice_us));
    assert_eq!(
        bind::INTERLEAVE_LEVEL,
        offset_of!(NvGpuBindCtx, interleave_level)
    );
    assert_eq!(bind::ALLOW, offset_of!(NvGpuBindCtx, allow));
    assert_eq!(bind::LEN as usize, size_of::<NvGpuBindCtx>());

    assert_eq!(
        token_request::CHANNEL_ID,
        offset_of!(NvGpuTokenRequestCtx, channel_id)
    );
    assert_eq!(
        token_request::TSG_ID,
        offset_of!(NvGpuTokenRequestCtx, tsg_id)
    );
    assert_eq!(
        token_request::TOKEN,
        offset_of!(NvGpuTokenRequestCtx, token)
    );
    assert_eq!(
        token_request::LEN as usize,
        size_of::<NvGpuTokenRequestCtx>()
    );

    assert_eq!(
        task_destroy::TSG_ID,
        offset_of!(NvGpuTaskDestroyCtx, tsg_id)
    );
    assert_eq!(task_destroy::LEN as usize, size_of::<NvGpuTaskDestroyCtx>());
    assert!(CTX_MAX >= size_of::<NvGpuTaskInitCtx>() && CTX_MAX >= size_of::<NvGpuBindCtx>());
    for h in [
        hook::TASK_INIT,
        hook::BIND,
        hook::TOKEN_REQUEST,
        hook::TASK_DESTROY,
    ] {
        assert!(abi::capture_len(h) as usize <= CTX_MAX);
    }
}

/// The bytes of a context struct, as the fork's RM fills it on its stack.
fn bytes<T>(ctx: &T) -> Vec<u8> {
    // SAFETY: the context structs above are plain integers; their padding is zeroed by the
    // `zeroed()` they are built from.
    unsafe { std::slice::from_raw_parts((ctx as *const T).cast::<u8>(), size_of::<T>()) }.to_vec()
}

fn record(hook: u32, ctx: &[u8]) -> NvSchedRecord {
    let mut buf = [0u8; CTX_MAX];
    buf[..ctx.len()].copy_from_slice(ctx);
    NvSchedRecord {
        hdr: RecordHeader {
            kind: record_kind::NV_SCHED,
            cpu: 0,
            ts_ns: 1,
            tgid: 7,
            tid: 7,
            comm: [0; 16],
        },
        hook,
        source: hook_source::KPROBE,
        ctx_len: ctx.len() as u32,
        syscall_nr: 16,
        syscall_arg0: 3,
        ctx: buf,
    }
}

fn zeroed<T>() -> T {
    // SAFETY: only used for the all-integer context structs above.
    unsafe { std::mem::zeroed() }
}

#[test]
fn contexts_filled_as_the_fork_fills_them_decode_to_the_same_values() {
    // kchangrpapiConstruct_IMPL for a PyTorch TSG on GR0 (alloc engineType 1 → RM GR0), right
    // after kchangrpSetInterleaveLevel(MEDIUM): hardware TSG id 1, default timeslice 1024 µs.
    let mut init: NvGpuTaskInitCtx = zeroed();
    init.tsg_id = 1;
    init.engine_type = RM_ENGINE_TYPE_GR0;
    init.default_timeslice = 1024;
    init.default_interleave = INTERLEAVE_MEDIUM;
    init.runlist_id = 0;
    assert_eq!(
        gpu_ext::decode(&record(hook::TASK_INIT, &bytes(&init))).hook,
        Some(GxHook::TaskInit {
            tsg_id: 1,
            engine_type: RM_ENGINE_TYPE_GR0,
            default_timeslice_us: 1024,
        })
    );
    // kchangrpapiCtrlCmdGpFifoSchedule_IMPL: the bind of that TSG, 8 channels, and each level
    // RM can store; a value RM never stores is unknown, not a level.
    for (level, want) in [
        (INTERLEAVE_LOW, Some(Interleave::Low)),
        (INTERLEAVE_MEDIUM, Some(Interleave::Medium)),
        (INTERLEAVE_HIGH, Some(Interleave::High)),
        (3, None),
    ] {
        let mut b: NvGpuBindCtx = zeroed();
        b.tsg_id = 1;
        b.runlist_id = 13;
        b.channel_count = 8;
        b.timeslice_us = 1024;
        b.interleave_level = level;
        b.allow = 1;
        assert_eq!(
            gpu_ext::decode(&record(hook::BIND, &bytes(&b))).hook,
            Some(GxHook::Bind {
                tsg_id: 1,
                runlist_id: 13,
                channel_count: 8,
                timeslice_us: 1024,
                interleave: want,
                allow: true,
            }),
            "interleave_level {level}"
        );
    }
    let mut t: NvGpuTokenRequestCtx = zeroed();
    t.channel_id = 0x2a;
    t.tsg_id = 1;
    t.token = 0x000d_002a;
    assert_eq!(
        gpu_ext::decode(&record(hook::TOKEN_REQUEST, &bytes(&t))).hook,
        Some(GxHook::TokenRequest {
            channel_id: 0x2a,
            tsg_id: 1,
            token: 0x000d_002a,
        })
    );
}

/// The seed's example lines (`gpu-trace-core/src/output/text.rs`) show the first TSG of a PyTorch
/// process as `engine=COPY … interleave=UNKNOWN` at init and `interleave=LOW` at schedule. With
/// the encodings of the driver code, that TSG's values are engine_type 1 and interleave 1 (0 at
/// init in versions A and B of the fork, which set the level after the hook): GR0 and MEDIUM.
/// Read with the comment encodings (GRAPHICS 0, LOW 1, MEDIUM 2, HIGH 3) the same numbers give
/// exactly the seed's words: those lines were decoded with the wrong table.
#[test]
fn the_seed_lines_are_the_driver_values_read_with_the_comment_encodings() {
    let comment_engine = |v: u32| if v == 0 { "GRAPHICS" } else { "COPY" };
    let comment_interleave = |v: u32| match v {
        1 => "LOW",
        2 => "MEDIUM",
        3 => "HIGH",
        _ => "UNKNOWN",
    };
    assert_eq!(comment_engine(RM_ENGINE_TYPE_GR0), "COPY");
    assert_eq!(comment_interleave(0), "UNKNOWN");
    assert_eq!(comment_interleave(INTERLEAVE_MEDIUM), "LOW");
    // gpu-trace's reading of the same numbers.
    let mut b: NvGpuBindCtx = zeroed();
    b.interleave_level = INTERLEAVE_MEDIUM;
    match gpu_ext::decode(&record(hook::BIND, &bytes(&b))).hook {
        Some(GxHook::Bind { interleave, .. }) => assert_eq!(interleave, Some(Interleave::Medium)),
        other => panic!("{other:?}"),
    }
    assert_ne!(RM_ENGINE_TYPE_GR0, RM_ENGINE_TYPE_COPY0);
}

/// The field declarations of C struct `name` in `src`, normalized to `type name`.
fn c_struct_fields(src: &str, name: &str) -> Vec<String> {
    let start = src
        .find(&format!("struct {name} {{"))
        .unwrap_or_else(|| panic!("struct {name} not in the source"));
    let body = &src[start..];
    let body = &body[body.find('{').unwrap() + 1..body.find("};").unwrap()];
    body.split(';')
        .map(|f| f.split_whitespace().collect::<Vec<_>>().join(" "))
        .filter(|f| !f.is_empty())
        .collect()
}

#[test]
fn the_lab_stand_in_declares_the_fork_structs_and_fills_the_fork_encodings() {
    let src = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../lab/modules/nvlab/nvlab.c"
    ))
    .unwrap();
    for (name, fields) in FORK_STRUCTS {
        assert_eq!(c_struct_fields(&src, name), fields, "struct {name}");
    }
    // What it writes: engine_type RM GR0, interleave MEDIUM (the values RM has at both hooks).
    assert!(src.contains(&format!(
        "#define NVLAB_INTERLEAVE_MEDIUM {INTERLEAVE_MEDIUM}u"
    )));
    assert!(src.contains(&format!("ctx.engine_type = {RM_ENGINE_TYPE_GR0};")));
    // And the C text of the fork is what the Rust copies above mirror (same names, same order).
    let rust_fields: [&[&str]; 4] = [
        &[
            "tsg_id",
            "engine_type",
            "default_timeslice",
            "default_interleave",
            "runlist_id",
        ],
        &[
            "tsg_id",
            "runlist_id",
            "channel_count",
            "timeslice_us",
            "interleave_level",
            "allow",
        ],
        &["channel_id", "tsg_id", "token"],
        &["tsg_id"],
    ];
    for ((name, c), rust) in FORK_STRUCTS.iter().zip(rust_fields) {
        let names: Vec<&str> = c.iter().map(|f| f.split(' ').nth(1).unwrap()).collect();
        assert_eq!(names, rust, "{name}");
    }
}

/// The `C` text of function `name`'s body in `src` (from its opening line to the first line that
/// is a lone `}`).
fn c_function_body<'a>(src: &'a str, signature: &str) -> &'a str {
    let start = src
        .find(signature)
        .unwrap_or_else(|| panic!("{signature} not in the source"));
    let body = &src[start..];
    &body[..body.find("\n}\n").expect("the function's end")]
}

/// Since nvlab hands out work-submit tokens (issue 20) it calls `token_request` as the fork's
/// `kchannelNotifyWorkSubmitToken` does: with every field of the fork's context filled (channel
/// id, TSG hardware id, token) and the token it writes into the control's parameters. And it
/// reads the control's parameter pointer and size at NVOS54's offsets, the ones gpu-trace-common
/// pins from the driver's headers (docs/driver-abi.md A2).
#[test]
fn the_lab_stand_in_fills_the_whole_token_request_context() {
    let src = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../lab/modules/nvlab/nvlab.c"
    ))
    .unwrap();
    let control = c_function_body(&src, "static u32 nvlab_control(");
    let (_, fields) = FORK_STRUCTS[2];
    for field in fields {
        let name = field.split(' ').nth(1).unwrap();
        assert!(
            control.contains(&format!("tctx.{name} = ")),
            "nvlab_control does not fill token_request's {name}"
        );
    }
    assert!(control.contains("value = tctx.token;"));
    assert!(control.contains("nv_gpu_sched_token_request(&tctx);"));
    let escape = c_function_body(&src, "static long nvlab_escape(");
    use gpu_trace_common::nvidia::off;
    assert!(escape.contains(&format!(
        "memcpy(&ctl_params, block + {}, sizeof(ctl_params));",
        off::CONTROL_PARAMS_PTR
    )));
    assert!(escape.contains(&format!(
        "memcpy(&ctl_size, block + {}, sizeof(ctl_size));",
        off::CONTROL_PARAMS_SIZE
    )));
}
