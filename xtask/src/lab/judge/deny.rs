//! Enforcement (`e.*`): the client's own BPF LSM program on file_ioctl, and gpu-trace's
//! `--deny-pid` (issue 4) and `--deny-cgroup` (issue 14) as lab/init.sh `deny_trace` runs them:
//! a denied client, an identical other client, then (for `--deny-pid`) a new process given the
//! denied PID.

use super::events::Event;
use super::guest::{Record, Records};
use super::{EINVAL, EPERM, Guest, Judged, no_bad_lines, tracer_problems};

pub(super) fn lsm(g: &Guest) -> Judged {
    let title =
        "BPF LSM on file_ioctl: loads, runs, denies CREATE_QUEUE for one process only, detaches";
    let counts = g.records.with_key("lsm", "program_denials");
    let Some(f) = g.records.with_key("lsm", "self_denied96") else {
        let lines = g.records.lines_starting("LAB lsm");
        return Judged::fail(
            "BPF LSM program on file_ioctl loads, runs and denies",
            format!("{lines:?}"),
        );
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
    let denials = counts.and_then(|c| c.int("program_denials"));
    if denials != Some(2) {
        problems.push(format!("program counted {denials:?} denials (want 2)"));
    }
    Judged::of(title, &problems, || {
        format!(
            "denied process got EPERM (both sizes), another process and GET_VERSION unaffected, EINVAL again after detach; program ran {} times",
            counts.and_then(|c| c.get("program_calls")).unwrap_or("?")
        )
    })
}

/// Who the clients of a `--deny-pid` run are.
const PID_ROLES: &[&str] = &["denied", "other", "reuse"];
/// Who the clients of a `--deny-cgroup` run are (the cgroup is empty at start; a client enters
/// it afterwards).
const CGROUP_ROLES: &[&str] = &["denied", "other"];

/// One deny run of the scenario, and what its clients must have seen.
struct DenyRun {
    /// The run's name in the log.
    name: &'static str,
    title: &'static str,
    /// Denials the kernel counts (`STATS kernel.denied`).
    denials: u64,
    roles: &'static [&'static str],
    calls: Calls,
    expect: fn(&DenyClient, &[&Event], &mut Vec<String>),
    /// Every event of the client that joined the denied cgroup says so.
    in_cgroup: bool,
}

impl DenyRun {
    /// A `--deny-pid` run: the denied client, the other, the PID's next owner.
    fn pid(
        name: &'static str,
        title: &'static str,
        denials: u64,
        calls: Calls,
        expect: fn(&DenyClient, &[&Event], &mut Vec<String>),
    ) -> Self {
        Self {
            name,
            title,
            denials,
            roles: PID_ROLES,
            calls,
            expect,
            in_cgroup: false,
        }
    }

    /// A `--deny-cgroup` run: the client that entered the cgroup, and one outside.
    fn cgroup(
        name: &'static str,
        title: &'static str,
        denials: u64,
        expect: fn(&DenyClient, &[&Event], &mut Vec<String>),
    ) -> Self {
        Self {
            roles: CGROUP_ROLES,
            in_cgroup: true,
            ..Self::pid(name, title, denials, Calls::Own, expect)
        }
    }
}

pub(super) fn nv(g: &Guest) -> Judged {
    judge_deny_run(
        g,
        &DenyRun::pid(
            "deny_nv",
            "--deny-pid refuses GPFIFO_SCHEDULE (nvlab; direct, XFER-wrapped, channel-level, \
                from another thread) for the denied process only, not for a later process \
                with its PID",
            4,
            Calls::Own,
            deny_nv_expect,
        ),
    )
}

pub(super) fn amd(g: &Guest) -> Judged {
    judge_deny_run(
        g,
        &DenyRun::pid(
            "deny_amd",
            "--deny-pid refuses CREATE_QUEUE and an activating UPDATE_QUEUE on /dev/kfd for \
                the denied process only, not for a later process with its PID",
            3,
            Calls::Own,
            deny_amd_expect,
        ),
    )
}

