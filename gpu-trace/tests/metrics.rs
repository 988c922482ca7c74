//! `--metrics` end to end.
//!
//! 1. A real GPU-host recording through the pipeline with metrics: the TSGs by engine that the
//!    workload is known to create (no root needed).
//! 2. A real Prometheus server (Debian's `prometheus`, /usr/bin/prometheus) scraping a live
//!    `gpu-trace --metrics` every second while child processes issue a known number of
//!    RM-shaped calls on a watched device; the counters Prometheus's HTTP API returns must
//!    equal the calls issued. Needs root and prometheus; otherwise `SKIPPED: why`.

mod common;
mod rel_support;

use std::{
    net::{SocketAddr, TcpListener},
    path::Path,
    process::{Child, Command, Stdio},
};

use common::prometheus::*;
use gpu_trace::{
    cli::Format,
    metrics::{Metrics, MetricsConfig},
    pipeline::Pipeline,
    record::RecordReader,
};
use rel_support::*;

/// The value of the sample whose line starts with `series` exactly.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .map(|v| v.parse().expect("a number"))
}

/// The sum of the samples of `name` whose labels contain `has` (e.g. `engine="COPY"`).
fn sum(text: &str, name: &str, has: &[&str]) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .filter(|l| has.iter().all(|h| l.contains(h)))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
        .sum()
}

/// two_streams.gtrace: PyTorch on an H200 doing matmuls on two streams. The workload is known
/// (from the RM calls it makes, docs/platforms.md) to allocate 4 TSGs, the first on the graphics
/// engine (GR0) and three on copy engines, with 8/4/4/4 channels (one work-submit token each),
/// schedule each TSG once, and leave them to be torn down when the process exits.
#[test]
fn a_real_recording_shows_the_jobs_tsgs_by_engine() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/two_streams.gtrace");
    let mut reader =
        RecordReader::new(std::io::BufReader::new(std::fs::File::open(&path).unwrap())).unwrap();
    let metrics = Metrics::new(MetricsConfig::default());
    let registry = metrics.registry();
    let mut p = Pipeline::new(pipeline_config(Format::Text), std::io::sink())
        .with_output(Box::new(metrics));
    let mut before_exit = None;
    while let Some(bytes) = reader.next_record().unwrap() {
        p.feed(&bytes).unwrap();
        let t = gpu_trace::metrics::encode(&registry);
        // The scrape while the job runs: all four TSGs live, one GR and three copy.
        if sum(&t, "gpu_trace_live_tasks", &[]) == 4.0 && before_exit.is_none() {
            before_exit = Some(t);
        }
    }
    let during = before_exit.expect("a moment with the 4 TSGs alive");
    let python = "comm=\"python3\"";
    assert_eq!(
        sum(
            &during,
            "gpu_trace_live_tasks",
            &["engine=\"GRAPHICS\"", python]
        ),
        1.0,
        "{during}"
    );
    assert_eq!(
        sum(
            &during,
            "gpu_trace_live_tasks",
            &["engine=\"COPY\"", python]
        ),
        3.0,
        "{during}"
    );

    let t = gpu_trace::metrics::encode(&registry);
    let ev = |event: &str, engine: &str| {
        sum(
            &t,
            "gpu_trace_events_total",
            &[
                &format!("event=\"{event}\""),
                &format!("engine=\"{engine}\""),
                python,
            ],
        )
    };
    assert_eq!(
        (ev("TASK_INIT", "GRAPHICS"), ev("TASK_INIT", "COPY")),
        (1.0, 3.0),
        "{t}"
    );
    assert_eq!(
        (ev("SCHEDULE", "GRAPHICS"), ev("SCHEDULE", "COPY")),
        (1.0, 3.0)
    );
    assert_eq!(
        (ev("WORK_SUBMIT", "GRAPHICS"), ev("WORK_SUBMIT", "COPY")),
        (8.0, 12.0)
    );
    // Torn down at process exit (by its cuda-EvtHandlr thread: still the process python3).
    assert_eq!(
        (ev("TASK_DESTROY", "GRAPHICS"), ev("TASK_DESTROY", "COPY")),
        (1.0, 3.0)
    );
    assert_eq!(sum(&t, "gpu_trace_live_tasks", &[]), 0.0);
    assert_eq!(sum(&t, "gpu_trace_schedules_refused_total", &[]), 0.0);
    // One latency and one lifetime per TSG.
    assert_eq!(
        sum(&t, "gpu_trace_schedule_latency_seconds_count", &[]),
        4.0
    );
    assert_eq!(sum(&t, "gpu_trace_task_lifetime_seconds_count", &[]), 4.0);
    assert_eq!(sample(&t, "gpu_trace_decode_errors_total"), Some(0.0));
}

