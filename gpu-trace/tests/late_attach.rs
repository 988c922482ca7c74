//! Late attach on the real kernel: a process that opened the watched device (`/dev/full`)
//! before `gpu-trace` started is in the start-up inventory, and its `close()` and exit are
//! reported (`PRETRACE_END`) although it issues no traced call while traced — because the
//! inventory put it in the kernel programs' `TRACKED` map. A second such process that the
//! walk cannot see as holding the device (it holds `/dev/zero`) is the control: nothing of it
//! is reported.
//!
//! Needs root; without it the test prints `SKIPPED: <why>`.

mod common;
mod rel_support;

use std::{
    io::{BufRead, BufReader, Write},
    process::{Command, Stdio},
};

use rel_support::*;

/// A shell that holds `dev` open on fds 7 and 8 before the tracer starts, closes fd 7 when told
/// (`close` on stdin), and exits when told again.
fn holder(dev: &str) -> std::process::Child {
    let script = format!(
        "exec 7<{dev}; exec 8<{dev}; echo ready; read a; exec 7<&-; echo closed; read b; exit 0"
    );
    Command::new("bash")
        .args(["-c", &script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("bash")
}

fn expect_line(out: &mut impl BufRead, want: &str) {
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), want);
}

#[test]
fn a_process_holding_the_device_before_tracing_is_inventoried_and_its_end_reported() {
    let test = "a_process_holding_the_device_before_tracing_is_inventoried_and_its_end_reported";
    if let Some(why) = cannot_trace() {
        common::skipped(test, why);
        return;
    }
    let mut held = holder(WATCHED);
    let mut control = holder("/dev/zero");
    let mut held_out = BufReader::new(held.stdout.take().unwrap());
    let mut control_out = BufReader::new(control.stdout.take().unwrap());
    expect_line(&mut held_out, "ready");
    expect_line(&mut control_out, "ready");
    let (pid, control_pid) = (held.id(), control.id());

    let rec = common::scratch().join("late.gtrace");
    let traced = Traced::start(&[
        "--watch-device",
        WATCHED,
        "--format",
        "json",
        "--record",
        rec.to_str().unwrap(),
    ])
    .unwrap_or_else(|e| panic!("{test}: {e}"));
    // "hooks:" is printed after the inventory was taken and its pids tracked.
    let mut stdin = held.stdin.take().unwrap();
    writeln!(stdin, "close").unwrap();
    expect_line(&mut held_out, "closed");
    writeln!(stdin, "exit").unwrap();
    assert!(held.wait().unwrap().success());
    let mut cstdin = control.stdin.take().unwrap();
    writeln!(cstdin, "close").unwrap();
    expect_line(&mut control_out, "closed");
    writeln!(cstdin, "exit").unwrap();
    assert!(control.wait().unwrap().success());
    // Both exits happened before the interrupt: their records are in the ring buffer, which
    // gpu-trace drains before it prints the statistics.
    let f = traced.interrupt();
    assert!(f.status.success(), "{f:?}");

    // Text inventory on stderr, before any event.
    assert!(
        f.stderr.lines().any(
            |l| l.contains(&format!("PID {pid} bash")) && l.contains("fds=7:watched,8:watched")
        ),
        "inventory line for {pid}:\n{}",
        f.stderr
    );
    assert!(
        !f.stderr.contains(&format!("PID {control_pid} ")),
        "the /dev/zero holder is not inventoried:\n{}",
        f.stderr
    );

    let lines = lines_with_inventory(&f.stdout);
    assert!(
        f.stdout.starts_with("{\"event\":\"INVENTORY\","),
        "{}",
        f.stdout
    );
    assert_eq!(lines[0]["event"], "INVENTORY", "{}", f.stdout);
    let inv = lines[0]["processes"].as_array().unwrap();
    let me = inv
        .iter()
        .find(|p| p["pid"] == pid)
        .unwrap_or_else(|| panic!("{pid} in {inv:?}"));
    assert_eq!(me["comm"], "bash");
    assert_eq!(me["cmdline"][0], "bash");
    assert_eq!(
        me["fds"],
        serde_json::json!([[7, {"kind": "watched"}], [8, {"kind": "watched"}]])
    );
    assert!(me["cgroup"].is_string(), "{me}");

    let ends: Vec<&serde_json::Value> = lines
        .iter()
        .filter(|l| l["event"] == "PRETRACE_END" && l["pid"] == pid)
        .collect();
    // close(7) ends what hung on fd 7; the exit ends what hung on fd 8. Counts unknown.
    assert_eq!(ends.len(), 2, "{}", f.stdout);
    assert_eq!(ends[0]["cause"], "fd_close");
    assert_eq!(ends[0]["fd"], 7);
    assert_eq!(ends[1]["cause"], "process_exit");
    assert!(ends.iter().all(|e| e["tsgs"].is_null()));
    assert!(
        !lines.iter().any(|l| l["pid"] == control_pid),
        "nothing of the control process: {}",
        f.stdout
    );

    // The recording holds the inventory: its replay prints the same lines.
    let replay = Command::new(gpu_trace_bin())
        .args(["replay", "--format", "json"])
        .arg(&rec)
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&rec);
    assert!(replay.status.success());
    let replayed = lines_with_inventory(&String::from_utf8(replay.stdout).unwrap());
    assert_eq!(replayed, lines);
}

/// Every JSON line of a run but the statistics, the INVENTORY line included (`json_events`
/// leaves it out).
fn lines_with_inventory(stdout: &str) -> Vec<serde_json::Value> {
    stdout
        .lines()
        .filter(|l| l.starts_with('{') && !l.starts_with("{\"event\":\"STATS\""))
        .map(|l| serde_json::from_str(l).expect("JSON lines"))
        .collect()
}

