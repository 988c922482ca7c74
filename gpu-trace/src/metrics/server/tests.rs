//! Each limit of the server, against the real server over loopback.

use std::{
    io::{Read, Write},
    net::TcpStream,
    time::{Duration, Instant},
};

use super::*;
use gpu_trace_core::{
    metrics::{CONTENT_TYPE, Metrics, MetricsConfig},
    skip::skipped,
};

fn server(limits: Limits) -> (MetricsServer, Metrics) {
    let m = Metrics::new(MetricsConfig::default());
    let s = MetricsServer::start_with(
        "127.0.0.1:0".parse().unwrap(),
        m.registry(),
        limits,
        Access::default(),
    )
    .expect("listening on a free loopback port");
    (s, m)
}

fn connect(s: &MetricsServer) -> TcpStream {
    let c = TcpStream::connect(s.addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    c
}

/// Sends `request` and reads the whole answer (the server closes: no keep-alive).
fn exchange(s: &MetricsServer, request: &[u8]) -> String {
    let mut c = connect(s);
    c.write_all(request).unwrap();
    let mut r = Vec::new();
    let _ = c.read_to_end(&mut r); // a reset after the answer is fine
    String::from_utf8_lossy(&r).into_owned()
}

/// Reads `c` to its end: whether the server closed it (the end, or a reset), not the client's
/// read timeout (20 s: a bound on a hang, far below the tests' server timeouts where that
/// matters). No clock is read.
fn closed_by_server(c: &mut TcpStream, r: &mut Vec<u8>) -> bool {
    match c.read_to_end(r) {
        Ok(_) => true,
        Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
    }
}

fn get(s: &MetricsServer, path: &str) -> String {
    exchange(
        s,
        format!("GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").as_bytes(),
    )
}

/// The value of the server's own counter `name` (without `_total`) in a scrape.
fn counter(s: &MetricsServer, name: &str) -> u64 {
    let r = get(s, "/metrics");
    let line = format!("\n{name}_total ");
    let at = r
        .find(&line)
        .unwrap_or_else(|| panic!("no {name}_total in {r}"));
    r[at + line.len()..]
        .lines()
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

/// The server is still up and answers a scrape.
fn assert_serves(s: &MetricsServer) {
    let r = get(s, "/metrics");
    assert!(
        r.starts_with("HTTP/1.0 200") || r.starts_with("HTTP/1.1 200"),
        "{r}"
    );
    assert!(r.trim_end().ends_with("# EOF"), "{r}");
}

#[test]
fn only_loopback_unless_allowed() {
    let a = |s: &str| s.parse().unwrap();
    assert!(check_addr(a("127.0.0.1:9464"), false).is_ok());
    assert!(check_addr(a("[::1]:9464"), false).is_ok());
    assert!(check_addr(a("0.0.0.0:9464"), false).is_err());
    assert!(check_addr(a("10.1.2.3:9464"), false).is_err());
    assert!(check_addr(a("0.0.0.0:9464"), true).is_ok());
}

#[test]
fn the_server_answers_metrics_and_nothing_else() {
    let (s, _m) = server(Limits::default());
    let r = get(&s, "/metrics");
    assert!(
        r.starts_with("HTTP/1.0 200") || r.starts_with("HTTP/1.1 200"),
        "{r}"
    );
    assert!(r.contains(CONTENT_TYPE), "{r}");
    assert!(r.contains("\ngpu_trace_dropped_records_total 0\n"), "{r}");
    assert!(
        r.contains("\ngpu_trace_metrics_connections_refused_total 0\n"),
        "{r}"
    );
    // One EOF marker, at the end.
    assert_eq!(r.matches("# EOF").count(), 1, "{r}");
    assert!(r.trim_end().ends_with("# EOF"), "{r}");
    assert!(get(&s, "/other").contains(" 404 "));
    let r = exchange(&s, b"POST /metrics HTTP/1.0\r\nContent-Length: 0\r\n\r\n");
    assert!(r.contains(" 405 "), "{r}");
}

/// A Content-Length the client never sends is never allocated nor waited for: the answer comes
/// at once and the server goes on.
#[test]
fn an_announced_body_is_never_allocated() {
    let (s, _m) = server(Limits::default());
    for len in [
        "100000000000",
        "18446744073709551615",
        "18446744073709551613",
    ] {
        let r = exchange(
            &s,
            format!("GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: {len}\r\n\r\nabc")
                .as_bytes(),
        );
        // hyper refuses a length over u64::MAX - 2 as too large (431).
        assert!(
            ["200", "400", "431"]
                .iter()
                .any(|c| r.starts_with(&format!("HTTP/1.1 {c} "))),
            "{len}: {r}"
        );
        // Waiting for the body would end at the connection's deadline: a timed-out connection.
        assert_eq!(
            counter(&s, "gpu_trace_metrics_connections_timed_out"),
            0,
            "{len}: waited for the body"
        );
        assert_serves(&s);
    }
}

/// A request head over the bound: 431 and the connection closed, the rest never read.
#[test]
fn the_request_head_is_bounded() {
    let (s, _m) = server(Limits::default());
    let mut c = connect(&s);
    c.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Long: ")
        .unwrap();
    let chunk = vec![b'a'; 64 * 1024];
    let mut sent = 0usize;
    // Up to 64 MiB; the server must close long before.
    while sent < 64 << 20 {
        if c.write_all(&chunk).is_err() {
            break;
        }
        sent += chunk.len();
    }
    assert!(
        sent < 8 << 20,
        "the server took {sent} bytes of one header line"
    );
    let mut r = Vec::new();
    let _ = c.read_to_end(&mut r);
    let r = String::from_utf8_lossy(&r);
    assert!(r.is_empty() || r.starts_with("HTTP/1.1 431"), "{r}");
    // Many small headers: the count is bounded too.
    let mut req = String::from("GET /metrics HTTP/1.1\r\nHost: x\r\n");
    for i in 0..100 {
        req.push_str(&format!("X-{i}: y\r\n"));
    }
    req.push_str("\r\n");
    assert!(exchange(&s, req.as_bytes()).starts_with("HTTP/1.1 431"));
    assert!(counter(&s, "gpu_trace_metrics_bad_requests") >= 1);
    assert_serves(&s);
}

/// A client that connects and sends nothing (or half a head) is closed after the header
/// timeout.
#[test]
fn a_silent_client_is_closed_after_the_header_timeout() {
    let limits = Limits {
        header_timeout: Duration::from_millis(300),
        ..Limits::default()
    };
    let (s, _m) = server(limits);
    for start in [&b""[..], b"GET /metrics HTTP/1.1\r\nHos"] {
        let mut c = connect(&s);
        c.write_all(start).unwrap();
        let mut r = Vec::new();
        assert!(closed_by_server(&mut c, &mut r), "{start:?}: still open");
        assert!(!String::from_utf8_lossy(&r).contains(" 200 "));
    }
    assert_eq!(counter(&s, "gpu_trace_metrics_connections_timed_out"), 2);
}

/// A client that asks and never reads the answer is closed at the connection's deadline.
/// A registry of `series` counters whose lines are each over 100 bytes long.
fn big_registry(series: u32) -> Arc<Registry> {
    let mut registry = Registry::default();
    let family =
        prometheus_client::metrics::family::Family::<Vec<(String, String)>, Counter>::default();
    registry.register("big", "many series", family.clone());
    for i in 0..series {
        family
            .get_or_create(&vec![("series".into(), format!("{i:0>80}"))])
            .inc();
    }
    Arc::new(registry)
}

#[test]
fn a_connection_is_closed_at_its_deadline() {
    let limits = Limits {
        connection_deadline: Duration::from_millis(1500),
        ..Limits::default()
    };
    // A large answer (many series), more than the sockets' buffers hold.
    let registry = big_registry(200_000);
    let s = MetricsServer::start_with(
        "127.0.0.1:0".parse().unwrap(),
        registry,
        limits,
        Access::default(),
    )
    .unwrap();
    // Each series is a line of over 100 bytes: the answer is over 20 MB.
    let body = 20_000_000;
    let mut c = connect(&s);
    c.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
    std::thread::sleep(Duration::from_secs(3));
    let mut r = Vec::new();
    let _ = c.read_to_end(&mut r);
    assert!(r.len() < body, "the whole answer came ({} bytes)", r.len());
    assert_eq!(counter(&s, "gpu_trace_metrics_connections_timed_out"), 1);
}

/// The bounds are on what clients send: an answer of megabytes is sent whole.
#[test]
fn a_large_answer_is_sent_whole() {
    let registry = big_registry(30_000);
    let s = MetricsServer::start_with(
        "127.0.0.1:0".parse().unwrap(),
        registry,
        Limits::default(),
        Access::default(),
    )
    .unwrap();
    let r = get(&s, "/metrics");
    assert!(r.len() > 3_000_000, "{} bytes", r.len());
    assert!(r.contains(&format!("big_total{{series=\"{:0>80}\"}} 1\n", 29_999)));
    assert!(r.trim_end().ends_with("# EOF"));
}

/// GET /metrics answers 200, polled for up to 20 s (after clients that held every slot went);
/// returns the tries that did not.
fn serves_again(s: &MetricsServer) -> u64 {
    let t = Instant::now();
    for failed in 0.. {
        let r = get(s, "/metrics");
        if r.contains(" 200 ") {
            return failed;
        }
        assert!(t.elapsed() < Duration::from_secs(20), "no 200 in 20 s: {r}");
        std::thread::sleep(Duration::from_millis(50));
    }
    unreachable!()
}

/// A connection that sent `GET /metrics` and has read the start of the answer (so it is being
/// answered), reading no more.
fn answering(s: &MetricsServer) -> TcpStream {
    let mut c = connect(s);
    c.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
    let mut start = [0u8; 12];
    c.read_exact(&mut start).unwrap();
    assert!(start.starts_with(b"HTTP/1."), "{start:?}");
    c
}

/// With every slot answering a request, a new connection is closed at once, counted, and the
/// server serves again once the others go.
#[test]
fn connections_over_the_limit_are_closed_at_once() {
    let limits = Limits {
        max_connections: 4,
        header_timeout: Duration::from_secs(30),
        connection_deadline: Duration::from_secs(60),
        ..Limits::default()
    };
    // Answers larger than the sockets' buffers: their connections stay answering.
    let s = MetricsServer::start_with(
        "127.0.0.1:0".parse().unwrap(),
        big_registry(200_000),
        limits,
        Access::default(),
    )
    .unwrap();
    let busy: Vec<TcpStream> = (0..4).map(|_| answering(&s)).collect();
    // Closed by the server (its header timeout is 30 s, the client's read timeout 20 s), and
    // counted as refused below.
    let mut extra = connect(&s);
    let mut r = Vec::new();
    assert!(closed_by_server(&mut extra, &mut r), "not closed at once");
    assert!(r.is_empty());
    drop(busy);
    // Tries refused while the busy connections were ending count too.
    let refused_tries = serves_again(&s);
    assert_eq!(
        counter(&s, "gpu_trace_metrics_connections_refused"),
        1 + refused_tries
    );
    assert_eq!(counter(&s, "gpu_trace_metrics_connections_evicted"), 0);
}

/// `n` connections held open without a complete request head: silent, or a request line and
/// nothing more.
fn idle(s: &MetricsServer, n: usize) -> Vec<TcpStream> {
    (0..n)
        .map(|i| {
            let mut c = connect(s);
            if i % 2 == 1 {
                c.write_all(b"GET /metrics HTTP/1.1\r\n").unwrap();
            }
            c
        })
        .collect()
}

/// Idle connections past the limit do not keep a scraper out: a new connection takes the slot
/// of the oldest one without a request head, which is closed (issue 36).
#[test]
fn idle_connections_make_room_for_a_scrape() {
    let limits = Limits {
        max_connections: 4,
        header_timeout: Duration::from_secs(60),
        connection_deadline: Duration::from_secs(60),
        ..Limits::default()
    };
    let (s, _m) = server(limits);
    let mut idle = idle(&s, 8);
    for _ in 0..10 {
        assert_serves(&s);
    }
    // 4 idle connections made room for the 4 next ones, and the first scrape for itself (the
    // next ones found its slot free again).
    assert_eq!(counter(&s, "gpu_trace_metrics_connections_evicted"), 5);
    assert_eq!(counter(&s, "gpu_trace_metrics_connections_refused"), 0);
    // The oldest was closed then, not at its header timeout (60 s).
    let mut r = Vec::new();
    assert!(idle[0].read_to_end(&mut r).is_ok(), "idle[0] still open");
    assert!(r.is_empty());
}

/// With a bearer token required, connections that have not authenticated give their slot up
/// to new ones: the scraper with the token is answered; a request without it gets 401 and its
/// connection is closed at once.
#[test]
fn unauthenticated_connections_make_room_for_a_scrape() {
    let dir = tempfile::tempdir().unwrap();
    let (_, token) = crate::metrics::access::tests::credentials(dir.path());
    let limits = Limits {
        max_connections: 4,
        header_timeout: Duration::from_secs(60),
        connection_deadline: Duration::from_secs(60),
        ..Limits::default()
    };
    let m = Metrics::new(MetricsConfig::default());
    let s = MetricsServer::start_with(
        "127.0.0.1:0".parse().unwrap(),
        m.registry(),
        limits,
        Access::load(None, Some(&token)).unwrap(),
    )
    .unwrap();
    let _idle = idle(&s, 8);
    // Closed by the server once the 401 is written (its timeouts are 60 s, the client's read
    // timeout 20 s).
    let mut c = connect(&s);
    c.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
    let mut r = Vec::new();
    assert!(closed_by_server(&mut c, &mut r), "open after the 401");
    let r = String::from_utf8_lossy(&r);
    assert!(r.starts_with("HTTP/1.0 401"), "{r}");
    let scrape = b"GET /metrics HTTP/1.0\r\nAuthorization: Bearer tok-123\r\n\r\n";
    let mut last = String::new();
    for _ in 0..10 {
        last = exchange(&s, scrape);
        assert!(last.starts_with("HTTP/1.0 200"), "{last}");
    }
    // 4 idle connections for the 4 next, and one for the 401's (the scrapes then found its slot
    // free).
    assert!(
        last.contains("\ngpu_trace_metrics_connections_evicted_total 5\n"),
        "{last}"
    );
}

/// The rule alone: a free slot, else the oldest waiting connection's, else refused; a
/// connection answering a request keeps its slot.
#[test]
fn the_oldest_waiting_connection_gives_its_slot_up() {
    let mut s = slots::Slots::new(3);
    use slots::Admission::{Admitted, Refused};
    for i in 0..3 {
        assert_eq!(
            s.admit(i),
            Admitted {
                id: i,
                evicted: None
            }
        );
    }
    assert!(s.answering(0));
    assert_eq!(
        s.admit(10),
        Admitted {
            id: 3,
            evicted: Some((1, 1))
        }
    );
    assert_eq!(
        s.admit(11),
        Admitted {
            id: 4,
            evicted: Some((2, 2))
        }
    );
    // An evicted connection's head, arriving late, takes no slot back.
    assert!(!s.answering(1));
    assert!(s.answering(3) && s.answering(4));
    assert_eq!(s.admit(12), Refused);
    assert_eq!(s.counts(), (0, 3));
    s.release(1);
    assert_eq!(s.counts(), (0, 3));
    s.release(3);
    assert_eq!(
        s.admit(13),
        Admitted {
            id: 5,
            evicted: None
        }
    );
    assert_eq!(s.counts(), (1, 2));
}

/// The stderr line: the first at once, then at most one per 10 s with the counts since.
#[test]
fn evictions_are_said_at_once_then_at_most_every_ten_seconds() {
    let mut n = slots::Notice::default();
    let t0 = Instant::now();
    assert_eq!(n.take(t0, 32), None);
    assert_eq!(n.due(), None);
    n.evicted += 1;
    let first = n.take(t0, 32).unwrap();
    assert!(
        first.contains("1 connection closed before sending a request")
            && first.contains("limit 32"),
        "{first}"
    );
    n.evicted += 57;
    n.refused += 2;
    assert_eq!(n.due(), Some(t0 + slots::NOTICE_PERIOD));
    assert_eq!(n.take(t0 + Duration::from_secs(9), 32), None);
    let next = n.take(t0 + Duration::from_secs(10), 32).unwrap();
    assert!(
        next.contains("57 connections closed in the last 10 s")
            && next.contains("2 connections refused in the last 10 s"),
        "{next}"
    );
    assert_eq!(n.due(), None);
    n.refused += 1;
    let refused = n.take(t0 + Duration::from_secs(25), 32).unwrap();
    assert!(
        refused.contains("1 connection refused in the last 15 s") && !refused.contains("closed"),
        "{refused}"
    );
}

/// Failed accepts are said too (with the error), at once, then with the same period; the
/// connections' advice is not added to a line about accepts alone.
#[test]
fn failed_accepts_are_said_at_once_with_their_error() {
    let mut n = slots::Notice::default();
    let t0 = Instant::now();
    n.accept_failed += 1;
    n.accept_error = "Too many open files (os error 24)".into();
    assert!(n.due().is_some(), "a failed accept is due at once");
    let first = n.take(t0, 32).unwrap();
    assert_eq!(
        first,
        "gpu-trace: --metrics: 1 accept failed (Too many open files (os error 24)); new \
         connections wait in the kernel's queue until a descriptor is free (raise the \
         open-files limit, `ulimit -n`, if this repeats)"
    );
    n.accept_failed += 3;
    n.evicted += 2;
    assert_eq!(n.take(t0 + Duration::from_secs(5), 32), None);
    let next = n.take(t0 + Duration::from_secs(11), 32).unwrap();
    assert!(
        next.contains("2 connections closed in the last 11 s")
            && next.contains("(slow or idle clients; limit 32 connections); 3 accepts failed in the last 11 s (Too many open files"),
        "{next}"
    );
    assert_eq!(n.due(), None);
}

/// docs/fleet.md lists every one of the server's own counters.
#[test]
fn the_fleet_doc_lists_every_server_counter() {
    let doc = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/fleet.md"));
    for (name, _) in SERVER_METRICS {
        assert!(
            doc.contains(&format!("`{name}_total`")),
            "docs/fleet.md does not list {name}_total"
        );
    }
}

/// A failure of the serving loop is counted and the server restarted on the same socket.
#[test]
fn a_failed_serving_loop_is_restarted() {
    let m = Metrics::new(MetricsConfig::default());
    let s = MetricsServer::start_inner(
        "127.0.0.1:0".parse().unwrap(),
        m.registry(),
        Limits::default(),
        Access::default(),
        Some(Fault::PanicOnce),
    )
    .unwrap();
    assert_serves(&s);
    assert_eq!(counter(&s, "gpu_trace_metrics_server_errors"), 1);
    assert!(!s.is_dead());
}

/// After [`MAX_RESTARTS`] failures the endpoint is given up and says so ([`endpoint_failed`]).
#[test]
fn a_server_that_keeps_failing_is_reported_dead() {
    let m = Metrics::new(MetricsConfig::default());
    let s = MetricsServer::start_inner(
        "127.0.0.1:0".parse().unwrap(),
        m.registry(),
        Limits::default(),
        Access::default(),
        Some(Fault::PanicAlways),
    )
    .unwrap();
    let t = Instant::now();
    while !s.is_dead() && t.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(s.is_dead());
    assert!(endpoint_failed());
}

/// With basic users and a bearer token configured: 401 (with a challenge) without credentials
/// or with wrong ones, 200 with either right one.
#[test]
fn credentials_are_required_when_configured() {
    let dir = tempfile::tempdir().unwrap();
    let (web, token) = crate::metrics::access::tests::credentials(dir.path());
    let access = Access::load(Some(&web), Some(&token)).unwrap();
    let m = Metrics::new(MetricsConfig::default());
    let s = MetricsServer::start_with(
        "127.0.0.1:0".parse().unwrap(),
        m.registry(),
        Limits::default(),
        access,
    )
    .unwrap();
    let with = |auth: &str| {
        exchange(
            &s,
            format!("GET /metrics HTTP/1.0\r\nHost: x\r\n{auth}\r\n").as_bytes(),
        )
    };
    let r = with("");
    assert!(r.starts_with("HTTP/1.0 401"), "{r}");
    assert!(
        r.to_ascii_lowercase().contains("www-authenticate: basic"),
        "{r}"
    );
    assert!(!r.contains("gpu_trace_"), "{r}");
    // prom:s3cret (before a wrong password: after one, unverified passwords wait a little).
    let r = with("Authorization: Basic cHJvbTpzM2NyZXQ=\r\n");
    assert!(r.starts_with("HTTP/1.0 200") && r.contains("# EOF"), "{r}");
    assert!(with("Authorization: Basic cHJvbTp3cm9uZw==\r\n").starts_with("HTTP/1.0 401"));
    assert!(with("Authorization: Bearer tok-124\r\n").starts_with("HTTP/1.0 401"));
    let r = with("Authorization: Bearer tok-123\r\n");
    assert!(r.starts_with("HTTP/1.0 200") && r.contains("# EOF"), "{r}");
    // Every path, not only /metrics.
    assert!(get(&s, "/").starts_with("HTTP/1.0 401"));
}

/// TLS from the web configuration: a real client (curl) that trusts the certificate gets the
/// metrics over HTTPS; plain HTTP on the same port gets nothing.
#[test]
fn tls_serves_https_with_the_configured_certificate() {
    let test = "tls_serves_https_with_the_configured_certificate";
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = (dir.path().join("m.crt"), dir.path().join("m.key"));
    let made = std::process::Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
        ])
        .args(["-nodes", "-days", "2", "-subj", "/CN=localhost"])
        .args(["-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output();
    if !made.as_ref().is_ok_and(|o| o.status.success()) {
        skipped(
            test,
            format!("openssl cannot make a test certificate: {made:?}"),
        );
        return;
    }
    let web = dir.path().join("web.yml");
    // Relative paths: from the configuration file's directory.
    std::fs::write(
        &web,
        "tls_server_config:\n  cert_file: m.crt\n  key_file: m.key\n",
    )
    .unwrap();
    let access = Access::load(Some(&web), None).unwrap();
    let m = Metrics::new(MetricsConfig::default());
    let limits = Limits {
        header_timeout: Duration::from_secs(1),
        ..Limits::default()
    };
    let s = MetricsServer::start_with("127.0.0.1:0".parse().unwrap(), m.registry(), limits, access)
        .unwrap();
    let curl = std::process::Command::new("curl")
        .args(["-sS", "--max-time", "10", "--cacert"])
        .arg(&cert)
        .arg(format!("https://127.0.0.1:{}/metrics", s.addr.port()))
        .output();
    let Ok(curl) = curl else {
        skipped(test, "curl is not installed");
        return;
    };
    let body = String::from_utf8_lossy(&curl.stdout);
    assert!(
        curl.status.success() && body.trim_end().ends_with("# EOF"),
        "{body} {}",
        String::from_utf8_lossy(&curl.stderr)
    );
    assert!(body.contains("gpu_trace_dropped_records_total"), "{body}");
    // Plain HTTP to the TLS port: no metrics, and the server goes on.
    let r = get(&s, "/metrics");
    assert!(!r.contains("# EOF"), "{r}");
    assert!(counter_tls(&cert, &s, "gpu_trace_metrics_bad_requests") >= 1);
    // A client that never starts the handshake is closed after the header timeout.
    let mut silent = connect(&s);
    assert!(closed_by_server(&mut silent, &mut Vec::new()), "still open");
    assert_eq!(
        counter_tls(&cert, &s, "gpu_trace_metrics_connections_timed_out"),
        1
    );
}

/// The server's counter `name` (without `_total`) read over HTTPS with curl.
fn counter_tls(cert: &std::path::Path, s: &MetricsServer, name: &str) -> u64 {
    let out = std::process::Command::new("curl")
        .args(["-sS", "--max-time", "10", "--cacert"])
        .arg(cert)
        .arg(format!("https://127.0.0.1:{}/metrics", s.addr.port()))
        .output()
        .unwrap();
    let body = String::from_utf8_lossy(&out.stdout).into_owned();
    body.lines()
        .find_map(|l| l.strip_prefix(&format!("{name}_total ")))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {name}_total in {body}"))
}

/// Whether a dump was asked for over HTTP since the last look (the flag the live loop waits
/// on; looked at without waiting).
fn dump_was_requested() -> bool {
    use std::{future::Future, task::Context};
    let fut = std::pin::pin!(crate::flags::dump_requested());
    let mut cx = Context::from_waker(std::task::Waker::noop());
    fut.poll(&mut cx).is_ready()
}

/// `POST /dump`, through a real client over loopback: without `--dump-token-file` 403 with the
/// reason (the metrics' own bearer token grants nothing); with one, no token or a wrong one 401
/// (a bearer challenge), `GET` with the token 405; the token asks the live loop for a dump
/// (202) and only it does. The metrics stay readable with their own token.
#[test]
fn post_dump_needs_its_own_token() {
    let dir = tempfile::tempdir().unwrap();
    let (_, token) = crate::metrics::access::tests::credentials(dir.path());
    let dump_token = dir.path().join("dump-token");
    std::fs::write(&dump_token, "dump-456\n").unwrap();
    let post = |s: &MetricsServer, auth: &str| {
        let head = format!("POST /dump HTTP/1.0\r\nContent-Length: 0\r\n{auth}\r\n");
        exchange(s, head.as_bytes())
    };
    let start = |access: Access| {
        let m = Metrics::new(MetricsConfig::default());
        let addr = "127.0.0.1:0".parse().unwrap();
        (MetricsServer::start_with(addr, m.registry(), Limits::default(), access)).unwrap()
    };
    let off = start(Access::load(None, Some(&token)).unwrap());
    let r = post(&off, "Authorization: Bearer tok-123\r\n");
    assert!(r.starts_with("HTTP/1.0 403"), "{r}");
    assert!(r.contains("--dump-token-file"), "{r}");
    assert!(!dump_was_requested(), "no dump without a dump token");
    drop(off);

    let access = Access::load(None, Some(&token)).unwrap();
    let on = start(access.with_dump_token(&dump_token).unwrap());
    for auth in [
        "",
        "Authorization: Bearer tok-123\r\n",
        "Authorization: Bearer dump-45\r\n",
    ] {
        let r = post(&on, auth);
        assert!(r.starts_with("HTTP/1.0 401"), "{auth:?}: {r}");
        assert!(
            r.to_ascii_lowercase().contains("www-authenticate: bearer"),
            "{r}"
        );
    }
    let get = exchange(
        &on,
        b"GET /dump HTTP/1.0\r\nAuthorization: Bearer dump-456\r\n\r\n",
    );
    assert!(get.starts_with("HTTP/1.0 405"), "{get}");
    assert!(!dump_was_requested(), "refused requests ask for nothing");
    let r = post(&on, "Authorization: Bearer dump-456\r\n");
    assert!(r.starts_with("HTTP/1.0 202"), "{r}");
    assert!(dump_was_requested(), "the token asks for a dump");
    assert!(!dump_was_requested(), "once");
    let scrape = exchange(
        &on,
        b"GET /metrics HTTP/1.0\r\nAuthorization: Bearer tok-123\r\n\r\n",
    );
    assert!(scrape.starts_with("HTTP/1.0 200"), "{scrape}");
}
