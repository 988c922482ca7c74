//! `cargo xtask fleet`: the pieces of docs/fleet.md checked with real tools.
//!
//! - deploy/daemonset.yaml and deploy/daemonset-flight-recorder.yaml against the Kubernetes
//!   schema (`kubernetes-validate` from PyPI, in a virtual environment under target/),
//!   deploy/prometheus-kubernetes.yml parsed as YAML;
//! - offline, the flight-recorder variant is deploy/daemonset.yaml plus its flight recorder
//!   only, with its dumps in a read-write hostPath at `--dump-dir`, bounded on disk by
//!   `--dump-keep` × `--flight-recorder-bytes` and in memory within the container's limit;
//! - offline, Pod Security admission (the namespace's levels against the standard's baseline
//!   controls the pods break) and deploy/podmonitor.yaml, deploy/servicemonitor.yaml against
//!   the DaemonSet and Service they scrape (the operator's CRD schemas are not available);
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
use serde_json::Value;

use crate::host::{is_root, workspace_root};

#[derive(clap::Args)]
pub struct FleetArgs {
    /// Skip the image (build and runs); check only the manifests and the Prometheus files.
    #[arg(long)]
    pub no_image: bool,
    /// After the image's checks, save it as an OCI archive in DIR
    /// (`gpu-trace-VERSION-image-x86_64.oci.tar`) and add its line to DIR/SHA256SUMS, as
    /// `cargo xtask dist` does for the packages (the release pipeline attaches it).
    #[arg(long, value_name = "DIR", conflicts_with = "no_image")]
    pub save_image: Option<PathBuf>,
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
        image(&root, args.save_image.as_deref())?;
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
        // The offline checks need only PyYAML.
        return offline_checks(Path::new("python3"), root);
    };
    offline_checks(&bin.join("python"), root)?;
    for file in ["deploy/daemonset.yaml", FLIGHT_VARIANT] {
        let text = check(
            Command::new(bin.join("kubernetes-validate"))
                .arg("--strict")
                .arg(root.join(file)),
        )?;
        print!("{text}");
    }
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

fn image(root: &Path, save: Option<&Path>) -> Result<()> {
    if !have("podman") || !have("runc") {
        // A release cannot go without its image: no skip then.
        ensure!(
            save.is_none(),
            "--save-image: podman and runc are needed (apt-get install podman runc)"
        );
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

    daemonset_privileges(root, &tag)?;
    if let Some(dir) = save {
        let dir = root.join(dir);
        fs::create_dir_all(&dir)?;
        let archive = dir.join(format!("gpu-trace-{version}-image-x86_64.oci.tar"));
        fs::remove_file(&archive).ok();
        check(
            Command::new("podman")
                .args(["save", "--format", "oci-archive", "-o"])
                .arg(&archive)
                .arg(&tag),
        )?;
        let sums = crate::dist::record_checksums(&dir, std::slice::from_ref(&archive))?;
        println!("fleet: wrote {} and {}", archive.display(), sums.display());
    }
    Ok(())
}

/// Starts the image live with exactly deploy/daemonset.yaml's privileges (it must attach and
/// serve /metrics), and once more without CAP_PERFMON (it must refuse, exit 3).
fn daemonset_privileges(root: &Path, tag: &str) -> Result<()> {
    if !is_root() {
        skipped("a live start with the DaemonSet's privileges", "needs root");
        return Ok(());
    }
    // The kubelet's pod log directories, read-only at the same path as in the DaemonSet; an
    // empty stand-in where this machine runs no kubelet.
    let mut pod_logs = PathBuf::from("/var/log/pods");
    if !pod_logs.is_dir() {
        pod_logs = root.join("target/image/var-log-pods");
        fs::create_dir_all(&pod_logs)?;
    }
    let pod_logs = format!("{}:/var/log/pods:ro", pod_logs.display());
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
            .args(["-v", &pod_logs])
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

/// The YAML documents of `path` as JSON values, read by PyYAML's safe loader through `python`.
fn yaml_documents(python: &Path, path: &Path) -> Result<Vec<Value>> {
    let text = check(
        Command::new(python)
            .args([
                "-c",
                "import json, sys, yaml; \
                 json.dump([d for d in yaml.safe_load_all(open(sys.argv[1])) if d], sys.stdout)",
            ])
            .arg(path),
    )
    .with_context(|| format!("reading {} as YAML (python3 with PyYAML)", path.display()))?;
    Ok(serde_json::from_str(&text)?)
}

/// The document of `kind` in `docs` (exactly one).
fn the<'a>(docs: &'a [Value], kind: &str) -> Result<&'a Value> {
    let mut found = docs.iter().filter(|d| d["kind"] == kind);
    let doc = found.next().with_context(|| format!("no {kind}"))?;
    ensure!(found.next().is_none(), "more than one {kind}");
    Ok(doc)
}

