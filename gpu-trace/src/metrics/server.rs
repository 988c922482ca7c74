//! The HTTP side of `--metrics`: a `tiny_http` server on its own thread that answers
//! `GET /metrics` with the registry's OpenMetrics text. Kept apart from the core so that the
//! core (and replay) never depend on a server.

use std::{net::SocketAddr, sync::Arc, thread::JoinHandle};

use prometheus_client::registry::Registry;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum ServeError {
    #[error(
        "--metrics {0}: not a loopback address. The endpoint has no authentication; to serve it \
         on other interfaces (e.g. in a Kubernetes pod), add --metrics-allow-remote"
    )]
    NotLoopback(SocketAddr),
    #[error("--metrics {addr}: cannot listen: {why} (is the port in use? pick another one)")]
    Bind { addr: SocketAddr, why: String },
}

/// Refuses a non-loopback address unless `allow_remote` (a usage error).
pub fn check_addr(addr: SocketAddr, allow_remote: bool) -> Result<(), ServeError> {
    if addr.ip().is_loopback() || allow_remote {
        Ok(())
    } else {
        Err(ServeError::NotLoopback(addr))
    }
}

/// The running server; dropping it stops it.
pub struct MetricsServer {
    server: Arc<tiny_http::Server>,
    thread: Option<JoinHandle<()>>,
    /// The address it listens on (the real port when 0 was asked for).
    pub addr: SocketAddr,
}

impl MetricsServer {
    /// Listens on `addr` and serves `registry` at `/metrics` until dropped.
    pub fn start(addr: SocketAddr, registry: Arc<Registry>) -> Result<Self, ServeError> {
        let server = tiny_http::Server::http(addr).map_err(|e| ServeError::Bind {
            addr,
            why: e.to_string(),
        })?;
        let addr = server.server_addr().to_ip().unwrap_or(addr);
        let server = Arc::new(server);
        let serving = server.clone();
        let thread = std::thread::Builder::new()
            .name("gpu-trace-metrics".into())
            .spawn(move || {
                for request in serving.incoming_requests() {
                    // A client that goes away mid-answer is not our error.
                    let _ = respond(request, &registry);
                }
            })
            .map_err(|e| ServeError::Bind {
                addr,
                why: format!("starting its thread: {e}"),
            })?;
        Ok(Self {
            server,
            thread: Some(thread),
            addr,
        })
    }
}

/// `--metrics` of a live run: checks the address, listens, and returns the metrics (for the
/// pipeline) with the server serving them; `None` without `--metrics`.
pub fn serve(
    args: &crate::cli::MetricsArgs,
    ring_bytes: u32,
) -> Result<Option<(super::Metrics, MetricsServer)>, ServeError> {
    let Some(addr) = args.addr else {
        return Ok(None);
    };
    check_addr(addr, args.metrics_allow_remote)?;
    let metrics = super::Metrics::new(super::MetricsConfig::default());
    metrics.set_ring_bytes(u64::from(ring_bytes));
    let server = MetricsServer::start(addr, metrics.registry())?;
    eprintln!("gpu-trace: metrics at http://{}/metrics", server.addr);
    Ok(Some((metrics, server)))
}

fn respond(request: tiny_http::Request, registry: &Registry) -> std::io::Result<()> {
    use tiny_http::{Header, Method, Response};
    let path = request.url().split('?').next().unwrap_or("");
    let get = matches!(request.method(), Method::Get | Method::Head);
    let header = |v: &str| Header::from_bytes("Content-Type", v).expect("valid header");
    match (get, path) {
        (true, "/metrics") => {
            let body = super::encode(registry);
            request.respond(Response::from_string(body).with_header(header(super::CONTENT_TYPE)))
        }
        (true, "/") => request.respond(
            Response::from_string("gpu-trace: metrics at /metrics\n")
                .with_header(header("text/plain; charset=utf-8")),
        ),
        (true, _) => request.respond(Response::from_string("not found\n").with_status_code(404)),
        (false, _) => request.respond(Response::from_string("GET only\n").with_status_code(405)),
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.server.unblock();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::{CONTENT_TYPE, Metrics, MetricsConfig};

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
        use std::io::{Read, Write};
        let m = Metrics::new(MetricsConfig::default());
        let server = MetricsServer::start("127.0.0.1:0".parse().unwrap(), m.registry())
            .expect("listening on a free loopback port");
        let get = |path: &str| {
            let mut s = std::net::TcpStream::connect(server.addr).unwrap();
            write!(s, "GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").unwrap();
            let mut r = String::new();
            s.read_to_string(&mut r).unwrap();
            r
        };
        let r = get("/metrics");
        assert!(
            r.starts_with("HTTP/1.0 200") || r.starts_with("HTTP/1.1 200"),
            "{r}"
        );
        assert!(r.contains(CONTENT_TYPE), "{r}");
        assert!(r.contains("\ngpu_trace_dropped_records_total 0\n"), "{r}");
        assert!(r.trim_end().ends_with("# EOF"), "{r}");
        let r = get("/other");
        assert!(r.contains(" 404 "), "{r}");
        drop(server);
    }
}