/// Issue 26: what a denied process creates is denied, also after the creator exited.
pub(super) fn fork_nv(g: &Guest) -> Judged {
    judge_deny_run(
        g,
        &DenyRun::pid(
            "deny_fork_nv",
            "--deny-pid refuses GPFIFO_SCHEDULE (nvlab, every form) to a child the denied process \
                forked after gpu-trace started and that runs after its parent exited; not to the other \
                process's child nor to the PID's next owner's",
            4,
            Calls::ForkedChild,
            deny_nv_expect,
        ),
    )
}

/// Issue 26: a FINN-serialized schedule (bEnable unreadable) of a denied process is refused.
pub(super) fn finn_nv(g: &Guest) -> Judged {
    judge_deny_run(
        g,
        &DenyRun::pid(
            "deny_finn_nv",
            "--deny-pid refuses a FINN-serialized GPFIFO_SCHEDULE (bEnable unreadable: fail closed), \
                TSG direct and channel XFER-wrapped, shown as refused SCHEDULEs, and one sent with \
                _IOC_TYPE 0 (which the driver and nvlab accept); a plain disable passes",
            3,
            Calls::Own,
            deny_finn_expect,
        ),
    )
}

/// Issue 40: the compat ioctl path (LSM hook `file_ioctl_compat`) refuses as the native one.
pub(super) fn compat_nv(g: &Guest) -> Judged {
    judge_deny_run(
        g,
        &DenyRun::pid(
            "deny_compat_nv",
            "--deny-pid refuses GPFIFO_SCHEDULE (nvlab; direct and XFER-wrapped) from a 32-bit x86 \
                process (compat ioctl, file_ioctl_compat) for the denied process only, not for \
                a later process with its PID",
            2,
            Calls::Own,
            deny_compat_expect,
        ),
    )
}

pub(super) fn cgroup_nv(g: &Guest) -> Judged {
    if !has_cgroup_ancestor(g) {
        return judge_deny_cgroup_refused(g, "deny_cgroup_nv");
    }
    judge_deny_run(
        g,
        &DenyRun::cgroup(
            "deny_cgroup_nv",
            "--deny-cgroup refuses GPFIFO_SCHEDULE (nvlab, every form) to a process that entered \
                the cgroup after gpu-trace started, not to one outside",
            4,
            deny_nv_expect,
        ),
    )
}

pub(super) fn cgroup_amd(g: &Guest) -> Judged {
    if !has_cgroup_ancestor(g) {
        return judge_deny_cgroup_refused(g, "deny_cgroup_amd");
    }
    judge_deny_run(
        g,
        &DenyRun::cgroup(
            "deny_cgroup_amd",
            "--deny-cgroup refuses CREATE_QUEUE and an activating UPDATE_QUEUE on /dev/kfd to a \
                process that entered the cgroup after gpu-trace started, not to one outside",
            3,
            deny_amd_expect,
        ),
    )
}

/// `bpf_get_current_ancestor_cgroup_id` became callable from tracing and LSM programs in Linux
/// 5.14 ("bpf: Allow bpf_get_current_ancestor_cgroup_id for tracing"); Debian's 5.10 refuses it
/// (`unknown func`), 6.1 has it. The cgroup options need it.
const CGROUP_ANCESTOR_SINCE: (u32, u32) = (5, 14);

fn has_cgroup_ancestor(g: &Guest) -> bool {
    g.kernel_at_least(CGROUP_ANCESTOR_SINCE)
}

