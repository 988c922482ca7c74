//! Tests of the statistics ([`super`]).

use super::*;
use crate::event::{Origin, TaskId, ValueSource};

fn ev(ts_ns: u64, pid: u32, comm: &str, kind: EventKind) -> Event {
    Event {
        key: None,
        amd: None,
        api: None,
        origin: Origin {
            ts_ns,
            cpu: 0,
            pid,
            tid: pid,
            comm: comm.into(),
        },
        kind,
    }
}

fn init() -> EventKind {
    EventKind::TaskInit {
        task: TaskId::HwTsg(1),
        client: 1,
        engine: None,
        engine_type: None,
        timeslice_us: None,
        timeslice_source: ValueSource::DriverDefault,
        interleave: None,
        interleave_source: ValueSource::DriverDefault,
        runlist: None,
        gpu: None,
    }
}

fn schedule(allowed: bool) -> EventKind {
    EventKind::Schedule {
        task: TaskId::HwTsg(1),
        client: 1,
        channels: None,
        timeslice_us: None,
        interleave: None,
        allowed,
        rm_status: Some(if allowed { 0 } else { 0x1f }),
        errno: 0,
        via_channel: false,
    }
}

fn submit() -> EventKind {
    EventKind::WorkSubmit {
        task: TaskId::HwTsg(1),
        client: 1,
        channel_handle: 2,
        chid: None,
        runlist: None,
        token: 3,
        gpu: None,
    }
}

fn destroy(cause: DestroyCause) -> EventKind {
    EventKind::TaskDestroy {
        final_params: None,
        task: TaskId::HwTsg(1),
        client: 1,
        cause,
        implicit: cause.is_implicit(),
    }
}

/// python3 (pid 637320): 4 inits, 4 schedules, 20 submits, 4 implicit destroys, over
/// 12.3 s; other (pid 42): one refused schedule and one explicit destroy.
fn sample() -> Stats {
    let mut s = Stats::new();
    let base = 1_000_000_000_000;
    let mut t = base;
    for _ in 0..4 {
        s.record(&ev(t, 637320, "python3", init()));
        s.record(&ev(t + 1, 637320, "python3", schedule(true)));
        for _ in 0..5 {
            s.record(&ev(t + 2, 637320, "pt_main_thread", submit()));
        }
        t += 1_000;
    }
    for _ in 0..4 {
        s.record(&ev(
            base + 12_300_000_000,
            637320,
            "cuda-EvtHandlr",
            destroy(DestroyCause::ProcessExit),
        ));
    }
    s.record(&ev(base + 5, 42, "other", schedule(false)));
    s.record(&ev(base + 6, 42, "other", destroy(DestroyCause::Free)));
    s
}

#[test]
fn unreported_calls_are_printed_by_reason_only_when_non_zero() {
    let mut stats = Stats::new();
    stats.unreported.insert("schedule_disable", 2);
    stats.unreported.insert("unknown_handle", 0);
    let text = stats.render_text(false);
    let line = text
        .lines()
        .find(|l| l.starts_with("schedule_disable"))
        .expect(&text);
    assert!(line.trim_end().ends_with(" 2"), "{line}");
    assert!(!text.contains("unknown_handle"), "{text}");
}

fn api_row(pid: u32, symbol: &str, calls: u64) -> CallStats {
    CallStats {
        errors: 1,
        total_ns: calls * 2000,
        ..CallStats::for_test(pid, symbol, calls)
    }
}

