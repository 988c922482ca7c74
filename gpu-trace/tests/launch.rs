//! `gpu-trace [OPTIONS] -- CMD`: the command is started once the programs are attached, it and
//! every process it creates are traced (and no other process), tracing stops when it exits and
//! gpu-trace exits with its status.
//!
//! The command is a shell running this test binary's #[ignore]d `launched_parent`, which
//! issues RM-shaped schedules on the watched device, forks `launched_grandchild` (more
//! schedules) and exits 7; meanwhile `noise` issues the same calls from outside the command.
//! Kernel tests need root; without it they print `SKIPPED: <why>`.

mod common;
mod rel_support;

use std::{
    process::{Child, Stdio},
    time::Duration,
};

use rel_support::*;

const CLIENT: u32 = 0xC1D0_0001;
/// Schedules of the launched process, of the process it forks, and of the noise (per round).
const PARENT_CALLS: usize = 2;
const GRANDCHILD_CALLS: usize = 3;
/// The launched command's exit status.
const STATUS: i32 = 7;

/// `LAUNCH_PIDS` names a file: the launched test writes its own pid and its child's there.
#[test]
#[ignore = "a child of launch_traces_the_command_and_its_children_only"]
fn launched_parent() {
    let Ok(pids_file) = std::env::var("LAUNCH_PIDS") else {
        return;
    };
    let dev = watched();
    let s = Schedule::new(CLIENT, 0x5C00_0001);
    for _ in 0..PARENT_CALLS {
        assert_eq!(s.issue(&dev), -ENOTTY);
    }
    let grandchild = child("launched_grandchild")
        .status_pid()
        .expect("starting the grandchild");
    std::fs::write(&pids_file, format!("{} {}", std::process::id(), grandchild)).unwrap();
    std::process::exit(STATUS);
}

#[test]
#[ignore = "a child of launched_parent"]
fn launched_grandchild() {
    let dev = watched();
    let s = Schedule::new(CLIENT, 0x5C00_0002);
    for _ in 0..GRANDCHILD_CALLS {
        assert_eq!(s.issue(&dev), -ENOTTY);
    }
    // Without the process connector, /proc decides: the process must still be there when
    // its records are read (the test that runs so gives it this long).
    std::thread::sleep(Duration::from_millis(env_num("LAUNCH_LINGER_MS", 0)));
}

/// The same calls from a process outside the command, until killed.
#[test]
#[ignore = "a child of launch_traces_the_command_and_its_children_only"]
fn noise() {
    let dev = watched();
    let s = Schedule::new(CLIENT, 0x5C00_0003);
    loop {
        assert_eq!(s.issue(&dev), -ENOTTY);
        std::thread::sleep(Duration::from_millis(2));
    }
}

trait StatusPid {
    /// Runs the command to its end; returns its pid (it must succeed).
    fn status_pid(&mut self) -> std::io::Result<u32>;
}

impl StatusPid for std::process::Command {
    fn status_pid(&mut self) -> std::io::Result<u32> {
        let mut c = self.spawn()?;
        let pid = c.id();
        assert!(c.wait()?.success(), "the grandchild failed");
        Ok(pid)
    }
}

fn kill(mut c: Child) {
    let _ = c.kill();
    let _ = c.wait();
}

#[test]
fn launch_traces_the_command_and_its_children_only() {
    let test = "launch_traces_the_command_and_its_children_only";
    if skip_unless_root(test) {
        return;
    }
    let f = launched_run(test, false);
    assert!(!f.stderr.contains("process connector"), "{}", f.stderr);
}

/// Where the kernel's process connector cannot be used (here: gpu-trace in a network namespace
/// of its own, where the connector refuses the subscription), the command's children are found
/// from their parent chain in /proc, with a warning.
#[test]
fn without_the_process_connector_children_are_found_from_proc() {
    let test = "without_the_process_connector_children_are_found_from_proc";
    if skip_unless_root(test) {
        return;
    }
    let f = launched_run(test, true);
    assert!(
        f.stderr.contains("children are found from /proc instead"),
        "{}",
        f.stderr
    );
}

