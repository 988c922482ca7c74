//! The `--metrics` endpoint under attack (issue 26, item 1), against the real `gpu-trace` binary
//! over loopback: requests that announce absurd bodies, a 300 MiB header line, 1000 idle and slow
//! connections. After each: the tracer is alive, `GET /metrics` answers 200, its thread count
//! and resident memory stay bounded; at the end SIGINT gives exit 0 with the statistics.

mod common;
mod rel_support;

use std::{
    io::{Read, Write},
    net::{SocketAddr, TcpStream},
    time::{Duration, Instant},
};

use rel_support::*;

/// `GET path` with optional extra header lines: (status line, body), or why it failed.
fn get(addr: SocketAddr, path: &str, headers: &str) -> Result<(String, String), String> {
    let mut s =
        TcpStream::connect_timeout(&addr, Duration::from_secs(2)).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n{headers}\r\n").map_err(|e| e.to_string())?;
    let mut r = Vec::new();
    s.read_to_end(&mut r).map_err(|e| e.to_string())?;
    let r = String::from_utf8_lossy(&r).into_owned();
    let (head, body) = r.split_once("\r\n\r\n").unwrap_or((&r, ""));
    Ok((
        head.lines().next().unwrap_or("").to_string(),
        body.to_string(),
    ))
}

/// Whether `GET /metrics` answers 200 with the OpenMetrics text, retrying for up to `within`.
fn serves_within(addr: SocketAddr, within: Duration) -> Result<(), String> {
    let t = Instant::now();
    loop {
        let last = match get(addr, "/metrics", "") {
            Ok((status, body)) if status.contains(" 200") && body.trim_end().ends_with("# EOF") => {
                return Ok(());
            }
            Ok((status, _)) => status,
            Err(e) => e,
        };
        if t.elapsed() > within {
            return Err(format!(
                "GET /metrics did not answer 200 within {within:?}: {last}"
            ));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A field of /proc/PID/status (the number before any unit).
fn status_field(pid: u32, field: &str) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_else(|e| panic!("gpu-trace (pid {pid}) is gone: {e}"));
    s.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
}

/// The bound on the tracer's resident memory through every attack, in KiB: its own start-up
/// size plus 32 MiB, and under the DaemonSet's limit of 128 MiB.
const RSS_GROWTH_KIB: u64 = 32 << 10;
const RSS_LIMIT_KIB: u64 = 128 << 10;

/// The tracer is alive, serves, and its threads and memory are within bounds.
fn check(traced: &mut Traced, addr: SocketAddr, after: &str, threads0: u64, rss0: u64) {
    if let Some(status) = traced.child.try_wait().unwrap() {
        panic!("after {after}: gpu-trace exited ({status})");
    }
    serves_within(addr, Duration::from_secs(10)).unwrap_or_else(|e| panic!("after {after}: {e}"));
    let pid = traced.pid();
    let (threads, rss) = (status_field(pid, "Threads"), status_field(pid, "VmRSS"));
    eprintln!("after {after}: {threads} threads, VmRSS {rss} KiB");
    assert!(
        threads <= threads0 + 2,
        "after {after}: {threads} threads (at start {threads0})"
    );
    assert!(
        rss <= rss0 + RSS_GROWTH_KIB && rss <= RSS_LIMIT_KIB,
        "after {after}: VmRSS {rss} KiB (at start {rss0} KiB)"
    );
}

/// Sends a request head announcing `len` body bytes, then 3 bytes, and reads what comes back.
fn announce_body(addr: SocketAddr, len: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let _ = write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: {len}\r\n\r\nabc"
    );
    let mut r = Vec::new();
    let _ = s.read_to_end(&mut r);
    String::from_utf8_lossy(&r)
        .lines()
        .next()
        .unwrap_or("")
        .to_string()
}

/// Waits until gpu-trace (`pid`) holds no TCP connection, only its listening socket(s): its
/// socket descriptors against the kernel's TCP table (state 0A is LISTEN). Bounded so that a
/// tracer that never closes them fails the test instead of hanging it.
fn wait_connections_closed(pid: u32, test: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let inodes: std::collections::HashSet<String> =
            std::fs::read_dir(format!("/proc/{pid}/fd"))
                .unwrap()
                .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
                .filter_map(|l| {
                    let l = l.to_string_lossy().into_owned();
                    Some(l.strip_prefix("socket:[")?.strip_suffix(']')?.to_string())
                })
                .collect();
        let mut held = 0;
        for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
            let text = std::fs::read_to_string(table).unwrap_or_default();
            for f in text
                .lines()
                .skip(1)
                .map(|l| l.split_whitespace().collect::<Vec<_>>())
            {
                if f.len() > 9 && f[3] != "0A" && inodes.contains(f[9]) {
                    held += 1;
                }
            }
        }
        if held == 0 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{test}: gpu-trace still holds {held} connections 60 s after they were closed"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Raises this process's descriptor limit to `n` (the test holds 1000 connections).
fn raise_nofile(n: u64) {
    let lim = libc::rlimit {
        rlim_cur: n,
        rlim_max: n,
    };
    // SAFETY: setrlimit with a valid struct.
    let rc = unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) };
    assert_eq!(rc, 0, "setrlimit(RLIMIT_NOFILE, {n})");
}

