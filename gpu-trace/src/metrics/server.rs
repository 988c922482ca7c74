//! The HTTP side of `--metrics`: `GET /metrics` answers the registry's OpenMetrics text. Kept
//! apart from the core so that the core (and replay) never depend on a server.
//!
//! The endpoint must not be a way to take the tracer down (issue 26), so:
//! - it runs on one thread of its own with its own small tokio runtime (current-thread): the
//!   tracer's runtime drains the ring buffer and never waits on a client, and a failure here never
//!   stops tracing; no thread per connection (one thread whatever the number of clients);
//! - hyper's HTTP/1 server with a bounded request head ([`Limits::head_bytes`],
//!   [`Limits::max_headers`]: over them, 431 and close), a head that must arrive within
//!   [`Limits::header_timeout`], no keep-alive, and a total deadline per connection
//!   ([`Limits::connection_deadline`]). The request body is never read: hyper reads a body only
//!   when asked, in pieces of what has arrived, so an announced `Content-Length` is never
//!   allocated (one over hyper's maximum, `u64::MAX - 2`, is refused with 431);
//! - at most [`Limits::max_connections`] connections at once (issue 36). A connection whose
//!   request head has not arrived, or was refused by the access check (401), holds its slot only
//!   until another connection needs it: at the limit, a new connection takes the slot of the
//!   oldest such one, which is closed (counted as evicted). The access check is made as soon as
//!   the head has arrived, and a refused request's connection is closed once the 401 is written.
//!   Only when every connection is answering an allowed request is a new one closed at once
//!   (counted as refused). So idle, slow or unauthenticated clients cannot keep a scraper out,
//!   however many they open; clients that send allowed requests and read slowly can, for at most
//!   [`Limits::connection_deadline`] each. Evictions and refusals are said on stderr, the first
//!   at once and then at most one line per 10 s with the counts;
//! - an `accept` that fails (EMFILE, ENFILE, ENOMEM...) is counted and retried after a short pause;
//! - the serving loop runs under `catch_unwind`: a panic is reported on stderr, counted, and the
//!   server restarted on the same socket; after [`MAX_RESTARTS`] failures in a row (each within a
//!   minute of its restart) the endpoint is dead:
//!   one line on stderr at once, and the run's exit status is 1 at the end ([`endpoint_failed`]),
//!   while tracing goes on.
//!
//! Its own counters (`gpu_trace_metrics_*`, [`SERVER_METRICS`]) are served before the core's.