/// `gpu_trace_ring_buffer_used_bytes` reads the kernel's positions: with 100 records waiting,
/// the fill equals what the kernel's ring-buffer layout says they occupy (each record behind an
/// 8-byte header, rounded up to 8 bytes: BPF_RINGBUF_HDR_SZ in kernel/bpf/ringbuf.c), and 0 once
/// they are read.
#[test]
fn ring_fill_reads_the_kernels_positions() {
    use std::os::fd::AsFd as _;
    let test = "ring_fill_reads_the_kernels_positions";
    if let Some(why) = cannot_trace() {
        common::skipped(test, why);
        return;
    }
    let options = gpu_trace::loader::LoadOptions {
        extra_device: Some(watched_dev()),
        ring_bytes: 1 << 20,
        // Only this process: other processes on the machine may use the watched device too.
        filter_tgid: Some(std::process::id()),
        ..Default::default()
    };
    let mut tracer = match gpu_trace::loader::Tracer::load(&options) {
        Ok(t) => t,
        Err(e) if e.is_unsupported() => {
            common::skipped(test, e);
            return;
        }
        Err(e) => panic!("{test}: loading failed: {e}"),
    };
    let mut ring = tracer.take_ring_buffer().unwrap();
    let fill = gpu_trace::metrics::ring::RingFill::new(ring.as_fd()).expect("mapping the ring");
    while ring.next().is_some() {}
    assert_eq!(fill.used_bytes(), 0);
    let dev = watched(); // kept open: closing it would add a record
    let s = Schedule::new(0xC1D0_0009, 0x5C00_0009);
    for _ in 0..100 {
        assert_eq!(s.issue(&dev), -ENOTTY);
    }
    let used = fill.used_bytes();
    let me = gettid();
    let (mut calls, mut cgroups, mut want) = (0, 0, 0u64);
    while let Some(item) = ring.next() {
        // Every record counts toward the fill; the other tests of this binary run in threads
        // of this process, so only this thread's calls are counted as calls.
        want += (item.len() as u64 + 8).next_multiple_of(8);
        match gpu_trace::wire::parse_record(&item) {
            Ok(gpu_trace::wire::RawRecord::NvIoctl(r)) if r.hdr.tid == me => calls += 1,
            Ok(gpu_trace::wire::RawRecord::TaskCgroup(_)) => cgroups += 1,
            _ => {}
        }
    }
    // One record per call, and this process's cgroup record before its first (issue 14).
    assert_eq!(
        (calls, cgroups),
        (100, 1),
        "one record per call, and the cgroup record"
    );
    assert_eq!(used, want, "{test}: fill before reading");
    assert_eq!(fill.used_bytes(), 0, "{test}: fill after reading");
    drop(dev);
}

// ---------------------------------------------------------------------------------------------
// A real Prometheus.

/// Child body: names its thread `PROM_COMM`, then issues `PROM_CALLS` GPFIFO_SCHEDULE calls
/// (each refused: the watched device has no ioctls) and as many RM_FREEs (records, no events).
#[test]
#[ignore = "child process body for the Prometheus test"]
fn prom_child() {
    let comm = std::env::var("PROM_COMM").unwrap();
    let calls = env_num("PROM_CALLS", 1);
    set_comm(&comm);
    let dev = watched();
    let s = Schedule::new(0xC1D0_0001, 0x5C00_0001);
    for _ in 0..calls {
        assert_eq!(s.issue(&dev), -ENOTTY);
        assert_eq!(free(&dev, 0xC1D0_0001, 0x5C00_0002), -ENOTTY);
    }
}