/// `--api`: the latest figures of each (process, library, symbol) replace its last ones;
/// the "API calls" table is in the block only once there is a row; past [`MAX_API_ROWS`]
/// a new row is counted, not kept (a known one still updates).
#[test]
fn api_rows_keep_the_latest_figures_bounded_and_show_only_when_there_are_some() {
    let mut s = Stats::new();
    assert!(!s.render_text(false).contains("API calls"));
    s.record_api(&api_row(7, "cuInit", 3), 1);
    s.record_api(&api_row(7, "cuInit", 9), 2);
    s.record_api(&api_row(8, "cuMemAlloc_v2", 4), 2);
    let rows: Vec<_> = s.api_rows().map(|r| (r.pid, r.calls)).collect();
    assert_eq!(rows, [(7, 9), (8, 4)]);
    let text = s.render_text(false);
    let table = text.split("API calls:\n").nth(1).expect("the table");
    let lines: Vec<&str> = table.lines().take(3).collect();
    assert!(lines[0].contains("SYMBOL"), "{text}");
    assert!(
        lines[1]
            .split_whitespace()
            .eq(["7", "cuInit", "9", "1", "18", "2", "2", "libcuda.so.1"]),
        "{text}"
    );
    assert!(lines[2].starts_with("       8 cuMemAlloc_v2"), "{text}");
    for pid in 0..MAX_API_ROWS as u32 {
        s.record_api(&api_row(100 + pid, "cuInit", 1), 1);
    }
    assert_eq!(s.api_rows().count(), MAX_API_ROWS);
    assert_eq!(s.api_dropped, 2);
    s.record_api(&api_row(7, "cuInit", 10), 3);
    assert_eq!(s.api_dropped, 2);
    assert!(s.render_text(false).contains("api_rows_dropped"));
}

#[test]
fn counts_events_and_processes() {
    let s = sample();
    assert_eq!(s.task_init, 4);
    assert_eq!(s.schedule, 5);
    assert_eq!(s.schedule_refused, 1);
    assert_eq!(s.work_submit, 20);
    assert_eq!(s.task_destroy, 5);
    assert_eq!(s.task_destroy_implicit, 4);
    assert_eq!(s.events(), 34);
    assert_eq!(s.live_at_exit, 0);
    let p = s.process(637320).unwrap();
    assert_eq!(p.comm, "python3", "first seen comm is kept");
    assert_eq!((p.task_init, p.schedule, p.schedule_refused), (4, 4, 0));
    assert_eq!((p.work_submit, p.task_destroy), (20, 4));
    let o = s.process(42).unwrap();
    assert_eq!((o.schedule, o.schedule_refused, o.task_destroy), (1, 1, 1));
    let pids: Vec<u32> = s.processes().map(|(pid, _)| pid).collect();
    assert_eq!(pids, [42, 637320]);
    assert_eq!(s.duration(), Duration::from_nanos(12_300_000_000));
}

/// An event of the task with handle `handle` of process 7, client 9.
fn keyed(ts_ms: u64, handle: u32, kind: EventKind) -> Event {
    let mut e = ev(ts_ms * 1_000_000, 7, "app", kind);
    e.key = Some(TaskKey {
        pid: 7,
        client: Some(9),
        object: handle,
        generation: 1,
    });
    e
}

fn keyed_init(handle: u32, engine: crate::event::Engine) -> EventKind {
    EventKind::TaskInit {
        task: TaskId::RmHandle(handle),
        client: 9,
        engine: Some(engine),
        engine_type: None,
        timeslice_us: Some(1024),
        timeslice_source: ValueSource::DriverDefault,
        interleave: Some(Interleave::Medium),
        interleave_source: ValueSource::DriverDefault,
        runlist: None,
        gpu: Some(0),
    }
}

fn keyed_submit(handle: u32, runlist: u32) -> EventKind {
    EventKind::WorkSubmit {
        task: TaskId::RmHandle(handle),
        client: 9,
        channel_handle: 1,
        chid: Some(1),
        runlist: Some(runlist),
        token: 1,
        gpu: Some(0),
    }
}

fn keyed_update(handle: u32, change: SchedChange, allowed: bool) -> EventKind {
    EventKind::SchedUpdate {
        task: TaskId::RmHandle(handle),
        client: 9,
        change,
        allowed,
        rm_status: Some(if allowed { 0 } else { 0x1f }),
        errno: 0,
        via_channel: false,
    }
}

