//! NVIDIA: the RM ioctl records decoded into typed calls ([`decode`], [`gpu_ext`]) and the
//! tracker that turns them into events ([`model`]).
pub mod decode;
pub mod gpu_ext;
pub mod model;

use crate::{
    event::{Event, Origin},
    inventory::{InventoryProcess, MpsRole},
    source::{Fact, Source},
    wire::RawRecord,
};
use decode::{ControlParams, RmCall};
use model::{NvInput, NvTracker};

/// NVIDIA's records: RM ioctls, fd closes and gpu_ext hooks.
impl Source for NvTracker {
    fn observe_record(
        &mut self,
        origin: Origin,
        record: &RawRecord,
        events: &mut Vec<Event>,
    ) -> Option<Fact> {
        let (input, fact) = match record {
            RawRecord::NvIoctl(rec) => {
                let call = decode::decode(rec);
                let errno = decode::errno(rec);
                let fact = match call {
                    RmCall::Malformed { .. } => Some(Fact::Malformed),
                    // Which GPU an RM device instance is: the driver's answer to the process.
                    RmCall::Control {
                        status: 0,
                        params:
                            ControlParams::GpuIdInfo {
                                gpu_id,
                                device_instance,
                                ..
                            },
                        ..
                    } if errno == 0 => Some(Fact::DeviceIsGpu {
                        device_instance,
                        gpu_id,
                    }),
                    _ => None,
                };
                let input = NvInput::Call {
                    fd: decode::fd(rec),
                    errno,
                    call,
                };
                (input, fact)
            }
            RawRecord::FdClose(t) => (NvInput::FdClose { fd: t.value }, None),
            RawRecord::NvSched(rec) => (NvInput::Sched(gpu_ext::decode(rec)), None),
            _ => return None,
        };
        events.extend(self.observe(origin, input));
        fact
    }

    fn process_exited(&mut self, origin: Origin, events: &mut Vec<Event>) {
        events.extend(self.observe(origin, NvInput::ProcessExit));
    }

    fn inventoried(&mut self, p: &InventoryProcess) {
        if p.uses_nvidia() {
            self.preexisting(
                p.pid,
                &p.comm,
                &p.control_fds(),
                p.mps == Some(MpsRole::Server),
            );
        }
    }

    fn live_tasks(&self) -> usize {
        NvTracker::live_tasks(self)
    }

    fn unreported(&self) -> Vec<(&'static str, u64)> {
        let nv = self.counters();
        vec![
            ("schedule_unreadable", nv.schedule_unreadable),
            ("unreadable_params", nv.unreadable_params),
            ("unknown_handle", nv.unknown_handle),
            ("pretrace_calls", nv.pretrace_calls),
            ("replaced_handles", nv.replaced_handles),
            ("failed_tsg_allocs", nv.failed_tsg_allocs),
            ("gpu_ext_unmatched", nv.gpu_ext_unmatched),
            ("gpu_ext_outside_ioctl", nv.gpu_ext_outside_ioctl),
        ]
    }

    fn untracked_handles(&self) -> u64 {
        self.counters().untracked_handles
    }
}
