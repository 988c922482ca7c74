//! What the running kernel allows: structure offsets from BTF, privileges, tracefs, LSMs,
//! symbols, devices and drivers. The only part of gpu-trace that reads `/proc` and `/sys`; the
//! parsers of what it reads are pure functions beside the readers, tested on captured text.
pub mod amd;
pub mod btf;
pub mod cgroup;
pub mod devices;
pub mod elf;
pub mod inventory;
pub mod kallsyms;
pub mod kernel;
pub mod libraries;
pub mod linker;
pub mod nvml;
pub mod pods;
pub mod share;
pub mod system;
pub mod trial;
pub mod untrusted;