/// A `--deny-cgroup` run on a kernel without the helper: gpu-trace stops at start-up with exit
/// 3 and names the helper and the release that has it; nothing was refused, so every call of
/// both clients reached the driver (no rc -1, EPERM).
fn judge_deny_cgroup_refused(g: &Guest, name: &str) -> Judged {
    let mut problems = Vec::new();
    let run = g.run(name);
    let exit = run.exit;
    if exit != Some(3) {
        problems.push(format!("tracer exit {exit:?}, want 3 (cannot trace here)"));
    }
    for want in ["bpf_get_current_ancestor_cgroup_id", "Linux 5.14"] {
        if !run.stderr.contains(want) {
            problems.push(format!("want the reason to name `{want}`"));
        }
    }
    let mut calls = 0;
    for role in ["denied", "other"] {
        for f in &g.client(&format!("{name}.{role}")).all {
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
    Judged::of(
        "before 5.14: --deny-cgroup refused at start-up (exit 3) naming the missing helper; nothing denied",
        &problems,
        || {
            format!(
                "exit 3: {}; {calls} client calls reached the driver",
                run.stderr.trim()
            )
        },
    )
}

/// What one client of a deny run saw, and whether it was the one denied.
struct DenyClient<'a> {
    role: &'static str,
    denied: bool,
    out: &'a Records,
}

/// How a deny run's clients make their calls.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Calls {
    /// The client process itself.
    Own,
    /// A child the client forked, which made its calls after the client had exited
    /// (`fork-SUB`): its events are the child's, its denial inherited.
    ForkedChild,
}

fn judge_deny_run(g: &Guest, d: &DenyRun) -> Judged {
    let Some(started) = g.started(d.name) else {
        return Judged::fail(d.title, format!("the guest did not run {}", d.name));
    };
    let run = g.run(d.name);
    let mut problems = Vec::new();
    tracer_problems(run, started, &mut problems);
    let denied_pid = started.int("denied_pid");
    no_bad_lines(run, &mut problems);
    for role in d.roles.iter().copied() {
        let out = g.client(&format!("{}.{role}", d.name));
        let caller = deny_caller(out, role, denied_pid, d.calls, &mut problems);
        let client = DenyClient {
            role,
            denied: role == "denied",
            out,
        };
        // The reuse client shares the denied pid; it runs as `lab-reuse` (its comm) to be told
        // apart.
        let comm = if role == "reuse" {
            "lab-reuse"
        } else {
            "lab-client"
        };
        let mine: Vec<&Event> = run
            .output
            .of(caller)
            .into_iter()
            .filter(|e| e.comm.as_deref() == Some(comm))
            .collect();
        (d.expect)(&client, &mine, &mut problems);
        if d.in_cgroup
            && client.denied
            && let Some(e) = mine
                .iter()
                .find(|e| e.cgroup.as_ref().and_then(|c| c.path.as_deref()) != Some("/gt-denied"))
        {
            problems.push(format!("denied client: an event not in /gt-denied: {e}"));
        }
    }
    let counted = run.output.kernel(|k| k.denied);
    if counted != Some(d.denials) {
        problems.push(format!(
            "STATS kernel.denied {counted:?}, want {}",
            d.denials
        ));
    }
    Judged::of(d.title, &problems, || {
        format!(
            "denied pid {}: refused with EPERM before the driver, shown as SCHEDULE \
                 allowed=false errno=-1, {} denial(s) counted by the kernel; the other \
                 process{} not refused",
            denied_pid.unwrap_or(-1),
            d.denials,
            if d.roles.contains(&"reuse") {
                " and the PID's next owner were"
            } else {
                " was"
            }
        )
    })
}