#[test]
fn per_task_latencies_parameters_and_concurrency() {
    use crate::event::Engine;
    let mut s = Stats::new();
    let (a, b) = (0x10, 0x20);
    let mut sched = schedule(true);
    if let EventKind::Schedule { task, client, .. } = &mut sched {
        *task = TaskId::RmHandle(a);
        *client = 9;
    }
    let preempt = SchedChange::Preempt {
        wait: true,
        manual_timeout: false,
        timeout_us: 0,
    };
    let ts = |new_us| SchedChange::Timeslice {
        old_us: Some(1024),
        old_source: Some(ValueSource::DriverDefault),
        new_us,
    };
    for e in [
        keyed(100, a, keyed_init(a, Engine::Graphics)),
        keyed(103, a, keyed_submit(a, 2)),
        keyed(105, a, sched),
        keyed(106, a, keyed_update(a, ts(2048), true)),
        keyed(107, a, keyed_update(a, ts(9999), false)),
        keyed(108, a, keyed_update(a, preempt.clone(), true)),
        keyed(109, b, keyed_init(b, Engine::Copy)),
        keyed(111, b, keyed_submit(b, 2)),
        keyed(150, a, destroy_of(a)),
    ] {
        s.record(&e);
    }
    let tasks: Vec<&TaskStats> = s.tasks().collect();
    assert_eq!(tasks.len(), 2);
    // Ended first, then the live one.
    let t = tasks[0];
    assert_eq!(t.key.to_string(), "7:0x00000009:0x00000010");
    assert_eq!(t.engine.as_deref(), Some("GRAPHICS"));
    assert_eq!(t.lifetime_ns(), Some(50_000_000));
    assert_eq!(t.init_to_schedule_ns(), Some(5_000_000));
    assert_eq!(t.init_to_submit_ns(), Some(3_000_000));
    // The accepted 2048 stays; the refused 9999 is counted, not applied.
    assert_eq!(t.timeslice_us, Some(2048));
    assert_eq!(
        (t.preemptions, t.param_changes, t.updates_refused),
        (1, 1, 1)
    );
    assert_eq!(t.end_cause, Some(DestroyCause::Free));
    let u = tasks[1];
    assert_eq!((u.end_ns, u.init_to_schedule_ns()), (None, None));
    assert_eq!(u.init_to_submit_ns(), Some(2_000_000));
    // Both lived at once on GPU 0 and on runlist 2 (from 111 ms to 150 ms).
    let gpus: Vec<_> = s.gpu_concurrency().collect();
    assert_eq!(
        gpus,
        [(
            Some(0),
            Concurrency {
                live: 1,
                max_live: 2
            }
        )]
    );
    let runlists: Vec<_> = s.runlist_concurrency().collect();
    assert_eq!(
        runlists,
        [(
            (Some(0), 2),
            Concurrency {
                live: 1,
                max_live: 2
            }
        )]
    );
    let engines: Vec<(&str, u64, u64, u64)> = s
        .engines()
        .map(|(n, e)| (n, e.task_init, e.sched_update, e.preempt))
        .collect();
    assert_eq!(engines, [("COPY", 1, 0, 0), ("GRAPHICS", 1, 3, 1)]);
    assert_eq!(
        (s.sched_update, s.sched_update_refused, s.preempt),
        (3, 1, 1)
    );
    let p = s.process(7).unwrap();
    assert_eq!((p.sched_update, p.preempt), (3, 1));
    // The text block lists both tasks, in ms (key in 29 columns, engine in 10, the numbers
    // right-aligned in 9, interleave in 10, the counts in 7).
    let text = s.render_text(false);
    assert!(
        text.contains(
            "7:0x00000009:0x00000010       GRAPHICS      50.000     5.000     3.000      2048 MEDIUM           1       1 free"
        ),
        "{text}"
    );
    assert!(text.contains(" alive\n"), "{text}");
}