use std::{
    convert::Infallible,
    net::SocketAddr,
    panic::AssertUnwindSafe,
    sync::{
        Arc, Mutex, MutexGuard, PoisonError,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use bytes::Bytes;
use gpu_trace_core::metrics::{CONTENT_TYPE, Metrics, MetricsConfig};
use http_body_util::Full;
use hyper::{Method, Request, Response, StatusCode, body::Incoming, header};
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::{metrics::counter::Counter, registry::Registry};
use thiserror::Error;
use tokio::sync::Notify;

use super::access::{Access, AccessError, DumpAccess};
use slots::{Admission, Notice, Slots};

#[derive(Debug, Error)]
pub enum ServeError {
    #[error(
        "--metrics {0}: not a loopback address, and no authentication is configured. To serve it \
         on other interfaces (e.g. a Kubernetes pod's IP), require credentials \
         (--metrics-web-config with basic_auth_users, or --metrics-bearer-token-file), or add \
         --metrics-allow-remote to serve it to anyone who can reach it"
    )]
    NotLoopback(SocketAddr),
    #[error("--metrics {addr}: cannot listen: {why} (is the port in use? pick another one)")]
    Bind { addr: SocketAddr, why: String },
    #[error(transparent)]
    Access(#[from] AccessError),
}

/// Refuses a non-loopback address unless `allow_remote` (a usage error).
pub fn check_addr(addr: SocketAddr, allow_remote: bool) -> Result<(), ServeError> {
    if addr.ip().is_loopback() || allow_remote {
        Ok(())
    } else {
        Err(ServeError::NotLoopback(addr))
    }
}

/// The `--metrics*` options before anything loads (usage errors): the access files are read
/// and the address is loopback, or allowed remote, or credentials are required. Returns what
/// the server will enforce; `None` without `--metrics`.
pub fn check_args(args: &crate::cli::MetricsArgs) -> Result<Option<Access>, ServeError> {
    let Some(addr) = args.addr else {
        return Ok(None);
    };
    let access = Access::load(
        args.metrics_web_config.as_deref(),
        args.metrics_bearer_token_file.as_deref(),
    )?;
    check_addr(addr, args.metrics_allow_remote || access.required())?;
    let access = match args.dump_token_file.as_deref() {
        Some(path) => access.with_dump_token(path)?,
        None => access,
    };
    Ok(Some(access))
}

/// What one client may cost the server.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Connections open at once. At the limit a new connection takes the slot of the oldest one
    /// without an allowed request head (which is closed), or is closed at once if there is none.
    pub max_connections: usize,
    /// The request line and headers together, in bytes (hyper answers 431 past it). At least
    /// 8192 (hyper's smallest read buffer).
    pub head_bytes: usize,
    /// Header lines in a request (431 past it).
    pub max_headers: usize,
    /// The whole request head must have arrived within this time of the connection's start.
    pub header_timeout: Duration,
    /// A connection is closed this long after it was accepted, whatever it is doing (a client
    /// that reads the answer slowly, or not at all).
    pub connection_deadline: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_connections: 32,
            head_bytes: 8192,
            max_headers: 32,
            header_timeout: Duration::from_secs(5),
            connection_deadline: Duration::from_secs(15),
        }
    }
}

/// Serving-loop failures (panics) in a row after which the endpoint is given up; a failure
/// after [`FAILURE_WINDOW`] of serving starts the count again.
pub const MAX_RESTARTS: u64 = 5;

/// See [`MAX_RESTARTS`].
const FAILURE_WINDOW: Duration = Duration::from_secs(60);

/// The pause after an `accept` that failed (e.g. EMFILE: no descriptor free until one closes).
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// The server's own metrics: (name without `_total`, help).
pub const SERVER_METRICS: [(&str, &str); 6] = [
    (
        "gpu_trace_metrics_connections_refused",
        "Connections to the metrics endpoint closed at once because the connection limit was reached with every connection answering a request",
    ),
    (
        "gpu_trace_metrics_connections_evicted",
        "Connections to the metrics endpoint closed before they sent a complete (and, with credentials configured, authenticated) request head, to make room for a new connection at the connection limit",
    ),
    (
        "gpu_trace_metrics_connections_timed_out",
        "Connections to the metrics endpoint closed because the request head did not arrive in time or the connection outlived its deadline",
    ),
    (
        "gpu_trace_metrics_bad_requests",
        "Connections to the metrics endpoint closed on a malformed or oversized request (hyper answered 400 or 431)",
    ),
    (
        "gpu_trace_metrics_accept_errors",
        "Failed accepts on the metrics endpoint (e.g. no file descriptor free); each is followed by a 100 ms pause",
    ),
    (
        "gpu_trace_metrics_server_errors",
        "Failures (panics) of the metrics server's serving loop; each restarts it, and the endpoint is given up after 5",
    ),
];

/// The server's counters, shared by its tasks and the registry it serves.
#[derive(Clone, Debug, Default)]
struct ServerCounters {
    refused: Counter,
    evicted: Counter,
    timed_out: Counter,
    bad_requests: Counter,
    accept_errors: Counter,
    server_errors: Counter,
}

impl ServerCounters {
    fn registry(&self) -> Registry {
        let mut r = Registry::default();
        let all = [
            &self.refused,
            &self.evicted,
            &self.timed_out,
            &self.bad_requests,
            &self.accept_errors,
            &self.server_errors,
        ];
        for ((name, help), c) in SERVER_METRICS.iter().zip(all) {
            r.register(*name, *help, c.clone());
        }
        r
    }
}

