//! A real Prometheus (Debian's /usr/bin/prometheus) for the tests that scrape gpu-trace: started
//! on a scratch directory, asked through its HTTP API.

use std::{
    io::{Read, Write},
    net::{SocketAddr, TcpListener, TcpStream},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

pub const PROMETHEUS: &str = "/usr/bin/prometheus";

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `GET path` over HTTP/1.0: (status line, body).
pub fn http_get(addr: SocketAddr, path: &str) -> std::io::Result<(String, String)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut r = String::new();
    s.read_to_string(&mut r)?;
    let (head, body) = r.split_once("\r\n\r\n").unwrap_or((&r, ""));
    Ok((
        head.lines().next().unwrap_or("").to_string(),
        body.to_string(),
    ))
}

pub fn url_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The instant vector of PromQL `query`: (labels, value) per series.
pub fn query(prom: SocketAddr, q: &str) -> Vec<(serde_json::Value, f64)> {
    let Ok((status, body)) = http_get(prom, &format!("/api/v1/query?query={}", url_encode(q)))
    else {
        return Vec::new();
    };
    if !status.contains(" 200") {
        return Vec::new();
    }
    let v: serde_json::Value = serde_json::from_str(&body).expect("Prometheus answers JSON");
    v["data"]["result"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| {
            let value = r["value"][1].as_str().unwrap().parse().unwrap();
            (r["metric"].clone(), value)
        })
        .collect()
}

pub struct Prometheus {
    child: Child,
    pub dir: std::path::PathBuf,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

pub fn start_prometheus(target: SocketAddr, listen: SocketAddr) -> Prometheus {
    let dir = super::scratch().join("prometheus");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
             scrape_configs:\n  - job_name: gpu-trace\n    static_configs:\n      \
             - targets: ['{target}']\n"
        ),
    )
    .unwrap();
    let log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
    let child = Command::new(PROMETHEUS)
        .arg(format!("--config.file={}", config.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.join("data").display()
        ))
        .arg(format!("--web.listen-address={listen}"))
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("starting prometheus");
    Prometheus { child, dir }
}

/// Polls `q` until it returns `want` series values summing to `want` or 90 s pass; returns the
/// last answer (the caller asserts on it).
pub fn wait_for(
    prom: SocketAddr,
    q: &str,
    done: impl Fn(&[(serde_json::Value, f64)]) -> bool,
) -> Vec<(serde_json::Value, f64)> {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let r = query(prom, q);
        if done(&r) || Instant::now() > deadline {
            return r;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}