#[test]
fn live_tasks_of_one_process_are_capped_and_an_end_makes_room() {
    use crate::event::Engine;
    let mut s = Stats::new();
    let n = MAX_LIVE_TASKS_PER_PROCESS as u32 + 5;
    for h in 0..n {
        s.record(&keyed(1, h, keyed_init(h, Engine::Copy)));
    }
    assert_eq!(s.live_tasks.len(), MAX_LIVE_TASKS_PER_PROCESS);
    assert_eq!(s.tasks_omitted, 5);
    // One ends: the next new task of the process is followed.
    s.record(&keyed(2, 0, destroy_of(0)));
    s.record(&keyed(3, n + 1, keyed_init(n + 1, Engine::Copy)));
    assert_eq!(s.live_tasks.len(), MAX_LIVE_TASKS_PER_PROCESS);
    assert_eq!(s.tasks_omitted, 5);
    // Another process is not held back by this one.
    let mut other = keyed(3, 1, keyed_init(1, Engine::Copy));
    other.origin.pid = 8;
    other.key = other.key.map(|k| TaskKey { pid: 8, ..k });
    s.record(&other);
    assert_eq!(s.live_tasks.len(), MAX_LIVE_TASKS_PER_PROCESS + 1);
}

#[test]
fn task_lists_are_bounded() {
    use crate::event::Engine;
    let mut s = Stats::new();
    let n = MAX_TASKS_KEPT as u32 + 3;
    for h in 0..n {
        s.record(&keyed(1, h, keyed_init(h, Engine::Copy)));
        s.record(&keyed(2, h, destroy_of(h)));
    }
    assert_eq!(s.tasks().count(), MAX_TASKS_KEPT);
    assert_eq!(s.tasks_omitted, 3);
    let text = s.render_text(false);
    let rows = text.lines().filter(|l| l.starts_with("7:0x")).count();
    assert_eq!(rows, MAX_TASKS_PRINTED);
    assert!(
        text.contains(&format!(
            "\n... {} more tasks (--format json lists them)\n",
            MAX_TASKS_KEPT - MAX_TASKS_PRINTED
        )),
        "{text}"
    );
    assert!(text.contains("(3 events of tasks beyond"), "{text}");
    // Every one of them was counted, kept or not.
    assert_eq!((s.task_init, s.task_destroy), (u64::from(n), u64::from(n)));
}

fn destroy_of(handle: u32) -> EventKind {
    EventKind::TaskDestroy {
        task: TaskId::RmHandle(handle),
        client: 9,
        cause: DestroyCause::Free,
        implicit: false,
        final_params: None,
    }
}

#[test]
fn tracer_exit_counts_as_live_at_exit() {
    let mut s = Stats::new();
    s.record(&ev(1, 7, "a", destroy(DestroyCause::TracerExit)));
    assert_eq!(s.task_destroy, 0);
    assert_eq!(s.live_at_exit, 1);
    assert!(s.process(7).is_none());
    assert_eq!(s.duration(), Duration::ZERO);
}

