//! The metrics core against hand-built events: values checked in the exposition text, as a
//! scraper reads them.

use super::*;
use crate::event::{Engine, Interleave, Origin, ValueSource};

/// Observes `kind` from thread `thread` of process `process` (pid `pid`) at `ts_ns`. An event
/// that carries RM's device instance D comes as the pipeline hands it on a host where D is
/// nvidia-smi's GPU D (UUID not known): these tests are about the series, not the numbering
/// (`gpus_are_labelled_by_nvidia_smi_s_index_or_question_mark` is).
fn see_as(m: &mut Metrics, ts_ns: u64, pid: u32, thread: &str, process: &str, kind: EventKind) {
    let origin = Origin {
        ts_ns,
        cpu: 0,
        pid,
        tid: pid,
        comm: thread.into(),
    };
    let named = kind.driver_gpu().flatten().map(|d| GpuIdentity {
        index: d,
        uuid: None,
        bus_id: format!("0000:{d:02x}:00.0"),
        rm_device: d,
    });
    m.observe_on(
        &Event {
            amd: None,
            api: None,
            key: None,
            origin,
            kind,
        },
        process,
        None,
        named.as_ref(),
    );
}

/// Observes `kind` from the main thread of process `comm`.
fn see(m: &mut Metrics, ts_ns: u64, pid: u32, comm: &str, kind: EventKind) {
    see_as(m, ts_ns, pid, comm, comm, kind);
}

fn init(task: u32, engine: Engine, gpu: u32, timeslice_us: Option<u64>) -> EventKind {
    EventKind::TaskInit {
        task: TaskId::RmHandle(task),
        client: 7,
        engine: Some(engine),
        engine_type: None,
        timeslice_us,
        timeslice_source: ValueSource::DriverDefault,
        interleave: Some(Interleave::Medium),
        interleave_source: ValueSource::DriverDefault,
        runlist: None,
        gpu: Some(gpu),
    }
}

fn schedule(task: u32, allowed: bool, timeslice_us: Option<u64>) -> EventKind {
    EventKind::Schedule {
        task: TaskId::RmHandle(task),
        client: 7,
        channels: None,
        timeslice_us,
        interleave: None,
        allowed,
        rm_status: Some(0),
        errno: if allowed { 0 } else { -1 },
        via_channel: false,
    }
}

fn submit(task: u32) -> EventKind {
    EventKind::WorkSubmit {
        task: TaskId::RmHandle(task),
        client: 7,
        channel_handle: 1,
        chid: None,
        runlist: None,
        token: 0,
        gpu: None,
    }
}

fn destroy(task: u32, cause: DestroyCause) -> EventKind {
    EventKind::TaskDestroy {
        task: TaskId::RmHandle(task),
        client: 7,
        cause,
        implicit: cause.is_implicit(),
        final_params: None,
    }
}

fn timeslice_update(task: u32, allowed: bool, old_us: u64, new_us: u64) -> EventKind {
    EventKind::SchedUpdate {
        task: TaskId::RmHandle(task),
        client: 7,
        change: SchedChange::Timeslice {
            old_us: Some(old_us),
            old_source: Some(ValueSource::DriverDefault),
            new_us,
        },
        allowed,
        rm_status: Some(if allowed { 0 } else { 0x1f }),
        errno: 0,
        via_channel: false,
    }
}

/// The value of the sample whose line starts with `series` (name and labels, exactly).
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .map(|v| v.parse().expect("a number"))
}

fn task_series(name: &str, gpu: &str, engine: &str, comm: &str) -> String {
    format!(
        "{name}{{gpu=\"{gpu}\",UUID=\"\",engine=\"{engine}\",comm=\"{comm}\",container=\"\",\
         pod=\"\",namespace=\"\",pod_uid=\"\"}}"
    )
}

fn event_series(event: &str, gpu: &str, engine: &str, comm: &str) -> String {
    format!(
        "gpu_trace_events_total{{event=\"{event}\",gpu=\"{gpu}\",UUID=\"\",engine=\"{engine}\",\
         comm=\"{comm}\",container=\"\",pod=\"\",namespace=\"\",pod_uid=\"\"}}"
    )
}

const S: u64 = 1_000_000_000;

/// Event `kind` of process `pid` (`python3`, its main thread) at 1 s.
fn python3_at_1s(pid: u32, kind: EventKind) -> Event {
    Event {
        amd: None,
        api: None,
        key: None,
        origin: Origin {
            ts_ns: S,
            cpu: 0,
            pid,
            tid: pid,
            comm: "python3".into(),
        },
        kind,
    }
}

#[test]
fn a_task_life_is_counted_timed_and_leaves_the_gauges_at_zero() {
    let mut m = Metrics::new(MetricsConfig::default());
    // A GR TSG on GPU 1 with a 2048 µs timeslice, scheduled 500 µs after its creation, then
    // raised to 4096 µs, refused once, one work-submit token, freed 2.5 s after creation.
    see(
        &mut m,
        10 * S,
        100,
        "python3",
        init(0xA, Engine::Graphics, 1, Some(2048)),
    );
    let t = m.encode();
    let live = task_series("gpu_trace_live_tasks", "1", "GRAPHICS", "python3");
    let ts = task_series(
        "gpu_trace_live_tasks_timeslice_seconds",
        "1",
        "GRAPHICS",
        "python3",
    );
    assert_eq!(sample(&t, &live), Some(1.0), "{t}");
    assert_eq!(sample(&t, &ts), Some(0.002048), "{t}");

    // Another thread of the same process: still counted under the process's name.
    see_as(
        &mut m,
        10 * S + 500_000,
        100,
        "cuda-EvtHandlr",
        "python3",
        schedule(0xA, true, Some(2048)),
    );
    see(
        &mut m,
        10 * S + 600_000,
        100,
        "python3",
        schedule(0xA, true, Some(4096)),
    );
    see(
        &mut m,
        10 * S + 700_000,
        100,
        "python3",
        schedule(0xA, false, None),
    );
    see(&mut m, 10 * S + 800_000, 100, "python3", submit(0xA));
    let t = m.encode();
    assert_eq!(sample(&t, &ts), Some(0.004096), "{t}");
    let lat = "gpu_trace_schedule_latency_seconds";
    assert_eq!(
        sample(
            &t,
            &format!("{lat}_count{{gpu=\"1\",UUID=\"\",engine=\"GRAPHICS\"}}")
        ),
        Some(1.0)
    );
    assert_eq!(
        sample(
            &t,
            &format!("{lat}_sum{{gpu=\"1\",UUID=\"\",engine=\"GRAPHICS\"}}")
        ),
        Some(0.0005)
    );
    // 500 µs is above the 160 µs bucket and within the 640 µs one (10 µs × 4^n).
    assert_eq!(
        sample(
            &t,
            &format!("{lat}_bucket{{le=\"0.00016\",gpu=\"1\",UUID=\"\",engine=\"GRAPHICS\"}}")
        ),
        Some(0.0),
        "{t}"
    );
    assert_eq!(
        sample(
            &t,
            &format!("{lat}_bucket{{le=\"0.00064\",gpu=\"1\",UUID=\"\",engine=\"GRAPHICS\"}}")
        ),
        Some(1.0),
        "{t}"
    );

    see(
        &mut m,
        12 * S + 500_000_000,
        100,
        "python3",
        destroy(0xA, DestroyCause::ProcessExit),
    );
    let t = m.encode();
    for (event, n) in [
        ("TASK_INIT", 1.0),
        ("SCHEDULE", 3.0),
        ("WORK_SUBMIT", 1.0),
        ("TASK_DESTROY", 1.0),
    ] {
        assert_eq!(
            sample(&t, &event_series(event, "1", "GRAPHICS", "python3")),
            Some(n),
            "{event}: {t}"
        );
    }
    let refused = task_series(
        "gpu_trace_schedules_refused_total",
        "1",
        "GRAPHICS",
        "python3",
    );
    assert_eq!(sample(&t, &refused), Some(1.0));
    assert_eq!(sample(&t, &live), Some(0.0));
    assert_eq!(sample(&t, &ts), Some(0.0));
    let life = "gpu_trace_task_lifetime_seconds";
    assert_eq!(
        sample(
            &t,
            &format!("{life}_sum{{gpu=\"1\",UUID=\"\",engine=\"GRAPHICS\"}}")
        ),
        Some(2.5)
    );
    assert_eq!(
        sample(
            &t,
            &format!("{life}_count{{gpu=\"1\",UUID=\"\",engine=\"GRAPHICS\"}}")
        ),
        Some(1.0)
    );
    // No PID anywhere.
    assert!(!t.contains("pid="), "{t}");
}

