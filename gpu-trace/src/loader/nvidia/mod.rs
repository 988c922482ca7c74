//! NVIDIA's hooks on the `nvidia` module's own functions, with the kit of
//! [`super::module_hooks`]: the driver's ioctl and release entry points ([`entry`]) and a
//! gpu_ext-patched driver's scheduling hooks ([`gpu_ext`]).

pub mod entry;
pub mod gpu_ext;
