//! NVIDIA (`b.*`, `g.*`): RM-shaped ioctls on /dev/null, the success path through the lab's
//! char-195 module nvlab, gpu_ext's scheduling hooks (nvlab's stand-in) and nvlab as an RM of
//! its own.

use super::events::Event;
use super::{ENOTTY, Guest, Judged, Record, indent, no_bad_lines, tracer_problems};

pub(super) fn load(g: &Guest) -> Judged {
    let run = g.run("nv");
    Judged::new(
        "gpu-trace loads and attaches on the stock kernel (NVIDIA path)",
        g.ready("nv") && run.exit == Some(0),
        format!(
            "{}; exit {}",
            run.hooks(),
            run.exit.map_or("?".into(), |e| e.to_string())
        ),
    )
}

pub(super) fn records(g: &Guest) -> Judged {
    let run = g.run("nv");
    if !g.ready("nv") {
        return Judged::fail(
            "RM-shaped ioctls on /dev/null traced",
            format!("tracer not ready:\n{}", indent(&run.stderr)),
        );
    }
    let client = g.client("nv.client");
    let pid = client.with_key("nv", "pid").and_then(|f| f.int("pid"));
    let calls: Vec<(String, i64)> = client
        .topic("nv")
        .filter_map(|f| Some((f.get("call")?.to_owned(), f.int("rc")?)))
        .collect();
    let all_enotty = calls.len() == 7 && calls.iter().all(|(_, rc)| *rc == -ENOTTY);
    let out = &run.output;
    let k = |counter: fn(&super::events::Kernel) -> Option<u64>| out.kernel(counter);
    let mut problems = Vec::new();
    if !all_enotty {
        problems.push(format!("client calls {calls:?} (want 7 × -{ENOTTY})"));
    }
    no_bad_lines(run, &mut problems);
    if out.stats.is_none() {
        problems.push("no STATS line".into());
    }
    // `emitted` counts every record kind (issue 11): the process's cgroup (sent before its first
    // record, issue 14), the 4 calls, the client's two close()s (a process with RM records gets a
    // notice for each close) and its exit.
    if k(|k| k.emitted) != Some(8) {
        problems.push(format!(
            "kernel emitted {:?}, want 8 (the process's cgroup; alloc, schedule, XFER alloc, \
             free; 2 close and 1 exit notice)",
            k(|k| k.emitted)
        ));
    }
    if k(|k| k.ignored) != Some(1) {
        problems.push(format!(
            "kernel ignored {:?}, want 1 (the unrelated control)",
            k(|k| k.ignored)
        ));
    }
    for (counter, n) in [
        ("dropped", k(|k| k.dropped)),
        ("read_failed", k(|k| k.read_failed)),
    ] {
        if n != Some(0) {
            problems.push(format!("{counter} {n:?}, want 0"));
        }
    }
    // Every call failed (ENOTTY): no task was created, the schedule was refused.
    let of_client = out.of(pid);
    if out.events.iter().any(|e| e.is("TASK_INIT")) {
        problems.push("a TASK_INIT for a failed alloc".into());
    }
    // The client's GPFIFO_SCHEDULE names TSG handle 0x5c000010 of RM client 0xc1d00001.
    let refused = of_client.iter().find(|e| {
        e.is("SCHEDULE")
            && e.allowed == Some(false)
            && e.errno == Some(-ENOTTY)
            && e.task.value == Some(0x5c00_0010)
            && e.client == Some(0xc1d0_0001)
    });
    if refused.is_none() {
        problems.push(format!(
            "no SCHEDULE of TSG 0x5c000010 (client 0xc1d00001) allowed=false errno=-{ENOTTY} for pid \
             {pid:?}; events: {of_client:?}"
        ));
    }
    Judged::of(
        "RM-shaped ioctls on /dev/null: captured, decoded, refused with ENOTTY, counted",
        &problems,
        || {
            format!(
                "8 records emitted (the process's cgroup, 4 calls, 2 close and 1 exit notice), 1 ignored, 0 dropped; events of pid {}: {}",
                pid.unwrap_or(-1),
                of_client
                    .iter()
                    .map(|e| e.raw["event"].as_str().unwrap_or("?"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        },
    )
}

/// The success path through a real major-195 device: the lab's test module nvlab, an RM client
/// and device, then two TSGs (lab/modules/nvlab, lab/client.c `cmd_nvdev`).
pub(super) fn nvdev(g: &Guest) -> Judged {
    let title = "NVIDIA success path on a char-195 device (test module nvlab): TASK_INIT, SCHEDULE \
                 allowed, TASK_DESTROY";
    if !g.module_loaded("nvlab") {
        let why = match g.module("nvlab") {
            Some(m) => format!("insmod nvlab failed: {:?}", m.kv),
            None => "the nvlab module was not in the guest (see lab.modules)".into(),
        };
        return Judged::fail(title, why);
    }
    let client = g.client("nvdev.client");
    let pid = client.topic("nvdev").find_map(|f| f.int("pid"));
    let calls: Vec<(String, i64, i64)> = client
        .topic("nvdev")
        .filter_map(|f| Some((f.get("call")?.to_owned(), f.int("rc")?, f.int("status")?)))
        .collect();
    let mut problems = Vec::new();
    // alloc_client, alloc_device, alloc64, schedule, xfer_alloc, free_a, free_b.
    if calls.len() != 7 || calls.iter().any(|(_, rc, st)| (*rc, *st) != (0, 0)) {
        problems.push(format!(
            "client calls (name, rc, RM status) {calls:?}: want 7 × (0, 0)"
        ));
    }
    if !g.ready("nvdev") {
        problems.push("gpu-trace did not report its hooks".into());
    }
    let run = g.run("nvdev");
    no_bad_lines(run, &mut problems);
    let out = &run.output;
    let of = |kind: &str, tsg: u64| {
        out.events
            .iter()
            .filter(|e| e.is(kind) && e.pid == pid && e.task.value == Some(tsg))
            .collect::<Vec<_>>()
    };
    for tsg in [0x5c00_0010u64, 0x5c00_0011] {
        let init = of("TASK_INIT", tsg);
        if init.len() != 1
            || init[0].engine.as_deref() != Some("GRAPHICS")
            || init[0].client != Some(0xc1d0_0001)
        {
            problems.push(format!(
                "want one TASK_INIT engine=GRAPHICS for TSG {tsg:#x}, got {init:?}"
            ));
        }
        let destroy = of("TASK_DESTROY", tsg);
        if destroy.len() != 1 || destroy[0].cause.as_deref() != Some("free") {
            problems.push(format!(
                "want one TASK_DESTROY cause=free for TSG {tsg:#x}, got {destroy:?}"
            ));
        }
    }
    let sched = of("SCHEDULE", 0x5c00_0010);
    if sched.len() != 1
        || sched[0].allowed != Some(true)
        || sched[0].errno != Some(0)
        || sched[0].rm_status != Some(0)
    {
        problems.push(format!(
            "want one SCHEDULE allowed=true errno=0 rm_status=0 for TSG 0x5c000010, got {sched:?}"
        ));
    }
    // The process's cgroup, 7 calls (the RM client and device allocations are traced: gpu-trace
    // needs them to know the client and the TSGs' GPU), then the client's close() and exit
    // notices (all counted in `emitted` since issue 11).
    let k = |counter: fn(&super::events::Kernel) -> Option<u64>| out.kernel(counter);
    let counters = (k(|k| k.emitted), k(|k| k.dropped), k(|k| k.read_failed));
    if counters != (Some(10), Some(0), Some(0)) {
        problems.push(format!(
            "kernel counters emitted {:?} dropped {:?} read_failed {:?}: want 10 (the cgroup, 7 \
             calls, a close and an exit notice), 0, 0",
            counters.0, counters.1, counters.2
        ));
    }
    Judged::of(title, &problems, || {
        format!(
            "pid {}: {}",
            pid.unwrap_or(-1),
            out.events
                .iter()
                .filter(|e| !e.is("STATS"))
                .map(|e| format!(
                    "{} {:#x}",
                    e.raw["event"].as_str().unwrap_or("?"),
                    e.raw["task"]["value"].as_u64().unwrap_or(0)
                ))
                .collect::<Vec<_>>()
                .join(", ")
        )
    })
}

pub(super) fn gpu_ext(g: &Guest) -> Judged {
    gpu_ext_run(
        g,
        "nvdev_gx",
        "gpu_ext hooks (stand-in in nvlab): found, attached (fentry with module BTF, else kprobe), \
         their hardware TSG ids and RM values added to the RM calls' events, nothing reported twice",
    )
}

pub(super) fn gpu_ext_kprobe(g: &Guest) -> Judged {
    gpu_ext_run(
        g,
        "nvdev_gxk",
        "gpu_ext hooks with --deep-attach kprobe: the same, through kprobes",
    )
}

/// gpu_ext's scheduling hooks (issue 3): nvlab defines them and calls them with its own values
/// (hardware TSG ids 1, 2, …, timeslice 3000 µs, runlist 13, interleave MEDIUM); the same
/// nvdev calls as `b.nvdev`, traced with the deep hooks.
fn gpu_ext_run(g: &Guest, run: &str, title: &'static str) -> Judged {
    if !g.module_loaded("nvlab") {
        return Judged::fail(title, "the nvlab module was not loaded");
    }
    let traced = g.run(run);
    let hooks = traced.hooks();
    let mut problems = Vec::new();
    let funcs = "nv_gpu_sched_task_init,nv_gpu_sched_bind,nv_gpu_sched_token_request,nv_gpu_sched_task_destroy";
    // nvlab has BTF where the kernel headers carry vmlinux's (6.12): fentry there, unless
    // kprobes are asked for; else the kprobe path, with the trampoline refusal said.
    let btf = g.fact("nvlab_btf").is_some_and(|v| v != "absent");
    let want = if btf && run == "nvdev_gx" {
        format!("NVIDIA gpu_ext hooks → fentry/{{{funcs}}} (nvlab BTF)")
    } else {
        format!("NVIDIA gpu_ext hooks → kprobe/{{{funcs}}} (in nvlab)")
    };
    if !hooks.contains(&want) {
        problems.push(format!("want `{want}` (nvlab BTF: {btf})"));
    }
    if !(traced.stderr.contains("fentry/nv_gpu_sched_task_init") || (btf && run == "nvdev_gx")) {
        problems.push("want the refused trampoline reported".into());
    }
    let pid = g
        .client(&format!("{run}.client"))
        .find("nvdev", &[])
        .and_then(|f| f.int("pid"));
    no_bad_lines(traced, &mut problems);
    let mine = traced.output.of(pid);
    let brief: Vec<String> = mine.iter().map(|e| e.brief()).collect();
    gpu_ext_tasks(&mine, &brief, &mut problems);
    let out = &traced.output;
    let unmatched = out.unreported(|u| u.gpu_ext_unmatched).unwrap_or(0);
    let emitted = out.kernel(|k| k.emitted);
    // `emitted` counts every record kind (issue 11): the 7 RM records, one record per gpu_ext
    // hook that ran, and the client's close and exit notices: at least 9.
    // lab/client.c allocates its RM client first (nvlab refuses calls on an unknown client), so
    // gpu-trace saw every object of the process made: no PRETRACE_END (late attach,
    // docs/events.md), only the 5 events of the TSGs.
    let pretrace = mine.iter().filter(|e| e.is("PRETRACE_END")).count();
    let task_events = mine.len() - pretrace;
    if unmatched != 0 || emitted.is_none_or(|e| e < 9) || task_events != 5 || pretrace != 0 {
        problems.push(format!(
            "want every hook taken up by its call (gpu_ext_unmatched {unmatched}), 7 RM records + \
             hook records + 2 notices (emitted {emitted:?}), 5 task events (got {task_events}) and \
             no PRETRACE_END: the client was allocated under tracing (got {pretrace})"
        ));
    }
    Judged::new(
        title,
        problems.is_empty(),
        if problems.is_empty() {
            format!("{hooks}; {}", brief.join(", "))
        } else {
            format!("{}: {}", problems.join("; "), traced.stderr.trim())
        },
    )
}

/// The two TSGs of a gpu_ext run: named by the hook's ids (hw_tsg), not the RM handles, with
/// the driver's timeslice; the first one scheduled with RM's values; both destroyed.
fn gpu_ext_tasks(mine: &[&Event], brief: &[String], problems: &mut Vec<String>) {
    let hw_tsg = |e: &Event| e.task.kind.as_deref() == Some("hw_tsg");
    let inits: Vec<&&Event> = mine.iter().filter(|e| e.is("TASK_INIT")).collect();
    let hw: Vec<u64> = inits
        .iter()
        .filter(|e| hw_tsg(e))
        .filter_map(|e| e.task.value)
        .collect();
    if hw.len() != 2 || hw[0] == hw[1] {
        problems.push(format!(
            "want two TASK_INITs named by distinct hardware TSG ids: {brief:?}"
        ));
    }
    if !inits.iter().all(|e| {
        e.timeslice_us == Some(3000) && e.timeslice_source.as_deref() == Some("driver_hook")
    }) {
        problems.push(format!(
            "want the driver's timeslice 3000 µs (source driver_hook) on both TASK_INITs: {inits:?}"
        ));
    }
    let sched: Vec<&&Event> = mine.iter().filter(|e| e.is("SCHEDULE")).collect();
    let first = hw.first().copied();
    if sched.len() != 1
        || !hw_tsg(sched[0])
        || sched[0].task.value != first
        || sched[0].channels != Some(0)
        || sched[0].timeslice_us != Some(3000)
        || sched[0].interleave.as_deref() != Some("MEDIUM")
        || sched[0].allowed != Some(true)
    {
        problems.push(format!(
            "want one SCHEDULE of hw_tsg {first:?} with RM's channels 0, timeslice 3000, interleave MEDIUM, allowed: {sched:?}"
        ));
    }
    let destroyed: Vec<u64> = mine
        .iter()
        .filter(|e| e.is("TASK_DESTROY") && hw_tsg(e) && e.cause.as_deref() == Some("free"))
        .filter_map(|e| e.task.value)
        .collect();
    if destroyed != hw {
        problems.push(format!(
            "want both TSGs destroyed (free) under their hardware ids: {brief:?}"
        ));
    }
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

/// What nvlab answered the `nvobj` client, as the client received it.
struct NvobjAnswers {
    calls: usize,
    tsg: Option<i64>,
    token_a: Option<i64>,
    token_b: Option<i64>,
}

/// The module's answers against [`NVOBJ_CALLS`], its TSG id and its tokens.
fn nvobj_answers(client: &[&Record], problems: &mut Vec<String>) -> NvobjAnswers {
    let calls: Vec<&&Record> = client.iter().filter(|f| f.get("call").is_some()).collect();
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
    NvobjAnswers {
        calls: calls.len(),
        tsg,
        token_a,
        token_b,
    }
}

/// nvlab as an RM of its own (issue 20, finding 2): the `nvobj` client's calls, traced with the
/// gpu_ext hooks. The oracle is what the module answered as the client received it (its printed
/// statuses, the TSG id of GET_INFO, the two tokens), never gpu-trace's output.
pub(super) fn nvobj(g: &Guest) -> Judged {
    let title = "nvlab as an independent RM (objects, refusals, its own TSG id and work-submit \
                 tokens): gpu-trace's events name the module's TSG id, its channel count and the \
                 tokens the client received, and nothing for the refused calls";
    if !g.module_loaded("nvlab") {
        return Judged::fail(title, "the nvlab module was not loaded");
    }
    let Some(started) = g.started("nvobj") else {
        return Judged::fail(title, "the guest did not run nvobj");
    };
    let run = g.run("nvobj");
    let mut problems = Vec::new();
    tracer_problems(run, started, &mut problems);
    let client: Vec<&Record> = g.client("nvobj.client").topic("nvobj").collect();
    let pid = client.iter().find_map(|f| f.int("pid"));
    let a = nvobj_answers(&client, &mut problems);
    // gpu-trace's events of the client, in order: exactly these six.
    no_bad_lines(run, &mut problems);
    let mine = run.output.of(pid);
    let brief = nvobj_events(&mine, pid, &a, &mut problems);
    let out = &run.output;
    let unmatched = out.unreported(|u| u.gpu_ext_unmatched);
    let (dropped, read_failed) = (out.kernel(|k| k.dropped), out.kernel(|k| k.read_failed));
    if out.stats.is_none()
        || unmatched.is_some_and(|n| n != 0)
        || (dropped, read_failed) != (Some(0), Some(0))
    {
        problems.push(format!(
            "want a STATS line, every gpu_ext hook taken up by its call (gpu_ext_unmatched \
             {unmatched:?}) and nothing dropped ({dropped:?}) or unread ({read_failed:?})",
        ));
    }
    Judged::of(title, &problems, || {
        format!(
            "the module answered {} calls as RM would (TSG id {}, tokens {}, {}); gpu-trace: {}",
            a.calls,
            a.tsg.unwrap_or(-1),
            a.token_a.unwrap_or(-1),
            a.token_b.unwrap_or(-1),
            brief.join(", ")
        )
    })
}

/// gpu-trace's events of the `nvobj` client against what the module answered: exactly six, in
/// order. Returns each event in brief.
fn nvobj_events(
    mine: &[&Event],
    pid: Option<i64>,
    a: &NvobjAnswers,
    problems: &mut Vec<String>,
) -> Vec<String> {
    let (tsg, token_a, token_b) = (a.tsg, a.token_a, a.token_b);
    let tsg_u = tsg.and_then(|t| u64::try_from(t).ok());
    let named = |e: &Event| e.task.kind.as_deref() == Some("hw_tsg") && e.task.value == tsg_u;
    let submit = |e: &Event, token: Option<i64>, handle: u64| {
        e.is("WORK_SUBMIT") && named(e) && e.token == token && e.channel_handle == Some(handle)
    };
    let scheduled = |e: &Event, channels: u64| {
        e.is("SCHEDULE") && named(e) && e.channels == Some(channels) && e.allowed == Some(true)
    };
    type EventTest<'a> = &'a dyn Fn(&Event) -> bool;
    let expected: [(&str, EventTest); 6] = [
        ("TASK_INIT of the module's TSG id", &|e| {
            e.is("TASK_INIT") && named(e)
        }),
        ("SCHEDULE with the bind hook's 2 channels", &|e| {
            scheduled(e, 2)
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
            scheduled(e, 1)
        }),
        ("TASK_DESTROY cause=free of the module's TSG id", &|e| {
            e.is("TASK_DESTROY") && named(e) && e.cause.as_deref() == Some("free")
        }),
    ];
    let brief: Vec<String> = mine
        .iter()
        .map(|e| {
            format!(
                "{}{}",
                e.brief(),
                if e.is("WORK_SUBMIT") {
                    format!(" token={}", e.raw["token"])
                } else if e.is("SCHEDULE") {
                    format!(" channels={}", e.raw["channels"])
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
    brief
}
