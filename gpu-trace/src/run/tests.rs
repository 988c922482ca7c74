use gpu_trace_core::inventory::{GpuNode, Inventory};

use super::{
    late_attach::kernel_tracking,
    report::{describe_missed_runs, describe_program_stats, pid_warnings},
};
use crate::probe::system;
use clap::Parser as _;

#[test]
fn skipped_runs_are_reported_only_when_the_kernel_skipped_some() {
    let stats = |name: &str, missed| crate::loader::ProgramStats {
        name: name.into(),
        runs: 0,
        run_time_ns: 0,
        missed,
    };
    assert_eq!(
        describe_missed_runs(&[stats("sys_exit_btf", 0), stats("nv_ioctl_fexit", 0)]),
        None
    );
    let w = describe_missed_runs(&[
        stats("nv_ioctl_fexit", 2),
        stats("process_exit_raw", 0),
        stats("sys_exit_btf", 35),
    ])
    .unwrap();
    assert!(
        w.starts_with(
            "WARNING: the kernel skipped 37 run(s) of gpu-trace's programs \
             (nv_ioctl_fexit 2, sys_exit_btf 35)"
        ),
        "{w}"
    );
    // --bpf-stats names them on the program's own line.
    let lines = describe_program_stats(&[stats("sys_exit_btf", 35)]);
    assert!(
        lines[1].ends_with(", 35 skipped by the kernel"),
        "{lines:?}"
    );
}

#[test]
fn pid_warnings_name_absent_pids_and_threads() {
    // 10: a process; 11: a thread of 10; 12: nothing.
    let tgid = |pid| match pid {
        10 | 11 => Some(10),
        _ => None,
    };
    let w = pid_warnings(&[10, 11, 12], tgid);
    assert_eq!(w.len(), 2, "{w:?}");
    assert!(
        w[0].starts_with("--pid 11 is a thread of process 10"),
        "{}",
        w[0]
    );
    assert!(
        w[1].starts_with("--pid 12: no such process now; waiting"),
        "{}",
        w[1]
    );
    assert!(pid_warnings(&[10], tgid).is_empty());
}

#[test]
fn only_the_filtered_inventory_processes_are_tracked_in_the_kernel() {
    use crate::probe::inventory::test_process;
    let inv = Inventory {
        processes: vec![
            test_process(10, "python3", vec![(8, GpuNode::NvCtl)]),
            test_process(11, "bash", vec![(3, GpuNode::Watched)]),
            test_process(12, "python3", vec![(4, GpuNode::Kfd), (5, GpuNode::NvUvm)]),
        ],
        ..Inventory::default()
    };
    let args = |pids: Vec<u32>, comms: Vec<&str>| {
        let mut a = crate::cli::Cli::try_parse_from(["gpu-trace"])
            .unwrap()
            .trace
            .output;
        a.pids = pids;
        a.comms = comms.into_iter().map(String::from).collect();
        a
    };
    let (nv, kfd) = (crate::loader::TRACK_NV, crate::loader::TRACK_KFD);
    assert_eq!(
        kernel_tracking(&inv, &args(vec![], vec![])),
        [(10, nv), (11, nv), (12, nv | kfd)]
    );
    assert_eq!(kernel_tracking(&inv, &args(vec![11], vec![])), [(11, nv)]);
    assert_eq!(
        kernel_tracking(&inv, &args(vec![], vec!["python3"])),
        [(10, nv), (12, nv | kfd)]
    );
    assert!(kernel_tracking(&inv, &args(vec![10], vec!["bash"])).is_empty());
}

#[test]
fn pid_warnings_on_this_machine() {
    // This process exists; pid_max is at most 2^22, so this id cannot.
    let me = std::process::id();
    assert!(pid_warnings(&[me], system::thread_group_of).is_empty());
    assert_eq!(pid_warnings(&[1 << 23], system::thread_group_of).len(), 1);
}