/// Set once a metrics endpoint of this process was given up (see [`endpoint_failed`]).
static ENDPOINT_FAILED: AtomicBool = AtomicBool::new(false);

/// Whether a metrics endpoint of this process stopped serving for good: the run exits 1.
pub fn endpoint_failed() -> bool {
    ENDPOINT_FAILED.load(Ordering::SeqCst)
}

/// State shared by the handle and the server thread.
struct Shared {
    stop: AtomicBool,
    wake: Notify,
    /// This server was given up.
    dead: AtomicBool,
    counters: ServerCounters,
}

/// The running server; dropping it stops it.
pub struct MetricsServer {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
    /// The address it listens on (the real port when 0 was asked for).
    pub addr: SocketAddr,
}

/// What the serving loop needs, cloned into each attempt.
#[derive(Clone)]
struct Serving {
    registry: Arc<Registry>,
    own: Arc<Registry>,
    limits: Limits,
    access: Arc<Access>,
}

impl MetricsServer {
    /// Listens on `addr` and serves `registry` at `/metrics` until dropped.
    pub fn start(addr: SocketAddr, registry: Arc<Registry>) -> Result<Self, ServeError> {
        Self::start_with(addr, registry, Limits::default(), Access::default())
    }

    /// [`start`](Self::start) with other limits, and requiring `access`.
    pub fn start_with(
        addr: SocketAddr,
        registry: Arc<Registry>,
        limits: Limits,
        access: Access,
    ) -> Result<Self, ServeError> {
        Self::start_inner(addr, registry, limits, access, None)
    }

    fn start_inner(
        addr: SocketAddr,
        registry: Arc<Registry>,
        limits: Limits,
        access: Access,
        fault: Option<Fault>,
    ) -> Result<Self, ServeError> {
        let bind_err = |why: String| ServeError::Bind { addr, why };
        let listener = std::net::TcpListener::bind(addr).map_err(|e| bind_err(e.to_string()))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| bind_err(e.to_string()))?;
        let addr = listener.local_addr().unwrap_or(addr);
        let counters = ServerCounters::default();
        let shared = Arc::new(Shared {
            stop: AtomicBool::new(false),
            wake: Notify::new(),
            dead: AtomicBool::new(false),
            counters: counters.clone(),
        });
        let serving = Serving {
            registry,
            own: Arc::new(counters.registry()),
            limits: Limits {
                head_bytes: limits.head_bytes.max(8192),
                ..limits
            },
            access: Arc::new(access),
        };
        let thread_shared = shared.clone();
        let thread = std::thread::Builder::new()
            .name("gpu-trace-metrics".into())
            .spawn(move || supervise(listener, addr, serving, &thread_shared, fault))
            .map_err(|e| bind_err(format!("starting its thread: {e}")))?;
        Ok(Self {
            shared,
            thread: Some(thread),
            addr,
        })
    }

    /// Whether this server was given up (its failures are on stderr).
    pub fn is_dead(&self) -> bool {
        self.shared.dead.load(Ordering::SeqCst)
    }
}

/// A fault injected into the serving loop (unit tests of the supervisor only).
#[cfg_attr(not(test), allow(dead_code))]
#[derive(Clone, Copy, Debug)]
enum Fault {
    /// Every attempt panics.
    PanicAlways,
    /// The first attempt panics, the next ones serve.
    PanicOnce,
}

