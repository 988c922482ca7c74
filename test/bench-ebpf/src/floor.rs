//! The benchmark floor: a kernel object of its own (`bench-floor`), built by xtask's build.rs
//! and loaded only by `cargo xtask bench` (xtask/src/bench/floor.rs), never by gpu-trace: this
//! crate is not part of the product, and the object gpu-trace loads does not contain these
//! programs. Empty programs on the hooks gpu-trace uses: what any program on
//! that hook costs every syscall of every process, so that the benchmark can tell gpu-trace's
//! own cost from the kernel's.
#![no_std]
#![no_main]

use aya_ebpf::{
    macros::{btf_tracepoint, raw_tracepoint, tracepoint},
    programs::{BtfTracePointContext, RawTracePointContext, TracePointContext},
};

/// Floor for `raw_tp/sys_exit`.
#[raw_tracepoint(tracepoint = "sys_exit")]
pub fn bench_floor_raw(_ctx: RawTracePointContext) -> i32 {
    0
}

/// Floor for `tp_btf/sys_exit`.
#[btf_tracepoint(function = "sys_exit")]
pub fn bench_floor_btf(_ctx: BtfTracePointContext) -> i32 {
    0
}

/// Floor for the classic `syscalls:sys_{enter,exit}_{ioctl,close}` tracepoints (attached to all
/// four, as gpu-trace's fallback is).
#[tracepoint]
pub fn bench_floor_tp(_ctx: TracePointContext) -> u32 {
    0
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";