#[test]
fn tasks_created_before_tracing_count_events_but_not_gauges_or_histograms() {
    let mut m = Metrics::new(MetricsConfig::default());
    see(&mut m, S, 5, "late", schedule(0xB, true, Some(1000)));
    see(&mut m, 2 * S, 5, "late", destroy(0xB, DestroyCause::Free));
    let t = m.encode();
    assert_eq!(
        sample(&t, &event_series("SCHEDULE", "", "", "late")),
        Some(1.0),
        "{t}"
    );
    assert_eq!(
        sample(&t, &event_series("TASK_DESTROY", "", "", "late")),
        Some(1.0)
    );
    // The unknown task never made a live series go up, so it does not go below zero: it
    // has none at all (no task created in it), nor a refusal series (no refusal).
    assert_eq!(
        sample(&t, &task_series("gpu_trace_live_tasks", "", "", "late")),
        None,
        "{t}"
    );
    assert!(!t.contains("gpu_trace_schedules_refused_total{"), "{t}");
    assert!(!t.contains("gpu_trace_task_lifetime_seconds_count"), "{t}");
}

#[test]
fn tracer_exit_takes_live_tasks_off_the_gauges_without_counting_an_event() {
    let mut m = Metrics::new(MetricsConfig::default());
    see(&mut m, S, 5, "p", init(1, Engine::Copy, 0, Some(100)));
    see(&mut m, 2 * S, 5, "p", destroy(1, DestroyCause::TracerExit));
    let t = m.encode();
    assert_eq!(
        sample(&t, &task_series("gpu_trace_live_tasks", "0", "COPY", "p")),
        Some(0.0)
    );
    // Not an event: no TASK_DESTROY series (it would sit at zero).
    assert_eq!(
        sample(&t, &event_series("TASK_DESTROY", "0", "COPY", "p")),
        None,
        "{t}"
    );
    assert!(!t.contains("gpu_trace_task_lifetime_seconds_count"), "{t}");
}

/// A fork storm: 5 000 processes with distinct names, each creating and destroying one TSG.
/// With a cap of 8 names, the scrape holds 8 named series plus `__overflow__`, and the totals
/// still add up.
#[test]
fn a_fork_storm_of_unique_names_is_capped_into_the_overflow_series() {
    let cap = 8;
    let mut m = Metrics::new(MetricsConfig {
        max_comms: cap,
        ..MetricsConfig::default()
    });
    let procs = 5_000u32;
    for p in 0..procs {
        let name = format!("storm{p}");
        see(
            &mut m,
            S,
            1000 + p,
            &name,
            init(p, Engine::Graphics, 0, None),
        );
        see(
            &mut m,
            2 * S,
            1000 + p,
            &name,
            destroy(p, DestroyCause::ProcessExit),
        );
    }
    let t = m.encode();
    let init_lines: Vec<&str> = t
        .lines()
        .filter(|l| l.starts_with("gpu_trace_events_total{event=\"TASK_INIT\""))
        .collect();
    assert_eq!(init_lines.len(), cap + 1, "{init_lines:#?}");
    for p in 0..cap {
        let s = event_series("TASK_INIT", "0", "GRAPHICS", &format!("storm{p}"));
        assert_eq!(sample(&t, &s), Some(1.0));
    }
    let over = event_series("TASK_INIT", "0", "GRAPHICS", OVERFLOW);
    assert_eq!(sample(&t, &over), Some(f64::from(procs) - cap as f64));
    let live_over = task_series("gpu_trace_live_tasks", "0", "GRAPHICS", OVERFLOW);
    assert_eq!(sample(&t, &live_over), Some(0.0));
    let overflowed = 2.0 * (f64::from(procs) - cap as f64);
    assert_eq!(
        sample(&t, "gpu_trace_label_overflow_events_total"),
        Some(overflowed)
    );
    // The whole scrape stays small: bounded by the cap, not by the storm.
    assert!(t.len() < 40_000, "{} bytes", t.len());
}

/// Each label under its own cap, but too many combinations: 40 GPUs × 3 names = 120 label sets
/// against a cap of 16. The rest share the all-overflow series; the totals still add up.
#[test]
fn combinations_past_the_label_set_cap_share_one_series() {
    let mut m = Metrics::new(MetricsConfig {
        max_label_sets: 16,
        ..MetricsConfig::default()
    });
    let mut task = 0;
    for gpu in 0..40 {
        for name in ["a", "b", "c"] {
            task += 1;
            see(&mut m, S, 10, name, init(task, Engine::Copy, gpu, None));
        }
    }
    let t = m.encode();
    let lines: Vec<&str> = t
        .lines()
        .filter(|l| l.starts_with("gpu_trace_live_tasks{"))
        .collect();
    assert_eq!(lines.len(), 17, "{lines:#?}");
    assert_eq!(sum_of(&lines), 120.0);
    let over = format!(
        "gpu_trace_live_tasks{{gpu=\"{OVERFLOW}\",UUID=\"{OVERFLOW}\",engine=\"\",\
         comm=\"{OVERFLOW}\",container=\"{OVERFLOW}\",pod=\"{OVERFLOW}\",\
         namespace=\"{OVERFLOW}\",pod_uid=\"{OVERFLOW}\"}}"
    );
    assert_eq!(sample(&t, &over), Some(120.0 - 16.0), "{t}");
}

