//! The verdict: what the guest handed back, read once into typed values ([`guest`],
//! [`events`]), and the checks, one plain function per check id, grouped by theme and
//! registered in [`CHECKS`] (the `checks!` table, which also makes each check a `#[test]` over
//! the lab's saved results: [`each`]) in the order the report prints them.
//!
//! A check returns its title and its outcome: pass, fail (why) or not applicable (why). The
//! table says what each check needs of the kernel's KFD ([`Needs`]): where the kernel cannot
//! serve that, the outcome is not applicable, with the reason `a.kfd` asserts.

use anyhow::{Result, bail};

mod amd;
mod deep;
mod deny;
mod entry;
mod events;
mod guest;
mod kernel;
mod nvidia;
#[cfg(test)]
mod tests;

pub(super) use guest::Results;
use guest::{Guest, Record, Run};
use kernel::Kfd;

/// Values the test client puts in its CREATE_QUEUE calls (lab/client.c `LAB_*`).
const LAB_GPU_ID: u64 = 0x4c_4142;
const EINVAL: i64 = 22;
const ENOTTY: i64 = 25;
const EPERM: i64 = 1;
const EFAULT: i64 = 14;
const EADDRNOTAVAIL: i64 = 99;

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

/// What one check function found: its title (some depend on the kernel) and the outcome.
#[derive(Debug)]
struct Judged {
    title: &'static str,
    status: Status,
    detail: String,
}

impl Judged {
    fn new(title: &'static str, ok: bool, detail: impl Into<String>) -> Self {
        let status = if ok { Status::Pass } else { Status::Fail };
        Self {
            title,
            status,
            detail: detail.into(),
        }
    }
    fn fail(title: &'static str, detail: impl Into<String>) -> Self {
        Self::new(title, false, detail)
    }
    /// Passes with `detail` when nothing went wrong, else fails naming the problems.
    fn of(title: &'static str, problems: &[String], detail: impl FnOnce() -> String) -> Self {
        if problems.is_empty() {
            Self::new(title, true, detail())
        } else {
            Self::fail(title, problems.join("; "))
        }
    }
}

#[derive(Debug)]
pub(super) struct Check {
    id: &'static str,
    title: &'static str,
    status: Status,
    detail: String,
}

impl Check {
    pub(super) fn fail(id: &'static str, title: &'static str, detail: impl Into<String>) -> Self {
        Self {
            id,
            title,
            status: Status::Fail,
            detail: detail.into(),
        }
    }
}

/// What a check needs of the guest: the kernel's KFD (see [`Kfd`]), or 32-bit x86 processes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Needs {
    /// Nothing: judged on every kernel.
    Nothing,
    /// KFD's functions in the kernel (attach only).
    KfdFunctions,
    /// KFD calls that succeed (the client's `kprobe` and `lsm` steps open /dev/kfd before
    /// anything else).
    KfdCalls,
    /// A 32-bit x86 process (`lab/client32.c`): the compat ioctl path of an x86-64 kernel.
    X86Compat,
}

/// Why a check that needs a 32-bit x86 client is not applicable on a guest of another
/// architecture.
const NOT_X86: &str =
    "this guest is not x86-64: no 32-bit x86 client (its compat processes are AArch32)";

impl Needs {
    /// Why a check with these needs is not applicable in `g` (KFD as `kfd` found it), or
    /// `None` when it is judged.
    fn unmet(self, g: &Guest, kfd: &Kfd) -> Option<&'static str> {
        match self {
            // (A guest that said nothing of its architecture is judged: its checks fail.)
            Needs::X86Compat => g
                .fact("arch")
                .is_some_and(|a| a != "x86_64")
                .then_some(NOT_X86),
            _ => kfd.cannot_serve(self),
        }
    }
}

/// One check: its id (what the lab prints, `.ci/expected-skips` and docs/lab.md name), what it
/// needs, and its function.
struct Entry {
    id: &'static str,
    needs: Needs,
    check: fn(&Guest) -> Judged,
}

/// The table of checks and, for each, a `#[test]` of its own that judges the lab's saved
/// results (see [`each`]).
macro_rules! checks {
    ($($test:ident = $id:literal, $needs:ident, $check:path;)*) => {
        /// Every check, in the report's order.
        const CHECKS: &[Entry] = &[$(Entry { id: $id, needs: $needs, check: $check },)*];

        /// Each check as an ordinary test over a directory of the lab's results (aya's way
        /// of running its VM tests as `#[test]`s): `GPU_TRACE_LAB_RESULTS=target/lab-cache/run
        /// cargo test -p xtask -- --ignored lab::judge::each` judges every `results.log` under
        /// it, one test per check id; a check that failed on any of them fails its test. Ignored
        /// by default: without a lab run there are no results to judge (the recorded logs of
        /// `xtask/testdata` are judged by [`tests`]).
        #[cfg(test)]
        mod each {
            $(
                #[test]
                #[ignore = "judges the lab's saved results: set GPU_TRACE_LAB_RESULTS and pass --ignored"]
                fn $test() {
                    super::tests::judge_results_dir($id);
                }
            )*
        }
    };
}