/// Sets process `pid`'s soft descriptor limit to `n` (the hard one kept); returns the soft
/// limit it had.
fn set_nofile(pid: u32, n: u64) -> u64 {
    let mut old = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: prlimit with a valid pointer; reading only.
    let rc = unsafe { libc::prlimit(pid as i32, libc::RLIMIT_NOFILE, std::ptr::null(), &mut old) };
    assert_eq!(rc, 0, "prlimit(pid {pid}) read");
    let new = libc::rlimit {
        rlim_cur: n,
        rlim_max: old.rlim_max,
    };
    // SAFETY: as above, setting the soft limit only.
    let rc = unsafe { libc::prlimit(pid as i32, libc::RLIMIT_NOFILE, &new, std::ptr::null_mut()) };
    assert_eq!(rc, 0, "prlimit(pid {pid}, NOFILE, {n})");
    old.rlim_cur
}

#[test]
fn hostile_clients_cannot_take_the_metrics_endpoint_down() {
    let test = "hostile_clients_cannot_take_the_metrics_endpoint_down";
    if skip_unless_root(test) {
        return;
    }
    let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    // Only this process (it makes no driver calls): other tests on the machine may storm the
    // watched device, and their drops would change the exit status.
    let me = std::process::id().to_string();
    let mut traced = Traced::start(&[
        "--watch-device",
        WATCHED,
        "--pid",
        &me,
        "--format",
        "json",
        "--metrics",
        &addr.to_string(),
    ])
    .unwrap_or_else(|e| panic!("{test}: {e}"));
    serves_within(addr, Duration::from_secs(10)).unwrap();
    let pid = traced.pid();
    let (threads0, rss0) = (status_field(pid, "Threads"), status_field(pid, "VmRSS"));
    eprintln!("{test}: at start {threads0} threads, VmRSS {rss0} KiB");

    // 1. Bodies announced and never sent: never allocated, never waited for. Waiting would
    // end at the server's timeout (the timed-out counter grows) or past the client's 10 s
    // (no answer): an answer with the counter unchanged is an answer that did not wait.
    for len in ["100000000000", "18446744073709551615"] {
        let timed_out = server_counter(addr, "", TIMED_OUT);
        let status = announce_body(addr, len);
        assert!(
            status.starts_with("HTTP/1."),
            "Content-Length {len}: no answer: {status:?}"
        );
        assert_eq!(
            server_counter(addr, "", TIMED_OUT),
            timed_out,
            "Content-Length {len}: the server waited for the body until its timeout"
        );
        eprintln!("{test}: Content-Length {len}: {status:?}");
        check(
            &mut traced,
            addr,
            &format!("Content-Length {len}"),
            threads0,
            rss0,
        );
    }

    // 2. One header line of 300 MiB, sent in 64 KiB pieces until the server closes.
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_write_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Huge: ")
        .unwrap();
    let piece = vec![b'a'; 64 << 10];
    let mut sent = 0usize;
    while sent < 300 << 20 {
        if s.write_all(&piece).is_err() {
            break;
        }
        sent += piece.len();
    }
    drop(s);
    eprintln!(
        "{test}: the server closed after {} KiB of header",
        sent >> 10
    );
    assert!(
        sent < 16 << 20,
        "the server read {} MiB of one header line",
        sent >> 20
    );
    check(&mut traced, addr, "a 300 MiB header", threads0, rss0);

    // 3. 1000 connections held open: half silent, half sending a head slowly (one line, then
    // nothing). The endpoint answers while they are still open (each new connection takes the
    // slot of the oldest one without a request head).
    raise_nofile(4096);
    let mut held = Vec::new();
    for i in 0..1000 {
        match TcpStream::connect_timeout(&addr, Duration::from_secs(2)) {
            Ok(mut c) => {
                if i % 2 == 1 {
                    let _ = c.write_all(b"GET /metrics HTTP/1.1\r\n");
                }
                held.push(c);
            }
            Err(e) => eprintln!("{test}: connection {i}: {e}"),
        }
    }
    eprintln!("{test}: {} connections open", held.len());
    // No wait: the check's own connection queues behind the 1000 (the kernel hands connections
    // to accept() in the order they completed), so it is answered with them accepted.
    check(
        &mut traced,
        addr,
        "1000 idle and slow connections",
        threads0,
        rss0,
    );
    drop(held);

    // 4. No descriptor free: the tracer's limit set to what it has open plus 4, then 40
    // connections. Accepts fail (EMFILE), are counted, said on stderr and retried; once
    // descriptors are free again it serves. First the tracer must have closed every connection
    // of step 3 (otherwise their closing makes room for the new ones below its connection limit,
    // and no accept ever fails).
    wait_connections_closed(pid, test);
    let open_fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count() as u64;
    let old = set_nofile(pid, open_fds + 4);
    let held: Vec<TcpStream> = (0..40)
        .filter_map(|_| TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok())
        .collect();
    // The part of a `--metrics:` notice about failed accepts ("N accept(s) failed[ in the last
    // T s] (error)"; its other parts are about connections, and it comes at most every 10 s).
    let accepts_said = |l: &str| -> Option<String> {
        let rest = l.strip_prefix("gpu-trace: --metrics: ")?;
        rest.split("; ")
            .find(|part| part.contains(" accept") && part.contains(" failed"))
            .map(str::to_string)
    };
    let said = traced.wait_stderr(
        |lines| lines.iter().any(|l| accepts_said(l).is_some()),
        Duration::from_secs(60),
    );
    set_nofile(pid, old);
    drop(held);
    assert!(
        said,
        "no failed accept said on stderr with the limit at {} descriptors: {:?}",
        open_fds + 4,
        traced.stderr_so_far()
    );
    let line = traced
        .stderr_so_far()
        .iter()
        .find_map(|l| accepts_said(l))
        .unwrap();
    eprintln!("{test}: {line}");
    assert!(
        line.contains("Too many open files"),
        "the line does not name the error: {line}"
    );
    check(&mut traced, addr, "no descriptor free", threads0, rss0);
    let (_, body) = get(addr, "/metrics", "").unwrap();
    let accept_errors: u64 = body
        .lines()
        .find_map(|l| l.strip_prefix("gpu_trace_metrics_accept_errors_total "))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no accept error count in {body}"));
    eprintln!("{test}: {accept_errors} failed accepts");
    let said_count: u64 = line
        .split(' ')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no count at the start of {line:?}"));
    assert!(
        accept_errors >= said_count && said_count >= 1,
        "{accept_errors} failed accepts counted, {said_count} said"
    );

    // Statistics and exit 0 at the end, as without the attacks.
    let f = traced.interrupt();
    assert_eq!(f.status.code(), Some(0), "{}", tail(&f.stderr));
    json_stats(&f.stdout); // panics without the STATS line
    assert!(
        !f.stderr.contains("metrics endpoint"),
        "the endpoint reported a failure: {}",
        tail(&f.stderr)
    );
}