/// Capabilities the Pod Security Standards' baseline level lets a container add.
const BASELINE_CAPABILITIES: [&str; 13] = [
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
];

/// Sysctls the baseline level allows.
const BASELINE_SYSCTLS: [&str; 10] = [
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
];

/// What the Pod Security Standards' `baseline` level refuses in a pod template (`metadata` and
/// `spec`), one line per field, each control as the standard's text words it
/// (kubernetes.io/docs/concepts/security/pod-security-standards, "Baseline"): HostProcess, host
/// namespaces, privileged containers, capabilities, hostPath volumes, host ports, AppArmor,
/// SELinux, /proc mount type, seccomp, sysctls (the 1.29 list), and the later gitRepo volumes
/// (1.31), probe and lifecycle hosts (1.34), ulimits (1.37). Empty: `baseline` admits it.
fn baseline_violations(template: &Value) -> Vec<String> {
    let spec = &template["spec"];
    let mut v = Vec::new();
    let is_true = |x: &Value| x.as_bool() == Some(true);
    for ns in ["hostNetwork", "hostPID", "hostIPC"] {
        if is_true(&spec[ns]) {
            v.push(format!("host namespaces: spec.{ns}"));
        }
    }
    for vol in spec["volumes"].as_array().into_iter().flatten() {
        if vol.get("hostPath").is_some() {
            v.push(format!("hostPath volumes: {}", vol["name"]));
        }
        // Kubernetes 1.31 on.
        if vol.get("gitRepo").is_some() {
            v.push(format!("volume types: {} is gitRepo", vol["name"]));
        }
    }
    for sysctl in spec["securityContext"]["sysctls"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let name = sysctl["name"].as_str().unwrap_or_default();
        if !BASELINE_SYSCTLS.contains(&name) {
            v.push(format!("sysctls: {name}"));
        }
    }
    for (key, value) in template["metadata"]["annotations"]
        .as_object()
        .into_iter()
        .flatten()
    {
        let value = value.as_str().unwrap_or_default();
        if key.starts_with("container.apparmor.security.beta.kubernetes.io/")
            && value != "runtime/default"
            && !value.starts_with("localhost/")
        {
            v.push(format!("AppArmor: annotation {key}: {value}"));
        }
    }
    baseline_security_context(&spec["securityContext"], "spec.securityContext", &mut v);
    for list in ["containers", "initContainers", "ephemeralContainers"] {
        for c in spec[list].as_array().into_iter().flatten() {
            let at = format!("{list}[{}]", c["name"]);
            let sc = &c["securityContext"];
            baseline_security_context(sc, &format!("{at}.securityContext"), &mut v);
            if is_true(&sc["privileged"]) {
                v.push(format!("privileged containers: {at}"));
            }
            for cap in sc["capabilities"]["add"].as_array().into_iter().flatten() {
                let cap = cap.as_str().unwrap_or_default();
                if !BASELINE_CAPABILITIES.contains(&cap) {
                    v.push(format!("capabilities: {at} adds {cap}"));
                }
            }
            if !matches!(sc["procMount"].as_str(), None | Some("Default")) {
                v.push(format!("/proc mount type: {at}"));
            }
            for port in c["ports"].as_array().into_iter().flatten() {
                if port["hostPort"].as_u64().is_some_and(|p| p != 0) {
                    v.push(format!("host ports: {at}"));
                }
            }
            // Kubernetes 1.37 on.
            if !sc["ulimits"].is_null() {
                v.push(format!("ulimits: {at}"));
            }
            // Kubernetes 1.34 on: probes and lifecycle handlers may not name another host.
            let handlers = ["livenessProbe", "readinessProbe", "startupProbe"]
                .map(|p| (p, &c[p]))
                .into_iter()
                .chain(["postStart", "preStop"].map(|h| (h, &c["lifecycle"][h])));
            for (name, handler) in handlers {
                for kind in ["httpGet", "tcpSocket"] {
                    if handler[kind]["host"]
                        .as_str()
                        .is_some_and(|h| !h.is_empty())
                    {
                        v.push(format!("probe or lifecycle host: {at}.{name}.{kind}.host"));
                    }
                }
            }
        }
    }
    v
}

