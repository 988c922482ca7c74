use super::*;

/// The committed H100 captures (`examples/outputs/nvml-share-h100/`).
fn capture(name: &str) -> Vec<ShareSample> {
    let path = format!(
        "{}/../examples/outputs/nvml-share-h100/{name}/nvml.jsonl",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(&path).unwrap();
    text.lines()
        .flat_map(|l| parse_capture_line(l, 0).unwrap())
        .collect()
}

fn model(samples: &[ShareSample]) -> ShareModel {
    let mut m = ShareModel::new();
    for s in samples {
        m.add(s);
    }
    m
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

// Expected figures computed apart from this code, over the jsonl:
//   python3 -c 'import json,sys; pts=set(); sm={}
//   for l in open(sys.argv[1]):
//     for s in json.loads(l)["samples"]: pts.add(s["ts_us"]); sm[s["pid"]]=sm.get(s["pid"],0)+s["sm"]
//   print(len(pts), sm)' examples/outputs/nvml-share-h100/share_fast/nvml.jsonl
// → 64 sampling points; sm sums 531: 1733, 532: 2113, 568: 2206.
#[test]
fn fast_capture_shares_are_sm_weighted_fractions_of_sampling_points() {
    let m = model(&capture("share_fast"));
    assert_eq!(m.gpus(), vec![0]);
    assert_eq!(m.pids(0), vec![531, 532, 568]);
    for (pid, sm) in [(531, 1733.0), (532, 2113.0), (568, 2206.0)] {
        let (whole, _) = m.run_share(0, pid, 1_000_000).unwrap();
        assert_eq!(whole.points, 64, "pid {pid}");
        assert!(close(whole.ratio, sm / 6400.0), "pid {pid}: {whole:?}");
    }
}

// share/ (polled once a second), same python: 34 sampling points; sm sums 455: 499, 456: 576,
// 500: 793 (12 samples of 500).
#[test]
fn slow_capture_counts_only_the_points_it_saw() {
    let m = model(&capture("share"));
    let (w, _) = m.run_share(0, 500, 1_000_000).unwrap();
    assert_eq!((w.points, w.samples), (34, 12));
    assert!(close(w.ratio, 793.0 / 3400.0), "{w:?}");
    let (w, _) = m.run_share(0, 455, 1_000_000).unwrap();
    assert!(close(w.ratio, 499.0 / 3400.0), "{w:?}");
}

// Windows of 1 s from the first sample (ts 10): [10, 1_000_010) holds one point (7 at 99 %),
// [1_000_010, 2_000_010) two (8 and 7): 7's largest is 99 %, 8's 99/200.
#[test]
fn window_share_of_a_single_sample_is_its_sm() {
    let s = |pid, ts_us, sm| ShareSample {
        gpu: 1,
        uuid: Some("GPU-x".into()),
        pid,
        ts_us,
        sm,
        mem: 0,
        enc: 0,
        dec: 0,
    };
    let m = model(&[s(7, 10, 99), s(8, 1_000_010, 99), s(7, 1_200_010, 99)]);
    let (whole, max) = m.run_share(1, 7, 1_000_000).unwrap();
    assert_eq!((whole.samples, whole.points), (2, 3));
    assert!(close(whole.ratio, 198.0 / 300.0));
    assert!(close(max, 0.99), "{max}");
    let (_, max8) = m.run_share(1, 8, 1_000_000).unwrap();
    assert!(close(max8, 0.495), "{max8}");
}

// Before/after a parameter change: 531's samples in share_fast before and after the point
// ts 1795711120677820 (the jsonl line t=6.143), counted with the same python restricted to
// ts < T and ts >= T: before: 14 points, 531's sm 396 (4 samples); after: 50 points, sm 1337.
#[test]
fn share_before_and_after_a_timeslice_change() {
    let mut m = model(&capture("share_fast"));
    m.params(531, 0, "timeslice=2048 us".into());
    m.params(531, 1_795_711_120_677_820, "timeslice=8192 us".into());
    m.params(531, 1_795_711_120_677_821, "timeslice=8192 us".into());
    let c = m.around_changes(0, 531);
    assert_eq!(c.len(), 1);
    assert_eq!(c[0].before_params.as_deref(), Some("timeslice=2048 us"));
    let (b, a) = (c[0].before.unwrap(), c[0].after.unwrap());
    assert_eq!((b.points, a.points), (14, 50));
    assert!(close(b.ratio, 396.0 / 1400.0), "{b:?}");
    assert!(close(a.ratio, 1337.0 / 5000.0), "{a:?}");
    let lines = m.render_lines(1_000_000);
    assert!(
        lines
            .iter()
            .any(|l| l
                .contains("after timeslice=2048 us -> timeslice=8192 us: share 28.3 % -> 26.7 %")),
        "{lines:#?}"
    );
}

#[test]
fn capture_lines_that_are_not_samples_are_refused() {
    assert!(parse_capture_line("{}", 0).is_err());
    assert!(parse_capture_line(r#"{"samples":[{"pid":1}]}"#, 0).is_err());
    assert_eq!(
        parse_capture_line(r#"{"rc":6,"samples":[]}"#, 0),
        Ok(vec![])
    );
}

#[test]
fn parameter_changes_kept_per_process_are_bounded() {
    // A process flipping its timeslice without end must not grow the tracer's memory: the
    // first MAX_CHANGES_PER_PROCESS changes are kept, the parameters in force still follow.
    let mut m = model(&capture("share_fast"));
    for i in 0..10_000u64 {
        let label = if i % 2 == 0 {
            "timeslice=1024 us"
        } else {
            "timeslice=8192 us"
        };
        m.params(531, 1_795_711_120_000_000 + i, label.into());
    }
    assert_eq!(
        m.around_changes(0, 531).len(),
        super::MAX_CHANGES_PER_PROCESS
    );
    assert_eq!(m.params_now(531), Some("timeslice=8192 us"));
}

/// A share computed the plain way (scan every sample, count distinct timestamps), to check the
/// time-ordered slices against.
fn naive_share(
    all: &[ShareSample],
    gpu: u32,
    pid: u32,
    from: u64,
    to: u64,
) -> Option<(f64, u64, u64)> {
    let inside: Vec<&ShareSample> = all
        .iter()
        .filter(|s| s.gpu == gpu && s.ts_us >= from && s.ts_us < to)
        .collect();
    let mut points: Vec<u64> = inside.iter().map(|s| s.ts_us).collect();
    points.sort_unstable();
    points.dedup();
    let mine: Vec<&&ShareSample> = inside.iter().filter(|s| s.pid == pid).collect();
    let sm: u64 = mine.iter().map(|s| u64::from(s.sm.min(100))).sum();
    (!points.is_empty()).then(|| {
        let n = points.len() as u64;
        (sm as f64 / (100.0 * n as f64), mine.len() as u64, n)
    })
}

// Samples of two GPUs and five processes, many at the same timestamp, fed out of time order
// (NVML batches of several GPUs interleave): every window, the run figures and the recent
// window equal the plain scan's.
#[test]
fn time_ordered_slices_give_the_plain_scans_figures_with_samples_out_of_order() {
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let mut all = Vec::new();
    for _ in 0..3000 {
        let r = next();
        all.push(ShareSample {
            gpu: (r % 2) as u32,
            uuid: None,
            pid: 100 + (r >> 8) as u32 % 5,
            // 600 distinct timestamps 200 ms apart, so points repeat; some out of order.
            ts_us: 1_000_000 + ((r >> 16) % 600) * 200_000,
            sm: ((r >> 32) % 120) as u32,
            mem: 0,
            enc: 0,
            dec: 0,
        });
    }
    let m = model(&all);
    let end = 1_000_000 + 600 * 200_000;
    for gpu in [0, 1] {
        for pid in 100..105 {
            for (from, to) in [
                (0, u64::MAX),
                (1_000_000, 5_000_000),
                (7_300_000, 7_300_001),
                (50_000_000, end),
            ] {
                let got = m
                    .share(gpu, pid, from, to)
                    .map(|s| (s.ratio, s.samples, s.points));
                let want = naive_share(&all, gpu, pid, from, to);
                match (got, want) {
                    (Some(g), Some(w)) => assert!(
                        close(g.0, w.0) && g.1 == w.1 && g.2 == w.2,
                        "{gpu} {pid} {from}..{to}: {g:?} {w:?}"
                    ),
                    (g, w) => assert_eq!(g.is_some(), w.is_some(), "{gpu} {pid} {from}..{to}"),
                }
            }
            // The run and its largest 10 s window, windows stepped from the GPU's first sample.
            let first = all
                .iter()
                .filter(|s| s.gpu == gpu)
                .map(|s| s.ts_us)
                .min()
                .unwrap();
            let last = all
                .iter()
                .filter(|s| s.gpu == gpu)
                .map(|s| s.ts_us)
                .max()
                .unwrap();
            let (whole, max) = m.run_share(gpu, pid, 10_000_000).unwrap();
            let w = naive_share(&all, gpu, pid, first, last + 1).unwrap();
            assert!(close(whole.ratio, w.0) && whole.points == w.2);
            let mut want_max = 0.0f64;
            let mut at = first;
            while at <= last {
                if let Some((r, _, _)) = naive_share(&all, gpu, pid, at, at + 10_000_000) {
                    want_max = want_max.max(r);
                }
                at += 10_000_000;
            }
            assert!(
                close(max, want_max),
                "{gpu} {pid}: max {max} want {want_max}"
            );
        }
        let last = all
            .iter()
            .filter(|s| s.gpu == gpu)
            .map(|s| s.ts_us)
            .max()
            .unwrap();
        for (g, pid, ratio) in m.recent(1_000_000).into_iter().filter(|r| r.0 == gpu) {
            let (want, _, _) = naive_share(&all, g, pid, last + 1 - 1_000_000, last + 1).unwrap();
            assert!(close(ratio, want), "recent {g} {pid}");
        }
    }
}

/// Process 7's event `kind` (at `ts_ns`), as the pipeline hands it to the model.
fn event(ts_ns: u64, kind: crate::event::EventKind) -> Event {
    Event {
        origin: crate::event::Origin {
            ts_ns,
            cpu: 0,
            pid: 7,
            tid: 7,
            comm: "app".into(),
        },
        kind,
        amd: None,
        key: None,
        api: None,
    }
}

fn schedule(allowed: bool, timeslice_us: u64, interleave: Interleave) -> EventKind {
    EventKind::Schedule {
        task: crate::event::TaskId::RmHandle(0x5c00_0015),
        client: 0xc1d0_0001,
        channels: Some(1),
        timeslice_us: Some(timeslice_us),
        interleave: Some(interleave),
        allowed,
        rm_status: Some(if allowed { 0 } else { 0x1f }),
        errno: if allowed { 0 } else { -1 },
        via_channel: false,
    }
}

fn update(allowed: bool, change: SchedChange) -> EventKind {
    EventKind::SchedUpdate {
        task: crate::event::TaskId::RmHandle(0x5c00_0015),
        client: 0xc1d0_0001,
        change,
        allowed,
        rm_status: Some(if allowed { 0 } else { 0x1f }),
        errno: 0,
        via_channel: false,
    }
}

fn timeslice(new_us: u64) -> SchedChange {
    SchedChange::Timeslice {
        old_us: None,
        old_source: None,
        new_us,
    }
}

fn interleave(new: Interleave) -> SchedChange {
    SchedChange::Interleave {
        old: None,
        old_source: None,
        new: Some(new),
        new_raw: new as u32,
    }
}

// ShareModel::observe driven by events: an allowed SCHEDULE sets the parameters in force, a
// refused SCHEDULE or SCHED_UPDATE (the driver said no: nothing changed on the GPU) changes
// neither them nor the list of changes, and an allowed SCHED_UPDATE after them is measured
// from the allowed SCHEDULE's values. The event's time is asked for exactly at each change.
#[test]
fn refused_schedules_and_updates_leave_the_parameters_in_force() {
    let mut m = ShareModel::new();
    // One sample, so that GPU 0 has a span for around_changes.
    m.add(&ShareSample {
        gpu: 0,
        uuid: None,
        pid: 7,
        ts_us: 1,
        sm: 99,
        mem: 0,
        enc: 0,
        dec: 0,
    });
    let asked = std::cell::Cell::new(0);
    let mut see = |ts_ns: u64, kind| {
        m.observe(&event(ts_ns, kind), || {
            asked.set(asked.get() + 1);
            ts_ns / 1000
        })
    };
    see(1_000, schedule(true, 2048, Interleave::Medium));
    see(2_000, schedule(false, 8192, Interleave::High));
    see(3_000, update(false, timeslice(4096)));
    see(4_000, update(false, interleave(Interleave::Low)));
    see(5_000, update(true, timeslice(512)));
    see(6_000, schedule(false, 16_384, Interleave::Low));
    see(7_000, update(false, interleave(Interleave::High)));
    assert_eq!(
        asked.get(),
        2,
        "the allowed SCHEDULE and the allowed SCHED_UPDATE"
    );
    assert_eq!(
        m.params_now(7),
        Some("timeslice=512 us interleave=MEDIUM"),
        "after the allowed update, the refused ones ignored"
    );
    let changes: Vec<(u64, Option<String>, String)> = m
        .around_changes(0, 7)
        .into_iter()
        .map(|c| (c.at_us, c.before_params, c.after_params))
        .collect();
    assert_eq!(
        changes,
        [(
            5,
            Some("timeslice=2048 us interleave=MEDIUM".to_string()),
            "timeslice=512 us interleave=MEDIUM".to_string()
        )]
    );
}

// Before/after each change reach only as far as the neighbouring changes. GPU 0 is sampled at
// 100, 200, … 1000 µs (10 points, one sample each at 100 %): process 1 at 100, 200, 300 and
// 800, 900, 1000; process 2 at 400 … 700. Process 1's parameters change at 400 and at 700:
//   at 400: before [100, 400) 3 points, 3 of process 1 → 1.0; after [400, 700) 3 points, 0.
//   at 700: before [400, 700) 3 points, 0; after [700, 1001) 4 points, 3 → 0.75.
// (Windows unbounded by the neighbours would read 3/7 after 400 and 3/6 before 700.)
#[test]
fn before_and_after_each_change_end_at_the_neighbouring_changes() {
    let samples: Vec<ShareSample> = (1..=10u64)
        .map(|i| ShareSample {
            gpu: 0,
            uuid: None,
            pid: if (4..=7).contains(&i) { 2 } else { 1 },
            ts_us: i * 100,
            sm: 100,
            mem: 0,
            enc: 0,
            dec: 0,
        })
        .collect();
    let mut m = model(&samples);
    m.params(1, 0, "timeslice=1024 us".into());
    m.params(1, 400, "timeslice=2048 us".into());
    m.params(1, 700, "timeslice=4096 us".into());
    // (at, (samples, points) before, (samples, points) after)
    type Figures = (u64, (u64, u64), (u64, u64));
    let figures: Vec<Figures> = m
        .around_changes(0, 1)
        .iter()
        .map(|c| {
            let (b, a) = (c.before.unwrap(), c.after.unwrap());
            (c.at_us, (b.samples, b.points), (a.samples, a.points))
        })
        .collect();
    assert_eq!(figures, [(400, (3, 3), (0, 3)), (700, (0, 3), (3, 4))]);
    let c = m.around_changes(0, 1);
    assert!(close(c[0].before.unwrap().ratio, 1.0), "{:?}", c[0]);
    assert!(close(c[1].after.unwrap().ratio, 0.75), "{:?}", c[1]);
}

fn sample(pid: u32, ts_us: u64, sm: u32) -> ShareSample {
    ShareSample {
        gpu: 0,
        uuid: Some("GPU-test".into()),
        pid,
        ts_us,
        sm,
        mem: 5,
        enc: 1,
        dec: 2,
    }
}

/// Found by the mutation run (round 13): nothing in the core's tests wrote a `GPU_SHARE`
/// line's own fields, or looked at a model without samples.
#[test]
fn a_share_samples_text_is_its_fields() {
    let mut line = String::new();
    crate::section::Section::text(&sample(7, 1, 37), &mut line);
    assert_eq!(line, "gpu=0 sm=37% mem=5% enc=1% dec=2%");
}

#[test]
fn a_model_without_samples_is_empty_and_says_nothing() {
    let mut m = ShareModel::new();
    assert!(m.is_empty());
    assert!(m.render_lines(1_000_000).is_empty());
    m.add(&sample(7, 1, 37));
    assert!(!m.is_empty());
    assert!(!m.render_lines(1_000_000).is_empty());
}

/// Past [`MAX_KEPT_SAMPLES`], samples are counted, not kept, and the statistics say how many.
#[test]
fn samples_past_the_cap_are_counted_not_kept() {
    let mut m = ShareModel::new();
    for i in 0..MAX_KEPT_SAMPLES as u64 + 3 {
        m.add(&sample(7, i, 1));
    }
    assert_eq!(m.not_kept, 3);
    let lines = m.render_lines(1_000_000);
    assert_eq!(
        lines.last().map(String::as_str),
        Some("  3 samples over the 1048576 kept were not counted"),
        "{lines:?}"
    );
}

/// Found by the mutation run (round 13): no test followed the parameters a `TASK_INIT` sets,
/// or an allowed interleave update (only refused ones, and an allowed timeslice update).
#[test]
fn task_init_and_an_allowed_interleave_update_set_the_parameters() {
    let mut m = ShareModel::new();
    m.add(&sample(7, 1, 99));
    let init = EventKind::TaskInit {
        task: crate::event::TaskId::RmHandle(0x5c00_0015),
        client: 0xc1d0_0001,
        engine: None,
        engine_type: None,
        timeslice_us: Some(1024),
        timeslice_source: crate::event::ValueSource::DriverDefault,
        interleave: Some(Interleave::Low),
        interleave_source: crate::event::ValueSource::DriverDefault,
        runlist: None,
        gpu: None,
    };
    m.observe(&event(1_000, init), || 1);
    assert_eq!(m.params_now(7), Some("timeslice=1024 us interleave=LOW"));
    m.observe(
        &event(2_000, update(true, interleave(Interleave::High))),
        || 2,
    );
    assert_eq!(m.params_now(7), Some("timeslice=1024 us interleave=HIGH"));
}

/// Found by the mutation run (round 13): the cap on processes whose parameters are followed
/// (a new process past it is not followed; one already followed still is), several GPUs, and
/// the recent window had no test of their own in the core.
#[test]
fn parameters_of_processes_past_the_cap_are_not_followed_but_known_ones_are() {
    let mut m = ShareModel::new();
    let at = |pid: u32, ts_ns: u64, kind| {
        let mut e = event(ts_ns, kind);
        e.origin.pid = pid;
        e
    };
    for pid in 0..MAX_FOLLOWED_PROCESSES as u32 {
        m.observe(&at(pid, 1_000, schedule(true, 1024, Interleave::Low)), || 1);
    }
    let past = MAX_FOLLOWED_PROCESSES as u32;
    m.observe(
        &at(past, 2_000, schedule(true, 2048, Interleave::Low)),
        || 2,
    );
    assert_eq!(m.params_now(past), None, "past the cap: not followed");
    m.observe(&at(7, 3_000, update(true, timeslice(4096))), || 3);
    assert_eq!(m.params_now(7), Some("timeslice=4096 us interleave=LOW"));
}

#[test]
fn several_gpus_and_the_recent_window_are_reported() {
    let mut m = ShareModel::new();
    m.add(&sample(7, 100, 60));
    m.add(&ShareSample {
        gpu: 1,
        ..sample(8, 100, 30)
    });
    assert_eq!(m.gpus(), [0, 1]);
    let recent = m.recent(1_000_000);
    assert_eq!(recent.len(), 2, "{recent:?}");
    assert!(
        recent.contains(&(0, 7, 0.6)) && recent.contains(&(1, 8, 0.3)),
        "{recent:?}"
    );
}