fn sum_of(lines: &[&str]) -> f64 {
    lines
        .iter()
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
        .sum()
}

#[test]
fn untrusted_names_are_escaped_and_stripped_of_control_characters() {
    let mut m = Metrics::new(MetricsConfig::default());
    let evil = "a\"b\\c\nd\x1b[2J\x07";
    see(&mut m, S, 5, evil, schedule(1, false, None));
    let t = m.encode();
    // The text output's escaping (escape.rs: `\\`, `\n`, `\xNN`), then the exposition
    // format's own (`"` and `\`).
    let want = event_series("SCHEDULE", "", "", r#"a\"b\\\\c\\nd\\x1b[2J\\x07"#);
    assert_eq!(sample(&t, &want), Some(1.0), "{t}");
    assert!(!t.contains('\x1b') && !t.contains('\x07'));
    assert_eq!(
        t.lines().filter(|l| l.contains("comm=")).count(),
        t.lines().filter(|l| l.contains(r"d\\x1b[2J")).count()
    );
}

#[test]
fn health_counters_follow_absolute_readings() {
    let mut m = Metrics::new(MetricsConfig::default());
    let k = |dropped, read_failed, emitted| KernelCounters {
        dropped,
        read_failed,
        emitted,
        ..KernelCounters::default()
    };
    m.set_kernel(&k(3, 1, 100));
    m.set_kernel(&k(5, 1, 250));
    let mut stats = Stats::new();
    stats.decode_errors = 4;
    stats.malformed = 2;
    m.sync_stats(&stats);
    m.sync_stats(&stats);
    m.set_ring_bytes(1 << 20);
    let t = m.encode();
    assert_eq!(sample(&t, "gpu_trace_dropped_records_total"), Some(5.0));
    assert_eq!(sample(&t, "gpu_trace_read_failures_total"), Some(1.0));
    assert_eq!(sample(&t, "gpu_trace_records_total"), Some(250.0));
    assert_eq!(sample(&t, "gpu_trace_decode_errors_total"), Some(4.0));
    assert_eq!(sample(&t, "gpu_trace_malformed_records_total"), Some(2.0));
    assert_eq!(sample(&t, "gpu_trace_ring_buffer_bytes"), Some(1048576.0));
    // No reader of the ring's positions (replay): the fill is not served rather than invented.
    assert_eq!(sample(&t, "gpu_trace_ring_buffer_used_bytes"), None);
    m.set_ring_fill(|| 12_345);
    let t = m.encode();
    assert_eq!(
        sample(&t, "gpu_trace_ring_buffer_used_bytes"),
        Some(12345.0)
    );
    // The pure core reads nothing of the system: gpu-trace's own CPU time and memory are the
    // binary's collector (gpu-trace's metrics::process).
    assert_eq!(sample(&t, "process_cpu_seconds_total"), None);
    assert_eq!(sample(&t, "process_resident_memory_bytes"), None);
    assert_eq!(
        sample(
            &t,
            &format!(
                "gpu_trace_build_info{{version=\"{}\"}}",
                env!("CARGO_PKG_VERSION")
            )
        ),
        Some(1.0)
    );
}

/// The flight recorder's counters, counted through the handle it is given (a clone), are the
/// scrape's: triggers by name (no series for a trigger that never came), dumps written,
/// suppressed and failed.
#[test]
fn the_flight_recorder_counts_into_the_scrape() {
    let m = Metrics::new(MetricsConfig::default());
    let t = m.encode();
    assert!(!t.contains("gpu_trace_flight_triggers_total{"), "{t}");
    assert_eq!(sample(&t, "gpu_trace_flight_dumps_total"), Some(0.0));
    let f = m.flight();
    for name in ["signal", "refused", "refused", "refused"] {
        f.trigger(name);
    }
    f.dumps.inc_by(2);
    f.suppressed.inc();
    f.failed.inc();
    let t = m.encode();
    let trig = |n: &str| {
        sample(
            &t,
            &format!("gpu_trace_flight_triggers_total{{trigger=\"{n}\"}}"),
        )
    };
    assert_eq!((trig("signal"), trig("refused")), (Some(1.0), Some(3.0)));
    assert_eq!(trig("dropped"), None);
    assert_eq!(sample(&t, "gpu_trace_flight_dumps_total"), Some(2.0));
    assert_eq!(
        sample(&t, "gpu_trace_flight_dumps_suppressed_total"),
        Some(1.0)
    );
    assert_eq!(sample(&t, "gpu_trace_flight_dumps_failed_total"), Some(1.0));
}

/// Every metric of the reference is in a scrape under its documented name and type, and the
/// scrape has no metric the reference does not list. [`CPU`] and [`RSS`] are served by the
/// binary's collector (gpu-trace's `metrics::process`, tested there), not by this pure core.
#[test]
fn the_reference_lists_exactly_the_metrics_served() {
    let mut m = Metrics::new(MetricsConfig::default());
    m.set_ring_fill(|| 4096);
    m.set_shares(&[(0, "p".into(), None, 0.5)]);
    api_sums(&mut m, 5, "p", "cuInit", [1, 0, 10]);
    api_path(&mut m, 5, "p", 1, 1);
    see(&mut m, S, 5, "p", init(1, Engine::Copy, 0, Some(100)));
    see(&mut m, S + 1, 5, "p", schedule(1, true, None));
    see(&mut m, S + 2, 5, "p", schedule(1, false, None));
    see(&mut m, 2 * S, 5, "p", destroy(1, DestroyCause::Free));
    m.flight().trigger("signal");
    m.set_unreported(&[("unfollowed", 1)].into());
    let t = m.encode();
    let types: Vec<(String, String)> = t
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .map(|l| {
            let (n, k) = l.split_once(' ').unwrap();
            (n.to_string(), k.to_string())
        })
        .collect();
    let core: Vec<&MetricDoc> = REFERENCE
        .iter()
        .filter(|d| d.name != CPU.name && d.name != RSS.name)
        .collect();
    assert_eq!(core.len(), REFERENCE.len() - 2);
    assert_eq!(types.len(), core.len(), "{types:?}");
    for d in core {
        let family = family_name(d);
        assert!(
            types.iter().any(|(n, k)| n == family && k == d.kind),
            "{} ({}) not served: {types:?}",
            d.name,
            d.kind
        );
        assert!(
            t.lines().any(|l| l.starts_with(d.name)),
            "no sample of {}",
            d.name
        );
    }
}

#[test]
fn deny_counters_are_exported_as_increments_of_absolute_readings() {
    let mut m = Metrics::new(MetricsConfig::default());
    let k = |unread, unfollowed| KernelCounters {
        denied: 10,
        denied_unread: unread,
        deny_unfollowed: unfollowed,
        ..KernelCounters::default()
    };
    // Not known (a replayed recording made before they were counted): 0, nothing invented.
    m.set_kernel(&k(None, None));
    let t = m.encode();
    assert_eq!(sample(&t, "gpu_trace_denied_unread_total"), Some(0.0));
    assert_eq!(sample(&t, "gpu_trace_deny_unfollowed_total"), Some(0.0));
    m.set_kernel(&k(Some(2), Some(1)));
    m.set_kernel(&k(Some(7), Some(3)));
    // A smaller reading (never from the kernel) does not take the counter back.
    m.set_kernel(&k(Some(5), Some(3)));
    let t = m.encode();
    assert_eq!(sample(&t, "gpu_trace_denied_total"), Some(10.0));
    assert_eq!(sample(&t, "gpu_trace_denied_unread_total"), Some(7.0));
    assert_eq!(sample(&t, "gpu_trace_deny_unfollowed_total"), Some(3.0));
}

/// The statistics' unreported reasons are read as totals (each health tick, and at the end):
/// exported as increments, one series per reason, never taken back; a reason not seen yet has
/// no series (nothing invented).
fn run_end(stats: &Stats) -> RunEnd<'_> {
    RunEnd {
        stats,
        counters: KernelCounters::default(),
        last_ts: 0,
        untracked: 0,
        stats_text: None,
        share_window_us: 1,
    }
}

