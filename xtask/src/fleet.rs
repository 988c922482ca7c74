//! `cargo xtask fleet`: the pieces of docs/fleet.md checked with real tools.
//!
//! - deploy/daemonset.yaml against the Kubernetes schema (`kubernetes-validate` from PyPI, in a
//!   virtual environment under target/), deploy/prometheus-kubernetes.yml parsed as YAML;
//! - deploy/prometheus.yml and deploy/alerts.yml with `promtool check config` / `check rules`,
//!   and the alerts' unit tests with `promtool test rules deploy/alerts_test.yml`;
//! - the image: the static binary, `podman build -f Containerfile` (FROM scratch), then with
//!   runc: `--version`, a replay of a committed GPU-host recording (its output must equal the
//!   same binary's output outside the container), and (root) a live start with exactly the
//!   DaemonSet's privileges, and a refusal without CAP_PERFMON.
//!
//! A tool that is missing (and not installable) is a loud `SKIPPED:` line, never a silent pass.

use std::{
    fs,
    path::{Path, PathBuf},
    process::{Command, Output},
};

use anyhow::{Context as _, Result, bail, ensure};

use crate::host::{is_root, workspace_root};

#[derive(clap::Args)]
pub struct FleetArgs {
    /// Skip the image (build and runs); check only the manifests and the Prometheus files.
    #[arg(long)]
    pub no_image: bool,
    /// Instead of the checks, measure what --metrics costs the pipeline (records/s without and
    /// with it, on the GPU-host recordings). Use a release build:
    /// `cargo run --release -p xtask -- fleet --cost`.
    #[arg(long)]
    pub cost: bool,
    /// --cost: records per run.
    #[arg(long, default_value_t = 1_000_000)]
    pub records: usize,
    /// --cost: repetitions of each (alternating).
    #[arg(long, default_value_t = 5)]
    pub reps: usize,
}

/// The PyPI validator and the version checked with.
const VALIDATOR: &str = "kubernetes-validate==1.37.0";

/// The recording replayed inside the image.
const FIXTURE: &str = "gpu-trace/tests/fixtures/two_streams.gtrace";

pub fn run(args: FleetArgs) -> Result<()> {
    let root = workspace_root();
    if args.cost {
        return cost(&root, &args);
    }
    manifests(&root)?;
    prometheus_files(&root)?;
    if !args.no_image {
        image(&root)?;
    }
    println!("fleet: done");
    Ok(())
}

fn skipped(what: &str, why: &str) {
    eprintln!("SKIPPED: cargo xtask fleet: {what}: {why}");
}

fn output(cmd: &mut Command) -> Result<Output> {
    cmd.output()
        .with_context(|| format!("running {:?}", cmd.get_program()))
}

/// Runs `cmd`; fails with its output when it fails.
fn check(cmd: &mut Command) -> Result<String> {
    let out = output(cmd)?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    ensure!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{text}",
        out.status
    );
    Ok(text)
}

