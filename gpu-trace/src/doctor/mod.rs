//! `gpu-trace doctor`: what this machine allows, per vendor and per hook, and why not where it
//! does not — each "no" names the fix — then whether tracing and `--deny-pid` can work.
//!
//! Three parts:
//! - `facts`: [`Facts::gather`] asks [`crate::probe`] what the system has (privileges, BTF,
//!   tracefs, LSMs, lockdown, kprobes, kallsyms, ftrace's function list, driver versions and
//!   device nodes), tries each hook for real with a trivial program ([`crate::probe::trial`]),
//!   and loads gpu-trace's own programs the way `gpu-trace` would; the hooks it asks about come
//!   from [`crate::targets`], the table the loader attaches from;
//! - `rows`: [`evaluate`] turns those facts into the table and the two verdicts. It is pure, and
//!   tested on text captured on the CI machine and on the GPU host;
//! - `render`: the report as text or JSON.
//!
//! Exit status ([`Report::exit_code`]): 0 when tracing and `--deny-pid` can both work, 5 when
//! tracing can but `--deny-pid` cannot, 3 when tracing cannot.

mod facts;
mod render;
mod rows;
#[cfg(test)]
mod tests;

/// The LSM list parser, where the tests of doctor's rows look for it.
pub use crate::probe::system::lsm_list;
pub use facts::{
    DevNode, Facts, GPU_EXT_HOOK, KFD_DEEP, LSM_HOOK, LSM_SYMBOL, ModuleBtf, PROBE_FUNCTION,
    TracerLoad, base_trials, symbols_of_interest,
};
pub use rows::{
    API_ATTACH, KERNEL_FEATURES, Report, Row, Scope, Status, Verdict, evaluate, exit, hook,
};