/// The server thread: runs the serving loop, restarting it after a failure, until stopped or
/// given up.
fn supervise(
    listener: std::net::TcpListener,
    addr: SocketAddr,
    serving: Serving,
    shared: &Shared,
    fault: Option<Fault>,
) {
    let mut failures = 0u64;
    while !shared.stop.load(Ordering::SeqCst) {
        let started = std::time::Instant::now();
        let attempt = std::panic::catch_unwind(AssertUnwindSafe(|| {
            match fault {
                Some(Fault::PanicAlways) => panic!("injected fault"),
                Some(Fault::PanicOnce) if failures == 0 => panic!("injected fault"),
                _ => {}
            }
            serve_until_stopped(&listener, &serving, shared)
        }));
        let why = match attempt {
            Ok(Ok(())) => return, // stopped
            Ok(Err(e)) => e.to_string(),
            Err(panic) => panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic".into()),
        };
        let why = gpu_trace_core::escape::escape_text(&why).into_owned();
        if shared.stop.load(Ordering::SeqCst) {
            return;
        }
        // Failures in a row: one after a minute of serving starts the count again.
        if started.elapsed() >= FAILURE_WINDOW {
            failures = 0;
        }
        failures += 1;
        shared.counters.server_errors.inc();
        if failures >= MAX_RESTARTS {
            shared.dead.store(true, Ordering::SeqCst);
            ENDPOINT_FAILED.store(true, Ordering::SeqCst);
            crate::say!(
                "gpu-trace: the metrics endpoint http://{addr}/metrics is dead after {failures} \
                 failures (last: {why}); tracing goes on, and the run will exit 1. Scrapes of it \
                 fail until gpu-trace is restarted"
            );
            return;
        }
        crate::say!(
            "gpu-trace: the metrics endpoint http://{addr}/metrics failed ({why}); restarting it \
             ({failures} of {MAX_RESTARTS} failures before it is given up)"
        );
        std::thread::sleep(Duration::from_millis(200 * failures));
    }
}

/// The hyper settings of every connection.
fn http_builder(limits: &Limits) -> hyper::server::conn::http1::Builder {
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .max_buf_size(limits.head_bytes)
        .max_header_size(limits.head_bytes)
        .max_headers(limits.max_headers)
        .keep_alive(false);
    http
}

/// One attempt: a fresh runtime accepting on `listener` until [`Shared::stop`].
fn serve_until_stopped(
    listener: &std::net::TcpListener,
    serving: &Serving,
    shared: &Shared,
) -> std::io::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()?;
    let listener = listener.try_clone()?;
    let limit = serving.limits.max_connections;
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::from_std(listener)?;
        let slots: SharedSlots = Arc::new(Mutex::new(Slots::new(limit)));
        let http = Arc::new(http_builder(&serving.limits));
        let mut notice = Notice::default();
        loop {
            if shared.stop.load(Ordering::SeqCst) {
                return Ok(());
            }
            // Counts not reported yet are reported when due, even if no connection comes.
            let due = notice.due();
            let report_at = tokio::time::Instant::from_std(due.unwrap_or_else(Instant::now));
            let accepted = tokio::select! {
                () = shared.wake.notified() => continue,
                () = tokio::time::sleep_until(report_at), if due.is_some() => {
                    report(&mut notice, limit);
                    continue;
                }
                a = listener.accept() => a,
            };
            match accepted {
                Ok((stream, _)) => admit(stream, &slots, &http, serving, shared, &mut notice),
                Err(e) => {
                    // EMFILE/ENFILE/ENOMEM or a connection reset before it was accepted: the
                    // listener itself is fine; wait a little for resources to come back. Said
                    // on stderr (at once, then with the other notices' period).
                    shared.counters.accept_errors.inc();
                    notice.accept_failed += 1;
                    notice.accept_error = e.to_string();
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                }
            }
            report(&mut notice, limit);
        }
    })
}

/// Prints the line about evicted and refused connections and failed accepts, if one is due.
fn report(notice: &mut Notice, limit: usize) {
    if let Some(line) = notice.take(Instant::now(), limit) {
        crate::say!("{line}");
    }
}

/// The slots of one serving attempt, shared by the accept loop and the connections.
type SharedSlots = Arc<Mutex<Slots<Arc<Notify>>>>;

fn lock(slots: &SharedSlots) -> MutexGuard<'_, Slots<Arc<Notify>>> {
    slots.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A connection's slot: freed when dropped.