/// `--api`: the statistics list each interposer's latest verdict and each process's
/// hand-outs (the hidden ones by name), escaped; nothing of the kind without them.
#[test]
fn renders_interposer_verdicts_and_hand_outs() {
    use crate::api::path::{ApiPath, Handout, PathSymbol};
    let mut stats = Stats::new();
    assert!(!stats.render_text(false).contains("API interposers"));
    let path = |through| ApiPath {
        pid: 42,
        comm: "python3".into(),
        library: "/opt/libvgpu.so".into(),
        preload: true,
        symbols: vec![PathSymbol {
            symbol: "cuLaunchKernel".into(),
            through,
            total: 10,
        }],
        lookups: 1,
        api_lookups: 1,
        overrides: vec!["dlsym".into()],
        last: false,
    };
    stats.record_api_path(&path(3));
    stats.record_api_path(&path(10));
    let handout = |symbol: &str, hidden| Handout {
        pid: 42,
        comm: "python3".into(),
        symbol: symbol.into(),
        lookup: "cuGetProcAddress_v2".into(),
        lookup_library: "/opt/libvgpu.so".into(),
        library: Some("/opt/libvgpu.so".into()),
        offset: 0x1196,
        address: 0x7f00_0000_1196,
        function: Some("hook\u{1b}[31m".into()),
        hidden,
    };
    stats.record_handout(&handout("cuLaunchKernel", true));
    stats.record_handout(&handout("cuMemAlloc_v2", false));
    let text = stats.render_text(false);
    let paths: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("  PATH pid 42 "))
        .collect();
    assert_eq!(
        paths,
        [
            "  PATH pid 42 /opt/libvgpu.so (LD_PRELOAD): on_path — 10 of 10 calls (cuLaunchKernel) passed through it; its dlsym saw 1 lookup, 1 for GPU API symbols"
        ],
        "{text}"
    );
    assert!(
        text.contains("  pid 42: 2, hidden 1: cuLaunchKernel -> libvgpu.so (hook\\x1b[31m)\n"),
        "{text}"
    );
    // Every hidden one counted, the first MAX_HIDDEN_SHOWN named.
    for _ in 0..MAX_HIDDEN_SHOWN + 3 {
        stats.record_handout(&handout("cuMemFree_v2", true));
    }
    let text = stats.render_text(false);
    let line = text.lines().find(|l| l.starts_with("  pid 42: ")).unwrap();
    assert!(line.starts_with("  pid 42: 21, hidden 20: "), "{line}");
    assert_eq!(line.matches(" -> ").count(), MAX_HIDDEN_SHOWN, "{line}");
}

#[test]
fn renders_the_block() {
    let s = sample();
    let expected = "\
--- gpu-trace statistics (12.3 s) ---
task_init           4
schedule            5   (refused 1)
sched_update        0   (refused 0, preempt 0)
work_submit        20
task_destroy        5   (implicit 4)
dropped             0
read_failed         0

PID      COMM             TASK_INIT SCHEDULE SCHED_UPDATE PREEMPT WORK_SUBMIT TASK_DESTROY
42       other                    0        1            0       0           0            1
637320   python3                  4        4            0       0          20            4
";
    assert_eq!(s.render_text(false), expected);
}

#[test]
fn renders_optional_counters_and_drop_warning() {
    let mut s = Stats {
        elapsed: Some(Duration::from_millis(2_040)),
        malformed: 2,
        decode_errors: 3,
        live_at_exit: 4,
        lost_samples: Some(0),
        ..Stats::default()
    };
    s.kernel = KernelCounters {
        dropped: 123_456,
        read_failed: 1,
        ignored: 9,
        emitted: 1_000_000,
        fd_lookup_failed: 5,
        denied: 0,
        skipped: None,
        denied_unread: None,
        deny_unfollowed: None,
    };
    let text = s.render_text(false);
    let expected = "\
--- gpu-trace statistics (2.0 s) ---
task_init             0
schedule              0   (refused 0)
sched_update          0   (refused 0, preempt 0)
work_submit           0
task_destroy          0   (implicit 0)
dropped          123456
read_failed           1
fd_lookup_failed      5
malformed             2
decode_errors         3
live_at_exit          4
lost_samples          0
warning: 123456 events were dropped because the ring buffer was full; raise --ring-size
";
    assert_eq!(text, expected);
    // -v adds the kernel side's internal counters after everything else.
    let verbose = s.render_text(true);
    assert_eq!(
        verbose.strip_prefix(expected),
        Some("\ndiagnostics (kernel side)\nemitted          1000000\nignored                9\n")
    );
}