/// `--metrics-bearer-token-file`: the real tracer answers 401 without the token, 200 with it; a
/// non-loopback address is accepted with credentials required (no --metrics-allow-remote), and
/// a missing or empty token file is a usage error (exit 2) before anything loads.
#[test]
fn the_bearer_token_is_required_by_the_real_tracer() {
    let test = "the_bearer_token_is_required_by_the_real_tracer";
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "t0k3n-of-the-test\n").unwrap();
    let token_arg = token.to_str().unwrap();
    let usage = |args: &[&str]| {
        std::process::Command::new(gpu_trace_bin())
            .args(args)
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap()
    };
    let missing = dir.path().join("absent");
    let out = usage(&[
        "--metrics",
        "127.0.0.1:0",
        "--metrics-bearer-token-file",
        missing.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("--metrics-bearer-token-file"));
    // Remote without credentials: still refused.
    let out = usage(&["--metrics", "0.0.0.0:9464"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");

    if skip_unless_root(test) {
        return;
    }
    let me = std::process::id().to_string();
    // Any address of the machine, as a pod binds its own IP: allowed with the token required.
    let port = free_port();
    let traced = Traced::start(&[
        "--watch-device",
        WATCHED,
        "--pid",
        &me,
        "--quiet",
        "--metrics",
        &format!("0.0.0.0:{port}"),
        "--metrics-bearer-token-file",
        token_arg,
    ])
    .unwrap_or_else(|e| panic!("{test}: {e}"));
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let (status, body) = get(addr, "/metrics", "").unwrap();
    assert!(status.contains(" 401"), "{status}");
    assert!(!body.contains("gpu_trace_"), "{body}");
    let (status, _) = get(addr, "/metrics", "Authorization: Bearer wrong\r\n").unwrap();
    assert!(status.contains(" 401"), "{status}");
    let (status, body) = get(
        addr,
        "/metrics",
        "Authorization: Bearer t0k3n-of-the-test\r\n",
    )
    .unwrap();
    assert!(status.contains(" 200"), "{status}");
    assert!(body.contains("gpu_trace_records_total"), "{body}");
    let f = traced.interrupt();
    assert_eq!(f.status.code(), Some(0), "{}", tail(&f.stderr));
}

/// `n` connections held open without a complete request head: silent, or a request line and
/// nothing more.
fn idle_connections(addr: SocketAddr, n: usize) -> Vec<TcpStream> {
    (0..n)
        .map(|i| {
            let mut c = TcpStream::connect_timeout(&addr, Duration::from_secs(2))
                .unwrap_or_else(|e| panic!("idle connection {i}: {e}"));
            if i % 2 == 1 {
                c.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
                    .unwrap();
            }
            c
        })
        .collect()
}

/// 10 scrapes (with `headers`) one after another while `n` idle connections are held, opened
/// before the first (the server accepts in order): how many were answered 200 with the
/// metrics.
fn scrapes_served(addr: SocketAddr, n: usize, headers: &str) -> usize {
    let held = idle_connections(addr, n);
    let served = (0..10)
        .filter(|_| {
            matches!(get(addr, "/metrics", headers),
                Ok((status, body)) if status.contains(" 200") && body.trim_end().ends_with("# EOF"))
        })
        .count();
    drop(held);
    served
}

/// The server's own counter `name` (with `_total`) in a scrape.
fn server_counter(addr: SocketAddr, headers: &str, name: &str) -> u64 {
    let (_, body) = get(addr, "/metrics", headers).unwrap();
    body.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {body}"))
}

const EVICTED: &str = "gpu_trace_metrics_connections_evicted_total";
/// Connections the server closed at its timeouts (the head within 5 s, the whole within 15 s).
const TIMED_OUT: &str = "gpu_trace_metrics_connections_timed_out_total";

/// 32 and 64 idle connections (the limit is 32), with `--metrics` as configured by `access`
/// and scrapes carrying `headers`: every one of 10 scrapes is answered, idle connections were
/// closed to make room, and stderr says so.
fn idle_connections_leave_scrapes_answered(test: &str, access: &[&str], headers: &str) {
    if skip_unless_root(test) {
        return;
    }
    let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let me = std::process::id().to_string();
    let mut args = vec!["--watch-device", WATCHED, "--pid", &me, "--quiet"];
    let addr_arg = addr.to_string();
    args.extend(["--metrics", &addr_arg]);
    args.extend(access);
    let traced = Traced::start(&args).unwrap_or_else(|e| panic!("{test}: {e}"));
    for n in [32, 64] {
        let before = server_counter(addr, headers, EVICTED);
        let served = scrapes_served(addr, n, headers);
        let evicted = server_counter(addr, headers, EVICTED) - before;
        eprintln!(
            "{test}: {n} idle connections: {served} of 10 scrapes answered, {evicted} evicted"
        );
        assert_eq!(served, 10, "{n} idle connections");
        // Those past the 32 slots made room for each other, and one for the first scrape.
        assert!(
            evicted > (n as u64) - 32,
            "{n} idle connections: {evicted} evicted"
        );
    }
    if !access.is_empty() {
        // Without the credentials, among 64 idle connections: 401, and closed once written.
        let held = idle_connections(addr, 64);
        let timed_out = server_counter(addr, headers, TIMED_OUT);
        // `get` reads to the end: it returns once the server closed the connection (or fails
        // past its 10 s).
        let (status, body) = get(addr, "/metrics", "").unwrap();
        assert!(status.contains(" 401"), "{status}");
        assert!(!body.contains("gpu_trace_"), "{body}");
        drop(held);
        assert_eq!(
            server_counter(addr, headers, TIMED_OUT),
            timed_out,
            "the 401's connection was closed by the server's timeout, not once written"
        );
    }
    let f = traced.interrupt();
    assert_eq!(f.status.code(), Some(0), "{}", tail(&f.stderr));
    let said = f
        .stderr
        .lines()
        .find(|l| l.starts_with("gpu-trace: --metrics: ") && l.contains("before sending a request"))
        .unwrap_or_else(|| panic!("no line about closed connections: {}", tail(&f.stderr)));
    eprintln!("{test}: said {said:?}");
    assert!(said.contains("limit 32"), "{said}");
}

/// Issue 36: connections that never finish their request head no longer keep a scraper out
/// (before: 1 of 39 scrapes answered while 32 were held).
#[test]
fn idle_connections_do_not_keep_a_scraper_out() {
    idle_connections_leave_scrapes_answered("idle_connections_do_not_keep_a_scraper_out", &[], "");
}

/// Issue 36 with a bearer token required: unauthenticated connections give their slots up to
/// the scraper with the token (before: 0 of 30 answered), and a request without the token gets
/// its 401 and is closed at once, before the header timeout (5 s).
#[test]
fn unauthenticated_connections_do_not_keep_a_scraper_out() {
    let test = "unauthenticated_connections_do_not_keep_a_scraper_out";
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "t0k3n-of-the-test\n").unwrap();
    let access = ["--metrics-bearer-token-file", token.to_str().unwrap()];
    idle_connections_leave_scrapes_answered(
        test,
        &access,
        "Authorization: Bearer t0k3n-of-the-test\r\n",
    );
}