/// The controls a pod's and a container's securityContext share.
fn baseline_security_context(sc: &Value, at: &str, v: &mut Vec<String>) {
    if sc["windowsOptions"]["hostProcess"].as_bool() == Some(true) {
        v.push(format!("HostProcess: {at}"));
    }
    if !matches!(
        sc["seccompProfile"]["type"].as_str(),
        None | Some("RuntimeDefault" | "Localhost")
    ) {
        v.push(format!("seccomp: {at}.seccompProfile"));
    }
    if !matches!(
        sc["appArmorProfile"]["type"].as_str(),
        None | Some("RuntimeDefault" | "Localhost")
    ) {
        v.push(format!("AppArmor: {at}.appArmorProfile"));
    }
    let se = &sc["seLinuxOptions"];
    if !matches!(
        se["type"].as_str(),
        None | Some(
            "" | "container_t" | "container_init_t" | "container_kvm_t" | "container_engine_t"
        )
    ) || se["user"].as_str().is_some_and(|u| !u.is_empty())
        || se["role"].as_str().is_some_and(|r| !r.is_empty())
    {
        v.push(format!("SELinux: {at}.seLinuxOptions"));
    }
}

/// Pod Security admission, offline: the Namespace's `enforce`, `audit` and `warn` levels must
/// each admit the DaemonSet's pods (`privileged` where the baseline refuses any field). Returns
/// the baseline's refusals.
fn pod_security(docs: &[Value]) -> Result<Vec<String>> {
    let namespace = the(docs, "Namespace")?;
    let daemonset = the(docs, "DaemonSet")?;
    ensure!(
        daemonset["metadata"]["namespace"] == namespace["metadata"]["name"],
        "the DaemonSet is not in the Namespace of the same file"
    );
    let refused = baseline_violations(&daemonset["spec"]["template"]);
    for mode in ["enforce", "audit", "warn"] {
        let label = format!("pod-security.kubernetes.io/{mode}");
        let level = namespace["metadata"]["labels"][&label].as_str();
        let admits = match level {
            Some("privileged") => true,
            Some("baseline") => refused.is_empty(),
            Some("restricted") => false,
            None if mode == "enforce" => bail!(
                "the Namespace has no {label} label: a cluster whose default level is \
                 baseline or restricted refuses the pods ({})",
                refused.join("; ")
            ),
            None => bail!("the Namespace has no {label} label (set it to privileged)"),
            Some(other) => bail!("{label}: {other:?} is not a Pod Security level"),
        };
        ensure!(
            admits,
            "{label}: {} refuses the DaemonSet's pods: {}",
            level.unwrap_or_default(),
            refused.join("; ")
        );
    }
    Ok(refused)
}