struct Slot {
    slots: SharedSlots,
    id: u64,
}

impl Slot {
    /// Its request head arrived and is allowed: the connection may no longer be evicted.
    fn answering(&self) {
        lock(&self.slots).answering(self.id);
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        lock(&self.slots).release(self.id);
    }
}

/// A connection just accepted: given a slot (the oldest waiting connection's, which is closed,
/// if none is free) and served on a task of its own, or refused.
fn admit(
    stream: tokio::net::TcpStream,
    slots: &SharedSlots,
    http: &Arc<hyper::server::conn::http1::Builder>,
    serving: &Serving,
    shared: &Shared,
    notice: &mut Notice,
) {
    let counters = &shared.counters;
    let closing = Arc::new(Notify::new());
    let id = match lock(slots).admit(closing.clone()) {
        Admission::Refused => {
            counters.refused.inc();
            notice.refused += 1;
            return; // the stream is closed here
        }
        Admission::Admitted { id, evicted } => {
            if let Some((_, evicted)) = evicted {
                evicted.notify_one();
                counters.evicted.inc();
                notice.evicted += 1;
            }
            id
        }
    };
    let _ = stream.set_nodelay(true);
    let slot = Arc::new(Slot {
        slots: slots.clone(),
        id,
    });
    let (http, serving, counters) = (http.clone(), serving.clone(), counters.clone());
    tokio::spawn(async move {
        let deadline = serving.limits.connection_deadline;
        let served = tokio::time::timeout(deadline, connection(stream, &http, serving, slot));
        tokio::select! {
            // An evicted connection is closed at its next turn, whatever it was doing.
            biased;
            () = closing.notified() => {}
            ended = served => {
                match ended {
                    Err(_) | Ok(Ended::TimedOut) => counters.timed_out.inc(),
                    Ok(Ended::Bad) => counters.bad_requests.inc(),
                    Ok(Ended::Done) => 0,
                };
            }
        }
    });
}

/// How a connection ended.
enum Ended {
    Done,
    TimedOut,
    /// A malformed or oversized request, or a failed TLS handshake.
    Bad,
}

/// One connection: the TLS handshake (within the header timeout) if configured, then HTTP/1.
async fn connection(
    stream: tokio::net::TcpStream,
    http: &hyper::server::conn::http1::Builder,
    serving: Serving,
    slot: Arc<Slot>,
) -> Ended {
    match serving.access.tls.clone() {
        None => http_on(TokioIo::new(stream), http, serving, slot).await,
        Some(tls) => {
            let handshake = tokio_rustls::TlsAcceptor::from(tls).accept(stream);
            match tokio::time::timeout(serving.limits.header_timeout, handshake).await {
                Err(_) => Ended::TimedOut,
                Ok(Err(_)) => Ended::Bad,
                Ok(Ok(stream)) => http_on(TokioIo::new(stream), http, serving, slot).await,
            }
        }
    }
}

async fn http_on<I>(
    io: I,
    http: &hyper::server::conn::http1::Builder,
    serving: Serving,
    slot: Arc<Slot>,
) -> Ended
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn(move |req| {
        let response = respond(&req, &serving, &slot);
        async move { Ok::<_, Infallible>(response) }
    });
    match http.serve_connection(io, service).await {
        Err(e) if e.is_timeout() => Ended::TimedOut,
        Err(e) if e.is_parse() || e.is_parse_too_large() => Ended::Bad,
        _ => Ended::Done,
    }
}

fn text(
    status: StatusCode,
    content_type: &'static str,
    body: impl Into<Bytes>,
) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(content_type),
    );
    r
}

const PLAIN: &str = "text/plain; charset=utf-8";