use Needs::{KfdCalls, KfdFunctions, Nothing, X86Compat};

checks! {
    a_boot = "a.boot", Nothing, kernel::boot;
    lab_limits = "lab.limits", Nothing, kernel::limits;
    a_kfd = "a.kfd", Nothing, kernel::kfd;
    a_kfd_version = "a.kfd_version", KfdCalls, kernel::kfd_version;
    a_lsm = "a.lsm", Nothing, kernel::lsm;
    a_kprobes = "a.kprobes", Nothing, kernel::kprobes;
    a_module_btf = "a.module_btf", Nothing, kernel::module_btf;
    a_doctor = "a.doctor", Nothing, kernel::doctor;
    b_load = "b.load", Nothing, nvidia::load;
    b_records = "b.records", Nothing, nvidia::records;
    b_nvdev = "b.nvdev", Nothing, nvidia::nvdev;
    c_driver = "c.driver", KfdCalls, amd::driver;
    c_trace = "c.trace", KfdCalls, amd::trace;
    d_kprobe = "d.kprobe", KfdCalls, amd::kprobe;
    d_ambiguous = "d.ambiguous", KfdCalls, amd::ambiguous;
    d_fentry = "d.fentry", KfdCalls, amd::fentry;
    f_deep_select = "f.deep_select", KfdFunctions, deep::select;
    f_deep_events = "f.deep_events", KfdCalls, deep::events;
    f_deep_kprobe = "f.deep_kprobe", KfdCalls, deep::kprobe;
    f_deep_release = "f.deep_release", KfdCalls, deep::release;
    g_gpu_ext = "g.gpu_ext", Nothing, nvidia::gpu_ext;
    g_gpu_ext_kprobe = "g.gpu_ext_kprobe", Nothing, nvidia::gpu_ext_kprobe;
    g_nvobj = "g.nvobj", Nothing, nvidia::nvobj;
    e_lsm = "e.lsm", KfdCalls, deny::lsm;
    e_deny_nv = "e.deny_nv", Nothing, deny::nv;
    e_deny_amd = "e.deny_amd", KfdCalls, deny::amd;
    e_deny_fork_nv = "e.deny_fork_nv", Nothing, deny::fork_nv;
    e_deny_finn_nv = "e.deny_finn_nv", Nothing, deny::finn_nv;
    e_deny_compat_nv = "e.deny_compat_nv", X86Compat, deny::compat_nv;
    e_deny_cgroup_nv = "e.deny_cgroup_nv", Nothing, deny::cgroup_nv;
    e_deny_cgroup_amd = "e.deny_cgroup_amd", KfdCalls, deny::cgroup_amd;
    z_nv_entry = "z.nv_entry", Nothing, entry::nv_entry;
    z_kfd_entry = "z.kfd_entry", KfdCalls, entry::kfd_entry;
}

/// Every check of the guest's results, in the report's order.
pub(super) fn judge(r: &Results) -> Vec<Check> {
    let g = Guest::read(r);
    let kfd = Kfd::of(&g);
    let mut c: Vec<Check> = CHECKS
        .iter()
        .map(|e| {
            let j = (e.check)(&g);
            let mut ch = Check {
                id: e.id,
                title: j.title,
                status: j.status,
                detail: j.detail,
            };
            if let Some(why) = e.needs.unmet(&g, &kfd) {
                ch.status = Status::NotApplicable;
                ch.detail = format!("{why}; as judged: {}", ch.detail);
            }
            ch
        })
        .collect();
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

fn indent(text: &str) -> String {
    text.lines()
        .map(|l| format!("        | {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// A traced run's tracer (`LAB <name> tracer_ready=…` is `started`): ready and exited 0, else a
/// problem that quotes its stderr.
fn tracer_problems(run: &Run, started: &Record, problems: &mut Vec<String>) {
    if started.get("tracer_ready") != Some("yes") || run.exit != Some(0) {
        problems.push(format!(
            "tracer ready {:?}, exit {:?}: {}",
            started.get("tracer_ready"),
            run.exit,
            run.stderr.trim()
        ));
    }
}

/// The output's lines that are not JSON, as a problem.
fn no_bad_lines(run: &Run, problems: &mut Vec<String>) {
    if !run.output.bad.is_empty() {
        problems.push(format!("non-JSON output lines: {:?}", run.output.bad));
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