#[test]
fn unreported_reasons_are_exported_as_increments_of_totals() {
    let mut m = Metrics::new(MetricsConfig::default());
    let series = |r: &str| format!("gpu_trace_unreported_total{{reason=\"{r}\"}}");
    m.set_unreported(&Default::default());
    assert_eq!(sample(&m.encode(), &series("unfollowed")), None);
    m.set_unreported(&[("unfollowed", 2)].into());
    m.set_unreported(&[("unfollowed", 5), ("api_uncounted", 3)].into());
    // The end's statistics, then a smaller total (never read): the counters stay.
    m.set_unreported(&[("unfollowed", 5), ("api_uncounted", 4)].into());
    m.set_unreported(&[("unfollowed", 1)].into());
    let t = m.encode();
    assert_eq!(sample(&t, &series("unfollowed")), Some(5.0));
    assert_eq!(sample(&t, &series("api_uncounted")), Some(4.0));
    assert_eq!(sample(&t, &series("own_process")), None);
    // Through the sink: the health tick's reading, then the run's end.
    let k = KernelCounters::default();
    Sink::kernel(&mut m, &k, &[("own_process", 2)].into());
    let mut stats = Stats::default();
    stats.unreported = [("own_process", 6), ("unfollowed", 7)].into();
    Sink::finish(&mut m, &run_end(&stats)).unwrap();
    let t = m.encode();
    assert_eq!(sample(&t, &series("own_process")), Some(6.0));
    assert_eq!(sample(&t, &series("unfollowed")), Some(7.0));
}

#[test]
fn sched_updates_are_counted_and_an_accepted_timeslice_moves_the_gauge() {
    // PyTorch's pattern (tests/fixtures/two_streams.gtrace): a GR TSG at the driver's 1024 µs,
    // raised to 2048 µs after its SCHEDULE. A refused change and a refused SCHEDULE-less
    // update change no gauge; neither is a refused schedule.
    let mut m = Metrics::new(MetricsConfig::default());
    see(
        &mut m,
        S,
        100,
        "python3",
        init(0xA, Engine::Graphics, 0, Some(1024)),
    );
    see(
        &mut m,
        S + 10,
        100,
        "python3",
        schedule(0xA, true, Some(1024)),
    );
    see(
        &mut m,
        S + 20,
        100,
        "python3",
        timeslice_update(0xA, true, 1024, 2048),
    );
    see(
        &mut m,
        S + 30,
        100,
        "python3",
        timeslice_update(0xA, false, 2048, 8192),
    );
    let t = m.encode();
    let ts = task_series(
        "gpu_trace_live_tasks_timeslice_seconds",
        "0",
        "GRAPHICS",
        "python3",
    );
    assert_eq!(sample(&t, &ts), Some(0.002048), "{t}");
    let upd = event_series("SCHED_UPDATE", "0", "GRAPHICS", "python3");
    assert_eq!(sample(&t, &upd), Some(2.0), "{t}");
    let refused = task_series(
        "gpu_trace_schedules_refused_total",
        "0",
        "GRAPHICS",
        "python3",
    );
    assert_eq!(sample(&t, &refused).unwrap_or(0.0), 0.0, "{t}");
    // Its end takes the raised timeslice off the gauge.
    see(
        &mut m,
        2 * S,
        100,
        "python3",
        destroy(0xA, DestroyCause::ProcessExit),
    );
    assert_eq!(sample(&m.encode(), &ts), Some(0.0));
}

/// 3000 named children, one after another (each exits before the next starts), against the
/// default cap of 128 names: each gets its own `comm` label while it lives (names of ended
/// processes are evicted to make room), nothing goes to `__overflow__`, a live process's name
/// is never evicted, and the scrape stays bounded by the cap.
#[test]
fn names_of_ended_processes_make_room_for_new_ones() {
    let mut m = Metrics::new(MetricsConfig::default());
    let cap = MetricsConfig::default().max_comms;
    // A process that lives through the storm.
    see(&mut m, S, 10, "keeper", init(1, Engine::Graphics, 0, None));
    let procs = 3_000u32;
    for p in 0..procs {
        let name = format!("child{p}");
        let pid = 1000 + p;
        see(
            &mut m,
            S,
            pid,
            &name,
            init(p + 2, Engine::Graphics, 0, None),
        );
        see(
            &mut m,
            2 * S,
            pid,
            &name,
            destroy(p + 2, DestroyCause::ProcessExit),
        );
        if p % 250 == 249 {
            let t = m.encode();
            let s = event_series("TASK_INIT", "0", "GRAPHICS", &name);
            assert_eq!(sample(&t, &s), Some(1.0), "child {p} has its own label");
        }
        m.process_exited(pid);
    }
    let t = m.encode();
    let over = event_series("TASK_INIT", "0", "GRAPHICS", OVERFLOW);
    assert_eq!(sample(&t, &over), None, "nothing overflowed");
    assert_eq!(
        sample(&t, "gpu_trace_label_overflow_events_total"),
        Some(0.0)
    );
    let keeper = task_series("gpu_trace_live_tasks", "0", "GRAPHICS", "keeper");
    assert_eq!(sample(&t, &keeper), Some(1.0));
    let init_lines = t
        .lines()
        .filter(|l| l.starts_with("gpu_trace_events_total{event=\"TASK_INIT\""))
        .count();
    assert!(
        init_lines <= cap,
        "{init_lines} TASK_INIT series for a cap of {cap}"
    );
    // The most recent children are still there (evicted oldest first).
    let last = event_series("TASK_INIT", "0", "GRAPHICS", &format!("child{}", procs - 1));
    assert_eq!(sample(&t, &last), Some(1.0));
}