/// The process whose calls a deny run's client made (the client, or the child it forked),
/// after checking that the client has the pid its role wants.
fn deny_caller(
    out: &Records,
    role: &str,
    denied_pid: Option<i64>,
    calls: Calls,
    problems: &mut Vec<String>,
) -> Option<i64> {
    // The clients print their pid in their first line (`wait pid=`, `nvdev pid=`, ...).
    let pid = out.all.iter().find_map(|f| f.int("pid"));
    let is_denied_pid = pid.is_some() && pid == denied_pid;
    match role {
        "denied" | "reuse" if !is_denied_pid => problems.push(format!(
            "the {role} client's pid {pid:?} is not the denied pid {denied_pid:?}{}",
            if role == "reuse" {
                " (the PID was not reused: ns_last_pid raced)"
            } else {
                ""
            }
        )),
        "other" if is_denied_pid => problems.push("the other client has the denied pid".into()),
        _ => {}
    }
    if calls == Calls::Own {
        return pid;
    }
    let child: Option<&Record> = out.with_key("fork_child", "reparented");
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
                "the {role} client's child: want it forked by pid {pid:?} and run after its \
                 parent exited (reparented=1), got parent line {:?}, child line {:?}",
                pa.map(|f| f.kv.clone()),
                ch.map(|f| f.kv.clone())
            ));
            None
        }
    }
}

/// A call's answer as the client printed it: (rc, RM status).
type Answer = (Option<i64>, Option<i64>);

/// The answer to the client's call `name` (its `LAB <topic> call=name rc= status=` record).
fn answer(c: &DenyClient, topic: &str, name: &str) -> Option<Answer> {
    c.out
        .find(topic, &[("call", name)])
        .map(|f| (f.int("rc"), f.int("status")))
}

/// Each of the schedules `names` answered `want`.
fn schedules_answered(
    c: &DenyClient,
    topic: &str,
    names: &[&str],
    want: Answer,
    problems: &mut Vec<String>,
) {
    for name in names {
        let got = answer(c, topic, name);
        if got != Some(want) {
            problems.push(format!(
                "{} client: {name} (rc, status) {got:?}, want {want:?}",
                c.role
            ));
        }
    }
}

/// Each of the calls `names` reached the module and got NV_OK (`why` says what a failure
/// means).
fn calls_reached(
    c: &DenyClient,
    topic: &str,
    names: &[&str],
    why: &str,
    problems: &mut Vec<String>,
) {
    for name in names {
        let got = answer(c, topic, name);
        if got != Some((Some(0), Some(0))) {
            problems.push(format!("{} client: {name} {why}: {got:?}", c.role));
        }
    }
}

/// The client's SCHEDULE events: `want` of them, each allowed or not with `errno`, `channel`
/// of them via the channel.
fn schedules_shown(
    c: &DenyClient,
    events: &[&Event],
    (want, allowed, errno, channel): (usize, bool, i64, usize),
    problems: &mut Vec<String>,
) {
    let sched: Vec<&&Event> = events.iter().filter(|e| e.is("SCHEDULE")).collect();
    let right = |e: &&&Event| e.allowed == Some(allowed) && e.errno == Some(errno);
    let via_channel = sched.iter().filter(|e| e.via_channel == Some(true)).count();
    if sched.len() != want || !sched.iter().all(right) || via_channel != channel {
        let which = if want == 4 {
            "one via the channel".to_owned()
        } else {
            format!("{channel} via the channel")
        };
        problems.push(format!(
            "{} client: want {want} SCHEDULE allowed={allowed} errno={errno} ({which}), got \
             {sched:?}",
            c.role
        ));
    }
}

/// The `nvdeny` client (lab/client.c): a TSG and a channel, then GPFIFO_SCHEDULE direct,
/// XFER-wrapped, at channel level and from a second thread. Denied: all four refused before the
/// driver (EPERM, the preset status left as it was) and shown as refused SCHEDULEs; the
/// allocations never. Not denied: all reach the module (NV_OK) and are allowed.
fn deny_nv_expect(c: &DenyClient, events: &[&Event], problems: &mut Vec<String>) {
    let (want_sched, want_allowed, want_errno) = if c.denied {
        // Refused before the driver: the status the client preset stays.
        ((Some(-EPERM), Some(0xffff_ffff)), false, -EPERM)
    } else {
        ((Some(0), Some(0)), true, 0)
    };
    let schedules = [
        "schedule",
        "schedule_xfer",
        "schedule_channel",
        "schedule_thread",
    ];
    schedules_answered(c, "nvdeny", &schedules, want_sched, problems);
    let allocs = [
        "alloc_client",
        "alloc_device",
        "alloc_tsg",
        "alloc_channel",
        "free",
    ];
    calls_reached(c, "nvdeny", &allocs, "must not be denied", problems);
    // One SCHEDULE per request; the channel-level one says so.
    schedules_shown(c, events, (4, want_allowed, want_errno, 1), problems);
}