/// deploy/podmonitor.yaml and deploy/servicemonitor.yaml against the DaemonSet and Service they
/// scrape. (prometheus-operator's CRD schemas are not available offline: the fields used are
/// checked by name and meaning here, not by the CRDs' OpenAPI schemas.)
fn monitors(docs: &[Value], podmonitor: &Value, servicemonitor: &Value) -> Result<()> {
    let daemonset = the(docs, "DaemonSet")?;
    let service = the(docs, "Service")?;
    let namespace = &daemonset["metadata"]["namespace"];
    let pod = &daemonset["spec"]["template"];
    let container_ports: Vec<&Value> = pod["spec"]["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|c| c["ports"].as_array().into_iter().flatten())
        .map(|p| &p["name"])
        .collect();
    let service_ports: Vec<&Value> = service["spec"]["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| &p["name"])
        .collect();
    for (monitor, kind, endpoints, labels, ports) in [
        (
            podmonitor,
            "PodMonitor",
            "podMetricsEndpoints",
            &pod["metadata"]["labels"],
            &container_ports,
        ),
        (
            servicemonitor,
            "ServiceMonitor",
            "endpoints",
            &service["metadata"]["labels"],
            &service_ports,
        ),
    ] {
        ensure!(
            monitor["apiVersion"] == "monitoring.coreos.com/v1" && monitor["kind"] == kind,
            "not a monitoring.coreos.com/v1 {kind}"
        );
        ensure!(
            &monitor["metadata"]["namespace"] == namespace,
            "{kind}: not in the DaemonSet's namespace {namespace}"
        );
        let spec = &monitor["spec"];
        let known = [
            "selector",
            "namespaceSelector",
            endpoints,
            "jobLabel",
            "podTargetLabels",
            "sampleLimit",
            "targetLimit",
        ];
        for key in spec.as_object().context("no spec")?.keys() {
            ensure!(known.contains(&key.as_str()), "{kind}: unknown spec.{key}");
        }
        for (key, value) in spec["selector"]["matchLabels"]
            .as_object()
            .with_context(|| format!("{kind}: no spec.selector.matchLabels"))?
        {
            ensure!(
                &labels[key] == value,
                "{kind}: the selector's {key}={value} does not match what it scrapes"
            );
        }
        let names = spec["namespaceSelector"]["matchNames"].as_array();
        ensure!(
            names.is_some_and(|n| n.contains(namespace)),
            "{kind}: namespaceSelector.matchNames lacks {namespace}"
        );
        let eps = spec[endpoints].as_array().filter(|e| !e.is_empty());
        for ep in eps.with_context(|| format!("{kind}: no {endpoints}"))? {
            ensure!(
                ports.contains(&&ep["port"]),
                "{kind}: port {} is not a named port of what it scrapes",
                ep["port"]
            );
            ensure!(ep["path"] == "/metrics", "{kind}: path is not /metrics");
        }
    }
    Ok(())
}

/// The DaemonSet with its flight recorder on.
const FLIGHT_VARIANT: &str = "deploy/daemonset-flight-recorder.yaml";

/// The flight recorder's arguments the variant must give (`--dump-on` and
/// `--dump-max-per-hour` too, but they bound neither disk nor memory).
const FLIGHT_ARGS: [&str; 4] = [
    "--flight-recorder",
    "--flight-recorder-bytes",
    "--dump-keep",
    "--dump-dir",
];

/// The most the variant's dumps may take on a node's disk.
const MAX_DUMP_DISK: u64 = 1 << 30;

/// `16Mi`, `128Mi`, `1Gi` (a Kubernetes quantity in powers of 1024) in bytes.
fn quantity(q: &str) -> Option<u64> {
    let (n, unit) = q.split_at(q.find(|c: char| !c.is_ascii_digit()).unwrap_or(q.len()));
    let shift = match unit {
        "" => 0,
        "Ki" => 10,
        "Mi" => 20,
        "Gi" => 30,
        _ => return None,
    };
    n.parse::<u64>().ok().map(|n| n << shift)
}

/// `variant` (deploy/daemonset-flight-recorder.yaml) is `plain` (deploy/daemonset.yaml) with
/// the flight recorder's arguments appended to the container's, and one more volume, a
/// hostPath at `--dump-dir` mounted read-write there; every other document and field the
/// same. Its dumps are bounded on disk (`--dump-keep` × `--flight-recorder-bytes` at most
/// [`MAX_DUMP_DISK`]) and the window in memory (twice the bytes, a margin for its index, its
/// chunks' slack and the state log — a dump copies nothing since the window is written
/// straight to its file — plus the 4 MiB ring buffer and 32 MiB for the tracer itself, within
/// the memory limit).
/// Returns the bounds, for the report.
fn flight_variant(plain: &[Value], variant: &[Value]) -> Result<String> {
    ensure!(
        plain.len() == variant.len(),
        "{FLIGHT_VARIANT}: {} documents, deploy/daemonset.yaml {}",
        variant.len(),
        plain.len()
    );
    for (p, v) in plain.iter().zip(variant) {
        if p["kind"] != "DaemonSet" {
            ensure!(p == v, "{FLIGHT_VARIANT}: its {} differs", v["kind"]);
        }
    }
    let mut ds = the(variant, "DaemonSet")?.clone();
    let want = the(plain, "DaemonSet")?;
    let spec = &mut ds["spec"]["template"]["spec"];
    let container = &mut spec["containers"][0];
    let base_args = want["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .context("deploy/daemonset.yaml: no args")?;
    let args = container["args"].as_array_mut().context("no args")?;
    ensure!(
        args.len() > base_args.len() && args[..base_args.len()] == base_args[..],
        "{FLIGHT_VARIANT}: the container's args are not deploy/daemonset.yaml's plus more"
    );
    let extra: Vec<(String, String)> = args
        .split_off(base_args.len())
        .iter()
        .map(|a| {
            let a = a.as_str().unwrap_or_default();
            let (k, v) = a.split_once('=').unwrap_or((a, ""));
            (k.to_string(), v.to_string())
        })
        .collect();
    let arg = |name: &str| {
        extra
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    };
    for name in FLIGHT_ARGS {
        ensure!(arg(name).is_some(), "{FLIGHT_VARIANT}: no {name}=VALUE");
    }
    ensure!(
        extra.iter().all(|(k, _)| FLIGHT_ARGS.contains(&k.as_str())
            || ["--dump-on", "--dump-max-per-hour"].contains(&k.as_str())),
        "{FLIGHT_VARIANT}: arguments other than the flight recorder's: {extra:?}"
    );
    let dir = arg("--dump-dir").unwrap_or_default();
    let mounts = container["volumeMounts"]
        .as_array_mut()
        .context("no mounts")?;
    let at = mounts
        .iter()
        .position(|m| m["mountPath"] == dir)
        .with_context(|| format!("{FLIGHT_VARIANT}: nothing mounted at --dump-dir {dir}"))?;
    let mount = mounts.remove(at);
    ensure!(
        mount["readOnly"] != true,
        "{FLIGHT_VARIANT}: the dump directory is mounted read-only"
    );
    let volumes = spec["volumes"].as_array_mut().context("no volumes")?;
    let at = volumes
        .iter()
        .position(|v| v["name"] == mount["name"])
        .context("the dump mount's volume")?;
    let volume = volumes.remove(at);
    ensure!(
        volume["hostPath"]["path"] == dir,
        "{FLIGHT_VARIANT}: the dumps' volume is not the node's {dir} (a hostPath)"
    );
    ensure!(
        &ds == want,
        "{FLIGHT_VARIANT}: its DaemonSet differs from deploy/daemonset.yaml's in more than the \
         flight recorder's arguments and volume"
    );
    let window =
        gpu_trace::cli::recording::parse_size(arg("--flight-recorder-bytes").unwrap_or(""))
            .map_err(anyhow::Error::msg)?;
    let keep: u64 = arg("--dump-keep").unwrap_or("").parse()?;
    ensure!(
        keep * window <= MAX_DUMP_DISK,
        "{FLIGHT_VARIANT}: {keep} dumps of {window} bytes may take more than 1 GiB of the node's disk"
    );
    let limit = want["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["memory"]
        .as_str()
        .and_then(quantity)
        .context("a memory limit in Ki, Mi or Gi")?;
    let need = 2 * window + (4 << 20) + (32 << 20);
    ensure!(
        need <= limit,
        "{FLIGHT_VARIANT}: the window ({window} bytes, counted twice for a margin) with the \
         ring and the tracer ({need} bytes) does not fit the memory limit ({limit} bytes)"
    );
    Ok(format!(
        "at most {keep} dumps of {} MiB on the node's {dir}; {} MiB of {} MiB memory",
        window >> 20,
        need >> 20,
        limit >> 20
    ))
}

/// The offline checks of deploy/: Pod Security admission and the monitors (`python`: one
/// with PyYAML).
fn offline_checks(python: &Path, root: &Path) -> Result<()> {
    let deploy = root.join("deploy");
    let docs = yaml_documents(python, &deploy.join("daemonset.yaml"))?;
    let refused = pod_security(&docs).context("deploy/daemonset.yaml: Pod Security")?;
    println!(
        "fleet: Pod Security (offline, the standard's baseline controls): the Namespace is \
         labelled privileged, as the DaemonSet's pods need ({})",
        refused.join("; ")
    );
    let variant = yaml_documents(python, &root.join(FLIGHT_VARIANT))?;
    let bounds = flight_variant(&docs, &variant)?;
    println!("fleet: {FLIGHT_VARIANT} is deploy/daemonset.yaml with its flight recorder: {bounds}");
    let pm = yaml_documents(python, &deploy.join("podmonitor.yaml"))?;
    let sm = yaml_documents(python, &deploy.join("servicemonitor.yaml"))?;
    monitors(&docs, the(&pm, "PodMonitor")?, the(&sm, "ServiceMonitor")?)?;
    println!(
        "fleet: deploy/podmonitor.yaml and deploy/servicemonitor.yaml select the DaemonSet's pods \
         and Service, namespace and port (not checked: the CRDs' schemas, not available offline)"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// python3 with PyYAML, or `None` after a skip of `test`.
    fn python(test: &str) -> Option<PathBuf> {
        let ok = Command::new("python3")
            .args(["-c", "import yaml"])
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            gpu_trace_core::skip::skipped(
                test,
                "python3 with PyYAML is not installed (apt-get install python3-yaml)",
            );
        }
        ok.then(|| PathBuf::from("python3"))
    }

    fn deploy(python: &Path, file: &str) -> Vec<Value> {
        yaml_documents(python, &workspace_root().join("deploy").join(file)).unwrap()
    }

    fn kind_mut<'a>(docs: &'a mut [Value], kind: &str) -> &'a mut Value {
        docs.iter_mut().find(|d| d["kind"] == kind).unwrap()
    }

    #[test]
    fn namespace_admits_the_daemonsets_pods() {
        let Some(py) = python("namespace_admits_the_daemonsets_pods") else {
            return;
        };
        let docs = deploy(&py, "daemonset.yaml");
        let refused = pod_security(&docs).unwrap();
        // Exactly what the DaemonSet's header comment says it needs, nothing else.
        let mut want = vec![
            "host namespaces: spec.hostPID".to_string(),
            r#"capabilities: containers["gpu-trace"] adds BPF"#.to_string(),
            r#"capabilities: containers["gpu-trace"] adds PERFMON"#.to_string(),
            r#"seccomp: containers["gpu-trace"].securityContext.seccompProfile"#.to_string(),
        ];
        for vol in ["btf", "tracefs", "host-cgroup", "pod-logs"] {
            want.push(format!("hostPath volumes: \"{vol}\""));
        }
        let mut got = refused.clone();
        got.sort();
        want.sort();
        assert_eq!(got, want);
        // Without the label, or with a level that refuses them, admission fails.
        for level in [None, Some("baseline"), Some("restricted")] {
            let mut docs = docs.clone();
            let labels = &mut kind_mut(&mut docs, "Namespace")["metadata"]["labels"];
            let key = "pod-security.kubernetes.io/enforce";
            match level {
                None => {
                    labels.as_object_mut().unwrap().remove(key);
                }
                Some(l) => labels[key] = json!(l),
            }
            let err = pod_security(&docs).unwrap_err().to_string();
            assert!(err.contains(key), "{level:?}: {err}");
        }
    }

    /// Each baseline control refuses a clean pod changed in that one field alone, and lets the
    /// values the standard allows through.
    #[test]
    fn baseline_checker_refuses_each_control_alone() {
        let clean = json!({"metadata": {}, "spec": {"containers": [{"name": "c", "image": "x"}]}});
        assert_eq!(baseline_violations(&clean), Vec::<String>::new());
        let sc = "/spec/containers/0/securityContext";
        let refused: [(&str, Value, &str); 18] = [
            ("/spec/hostNetwork", json!(true), "host namespaces"),
            ("/spec/hostPID", json!(true), "host namespaces"),
            ("/spec/hostIPC", json!(true), "host namespaces"),
            (
                "/spec/volumes",
                json!([{"name": "h", "hostPath": {"path": "/"}}]),
                "hostPath",
            ),
            (sc, json!({"privileged": true}), "privileged containers"),
            (
                sc,
                json!({"capabilities": {"add": ["SYS_ADMIN"]}}),
                "capabilities",
            ),
            (
                sc,
                json!({"seccompProfile": {"type": "Unconfined"}}),
                "seccomp",
            ),
            (sc, json!({"procMount": "Unmasked"}), "/proc mount type"),
            (sc, json!({"seLinuxOptions": {"type": "spc_t"}}), "SELinux"),
            (
                sc,
                json!({"appArmorProfile": {"type": "Unconfined"}}),
                "AppArmor",
            ),
            (
                sc,
                json!({"windowsOptions": {"hostProcess": true}}),
                "HostProcess",
            ),
            (
                "/spec/containers/0/ports",
                json!([{"containerPort": 1, "hostPort": 80}]),
                "host ports",
            ),
            (
                "/spec/securityContext",
                json!({"sysctls": [{"name": "kernel.msgmax", "value": "1"}]}),
                "sysctls",
            ),
            (
                "/spec/volumes",
                json!([{"name": "g", "gitRepo": {"repository": "x"}}]),
                "volume types",
            ),
            (sc, json!({"ulimits": []}), "ulimits"),
            (
                "/spec/containers/0/readinessProbe",
                json!({"httpGet": {"host": "10.0.0.1", "port": 1}}),
                "probe or lifecycle host",
            ),
            (
                "/spec/containers/0/lifecycle",
                json!({"preStop": {"tcpSocket": {"host": "h", "port": 1}}}),
                "probe or lifecycle host",
            ),
            (
                "/metadata/annotations",
                json!({"container.apparmor.security.beta.kubernetes.io/c": "unconfined"}),
                "AppArmor",
            ),
        ];
        let set = |pointer: &str, value: &Value| {
            let mut pod = clean.clone();
            let (parent, key) = pointer.rsplit_once('/').unwrap();
            pod.pointer_mut(parent).unwrap()[key] = value.clone();
            pod
        };
        for (pointer, value, control) in &refused {
            let v = baseline_violations(&set(pointer, value));
            assert!(
                v.len() == 1 && v[0].starts_with(control),
                "{pointer} {value}: {v:?}"
            );
        }
        let allowed: [(&str, Value); 7] = [
            (
                "/spec/containers/0/livenessProbe",
                json!({"tcpSocket": {"port": 1}, "httpGet": {"host": ""}}),
            ),
            (
                sc,
                json!({"seccompProfile": {"type": "RuntimeDefault"}, "privileged": false}),
            ),
            (
                sc,
                json!({"capabilities": {"add": ["NET_BIND_SERVICE"], "drop": ["ALL"]}}),
            ),
            (
                sc,
                json!({"procMount": "Default", "seLinuxOptions": {"type": "container_t"}}),
            ),
            (
                "/spec/containers/0/ports",
                json!([{"containerPort": 1, "hostPort": 0}]),
            ),
            (
                "/spec/securityContext",
                json!({"sysctls": [{"name": "net.ipv4.tcp_syncookies"}]}),
            ),
            ("/spec/hostPID", json!(false)),
        ];
        for (pointer, value) in &allowed {
            assert_eq!(
                baseline_violations(&set(pointer, value)),
                Vec::<String>::new()
            );
        }
    }

    #[test]
    fn monitors_scrape_the_daemonsets_metrics_port() {
        let Some(py) = python("monitors_scrape_the_daemonsets_metrics_port") else {
            return;
        };
        let docs = deploy(&py, "daemonset.yaml");
        let pm = the(&deploy(&py, "podmonitor.yaml"), "PodMonitor")
            .unwrap()
            .clone();
        let sm = the(&deploy(&py, "servicemonitor.yaml"), "ServiceMonitor")
            .unwrap()
            .clone();
        monitors(&docs, &pm, &sm).unwrap();
        // Each mismatch is seen: port, namespace, selector, path, an unknown field.
        let mutants: [(&str, Value); 5] = [
            ("/spec/podMetricsEndpoints/0/port", json!("http")),
            ("/metadata/namespace", json!("monitoring")),
            (
                "/spec/selector/matchLabels/app.kubernetes.io~1name",
                json!("other"),
            ),
            ("/spec/podMetricsEndpoints/0/path", json!("/")),
            ("/spec/podMetricsEndpoint", json!([])),
        ];
        for (pointer, value) in mutants {
            let mut bad = pm.clone();
            match bad.pointer_mut(pointer) {
                Some(slot) => *slot = value,
                None => bad["spec"]["podMetricsEndpoint"] = value,
            }
            assert!(monitors(&docs, &bad, &sm).is_err(), "{pointer} not seen");
            let mut bad = sm.clone();
            bad["spec"]["endpoints"][0]["port"] = json!("http");
            assert!(monitors(&docs, &pm, &bad).is_err());
        }
    }

    /// The flight-recorder variant is the DaemonSet plus a bounded dump directory; the check
    /// refuses a variant without `--dump-keep` (unbounded disk), with the dumps' mount
    /// read-only or elsewhere than `--dump-dir`, with a window the memory limit cannot hold, or
    /// that changed anything else.
    #[test]
    fn flight_recorder_variant_is_the_daemonset_plus_a_bounded_dump_directory() {
        let test = "flight_recorder_variant_is_the_daemonset_plus_a_bounded_dump_directory";
        let Some(py) = python(test) else {
            return;
        };
        let plain = deploy(&py, "daemonset.yaml");
        let variant = deploy(&py, "daemonset-flight-recorder.yaml");
        let bounds = flight_variant(&plain, &variant).unwrap();
        assert!(bounds.starts_with("at most 16 dumps of 16 MiB"), "{bounds}");
        let container = "/spec/template/spec/containers/0";
        let change = |f: &dyn Fn(&mut Value)| {
            let mut docs = variant.clone();
            f(kind_mut(&mut docs, "DaemonSet"));
            flight_variant(&plain, &docs).unwrap_err().to_string()
        };
        let args = format!("{container}/args");
        let err = change(&|d| {
            let a = d.pointer_mut(&args).unwrap().as_array_mut().unwrap();
            a.retain(|a| !a.as_str().unwrap().starts_with("--dump-keep"));
        });
        assert!(err.contains("no --dump-keep"), "{err}");
        let err = change(&|d| {
            let a = d.pointer_mut(&args).unwrap().as_array_mut().unwrap();
            for a in a.iter_mut() {
                if a.as_str().unwrap().starts_with("--flight-recorder-bytes") {
                    *a = json!("--flight-recorder-bytes=64M");
                }
            }
        });
        assert!(err.contains("memory limit"), "{err}");
        let mounts = format!("{container}/volumeMounts");
        let err = change(&|d| {
            let m = d.pointer_mut(&mounts).unwrap().as_array_mut().unwrap();
            m.last_mut().unwrap()["readOnly"] = json!(true);
        });
        assert!(err.contains("read-only"), "{err}");
        let err = change(&|d| {
            let m = d.pointer_mut(&mounts).unwrap().as_array_mut().unwrap();
            m.last_mut().unwrap()["mountPath"] = json!("/tmp/dumps");
        });
        assert!(err.contains("nothing mounted at --dump-dir"), "{err}");
        let err = change(&|d| {
            *d.pointer_mut(&format!("{container}/resources/limits/cpu"))
                .unwrap() = json!("2");
        });
        assert!(err.contains("more than the flight recorder"), "{err}");
    }

    /// The pod-name resolver reads the kubelet's /var/log/pods: mounted there, read-only.
    #[test]
    fn daemonset_mounts_pod_logs_read_only_at_the_kubelets_path() {
        let Some(py) = python("daemonset_mounts_pod_logs_read_only_at_the_kubelets_path") else {
            return;
        };
        let docs = deploy(&py, "daemonset.yaml");
        let spec = &the(&docs, "DaemonSet").unwrap()["spec"]["template"]["spec"];
        let mount = spec["containers"][0]["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["mountPath"] == "/var/log/pods")
            .expect("/var/log/pods mounted");
        assert_eq!(mount["readOnly"], true);
        let volume = spec["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == mount["name"])
            .unwrap();
        assert_eq!(volume["hostPath"]["path"], "/var/log/pods");
    }
}
