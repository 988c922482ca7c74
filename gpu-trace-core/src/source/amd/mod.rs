//! AMD KFD (`/dev/kfd`): decoding of the ioctl records ([`decode`]), the queue tracker
//! ([`model`]) and how its events' detail renders itself ([`render`]). (The facts about the
//! running system, such as the device's dynamic character major, are `gpu-trace`'s
//! `probe::kfd`.)
pub mod decode;
pub mod model;
pub mod render;

use crate::{
    event::{Event, Origin},
    source::{Fact, Source},
    wire::RawRecord,
};
use decode::KfdCall;
use model::{KfdInput, KfdTracker};

/// AMD's records: KFD ioctls and the deep hooks' queue records and driver steps. (A process's
/// fd closes end no queue: the module documentation of [`model`] says why.)
impl Source for KfdTracker {
    fn observe_record(
        &mut self,
        origin: Origin,
        record: &RawRecord,
        events: &mut Vec<Event>,
    ) -> Option<Fact> {
        let mut fact = None;
        let input = match record {
            RawRecord::KfdIoctl(rec) => {
                let call = decode::decode(rec);
                if matches!(call, KfdCall::Malformed { .. }) {
                    fact = Some(Fact::Malformed);
                }
                KfdInput::Call {
                    fd: decode::fd(rec),
                    errno: decode::errno(rec),
                    call,
                }
            }
            RawRecord::KfdQueue(rec) => KfdInput::QueueBuilt(decode::decode_queue(rec)),
            RawRecord::Deep(rec) => KfdInput::Deep(decode::decode_deep(rec)),
            _ => return None,
        };
        events.extend(self.observe(origin, input));
        fact
    }

    fn process_exited(&mut self, origin: Origin, events: &mut Vec<Event>) {
        events.extend(self.observe(origin, KfdInput::ProcessExit));
    }

    fn live_tasks(&self) -> usize {
        KfdTracker::live_tasks(self)
    }

    fn unreported(&self) -> Vec<(&'static str, u64)> {
        let kfd = self.counters();
        vec![
            ("unknown_queue", kfd.unknown_queue),
            ("replaced_queues", kfd.replaced_queues),
            ("deep_unmatched", kfd.deep_unmatched),
            ("deep_unknown", kfd.deep_unknown),
            ("kfd_release_no_queues", kfd.kfd_releases_without_queues),
        ]
    }

    fn untracked_handles(&self) -> u64 {
        self.counters().untracked_handles
    }
}