#[test]
fn a_real_prometheus_scrapes_counts_equal_to_the_calls_issued() {
    let test = "a_real_prometheus_scrapes_counts_equal_to_the_calls_issued";
    if let Some(why) = cannot_trace() {
        common::skipped(test, why);
        return;
    }
    if !Path::new(PROMETHEUS).exists() {
        common::skipped(
            test,
            format!(
                "{PROMETHEUS} is not installed (apt-get install prometheus; scripts/setup.sh does)"
            ),
        );
        return;
    }
    let metrics: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let traced = Traced::start(&[
        "--watch-device",
        WATCHED,
        "--ring-size",
        "16777216",
        "--metrics",
        &metrics.to_string(),
        "--quiet",
    ])
    .unwrap_or_else(|e| panic!("{test}: {e}"));
    let prom_addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let prom = start_prometheus(metrics, prom_addr);

    // Three processes with known names, one of them hostile (quote, backslash, escape).
    let evil = "ev\"il\\\x1b[2J";
    // As exposed: escaped as the text output escapes it (output/escape.rs: `\\`, `\xNN`),
    // then JSON-decoded by the query.
    let evil_label = "ev\"il\\\\\\x1b[2J";
    let plan = [("promA", 300u64), ("promB", 1200), (evil, 50)];
    let children: Vec<Child> = plan
        .iter()
        .map(|(comm, calls)| {
            child("prom_child")
                .env("PROM_COMM", comm)
                .env("PROM_CALLS", calls.to_string())
                .spawn()
                .unwrap()
        })
        .collect();
    for mut c in children {
        assert!(c.wait().unwrap().success(), "prom_child failed");
    }
    let issued: u64 = plan.iter().map(|(_, n)| n).sum();

    // Prometheus is up and scraping gpu-trace.
    let up = wait_for(prom_addr, "up{job=\"gpu-trace\"}", |r| {
        r.iter().any(|(_, v)| *v == 1.0)
    });
    let log = || std::fs::read_to_string(prom.dir.join("prometheus.log")).unwrap_or_default();
    assert_eq!(
        up.len(),
        1,
        "{test}: Prometheus has no gpu-trace target: {up:?}; its log:\n{}",
        tail(&log())
    );
    assert_eq!(
        up[0].1,
        1.0,
        "{test}: gpu-trace scrape is down; Prometheus's log:\n{}",
        tail(&log())
    );

    // Other processes on this machine may use the watched device too: count ours, by name.
    let ours = "comm=~\"promA|promB|ev.il.*\"";
    let q = format!("sum(gpu_trace_events_total{{event=\"SCHEDULE\",{ours}}})");
    let total = wait_for(prom_addr, &q, |r| {
        r.first().is_some_and(|(_, v)| *v >= issued as f64)
    });
    assert_eq!(
        total.first().map(|r| r.1),
        Some(issued as f64),
        "{test}: {q}"
    );

    let per_comm = query(prom_addr, "gpu_trace_schedules_refused_total");
    eprintln!("{test}: Prometheus says: {per_comm:?}");
    for (comm, calls) in [("promA", 300u64), ("promB", 1200), (evil_label, 50)] {
        let got: Vec<f64> = per_comm
            .iter()
            .filter(|(m, _)| m["comm"] == comm)
            .map(|(_, v)| *v)
            .collect();
        assert_eq!(
            got,
            vec![calls as f64],
            "{test}: refused for comm {comm:?}: {per_comm:?}"
        );
    }
    // Every SCHEDULE was refused, and no event kind other than SCHEDULE happened (no such
    // series at all: series appear with their first value).
    let refused = query(
        prom_addr,
        &format!("sum(gpu_trace_schedules_refused_total{{{ours}}})"),
    );
    assert_eq!(refused.first().map(|r| r.1), Some(issued as f64));
    let others = query(
        prom_addr,
        &format!("sum(gpu_trace_events_total{{event!=\"SCHEDULE\",{ours}}})"),
    );
    assert!(others.is_empty(), "{others:?}");
    // Health: nothing dropped, nothing undecodable; every call was a record (plus exits).
    for name in [
        "gpu_trace_dropped_records_total",
        "gpu_trace_decode_errors_total",
    ] {
        let r = query(prom_addr, name);
        assert_eq!(r.first().map(|r| r.1), Some(0.0), "{test}: {name}");
    }
    let records = wait_for(prom_addr, "gpu_trace_records_total", |r| {
        r.first().is_some_and(|(_, v)| *v >= 2.0 * issued as f64)
    });
    let records = records.first().map_or(0.0, |r| r.1);
    assert!(records >= 2.0 * issued as f64, "{test}: records {records}");
    let fill = query(prom_addr, "gpu_trace_ring_buffer_used_bytes");
    assert!(
        fill.len() == 1 && (0.0..=16_777_216.0).contains(&fill[0].1),
        "{test}: ring fill {fill:?}"
    );
    assert!(
        query(prom_addr, "gpu_trace_build_info").len() == 1,
        "{test}: build_info missing"
    );
    // No PID label on any series.
    let series = query(prom_addr, "{job=\"gpu-trace\"}");
    assert!(series.iter().all(|(m, _)| m.get("pid").is_none()));

    drop(prom);
    let f = traced.interrupt();
    assert_eq!(f.status.code(), Some(0), "{}", f.stderr);
    assert!(f.stdout.is_empty(), "--quiet printed: {}", tail(&f.stdout));
}

