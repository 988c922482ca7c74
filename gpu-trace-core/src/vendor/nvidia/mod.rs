//! NVIDIA: the RM ioctl records decoded into typed calls ([`decode`], [`gpu_ext`]) and the
//! tracker that turns them into events ([`model`]).
pub mod decode;
pub mod gpu_ext;
pub mod model;