/// The answer to one request (its body is never read). A request that may read the metrics
/// keeps its connection's slot until the answer is sent; one that may not (401) leaves it
/// evictable, and its connection closes once the 401 is written.
fn respond(request: &Request<Incoming>, serving: &Serving, slot: &Slot) -> Response<Full<Bytes>> {
    let authorization = request
        .headers()
        .get(header::AUTHORIZATION)
        .map(|v| v.as_bytes());
    if request.uri().path() == "/dump" {
        return dump(request.method(), serving.access.dump(authorization), slot);
    }
    if !serving.access.allows(authorization) {
        let mut r = text(StatusCode::UNAUTHORIZED, PLAIN, "authentication required\n");
        r.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            header::HeaderValue::from_static(serving.access.challenge()),
        );
        return r;
    }
    slot.answering();
    let get = matches!(*request.method(), Method::GET | Method::HEAD);
    match (get, request.uri().path()) {
        (true, "/metrics") => {
            let mut body = String::new();
            // Writing into a String cannot fail.
            // The server's own counters first: a scrape cut short by the deadline still has them.
            let _ = prometheus_client::encoding::text::encode_registry(&mut body, &serving.own);
            let _ =
                prometheus_client::encoding::text::encode_registry(&mut body, &serving.registry);
            let _ = prometheus_client::encoding::text::encode_eof(&mut body);
            text(StatusCode::OK, CONTENT_TYPE, body)
        }
        (true, "/") => text(StatusCode::OK, PLAIN, "gpu-trace: metrics at /metrics\n"),
        (true, _) => text(StatusCode::NOT_FOUND, PLAIN, "not found\n"),
        (false, _) => text(StatusCode::METHOD_NOT_ALLOWED, PLAIN, "GET only\n"),
    }
}

/// `POST /dump` (`--dump-token-file`): the flight recorder's window dumped as on SIGUSR1
/// (202), with `Authorization: Bearer TOKEN`; without the token 401, and 403 when no token is
/// configured (the endpoint takes no dump). Its own token only: the metrics' credentials grant
/// nothing here.
fn dump(method: &Method, access: DumpAccess, slot: &Slot) -> Response<Full<Bytes>> {
    if access == DumpAccess::Off {
        return text(
            StatusCode::FORBIDDEN,
            PLAIN,
            "POST /dump is off: start gpu-trace with --flight-recorder and --dump-token-file\n",
        );
    }
    if access == DumpAccess::Refused {
        let mut r = text(
            StatusCode::UNAUTHORIZED,
            PLAIN,
            "POST /dump needs Authorization: Bearer TOKEN (--dump-token-file)\n",
        );
        r.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            header::HeaderValue::from_static("Bearer"),
        );
        return r;
    }
    slot.answering();
    if *method != Method::POST {
        return text(StatusCode::METHOD_NOT_ALLOWED, PLAIN, "POST only\n");
    }
    crate::flags::request_dump();
    text(
        StatusCode::ACCEPTED,
        PLAIN,
        "dump requested: the window is written to --dump-dir as on SIGUSR1\n",
    )
}

/// `--metrics` of a live run: checks the address, listens, and returns the metrics (for the
/// pipeline) with the server serving them; `None` without `--metrics`.
pub fn serve(
    args: &crate::cli::MetricsArgs,
    ring_bytes: u32,
) -> Result<Option<(Metrics, MetricsServer)>, ServeError> {
    let (Some(addr), Some(access)) = (args.addr, check_args(args)?) else {
        return Ok(None);
    };
    let scheme = if access.tls.is_some() {
        "https"
    } else {
        "http"
    };
    let config = MetricsConfig {
        expire: (args.metrics_expire)
            .map(std::time::Duration::from_secs_f64)
            .or(MetricsConfig::default().expire),
        ..MetricsConfig::default()
    };
    let metrics = super::process::metrics(config).with_clock(gpu_trace_core::event::monotonic_ns);
    metrics.set_ring_bytes(u64::from(ring_bytes));
    let server = MetricsServer::start_with(addr, metrics.registry(), Limits::default(), access)?;
    crate::say!("gpu-trace: metrics at {scheme}://{}/metrics", server.addr);
    Ok(Some((metrics, server)))
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.wake.notify_one();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

mod slots;

#[cfg(test)]
mod tests;
