//! The verdict: the guest's results log parsed, and every check judged from it.

use std::collections::BTreeMap;

use anyhow::{Result, bail};

mod entry;

/// Values the test client puts in its CREATE_QUEUE calls (lab/client.c `LAB_*`).
const LAB_GPU_ID: u64 = 0x4c_4142;
const EINVAL: i64 = 22;
const ENOTTY: i64 = 25;
const EPERM: i64 = 1;
const EFAULT: i64 = 14;
const EADDRNOTAVAIL: i64 = 99;

/// What the guest wrote on its results port: `LAB` lines and `LAB-BEGIN`/`LAB-END` blocks.
#[derive(Debug, Default)]
pub(super) struct Results {
    /// Every `LAB <topic> ...` line, those inside blocks included, in order.
    lines: Vec<String>,
    blocks: BTreeMap<String, Block>,
    done: bool,
}

#[derive(Debug, Default, Clone)]
struct Block {
    text: String,
    rc: Option<i64>,
}

impl Results {
    pub(super) fn parse(text: &str) -> Self {
        let mut r = Results::default();
        let mut current: Option<(String, String)> = None;
        for raw in text.lines() {
            let line = raw.trim_end_matches('\r');
            if let Some(name) = line.strip_prefix("LAB-BEGIN ") {
                current = Some((name.trim().to_owned(), String::new()));
                continue;
            }
            if let Some(rest) = line.strip_prefix("LAB-END ") {
                let mut parts = rest.split_whitespace();
                let name = parts.next().unwrap_or_default().to_owned();
                let rc = parts
                    .find_map(|p| p.strip_prefix("rc="))
                    .and_then(|v| v.parse().ok());
                let text = match current.take() {
                    Some((n, t)) if n == name => t,
                    _ => String::new(),
                };
                r.blocks.insert(name, Block { text, rc });
                continue;
            }
            if line == "LAB-DONE" {
                r.done = true;
            }
            if let Some((_, t)) = current.as_mut() {
                t.push_str(line);
                t.push('\n');
            }
            if line.starts_with("LAB ") {
                r.lines.push(line.to_owned());
            }
        }
        r
    }

    /// The `key=value` fields of the first `LAB <topic> ...` line that has all of `matching`.
    fn find(&self, topic: &str, matching: &[(&str, &str)]) -> Option<Fields> {
        self.lines
            .iter()
            .map(|l| Fields::parse(l))
            .find(|f| f.topic == topic && matching.iter().all(|(k, v)| f.get(k) == Some(*v)))
    }

    /// The first `LAB <topic> ...` line that has the field `key`.
    fn with_key(&self, topic: &str, key: &str) -> Option<Fields> {
        self.lines
            .iter()
            .map(|l| Fields::parse(l))
            .find(|f| f.topic == topic && f.get(key).is_some())
    }

    /// `LAB fact key=value...`: the whole rest of the line is the value.
    fn fact(&self, key: &str) -> Option<&str> {
        let prefix = format!("LAB fact {key}=");
        self.lines
            .iter()
            .find_map(|l| l.strip_prefix(prefix.as_str()))
    }

    fn block(&self, name: &str) -> Option<&Block> {
        self.blocks.get(name)
    }

    /// The `LAB` lines of one block only (an empty result when the block is missing): several
    /// steps run the same client subcommand.
    fn sub(&self, name: &str) -> Results {
        Results::parse(self.block(name).map_or("", |b| b.text.as_str()))
    }
}

#[derive(Debug)]
struct Fields {
    topic: String,
    kv: Vec<(String, String)>,
}

impl Fields {
    fn parse(line: &str) -> Self {
        let mut parts = line.split_whitespace().skip(1);
        let topic = parts.next().unwrap_or_default().to_owned();
        let kv = parts
            .filter_map(|p| p.split_once('='))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        Self { topic, kv }
    }

    fn get(&self, key: &str) -> Option<&str> {
        self.kv
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    fn int(&self, key: &str) -> Option<i64> {
        let v = self.get(key)?;
        match v.strip_prefix("0x") {
            Some(hex) => i64::from_str_radix(hex, 16).ok(),
            None => v.parse().ok(),
        }
    }
}

// ---- checks -------------------------------------------------------------------------------

/// A check passes or fails: every shipped feature's check runs, and a feature that did not run
/// (missing from the build, or the guest never got to it) is a failure, never a skip.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Status {
    Pass,
    Fail,
    /// The kernel cannot run what the check needs, and another check asserts exactly why
    /// (`a.kfd`, see [`Kfd`]): printed as `N/A` with the reason, counted apart, never a pass.
    NotApplicable,
}

#[derive(Debug)]
pub(super) struct Check {
    id: &'static str,
    title: &'static str,
    status: Status,
    detail: String,
}

impl Check {
    fn new(id: &'static str, title: &'static str, ok: bool, detail: impl Into<String>) -> Self {
        let status = if ok { Status::Pass } else { Status::Fail };
        Self {
            id,
            title,
            status,
            detail: detail.into(),
        }
    }
    pub(super) fn fail(id: &'static str, title: &'static str, detail: impl Into<String>) -> Self {
        Self::new(id, title, false, detail)
    }
    /// Passes with `detail` when nothing went wrong, else fails naming the problems.
    fn judged(
        id: &'static str,
        title: &'static str,
        problems: &[String],
        detail: impl FnOnce() -> String,
    ) -> Self {
        if problems.is_empty() {
            Self::new(id, title, true, detail())
        } else {
            Self::fail(id, title, problems.join("; "))
        }
    }
}

pub(super) fn judge(r: &Results) -> Vec<Check> {
    let mut c = Vec::new();
    let kfd = Kfd::of(r);
    judge_kernel(r, &kfd, &mut c);
    judge_nvidia(r, &mut c);
    judge_nvidia_device(r, &mut c);
    judge_amd(r, &mut c);
    judge_deep(r, &mut c);
    judge_deep_hooks(r, &mut c);
    judge_gpu_ext(r, &mut c, "g.gpu_ext", "nvdev_gx");
    judge_gpu_ext(r, &mut c, "g.gpu_ext_kprobe", "nvdev_gxk");
    judge_nvobj(r, &mut c);
    judge_lsm(r, &mut c);
    judge_deny(r, &mut c);
    entry::judge_entry(r, &mut c);
    not_applicable(&mut c, &kfd);
    note_skipped_runs(r, &mut c);
    c
}

/// gpu-trace's exit warning that the kernel skipped runs of its programs (a program already
/// running on that CPU: preempted inside it, as under TCG on a lazily preemptible kernel).
const SKIPPED_RUNS: &str = "WARNING: the kernel skipped";

/// A failed check in a guest where some traced run lost calls to the kernel's skipping says so:
/// the failure stays a failure, with its likely cause named.
fn note_skipped_runs(r: &Results, c: &mut [Check]) {
    let runs: Vec<String> = r
        .blocks
        .iter()
        .filter(|(name, b)| name.ends_with(".stderr") && b.text.contains(SKIPPED_RUNS))
        .map(|(name, b)| {
            let line = b
                .text
                .lines()
                .find(|l| l.contains(SKIPPED_RUNS))
                .unwrap_or("");
            let count = line
                .split(SKIPPED_RUNS)
                .nth(1)
                .and_then(|rest| rest.split_whitespace().next())
                .unwrap_or("?");
            format!("{} ({count})", name.trim_end_matches(".stderr"))
        })
        .collect();
    if runs.is_empty() {
        return;
    }
    for ch in c.iter_mut().filter(|ch| ch.status == Status::Fail) {
        ch.detail.push_str(&format!(
            "\n      note: in this guest the kernel skipped runs of gpu-trace's programs, each losing \
             its calls, in: {} (gpu-trace's WARNING at exit)",
            runs.join(", ")
        ));
    }
}

/// What the guest's KFD allows. On a kernel where it cannot serve a process at all, the checks
/// that need KFD calls cannot pass or fail on gpu-trace's merits; `a.kfd` then asserts the
/// kernel's own reason instead, and the rest of those checks are not applicable.
#[derive(Debug, PartialEq, Eq)]
enum Kfd {
    /// /dev/kfd answers (5.10–6.19 without a GPU): every AMD check is judged.
    Usable,
    /// The kernel was built without KFD (`CONFIG_HSA_AMD` not set: Debian's arm64 kernels).
    /// amdgpu loads, but there is no /dev/kfd and none of KFD's functions.
    NotBuilt { config: String },
    /// Linux 7.0 on: KFD refuses every `open()` while no AMD GPU is initialised ("no gpu
    /// node!", from "drm/amdkfd: kfd driver supports hot unplug/replug amdgpu devices").
    /// The functions exist, so the checks of what attaches to them are still judged.
    NoGpuNode { refusal: String },
}

/// Checks that need KFD's functions in the kernel (attach only).
const NEEDS_KFD_FUNCTIONS: [&str; 1] = ["f.deep_select"];
/// Checks that need KFD calls to succeed (the client's `kprobe` and `lsm` steps open /dev/kfd
/// before anything else).
const NEEDS_KFD_CALLS: [&str; 13] = [
    "a.kfd_version",
    "c.driver",
    "c.trace",
    "d.kprobe",
    "d.ambiguous",
    "d.fentry",
    "e.lsm",
    "e.deny_amd",
    "e.deny_cgroup_amd",
    "f.deep_events",
    "f.deep_kprobe",
    "f.deep_release",
    "z.kfd_entry",
];

impl Kfd {
    fn of(r: &Results) -> Self {
        if let Some(config) = r.fact("hsa_amd").and_then(|v| v.strip_prefix("n")) {
            return Kfd::NotBuilt {
                config: config.trim().to_owned(),
            };
        }
        let refused = r
            .find("error", &[("open", "/dev/kfd")])
            .is_some_and(|f| f.int("errno") == Some(EINVAL));
        match r.fact("kfd_refusal") {
            Some(refusal) if refused && refusal.contains("no gpu node") => Kfd::NoGpuNode {
                refusal: refusal.trim().to_owned(),
            },
            _ => Kfd::Usable,
        }
    }

    /// `a.kfd`: /dev/kfd present; on a kernel whose KFD cannot serve, its reason as the guest
    /// showed it, and gpu-trace's doctor saying that the AMD driver cannot be used.
    fn check(&self, r: &Results) -> Check {
        let doctor = r.block("doctor").map_or("", |b| b.text.as_str());
        let amd_row = doctor
            .lines()
            .find(|l| l.starts_with("AMD") && l.contains(" driver "))
            .unwrap_or("")
            .trim();
        let said_no = amd_row.split_whitespace().nth(2) == Some("no");
        let kfd = r.fact("kfd").unwrap_or("(no fact)");
        match self {
            Kfd::Usable => Check::new("a.kfd", "/dev/kfd present", kfd.starts_with("present"), kfd),
            Kfd::NotBuilt { config } => Check::new(
                "a.kfd",
                "kernel without KFD: no /dev/kfd, and gpu-trace doctor says the AMD driver is absent",
                kfd == "absent" && said_no,
                format!("{config}; /dev/kfd {kfd}; doctor: `{amd_row}`"),
            ),
            Kfd::NoGpuNode { refusal } => Check::new(
                "a.kfd",
                "KFD refuses processes without a GPU (Linux 7.0 on): open() EINVAL with the kernel's reason, doctor says why",
                kfd.starts_with("present") && said_no,
                format!("/dev/kfd {kfd}; open: EINVAL; dmesg: `{refusal}`; doctor: `{amd_row}`"),
            ),
        }
    }
}

/// Marks the checks a kernel's KFD cannot serve as not applicable (see [`Kfd`]; its `a.kfd`,
/// judged with the kernel's checks, asserts why).
fn not_applicable(c: &mut [Check], kfd: &Kfd) {
    let why = match kfd {
        Kfd::Usable => return,
        Kfd::NotBuilt { .. } => "this kernel has no KFD (a.kfd)",
        Kfd::NoGpuNode { .. } => "this kernel's KFD serves no process without a GPU (a.kfd)",
    };
    let functions_too = matches!(kfd, Kfd::NotBuilt { .. });
    for ch in c.iter_mut() {
        if NEEDS_KFD_CALLS.contains(&ch.id)
            || (functions_too && NEEDS_KFD_FUNCTIONS.contains(&ch.id))
        {
            ch.status = Status::NotApplicable;
            ch.detail = format!("{why}; as judged: {}", ch.detail);
        }
    }
}

/// Module BTF (`/sys/kernel/btf/<module>`, and fentry/fexit on a module's functions through it)
/// came with Linux 5.11 ("bpf: Load and verify kernel module BTFs", "bpf: Allow to specify
/// kernel module BTFs when attaching BPF programs"). Before it, the checks of what needs it
/// assert the documented fallback instead (docs/kernels.md).
const MODULE_BTF_SINCE: (u32, u32) = (5, 11);

/// Whether the guest's kernel (`LAB fact kernel=`) is one that has module BTF; a kernel the
/// log does not name counts as new (its checks then want everything).
fn has_module_btf(r: &Results) -> bool {
    r.fact("kernel")
        .and_then(gpu_trace::probe::kernel::KernelVersion::parse)
        .is_none_or(|v| (v.major, v.minor) >= MODULE_BTF_SINCE)
}

/// What gpu-trace prints for the AMD deep hooks on a kernel without module BTF: the three
/// handlers whose arguments it needs no size for by kprobe, CREATE_QUEUE left to the syscall
/// layer, and the hooks that read the driver's structures not used.
const NO_MODULE_BTF_HANDLERS: &str = "AMD ioctl events → kprobe+kretprobe/{kfd_ioctl_destroy_queue,\
                                      kfd_ioctl_update_queue,kfd_ioctl_set_cu_mask} (in amdgpu)";
const NO_MODULE_BTF_REFUSALS: [&str; 4] = [
    "(not used: AMD ioctl events: kfd_ioctl_create_queue: the size of struct \
     kfd_ioctl_create_queue_args is unknown without the module's BTF; the syscall layer serves \
     CREATE_QUEUE)",
    "(not used: AMD queue details: create_queue_cpsch, create_queue_nocpsch: no module BTF to \
     read offsets from)",
    "(not used: AMD MQD init: no module BTF to read offsets from)",
    "(not used: AMD queue teardown: pqm_uninit: no module BTF to read offsets from)",
];

/// The fallback of a kernel without module BTF, as printed in a run's stderr: problems found.
fn no_module_btf_fallback(hooks: &str, stderr: &str) -> Vec<String> {
    let mut problems = Vec::new();
    if !hooks.contains(NO_MODULE_BTF_HANDLERS) {
        problems.push(format!("want `{NO_MODULE_BTF_HANDLERS}`"));
    }
    if !hooks.contains("ioctl+close → tp_btf/sys_exit") {
        problems.push("want the syscall layer attached for CREATE_QUEUE".into());
    }
    for want in NO_MODULE_BTF_REFUSALS {
        if !stderr.contains(want) {
            problems.push(format!("want `{want}`"));
        }
    }
    problems
}