fn have(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// A virtual environment with the Kubernetes schema validator, made on first use.
fn validator_env(root: &Path) -> Option<PathBuf> {
    let venv = root.join("target/fleet-venv");
    let bin = venv.join("bin");
    if bin.join("kubernetes-validate").exists() {
        return Some(bin);
    }
    let made = Command::new("python3")
        .args(["-m", "venv"])
        .arg(&venv)
        .status()
        .is_ok_and(|s| s.success())
        && Command::new(bin.join("pip"))
            .args(["install", "-q", VALIDATOR])
            .status()
            .is_ok_and(|s| s.success());
    made.then_some(bin)
}

fn manifests(root: &Path) -> Result<()> {
    let Some(bin) = validator_env(root) else {
        skipped(
            "Kubernetes schema validation of deploy/daemonset.yaml",
            &format!("could not install {VALIDATOR} into target/fleet-venv (python3 -m venv, pip)"),
        );
        return Ok(());
    };
    let text = check(
        Command::new(bin.join("kubernetes-validate"))
            .arg("--strict")
            .arg(root.join("deploy/daemonset.yaml")),
    )?;
    print!("{text}");
    // Debian's promtool has no Kubernetes service discovery: this file is parsed only.
    let k8s = root.join("deploy/prometheus-kubernetes.yml");
    check(
        Command::new(bin.join("python"))
            .args([
                "-c",
                "import sys, yaml; d = yaml.safe_load(open(sys.argv[1])); \
                 assert d['scrape_configs'][0]['kubernetes_sd_configs'], 'no kubernetes_sd_configs'",
            ])
            .arg(&k8s),
    )?;
    println!(
        "fleet: {} parses as YAML (not checked by promtool)",
        k8s.display()
    );
    Ok(())
}

fn prometheus_files(root: &Path) -> Result<()> {
    if !have("promtool") {
        skipped(
            "promtool checks of deploy/prometheus.yml and deploy/alerts.yml",
            "promtool is not installed (apt-get install prometheus; scripts/setup.sh does)",
        );
        return Ok(());
    }
    let deploy = root.join("deploy");
    for args in [
        &["check", "config", "prometheus.yml"][..],
        &["check", "rules", "alerts.yml"],
        &["test", "rules", "alerts_test.yml"],
    ] {
        let text = check(Command::new("promtool").current_dir(&deploy).args(args))?;
        print!("fleet: promtool {}:\n{text}", args.join(" "));
    }
    Ok(())
}

/// `podman run` with runc and the settings this kind of host needs (see docs/fleet.md).
fn podman_run() -> Command {
    let mut c = Command::new("podman");
    c.args([
        "--runtime",
        "runc",
        "run",
        "--rm",
        "--ulimit",
        "nofile=1024:1024",
        "--ulimit",
        "nproc=1024:1024",
    ]);
    c
}

fn image(root: &Path) -> Result<()> {
    if !have("podman") || !have("runc") {
        skipped(
            "the container image",
            "podman or runc is not installed (apt-get install podman runc; scripts/setup.sh does)",
        );
        return Ok(());
    }
    let bin = crate::dist::static_binary(root)?;
    let version = env!("CARGO_PKG_VERSION");
    let tag = format!("localhost/gpu-trace:{version}");
    let context = root.join("target/image/context");
    fs::create_dir_all(&context).with_context(|| format!("creating {}", context.display()))?;
    fs::copy(&bin, context.join("gpu-trace"))
        .with_context(|| format!("copying {} into the build context", bin.display()))?;
    check(
        Command::new("podman")
            .args(["build", "-q", "-f"])
            .arg(root.join("Containerfile"))
            .args(["-t", &tag])
            .arg(&context),
    )?;
    println!("fleet: built {tag} (FROM scratch)");

    let out = check(podman_run().args(["--network=none", &tag, "--version"]))?;
    ensure!(
        out.trim() == format!("gpu-trace {version}"),
        "the image's --version says {out:?}"
    );
    println!("fleet: {tag} --version: {}", out.trim());

    // The same recording replayed inside the image and outside: byte for byte the same JSON.
    let fixture = root.join(FIXTURE);
    let inside = output(
        podman_run()
            .arg("--network=none")
            .arg("-v")
            .arg(format!("{}:/data/recording.gtrace:ro", fixture.display()))
            .args([
                &tag,
                "replay",
                "/data/recording.gtrace",
                "-v",
                "--format",
                "json",
            ]),
    )?;
    let outside = output(
        Command::new(&bin)
            .arg("replay")
            .arg(&fixture)
            .args(["-v", "--format", "json"]),
    )?;
    ensure!(
        inside.status.success() && outside.status.success(),
        "replay failed: inside {} ({}), outside {}",
        inside.status,
        String::from_utf8_lossy(&inside.stderr),
        outside.status
    );
    let inside = String::from_utf8(inside.stdout)?;
    ensure!(
        inside == String::from_utf8(outside.stdout)?,
        "the image's replay differs from the binary's"
    );
    let inits = inside.matches("\"event\":\"TASK_INIT\"").count();
    ensure!(
        inits == 4,
        "the replay shows {inits} TASK_INIT events, not the recording's 4"
    );
    println!("fleet: replay of {FIXTURE} in the image equals the host's (4 TSGs)");

    daemonset_privileges(&tag)
}

/// Starts the image live with exactly deploy/daemonset.yaml's privileges (it must attach and
/// serve /metrics), and once more without CAP_PERFMON (it must refuse, exit 3).
fn daemonset_privileges(tag: &str) -> Result<()> {
    if !is_root() {
        skipped("a live start with the DaemonSet's privileges", "needs root");
        return Ok(());
    }
    // The host's network (to scrape it from here), on a free loopback port.
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let live = |caps: &str| {
        let mut c = podman_run();
        c.args(["--network=host", "--pid=host", "--read-only"])
            .args(["--security-opt", "seccomp=unconfined"])
            .args(["--cap-drop=ALL", &format!("--cap-add={caps}")])
            .args(["-v", "/sys/kernel/btf:/sys/kernel/btf:ro"])
            .args(["-v", "/sys/kernel/tracing:/sys/kernel/tracing:ro"])
            .args(["-v", "/sys/fs/cgroup:/host/sys/fs/cgroup:ro"])
            .args([tag, "--vendor=nvidia", "--watch-device=/dev/full"])
            .arg(format!("--metrics=127.0.0.1:{port}"))
            .args(["--metrics-allow-remote", "--quiet", "--duration=4"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped());
        c
    };
    let child = live("BPF,PERFMON")
        .spawn()
        .context("starting the image with podman")?;
    // Scrape it while it runs, once it traces (the endpoint is up before the programs load;
    // the ring's fill is served from then on). Bounded: 30 × 0.2 s.
    let mut scraped = None;
    for _ in 0..30 {
        std::thread::sleep(std::time::Duration::from_millis(200));
        if let Ok(body) = http_get_metrics(port) {
            let tracing = body.contains("gpu_trace_ring_buffer_used_bytes");
            scraped = Some(body);
            if tracing {
                break;
            }
        }
    }
    let out = child.wait_with_output()?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(
        out.status.success(),
        "the image did not trace with the DaemonSet's privileges ({}):\n{stderr}",
        out.status
    );
    ensure!(stderr.contains("hooks:"), "no hooks reported:\n{stderr}");
    let Some(body) = scraped else {
        bail!("the image's /metrics on 127.0.0.1:{port} never answered:\n{stderr}");
    };
    ensure!(
        body.contains("gpu_trace_build_info{version=")
            && body.contains("gpu_trace_ring_buffer_used_bytes"),
        "the image's /metrics lacks gpu-trace's metrics:\n{body}"
    );
    println!(
        "fleet: live start with CAP_BPF + CAP_PERFMON, hostPID, read-only mounts: attached, \
         /metrics scraped"
    );
    let out = live("BPF").output()?;
    ensure!(
        out.status.code() == Some(3),
        "without CAP_PERFMON the image should refuse with exit 3, got {}",
        out.status
    );
    println!("fleet: without CAP_PERFMON: refused (exit 3), so the DaemonSet needs it");
    Ok(())
}

/// `GET /metrics` on a loopback port: the body of a 200 answer.
fn http_get_metrics(port: u16) -> Result<String> {
    use std::io::{Read as _, Write as _};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(std::time::Duration::from_secs(5)))?;
    write!(s, "GET /metrics HTTP/1.0\r\n\r\n")?;
    let mut r = String::new();
    s.read_to_string(&mut r)?;
    let (head, body) = r.split_once("\r\n\r\n").context("no HTTP header")?;
    ensure!(head.contains(" 200 "), "{head}");
    Ok(body.to_string())
}

/// `--cost`: the fixtures' records repeated to `args.records` (timestamps not shifted: the
/// model's work per record is what is measured), through [`crate::bench_metrics::measure`].
fn cost(root: &Path, args: &FleetArgs) -> Result<()> {
    use gpu_trace::{output::clock::Clock, record::RecordReader};
    let mut base = Vec::new();
    let mut offset = 0;
    for name in ["ctx_churn.gtrace", "two_streams.gtrace"] {
        let path = root.join("gpu-trace/tests/fixtures").join(name);
        let file = fs::File::open(&path).with_context(|| format!("opening {}", path.display()))?;
        let mut reader = RecordReader::new(std::io::BufReader::new(file))?;
        offset = reader.header.realtime_offset_ns;
        while let Some(rec) = reader.next_record()? {
            base.push(rec);
        }
    }
    ensure!(!base.is_empty(), "the fixtures hold no records");
    let records: Vec<Vec<u8>> = base.iter().cycle().take(args.records).cloned().collect();
    if cfg!(debug_assertions) {
        eprintln!(
            "fleet: warning: a debug build; for numbers run `cargo run --release -p xtask -- fleet --cost`"
        );
    }
    let cost = crate::bench_metrics::measure(&records, &Clock::new(offset), args.reps)?;
    print!("{}", crate::bench_metrics::render(&cost));
    Ok(())
}
