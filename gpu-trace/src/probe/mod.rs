//! What the running kernel allows: structure offsets from BTF, privileges, tracefs, devices.
pub mod btf;
pub mod inventory;
pub mod kallsyms;
pub mod nvml;
pub mod system;
pub mod trial;