/// Child body of `the_walk_counts_the_processes_it_may_not_read`: walks /proc as whoever runs it
/// and prints `processes denied vanished` and the pids found.
#[test]
#[ignore = "child process body for the_walk_counts_the_processes_it_may_not_read"]
fn walk_child_body() {
    use std::os::unix::fs::MetadataExt;
    let opts = gpu_trace::probe::inventory::WalkOptions {
        nvidia: true,
        watched_rdev: Some(std::fs::metadata(WATCHED).unwrap().rdev()),
        ..Default::default()
    };
    let inv = gpu_trace::probe::inventory::walk(std::path::Path::new("/proc"), &opts);
    let pids: Vec<String> = inv.processes.iter().map(|p| p.pid.to_string()).collect();
    println!(
        "WALK {} {} {} {}",
        inv.processes.len(),
        inv.denied,
        inv.vanished,
        pids.join(",")
    );
}

/// `hidepid`-like refusals: walked as user nobody, /proc/PID/fd of root's processes cannot be
/// read. The walk goes on, counts them as `denied`, and lists none of them (the root process
/// holding the watched device among them).
#[test]
fn the_walk_counts_the_processes_it_may_not_read() {
    let test = "the_walk_counts_the_processes_it_may_not_read";
    if let Some(why) = cannot_trace() {
        common::skipped(test, why);
        return;
    }
    let mut held = holder(WATCHED);
    let mut held_out = BufReader::new(held.stdout.take().unwrap());
    expect_line(&mut held_out, "ready");
    let out = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--inh-caps=-all",
        ])
        .arg(std::env::current_exe().unwrap())
        .args([
            "--ignored",
            "--exact",
            "walk_child_body",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .output();
    drop(held.stdin.take());
    let _ = held.kill();
    let _ = held.wait();
    let out = match out {
        Ok(o) => o,
        Err(e) => {
            common::skipped(test, format!("setpriv cannot run: {e}"));
            return;
        }
    };
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    // The one skip: setpriv could not execute the test binary as nobody (a checkout nobody
    // cannot reach). Anything else (the body crashed, was killed, failed, or printed no walk)
    // is a failure of the code under test.
    if common::setpriv_could_not_exec(out.status, &stderr) {
        common::skipped(
            test,
            format!("user nobody cannot run the test binary: {}", stderr.trim()),
        );
        return;
    }
    // libtest prints `test walk_child_body ... ` before the body's line.
    let line = stdout
        .lines()
        .find_map(|l| l.split_once("WALK ").map(|x| x.1))
        .unwrap_or_else(|| {
            panic!(
                "the walk as nobody printed no WALK line ({:?}): {stdout}\n{stderr}",
                out.status
            )
        });
    let f: Vec<&str> = line.split(' ').collect();
    let denied: u32 = f[1].parse().unwrap();
    assert!(
        denied >= 1,
        "root's processes are refused to nobody: {line}"
    );
    assert!(
        !f.get(3)
            .unwrap_or(&"")
            .split(',')
            .any(|p| p == held.id().to_string()),
        "the root holder cannot be seen by nobody: {line}"
    );
    assert!(out.status.success(), "{stdout}");
}

/// The skip of the tests that run a binary as nobody (`common::setpriv_could_not_exec`) is
/// setpriv's real refusal to execute, and nothing else: a program that crashes, is killed, or
/// exits 126 of its own accord under nobody is judged, not skipped.
#[test]
fn only_a_refused_exec_as_nobody_is_a_skip() {
    let test = "only_a_refused_exec_as_nobody_is_a_skip";
    // SAFETY: no arguments.
    if unsafe { libc::geteuid() } != 0 {
        common::skipped(test, "needs root (setpriv switches to nobody)");
        return;
    }
    let as_nobody = |args: &[&str]| {
        let out = Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .args(["--inh-caps=-all", "--"])
            .args(args)
            .output()
            .expect("setpriv runs");
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        (
            common::setpriv_could_not_exec(out.status, &stderr),
            out.status,
            stderr,
        )
    };
    // A file without an execute bit: no capability lets it be executed (126); a missing one (127).
    let plain = common::scratch().join("not-executable");
    std::fs::write(&plain, "#!/bin/sh\n").unwrap();
    let plain = plain.to_str().unwrap();
    for refused in [plain, "/nonexistent/test-binary"] {
        let (skip, status, stderr) = as_nobody(&[refused]);
        assert!(skip, "{refused}: {status:?} {stderr}");
    }
    // What the program does once it runs is never the skip.
    for ran in [
        "kill -SEGV $$",
        "kill -KILL $$",
        "echo 'sh: failed to execute x' >&2; exit 126",
        "echo 'setpriv: failed to execute x' >&2; exit 101",
    ] {
        let (skip, status, stderr) = as_nobody(&["/bin/sh", "-c", ran]);
        assert!(!skip, "{ran}: {status:?} {stderr}");
    }
}

/// `--pid` of a process that does not exist: one warning, and the run goes on (exit 0).
#[test]
fn pid_that_does_not_exist_warns_once_and_waits() {
    let test = "pid_that_does_not_exist_warns_once_and_waits";
    if let Some(why) = cannot_trace() {
        common::skipped(test, why);
        return;
    }
    // pid_max is at most 2^22 (PID_MAX_LIMIT): 2^23 can never exist.
    let out = Command::new(gpu_trace_bin())
        .args([
            "--watch-device",
            WATCHED,
            "--duration",
            "0.2",
            "--pid",
            "8388608",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(
        stderr
            .matches("warning: --pid 8388608: no such process now; waiting for it")
            .count(),
        1,
        "{stderr}"
    );
}