#[test]
fn deny_counters_show_when_known_and_warn_when_a_denial_did_not_hold() {
    let mut s = Stats {
        elapsed: Some(Duration::from_millis(1_000)),
        ..Stats::default()
    };
    // Not known (a recording made before they were counted): nothing, also with -v.
    let unknown = s.render_text(true);
    assert!(!unknown.contains("denied_unread"), "{unknown}");
    assert!(!unknown.contains("deny_unfollowed"), "{unknown}");
    // Known and 0: nothing without -v; with -v, a 0 in the diagnostics section.
    s.kernel.denied_unread = Some(0);
    s.kernel.deny_unfollowed = Some(0);
    assert_eq!(
        s.render_text(false),
        Stats {
            elapsed: s.elapsed,
            ..Stats::default()
        }
        .render_text(false)
    );
    assert!(
        s.render_text(true).ends_with(
            "\ndiagnostics (kernel side)\nemitted             0\nignored             0\n\
             denied_unread       0\ndeny_unfollowed     0\n"
        ),
        "{}",
        s.render_text(true)
    );
    // Not zero: rows after `denied`, and a WARNING for the processes that were not denied.
    s.kernel.denied = 9;
    s.kernel.denied_unread = Some(4);
    s.kernel.deny_unfollowed = Some(3);
    let text = s.render_text(false);
    assert!(
        text.contains("\ndenied              9\ndenied_unread       4\ndeny_unfollowed     3\n"),
        "{text}"
    );
    assert!(
        text.contains(
            "\nWARNING: 3 process(es) created by denied processes were NOT denied: the \
             deny map was full"
        ),
        "{text}"
    );
    let verbose = s.render_text(true);
    assert!(
        verbose.ends_with(
            "\ndiagnostics (kernel side)\nemitted             0\nignored             0\n"
        ),
        "{verbose}"
    );
    // Only `deny_unfollowed` says a denial did not hold.
    s.kernel.deny_unfollowed = Some(0);
    assert!(!s.render_text(false).contains("WARNING"));
}

#[test]
fn empty_stats_still_print_dropped_and_read_failed() {
    let text = Stats::new().render_text(false);
    assert!(text.starts_with("--- gpu-trace statistics (0.0 s) ---\n"));
    assert!(text.contains("\ndropped             0\n"), "{text}");
    assert!(text.contains("\nread_failed         0\n"), "{text}");
    assert!(!text.contains("PID"));
    assert!(!text.contains("ring-size"));
    assert!(text.lines().all(|l| l.trim_end() == l));
}

// ---- Found by the mutation run of round 14 (docs/reliability.md, section 15) -------------

/// The container / pod rows sum their processes' counts, each kind apart; the host's row
/// (processes in none) last; no row at all while no process is in one.
#[test]
fn container_rows_sum_each_count_of_their_processes() {
    let mut s = Stats::new();
    let update = |change| {
        let mut e = keyed(1, 0x10, keyed_update(0x10, change, true));
        e.key = None;
        e
    };
    let preempt = SchedChange::Preempt {
        wait: true,
        manual_timeout: false,
        timeout_us: 0,
    };
    let slice = SchedChange::Timeslice {
        old_us: None,
        old_source: None,
        new_us: 2048,
    };
    // pid 10: n = 1 round, pid 11: 2, pid 12 (the host): 4; a round is one of each kind,
    // two schedules (`schedule` counts both, `schedule_refused` the refused one) and two
    // updates (`sched_update` counts both, `preempt` the preemption).
    for (pid, n) in [(10, 1), (11, 2), (12, 4)] {
        for _ in 0..n {
            let mut kinds = vec![
                init(),
                schedule(true),
                schedule(false),
                submit(),
                destroy(DestroyCause::Free),
            ];
            kinds.extend([update(slice.clone()).kind, update(preempt.clone()).kind]);
            for kind in kinds {
                s.record(&ev(1, pid, "p", kind));
            }
        }
    }
    assert!(s.groups().is_empty(), "no process in a container: no rows");
    s.set_group(10, "podman a".into(), None);
    s.set_group(11, "podman a".into(), None);
    let rows = s.groups();
    let counts = |p: &ProcessStats| {
        [
            p.task_init,
            p.schedule,
            p.schedule_refused,
            p.sched_update,
            p.preempt,
            p.work_submit,
            p.task_destroy,
        ]
    };
    let rows: Vec<_> = (rows.iter())
        .map(|(g, n, p)| (g.map(str::to_owned), *n, counts(p)))
        .collect();
    assert_eq!(
        rows,
        [
            (Some("podman a".to_owned()), 2, [3, 6, 3, 6, 3, 3, 3]),
            (None, 1, [4, 8, 4, 8, 4, 4, 4]),
        ]
    );
}