fn judge_kernel(r: &Results, kfd: &Kfd, c: &mut Vec<Check>) {
    let failed: Vec<&String> = r
        .lines
        .iter()
        .filter(|l| l.starts_with("LAB module_failed="))
        .collect();
    let modules = r
        .lines
        .iter()
        .find(|l| l.starts_with("LAB modules_loaded="))
        .cloned()
        .unwrap_or_default();
    c.push(Check::new(
        "a.boot",
        "guest booted, loaded the amdgpu module chain, finished the scenario",
        r.done && failed.is_empty() && !modules.is_empty(),
        format!(
            "kernel {}; {}{}{}",
            r.fact("kernel").unwrap_or("?"),
            modules.trim_start_matches("LAB "),
            if failed.is_empty() {
                String::new()
            } else {
                format!("; {failed:?}")
            },
            if r.done {
                String::new()
            } else {
                format!(
                    "; the scenario did not finish (no LAB-DONE; the last step begun: {})",
                    r.lines
                        .iter()
                        .rev()
                        .find_map(|l| l.strip_prefix("LAB step "))
                        .unwrap_or("none")
                )
            }
        ),
    ));
    // The guest limits each command (lab/init.sh `limit`); one that ran past its limit was
    // killed there, and is a failure here whatever its own check makes of the rest.
    let timeouts: Vec<&str> = r
        .lines
        .iter()
        .filter_map(|l| l.strip_prefix("LAB timeout"))
        .map(str::trim_start)
        .collect();
    c.push(Check::new(
        "lab.limits",
        "every command of the scenario ended within its limit",
        r.done && timeouts.is_empty(),
        match (timeouts.is_empty(), r.done) {
            (true, true) => "none killed".to_owned(),
            (true, false) => "unknown: the scenario did not finish".to_owned(),
            (false, _) => format!("killed: {}", timeouts.join(" | ")),
        },
    ));
    c.push(kfd.check(r));
    let v = r.find("kfd", &[("rc", "0")]);
    c.push(Check::new(
        "a.kfd_version",
        "KFD GET_VERSION answers",
        v.is_some(),
        match &v {
            Some(f) => format!(
                "KFD {}.{}",
                f.get("major").unwrap_or("?"),
                f.get("minor").unwrap_or("?")
            ),
            None => r
                .find("kfd", &[])
                .map_or("no answer".into(), |f| format!("{:?}", f.kv)),
        },
    ));
    let lsm = r.fact("lsm").unwrap_or("(no fact)");
    c.push(Check::new(
        "a.lsm",
        "BPF LSM active (bpf in /sys/kernel/security/lsm)",
        lsm.split(',').any(|m| m == "bpf"),
        lsm,
    ));
    let pmu = r.fact("kprobe_pmu").unwrap_or("absent");
    let events = r.fact("kprobe_events").unwrap_or("absent");
    c.push(Check::new(
        "a.kprobes",
        "kprobes available (perf kprobe PMU, tracefs kprobe_events)",
        pmu != "absent" && events == "present",
        format!(
            "kprobe PMU type {pmu}, kprobe_events {events}, lockdown {}",
            r.fact("lockdown").unwrap_or("?")
        ),
    ));
    let btf = r.fact("amdgpu_btf").unwrap_or("absent");
    let vmlinux = r.fact("vmlinux_btf").unwrap_or("absent");
    c.push(Check::new(
        "a.module_btf",
        if has_module_btf(r) {
            "module BTF for amdgpu (/sys/kernel/btf/amdgpu)"
        } else {
            "before 5.11: no module BTF (/sys/kernel/btf/amdgpu absent), vmlinux BTF present"
        },
        if has_module_btf(r) {
            btf != "absent"
        } else {
            btf == "absent" && vmlinux != "absent"
        },
        format!(
            "{btf} bytes; vmlinux BTF {} bytes",
            r.fact("vmlinux_btf").unwrap_or("?")
        ),
    ));
    // Exit 0: tracing and --deny-pid can both work, which on this kernel they should.
    match r.block("doctor") {
        Some(b) => c.push(Check::new(
            "a.doctor",
            "gpu-trace doctor: tracing and --deny-pid both supported (exit 0)",
            b.rc == Some(0),
            format!("exit {}\n{}", b.rc.unwrap_or(-1), indent(&b.text)),
        )),
        None => c.push(Check::fail(
            "a.doctor",
            "gpu-trace doctor: tracing and --deny-pid both supported (exit 0)",
            "the guest did not run `gpu-trace doctor` (no doctor block in the log)",
        )),
    }
}