/// At the bound of processes followed at once, those that exited leave the set: a command
/// that first runs (and reaps) 100 short processes, past a bound lowered to 16 (a debug
/// build's test variable; the release bound is 2^20), still has its next child and grandchild
/// traced whole, and nothing is counted as not traced. Before processes that exited were
/// pruned, the 16th process was the last followed.
#[test]
fn processes_that_exited_leave_the_followed_set_at_its_bound() {
    let test = "processes_that_exited_leave_the_followed_set_at_its_bound";
    if skip_unless_root(test) {
        return;
    }
    let f = launched_run_after(test, false, 100, Some(16));
    assert!(!f.stderr.contains("were not traced"), "{}", f.stderr);
    let stats = json_stats(&f.stdout);
    assert!(stats["unreported"]["unfollowed"].is_null(), "{stats}");
}

/// At the bound with every follower alive, a new process of the command is not traced, and
/// that is never silent: counted while the run goes on (`gpu_trace_unreported_total{reason=
/// "unfollowed"}`, read each second), in the statistics at the end and said on stderr. The
/// command (bound lowered to 2) starts three processes that stay alive: the first is followed
/// (with the command, 2), the next two are not — exactly 2, known from the script.
#[test]
fn processes_past_the_bound_of_live_ones_are_counted_while_tracing() {
    let test = "processes_past_the_bound_of_live_ones_are_counted_while_tracing";
    if skip_unless_root(test) {
        return;
    }
    let fifo = common::scratch().join(format!("{test}.fifo"));
    common::mkfifo(&fifo, 0o600);
    let port = free_port();
    let metrics = format!("127.0.0.1:{port}");
    // The sleeps are killed by the script once the test has seen the count (the FIFO's line).
    let script = "sleep 120 & a=$!; sleep 120 & b=$!; sleep 120 & c=$!; read go < \"$0\"; \
                  kill $a $b $c; exit 0";
    let mut cmd = std::process::Command::new(gpu_trace_bin());
    cmd.env("GPU_TRACE_TEST_MAX_FOLLOWED", "2");
    let traced = Traced::start_with(
        cmd,
        &[
            "--watch-device",
            WATCHED,
            "--format",
            "json",
            "--metrics",
            &metrics,
            "--",
            "sh",
            "-c",
            script,
            fifo.to_str().unwrap(),
        ],
    )
    .unwrap_or_else(|e| panic!("{test}: {e}"));
    let series = r#"gpu_trace_unreported_total{reason="unfollowed"}"#;
    wait_scraped(port, series, |v| v == 2.0, "two processes not followed");
    std::fs::write(&fifo, "go\n").expect("the command reads the FIFO");
    let f = traced.wait(Duration::from_secs(60));
    assert_eq!(f.status.code(), Some(0), "{}", f.stderr);
    assert!(
        f.stderr.contains(
            "warning: 2 processes the command created were not traced: 2 of its processes were \
             alive at once"
        ),
        "{}",
        f.stderr
    );
    assert_eq!(json_stats(&f.stdout)["unreported"]["unfollowed"], 2);
}

/// Runs the launch scenario (module doc) and checks its events, counts and exit status;
/// `own_netns`: gpu-trace runs under `unshare -n`.
fn launched_run(test: &str, own_netns: bool) -> Finished {
    launched_run_after(test, own_netns, 0, None)
}