/// Usage errors exit 2 before anything loads; a port in use stops the run before any hook
/// (exit 1, saying so). No root needed: both come before the programs are loaded.
#[test]
fn metrics_address_errors_stop_the_run_early() {
    let run = |args: &[&str]| {
        Command::new(gpu_trace_bin())
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("running gpu-trace")
    };
    let out = run(&["--vendor", "nvidia", "--metrics", "0.0.0.0:9464"]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "non-loopback without --metrics-allow-remote"
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("--metrics-allow-remote"));
    let out = run(&["--vendor", "nvidia", "--metrics-allow-remote"]);
    assert_eq!(out.status.code(), Some(2), "--metrics-allow-remote alone");
    let out = run(&["--quiet", "-o", "x.txt"]);
    assert_eq!(out.status.code(), Some(2), "--quiet with -o");

    let busy = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = busy.local_addr().unwrap().to_string();
    let out = run(&["--vendor", "nvidia", "--metrics", &addr, "--duration", "1"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("cannot listen"), "{stderr}");
    assert!(
        !stderr.contains("hooks:"),
        "attached despite the busy port: {stderr}"
    );
}

/// `--metrics-web-config` with `tls_server_config`: a certificate or key that cannot be read or
/// used is a usage error (exit 2, naming the file) before anything loads; a good pair is
/// accepted (the run goes on to listen: on a busy port it stops there, exit 1). No root needed.
#[test]
fn metrics_tls_files_are_checked_before_the_run() {
    let test = "metrics_tls_files_are_checked_before_the_run";
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = (dir.path().join("m.crt"), dir.path().join("m.key"));
    let made = Command::new("openssl")
        .args(["req", "-x509", "-newkey", "ec", "-pkeyopt"])
        .args(["ec_paramgen_curve:P-256", "-nodes", "-days", "2"])
        .args(["-subj", "/CN=localhost", "-keyout"])
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output();
    if !made.as_ref().is_ok_and(|o| o.status.success()) {
        common::skipped(
            test,
            format!("openssl cannot make a test certificate: {made:?}"),
        );
        return;
    }
    let busy = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = busy.local_addr().unwrap().to_string();
    let run = |name: &str, yaml: &str| {
        let web = dir.path().join(name);
        std::fs::write(&web, yaml).unwrap();
        let out = Command::new(gpu_trace_bin())
            .args(["--vendor", "nvidia", "--metrics", &addr, "--duration", "1"])
            .arg("--metrics-web-config")
            .arg(&web)
            .stdin(Stdio::null())
            .output()
            .expect("running gpu-trace");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, stderr) = run(
        "missing.yml",
        "tls_server_config:\n  cert_file: nothere.crt\n  key_file: m.key\n",
    );
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("nothere.crt"), "{stderr}");
    // The certificate given as the key: no private key in it.
    let (code, stderr) = run(
        "swapped.yml",
        "tls_server_config:\n  cert_file: m.crt\n  key_file: m.crt\n",
    );
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("key_file"), "{stderr}");
    let (code, stderr) = run(
        "good.yml",
        "tls_server_config:\n  cert_file: m.crt\n  key_file: m.key\n",
    );
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("cannot listen"), "{stderr}");
}