/// RM's answer to a control naming no RM client (nvlab, as rmapi/control.c).
const NV_ERR_INVALID_CLIENT: i64 = 0x23;

/// The `nvdeny32` client (lab/client32.c, 32-bit x86, no RM client allocated): a TSG schedule
/// direct and XFER-wrapped through the compat ioctl path. Denied: both refused before the
/// driver (EPERM, the preset status left). Not denied: both reach nvlab, which answers
/// NV_ERR_INVALID_CLIENT with rc 0. The client says it ran as a 32-bit process (`bits=32`).
/// (Its events are not judged: the syscall-layer hooks leave compat ioctls out.)
fn deny_compat_expect(c: &DenyClient, _events: &[&Event], problems: &mut Vec<String>) {
    if c.out
        .with_key("nvdeny32", "bits")
        .and_then(|f| f.int("bits"))
        != Some(32)
    {
        problems.push(format!("{} client: the 32-bit client did not run", c.role));
    }
    let want = if c.denied {
        (Some(-EPERM), Some(0xffff_ffff))
    } else {
        (Some(0), Some(NV_ERR_INVALID_CLIENT))
    };
    schedules_answered(
        c,
        "nvdeny32",
        &["schedule", "schedule_xfer"],
        want,
        problems,
    );
}

/// The `nvdeny-finn` client: FINN-serialized GPFIFO_SCHEDULEs on the TSG (direct) and on the
/// channel (XFER-wrapped), whose first byte is 0; an enabling schedule sent with `_IOC_TYPE` 0
/// (the driver ignores the type: so must nvlab and gpu-trace); then a plain disable. Denied: the
/// three schedules refused before the driver (EPERM, preset status kept) and shown as refused
/// SCHEDULEs (one via the channel); the disable reaches the module. Not denied: every call
/// reaches the module (NV_OK); the type-0 schedule is one allowed SCHEDULE, and a FINN schedule
/// that reached the driver gives no event (its bEnable is not known).
fn deny_finn_expect(c: &DenyClient, events: &[&Event], problems: &mut Vec<String>) {
    let reached = (Some(0), Some(0));
    let sched_want = if c.denied {
        (Some(-EPERM), Some(0xffff_ffff))
    } else {
        reached
    };
    let schedules = [
        "schedule_finn",
        "schedule_finn_channel_xfer",
        "schedule_type0",
    ];
    schedules_answered(c, "nvdeny_finn", &schedules, sched_want, problems);
    let others = [
        "alloc_client",
        "alloc_device",
        "alloc_tsg",
        "alloc_channel",
        "disable",
        "free",
    ];
    calls_reached(c, "nvdeny_finn", &others, "must reach the driver", problems);
    let want = if c.denied {
        (3, false, -EPERM, 1)
    } else {
        (1, true, 0, 0)
    };
    schedules_shown(c, events, want, problems);
    let disables = events
        .iter()
        .filter(|e| e.is("SCHED_UPDATE") && e.allowed == Some(true))
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
fn deny_amd_expect(c: &DenyClient, events: &[&Event], problems: &mut Vec<String>) {
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
        .filter(|e| e.is("SCHEDULE") && e.allowed == Some(false) && e.errno == Some(want))
        .count();
    if refused != 2 || events.iter().any(|e| e.is("TASK_INIT")) {
        problems.push(format!(
            "{} client: want 2 SCHEDULE allowed=false errno={want} and no TASK_INIT, got {events:?}",
            c.role
        ));
    }
}