/// [`launched_run`], the command running `short` short processes (`/bin/true`) first, with
/// the bound of followed processes `bound` when given.
fn launched_run_after(test: &str, own_netns: bool, short: usize, bound: Option<usize>) -> Finished {
    let pids_file = common::scratch().join(format!("{test}.pids"));
    let _ = std::fs::remove_file(&pids_file);
    let noise = child("noise")
        .stdout(Stdio::null())
        .spawn()
        .expect("spawning the noise");
    let exe = std::env::current_exe().unwrap();
    let exe = exe.to_str().unwrap();
    // A shell in between: the schedules come from its child and grandchild.
    let script = format!(
        "i=0; while [ $i -lt {short} ]; do /bin/true; i=$((i + 1)); done; \
         \"$0\" --ignored --exact launched_parent --test-threads 1 -q >/dev/null; exit $?"
    );
    let mut cmd = if own_netns {
        let mut c = std::process::Command::new("unshare");
        c.args(["-n", gpu_trace_bin().to_str().unwrap()]);
        c.env("LAUNCH_LINGER_MS", "500");
        c
    } else {
        std::process::Command::new(gpu_trace_bin())
    };
    cmd.env("LAUNCH_PIDS", &pids_file);
    if let Some(n) = bound {
        cmd.env("GPU_TRACE_TEST_MAX_FOLLOWED", n.to_string());
    }
    let traced = Traced::start_with(
        cmd,
        &[
            "--watch-device",
            WATCHED,
            "--format",
            "json",
            "--",
            "sh",
            "-c",
            &script,
            exe,
        ],
    );
    let f = traced
        .unwrap_or_else(|e| {
            panic!("{test}: {e}");
        })
        .wait(Duration::from_secs(60));
    kill(noise);
    assert_eq!(f.status.code(), Some(STATUS), "{}", f.stderr);
    let pids = std::fs::read_to_string(&pids_file).expect("the launched test wrote its pids");
    let pids: Vec<u64> = pids.split(' ').map(|p| p.parse().unwrap()).collect();
    let (parent, grandchild) = (pids[0], pids[1]);
    let events = json_events(&f.stdout);
    let count = |pid: u64| {
        events
            .iter()
            .filter(|e| e["event"] == "SCHEDULE" && e["pid"] == pid)
            .count()
    };
    assert_eq!(count(parent), PARENT_CALLS, "{}", tail(&f.stdout));
    assert_eq!(count(grandchild), GRANDCHILD_CALLS, "{}", tail(&f.stdout));
    let others: Vec<_> = events
        .iter()
        .filter(|e| e["pid"] != parent && e["pid"] != grandchild)
        .collect();
    assert!(others.is_empty(), "events of other processes: {others:?}");
    // The statistics as usual, counting the command's schedules.
    let stats = json_stats(&f.stdout);
    assert_eq!(
        stats["schedule"],
        (PARENT_CALLS + GRANDCHILD_CALLS) as u64,
        "{stats}"
    );
    f
}

