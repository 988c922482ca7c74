//! NVIDIA RM ioctl decoding (pure code): typed calls from captured records.
pub mod decode;
pub mod gpu_ext;
