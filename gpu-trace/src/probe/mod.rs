//! What the running kernel allows: structure offsets from BTF, privileges, tracefs, devices.
pub mod btf;
pub mod cgroup;
pub mod kallsyms;
pub mod system;
pub mod trial;
