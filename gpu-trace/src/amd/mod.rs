//! AMD KFD (`/dev/kfd`): the decoder is `gpu_trace_core::amd`; the facts about the running
//! system the tracer needs (the device's dynamic character major) are read by
//! [`crate::probe::kfd`], re-exported here for the callers that look for them under `amd`.
pub use gpu_trace_core::amd::*;

pub use crate::probe::kfd::{
    KFD_DEVICE_NAME, KFD_PATH, KfdPresence, driver_description, kfd_char_major,
};
