//! A driver event kind's own fields, as text (after the `TSG=` column) and the helpers that
//! spell them (`?` for unknown, errno names, scheduling changes), which the vendors' details
//! share ([`crate::source::amd::render`]). The event's whole section, its kind's fields then
//! its vendor's, is [`crate::event_section`].

use std::fmt::{self, Display, Write as _};

use crate::event::{DestroyCause, Engine, EventKind, Interleave, RunState, SchedChange, TaskId};

/// Appends `v` in decimal, `?` when unknown (as [`Opt`] shows it).
fn push_opt(line: &mut String, v: Option<u32>) {
    match v {
        Some(v) => line.push_str(itoa::Buffer::new().format(v)),
        None => line.push('?'),
    }
}

/// The fields of `kind` as NVIDIA's events print them (AMD's too where its detail adds
/// nothing: [`AmdFields`]); `gpu_index`: nvidia-smi's index of the task's GPU, where known
/// (`WORK_SUBMIT`'s `gpu=`).
pub(crate) fn write_fields(line: &mut String, kind: &EventKind, gpu_index: Option<u32>) {
    match kind {
        EventKind::TaskInit { .. } | EventKind::Schedule { .. } | EventKind::SchedUpdate { .. } => {
            write_scheduling(line, kind);
        }
        EventKind::WorkSubmit {
            chid,
            runlist,
            token,
            ..
        } => {
            // `channel={} token={} gpu={} runlist={}` (the `-v` lines, most of them). `gpu=`
            // is nvidia-smi's index, not the event's RM device instance.
            line.push_str("channel=");
            push_opt(line, *chid);
            line.push_str(" token=");
            line.push_str(itoa::Buffer::new().format(*token));
            line.push_str(" gpu=");
            push_opt(line, gpu_index);
            line.push_str(" runlist=");
            push_opt(line, *runlist);
        }
        EventKind::TaskDestroy { .. }
        | EventKind::PretraceEnd { .. }
        | EventKind::MpsShared { .. } => write_ending(line, kind),
    }
    // Late attach and MPS: the TSG column names an object this tracer never saw created.
    match kind.task() {
        TaskId::PreTrace(_) => line.push_str(" [pre-trace]"),
        TaskId::Shared(_) if !matches!(kind, EventKind::MpsShared { .. }) => {
            line.push_str(" [shared]");
        }
        _ => {}
    }
}

/// `TASK_INIT`'s, `SCHEDULE`'s and `SCHED_UPDATE`'s fields ([`write_fields`]).
fn write_scheduling(line: &mut String, kind: &EventKind) {
    let _ = match kind {
        EventKind::TaskInit {
            engine,
            timeslice_us,
            interleave,
            runlist,
            ..
        } => write!(
            line,
            "engine={:<8} timeslice={} interleave={} runlist={}",
            engine.map_or("?", engine_name),
            Timeslice(*timeslice_us),
            interleave.map_or("UNKNOWN", interleave_name),
            Opt(*runlist),
        ),
        EventKind::Schedule {
            channels,
            timeslice_us,
            interleave,
            allowed,
            rm_status,
            errno,
            via_channel,
            ..
        } => {
            let _ = write!(
                line,
                "channels={} timeslice={} interleave={} ",
                Opt(*channels),
                Timeslice(*timeslice_us),
                interleave.map_or("?", interleave_name),
            );
            write_verdict(line, *allowed, *rm_status, *errno, *via_channel);
            Ok(())
        }
        EventKind::SchedUpdate {
            change,
            allowed,
            rm_status,
            errno,
            via_channel,
            ..
        } => {
            write_change(line, change);
            line.push(' ');
            write_verdict(line, *allowed, *rm_status, *errno, *via_channel);
            Ok(())
        }
        _ => Ok(()),
    };
}

/// `TASK_DESTROY`'s, `PRETRACE_END`'s and `MPS_SHARED`'s fields ([`write_fields`]).
fn write_ending(line: &mut String, kind: &EventKind) {
    let _ = match kind {
        EventKind::TaskDestroy {
            cause, implicit, ..
        } => {
            let _ = write!(line, "cause={}", cause_name(*cause));
            if *implicit {
                line.push_str(" (implicit)");
            }
            Ok(())
        }
        EventKind::PretraceEnd {
            client,
            fd,
            cause,
            tsgs,
        } => {
            let _ = write!(line, "tsgs={} cause={}", Opt(*tsgs), cause_name(*cause));
            if let Some(fd) = fd {
                let _ = write!(line, " fd={fd}");
            }
            if let Some(c) = client {
                let _ = write!(line, " client=0x{c:08x}");
            }
            line.push_str(" (TSGs created before tracing started)");
            Ok(())
        }
        EventKind::MpsShared {
            server_pid,
            server_task,
            runlist,
            ..
        } => write!(
            line,
            "server_pid={server_pid} server_tsg={} runlist={runlist}",
            server_task.label()
        ),
        _ => Ok(()),
    };
}

/// `allowed=yes|no`, ` (channel)` for a request sent to a channel, and for a refused one its RM
/// status (when not `NV_OK`) and errno (when not 0).
pub(crate) fn write_verdict(
    line: &mut String,
    allowed: bool,
    rm_status: Option<u32>,
    errno: i32,
    via_channel: bool,
) {
    let _ = write!(line, "allowed={}", if allowed { "yes" } else { "no" });
    if via_channel {
        line.push_str(" (channel)");
    }
    if !allowed {
        if let Some(status) = rm_status.filter(|&s| s != 0) {
            let _ = write!(line, " status=0x{status:08x}");
        }
        if errno != 0 {
            let _ = write!(line, " errno={}", Errno(errno));
        }
    }
}