/// A task's refused schedules are each counted.
#[test]
fn a_tasks_refused_schedules_are_each_counted() {
    let mut s = Stats::new();
    let refused = |ts| {
        let mut sched = schedule(false);
        if let EventKind::Schedule { task, client, .. } = &mut sched {
            *task = TaskId::RmHandle(0x10);
            *client = 9;
        }
        keyed(ts, 0x10, sched)
    };
    s.record(&keyed(
        1,
        0x10,
        keyed_init(0x10, crate::event::Engine::Copy),
    ));
    for ts in 2..5 {
        s.record(&refused(ts));
    }
    let t = s.tasks().next().expect("the task");
    assert_eq!(t.schedule_refused, 3);
    assert_eq!(s.schedule_refused, 3);
}

/// `events()` is the sum of every kind `record` counts.
#[test]
fn events_is_the_sum_of_every_kind() {
    let mut s = Stats::new();
    (s.task_init, s.schedule, s.work_submit, s.task_destroy) = (1, 2, 4, 8);
    (s.sched_update, s.pretrace_end, s.mps_shared) = (16, 32, 64);
    assert_eq!(s.events(), 127);
}

/// NVIDIA: a GPU is shown by nvidia-smi's index once the run learned it (`?` before), and
/// JSON keeps RM's device instance apart; AMD: the driver's own number, no RM instance.
#[test]
fn gpus_are_shown_by_nvidia_smi_index_or_by_the_amd_drivers_number() {
    let mut s = Stats::new();
    assert_eq!(s.gpu_name(3), None);
    s.set_gpu_name(3, 1, Some("GPU-x"));
    assert_eq!(s.gpu_name(3), Some(&(1, Some("GPU-x".to_owned()))));
    assert_eq!(s.shown_gpu(Some(3)), Some(1));
    assert_eq!(s.shown_gpu(Some(4)), None, "not learned: not guessed");
    assert_eq!(s.rm_device(Some(3)), Some(Some(3)));
    assert_eq!(s.rm_device(None), Some(None));
    s.record(&ev(1, 5, "nv", init()));
    assert_eq!(
        s.shown_gpu(Some(4)),
        None,
        "an NVIDIA event changes nothing"
    );
    let mut amd = ev(2, 6, "hip", init());
    amd.amd = Some(crate::event::AmdDetail::default());
    s.record(&amd);
    assert_eq!(s.shown_gpu(Some(4)), Some(4));
    assert_eq!(s.rm_device(Some(4)), None);
    // Once an AMD event was seen, later NVIDIA ones do not take it back.
    s.record(&ev(3, 5, "nv", init()));
    assert_eq!(s.shown_gpu(Some(4)), Some(4));
}

/// A process's exit time is its first `process_exit` destroy; a destroy of another cause is
/// not an exit.
#[test]
fn a_process_exits_at_its_first_process_exit_destroy() {
    let mut s = Stats::new();
    s.record(&ev(10, 7, "a", init()));
    s.record(&ev(20, 7, "a", destroy(DestroyCause::Free)));
    assert_eq!(s.process(7).unwrap().exited_ns, None);
    s.record(&ev(30, 7, "a", destroy(DestroyCause::ProcessExit)));
    s.record(&ev(40, 7, "a", destroy(DestroyCause::ProcessExit)));
    assert_eq!(s.process(7).unwrap().exited_ns, Some(30));
}