/// The share gauge: summed over processes with the same labels, no pid label, absent before
/// any sample (a run without samples serves what it served before).
#[test]
fn share_gauge_sums_same_labels_and_is_absent_without_samples() {
    let mut m = Metrics::new(MetricsConfig::default());
    assert!(!m.encode().contains("gpu_trace_gpu_share_ratio"));
    let w = Workload {
        container: "c1".into(),
        ..Workload::default()
    };
    m.set_shares(&[
        (0, "python3".into(), Some(w.clone()), 0.25),
        (0, "python3".into(), Some(w), 0.125),
        (1, "python3".into(), None, 0.5),
    ]);
    let t = m.encode();
    assert!(
        t.contains(
            r#"gpu_trace_gpu_share_ratio{gpu="0",UUID="",comm="python3",container="c1",pod="",namespace="",pod_uid=""} 0.375"#
        ),
        "{t}"
    );
    assert!(
        t.contains(r#"gpu_trace_gpu_share_ratio{gpu="1",UUID="",comm="python3",container="",pod="",namespace="",pod_uid=""} 0.5"#),
        "{t}"
    );
    assert!(!t.contains("pid="));
}

/// Hands the metrics process `pid`'s (named `comm`) sums so far of libcuda's `symbol`:
/// calls, errors, ns.
fn api_sums(m: &mut Metrics, pid: u32, comm: &str, symbol: &str, v: [u64; 3]) {
    api_sums_at(m, 0, (pid, comm), symbol, v);
}

/// [`api_sums`] read at `ts_ns` (the record's time).
fn api_sums_at(m: &mut Metrics, ts_ns: u64, (pid, comm): (u32, &str), symbol: &str, v: [u64; 3]) {
    let row = crate::api::stats::CallStats {
        errors: v[1],
        total_ns: v[2],
        ..crate::api::stats::CallStats::for_test(pid, symbol, v[0])
    };
    feed_api_at(m, ts_ns, &crate::api::names::ApiEvent::Stats(row), comm);
}

/// One API record of process `comm` into the metrics, as the pipeline hands it.
fn feed_api(m: &mut Metrics, event: &crate::api::names::ApiEvent, comm: &str) {
    feed_api_at(m, 0, event, comm);
}

/// [`feed_api`] of a record made at `ts_ns`.
fn feed_api_at(m: &mut Metrics, ts_ns: u64, event: &crate::api::names::ApiEvent, comm: &str) {
    let origin = crate::api::events::samples::origin_of(event, ts_ns, 0);
    let ev = crate::sink::ApiEnriched {
        event,
        origin: &origin,
        process: comm,
        cgroup: None,
    };
    m.api(&ev).unwrap();
}

/// An `API_PATH` of process `pid` (`comm`): `/opt/vgpu/libvgpu.so`, `cuLaunchKernel` entered
/// `through` times of `total`.
fn api_path(m: &mut Metrics, pid: u32, comm: &str, through: u64, total: u64) {
    use crate::api::path::{ApiPath, PathSymbol};
    let event = crate::api::names::ApiEvent::Path(ApiPath {
        pid,
        comm: comm.into(),
        library: "/opt/vgpu/libvgpu.so".into(),
        preload: true,
        symbols: vec![PathSymbol {
            symbol: "cuLaunchKernel".into(),
            through,
            total,
        }],
        lookups: 0,
        api_lookups: 0,
        overrides: vec!["dlsym".into()],
        last: false,
    });
    feed_api(m, &event, comm);
}

fn api_series(name: &str, comm: &str, symbol: &str) -> String {
    format!(
        "{name}{{comm=\"{comm}\",container=\"\",pod=\"\",namespace=\"\",pod_uid=\"\",\
         library=\"libcuda.so.1\",symbol=\"{symbol}\"}}"
    )
}

/// `--api`: no API series before a sum came; then per (comm, workload, library, symbol),
/// never by pid: the processes of one name are summed, each adding what its sums grew by, so
/// a counter never goes down (a process that exited keeps what it added; a pid reused with
/// lower sums adds them whole).
#[test]
fn api_counters_add_each_process_growth_under_its_labels() {
    let mut m = Metrics::new(MetricsConfig::default());
    assert!(!m.encode().contains("gpu_trace_api"));
    let calls = |m: &Metrics, sym| {
        sample(
            &m.encode(),
            &api_series("gpu_trace_api_calls_total", "python3", sym),
        )
    };
    api_sums(&mut m, 10, "python3", "cuInit", [3, 1, 1_500_000_000]);
    api_sums(&mut m, 11, "python3", "cuInit", [2, 0, 500_000_000]);
    assert_eq!(calls(&m, "cuInit"), Some(5.0));
    api_sums(&mut m, 10, "python3", "cuInit", [7, 1, 2_000_000_000]);
    assert_eq!(calls(&m, "cuInit"), Some(9.0));
    let t = m.encode();
    let series = |name| api_series(name, "python3", "cuInit");
    assert_eq!(
        sample(&t, &series("gpu_trace_api_call_errors_total")),
        Some(1.0)
    );
    assert_eq!(
        sample(&t, &series("gpu_trace_api_call_seconds_total")),
        Some(2.5)
    );
    assert!(!t.contains("pid="), "{t}");
    // Process 11 exits, its pid comes back with fewer calls: they are new ones.
    m.process_exited(11);
    api_sums(&mut m, 11, "python3", "cuInit", [1, 0, 0]);
    assert_eq!(calls(&m, "cuInit"), Some(10.0));
    assert_eq!(calls(&m, "cuMemAlloc"), None);
}

/// `--api`: label sets past [`MetricsConfig::max_label_sets`] count under `__overflow__`;
/// a name from the traced process is escaped.
#[test]
fn api_label_sets_are_capped_and_escaped() {
    let mut m = Metrics::new(MetricsConfig {
        max_label_sets: 2,
        ..MetricsConfig::default()
    });
    api_sums(&mut m, 1, "a", "cuInit", [1, 0, 0]);
    api_sums(&mut m, 2, "b\u{1b}[31m", "cuInit", [1, 0, 0]);
    api_sums(&mut m, 3, "c", "cuInit", [4, 0, 0]);
    api_sums(&mut m, 4, "d", "cuInit", [5, 0, 0]);
    let t = m.encode();
    assert_eq!(
        sample(&t, &api_series("gpu_trace_api_calls_total", "a", "cuInit")),
        Some(1.0)
    );
    assert!(t.contains("comm=\"b\\\\x1b[31m\""), "{t}");
    let over = "gpu_trace_api_calls_total{comm=\"__overflow__\",container=\"\",pod=\"\",\
                namespace=\"\",pod_uid=\"\",library=\"__overflow__\",symbol=\"__overflow__\"}";
    assert_eq!(sample(&t, over), Some(9.0), "{t}");
}

/// `--metrics-expire` for `--api`'s label sets (issue 40 item 4): under a cap of 2, a third
/// process name counts under `__overflow__`; once the label sets of `b` and of the overflow
/// have not grown for the expiry they leave the scrape (counted as expired) and give their
/// room back, so a new name `d` gets its own label set; `a`, which grew, stays with its
/// counts; `b` coming back counts from 0 (only what it added since), and a row that reports
/// unchanged sums does not bring its label set back.
#[test]
fn api_label_sets_expire_and_give_their_room_back() {
    let mut m = Metrics::new(MetricsConfig {
        max_label_sets: 2,
        expire: Some(Duration::from_secs(10)),
        ..MetricsConfig::default()
    });
    let calls = |m: &Metrics, comm| {
        sample(
            &m.encode(),
            &api_series("gpu_trace_api_calls_total", comm, "cuInit"),
        )
    };
    let over = "gpu_trace_api_calls_total{comm=\"__overflow__\",container=\"\",pod=\"\",\
                namespace=\"\",pod_uid=\"\",library=\"__overflow__\",symbol=\"__overflow__\"}";
    api_sums_at(&mut m, S, (1, "a"), "cuInit", [1, 0, 0]);
    api_sums_at(&mut m, S, (2, "b"), "cuInit", [2, 0, 0]);
    api_sums_at(&mut m, S, (3, "c"), "cuInit", [3, 0, 0]);
    assert_eq!(sample(&m.encode(), over), Some(3.0));
    // `a` grows at 15 s; nothing else does. `b` reports the same sums (no growth).
    api_sums_at(&mut m, 15 * S, (1, "a"), "cuInit", [5, 0, 0]);
    api_sums_at(&mut m, 15 * S, (2, "b"), "cuInit", [2, 0, 0]);
    m.tick(20 * S);
    let t = m.encode();
    assert_eq!(calls(&m, "a"), Some(5.0), "{t}");
    assert_eq!((calls(&m, "b"), sample(&t, over)), (None, None), "{t}");
    assert_eq!(sample(&t, "gpu_trace_label_sets_expired_total"), Some(2.0));
    api_sums_at(&mut m, 21 * S, (4, "d"), "cuInit", [7, 0, 0]);
    assert_eq!(calls(&m, "d"), Some(7.0), "room under the cap again");
    // `b` unchanged: stays out; `b` grows by 1: back with 1, not its 3 calls (the cap is full
    // again: a and d).
    api_sums_at(&mut m, 22 * S, (2, "b"), "cuInit", [2, 0, 0]);
    assert_eq!(calls(&m, "b"), None);
    m.tick(40 * S);
    assert_eq!(calls(&m, "a"), None, "a expired too: {}", m.encode());
    api_sums_at(&mut m, 41 * S, (2, "b"), "cuInit", [3, 0, 0]);
    assert_eq!(calls(&m, "b"), Some(1.0));
}

/// `--metrics-expire` for the interposer counter: a (process, interposer) row whose calls did
/// not grow for the expiry leaves the scrape; the same figures again do not bring it back, more
/// calls do.
#[test]
fn api_interposer_rows_expire() {
    let mut m = Metrics::new(MetricsConfig {
        expire: Some(Duration::from_secs(10)),
        ..MetricsConfig::default()
    });
    let served = |m: &Metrics| m.encode().contains("gpu_trace_api_interposer_calls_total{");
    api_path(&mut m, 5, "p", 3, 4);
    assert!(served(&m));
    m.tick(20 * S);
    assert!(!served(&m), "{}", m.encode());
    api_path(&mut m, 5, "p", 3, 4);
    assert!(!served(&m));
    api_path(&mut m, 5, "p", 4, 5);
    assert!(served(&m));
}

/// `--metrics-expire` for the share gauge's label values: a name only the share gauge used gives
/// its room under the `comm` cap back once not sampled for the expiry.
#[test]
fn share_only_names_give_their_room_back() {
    let mut m = Metrics::new(MetricsConfig {
        max_comms: 1,
        expire: Some(Duration::from_secs(10)),
        ..MetricsConfig::default()
    });
    m.set_shares(&[(0, "first".into(), None, 0.5)]);
    m.set_shares(&[]);
    m.tick(20 * S);
    m.set_shares(&[(0, "second".into(), None, 0.25)]);
    let t = m.encode();
    assert!(t.contains("comm=\"second\""), "{t}");
    assert!(!t.contains("comm=\"__overflow__\""), "{t}");
}

/// Issue 36, item 5: a user's copy of a container id (a cgroup below its own
/// `user@UID.service`) is a series of its own with `container_user`, in the task metrics and
/// the share gauge; root's container keeps the label set it always had.
#[test]
fn a_users_copy_of_a_container_id_is_its_own_series_with_container_user() {
    use crate::model::workload::Attribution;
    let id = "3f2a9c1b0000000000000000000000000000000000000000000000000000beef";
    let root = Attribution::new(1, Some(format!("/system.slice/docker-{id}.scope")), None);
    let user = Attribution::new(
        2,
        Some(format!(
            "/user.slice/user-1000.slice/user@1000.service/app.slice/docker-{id}.scope"
        )),
        None,
    );
    let (wr, wu) = (Workload::of(&root), Workload::of(&user));
    assert_eq!(
        (wr.container.as_str(), wr.container_user.as_str()),
        ("3f2a9c1b0000", "")
    );
    assert_eq!(
        (wu.container.as_str(), wu.container_user.as_str()),
        ("3f2a9c1b0000", "1000")
    );

    let mut m = Metrics::new(MetricsConfig::default());
    let ev = |pid| python3_at_1s(pid, init(pid, Engine::Graphics, 0, None));
    // On nvidia-smi's GPU 0, the GPU of the share samples below.
    let gpu0 = GpuIdentity {
        index: 0,
        uuid: None,
        bus_id: "0000:00:06.0".into(),
        rm_device: 0,
    };
    m.observe_on(&ev(10), "python3", Some(&wr), Some(&gpu0));
    m.observe_on(&ev(11), "python3", Some(&wu), Some(&gpu0));
    m.observe_on(&ev(12), "python3", Some(&wu), Some(&gpu0));
    m.set_shares(&[
        (0, "python3".into(), Some(wr), 0.5),
        (0, "python3".into(), Some(wu), 0.25),
    ]);
    let t = m.encode();
    let series = |user: &str| {
        format!(
            "gpu_trace_events_total{{event=\"TASK_INIT\",gpu=\"0\",UUID=\"\",engine=\"GRAPHICS\",\
             comm=\"python3\",container=\"3f2a9c1b0000\",{user}pod=\"\",namespace=\"\",pod_uid=\"\"}}"
        )
    };
    assert_eq!(sample(&t, &series("")), Some(1.0), "{t}");
    assert_eq!(
        sample(&t, &series("container_user=\"1000\",")),
        Some(2.0),
        "{t}"
    );
    for (user, v) in [("", "0.5"), ("container_user=\"1000\",", "0.25")] {
        let line = format!(
            "gpu_trace_gpu_share_ratio{{gpu=\"0\",UUID=\"\",comm=\"python3\",\
             container=\"3f2a9c1b0000\",{user}pod=\"\",namespace=\"\",pod_uid=\"\"}} {v}"
        );
        assert!(t.contains(&line), "{line} in:\n{t}");
    }
    // Only the user's series have the label.
    let labelled: Vec<&str> = t
        .lines()
        .filter(|l| l.contains("container_user="))
        .collect();
    assert!(labelled.len() >= 2, "{t}");
    assert!(
        labelled
            .iter()
            .all(|l| l.contains("container_user=\"1000\"")),
        "{t}"
    );
}

/// Issue 39, item 3: each `API_PATH` sets its (process, interposer) row; served summed per
/// label set with the latest verdict, never by pid; a verdict that changes moves the row to
/// its new series (no old series left behind).
#[test]
fn interposer_calls_are_summed_per_label_set_under_the_latest_verdict() {
    let mut m = Metrics::new(MetricsConfig::default());
    let series = |verdict: &str| {
        format!(
            "gpu_trace_api_interposer_calls_total{{comm=\"python3\",container=\"\",pod=\"\",\
             namespace=\"\",pod_uid=\"\",library=\"/opt/vgpu/libvgpu.so\",verdict=\"{verdict}\"}}"
        )
    };
    assert!(!m.encode().contains("gpu_trace_api_interposer"));
    api_path(&mut m, 10, "python3", 0, 40);
    api_path(&mut m, 11, "python3", 0, 2);
    assert_eq!(sample(&m.encode(), &series("bypassed")), Some(0.0));
    // Process 10's hook comes on the path: its row moves to on_path with its count.
    api_path(&mut m, 10, "python3", 50, 50);
    let t = m.encode();
    assert_eq!(sample(&t, &series("on_path")), Some(50.0), "{t}");
    assert_eq!(sample(&t, &series("bypassed")), Some(0.0), "{t}");
    api_path(&mut m, 11, "python3", 7, 7);
    let t = m.encode();
    assert_eq!(sample(&t, &series("on_path")), Some(57.0), "{t}");
    assert_eq!(sample(&t, &series("bypassed")), None, "{t}");
    // Past the cap on label sets: comm and library __overflow__, no workload labels (as the
    // call counters' overflow).
    let mut m = Metrics::new(MetricsConfig {
        max_label_sets: 1,
        ..MetricsConfig::default()
    });
    api_path(&mut m, 10, "a", 1, 1);
    api_path(&mut m, 11, "b", 2, 2);
    let t = m.encode();
    let over = "gpu_trace_api_interposer_calls_total{comm=\"__overflow__\",container=\"\",pod=\"\",\
                namespace=\"\",pod_uid=\"\",library=\"__overflow__\",verdict=\"on_path\"}";
    assert_eq!(sample(&t, over), Some(2.0), "{t}");
}

/// The `gpu` label is nvidia-smi's index of the GPU the pipeline named, whatever RM's device
/// instance was; an NVIDIA GPU it could not name is `gpu="?"` (RM's number is not shown as an
/// index: devices 0 and 3 unnamed are one `?` series), never the device instance.
#[test]
fn gpus_are_labelled_by_nvidia_smi_s_index_or_question_mark() {
    let mut m = Metrics::new(MetricsConfig::default());
    let ev = |task, gpu| python3_at_1s(10, init(task, Engine::Graphics, gpu, None));
    // RM's device instance 0 is nvidia-smi's GPU 1 (RM numbers GPUs as it initialized them).
    let second = GpuIdentity {
        index: 1,
        uuid: Some("GPU-b".into()),
        bus_id: "0000:41:00.0".into(),
        rm_device: 0,
    };
    m.observe_on(&ev(1, 0), "python3", None, Some(&second));
    m.observe_on(&ev(2, 0), "python3", None, None);
    m.observe_on(&ev(3, 3), "python3", None, None);
    let t = m.encode();
    let series = |gpu: &str, uuid: &str| {
        format!(
            "gpu_trace_events_total{{event=\"TASK_INIT\",gpu=\"{gpu}\",UUID=\"{uuid}\",\
             engine=\"GRAPHICS\",comm=\"python3\",container=\"\",pod=\"\",namespace=\"\",\
             pod_uid=\"\"}}"
        )
    };
    assert_eq!(sample(&t, &series("1", "GPU-b")), Some(1.0), "{t}");
    assert_eq!(sample(&t, &series("?", "")), Some(2.0), "{t}");
    for raw in ["0", "3"] {
        assert_eq!(sample(&t, &series(raw, "")), None, "{t}");
    }
}

/// Observes `kind` of process `pid` (`comm` "w") running in pod `pod`, at record time `ts_ns`
/// (the clock label expiry reads).
fn see_in_pod(m: &mut Metrics, ts_ns: u64, pid: u32, pod: &str, kind: EventKind) {
    let w = Workload {
        pod: pod.into(),
        namespace: "ns".into(),
        pod_uid: format!("uid-{pod}"),
        container: "c".into(),
        container_user: String::new(),
    };
    let origin = Origin {
        ts_ns,
        cpu: 0,
        pid,
        tid: pid,
        comm: "w".into(),
    };
    let ev = Event {
        amd: None,
        api: None,
        key: None,
        origin,
        kind,
    };
    m.observe(&ev, "w", Some(&w));
}

/// A pod's whole life at `t` (s): its process creates a TSG, frees it half a second later and
/// exits.
fn pod_life(m: &mut Metrics, t: u64, pid: u32, pod: &str) {
    see_in_pod(m, t * S, pid, pod, init(pid, Engine::Graphics, 0, None));
    see_in_pod(
        m,
        t * S + S / 2,
        pid,
        pod,
        destroy(pid, DestroyCause::ProcessExit),
    );
    m.process_exited(pid);
}

/// `gpu_trace_events_total`'s `TASK_INIT` sample of pod `pod` (its own label set).
fn pod_inits(t: &str, pod: &str) -> Option<f64> {
    let series = format!(
        "gpu_trace_events_total{{event=\"TASK_INIT\",gpu=\"?\",UUID=\"\",engine=\"GRAPHICS\",\
         comm=\"w\",container=\"c\",pod=\"{pod}\",namespace=\"ns\",pod_uid=\"uid-{pod}\"}}"
    );
    sample(t, &series)
}

/// Label expiry with the records' clock: under a cap of 2 workloads, a third pod lands in
/// `__overflow__`; once the first two have counted nothing for the expiry (60 s) they leave
/// the scrape, and a pod that comes after gets a label set of its own. A label set holding a
/// live task is never taken out, however idle. One that comes back counts from 0 again.
#[test]
fn a_label_set_past_the_cap_is_served_once_older_ones_expired() {
    let mut m = Metrics::new(MetricsConfig {
        max_workloads: 3,
        expire: Some(Duration::from_secs(60)),
        ..MetricsConfig::default()
    });
    // A pod whose task lives on (created at 1 s, never freed).
    see_in_pod(&mut m, S, 50, "live", init(50, Engine::Graphics, 0, None));
    pod_life(&mut m, 1, 100, "p0");
    pod_life(&mut m, 2, 101, "p1");
    pod_life(&mut m, 10, 102, "p2");
    let t = m.encode();
    assert_eq!(pod_inits(&t, "p0"), Some(1.0), "{t}");
    assert_eq!(pod_inits(&t, "p2"), None, "{t}");
    let over = |t: &str| {
        t.lines()
            .filter(|l| {
                l.starts_with("gpu_trace_events_total{event=\"TASK_INIT\"")
                    && l.contains("pod=\"__overflow__\"")
            })
            .count()
    };
    assert_eq!(over(&t), 1, "p2 past the cap: {t}");
    // 62.5 s: p0 and p1 idle for 60 s (their last event at 1.5 and 2.5 s), p2 not yet.
    pod_life(&mut m, 63, 103, "p3");
    let t = m.encode();
    assert_eq!(pod_inits(&t, "p0"), None, "{t}");
    assert_eq!(pod_inits(&t, "p1"), None, "{t}");
    assert_eq!(pod_inits(&t, "p3"), Some(1.0), "room freed for p3: {t}");
    assert_eq!(
        over(&t),
        1,
        "p2's overflow series not idle long enough: {t}"
    );
    assert_eq!(
        pod_inits(&t, "live"),
        Some(1.0),
        "a live task's label set stays: {t}"
    );
    let live = "gpu_trace_live_tasks{gpu=\"?\",UUID=\"\",engine=\"GRAPHICS\",comm=\"w\",\
                container=\"c\",pod=\"live\",namespace=\"ns\",pod_uid=\"uid-live\"}";
    assert_eq!(sample(&t, live), Some(1.0), "{t}");
    assert_eq!(sample(&t, "gpu_trace_label_sets_expired_total"), Some(2.0));
    // p0 again at 64 s: its counter starts from 0 (a reset), not from its old 1.
    pod_life(&mut m, 64, 104, "p0");
    let t = m.encode();
    assert_eq!(pod_inits(&t, "p0"), Some(1.0), "{t}");
    // Past 10.5 + 60 s, p2's overflow series goes too: p4, past the cap again (live, p3 and
    // p0 hold the 3 workloads), starts it from 0.
    pod_life(&mut m, 80, 105, "p4");
    let t = m.encode();
    assert_eq!(over(&t), 1, "{t}");
    let overflow_inits = t
        .lines()
        .find(|l| {
            l.starts_with("gpu_trace_events_total{event=\"TASK_INIT\"")
                && l.contains("pod=\"__overflow__\"")
        })
        .and_then(|l| l.rsplit(' ').next())
        .map(|v| v.parse::<f64>().unwrap());
    assert_eq!(overflow_inits, Some(1.0), "{t}");
    assert_eq!(sample(&t, "gpu_trace_label_sets_expired_total"), Some(3.0));
    assert_eq!(pod_inits(&t, "live"), Some(1.0), "{t}");
}

/// A node that runs one short pod a second for 3 hours, under the default caps (256
/// workloads, 1024 label sets) and a 60 s expiry: the scrape holds every pod of the last 60 s
/// (none taken out early) and never more than those of the last 60 s plus one look at idle
/// label sets (an eighth of the expiry, 7.5 s) and the pod in flight; nothing ever lands in
/// `__overflow__`. Without expiry, pod 257 would.
#[test]
fn label_sets_stay_bounded_in_steady_state() {
    let mut m = Metrics::new(MetricsConfig {
        expire: Some(Duration::from_secs(60)),
        ..MetricsConfig::default()
    });
    let pods = 3 * 3600u64;
    for t in 1..=pods {
        pod_life(&mut m, t, 1000 + t as u32, &format!("p{t}"));
        if t % 500 == 0 || t == pods {
            let text = m.encode();
            let inits = text
                .lines()
                .filter(|l| l.starts_with("gpu_trace_events_total{event=\"TASK_INIT\""))
                .count() as u64;
            // Pods t-59 ..= t: their last event is less than 60 s old.
            for recent in t - 59..=t {
                assert_eq!(
                    pod_inits(&text, &format!("p{recent}")),
                    Some(1.0),
                    "t={t} p{recent}:\n{}",
                    text.lines()
                        .filter(|l| l.contains("TASK_INIT"))
                        .collect::<Vec<_>>()
                        .join("\n")
                );
            }
            assert!(inits <= 60 + 8 + 1, "t={t}: {inits} label sets");
            assert!(!text.contains(&format!("=\"{OVERFLOW}\"")), "t={t}");
        }
    }
    let text = m.encode();
    let expired = sample(&text, "gpu_trace_label_sets_expired_total").unwrap();
    let inits = text
        .lines()
        .filter(|l| l.starts_with("gpu_trace_events_total{event=\"TASK_INIT\""))
        .count() as f64;
    // Every pod's label set is either still served or was expired, once.
    assert_eq!(expired + inits, pods as f64);
}