/// What a `SCHED_UPDATE` changes, old → new (`->`; `?` for an old value not known):
///
/// ```text
/// SCHED_UPDATE … TSG=0x5c000015 timeslice=1024 us -> 2048 us allowed=yes
/// SCHED_UPDATE … TSG=0x5c000015 interleave=MEDIUM -> HIGH allowed=yes (channel)
/// SCHED_UPDATE … TSG=0x5c000015 preempt wait=yes timeout=default allowed=yes
/// SCHED_UPDATE … TSG=0x5c000015 run_state=enabled -> disabled allowed=yes
/// SCHED_UPDATE … TSG=2    via=update priority=7 -> 2 percent=100 -> 30 ring=4096 active=yes allowed=yes
/// ```
pub(crate) fn write_change(line: &mut String, change: &SchedChange) {
    let _ = match change {
        SchedChange::Timeslice { old_us, new_us, .. } => write!(
            line,
            "timeslice={} -> {}",
            Timeslice(*old_us),
            Timeslice(Some(*new_us))
        ),
        SchedChange::Interleave {
            old, new, new_raw, ..
        } => {
            let _ = write!(line, "interleave={} -> ", old.map_or("?", interleave_name));
            match new {
                Some(level) => write!(line, "{}", interleave_name(*level)),
                None => write!(line, "INVALID({new_raw})"),
            }
        }
        SchedChange::Preempt {
            wait,
            manual_timeout,
            timeout_us,
        } => {
            let _ = write!(line, "preempt wait={}", if *wait { "yes" } else { "no" });
            if *manual_timeout {
                write!(line, " timeout={timeout_us} us")
            } else {
                write!(line, " timeout=default")
            }
        }
        SchedChange::RunState {
            old,
            new,
            skip_submit,
            skip_enable,
        } => {
            let _ = write!(
                line,
                "run_state={} -> {}",
                old.map_or("?", run_state_name),
                run_state_name(*new)
            );
            if *skip_submit {
                line.push_str(" skip_submit");
            }
            if *skip_enable {
                line.push_str(" skip_enable");
            }
            Ok(())
        }
        SchedChange::AmdQueue {
            old_priority,
            new_priority,
            old_percentage,
            new_percentage,
        } => write!(
            line,
            "priority={} -> {new_priority} percent={} -> {new_percentage}",
            Opt(*old_priority),
            Opt(*old_percentage)
        ),
        SchedChange::CuMask { old_bits, new_bits } => {
            write!(line, "cu_mask={} -> {new_bits}", Opt(*old_bits))
        }
    };
}

fn run_state_name(s: RunState) -> &'static str {
    match s {
        RunState::Unscheduled => "unscheduled",
        RunState::Enabled => "enabled",
        RunState::Disabled => "disabled",
    }
}

fn engine_name(engine: Engine) -> &'static str {
    match engine {
        Engine::Graphics => "GRAPHICS",
        Engine::Copy => "COPY",
        Engine::Nvdec => "NVDEC",
        Engine::Nvenc => "NVENC",
        Engine::Nvjpeg => "NVJPEG",
        Engine::Ofa => "OFA",
        Engine::Sec2 => "SEC2",
        Engine::Other => "OTHER",
    }
}

fn interleave_name(level: Interleave) -> &'static str {
    match level {
        Interleave::Low => "LOW",
        Interleave::Medium => "MEDIUM",
        Interleave::High => "HIGH",
    }
}

fn cause_name(cause: DestroyCause) -> &'static str {
    match cause {
        DestroyCause::Free => "free",
        DestroyCause::ParentFree => "parent_free",
        DestroyCause::FdClose => "fd_close",
        DestroyCause::ProcessExit => "process_exit",
        DestroyCause::TracerExit => "tracer_exit",
        DestroyCause::KfdRelease => "kfd_release",
    }
}

/// A value or `?`.
pub(crate) struct Opt<T>(pub(crate) Option<T>);

impl<T: Display> Display for Opt<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Some(v) => v.fmt(f),
            None => f.write_str("?"),
        }
    }
}

/// `1024 us`, or `?` without the unit.
struct Timeslice(Option<u64>);

impl Display for Timeslice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(us) => write!(f, "{us} us"),
            None => f.write_str("?"),
        }
    }
}

/// An errno (either sign) by name when it is a common one, else its positive number (the text
/// line's format: a fixed list, narrower than [`crate::event::errno_name`]'s).
pub(crate) struct Errno(pub(crate) i32);

impl Display for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let e = self.0.unsigned_abs();
        let name = match i32::try_from(e).unwrap_or(i32::MAX) {
            libc::EPERM => "EPERM",
            libc::ENOENT => "ENOENT",
            libc::EIO => "EIO",
            libc::EAGAIN => "EAGAIN",
            libc::ENOMEM => "ENOMEM",
            libc::EFAULT => "EFAULT",
            libc::EBUSY => "EBUSY",
            libc::ENODEV => "ENODEV",
            libc::EINVAL => "EINVAL",
            libc::ENOTTY => "ENOTTY",
            _ => return write!(f, "{e}"),
        };
        f.write_str(name)
    }
}