#[test]
fn launch_refuses_pid_and_a_missing_command() {
    let out = std::process::Command::new(gpu_trace_bin())
        .args(["--pid", "1", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--pid"), "{err}");
    let out = std::process::Command::new(gpu_trace_bin())
        .args(["--user", "root"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "--user needs -- CMD");
}

/// A command ended by a signal N: gpu-trace exits 128 + N, as shells do; `--user` runs the
/// command as that user (its uid as `id -u` prints it, on gpu-trace's stdout).
#[test]
fn launch_passes_a_signal_through_and_runs_as_the_user() {
    let test = "launch_passes_a_signal_through_and_runs_as_the_user";
    if skip_unless_root(test) {
        return;
    }
    let run = |args: &[&str]| {
        Traced::start(args)
            .unwrap_or_else(|e| panic!("{test}: {e}"))
            .wait(Duration::from_secs(60))
    };
    let f = run(&["--watch-device", WATCHED, "--", "sh", "-c", "kill -TERM $$"]);
    assert_eq!(f.status.code(), Some(128 + libc::SIGTERM), "{}", f.stderr);
    let f = run(&[
        "--watch-device",
        WATCHED,
        "--format",
        "json",
        "--user",
        "nobody",
        "--",
        "sh",
        "-c",
        "id -u; id -g; exit 3",
    ]);
    assert_eq!(f.status.code(), Some(3), "{}", f.stderr);
    let ids: Vec<&str> = f.stdout.lines().filter(|l| !l.starts_with('{')).collect();
    // SAFETY: getpwnam with a NUL-terminated name; the entry is read at once.
    let (uid, gid) = unsafe {
        let pw = libc::getpwnam(c"nobody".as_ptr());
        assert!(!pw.is_null(), "no user nobody here");
        ((*pw).pw_uid, (*pw).pw_gid)
    };
    assert_eq!(ids, [uid.to_string(), gid.to_string()], "{}", f.stdout);
    // An unknown user is bad usage, before anything starts.
    let out = std::process::Command::new(gpu_trace_bin())
        .args(["--user", "no-such-user-gpu-trace", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
}

/// Tracing that ends first (`--duration`) leaves the command running, says so, and exits with
/// gpu-trace's own status.
#[test]
fn a_command_still_running_when_tracing_ends_is_left_running() {
    let test = "a_command_still_running_when_tracing_ends_is_left_running";
    if skip_unless_root(test) {
        return;
    }
    let marker = common::scratch().join("still_running");
    let _ = std::fs::remove_file(&marker);
    let script = format!("sleep 1; touch {}", marker.display());
    let f = Traced::start(&[
        "--watch-device",
        WATCHED,
        "-d",
        "0.3",
        "--",
        "sh",
        "-c",
        &script,
    ])
    .unwrap_or_else(|e| panic!("{test}: {e}"))
    .wait(Duration::from_secs(60));
    assert_eq!(f.status.code(), Some(0), "{}", f.stderr);
    assert!(
        f.stderr.contains("still runs, no longer traced"),
        "{}",
        f.stderr
    );
    // It was not killed: it finishes its work.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !marker.exists() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        marker.exists(),
        "the command went on after gpu-trace exited"
    );
}

/// A scratch directory holding a file that is not executable, a script whose `#!` names a
/// program that does not exist, and a root-only script.
fn unrunnable_files(test: &str) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = common::scratch().join(test);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let write = |name: &str, text: &str, mode: u32| {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
    };
    write("noexec", "echo never\n", 0o644);
    write(
        "badinterp",
        "#!/nonexistent/interpreter\necho never\n",
        0o755,
    );
    write("rootonly", "#!/bin/sh\necho never\n", 0o700);
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

/// `-- CMD` that cannot run: said on stderr before anything is traced, exit 126 (found, cannot
/// be executed) or 127 (not found) as a shell would, for the main trace and `gpu-trace api`.
#[test]
fn a_command_that_cannot_run_says_why_and_exits_as_a_shell_would() {
    let test = "a_command_that_cannot_run_says_why_and_exits_as_a_shell_would";
    if skip_unless_root(test) {
        return;
    }
    let dir = unrunnable_files(test);
    let d = dir.to_str().unwrap().to_string();
    let cases: Vec<(String, i32, String)> = vec![
        (
            "no-such-command-gpu-trace".into(),
            127,
            "no-such-command-gpu-trace: command not found (no such program in any directory of \
             PATH: check the name, or give its path, e.g. ./NAME)"
                .into(),
        ),
        (
            format!("{d}/absent"),
            127,
            format!("{d}/absent: no such file (check the path)"),
        ),
        (
            d.clone(),
            126,
            format!("{d}: is a directory, not a program (name the program inside it)"),
        ),
        (
            format!("{d}/noexec"),
            126,
            format!(
                "{d}/noexec: permission denied: not executable (chmod +x {d}/noexec, or give it \
                 to its interpreter: -- sh {d}/noexec)"
            ),
        ),
        (
            format!("{d}/badinterp"),
            126,
            format!(
                "{d}/badinterp: bad interpreter: its first line, #!/nonexistent/interpreter, \
                 names a program that does not exist (fix that line, or start the script with \
                 an interpreter that exists: -- sh SCRIPT)"
            ),
        ),
    ];
    for (cmd, code, why) in &cases {
        for api in [false, true] {
            let mut args = vec![];
            if api {
                args.push("api");
            } else {
                args.extend(["--watch-device", WATCHED, "--no-share"]);
            }
            args.extend(["--", cmd.as_str(), "arg"]);
            let out = std::process::Command::new(gpu_trace_bin())
                .args(&args)
                .stdin(Stdio::null())
                .output()
                .unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(*code), "{args:?}: {err}");
            assert_eq!(
                err.lines().last(),
                Some(format!("gpu-trace: {why}").as_str())
            );
            assert!(out.stdout.is_empty(), "{args:?}: nothing traced: {err}");
            assert!(!err.contains("hooks:"), "{args:?}: nothing attached: {err}");
        }
    }
    // Found and executable for root, but not for --user nobody: exec fails in the child, which
    // says so; 126.
    let script = format!("{d}/rootonly");
    let f = Traced::start(&[
        "--watch-device",
        WATCHED,
        "--no-share",
        "--user",
        "nobody",
        "--",
        &script,
    ])
    .unwrap_or_else(|e| panic!("{test}: {e}"))
    .wait(Duration::from_secs(60));
    assert_eq!(f.status.code(), Some(126), "{}", f.stderr);
    assert!(
        f.stderr.lines().any(|l| l
            == format!(
                "gpu-trace: {script}: cannot run it: permission denied (not executable for this \
                 user)"
            )),
        "{}",
        f.stderr
    );
}

/// SIGTERM ends `gpu-trace -- CMD` and `gpu-trace api -- CMD` alike: sent to the process group
/// (as `timeout` and service managers do), the command ends too and both exit 143, its status;
/// sent to gpu-trace alone, the command is left running, both say so in one line (one
/// `gpu-trace:` prefix) and exit 0, gpu-trace's own status.
#[test]
fn sigterm_ends_the_main_trace_and_api_alike() {
    use std::os::unix::process::CommandExt as _;
    let test = "sigterm_ends_the_main_trace_and_api_alike";
    if skip_unless_root(test) {
        return;
    }
    for api in [false, true] {
        for group in [true, false] {
            let marker = common::scratch().join(format!("{test}-{api}-{group}.running"));
            let _ = std::fs::remove_file(&marker);
            // The command says it runs (exec'd, so traced), then waits to be ended (not on
            // gpu-trace's stderr, which the test reads to its end).
            let script = format!("touch {}; exec sleep 120 >/dev/null 2>&1", marker.display());
            let mut cmd = std::process::Command::new(gpu_trace_bin());
            cmd.process_group(0);
            let mut args = vec![];
            if api {
                args.push("api");
            } else {
                args.extend(["--watch-device", WATCHED, "--no-share", "-q"]);
            }
            args.extend(["--", "sh", "-c", &script]);
            let mut child = cmd
                .args(&args)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            let deadline = std::time::Instant::now() + Duration::from_secs(60);
            while !marker.exists() {
                assert!(std::time::Instant::now() < deadline, "{args:?}: never ran");
                assert!(
                    child.try_wait().unwrap().is_none(),
                    "{args:?}: exited early"
                );
                std::thread::sleep(Duration::from_millis(20));
            }
            let pid = child.id() as i32;
            // SAFETY: kill(2) on our own child, or on the process group it leads.
            unsafe { libc::kill(if group { -pid } else { pid }, libc::SIGTERM) };
            let out = child.wait_with_output().unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            let said: Vec<&str> = err.lines().filter(|l| l.contains("still runs")).collect();
            if group {
                assert_eq!(
                    out.status.code(),
                    Some(128 + libc::SIGTERM),
                    "{args:?}: {err}"
                );
                assert!(said.is_empty(), "{args:?}: {err}");
            } else {
                assert_eq!(out.status.code(), Some(0), "{args:?}: {err}");
                assert_eq!(said.len(), 1, "{args:?}: {err}");
                let line = said[0];
                let left = line
                    .strip_prefix("gpu-trace: the command (pid ")
                    .and_then(|r| {
                        r.strip_suffix(
                            ") still runs, no longer traced; the exit status is gpu-trace's own",
                        )
                    })
                    .unwrap_or_else(|| panic!("{args:?}: {line:?}"));
                let left: i32 = left.parse().unwrap();
                // SAFETY: kill(2) on the command this test had started.
                unsafe { libc::kill(left, libc::SIGKILL) };
            }
        }
    }
}