#[cfg(test)]
mod tests {
    /// The whole userspace path (parse → decode → track → render) on KFD records, text and
    /// JSON. The records are built from the documented UAPI layout (no AMD GPU was available;
    /// see `decode::testing`).
    fn render(format: crate::output::Format, verbose: bool) -> String {
        use crate::{
            output::TimestampMode as Timestamps,
            output::clock::Clock,
            pipeline::{Pipeline, PipelineConfig},
            source::amd::decode::testing::{self, CreateArgs, soc15_doorbell},
            wire::RawRecord,
        };
        let config = PipelineConfig {
            show_container: false,
            verbose,
            pids: Vec::new(),
            comms: Vec::new(),
            format,
            timestamps: Timestamps::Relative,
            stats: false,
            clock: Clock::new(0),
        };
        let mut out = Vec::new();
        let mut p = Pipeline::new(config, &mut out);
        let created = CreateArgs {
            queue_id: 2,
            doorbell_offset: soc15_doorbell(0xbeef, 16),
            ..CreateArgs::default()
        }
        .created(4242, 5);
        let refused = testing::record(
            4242,
            5,
            gpu_trace_common::amd::cmd::CREATE_QUEUE,
            -22,
            &CreateArgs::default().bytes(),
        );
        let exit = gpu_trace_common::TaskRecord {
            hdr: gpu_trace_common::RecordHeader {
                kind: gpu_trace_common::record_kind::PROCESS_EXIT,
                ..created.hdr
            },
            value: -1,
            _pad: 0,
        };
        for rec in [
            RawRecord::KfdIoctl(created),
            RawRecord::KfdIoctl(refused),
            RawRecord::KfdIoctl(testing::update(4242, 5, 2, 4096, 30, 2, 0)),
            RawRecord::KfdIoctl(testing::cu_mask(4242, 5, 2, 64, 0)),
            RawRecord::KfdIoctl(testing::cu_mask(4242, 5, 2, 33, -22)),
            RawRecord::ProcessExit(exit),
        ] {
            p.feed(rec.as_bytes()).unwrap();
        }
        p.finish(Default::default(), Default::default()).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn kfd_events_render_as_text() {
        let text = render(crate::output::Format::Text, true);
        let lines: Vec<&str> = text.lines().map(|l| &l[24..]).collect();
        assert_eq!(
            lines,
            [
                "TASK_INIT    PID=4242   hip_app          TSG=2    type=COMPUTE_AQL priority=7 percent=100 ring=1048576 gpu=48879 doorbell=0xefbbc00000000010",
                "WORK_SUBMIT  PID=4242   hip_app          TSG=2    doorbell=0xefbbc00000000010 offset=16 gpu=48879",
                "SCHEDULE     PID=4242   hip_app          TSG=2    via=create type=COMPUTE_AQL priority=7 percent=100 ring=1048576 gpu=48879 active=yes allowed=yes",
                "SCHEDULE     PID=4242   hip_app          TSG=?    via=create type=COMPUTE_AQL priority=7 percent=100 ring=1048576 gpu=48879 active=yes allowed=no errno=EINVAL",
                // UPDATE_QUEUE: priority 7 → 2, percentage 100 → 30 (the create's values before).
                "SCHED_UPDATE PID=4242   hip_app          TSG=2    via=update priority=7 -> 2 percent=100 -> 30 ring=4096 active=yes allowed=yes",
                // SET_CU_MASK: no mask was set before (`?`), then 64 → 33 refused.
                "SCHED_UPDATE PID=4242   hip_app          TSG=2    via=cu_mask cu_mask=? -> 64 priority=2 percent=30 ring=4096 active=yes allowed=yes",
                "SCHED_UPDATE PID=4242   hip_app          TSG=2    via=cu_mask cu_mask=64 -> 33 priority=2 percent=30 ring=4096 active=yes allowed=no errno=EINVAL",
                "TASK_DESTROY PID=4242   hip_app          TSG=2    cause=process_exit (implicit)",
            ]
        );
        assert!(
            text.lines()
                .all(|l| l.starts_with("       0.000000 [CPU02] ")),
            "{text}"
        );
        // Without -v, the doorbell line is left out.
        assert!(!render(crate::output::Format::Text, false).contains("WORK_SUBMIT"));
    }

    #[test]
    fn kfd_events_render_as_json() {
        let json = render(crate::output::Format::Json, true);
        let lines: Vec<serde_json::Value> = json
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 8, "{json}");
        let init = &lines[0];
        assert_eq!(init["event"], "TASK_INIT");
        assert_eq!(
            init["task"],
            serde_json::json!({"kind": "kfd_queue", "value": 2})
        );
        assert_eq!(init["gpu"], 0xbeef);
        assert_eq!(init["engine"], serde_json::Value::Null);
        assert_eq!(
            init["amd"],
            serde_json::json!({
                "queue_type": "COMPUTE_AQL", "queue_type_raw": 2, "priority": 7,
                "percentage": 100, "pm4_target_xcc": 0, "ring_size": 1048576, "active": true,
                "gpu_id": 48879, "doorbell_offset": 0xefbb_c000_0000_0010u64,
                "sdma_engine_id": 0, "cu_mask_bits": null,
                // Only the deep hooks see these; the ioctl layer leaves them unknown.
                "hw_doorbell": null, "vmid": null, "driver_active": null, "mqd_init_addr": null
            })
        );
        assert!(
            json.lines()
                .all(|l| l.ends_with('}') && l.contains(",\"amd\":{")),
            "{json}"
        );
        assert_eq!(lines[1]["token"], 16);
        assert_eq!(lines[2]["amd"]["via"], "create");
        let refused = &lines[3];
        assert_eq!(refused["task"], serde_json::json!({"kind": "kfd_no_queue"}));
        assert_eq!(
            (refused["allowed"].clone(), refused["errno"].clone()),
            (false.into(), (-22).into())
        );
        assert_eq!(refused["rm_status"], serde_json::Value::Null);
        // The run-unique key: process and queue id; none for a refused create (no queue).
        assert_eq!(init["key"], "4242:kfd:2");
        assert_eq!(lines[7]["key"], "4242:kfd:2");
        assert_eq!(refused["key"], serde_json::Value::Null);
        assert_eq!(
            (init["tsg"].clone(), refused["tsg"].clone()),
            ("2".into(), "?".into())
        );
        assert_eq!(init["handle"], serde_json::Value::Null);
        assert_eq!(lines[4]["event"], "SCHED_UPDATE");
        assert_eq!(
            lines[4]["change"],
            serde_json::json!({"what": "amd_queue", "old_priority": 7, "new_priority": 2,
                "old_percentage": 100, "new_percentage": 30})
        );
        assert_eq!(lines[5]["amd"]["cu_mask_bits"], 64);
        assert_eq!(lines[7]["cause"], "process_exit");
    }
}