fn indent(text: &str) -> String {
    text.lines()
        .map(|l| format!("        | {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// JSON lines of a dumped block; lines that are not JSON objects are returned as errors.
fn json_lines(text: &str) -> (Vec<serde_json::Value>, Vec<String>) {
    let mut ok = Vec::new();
    let mut bad = Vec::new();
    for l in text.lines().filter(|l| !l.trim().is_empty()) {
        match serde_json::from_str::<serde_json::Value>(l) {
            Ok(v) if v.is_object() => ok.push(v),
            _ => bad.push(l.to_owned()),
        }
    }
    (ok, bad)
}

/// The JSON events of run `run` (its `<run>.jsonl` block); lines that are not JSON are noted in
/// `problems`.
fn run_events(r: &Results, run: &str, problems: &mut Vec<String>) -> Vec<serde_json::Value> {
    let (events, bad) = json_lines(
        &r.block(&format!("{run}.jsonl"))
            .map(|b| b.text.clone())
            .unwrap_or_default(),
    );
    if !bad.is_empty() {
        problems.push(format!("non-JSON output lines: {bad:?}"));
    }
    events
}

/// The events of process `pid`, in order (the STATS line and process-less lines left out).
fn events_of(events: &[serde_json::Value], pid: Option<i64>) -> Vec<&serde_json::Value> {
    events
        .iter()
        .filter(|e| e["event"] != "STATS" && e["pid"].as_i64() == pid)
        .collect()
}

/// A traced run's stderr (its block) and exit code (`LAB <name> tracer_exit=`).
fn tracer_outcome(r: &Results, name: &str) -> (String, Option<i64>) {
    let stderr = r
        .block(&format!("{name}.stderr"))
        .map(|b| b.text.clone())
        .unwrap_or_default();
    let exit = r
        .with_key(name, "tracer_exit")
        .and_then(|f| f.int("tracer_exit"));
    (stderr, exit)
}

/// A traced run's tracer (`LAB <name> tracer_ready=…` is `run`): ready and exited 0, else a
/// problem that quotes its stderr.
fn tracer_problems(r: &Results, name: &str, run: &Fields, problems: &mut Vec<String>) {
    let (stderr, exit) = tracer_outcome(r, name);
    if run.get("tracer_ready") != Some("yes") || exit != Some(0) {
        problems.push(format!(
            "tracer ready {:?}, exit {exit:?}: {}",
            run.get("tracer_ready"),
            stderr.trim()
        ));
    }
}

/// An event as `EVENT kind=value` (its task), for a check's detail.
fn event_brief(e: &serde_json::Value) -> String {
    format!(
        "{} {}={}",
        e["event"].as_str().unwrap_or("?"),
        e["task"]["kind"].as_str().unwrap_or("?"),
        e["task"]["value"]
    )
}

fn hooks_line(stderr: &str) -> String {
    stderr
        .lines()
        .filter(|l| l.contains("hooks"))
        .collect::<Vec<_>>()
        .join(" / ")
}

fn judge_nvidia(r: &Results, c: &mut Vec<Check>) {
    let ready = r.find("nv", &[("tracer_ready", "yes")]).is_some();
    let exit = r
        .with_key("nv", "tracer_exit")
        .and_then(|f| f.int("tracer_exit"));
    let stderr = r
        .block("nv.stderr")
        .map(|b| b.text.clone())
        .unwrap_or_default();
    c.push(Check::new(
        "b.load",
        "gpu-trace loads and attaches on the stock kernel (NVIDIA path)",
        ready && exit == Some(0),
        format!(
            "{}; exit {}",
            hooks_line(&stderr),
            exit.map_or("?".into(), |e| e.to_string())
        ),
    ));
    if !ready {
        c.push(Check::fail(
            "b.records",
            "RM-shaped ioctls on /dev/null traced",
            format!("tracer not ready:\n{}", indent(&stderr)),
        ));
        return;
    }
    let client = r.sub("nv.client");
    let pid = client.with_key("nv", "pid").and_then(|f| f.int("pid"));
    let calls: Vec<(String, i64)> = client
        .lines
        .iter()
        .map(|l| Fields::parse(l))
        .filter(|f| f.topic == "nv")
        .filter_map(|f| Some((f.get("call")?.to_owned(), f.int("rc")?)))
        .collect();
    let all_enotty = calls.len() == 7 && calls.iter().all(|(_, rc)| *rc == -ENOTTY);
    let (events, bad) = json_lines(
        &r.block("nv.jsonl")
            .map(|b| b.text.clone())
            .unwrap_or_default(),
    );
    let stats = events.iter().find(|e| e["event"] == "STATS");
    let kernel = stats.map(|s| &s["kernel"]);
    let k = |name: &str| kernel.and_then(|k| k[name].as_u64());
    let mut problems = Vec::new();
    if !all_enotty {
        problems.push(format!("client calls {calls:?} (want 7 × -{ENOTTY})"));
    }
    if !bad.is_empty() {
        problems.push(format!("non-JSON output lines: {bad:?}"));
    }
    if stats.is_none() {
        problems.push("no STATS line".into());
    }
    // `emitted` counts every record kind (issue 11): the process's cgroup (sent before its first
    // record, issue 14), the 4 calls, the client's two close()s (a process with RM records gets a
    // notice for each close) and its exit.
    if k("emitted") != Some(8) {
        problems.push(format!(
            "kernel emitted {:?}, want 8 (the process's cgroup; alloc, schedule, XFER alloc, \
             free; 2 close and 1 exit notice)",
            k("emitted")
        ));
    }
    if k("ignored") != Some(1) {
        problems.push(format!(
            "kernel ignored {:?}, want 1 (the unrelated control)",
            k("ignored")
        ));
    }
    for counter in ["dropped", "read_failed"] {
        if k(counter) != Some(0) {
            problems.push(format!("{counter} {:?}, want 0", k(counter)));
        }
    }
    // Every call failed (ENOTTY): no task was created, the schedule was refused.
    let of_client: Vec<&serde_json::Value> = events
        .iter()
        .filter(|e| e["event"] != "STATS" && e["pid"].as_i64() == pid)
        .collect();
    if events.iter().any(|e| e["event"] == "TASK_INIT") {
        problems.push("a TASK_INIT for a failed alloc".into());
    }
    // The client's GPFIFO_SCHEDULE names TSG handle 0x5c000010 of RM client 0xc1d00001.
    let refused = of_client.iter().find(|e| {
        e["event"] == "SCHEDULE"
            && e["allowed"] == false
            && e["errno"].as_i64() == Some(-ENOTTY)
            && e["task"]["value"].as_u64() == Some(0x5c00_0010)
            && e["client"].as_u64() == Some(0xc1d0_0001)
    });
    if refused.is_none() {
        problems.push(format!(
            "no SCHEDULE of TSG 0x5c000010 (client 0xc1d00001) allowed=false errno=-{ENOTTY} for pid \
             {pid:?}; events: {of_client:?}"
        ));
    }
    c.push(Check::judged(
        "b.records",
        "RM-shaped ioctls on /dev/null: captured, decoded, refused with ENOTTY, counted",
        &problems,
        || {
            format!(
                "8 records emitted (the process's cgroup, 4 calls, 2 close and 1 exit notice), 1 ignored, 0 dropped; events of pid {}: {}",
                pid.unwrap_or(-1),
                of_client
                    .iter()
                    .map(|e| e["event"].as_str().unwrap_or("?"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        },
    ));
}

/// The success path through a real major-195 device: the lab's test module nvlab, an RM client
/// and device, then two TSGs (lab/modules/nvlab, lab/client.c `cmd_nvdev`).
fn judge_nvidia_device(r: &Results, c: &mut Vec<Check>) {
    let title = "NVIDIA success path on a char-195 device (test module nvlab): TASK_INIT, SCHEDULE \
                 allowed, TASK_DESTROY";
    let module = r.find("test_module", &[("name", "nvlab")]);
    if module.as_ref().and_then(|m| m.get("loaded")) != Some("yes") {
        let why = match module {
            Some(m) => format!("insmod nvlab failed: {:?}", m.kv),
            None => "the nvlab module was not in the guest (see lab.modules)".into(),
        };
        c.push(Check::fail("b.nvdev", title, why));
        return;
    }
    let client = r.sub("nvdev.client");
    let fields = |topic: &str| -> Vec<Fields> {
        client
            .lines
            .iter()
            .map(|l| Fields::parse(l))
            .filter(|f| f.topic == topic)
            .collect()
    };
    let pid = fields("nvdev").iter().find_map(|f| f.int("pid"));
    let calls: Vec<(String, i64, i64)> = fields("nvdev")
        .iter()
        .filter_map(|f| Some((f.get("call")?.to_owned(), f.int("rc")?, f.int("status")?)))
        .collect();
    let mut problems = Vec::new();
    // alloc_client, alloc_device, alloc64, schedule, xfer_alloc, free_a, free_b.
    if calls.len() != 7 || calls.iter().any(|(_, rc, st)| (*rc, *st) != (0, 0)) {
        problems.push(format!(
            "client calls (name, rc, RM status) {calls:?}: want 7 × (0, 0)"
        ));
    }
    if r.find("nvdev", &[("tracer_ready", "yes")]).is_none() {
        problems.push("gpu-trace did not report its hooks".into());
    }
    let (events, bad) = json_lines(
        &r.block("nvdev.jsonl")
            .map(|b| b.text.clone())
            .unwrap_or_default(),
    );
    if !bad.is_empty() {
        problems.push(format!("non-JSON output lines: {bad:?}"));
    }
    let of = |kind: &str, tsg: u64| {
        events
            .iter()
            .filter(|e| {
                e["event"] == kind
                    && e["pid"].as_i64() == pid
                    && e["task"]["value"].as_u64() == Some(tsg)
            })
            .collect::<Vec<_>>()
    };
    for tsg in [0x5c00_0010u64, 0x5c00_0011] {
        let init = of("TASK_INIT", tsg);
        if init.len() != 1 || init[0]["engine"] != "GRAPHICS" || init[0]["client"] != 0xc1d0_0001u64
        {
            problems.push(format!(
                "want one TASK_INIT engine=GRAPHICS for TSG {tsg:#x}, got {init:?}"
            ));
        }
        let destroy = of("TASK_DESTROY", tsg);
        if destroy.len() != 1 || destroy[0]["cause"] != "free" {
            problems.push(format!(
                "want one TASK_DESTROY cause=free for TSG {tsg:#x}, got {destroy:?}"
            ));
        }
    }
    let sched = of("SCHEDULE", 0x5c00_0010);
    if sched.len() != 1
        || sched[0]["allowed"] != true
        || sched[0]["errno"] != 0
        || sched[0]["rm_status"] != 0
    {
        problems.push(format!(
            "want one SCHEDULE allowed=true errno=0 rm_status=0 for TSG 0x5c000010, got {sched:?}"
        ));
    }
    let stats = events.iter().find(|e| e["event"] == "STATS");
    let k = |name: &str| stats.and_then(|s| s["kernel"][name].as_u64());
    // The process's cgroup, 7 calls (the RM client and device allocations are traced: gpu-trace
    // needs them to know the client and the TSGs' GPU), then the client's close() and exit
    // notices (all counted in `emitted` since issue 11).
    if (k("emitted"), k("dropped"), k("read_failed")) != (Some(10), Some(0), Some(0)) {
        problems.push(format!(
            "kernel counters emitted {:?} dropped {:?} read_failed {:?}: want 10 (the cgroup, 7 \
             calls, a close and an exit notice), 0, 0",
            k("emitted"),
            k("dropped"),
            k("read_failed")
        ));
    }
    c.push(Check::judged("b.nvdev", title, &problems, || {
        format!(
            "pid {}: {}",
            pid.unwrap_or(-1),
            events
                .iter()
                .filter(|e| e["event"] != "STATS")
                .map(|e| format!(
                    "{} {:#x}",
                    e["event"].as_str().unwrap_or("?"),
                    e["task"]["value"].as_u64().unwrap_or(0)
                ))
                .collect::<Vec<_>>()
                .join(", ")
        )
    }));
}

fn judge_amd(r: &Results, c: &mut Vec<Check>) {
    let client = r.sub("amd.client");
    let rc = |size: &str| {
        client
            .find("kfd_create", &[("size", size)])
            .and_then(|f| f.int("rc"))
    };
    let (r96, r88) = (rc("96"), rc("88"));
    c.push(Check::new(
        "c.driver",
        "CREATE_QUEUE on /dev/kfd enters the driver and fails with EINVAL (96- and 88-byte forms)",
        r96 == Some(-EINVAL) && r88 == Some(-EINVAL),
        format!(
            "96-byte: {r96:?}, 88-byte: {r88:?} (want -{EINVAL}: no GPU with the lab's gpu_id)"
        ),
    ));
    let probe = r.block("amd.probe");
    let stderr = r
        .block("amd.stderr")
        .map(|b| b.text.clone())
        .unwrap_or_default();
    // A build that cannot trace AMD (the probe run exits non-zero) fails below: the tracer is
    // not ready and no event arrives.
    if let Some(b) = probe.filter(|b| b.rc != Some(0)) {
        c.push(Check::fail(
            "c.trace",
            "gpu-trace --vendor amd shows the refused CREATE_QUEUE calls",
            format!(
                "`gpu-trace --vendor amd` exited {:?}:\n{}",
                b.rc,
                indent(&b.text)
            ),
        ));
        return;
    }
    let ready = r.find("amd", &[("tracer_ready", "yes")]).is_some();
    let pid = client.find("kfd_create", &[]).and_then(|f| f.int("pid"));
    let (events, bad) = json_lines(
        &r.block("amd.jsonl")
            .map(|b| b.text.clone())
            .unwrap_or_default(),
    );
    let mut problems = Vec::new();
    if !ready {
        problems.push(format!("tracer not ready: {}", stderr.trim()));
    }
    if !bad.is_empty() {
        problems.push(format!("non-JSON output lines: {bad:?}"));
    }
    let of_client: Vec<&serde_json::Value> = events
        .iter()
        .filter(|e| e["event"] != "STATS" && e["pid"].as_i64() == pid)
        .collect();
    if events.iter().any(|e| e["event"] == "TASK_INIT") {
        problems.push("a TASK_INIT although no queue was created".into());
    }
    // docs/amd.md: a refused CREATE_QUEUE is `SCHEDULE via=create allowed=no` with the errno,
    // task `kfd_no_queue`, and the parameters the caller passed (lab/client.c `LAB_*`).
    let refused: Vec<&&serde_json::Value> = of_client
        .iter()
        .filter(|e| {
            let amd = &e["amd"];
            e["event"] == "SCHEDULE"
                && e["allowed"] == false
                && e["errno"].as_i64() == Some(-EINVAL)
                && e["task"]["kind"] == "kfd_no_queue"
                && amd["via"] == "create"
                && amd["gpu_id"].as_u64() == Some(LAB_GPU_ID)
                && amd["queue_type"] == "COMPUTE_AQL"
                && amd["priority"] == 7
                && amd["percentage"] == 100
                && amd["ring_size"] == 4096
        })
        .collect();
    if refused.len() != 2 {
        problems.push(format!(
            "want 2 refused CREATE_QUEUE events (SCHEDULE via=create allowed=false errno=-{EINVAL}, \
             task kfd_no_queue, gpu_id {LAB_GPU_ID:#x} COMPUTE_AQL priority 7, 100 %, ring 4096) \
             for pid {pid:?}, got {}: {of_client:?}",
            refused.len()
        ));
    }
    // The 88-byte form ends before sdma_engine_id: gpu-trace reports it unknown (null); the
    // 96-byte form carries it (0). So each form was read with its own size.
    let sdma: Vec<&serde_json::Value> = refused
        .iter()
        .map(|e| &e["amd"]["sdma_engine_id"])
        .collect();
    if refused.len() == 2
        && !(sdma.contains(&&serde_json::json!(0)) && sdma.contains(&&serde_json::Value::Null))
    {
        problems.push(format!(
            "sdma_engine_id {sdma:?}: want 0 (96-byte form) and null (88-byte form)"
        ));
    }
    let stats = events.iter().find(|e| e["event"] == "STATS");
    let k = |name: &str| stats.and_then(|s| s["kernel"][name].as_u64());
    // 2 refused creates and the client's exit notice (close notices are for RM processes only).
    if (k("emitted"), k("dropped")) != (Some(4), Some(0)) {
        problems.push(format!(
            "kernel emitted {:?} dropped {:?}: want 4 (the process's cgroup, 2 calls, 1 exit notice), 0",
            k("emitted"),
            k("dropped")
        ));
    }
    c.push(Check::judged(
        "c.trace",
        "gpu-trace --vendor amd shows both CREATE_QUEUE calls refused with EINVAL, no TASK_INIT",
        &problems,
        || {
            format!(
                "{}; 2 × SCHEDULE via=create allowed=false errno=-22 task=kfd_no_queue, gpu_id, \
                 type, priority, percentage, ring decoded; sdma_engine_id 0 (96-byte) and null \
                 (88-byte)",
                hooks_line(&stderr)
            )
        },
    ));
}

/// Entry and return programs on kfd_ioctl_create_queue: one hit each, the driver's copy of the
/// arguments read at entry, the driver's errno at return.
fn create_queue_probe(r: &Results, topic: &str) -> (bool, String) {
    let Some(f) = r.with_key(topic, "entry_hits") else {
        let lines: Vec<&String> = r
            .lines
            .iter()
            .filter(|l| l.starts_with(&format!("LAB {topic} ")))
            .collect();
        return (false, format!("no result; client said: {lines:?}"));
    };
    let ok = f.int("entry_hits") == Some(1)
        && f.int("return_hits") == Some(1)
        && f.int("gpu_id") == Some(LAB_GPU_ID as i64)
        && f.int("ret") == Some(-EINVAL);
    (
        ok,
        format!(
            "entry hits {}, gpu_id read from the driver's args {}, return hits {}, returned {} (want 1, {LAB_GPU_ID:#x}, 1, -{EINVAL})",
            f.get("entry_hits").unwrap_or("?"),
            f.get("gpu_id").unwrap_or("?"),
            f.get("return_hits").unwrap_or("?"),
            f.get("ret").unwrap_or("?")
        ),
    )
}

fn judge_deep(r: &Results, c: &mut Vec<Check>) {
    let (ok, detail) = create_queue_probe(r, "kprobe");
    c.push(Check::new(
        "d.kprobe",
        "kprobe + kretprobe on kfd_ioctl_create_queue fire for CREATE_QUEUE",
        ok,
        detail,
    ));
    let amb = r.find("kprobe", &[("ambiguous", "init_mqd")]);
    let att = r.with_key("kprobe", "by_address_attached");
    let copies = amb.as_ref().and_then(|f| f.int("copies"));
    let ok = copies.is_some_and(|n| n > 1)
        && amb.as_ref().and_then(|f| f.get("by_name")) == Some("refused")
        && amb.as_ref().and_then(|f| f.int("errno")) == Some(EADDRNOTAVAIL)
        && att.as_ref().and_then(|f| f.int("by_address_attached")) == copies;
    c.push(Check::new(
        "d.ambiguous",
        "ambiguous static name (init_mqd): refused by name (EADDRNOTAVAIL), every copy attaches by address",
        ok,
        format!(
            "{} copies in kallsyms; by name: {} (errno {}); attached by address: {}",
            copies.map_or("?".into(), |n| n.to_string()),
            amb.as_ref().and_then(|f| f.get("by_name")).unwrap_or("?"),
            amb.as_ref().and_then(|f| f.get("errno")).unwrap_or("?"),
            att.as_ref().and_then(|f| f.get("by_address_attached")).unwrap_or("?"),
        ),
    ));
    let (ok, detail) = create_queue_probe(r, "fentry");
    let btf = r
        .with_key("fentry", "func_id")
        .map(|f| {
            format!(
                "; split-BTF id {} (vmlinux has {} types)",
                f.get("func_id").unwrap_or("?"),
                f.get("vmlinux_types").unwrap_or("?")
            )
        })
        .unwrap_or_default();
    if has_module_btf(r) {
        c.push(Check::new(
            "d.fentry",
            "fentry + fexit on kfd_ioctl_create_queue through amdgpu's module BTF",
            ok,
            format!("{detail}{btf}"),
        ));
    } else {
        // The client looks for /sys/kernel/btf/amdgpu first and says it is missing.
        let missing = r.find("fentry", &[("btf", "missing")]).is_some();
        c.push(Check::new(
            "d.fentry",
            "before 5.11: no trampoline on a module function (the client finds no amdgpu BTF)",
            missing && !ok,
            format!("btf=missing: {missing}; {detail}"),
        ));
    }
}

/// gpu-trace's own deep hooks (issue 3): the same `kfd-ops` calls traced through the syscall
/// layer only (`ops_syscall`) and through the driver's functions (`ops_deep`).
fn judge_deep_hooks(r: &Results, c: &mut Vec<Check>) {
    let stderr = r
        .block("ops_deep.stderr")
        .map(|b| b.text.clone())
        .unwrap_or_default();
    let hooks = hooks_line(&stderr);
    let module_btf = has_module_btf(r);
    let mut problems = Vec::new();
    let want_handlers = "AMD ioctl events → fexit/{kfd_ioctl_create_queue,kfd_ioctl_destroy_queue,\
                         kfd_ioctl_update_queue,kfd_ioctl_set_cu_mask} (amdgpu BTF)";
    if !hooks.contains(want_handlers) {
        problems.push(format!("want `{want_handlers}`"));
    }
    // Both device-queue-manager implementations take six arguments: trampolines on 6.1 too.
    let want_dqm = "AMD queue details → fexit/{create_queue_cpsch,create_queue_nocpsch}";
    if !hooks.contains(want_dqm) {
        problems.push(format!("want `{want_dqm}`"));
    }
    // Every copy of each MQD builder this kernel has, by address: `name ×attached/copies`.
    let mqd = hooks
        .split(';')
        .find(|h| h.contains("AMD MQD init → kprobe by address:"))
        .map(|h| {
            h.split(['(', ':'])
                .nth(1)
                .unwrap_or("")
                .split(',')
                .filter_map(|part| {
                    let (name, counts) = part.trim().split_once(" ×")?;
                    let (a, b) = counts.split_once('/')?;
                    Some((
                        name.to_string(),
                        a.trim().parse::<u32>().ok()?,
                        b.trim().parse::<u32>().ok()?,
                    ))
                })
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
    let all_copies = mqd.iter().all(|(_, a, b)| a == b);
    let init_copies = mqd
        .iter()
        .find(|(n, _, _)| n == "init_mqd")
        .map(|(_, a, _)| *a);
    let sdma = mqd.iter().any(|(n, _, _)| n == "init_mqd_sdma");
    if !(all_copies && init_copies.is_some_and(|n| n > 1) && sdma) {
        problems.push(format!(
            "want every copy of init_mqd (> 1) and init_mqd_sdma attached by address, got {mqd:?}"
        ));
    }
    if !hooks.contains("AMD queue teardown → fentry/{pqm_uninit} (amdgpu BTF)") {
        problems.push("want fentry/{pqm_uninit}".into());
    }
    if !stderr.contains("syscall layer not attached") {
        problems.push(
            "want the syscall layer left out (every KFD command served by the driver hooks)".into(),
        );
    }
    if !module_btf {
        problems = no_module_btf_fallback(&hooks, &stderr);
    }
    let ready = r.find("ops_deep", &[("tracer_ready", "yes")]).is_some();
    if !ready {
        problems.push("tracer not ready".into());
    }
    c.push(Check::new(
        "f.deep_select",
        if module_btf {
            "gpu-trace picks per event: fexit on the KFD handlers and on both DQM create_queue functions, every init_mqd/init_mqd_sdma copy by address, fentry on pqm_uninit; no syscall hook"
        } else {
            "before 5.11 (no module BTF): kprobes on the three handlers, CREATE_QUEUE on the syscall layer, the hooks that read driver structures refused with the reason"
        },
        problems.is_empty(),
        if problems.is_empty() { hooks.clone() } else { format!("{}: {}", problems.join("; "), stderr.trim()) },
    ));

    // Same calls, same events: the deep run must print what the syscall layer printed.
    let events = |name: &str| {
        let (ev, bad) = json_lines(
            &r.block(&format!("{name}.jsonl"))
                .map(|b| b.text.clone())
                .unwrap_or_default(),
        );
        (ev, bad)
    };
    let (sys, sys_bad) = events("ops_syscall");
    let (deep, deep_bad) = events("ops_deep");
    let client = |name: &str| {
        r.sub(&format!("{name}.client"))
            .find("kfd_ops", &[])
            .and_then(|f| f.int("pid"))
    };
    let normal = |ev: &[serde_json::Value], pid: Option<i64>| -> Vec<serde_json::Value> {
        ev.iter()
            .filter(|e| e["event"] != "STATS" && e["pid"].as_i64() == pid)
            .map(|e| {
                let mut e = e.clone();
                // `key` starts with the pid.
                for k in ["ts", "ts_ns", "cpu", "pid", "tid", "time", "key"] {
                    e.as_object_mut().map(|o| o.remove(k));
                }
                // The driver's copy of an 88-byte CREATE_QUEUE is zero-filled to 96 bytes: the
                // deep hook reads sdma_engine_id 0 where the syscall layer reads nothing.
                e["amd"].as_object_mut().map(|o| o.remove("sdma_engine_id"));
                e
            })
            .collect()
    };
    let (s_norm, d_norm) = (
        normal(&sys, client("ops_syscall")),
        normal(&deep, client("ops_deep")),
    );
    let calls = r.sub("ops_deep.client");
    let rc = |call: &str| {
        calls
            .find("kfd_ops", &[("call", call)])
            .and_then(|f| f.int("rc"))
    };
    let mut problems = Vec::new();
    if !sys_bad.is_empty() || !deep_bad.is_empty() {
        problems.push(format!("non-JSON lines: {sys_bad:?} {deep_bad:?}"));
    }
    if s_norm.is_empty() {
        problems.push("the syscall-layer run printed no event for the client".into());
    }
    if s_norm != d_norm {
        problems.push(format!(
            "syscall layer printed {s_norm:?}\ndeep hooks printed {d_norm:?}"
        ));
    }
    let stats = |ev: &[serde_json::Value]| ev.iter().find(|e| e["event"] == "STATS").cloned();
    let k = |st: &Option<serde_json::Value>, name: &str| {
        st.as_ref().and_then(|s| s["kernel"][name].as_u64())
    };
    let (ss, ds) = (stats(&sys), stats(&deep));
    // The process's cgroup, one record per call, none twice, plus the exit notice; the deep run
    // also sends the driver's teardown (pqm_uninit) record. All counted in `emitted`.
    // Without module BTF there is no teardown hook: 6 in both runs.
    let deep_emitted = if module_btf { 7 } else { 6 };
    if (k(&ss, "emitted"), k(&ds, "emitted"), k(&ds, "dropped"))
        != (Some(6), Some(deep_emitted), Some(0))
    {
        problems.push(format!(
            "kernel emitted {:?} (syscall) / {:?} (deep), dropped {:?}: want 6 (cgroup + 4 calls + exit), \
             {deep_emitted} (+ pqm_uninit where hooked), 0",
            k(&ss, "emitted"),
            k(&ds, "emitted"),
            k(&ds, "dropped")
        ));
    }
    let refused = |kind: &str| {
        d_norm
            .iter()
            .filter(|e| e["event"] == kind && e["allowed"] == false)
            .count()
    };
    // What the calls are known to do without a GPU (no queue with the lab's gpu_id): CREATE_QUEUE
    // and DESTROY_QUEUE refused with EINVAL, UPDATE_QUEUE and SET_CU_MASK with EFAULT. gpu-trace
    // shows a refused SCHEDULE for the create (the admission request) and a refused SCHED_UPDATE
    // for the update and the CU mask (parameter changes); a refused destroy prints nothing; in
    // both runs.
    let want_rc = [
        ("create", -EINVAL),
        ("update", -EFAULT),
        ("cu_mask", -EFAULT),
        ("destroy", -EINVAL),
    ];
    for (call, want) in want_rc {
        if rc(call) != Some(want) {
            problems.push(format!(
                "client {call} returned {:?}, want {want}",
                rc(call)
            ));
        }
    }
    let (sched, upd) = (refused("SCHEDULE"), refused("SCHED_UPDATE"));
    if d_norm.len() != 3 || sched != 1 || upd != 2 {
        problems.push(format!(
            "{} events, {sched} refused SCHEDULE, {upd} refused SCHED_UPDATE: want exactly 1 \
             (CREATE_QUEUE) and 2 (UPDATE_QUEUE, SET_CU_MASK)",
            d_norm.len()
        ));
    }
    c.push(Check::judged(
        "f.deep_events",
        "the four KFD handlers hooked: the same events as the syscall layer, each call once",
        &problems,
        || {
            format!(
                "client: create {:?}, update {:?}, cu_mask {:?}, destroy {:?}; {} events identical in both runs ({sched} refused SCHEDULE, {upd} refused SCHED_UPDATE); emitted 6 / {deep_emitted} (the process's cgroup, 4 calls, the exit notice, and the deep run's teardown record where hooked)",
                rc("create"), rc("update"), rc("cu_mask"), rc("destroy"), d_norm.len()
            )
        },
    ));

    // The kprobe fallback of every deep hook (`--deep-attach kprobe`): chosen, same events,
    // the teardown seen.
    let kstderr = r
        .block("ops_kprobe.stderr")
        .map(|b| b.text.clone())
        .unwrap_or_default();
    let khooks = hooks_line(&kstderr);
    let (kev, kbad) = events("ops_kprobe");
    let k_norm = normal(&kev, client("ops_kprobe"));
    let kstats = stats(&kev);
    let mut kproblems = if module_btf {
        Vec::new()
    } else {
        no_module_btf_fallback(&khooks, &kstderr)
    };
    for want in if !module_btf {
        [].as_slice()
    } else {
        [
        "AMD ioctl events → kprobe+kretprobe/{kfd_ioctl_create_queue,kfd_ioctl_destroy_queue,\
         kfd_ioctl_update_queue,kfd_ioctl_set_cu_mask} (in amdgpu)",
        "AMD queue details → kprobe+kretprobe/{create_queue_cpsch,create_queue_nocpsch} (in amdgpu)",
        "AMD queue teardown → kprobe/{pqm_uninit} (in amdgpu)",
    ].as_slice()
    } {
        if !khooks.contains(want) {
            kproblems.push(format!("want `{want}`"));
        }
    }
    if !kbad.is_empty() {
        kproblems.push(format!("non-JSON lines: {kbad:?}"));
    }
    if k_norm != s_norm {
        kproblems.push(format!(
            "syscall layer printed {s_norm:?}\nkprobes printed {k_norm:?}"
        ));
    }
    let kreleased = kstats
        .as_ref()
        .and_then(|s| s["unreported"]["kfd_release_no_queues"].as_u64());
    let want_k = if module_btf {
        (Some(7), Some(0), Some(1))
    } else {
        (Some(6), Some(0), None)
    };
    if (k(&kstats, "emitted"), k(&kstats, "dropped"), kreleased) != want_k {
        kproblems.push(format!(
            "emitted {:?} dropped {:?} kfd_release_no_queues {kreleased:?}: want {want_k:?} (cgroup, 4 calls, exit, \
             pqm_uninit where hooked; 0 dropped; the teardown seen where hooked)",
            k(&kstats, "emitted"),
            k(&kstats, "dropped")
        ));
    }
    c.push(Check::new(
        "f.deep_kprobe",
        "--deep-attach kprobe: every deep hook on its kprobe fallback, the same events, the teardown seen",
        kproblems.is_empty(),
        if kproblems.is_empty() { khooks } else { format!("{}: {}", kproblems.join("; "), kstderr.trim()) },
    ));

    // The client's process teardown, seen in the driver.
    let released = ds
        .as_ref()
        .and_then(|s| s["unreported"]["kfd_release_no_queues"].as_u64());
    if module_btf {
        c.push(Check::new(
            "f.deep_release",
            "fentry/pqm_uninit sees the driver tear down the client's KFD process when it exits",
            released == Some(1),
            format!("kfd_release_no_queues {released:?} (want 1: the client opened /dev/kfd, created no queue, exited)"),
        ));
    } else {
        // No offsets into the driver's structures: the queues end at process exit (implicit),
        // and the teardown hook is refused with its reason.
        let refused = stderr.contains(NO_MODULE_BTF_REFUSALS[3]);
        c.push(Check::new(
            "f.deep_release",
            "before 5.11: the teardown hook refused for want of module BTF (queues end at process exit), no teardown record",
            refused && released.is_none(),
            format!("refusal printed: {refused}; kfd_release_no_queues {released:?} (want none)"),
        ));
    }
}

/// gpu_ext's scheduling hooks (issue 3): nvlab defines them and calls them with its own values
/// (hardware TSG ids 1, 2, …, timeslice 3000 µs, runlist 13, interleave MEDIUM); the same
/// nvdev calls as `b.nvdev`, traced with the deep hooks.
fn judge_gpu_ext(r: &Results, c: &mut Vec<Check>, id: &'static str, run: &str) {
    let title = if run == "nvdev_gx" {
        "gpu_ext hooks (stand-in in nvlab): found, attached (fentry with module BTF, else kprobe), \
         their hardware TSG ids and RM values added to the RM calls' events, nothing reported twice"
    } else {
        "gpu_ext hooks with --deep-attach kprobe: the same, through kprobes"
    };
    if r.find("test_module", &[("name", "nvlab")])
        .and_then(|m| m.get("loaded").map(str::to_owned))
        != Some("yes".into())
    {
        c.push(Check::fail(id, title, "the nvlab module was not loaded"));
        return;
    }
    let stderr = r
        .block(&format!("{run}.stderr"))
        .map(|b| b.text.clone())
        .unwrap_or_default();
    let hooks = hooks_line(&stderr);
    let mut problems = Vec::new();
    let funcs = "nv_gpu_sched_task_init,nv_gpu_sched_bind,nv_gpu_sched_token_request,nv_gpu_sched_task_destroy";
    // nvlab has BTF where the kernel headers carry vmlinux's (6.12): fentry there, unless
    // kprobes are asked for; else the kprobe path, with the trampoline refusal said.
    let btf = r.fact("nvlab_btf").is_some_and(|v| v != "absent");
    let want = if btf && run == "nvdev_gx" {
        format!("NVIDIA gpu_ext hooks → fentry/{{{funcs}}} (nvlab BTF)")
    } else {
        format!("NVIDIA gpu_ext hooks → kprobe/{{{funcs}}} (in nvlab)")
    };
    if !hooks.contains(&want) {
        problems.push(format!("want `{want}` (nvlab BTF: {btf})"));
    }
    if !(stderr.contains("fentry/nv_gpu_sched_task_init") || (btf && run == "nvdev_gx")) {
        problems.push("want the refused trampoline reported".into());
    }
    let pid = r
        .sub(&format!("{run}.client"))
        .find("nvdev", &[])
        .and_then(|f| f.int("pid"));
    let events = run_events(r, run, &mut problems);
    let mine = events_of(&events, pid);
    let brief: Vec<String> = mine.iter().map(|e| event_brief(e)).collect();
    // Two TSGs: the hook's ids (hw_tsg), not the RM handles; the first one scheduled.
    let inits: Vec<&&serde_json::Value> =
        mine.iter().filter(|e| e["event"] == "TASK_INIT").collect();
    let hw: Vec<u64> = inits
        .iter()
        .filter(|e| e["task"]["kind"] == "hw_tsg")
        .filter_map(|e| e["task"]["value"].as_u64())
        .collect();
    if hw.len() != 2 || hw[0] == hw[1] {
        problems.push(format!(
            "want two TASK_INITs named by distinct hardware TSG ids: {brief:?}"
        ));
    }
    if !inits
        .iter()
        .all(|e| e["timeslice_us"] == 3000 && e["timeslice_source"] == "driver_hook")
    {
        problems.push(format!(
            "want the driver's timeslice 3000 µs (source driver_hook) on both TASK_INITs: {inits:?}"
        ));
    }
    let sched: Vec<&&serde_json::Value> =
        mine.iter().filter(|e| e["event"] == "SCHEDULE").collect();
    let first = hw.first().copied();
    if sched.len() != 1
        || sched[0]["task"]["kind"] != "hw_tsg"
        || sched[0]["task"]["value"].as_u64() != first
        || sched[0]["channels"] != 0
        || sched[0]["timeslice_us"] != 3000
        || sched[0]["interleave"] != "MEDIUM"
        || sched[0]["allowed"] != true
    {
        problems.push(format!(
            "want one SCHEDULE of hw_tsg {first:?} with RM's channels 0, timeslice 3000, interleave MEDIUM, allowed: {sched:?}"
        ));
    }
    let destroyed: Vec<u64> = mine
        .iter()
        .filter(|e| {
            e["event"] == "TASK_DESTROY" && e["task"]["kind"] == "hw_tsg" && e["cause"] == "free"
        })
        .filter_map(|e| e["task"]["value"].as_u64())
        .collect();
    if destroyed != hw {
        problems.push(format!(
            "want both TSGs destroyed (free) under their hardware ids: {brief:?}"
        ));
    }
    let stats = events.iter().find(|e| e["event"] == "STATS");
    let unmatched = stats
        .and_then(|s| s["unreported"]["gpu_ext_unmatched"].as_u64())
        .unwrap_or(0);
    let emitted = stats.and_then(|s| s["kernel"]["emitted"].as_u64());
    // `emitted` counts every record kind (issue 11): the 7 RM records, one record per gpu_ext
    // hook that ran, and the client's close and exit notices: at least 9.
    // lab/client.c allocates its RM client first (nvlab refuses calls on an unknown client), so
    // gpu-trace saw every object of the process made: no PRETRACE_END (late attach,
    // docs/events.md), only the 5 events of the TSGs.
    let pretrace = mine.iter().filter(|e| e["event"] == "PRETRACE_END").count();
    let task_events = mine.len() - pretrace;
    if unmatched != 0 || emitted.is_none_or(|e| e < 9) || task_events != 5 || pretrace != 0 {
        problems.push(format!(
            "want every hook taken up by its call (gpu_ext_unmatched {unmatched}), 7 RM records + \
             hook records + 2 notices (emitted {emitted:?}), 5 task events (got {task_events}) and \
             no PRETRACE_END: the client was allocated under tracing (got {pretrace})"
        ));
    }
    c.push(Check::new(
        id,
        title,
        problems.is_empty(),
        if problems.is_empty() {
            format!("{hooks}; {}", brief.join(", "))
        } else {
            format!("{}: {}", problems.join("; "), stderr.trim())
        },
    ));
}

/// The calls of lab/client.c `cmd_nvobj`, in order, with the RM status nvlab must answer each
/// (read off client.c and RM's source, open-gpu-kernel-modules 595.45.04: resserv's
/// clientValidateNewResourceHandle, rmapi/alloc_free.c's parent checks, serverControl's and
/// serverFreeResourceTree's lookups; the codes from nvstatuscodes.h). The syscall returns 0 for
/// each: RM reports in `status`.
const NVOBJ_CALLS: [(&str, i64); 20] = [
    ("alloc_client", 0),
    ("alloc_device", 0),
    ("alloc_tsg", 0),
    ("alloc_tsg_again", 0x19),        // NV_ERR_INSERT_DUPLICATE_NAME
    ("alloc_tsg_under_client", 0x36), // NV_ERR_INVALID_OBJECT_PARENT: a TSG's parent is a device
    ("alloc_channel_a", 0),
    ("alloc_channel_b", 0),
    ("alloc_channel_unknown_parent", 0x57), // NV_ERR_OBJECT_NOT_FOUND
    ("get_info", 0),
    ("schedule", 0),
    ("token_a", 0),
    ("token_b", 0),
    ("token_unknown", 0x57),       // NV_ERR_OBJECT_NOT_FOUND
    ("free_unknown_client", 0x33), // NV_ERR_INVALID_OBJECT_HANDLE
    ("free_unknown_handle", 0),    // RS_COMPATABILITY_MODE: NV_OK, nothing freed
    ("free_channel_a", 0),
    ("schedule_again", 0),
    ("free_tsg", 0),
    ("token_b_after_free", 0x57), // channel B went with its TSG
    ("free_client", 0),
];

/// nvlab as an RM of its own (issue 20, finding 2): the `nvobj` client's calls, traced with the
/// gpu_ext hooks. The oracle is what the module answered as the client received it (its printed
/// statuses, the TSG id of GET_INFO, the two tokens), never gpu-trace's output.
fn judge_nvobj(r: &Results, c: &mut Vec<Check>) {
    let id = "g.nvobj";
    let title = "nvlab as an independent RM (objects, refusals, its own TSG id and work-submit \
                 tokens): gpu-trace's events name the module's TSG id, its channel count and the \
                 tokens the client received, and nothing for the refused calls";
    if r.find("test_module", &[("name", "nvlab")])
        .and_then(|m| m.get("loaded").map(str::to_owned))
        != Some("yes".into())
    {
        c.push(Check::fail(id, title, "the nvlab module was not loaded"));
        return;
    }
    let Some(run) = r
        .find("nvobj", &[])
        .filter(|f| f.get("tracer_ready").is_some())
    else {
        c.push(Check::fail(id, title, "the guest did not run nvobj"));
        return;
    };
    let mut problems = Vec::new();
    tracer_problems(r, "nvobj", &run, &mut problems);
    // What the module answered, as the client received it.
    let client = r.sub("nvobj.client");
    let lines: Vec<Fields> = client
        .lines
        .iter()
        .map(|l| Fields::parse(l))
        .filter(|f| f.topic == "nvobj")
        .collect();
    let pid = lines.iter().find_map(|f| f.int("pid"));
    let calls: Vec<&Fields> = lines.iter().filter(|f| f.get("call").is_some()).collect();
    let got: Vec<(&str, Option<i64>, Option<i64>)> = calls
        .iter()
        .map(|f| (f.get("call").unwrap_or("?"), f.int("rc"), f.int("status")))
        .collect();
    let want: Vec<(&str, Option<i64>, Option<i64>)> = NVOBJ_CALLS
        .iter()
        .map(|(name, st)| (*name, Some(0), Some(*st)))
        .collect();
    if got != want {
        problems.push(format!(
            "the module's answers (call, rc, status) {got:?}, want {want:?}"
        ));
    }
    let call = |name: &str| calls.iter().find(|f| f.get("call") == Some(name));
    let tsg = call("get_info").and_then(|f| f.int("tsg_id"));
    let token = |name: &str| call(name).and_then(|f| f.int("token"));
    let (token_a, token_b) = (token("token_a"), token("token_b"));
    let unset = Some(0xffff_ffff);
    if tsg.is_none() || tsg == Some(0) || tsg == unset {
        problems.push(format!("GET_INFO gave no hardware TSG id: {tsg:?}"));
    }
    if token_a.is_none() || token_a == unset || token_b == unset || token_a == token_b {
        problems.push(format!(
            "want two distinct tokens written by the module: {token_a:?}, {token_b:?}"
        ));
    }
    for name in ["token_unknown", "token_b_after_free"] {
        if token(name) != unset {
            problems.push(format!(
                "{name}: a refused request wrote a token {:?}",
                token(name)
            ));
        }
    }
    // gpu-trace's events of the client, in order: exactly these six.
    let events = run_events(r, "nvobj", &mut problems);
    let mine = events_of(&events, pid);
    let tsg_u = tsg.and_then(|t| u64::try_from(t).ok());
    let named = |e: &serde_json::Value| {
        e["task"]["kind"] == "hw_tsg" && e["task"]["value"].as_u64() == tsg_u
    };
    let submit = |e: &serde_json::Value, token: Option<i64>, handle: u64| {
        e["event"] == "WORK_SUBMIT"
            && named(e)
            && e["token"].as_i64() == token
            && e["channel_handle"].as_u64() == Some(handle)
    };
    type EventTest<'a> = &'a dyn Fn(&serde_json::Value) -> bool;
    let expected: [(&str, EventTest); 6] = [
        ("TASK_INIT of the module's TSG id", &|e| {
            e["event"] == "TASK_INIT" && named(e)
        }),
        ("SCHEDULE with the bind hook's 2 channels", &|e| {
            e["event"] == "SCHEDULE" && named(e) && e["channels"] == 2 && e["allowed"] == true
        }),
        (
            "WORK_SUBMIT of channel 0x5c000031 with the client's token_a",
            &|e| submit(e, token_a, 0x5c00_0031),
        ),
        (
            "WORK_SUBMIT of channel 0x5c000032 with the client's token_b",
            &|e| submit(e, token_b, 0x5c00_0032),
        ),
        ("SCHEDULE with 1 channel after the first was freed", &|e| {
            e["event"] == "SCHEDULE" && named(e) && e["channels"] == 1 && e["allowed"] == true
        }),
        ("TASK_DESTROY cause=free of the module's TSG id", &|e| {
            e["event"] == "TASK_DESTROY" && named(e) && e["cause"] == "free"
        }),
    ];
    let brief: Vec<String> = mine
        .iter()
        .map(|e| {
            format!(
                "{}{}",
                event_brief(e),
                if e["event"] == "WORK_SUBMIT" {
                    format!(" token={}", e["token"])
                } else if e["event"] == "SCHEDULE" {
                    format!(" channels={}", e["channels"])
                } else {
                    String::new()
                }
            )
        })
        .collect();
    if mine.len() != expected.len() || !mine.iter().zip(&expected).all(|(e, (_, ok))| ok(e)) {
        let wanted: Vec<&str> = expected.iter().map(|(what, _)| *what).collect();
        problems.push(format!(
            "gpu-trace's events of pid {pid:?}: {brief:?}; want exactly, in order: {wanted:?} \
             (module TSG id {tsg:?}, tokens {token_a:?}, {token_b:?}); nothing for the refused \
             calls"
        ));
    }
    let stats = events.iter().find(|e| e["event"] == "STATS");
    let unmatched = stats.and_then(|s| s["unreported"]["gpu_ext_unmatched"].as_u64());
    let k = |name: &str| stats.and_then(|s| s["kernel"][name].as_u64());
    if stats.is_none()
        || unmatched.is_some_and(|n| n != 0)
        || (k("dropped"), k("read_failed")) != (Some(0), Some(0))
    {
        problems.push(format!(
            "want a STATS line, every gpu_ext hook taken up by its call (gpu_ext_unmatched \
             {unmatched:?}) and nothing dropped ({:?}) or unread ({:?})",
            k("dropped"),
            k("read_failed")
        ));
    }
    c.push(Check::judged(id, title, &problems, || {
        format!(
            "the module answered {} calls as RM would (TSG id {}, tokens {}, {}); gpu-trace: {}",
            calls.len(),
            tsg.unwrap_or(-1),
            token_a.unwrap_or(-1),
            token_b.unwrap_or(-1),
            brief.join(", ")
        )
    }));
}

fn judge_lsm(r: &Results, c: &mut Vec<Check>) {
    let f = r.with_key("lsm", "self_denied96");
    let counts = r.with_key("lsm", "program_denials");
    let Some(f) = f else {
        let lines: Vec<&String> = r
            .lines
            .iter()
            .filter(|l| l.starts_with("LAB lsm"))
            .collect();
        c.push(Check::fail(
            "e.lsm",
            "BPF LSM program on file_ioctl loads, runs and denies",
            format!("{lines:?}"),
        ));
        return;
    };
    let want = [
        ("self_before", -EINVAL),
        ("self_denied96", -EPERM),
        ("self_denied88", -EPERM),
        ("self_get_version", 0),
        ("other_process", -EINVAL),
        ("self_after_detach", -EINVAL),
    ];
    let mut problems: Vec<String> = want
        .iter()
        .filter(|(k, v)| f.int(k) != Some(*v))
        .map(|(k, v)| format!("{k} {} (want {v})", f.get(k).unwrap_or("?")))
        .collect();
    let denials = counts.as_ref().and_then(|c| c.int("program_denials"));
    if denials != Some(2) {
        problems.push(format!("program counted {denials:?} denials (want 2)"));
    }
    c.push(Check::judged(
        "e.lsm",
        "BPF LSM on file_ioctl: loads, runs, denies CREATE_QUEUE for one process only, detaches",
        &problems,
        || {
            format!(
                "denied process got EPERM (both sizes), another process and GET_VERSION unaffected, EINVAL again after detach; program ran {} times",
                counts.as_ref().and_then(|c| c.get("program_calls")).unwrap_or("?")
            )
        },
    ));
}

/// `gpu-trace --deny-pid` (issue 4) as lab/init.sh `deny_trace` runs it: a denied client, an
/// identical other client, then a new process given the denied PID.
fn judge_deny(r: &Results, c: &mut Vec<Check>) {
    let nv_title = "--deny-pid refuses GPFIFO_SCHEDULE (nvlab; direct, XFER-wrapped, channel-level, \
                    from another thread) for the denied process only, not for a later process \
                    with its PID";
    let amd_title = "--deny-pid refuses CREATE_QUEUE and an activating UPDATE_QUEUE on /dev/kfd for \
                     the denied process only, not for a later process with its PID";
    // Denials the kernel counts (`STATS kernel.denied`): four GPFIFO_SCHEDULEs; two
    // CREATE_QUEUEs and one UPDATE_QUEUE.
    const PID_ROLES: &[&str] = &["denied", "other", "reuse"];
    c.push(judge_deny_run(
        r,
        "deny_nv",
        "e.deny_nv",
        nv_title,
        4,
        PID_ROLES,
        Calls::Own,
        &deny_nv_expect,
    ));
    c.push(judge_deny_run(
        r,
        "deny_amd",
        "e.deny_amd",
        amd_title,
        3,
        PID_ROLES,
        Calls::Own,
        &deny_amd_expect,
    ));
    // Issue 26: what a denied process creates is denied, also after the creator exited; a
    // FINN-serialized schedule (bEnable unreadable) of a denied process is refused.
    c.push(judge_deny_run(
        r,
        "deny_fork_nv",
        "e.deny_fork_nv",
        "--deny-pid refuses GPFIFO_SCHEDULE (nvlab, every form) to a child the denied process \
         forked after gpu-trace started and that runs after its parent exited; not to the other \
         process's child nor to the PID's next owner's",
        4,
        PID_ROLES,
        Calls::ForkedChild,
        &deny_nv_expect,
    ));
    c.push(judge_deny_run(
        r,
        "deny_finn_nv",
        "e.deny_finn_nv",
        "--deny-pid refuses a FINN-serialized GPFIFO_SCHEDULE (bEnable unreadable: fail closed), \
         TSG direct and channel XFER-wrapped, shown as refused SCHEDULEs, and one sent with \
         _IOC_TYPE 0 (which the driver and nvlab accept); a plain disable passes",
        3,
        PID_ROLES,
        Calls::Own,
        &deny_finn_expect,
    ));
    // --deny-cgroup (issue 14): the cgroup is empty at start; a client enters it afterwards.
    const CGROUP_ROLES: &[&str] = &["denied", "other"];
    let in_cgroup = |expect: &'static DenyExpect| {
        move |c: &DenyClient, events: &[serde_json::Value], problems: &mut Vec<String>| {
            expect(c, events, problems);
            // Every event of the client that joined says which cgroup it ran in.
            if c.denied
                && let Some(e) = events.iter().find(|e| e["cgroup"]["path"] != "/gt-denied")
            {
                problems.push(format!("denied client: an event not in /gt-denied: {e}"));
            }
        }
    };
    if !has_cgroup_ancestor(r) {
        for (name, id) in [
            ("deny_cgroup_nv", "e.deny_cgroup_nv"),
            ("deny_cgroup_amd", "e.deny_cgroup_amd"),
        ] {
            c.push(judge_deny_cgroup_refused(r, name, id));
        }
        return;
    }
    c.push(judge_deny_run(
        r,
        "deny_cgroup_nv",
        "e.deny_cgroup_nv",
        "--deny-cgroup refuses GPFIFO_SCHEDULE (nvlab, every form) to a process that entered \
         the cgroup after gpu-trace started, not to one outside",
        4,
        CGROUP_ROLES,
        Calls::Own,
        &in_cgroup(&deny_nv_expect),
    ));
    c.push(judge_deny_run(
        r,
        "deny_cgroup_amd",
        "e.deny_cgroup_amd",
        "--deny-cgroup refuses CREATE_QUEUE and an activating UPDATE_QUEUE on /dev/kfd to a \
         process that entered the cgroup after gpu-trace started, not to one outside",
        3,
        CGROUP_ROLES,
        Calls::Own,
        &in_cgroup(&deny_amd_expect),
    ));
}

/// `bpf_get_current_ancestor_cgroup_id` became callable from tracing and LSM programs in Linux
/// 5.14 ("bpf: Allow bpf_get_current_ancestor_cgroup_id for tracing"); Debian's 5.10 refuses it
/// (`unknown func`), 6.1 has it. The cgroup options need it.
const CGROUP_ANCESTOR_SINCE: (u32, u32) = (5, 14);

fn has_cgroup_ancestor(r: &Results) -> bool {
    r.fact("kernel")
        .and_then(gpu_trace::probe::kernel::KernelVersion::parse)
        .is_none_or(|v| (v.major, v.minor) >= CGROUP_ANCESTOR_SINCE)
}

/// A `--deny-cgroup` run on a kernel without the helper: gpu-trace stops at start-up with exit
/// 3 and names the helper and the release that has it; nothing was refused, so every call of
/// both clients reached the driver (no rc -1, EPERM).
fn judge_deny_cgroup_refused(r: &Results, name: &str, id: &'static str) -> Check {
    let mut problems = Vec::new();
    let (stderr, exit) = tracer_outcome(r, name);
    if exit != Some(3) {
        problems.push(format!("tracer exit {exit:?}, want 3 (cannot trace here)"));
    }
    for want in ["bpf_get_current_ancestor_cgroup_id", "Linux 5.14"] {
        if !stderr.contains(want) {
            problems.push(format!("want the reason to name `{want}`"));
        }
    }
    let mut calls = 0;
    for role in ["denied", "other"] {
        let out = Results::parse(
            &r.block(&format!("{name}.{role}"))
                .map(|b| b.text.clone())
                .unwrap_or_default(),
        );
        for f in out.lines.iter().map(|l| Fields::parse(l)) {
            if let Some(rc) = f.int("rc") {
                calls += 1;
                if rc == -EPERM {
                    problems.push(format!("{role} client: a call refused with EPERM: {f:?}"));
                }
            }
        }
    }
    if calls == 0 {
        problems.push("the clients reported no call".into());
    }
    Check::judged(
        id,
        "before 5.14: --deny-cgroup refused at start-up (exit 3) naming the missing helper; nothing denied",
        &problems,
        || {
            format!(
                "exit 3: {}; {calls} client calls reached the driver",
                stderr.trim()
            )
        },
    )
}

/// What one client of a deny run saw, and whether it was the one denied.
struct DenyClient<'a> {
    role: &'static str,
    denied: bool,
    out: &'a Results,
}

type DenyExpect = dyn Fn(&DenyClient, &[serde_json::Value], &mut Vec<String>);

/// How a deny run's clients make their calls.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Calls {
    /// The client process itself.
    Own,
    /// A child the client forked, which made its calls after the client had exited
    /// (`fork-SUB`): its events are the child's, its denial inherited.
    ForkedChild,
}

#[allow(clippy::too_many_arguments)]
fn judge_deny_run(
    r: &Results,
    name: &str,
    id: &'static str,
    title: &'static str,
    denials: u64,
    roles: &[&'static str],
    calls: Calls,
    expect: &DenyExpect,
) -> Check {
    let Some(run) = r
        .find(name, &[])
        .filter(|f| f.get("tracer_ready").is_some())
    else {
        return Check::fail(id, title, format!("the guest did not run {name}"));
    };
    let mut problems = Vec::new();
    tracer_problems(r, name, &run, &mut problems);
    let denied_pid = run.int("denied_pid");
    let events = run_events(r, name, &mut problems);
    let outputs: Vec<(&'static str, Results)> = roles
        .iter()
        .copied()
        .map(|role| {
            let text = r
                .block(&format!("{name}.{role}"))
                .map(|b| b.text.clone())
                .unwrap_or_default();
            (role, Results::parse(&text))
        })
        .collect();
    for (role, out) in &outputs {
        let pid = out
            .lines
            .iter()
            .map(|l| Fields::parse(l))
            .find_map(|f| f.int("pid"));
        // The clients print their pid in their first line (`wait pid=`, `nvdev pid=`, ...).
        let is_denied_pid = pid.is_some() && pid == denied_pid;
        match *role {
            "denied" | "reuse" if !is_denied_pid => problems.push(format!(
                "the {role} client's pid {pid:?} is not the denied pid {denied_pid:?}{}",
                if *role == "reuse" {
                    " (the PID was not reused: ns_last_pid raced)"
                } else {
                    ""
                }
            )),
            "other" if is_denied_pid => problems.push("the other client has the denied pid".into()),
            _ => {}
        }
        // The process whose calls these are: the client, or the child it forked.
        let caller = match calls {
            Calls::Own => pid,
            Calls::ForkedChild => {
                let child = out.with_key("fork_child", "reparented");
                let parent = out.find("fork_parent", &[]);
                match (child, parent) {
                    (Some(ch), Some(pa))
                        if ch.int("parent") == pid
                            && pa.int("child") == ch.int("pid")
                            && ch.get("reparented") == Some("1") =>
                    {
                        ch.int("pid")
                    }
                    (ch, pa) => {
                        problems.push(format!(
                            "the {role} client's child: want it forked by pid {pid:?} and run \
                             after its parent exited (reparented=1), got parent line {:?}, child \
                             line {:?}",
                            pa.map(|f| f.kv.clone()),
                            ch.map(|f| f.kv.clone())
                        ));
                        None
                    }
                }
            }
        };
        let client = DenyClient {
            role,
            denied: *role == "denied",
            out,
        };
        // The reuse client shares the denied pid; it runs as `lab-reuse` (its comm) to be told
        // apart.
        let comm = if *role == "reuse" {
            "lab-reuse"
        } else {
            "lab-client"
        };
        let mine: Vec<serde_json::Value> = events
            .iter()
            .filter(|e| e["event"] != "STATS" && e["pid"].as_i64() == caller && e["comm"] == comm)
            .cloned()
            .collect();
        expect(&client, &mine, &mut problems);
    }
    let stats = events.iter().find(|e| e["event"] == "STATS");
    let counted = stats.and_then(|s| s["kernel"]["denied"].as_u64());
    if counted != Some(denials) {
        problems.push(format!("STATS kernel.denied {counted:?}, want {denials}"));
    }
    Check::judged(id, title, &problems, || {
        format!(
            "denied pid {}: refused with EPERM before the driver, shown as SCHEDULE \
                 allowed=false errno=-1, {denials} denial(s) counted by the kernel; the other \
                 process{} not refused",
            denied_pid.unwrap_or(-1),
            if roles.contains(&"reuse") {
                " and the PID's next owner were"
            } else {
                " was"
            }
        )
    })
}

/// The `nvdeny` client (lab/client.c): a TSG and a channel, then GPFIFO_SCHEDULE direct,
/// XFER-wrapped, at channel level and from a second thread. Denied: all four refused before the
/// driver (EPERM, the preset status left as it was) and shown as refused SCHEDULEs; the
/// allocations never. Not denied: all reach the module (NV_OK) and are allowed.
fn deny_nv_expect(c: &DenyClient, events: &[serde_json::Value], problems: &mut Vec<String>) {
    let call = |name: &str| c.out.find("nvdeny", &[("call", name)]);
    let rc_status = |name: &str| call(name).map(|f| (f.int("rc"), f.int("status")));
    let (want_sched, want_allowed, want_errno) = if c.denied {
        // Refused before the driver: the status the client preset stays.
        ((Some(-EPERM), Some(0xffff_ffff)), false, -EPERM)
    } else {
        ((Some(0), Some(0)), true, 0)
    };
    for name in [
        "schedule",
        "schedule_xfer",
        "schedule_channel",
        "schedule_thread",
    ] {
        if rc_status(name) != Some(want_sched) {
            problems.push(format!(
                "{} client: {name} (rc, status) {:?}, want {want_sched:?}",
                c.role,
                rc_status(name)
            ));
        }
    }
    for name in [
        "alloc_client",
        "alloc_device",
        "alloc_tsg",
        "alloc_channel",
        "free",
    ] {
        if rc_status(name) != Some((Some(0), Some(0))) {
            problems.push(format!(
                "{} client: {name} must not be denied: {:?}",
                c.role,
                rc_status(name)
            ));
        }
    }
    // One SCHEDULE per request; the channel-level one says so.
    let sched: Vec<&serde_json::Value> =
        events.iter().filter(|e| e["event"] == "SCHEDULE").collect();
    let right = |e: &&serde_json::Value| e["allowed"] == want_allowed && e["errno"] == want_errno;
    let via_channel = sched.iter().filter(|e| e["via_channel"] == true).count();
    if sched.len() != 4 || !sched.iter().all(right) || via_channel != 1 {
        problems.push(format!(
            "{} client: want 4 SCHEDULE allowed={want_allowed} errno={want_errno} (one via the \
             channel), got {sched:?}",
            c.role
        ));
    }
}

/// The `nvdeny-finn` client: FINN-serialized GPFIFO_SCHEDULEs on the TSG (direct) and on the
/// channel (XFER-wrapped), whose first byte is 0; an enabling schedule sent with `_IOC_TYPE` 0
/// (the driver ignores the type: so must nvlab and gpu-trace); then a plain disable. Denied: the
/// three schedules refused before the driver (EPERM, preset status kept) and shown as refused
/// SCHEDULEs (one via the channel); the disable reaches the module. Not denied: every call
/// reaches the module (NV_OK); the type-0 schedule is one allowed SCHEDULE, and a FINN schedule
/// that reached the driver gives no event (its bEnable is not known).
fn deny_finn_expect(c: &DenyClient, events: &[serde_json::Value], problems: &mut Vec<String>) {
    let rc_status = |name: &str| {
        c.out
            .find("nvdeny_finn", &[("call", name)])
            .map(|f| (f.int("rc"), f.int("status")))
    };
    let reached = (Some(0), Some(0));
    let sched_want = if c.denied {
        (Some(-EPERM), Some(0xffff_ffff))
    } else {
        reached
    };
    for name in [
        "schedule_finn",
        "schedule_finn_channel_xfer",
        "schedule_type0",
    ] {
        if rc_status(name) != Some(sched_want) {
            problems.push(format!(
                "{} client: {name} (rc, status) {:?}, want {sched_want:?}",
                c.role,
                rc_status(name)
            ));
        }
    }
    for name in [
        "alloc_client",
        "alloc_device",
        "alloc_tsg",
        "alloc_channel",
        "disable",
        "free",
    ] {
        if rc_status(name) != Some(reached) {
            problems.push(format!(
                "{} client: {name} must reach the driver: {:?}",
                c.role,
                rc_status(name)
            ));
        }
    }
    let sched: Vec<&serde_json::Value> =
        events.iter().filter(|e| e["event"] == "SCHEDULE").collect();
    let via_channel = sched.iter().filter(|e| e["via_channel"] == true).count();
    let (want, want_allowed, want_errno, want_channel) = if c.denied {
        (3, false, -EPERM, 1)
    } else {
        (1, true, 0, 0)
    };
    let right = |e: &&serde_json::Value| e["allowed"] == want_allowed && e["errno"] == want_errno;
    if sched.len() != want || !sched.iter().all(right) || via_channel != want_channel {
        problems.push(format!(
            "{} client: want {want} SCHEDULE allowed={want_allowed} errno={want_errno} \
             ({want_channel} via the channel), got {sched:?}",
            c.role
        ));
    }
    let disables = events
        .iter()
        .filter(|e| e["event"] == "SCHED_UPDATE" && e["allowed"] == true)
        .count();
    if disables != 1 {
        problems.push(format!(
            "{} client: want the disable as one allowed SCHED_UPDATE, got {disables}",
            c.role
        ));
    }
}

/// The `kfd-deny` client: both CREATE_QUEUE sizes and an UPDATE_QUEUE that activates a queue
/// are refused for the denied process (EPERM); the UPDATE_QUEUE that deactivates one never is;
/// without a GPU whatever reaches the driver fails there, never with EPERM.
fn deny_amd_expect(c: &DenyClient, events: &[serde_json::Value], problems: &mut Vec<String>) {
    let want = if c.denied { -EPERM } else { -EINVAL };
    let update = |name: &str| {
        c.out
            .find("kfd_deny", &[("call", name)])
            .and_then(|f| f.int("rc"))
    };
    let active = update("update_active");
    let inactive = update("update_inactive");
    let active_ok = if c.denied {
        active == Some(-EPERM)
    } else {
        active.is_some_and(|rc| rc != -EPERM)
    };
    if !active_ok || inactive.is_none_or(|rc| rc == -EPERM) {
        problems.push(format!(
            "{} client: UPDATE_QUEUE activating {active:?} (denied: want {}), deactivating \
             {inactive:?} (never EPERM)",
            c.role, -EPERM
        ));
    }
    for size in ["96", "88"] {
        let rc = c
            .out
            .find("kfd_create", &[("size", size)])
            .and_then(|f| f.int("rc"));
        if rc != Some(want) {
            problems.push(format!(
                "{} client: {size}-byte CREATE_QUEUE returned {rc:?}, want {want}",
                c.role
            ));
        }
    }
    let refused = events
        .iter()
        .filter(|e| e["event"] == "SCHEDULE" && e["allowed"] == false && e["errno"] == want)
        .count();
    if refused != 2 || events.iter().any(|e| e["event"] == "TASK_INIT") {
        problems.push(format!(
            "{} client: want 2 SCHEDULE allowed=false errno={want} and no TASK_INIT, got {events:?}",
            c.role
        ));
    }
}

pub(super) fn print_report(checks: &[Check], what: &str) {
    println!("\n=== gpu-trace lab verdict: {what} ===");
    for ch in checks {
        let tag = match ch.status {
            Status::Pass => "PASS",
            Status::Fail => "FAIL",
            Status::NotApplicable => "N/A ",
        };
        println!("{tag}  {:<14} {}\n      {}", ch.id, ch.title, ch.detail);
    }
    // One greppable line per failure after the report (the detail above says why).
    for ch in checks.iter().filter(|c| c.status == Status::Fail) {
        println!("FAILED: lab: {}: {}", ch.id, ch.title);
    }
    for ch in checks.iter().filter(|c| c.status == Status::NotApplicable) {
        println!("NOT APPLICABLE: lab: {what}: {}: {}", ch.id, ch.title);
    }
}

/// The overall verdict over every kernel's checks: an error (non-zero exit) on any FAIL.
pub(super) fn verdict(runs: &[Vec<Check>]) -> Result<()> {
    let count = |s| runs.iter().flatten().filter(|c| c.status == s).count();
    let (pass, fail, na) = (
        count(Status::Pass),
        count(Status::Fail),
        count(Status::NotApplicable),
    );
    let kernels = runs.len();
    let na = if na > 0 {
        format!(", {na} not applicable (the NOT APPLICABLE lines say which)")
    } else {
        String::new()
    };
    if fail > 0 {
        println!("lab: FAIL ({pass} passed, {fail} failed{na}; {kernels} kernel(s))");
        bail!("the lab failed {fail} check(s); the logs above say which and why");
    }
    println!("lab: PASS ({pass} passed{na}; {kernels} kernel(s))");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A results log exactly as a current guest wrote it: `cargo xtask lab --kernel 6.1` of this
    /// tree (Debian 6.1.0-56, 30 checks passed; refreshed on 2026-11-25 with issue 17's
    /// driver entry points, `lab.limits` and the `storm` runs), copied from
    /// `target/lab-cache/run/6.1.0-56-amd64/results.log` (the serial console's CRs removed).
    const GOOD: &str = include_str!("../../testdata/lab-6.1-results.log");

    fn statuses(text: &str) -> BTreeMap<&'static str, Status> {
        judge(&Results::parse(text))
            .into_iter()
            .map(|c| (c.id, c.status))
            .collect()
    }

    /// The checks of issue 26's `deny_fork` step, which the logs recorded before it lack.
    const DENY_FORK_CHECKS: [&str; 2] = ["e.deny_fork_nv", "e.deny_finn_nv"];

    /// Whether `id` is a check that `text` was recorded before (so it fails: the run is
    /// missing, and a missing run never passes).
    fn predates(text: &str, id: &str) -> bool {
        DENY_FORK_CHECKS.contains(&id) && !text.contains("LAB step deny_fork")
    }

    /// `judge` of `text` without the checks `text` was recorded before (for the tests of other
    /// checks that edit an older log).
    fn judge_recorded(text: &str) -> Vec<Check> {
        judge(&Results::parse(text))
            .into_iter()
            .filter(|c| !predates(text, c.id))
            .collect()
    }

    /// Every check of `text` passed (those it predates failed); its statuses.
    fn all_pass(text: &str) -> BTreeMap<&'static str, Status> {
        let s = statuses(text);
        for (id, st) in &s {
            if predates(text, id) {
                assert_eq!(*st, Status::Fail, "{id}");
                continue;
            }
            assert_eq!(
                *st,
                Status::Pass,
                "{id}: {:#?}",
                judge(&Results::parse(text))
            );
        }
        s
    }

    #[test]
    fn a_current_guest_log_passes_every_check() {
        assert_eq!(all_pass(GOOD).len(), 32);
    }

    /// Debian 11's kernel (5.10.0-46, upstream 5.10.262) as its guest wrote it: `cargo xtask
    /// lab --kernel 5.10` of this tree on 2026-11-26 (with issue 26's `deny_fork` step), 32
    /// checks passed, copied from
    /// `target/lab-cache/run/5.10.0-46-amd64/results.log` (CRs removed).
    const OLD: &str = include_str!("../../testdata/lab-5.10-results.log");

    #[test]
    fn an_old_kernel_passes_on_its_documented_fallbacks() {
        let s = all_pass(OLD);
        assert_eq!(s.len(), 32);
        // The same checks, not fewer: the ids are those of a current kernel's log.
        let current: Vec<_> = statuses(GOOD).into_keys().collect();
        assert_eq!(s.into_keys().collect::<Vec<_>>(), current);
    }

    #[test]
    fn the_fallbacks_are_asserted_not_skipped() {
        // The 5.10 log claimed by a kernel that has module BTF and the cgroup helper: every
        // check that accepted a fallback fails.
        let relabelled = OLD.replace("kernel=5.10.0-46-amd64", "kernel=6.1.0-56-amd64");
        let s = statuses(&relabelled);
        for id in [
            "a.module_btf",
            "d.fentry",
            "f.deep_select",
            "f.deep_events",
            "f.deep_kprobe",
            "f.deep_release",
            "e.deny_cgroup_nv",
            "e.deny_cgroup_amd",
        ] {
            assert_eq!(s[id], Status::Fail, "{id}");
        }
        // On 5.10 itself, each fallback is checked for what it must show.
        let cases = [
            // module BTF that 5.10 cannot have
            ("amdgpu_btf=absent", "amdgpu_btf=2095369", "a.module_btf"),
            // a handler missing from the kprobe fallback
            (
                "kprobe+kretprobe/{kfd_ioctl_destroy_queue,kfd_ioctl_update_queue,kfd_ioctl_set_cu_mask}",
                "kprobe+kretprobe/{kfd_ioctl_destroy_queue,kfd_ioctl_update_queue}",
                "f.deep_select",
            ),
            // the teardown refusal not printed
            (
                "(not used: AMD queue teardown: pqm_uninit: no module BTF to read offsets from)",
                "",
                "f.deep_release",
            ),
            // --deny-cgroup refused without naming the helper
            (
                "this kernel does not let these programs call bpf_get_current_ancestor_cgroup_id \
                 (bpf_get_current_ancestor_cgroup_id in tracing and LSM programs: Linux 5.14 and \
                 later), which --cgroup, --container, --deny-cgroup, --deny-container need",
                "BPF LSM programs need CONFIG_BPF_LSM=y",
                "e.deny_cgroup_nv",
            ),
            // ... or not refused at all
            (
                "LAB deny_cgroup_amd tracer_exit=3",
                "LAB deny_cgroup_amd tracer_exit=0",
                "e.deny_cgroup_amd",
            ),
        ];
        for (from, to, id) in cases {
            assert!(OLD.contains(from), "{from}");
            let broken = OLD.replace(from, to);
            assert_eq!(
                statuses(&broken)[id],
                Status::Fail,
                "{id} after {from:?} -> {to:?}"
            );
        }
    }

    /// A shipped feature that did not run fails its check: the guest's log as it would be had
    /// the feature's run been left out, or had the build refused it.
    #[test]
    fn a_feature_that_did_not_run_fails_never_skips() {
        let block = |name: &str| {
            let begin = GOOD.find(&format!("LAB-BEGIN {name}")).unwrap();
            let end_tag = format!("LAB-END {name} rc=");
            let end = GOOD[begin..].find(&end_tag).unwrap() + begin;
            let end = GOOD[end..].find('\n').unwrap() + end + 1;
            (begin, end)
        };
        let without = |name: &str| {
            let (b, e) = block(name);
            format!("{}{}", &GOOD[..b], &GOOD[e..])
        };
        // doctor: no block at all, or the block of a build without the subcommand.
        assert_eq!(statuses(&without("doctor"))["a.doctor"], Status::Fail);
        let (b, e) = block("doctor");
        let no_doctor = format!(
            "{}LAB-BEGIN doctor\nerror: unrecognized subcommand 'doctor'\nLAB-END doctor rc=2\n{}",
            &GOOD[..b],
            &GOOD[e..]
        );
        assert_eq!(statuses(&no_doctor)["a.doctor"], Status::Fail);
        // --deny-pid: the runs left out, or refused by the build.
        let mut no_deny = GOOD.to_string();
        no_deny.truncate(GOOD.find("LAB deny_nv tracer_ready").unwrap());
        no_deny.push_str(&GOOD[GOOD.find("LAB step kprobe").unwrap()..]);
        let s = statuses(&no_deny);
        assert_eq!(
            (s["e.deny_nv"], s["e.deny_amd"]),
            (Status::Fail, Status::Fail)
        );
        let refused = GOOD.replacen(
            "LAB deny_amd tracer_exit=0",
            "LAB deny_amd tracer_exit=3",
            1,
        );
        assert_ne!(refused, GOOD);
        assert_eq!(statuses(&refused)["e.deny_amd"], Status::Fail);
        // --deny-cgroup: refused by the build, or the client that joined the cgroup not refused,
        // or its events not naming the cgroup.
        let refused = GOOD.replacen(
            "LAB deny_cgroup_nv tracer_exit=0",
            "LAB deny_cgroup_nv tracer_exit=2",
            1,
        );
        assert_ne!(refused, GOOD);
        assert_eq!(statuses(&refused)["e.deny_cgroup_nv"], Status::Fail);
        let (b, e) = block("deny_cgroup_amd.jsonl");
        let elsewhere = format!(
            "{}{}{}",
            &GOOD[..b],
            GOOD[b..e].replace("\"path\":\"/gt-denied\"", "\"path\":\"/\""),
            &GOOD[e..]
        );
        assert_ne!(elsewhere, GOOD);
        assert_eq!(statuses(&elsewhere)["e.deny_cgroup_amd"], Status::Fail);
        let allowed = format!(
            "{}{}{}",
            &GOOD[..b],
            GOOD[b..e].replace("\"errno\":-1,", "\"errno\":-22,"),
            &GOOD[e..]
        );
        assert_ne!(allowed, GOOD);
        assert_eq!(statuses(&allowed)["e.deny_cgroup_amd"], Status::Fail);
        // --vendor amd refused by the build.
        let (b, e) = block("amd.probe");
        let no_amd = format!(
            "{}LAB-BEGIN amd.probe\ngpu-trace: AMD KFD tracing is not implemented yet in this build\nLAB-END amd.probe rc=3\n{}",
            &GOOD[..b],
            &GOOD[e..]
        );
        assert_eq!(statuses(&no_amd)["c.trace"], Status::Fail);
    }

    /// The deep-hook checks fail when the choice, the events or the teardown are wrong.
    #[test]
    fn deep_hook_checks_catch_a_wrong_choice_double_counting_and_a_missed_teardown() {
        let st = |text: &str, id: &str| statuses(text)[id];
        assert_eq!(st(GOOD, "f.deep_select"), Status::Pass);
        // The device queue manager's functions fell back to kprobes (six arguments: trampolines
        // work on both lab kernels), or an init_mqd copy was missed.
        let fallback = GOOD.replace(
            "AMD queue details → fexit/{create_queue_cpsch,create_queue_nocpsch}",
            "AMD queue details → kprobe+kretprobe/{create_queue_cpsch,create_queue_nocpsch}",
        );
        assert_eq!(st(&fallback, "f.deep_select"), Status::Fail);
        let missed_copy = GOOD.replace("init_mqd ×5/5", "init_mqd ×4/5");
        assert_ne!(missed_copy, GOOD);
        assert_eq!(st(&missed_copy, "f.deep_select"), Status::Fail);
        // The syscall layer attached as well: not the selection asked for.
        let both = GOOD.replace(
            "gpu-trace: (not used: ioctl+close: syscall layer not attached: the driver's own hooks serve every call, so unrelated syscalls pay nothing)\n",
            "",
        );
        assert_eq!(st(&both, "f.deep_select"), Status::Fail);
        // One call reported twice (the kernel emitted 8 where 7 records were sent), or an event that differs.
        let twice = GOOD.replacen("\"emitted\":7,\"fd_lookup_failed\":0,\"denied\":0},\"malformed\":0,\"decode_errors\":0,\"live_at_exit\":0,\"unreported\":{\"kfd_release", "\"emitted\":8,\"fd_lookup_failed\":0,\"denied\":0},\"malformed\":0,\"decode_errors\":0,\"live_at_exit\":0,\"unreported\":{\"kfd_release", 1);
        assert_ne!(twice, GOOD);
        assert_eq!(st(&twice, "f.deep_events"), Status::Fail);
        // Only the deep run's cu_mask event says another errno.
        let pat = "\"errno\":-14,\"via_channel\":false,\"amd\":{\"via\":\"cu_mask\"";
        let deep_at = GOOD.find("LAB-BEGIN ops_deep.jsonl").unwrap();
        let at = deep_at + GOOD[deep_at..].find(pat).unwrap();
        let differs = format!(
            "{}{}{}",
            &GOOD[..at],
            pat.replace("-14", "-22"),
            &GOOD[at + pat.len()..]
        );
        assert_eq!(st(&differs, "f.deep_events"), Status::Fail);
        assert_eq!(
            st(&differs, "f.deep_kprobe"),
            Status::Pass,
            "the kprobe run is another block"
        );
        // The kprobe run on a trampoline: not the fallback asked for.
        let kprobe_at = GOOD.find("LAB-BEGIN ops_kprobe.stderr").unwrap();
        let (head, tail) = GOOD.split_at(kprobe_at);
        let on_trampoline = format!(
            "{head}{}",
            tail.replacen(
                "AMD queue teardown → kprobe/{pqm_uninit}",
                "AMD queue teardown → fentry/{pqm_uninit}",
                1
            )
        );
        assert_eq!(st(&on_trampoline, "f.deep_kprobe"), Status::Fail);
        // A client call returned what the driver does not (the docs' EINVAL, EFAULT, EFAULT,
        // EINVAL), or the same event is missing from both runs (identical, but not the 3).
        let rc = edit_line(
            GOOD,
            "LAB-BEGIN ops_deep.client",
            &["call=update"],
            "rc=-14",
            "rc=-22",
        );
        assert_eq!(st(&rc, "f.deep_events"), Status::Fail);
        let mut gone = GOOD.to_string();
        for run in ["LAB-BEGIN ops_syscall.jsonl", "LAB-BEGIN ops_deep.jsonl"] {
            let line = edit_line(&gone, run, &["\"via\":\"cu_mask\""], "{", "\u{0}{");
            gone = line
                .split_inclusive('\n')
                .filter(|l| !l.starts_with('\u{0}'))
                .collect();
        }
        assert_eq!(st(&gone, "f.deep_events"), Status::Fail);
        // The teardown not seen.
        let missed = GOOD.replace("\"kfd_release_no_queues\":1,", "");
        assert_eq!(st(&missed, "f.deep_release"), Status::Fail);
        // gpu_ext: the hooks' values not added (the TSGs keep the assumed 1024 µs), or a hook
        // left unclaimed.
        assert_eq!(st(GOOD, "g.gpu_ext"), Status::Pass);
        let gx_start = GOOD.find("LAB nvdev_gx tracer_ready").unwrap();
        let (head, tail) = GOOD.split_at(gx_start);
        let assumed = format!(
            "{head}{}",
            tail.replacen("\"timeslice_us\":3000", "\"timeslice_us\":1024", 1)
        );
        assert_eq!(st(&assumed, "g.gpu_ext"), Status::Fail);
        let unclaimed = format!(
            "{head}{}",
            tail.replacen(
                "\"unreported\":{",
                "\"unreported\":{\"gpu_ext_unmatched\":1,",
                1
            )
        );
        assert_ne!(unclaimed, GOOD);
        assert_eq!(st(&unclaimed, "g.gpu_ext"), Status::Fail);
    }

    #[test]
    fn each_broken_fact_fails_its_check() {
        let cases = [
            ("LAB-DONE\n", "", "a.boot"),
            (
                "LAB step done",
                "LAB timeout what=lsm after=240s t=300.1\nLAB step done",
                "lab.limits",
            ),
            (
                "LAB fact lsm=lockdown,capability,landlock,yama,apparmor,bpf",
                "LAB fact lsm=lockdown,capability",
                "a.lsm",
            ),
            ("kprobe_pmu=6", "kprobe_pmu=absent", "a.kprobes"),
            ("amdgpu_btf=2095369", "amdgpu_btf=absent", "a.module_btf"),
            ("\"emitted\":8", "\"emitted\":7", "b.records"),
            ("\"allowed\":false", "\"allowed\":true", "b.records"),
            ("\"value\":1543503888", "\"value\":1543503889", "b.records"),
            ("nv tracer_exit=0", "nv tracer_exit=1", "b.load"),
            ("nvlab loaded=yes", "nvlab loaded=no", "b.nvdev"),
            (
                "call=free_b rc=0 status=0",
                "call=free_b rc=0 status=4294967295",
                "b.nvdev",
            ),
            ("\"allowed\":true", "\"allowed\":false", "b.nvdev"),
            (
                "\"cause\":\"free\",",
                "\"cause\":\"process_exit\",",
                "b.nvdev",
            ),
            (
                "\"value\":1543503889},\"client\":3251634177,\"engine\"",
                "\"value\":1543503890},\"client\":3251634177,\"engine\"",
                "b.nvdev",
            ),
            (
                "\"ignored\":0,\"emitted\":10,\"fd_lookup_failed\"",
                "\"ignored\":0,\"emitted\":11,\"fd_lookup_failed\"",
                "b.nvdev",
            ),
            (
                "size=88 cmd=0xc0584b02 rc=-22",
                "size=88 cmd=0xc0584b02 rc=-25",
                "c.driver",
            ),
            ("kprobe entry_hits=1", "kprobe entry_hits=0", "d.kprobe"),
            (
                "by_address_attached=5",
                "by_address_attached=4",
                "d.ambiguous",
            ),
            (
                "fentry entry_hits=1 gpu_id=0x4c4142",
                "fentry entry_hits=1 gpu_id=0x0",
                "d.fentry",
            ),
            ("self_denied88=-1", "self_denied88=-22", "e.lsm"),
            ("other_process=-22", "other_process=-1", "e.lsm"),
        ];
        for (from, to, id) in cases {
            assert!(GOOD.contains(from), "{from}");
            let broken = GOOD.replacen(from, to, 1);
            assert_eq!(
                statuses(&broken)[id],
                Status::Fail,
                "{from} → {to} must fail {id}"
            );
        }
    }

    /// The `--vendor amd` run's event lines in the guest's log (the STATS line excluded): the
    /// 96-byte and the 88-byte CREATE_QUEUE, both refused.
    fn amd_events() -> Vec<&'static str> {
        let at = GOOD.find("LAB-BEGIN amd.jsonl\n").unwrap() + "LAB-BEGIN amd.jsonl\n".len();
        let end = at + GOOD[at..].find("LAB-END amd.jsonl").unwrap();
        GOOD[at..end]
            .lines()
            .filter(|l| !l.contains("\"STATS\"") && !l.contains("\"INVENTORY\""))
            .collect()
    }

    /// The guest's log with the `--vendor amd` run's events replaced by `events`.
    fn with_amd_trace(events: &[&str]) -> String {
        let real = amd_events().join("\n") + "\n";
        let replaced = if events.is_empty() {
            String::new()
        } else {
            events.join("\n") + "\n"
        };
        assert!(GOOD.contains(&real));
        GOOD.replacen(&real, &replaced, 1)
    }

    #[test]
    fn amd_tracing_is_judged_on_the_events_of_the_real_run() {
        let real = amd_events();
        assert_eq!(real.len(), 2, "{real:?}");
        let (e96, e88) = (real[0], real[1]);
        let trace = |events: &[&str]| statuses(&with_amd_trace(events))["c.trace"];
        assert_eq!(trace(&[e96, e88]), Status::Pass);
        let pid = format!("\"pid\":{}", {
            let at = e96.find("\"pid\":").unwrap() + 6;
            &e96[at..at + e96[at..].find(',').unwrap()]
        });
        let broken = [
            ("\"errno\":-22".to_string(), "\"errno\":-1".to_string()),
            ("\"allowed\":false".into(), "\"allowed\":true".into()),
            (
                "\"kind\":\"kfd_no_queue\"".into(),
                "\"kind\":\"kfd_queue\",\"value\":0".into(),
            ),
            ("\"gpu_id\":4997442".into(), "\"gpu_id\":0".into()),
            ("\"priority\":7".into(), "\"priority\":0".into()),
            ("\"ring_size\":4096".into(), "\"ring_size\":1024".into()),
            (pid.clone(), "\"pid\":1".into()),
        ];
        for (from, to) in &broken {
            let bad = e96.replace(from, to);
            assert_ne!(bad, e96, "{from}");
            assert_eq!(trace(&[&bad, e88]), Status::Fail, "{from} → {to}");
        }
        assert_eq!(trace(&[e96]), Status::Fail, "one call missing");
        assert_eq!(
            trace(&[e96, e96]),
            Status::Fail,
            "the 88-byte form not told apart"
        );
        let init = e96.replace("\"event\":\"SCHEDULE\"", "\"event\":\"TASK_INIT\"");
        assert_eq!(trace(&[e96, e88, &init]), Status::Fail);
        let extra = edit_line(
            GOOD,
            "LAB-BEGIN amd.jsonl",
            &["STATS"],
            "\"emitted\":4",
            "\"emitted\":5",
        );
        assert_eq!(statuses(&extra)["c.trace"], Status::Fail);
    }

    #[test]
    fn doctor_is_judged_by_its_exit_code() {
        assert_eq!(statuses(GOOD)["a.doctor"], Status::Pass);
        let rc5 = GOOD.replacen("LAB-END doctor rc=0", "LAB-END doctor rc=5", 1);
        assert_ne!(rc5, GOOD);
        assert_eq!(statuses(&rc5)["a.doctor"], Status::Fail);
    }

    /// `text` with `from` replaced by `to` in the first line after `after` that holds every
    /// string of `has`.
    fn edit_line(text: &str, after: &str, has: &[&str], from: &str, to: &str) -> String {
        let start = text
            .find(after)
            .unwrap_or_else(|| panic!("{after} not in the log"));
        let mut at = start;
        for line in text[start..].split_inclusive('\n') {
            if has.iter().all(|h| line.contains(h)) && line.contains(from) {
                let edited = line.replacen(from, to, 1);
                return format!("{}{}{}", &text[..at], edited, &text[at + line.len()..]);
            }
            at += line.len();
        }
        panic!("no line with {has:?} and {from} after {after}");
    }

    #[test]
    fn deny_runs_are_judged_on_what_each_process_saw() {
        let s = statuses(GOOD);
        assert_eq!(
            (s["e.deny_nv"], s["e.deny_amd"]),
            (Status::Pass, Status::Pass)
        );
        // The PID the reuse run's process got in this log (a real run: it changes with the log).
        let reuse_pid: u32 = GOOD[GOOD.find("LAB-BEGIN deny_nv.reuse").unwrap()..]
            .lines()
            .find_map(|l| l.strip_prefix("LAB nvdeny pid="))
            .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
            .expect("the reuse run's pid line");
        let (reuse_from, reuse_to) = (format!("pid={reuse_pid}"), format!("pid={}", reuse_pid + 2));
        let cases: [(&str, &[&str], &str, &str, &str); 13] = [
            // The denied schedule reached the driver.
            (
                "LAB-BEGIN deny_nv.denied",
                &["call=schedule"],
                "status=4294967295",
                "status=0",
                "e.deny_nv",
            ),
            // The XFER-wrapped, channel-level or other thread's schedule reached the driver.
            (
                "LAB-BEGIN deny_nv.denied",
                &["call=schedule_xfer"],
                "status=4294967295",
                "status=0",
                "e.deny_nv",
            ),
            (
                "LAB-BEGIN deny_nv.denied",
                &["call=schedule_channel"],
                "rc=-1 ",
                "rc=0 ",
                "e.deny_nv",
            ),
            (
                "LAB-BEGIN deny_nv.denied",
                &["call=schedule_thread"],
                "status=4294967295",
                "status=0",
                "e.deny_nv",
            ),
            // The activating UPDATE_QUEUE of the denied process reached the driver.
            (
                "LAB-BEGIN deny_amd.denied",
                &["call=update_active"],
                "rc=-1",
                "rc=-22",
                "e.deny_amd",
            ),
            // The next owner of the PID was denied too.
            (
                "LAB-BEGIN deny_nv.jsonl",
                &["SCHEDULE", "lab-reuse"],
                "\"allowed\":true",
                "\"allowed\":false",
                "e.deny_nv",
            ),
            // The PID was not reused.
            (
                "LAB-BEGIN deny_nv.reuse",
                &["LAB nvdeny pid="],
                &reuse_from,
                &reuse_to,
                "e.deny_nv",
            ),
            // The other process was denied.
            (
                "LAB-BEGIN deny_amd.other",
                &["size=96"],
                "rc=-22",
                "rc=-1",
                "e.deny_amd",
            ),
            // gpu-trace did not show the refusal (the denied process's first call shown allowed).
            (
                "LAB-BEGIN deny_amd.jsonl",
                &["lab-client"],
                "\"errno\":-1",
                "\"errno\":-22",
                "e.deny_amd",
            ),
            // The tracer failed.
            (
                "LAB deny_amd tracer_exit",
                &["tracer_exit"],
                "tracer_exit=0",
                "tracer_exit=1",
                "e.deny_amd",
            ),
            (
                "LAB deny_nv tracer_ready",
                &["tracer_ready"],
                "tracer_ready=yes",
                "tracer_ready=no",
                "e.deny_nv",
            ),
            // The kernel counted another number of denials.
            (
                "LAB-BEGIN deny_nv.jsonl",
                &["STATS"],
                "\"denied\":4}",
                "\"denied\":3}",
                "e.deny_nv",
            ),
            (
                "LAB-BEGIN deny_amd.jsonl",
                &["STATS"],
                "\"denied\":3}",
                "\"denied\":2}",
                "e.deny_amd",
            ),
        ];
        for (after, has, from, to, id) in cases {
            let broken = edit_line(GOOD, after, has, from, to);
            assert_eq!(
                statuses(&broken)[id],
                Status::Fail,
                "{from} → {to} after {after} must fail {id}"
            );
        }
    }

    /// `g.nvobj` compares gpu-trace's events with what nvlab answered as the client received
    /// it: each planted disagreement in the real guest log fails the check.
    #[test]
    fn nvobj_is_judged_against_what_the_client_received() {
        assert_eq!(statuses(GOOD)["g.nvobj"], Status::Pass);
        // The module's answers in this log (a real run: they change with the log).
        let client_value = |call: &str, key: &str| -> u64 {
            let at = GOOD.find("LAB-BEGIN nvobj.client").unwrap();
            GOOD[at..]
                .lines()
                .find(|l| l.contains(&format!("call={call} ")))
                .and_then(|l| {
                    l.split_whitespace()
                        .find_map(|kv| kv.strip_prefix(&format!("{key}=")))
                })
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("{call} {key} in the log"))
        };
        let (tsg, token_a, token_b) = (
            client_value("get_info", "tsg_id"),
            client_value("token_a", "token"),
            client_value("token_b", "token"),
        );
        let token = |t: u64| format!("token={t}");
        let json_token = |t: u64| format!("\"token\":{t}");
        let hw = |t: u64| format!("\"task\":{{\"kind\":\"hw_tsg\",\"value\":{t}}}");
        let cases: [(&str, &[&str], String, String); 10] = [
            // The token the client received differs from the one gpu-trace printed.
            (
                "LAB-BEGIN nvobj.client",
                &["call=token_a "],
                token(token_a),
                token(token_a + 1),
            ),
            (
                "LAB-BEGIN nvobj.jsonl",
                &["WORK_SUBMIT"],
                json_token(token_b),
                json_token(token_b + 0x10000),
            ),
            // The module's TSG id (GET_INFO) is not the one the events name.
            (
                "LAB-BEGIN nvobj.client",
                &["call=get_info "],
                format!("tsg_id={tsg}"),
                format!("tsg_id={}", tsg + 1),
            ),
            (
                "LAB-BEGIN nvobj.jsonl",
                &["TASK_INIT"],
                hw(tsg),
                "\"task\":{\"kind\":\"tsg\",\"value\":1543503920}".into(),
            ),
            // The bind hook's channel count not in the SCHEDULE, or not decremented on free.
            (
                "LAB-BEGIN nvobj.jsonl",
                &["SCHEDULE"],
                "\"channels\":2".into(),
                "\"channels\":0".into(),
            ),
            (
                "LAB-BEGIN nvobj.jsonl",
                &["SCHEDULE", "\"channels\":1"],
                "\"channels\":1".into(),
                "\"channels\":2".into(),
            ),
            // The module accepted what RM refuses.
            (
                "LAB-BEGIN nvobj.client",
                &["call=alloc_tsg_again "],
                "status=25 ".into(),
                "status=0 ".into(),
            ),
            (
                "LAB-BEGIN nvobj.client",
                &["call=free_unknown_client "],
                "status=51 ".into(),
                "status=0 ".into(),
            ),
            (
                "LAB-BEGIN nvobj.client",
                &["call=token_unknown "],
                "token=4294967295".into(),
                "token=851971".into(),
            ),
            // The tracer did not run.
            (
                "LAB nvobj tracer_ready",
                &["tracer_ready"],
                "tracer_ready=yes".into(),
                "tracer_ready=no".into(),
            ),
        ];
        for (after, has, from, to) in &cases {
            let broken = edit_line(GOOD, after, has, from, to);
            assert_ne!(broken, GOOD);
            assert_eq!(
                statuses(&broken)["g.nvobj"],
                Status::Fail,
                "{from} → {to} after {after} must fail g.nvobj"
            );
        }
        // A TASK_DESTROY for the refused free (the TSG's line once more, before its real one).
        let at = GOOD.find("LAB-BEGIN nvobj.jsonl").unwrap();
        let line = GOOD[at..]
            .lines()
            .find(|l| l.contains("\"event\":\"TASK_DESTROY\""))
            .unwrap();
        let twice = GOOD.replacen(line, &format!("{line}\n{line}"), 1);
        assert_ne!(twice, GOOD);
        assert_eq!(statuses(&twice)["g.nvobj"], Status::Fail);
        // The run left out of the guest's scenario.
        let (b, e) = (
            GOOD.find("LAB nvobj tracer_ready").unwrap(),
            GOOD.find("LAB-END nvobj.jsonl").unwrap(),
        );
        let without = format!("{}{}", &GOOD[..b], &GOOD[e..]);
        assert_eq!(statuses(&without)["g.nvobj"], Status::Fail);
    }

    #[test]
    fn the_verdict_fails_when_any_kernel_fails() {
        let good = || judge_recorded(GOOD);
        assert!(verdict(&[good(), good()]).is_ok());
        assert!(verdict(&[good(), judge(&Results::parse(""))]).is_err());
        let one_failed = GOOD.replacen("LAB-DONE\n", "", 1);
        assert!(verdict(&[judge(&Results::parse(&one_failed))]).is_err());
    }

    #[test]
    fn an_unfinished_scenario_names_its_last_step() {
        let cut = &GOOD[..GOOD.find("LAB step lsm").unwrap()];
        let checks = judge(&Results::parse(cut));
        let boot = checks.iter().find(|c| c.id == "a.boot").unwrap();
        assert_eq!(boot.status, Status::Fail);
        assert!(
            boot.detail.contains("the last step begun: fentry t="),
            "{}",
            boot.detail
        );
    }

    #[test]
    fn an_empty_log_fails_everything() {
        for (id, st) in statuses("") {
            assert_eq!(st, Status::Fail, "{id}");
        }
    }

    /// The doctor's AMD driver row of GOOD, and what it says on a kernel whose KFD cannot serve.
    const AMD_YES: &str = "AMD     driver                yes  KFD 1.11 (AMDKFD_IOC_GET_VERSION); 0 GPU node(s) in the KFD topology";

    #[test]
    fn a_kernel_without_kfd_asserts_why_and_the_amd_checks_are_not_applicable() {
        // Debian's arm64 kernels: amdgpu without KFD (CONFIG_HSA_AMD not set).
        let no_kfd = GOOD
            .replace(
                "LAB fact kfd=present dev=f3:0 proc_devices_major=243",
                "LAB fact hsa_amd=n # CONFIG_HSA_AMD is not set\nLAB fact kfd=absent",
            )
            .replace(
                AMD_YES,
                "AMD     driver                no   amdgpu is loaded but /dev/kfd is missing",
            );
        passes_but(&no_kfd, &every_kfd_check());
        // The same kernel with a doctor that claims the driver works, or a /dev/kfd: a.kfd fails.
        assert_eq!(
            statuses(&no_kfd.replace(
                "AMD     driver                no ",
                "AMD     driver                yes"
            ))["a.kfd"],
            Status::Fail
        );
        assert_eq!(
            statuses(&no_kfd.replace("LAB fact kfd=absent", "LAB fact kfd=present dev=f3:0"))["a.kfd"],
            Status::Fail
        );
        // And the verdict counts them apart: no failure, not passes either.
        let checks = judge_recorded(&no_kfd);
        let na = checks
            .iter()
            .filter(|c| c.status == Status::NotApplicable)
            .count();
        assert_eq!(na, NEEDS_KFD_CALLS.len() + NEEDS_KFD_FUNCTIONS.len());
        assert!(verdict(&[checks]).is_ok());
    }

    #[test]
    fn kfd_refusing_processes_without_a_gpu_keeps_the_attach_checks() {
        // Linux 7.0 on (Debian sid): open("/dev/kfd") is EINVAL, the kernel says why.
        let refused = GOOD
            .replace(
                "LAB kfd get_version rc=0 major=1 minor=11",
                "LAB error open=/dev/kfd errno=22 (Invalid argument)",
            )
            .replace(
                "LAB fact kfd=present",
                "LAB fact hsa_amd=y\nLAB fact kfd_refusal=amdgpu: no gpu node! Cannot create KFD process\nLAB fact kfd=present",
            )
            .replace(
                AMD_YES,
                "AMD     driver                no   /dev/kfd exists but opening /dev/kfd: Invalid argument (os error 22)",
            );
        let s = statuses(&refused);
        assert_eq!(s["a.kfd"], Status::Pass);
        for id in NEEDS_KFD_CALLS {
            assert_eq!(s[id], Status::NotApplicable, "{id}");
        }
        for id in NEEDS_KFD_FUNCTIONS {
            assert_eq!(s[id], Status::Pass, "{id}");
        }
        // Without the kernel's reason the refusal is a failure, as before.
        let unexplained = refused.replace("no gpu node! ", "");
        let s = statuses(&unexplained);
        assert_eq!(s["a.kfd_version"], Status::Fail);
        assert!(s.values().all(|st| *st != Status::NotApplicable));
    }

    #[test]
    fn a_failure_in_a_guest_whose_kernel_skipped_runs_names_them() {
        let warning = "gpu-trace: WARNING: the kernel skipped 35 run(s) of gpu-trace's programs (sys_exit_btf 35): each was already running on that CPU, so the calls of those runs were not seen";
        // The 6.1 log with one client event missing and the warning in that run's stderr.
        let broken = GOOD.replacen(
            "LAB-END deny_nv.stderr",
            &format!("{warning}\nLAB-END deny_nv.stderr"),
            1,
        );
        assert_ne!(broken, GOOD, "the log has a deny_nv stderr block");
        let checks = judge_recorded(&broken);
        // Nothing failed: no note anywhere.
        assert!(checks.iter().all(|c| !c.detail.contains("skipped runs")));
        let failing = broken.replacen("LAB kfd get_version rc=0 major=1 minor=11", "", 1);
        let checks = judge(&Results::parse(&failing));
        let kv = checks.iter().find(|c| c.id == "a.kfd_version").unwrap();
        assert_eq!(kv.status, Status::Fail);
        assert!(
            kv.detail.contains(
                "skipped runs of gpu-trace's programs, each losing its calls, in: deny_nv (35)"
            ),
            "{}",
            kv.detail
        );
    }

    /// Debian 6.12.117+deb12 as its guest wrote it with issue 26's `deny_fork` step (`cargo
    /// xtask lab --kernel 6.12` of this tree, 2026-11-26, 32 checks passed), copied from
    /// `target/lab-cache/run/6.12.117+deb12-amd64/results.log` (CRs removed).
    const DENY_FORK: &str = include_str!("../../testdata/lab-6.12-results.log");

    /// `text` with the first `from` after the line `LAB-BEGIN block` replaced by `to`.
    fn in_block(text: &str, block: &str, from: &str, to: &str) -> String {
        let start = text
            .find(&format!("LAB-BEGIN {block}\n"))
            .unwrap_or_else(|| panic!("no block {block}"));
        let at = start + text[start..].find(from).expect("the line is in the block");
        format!("{}{to}{}", &text[..at], &text[at + from.len()..])
    }

    #[test]
    fn deny_fork_and_finn_runs_pass_and_each_escape_fails() {
        let s = all_pass(DENY_FORK);
        assert_eq!(s.len(), 32);
        let current: Vec<_> = statuses(GOOD).into_keys().collect();
        assert_eq!(s.into_keys().collect::<Vec<_>>(), current);
        let refused = "rc=-1 status=4294967295";
        let cases = [
            // The denied client's child was not denied (the fork not followed).
            (
                "deny_fork_nv.denied",
                format!("call=schedule {refused}"),
                "call=schedule rc=0 status=0".to_string(),
                "e.deny_fork_nv",
            ),
            // The child ran while its parent was alive (not the reparented case).
            (
                "deny_fork_nv.denied",
                "reparented=1".into(),
                "reparented=0".into(),
                "e.deny_fork_nv",
            ),
            // The other client's child was denied.
            (
                "deny_fork_nv.other",
                "call=schedule_xfer rc=0 status=0".into(),
                format!("call=schedule_xfer {refused}"),
                "e.deny_fork_nv",
            ),
            // A FINN-serialized schedule of the denied process reached the driver (bEnable read
            // from the serialized buffer's first byte, 0: the bypass).
            (
                "deny_finn_nv.denied",
                format!("call=schedule_finn {refused}"),
                "call=schedule_finn rc=0 status=0".into(),
                "e.deny_finn_nv",
            ),
            // The channel's XFER-wrapped FINN schedule likewise.
            (
                "deny_finn_nv.denied",
                format!("call=schedule_finn_channel_xfer {refused}"),
                "call=schedule_finn_channel_xfer rc=0 status=0".into(),
                "e.deny_finn_nv",
            ),
            // A stand-in that checks _IOC_TYPE, as the real driver does not.
            (
                "deny_finn_nv.other",
                "call=schedule_type0 rc=0 status=0".into(),
                "call=schedule_type0 rc=-25 status=4294967295".into(),
                "e.deny_finn_nv",
            ),
            // The policy refused the plain disable.
            (
                "deny_finn_nv.denied",
                "call=disable rc=0 status=0".into(),
                format!("call=disable {refused}"),
                "e.deny_finn_nv",
            ),
        ];
        for (block, from, to, id) in cases {
            let broken = in_block(DENY_FORK, block, &from, &to);
            let st = statuses(&broken);
            assert_eq!(st[id], Status::Fail, "{block}: {from} -> {to}");
            let failed: Vec<_> = st.iter().filter(|(_, s)| **s == Status::Fail).collect();
            assert_eq!(failed.len(), 1, "{block}: {from} -> {to}: {failed:?}");
        }
    }

    /// Debian sid's 7.2.13+deb14 as its guest wrote it (`cargo xtask lab --kernel sid` of this
    /// tree, 2026-11-25 20:09, single-threaded TCG), copied from
    /// `target/lab-cache/run/7.2.13+deb14-amd64/results.log` (CRs removed): KFD refuses open().
    const SID: &str = include_str!("../../testdata/lab-sid-results.log");
    /// Debian's arm64 6.12.117+deb12 (`cargo xtask lab --arch arm64` of issue 26's tree,
    /// 2026-11-26, with the `deny_fork` step: 18 passed, 14 not applicable), from
    /// `target/lab-cache/run/6.12.117+deb12-arm64/results.log`: a kernel without KFD.
    const ARM64: &str = include_str!("../../testdata/lab-arm64-6.12-results.log");

    /// The checks a kernel without KFD cannot run.
    fn every_kfd_check() -> Vec<&'static str> {
        NEEDS_KFD_CALLS
            .iter()
            .chain(&NEEDS_KFD_FUNCTIONS)
            .copied()
            .collect()
    }

    /// Every check of `text` passed except `na`, which are not applicable (a.kfd among the
    /// passes); the same ids as a current x86-64 kernel's log.
    fn passes_but(text: &str, na: &[&str]) {
        let s = statuses(text);
        for (id, st) in &s {
            if predates(text, id) {
                assert_eq!(*st, Status::Fail, "{id}");
                continue;
            }
            let want = if na.contains(id) {
                Status::NotApplicable
            } else {
                Status::Pass
            };
            assert_eq!(*st, want, "{id}: {:#?}", judge(&Results::parse(text)));
        }
        let current: Vec<_> = statuses(GOOD).into_keys().collect();
        assert_eq!(s.into_keys().collect::<Vec<_>>(), current);
    }

    #[test]
    fn sid_passes_with_the_checks_that_make_kfd_calls_not_applicable() {
        passes_but(SID, &NEEDS_KFD_CALLS);
        // Its a.kfd is the refusal's own check, with the kernel's words.
        let kfd = judge(&Results::parse(SID))
            .into_iter()
            .find(|c| c.id == "a.kfd")
            .unwrap();
        assert!(kfd.detail.contains("no gpu node!"), "{}", kfd.detail);
    }

    #[test]
    fn arm64_passes_with_every_kfd_check_not_applicable() {
        passes_but(ARM64, &every_kfd_check());
        assert_eq!(Results::parse(ARM64).fact("arch"), Some("aarch64"));
    }
}
