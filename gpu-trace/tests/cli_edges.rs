//! The CLI's edges, through the real binary (issue 41 items 3 and 7): a mistyped subcommand gets
//! "did you mean", a program typed without `--` gets the line with `--`, a negative time its own
//! message (never a tip that would start a command named `-1`), every option that takes a time
//! takes units, `top` refuses the options it would ignore, options typed before a subcommand are
//! not ignored, and messages carry no stray source indentation, no doubled prefix and no Rust
//! error text (nor a panic on a closed pipe). Only the `-q` and `--pid` tests need root.

#[allow(dead_code)]
mod common;

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_gpu-trace");
const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/two_streams.gtrace"
);
const USAGE: &str = "Usage: gpu-trace [OPTIONS] [-- <CMD>...] [COMMAND]";
const MORE: &str = "For more information, try '--help'.";

/// Exit status, stdout and stderr of `gpu-trace ARGS` (stdin: nothing).
fn run(args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(BIN)
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .expect("running gpu-trace");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A usage error (exit 2, nothing on stdout); its stderr.
fn usage_error(args: &[&str]) -> String {
    let (code, out, err) = run(args);
    assert_eq!(code, Some(2), "{args:?}: {err}");
    assert!(out.is_empty(), "{args:?}: {out}");
    err
}

#[test]
fn a_mistyped_subcommand_gets_did_you_mean() {
    for (typed, meant) in [
        ("replya", "replay"),
        ("merg", "merge"),
        ("topp", "top"),
        ("docter", "doctor"),
    ] {
        assert_eq!(
            usage_error(&[typed]),
            format!(
                "error: unrecognized subcommand '{typed}'\n\n  tip: a similar subcommand \
                 exists: '{meant}'\n\n{USAGE}\n\n{MORE}\n"
            )
        );
    }
    // After options too, their values not taken for the subcommand.
    assert_eq!(
        usage_error(&["-p", "5", "-v", "replya", "run.gtrace"]),
        format!(
            "error: unrecognized subcommand 'replya'\n\n  tip: a similar subcommand exists: \
             'replay'\n\n{USAGE}\n\n{MORE}\n"
        )
    );
    // A word like nothing: the subcommands and how to trace a command.
    assert_eq!(
        usage_error(&["no-such-command"]),
        format!(
            "error: unrecognized subcommand 'no-such-command'\n\n  tip: subcommands: replay, \
             merge, doctor, top, api, completions; to start and trace a command: gpu-trace [OPTIONS] \
             -- CMD\n\n{USAGE}\n\n{MORE}\n"
        )
    );
}

#[test]
fn a_program_typed_without_dash_dash_gets_the_line_with_it() {
    for (args, line) in [
        (&["sleep", "1"][..], "gpu-trace -- sleep 1"),
        (
            &["-v", "--comm", "python3", "sleep", "1"],
            "gpu-trace -v --comm python3 -- sleep 1",
        ),
        (&["sh", "-c", "exit 3"], "gpu-trace -- sh -c 'exit 3'"),
    ] {
        assert_eq!(
            usage_error(args),
            format!(
                "error: unrecognized subcommand '{}'\n\n  tip: did you mean `{line}`? (the \
                 command to start and trace goes after `--`)\n\n{USAGE}\n\n{MORE}\n",
                args[args
                    .iter()
                    .position(|a| *a == "sleep" || *a == "sh")
                    .unwrap()]
            )
        );
    }
}

#[test]
fn a_negative_value_gets_its_own_message_and_no_tip_to_start_it() {
    for (args, says) in [
        (
            &["--duration", "-1"][..],
            "error: invalid value '-1' for '--duration <TIME>': `-1`: the duration must be > 0 \
             and at most 31622400 seconds (a year); leave --duration out to trace until Ctrl-C",
        ),
        (
            &["-d", "-1m"],
            "error: invalid value '-1m' for '--duration <TIME>': `-1m`: the duration must be > \
             0 and at most 31622400 seconds (a year); leave --duration out to trace until Ctrl-C",
        ),
        (
            &["--pid", "-3"],
            "error: invalid value '-3' for '--pid <PID>': `-3` is not a process id (a number \
             from 1 up)",
        ),
        (
            &["api", "--stuck-after", "-5s"],
            "error: invalid value '-5s' for '--stuck-after <TIME>': `-5s`: give a time from \
             10ms to 24h (e.g. 1, 500ms, 5s, 2m)",
        ),
        (
            &["replay", FIXTURE, "--interval", "-1"],
            "error: invalid value '-1' for '--interval <TIME>': `-1` is not a usable interval: \
             give a time from 0.01 s to 1e9 s (e.g. 1, 0.5, 250ms, 1m)",
        ),
    ] {
        let err = usage_error(args);
        assert_eq!(err, format!("{says}\n\n{MORE}\n"), "{args:?}");
    }
    // An unknown option of gpu-trace or api: `-- -x` would start a command named -x.
    assert_eq!(
        usage_error(&["-x"]),
        format!("error: unexpected argument '-x' found\n\n{USAGE}\n\n{MORE}\n")
    );
    assert_eq!(
        usage_error(&["api", "-x"]),
        format!(
            "error: unexpected argument '-x' found\n\nUsage: gpu-trace api [OPTIONS] [-- \
             <CMD>...]\n\n{MORE}\n"
        )
    );
}

/// Options typed before a subcommand are gpu-trace's own, which the subcommand never reads: they
/// are not ignored in silence but answered with the line that has them after the subcommand's
/// name, or with the subcommand's own error for them.
#[test]
fn options_before_a_subcommand_are_not_ignored() {
    for (args, before, meant, usage) in [
        (
            &["-v", "replay", FIXTURE][..],
            "-v",
            format!("gpu-trace replay -v {FIXTURE}"),
            "Usage: gpu-trace replay [OPTIONS] <FILE>",
        ),
        (
            &[
                "--format",
                "json",
                "-o",
                "/dev/null",
                "replay",
                FIXTURE,
                "--pid",
                "4",
            ],
            "--format json -o /dev/null",
            format!("gpu-trace replay --format json -o /dev/null {FIXTURE} --pid 4"),
            "Usage: gpu-trace replay [OPTIONS] <FILE>",
        ),
        (
            &["-p", "5", "api", "--resolve"],
            "-p 5",
            "gpu-trace api -p 5 --resolve".to_string(),
            "Usage: gpu-trace api [OPTIONS] [-- <CMD>...]",
        ),
    ] {
        assert_eq!(
            usage_error(args),
            format!(
                "error: `{before}` before `{}` would be ignored: a subcommand's options go after \
                 its name\n\n  tip: did you mean `{meant}`?\n\n{usage}\n\n{MORE}\n",
                meant.split(' ').nth(1).unwrap()
            ),
            "{args:?}"
        );
    }
    // The line it suggests does what the options ask: -v there adds the WORK_SUBMIT lines.
    let (code, out, err) = run(&["replay", "-v", FIXTURE]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains(" WORK_SUBMIT "), "{out}");
    // Where the subcommand refuses them, its own error says why.
    assert_eq!(
        usage_error(&["-v", "top"]),
        format!(
            "error: `gpu-trace top` shows its view instead of event lines: -v/--verbose shapes \
             only the events it writes to -o FILE; add -o FILE, or leave -v/--verbose out\n\n\
             Usage: gpu-trace top [OPTIONS]\n\n{MORE}\n"
        )
    );
    assert_eq!(
        usage_error(&["--duration", "5", "doctor"]),
        format!(
            "error: unexpected argument '--duration' found\n\nUsage: gpu-trace doctor \
             [OPTIONS]\n\n{MORE}\n"
        )
    );
}

/// Exit status and stderr of `gpu-trace ARGS` writing into a pipe whose reader is gone (as
/// after `| head` read what it wanted): its first write fails with EPIPE.
fn into_closed_pipe(args: &[&str]) -> (Option<i32>, String) {
    use std::os::fd::{FromRawFd as _, OwnedFd};
    let mut fds = [0; 2];
    // SAFETY: a two-int array.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: the new pipe's ends, ours alone.
    let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    drop(read);
    let out = Command::new(BIN)
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::from(write))
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Exit status of `gpu-trace ARGS 2>&1 | head` once head has gone: stdout and stderr one pipe
/// whose reader is gone before the first write.
fn both_into_closed_pipe(args: &[&str]) -> Option<i32> {
    use std::os::fd::{FromRawFd as _, OwnedFd};
    let mut fds = [0; 2];
    // SAFETY: a two-int array.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: the new pipe's ends, ours alone.
    let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    drop(read);
    let err = write.try_clone().unwrap();
    Command::new(BIN)
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::from(write))
        .stderr(std::process::Stdio::from(err))
        .status()
        .unwrap()
        .code()
}

/// `gpu-trace … 2>&1 | head`: a closed stderr is no reason to stop with a panic (exit 101,
/// "failed printing to stderr") in the middle of a run: warnings and notes that cannot be
/// written are dropped, as the events are, and the run ends as it would have.
#[test]
fn a_closed_stderr_ends_no_run_with_a_panic() {
    // A replay that warns (--gpu 3 names no GPU of the recording) and notes its inventory.
    assert_eq!(
        both_into_closed_pipe(&["replay", FIXTURE, "--gpu", "3"]),
        Some(0)
    );
    // A usage error is still one (its message has nowhere to go).
    assert_eq!(both_into_closed_pipe(&["replya", FIXTURE]), Some(2));
}

/// `gpu-trace completions bash | head`, `gpu-trace doctor | head`: a quiet end, as coreutils
/// (doctor had panicked: "failed printing to stdout: Broken pipe (os error 32)"); doctor's exit
/// status is still its verdict, the one it gives with its whole report written.
#[test]
fn completions_and_doctor_into_a_closed_pipe_end_quietly() {
    assert_eq!(
        into_closed_pipe(&["completions", "bash"]),
        (Some(0), String::new())
    );
    for args in [&["doctor"][..], &["doctor", "--json"]] {
        let (whole, _, err) = run(args);
        assert!(matches!(whole, Some(0 | 3 | 5)), "{args:?}: {err}");
        assert_eq!(into_closed_pipe(args), (whole, String::new()), "{args:?}");
    }
}

/// stderr of a replay of the fixture with `args` (it must succeed).
fn replay_stderr(args: &[&str]) -> String {
    let mut all = vec!["replay", FIXTURE];
    all.extend_from_slice(args);
    let (code, _, err) = run(&all);
    assert_eq!(code, Some(0), "{args:?}: {err}");
    err
}

#[test]
fn every_option_that_takes_a_time_takes_units() {
    // The parser's values, through the library: a unit, several, and a plain number as before.
    let parse = |args: &[&str]| {
        let mut all = vec!["gpu-trace"];
        all.extend_from_slice(args);
        gpu_trace::cli::parse_from(all).unwrap_or_else(|e| panic!("{args:?}: {e}"))
    };
    let c = parse(&[
        "-d",
        "1m30s",
        "--interval",
        "500ms",
        "--share-interval",
        "250ms",
    ]);
    assert_eq!(c.trace.duration, Some(90.0));
    assert_eq!(c.trace.output.interval, Some(0.5));
    assert_eq!(c.trace.share_interval, 0.25);
    let c = parse(&["-d", "30", "--interval", "2", "--share-interval", "0.5"]);
    assert_eq!(c.trace.duration, Some(30.0));
    assert_eq!(c.trace.output.interval, Some(2.0));
    assert_eq!(c.trace.share_interval, 0.5);
    match parse(&["top", "--expire", "1m"]).command {
        Some(gpu_trace::cli::Command::Top { expire, .. }) => assert_eq!(expire, 60.0),
        other => panic!("{other:?}"),
    }
    match parse(&[
        "api",
        "--interval",
        "250ms",
        "--stuck-after",
        "1m30s",
        "--pid",
        "1",
    ])
    .command
    {
        Some(gpu_trace::cli::Command::Api(a)) => {
            assert_eq!((a.interval, a.stuck_after), (Some(0.25), 90.0));
        }
        other => panic!("{other:?}"),
    }
    // Through the binary: a replay's --interval in units prints what seconds print.
    assert_eq!(
        replay_stderr(&["--interval", "1s", "-o", "/dev/null"]),
        replay_stderr(&["--interval", "1", "-o", "/dev/null"])
    );
    assert_eq!(
        replay_stderr(&["--interval", "500ms", "-o", "/dev/null"]),
        replay_stderr(&["--interval", "0.5", "-o", "/dev/null"])
    );
    // `top --expire 1m` parses (then stops: no terminal here).
    let err = usage_error(&["top", "--expire", "1m"]);
    assert!(
        err.starts_with("gpu-trace: gpu-trace top draws in a terminal"),
        "{err}"
    );
    // A time the parser cannot read says how to write one.
    assert_eq!(
        usage_error(&["api", "--stuck-after", "1m30"]),
        format!(
            "error: invalid value '1m30' for '--stuck-after <TIME>': `1m30` is not a time: give \
             seconds (30, 0.5) or numbers with units (250ms, 90s, 5m, 1m30s, 1h)\n\n{MORE}\n"
        )
    );
}

#[test]
fn top_refuses_the_options_it_would_ignore() {
    let top_usage = "Usage: gpu-trace top [OPTIONS]";
    for (args, shown) in [
        (&["top", "--format", "json"][..], "--format"),
        (&["top", "-v"], "-v/--verbose"),
        (&["top", "--timestamps", "relative"], "--timestamps"),
        (&["top", "--no-stats"], "--no-stats"),
        (&["top", "--show-container"], "--show-container"),
    ] {
        assert_eq!(
            usage_error(args),
            format!(
                "error: `gpu-trace top` shows its view instead of event lines: {shown} shapes \
                 only the events it writes to -o FILE; add -o FILE, or leave {shown} out\n\n\
                 {top_usage}\n\n{MORE}\n"
            )
        );
    }
    assert_eq!(
        usage_error(&["top", "--interval", "1", "-o", "/dev/null"]),
        format!(
            "error: `gpu-trace top` redraws its view every second instead of printing \
             statistics: leave --interval out (with -o FILE, the file gets the statistics at \
             the end)\n\n{top_usage}\n\n{MORE}\n"
        )
    );
    assert_eq!(
        usage_error(&["top", "-q"]),
        format!(
            "error: `gpu-trace top` prints no events or statistics on the terminal anyway (only \
             to -o FILE): leave -q/--quiet out\n\n{top_usage}\n\n{MORE}\n"
        )
    );
    // -q and --interval: nothing would print the statistics blocks (for top, replay, tracing).
    for args in [
        &["-q", "--interval", "1"][..],
        &["replay", FIXTURE, "-q", "--interval", "1"],
    ] {
        let err = usage_error(args);
        assert!(
            err.starts_with(
                "error: the argument '--quiet' cannot be used with '--interval <TIME>'\n"
            ),
            "{args:?}: {err}"
        );
    }
    // With -o FILE they shape the file: accepted (then stopped only for want of a terminal).
    let err = usage_error(&["top", "--format", "json", "-v", "-o", "/dev/null"]);
    assert!(
        err.starts_with("gpu-trace: gpu-trace top draws in a terminal"),
        "{err}"
    );
}

#[test]
fn a_long_comm_warning_has_no_source_indentation() {
    let err = replay_stderr(&["--comm", "nvidia-cuda-mps-server", "-q"]);
    assert_eq!(
        err,
        "gpu-trace: warning: --comm \"nvidia-cuda-mps-server\" is longer than the 15 characters \
         the kernel keeps of a process name: matching \"nvidia-cuda-mps\" (e.g. \
         nvidia-cuda-mps-server and nvidia-cuda-mps-control are both \"nvidia-cuda-mps\")\n"
    );
}

#[test]
fn replay_errors_say_what_to_do_without_rust_s_words() {
    let dir = common::scratch();
    let cut = dir.join("header-cut.gtrace");
    let whole = std::fs::read(FIXTURE).unwrap();
    std::fs::write(&cut, &whole[..16]).unwrap();
    let (code, _, err) = run(&["replay", cut.to_str().unwrap()]);
    assert_eq!(code, Some(1), "{err}");
    assert_eq!(
        err,
        format!(
            "gpu-trace: replaying {}: the recording ends inside its header: the file was cut \
             short (copied while gpu-trace was still writing it?); copy it again, or record \
             again\n",
            cut.display()
        )
    );
    let absent = dir.join("absent.gtrace");
    let (code, _, err) = run(&["replay", absent.to_str().unwrap()]);
    assert_eq!(code, Some(1), "{err}");
    assert_eq!(
        err,
        format!(
            "gpu-trace: replaying {0}: opening {0}: No such file or directory; check the path \
             (`gpu-trace --record FILE` makes a recording)\n",
            absent.display()
        )
    );
    // A recording that is a directory: the system's words, and what to give instead.
    let (code, _, err) = run(&["replay", dir.to_str().unwrap()]);
    assert_eq!(code, Some(1), "{err}");
    assert_eq!(
        err,
        format!(
            "gpu-trace: replaying {0}: opening {0}: Is a directory; name a recording file in it\n",
            dir.display()
        )
    );
    // An output that is a directory: refused before anything runs, a usage error.
    let (code, _, err) = run(&["replay", FIXTURE, "-o", dir.to_str().unwrap()]);
    assert_eq!(code, Some(2), "{err}");
    assert_eq!(
        err,
        format!(
            "gpu-trace: -o {}: is a directory; name a file in it to write\n",
            dir.display()
        )
    );
    // An output that cannot be created where it is named (/proc takes no new files): not the
    // recording's "--record makes a recording" hint, which is for the input.
    let (code, _, err) = run(&["replay", FIXTURE, "--perfetto", "/proc/gpu-trace-test.json"]);
    assert_eq!(code, Some(1), "{err}");
    assert_eq!(
        err,
        format!(
            "gpu-trace: replaying {FIXTURE}: creating /proc/gpu-trace-test.json: No such file or \
             directory; name a file in a directory where files can be created\n"
        )
    );
    // An output in a directory that does not exist: the system's words, without `(os error 2)`.
    let (code, _, err) = run(&[
        "replay",
        FIXTURE,
        "--perfetto",
        dir.join("no/such/dir/t.json").to_str().unwrap(),
    ]);
    assert_eq!(code, Some(2), "{err}");
    assert_eq!(
        err,
        format!(
            "gpu-trace: --perfetto {}: No such file or directory; name a file in an existing \
             directory\n",
            dir.join("no/such/dir/t.json").display()
        )
    );
}

/// Whether this test can load programs (root); if not it says so loudly.
fn can_trace(test: &str) -> bool {
    match gpu_trace::probe::system::check_privileges() {
        Ok(()) => true,
        Err(e) => {
            common::skipped(test, e);
            false
        }
    }
}

/// Whether `line` is one `-q` may print: a warning, or the line that says tracing started.
fn quiet_may_print(line: &str) -> bool {
    line.starts_with("gpu-trace: warning: ")
        || (line.starts_with("gpu-trace: tracing ") && line.contains("; hooks: "))
}

/// `-q`: no events, no statistics, and on stderr warnings only (and the line that says tracing
/// started, which scripts wait for); the `--pid` warnings in one line each, without source
/// indentation.
#[test]
fn quiet_prints_warnings_only() {
    let test = "quiet_prints_warnings_only";
    if !can_trace(test) {
        return;
    }
    let live = ["--watch-device", "/dev/null", "--no-share", "-d", "0.2"];
    // Without -q the start-up notes are there (what this test would see leak).
    let (code, _, err) = run(&[&live[..], &["--", "true"]].concat());
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("\ngpu-trace: (not used: "), "{err}");
    assert!(err.contains("gpu-trace: starting true (pid "), "{err}");
    // With it, not a line more than warnings, for a command as for --pid.
    let (code, out, err) = run(&[&["-q"][..], &live, &["--", "true"]].concat());
    assert_eq!(code, Some(0), "{err}");
    assert!(out.is_empty(), "{out}");
    assert!(err.lines().all(quiet_may_print), "{err}");
    assert_eq!(
        err.lines().filter(|l| l.contains("; hooks: ")).count(),
        1,
        "{err}"
    );
    let (code, out, err) = run(&[&["-q"][..], &live, &["--pid", "8388608"]].concat());
    assert_eq!(code, Some(0), "{err}");
    assert!(out.is_empty(), "{out}");
    assert!(err.lines().all(quiet_may_print), "{err}");
    assert!(
        err.contains("warning: --pid 8388608: no such process now"),
        "{err}"
    );
    // --api says what it attached, unless -q.
    let me = std::process::id().to_string();
    let api = [&live[..], &["--api", "--pid", &me]].concat();
    let (code, _, err) = run(&api);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        err.contains("gpu-trace: --api: 0 of 1 target process(es) map a GPU API library; "),
        "{err}"
    );
    let (code, out, err) = run(&[&["-q"][..], &api].concat());
    assert_eq!(code, Some(0), "{err}");
    assert!(out.is_empty(), "{out}");
    assert!(err.lines().all(quiet_may_print), "{err}");
}

/// `--watch-device` naming nothing: what it needs, not the system's "cannot read … (os error 2)".
#[test]
fn a_watch_device_that_is_not_there_says_what_it_needs() {
    let test = "a_watch_device_that_is_not_there_says_what_it_needs";
    if !can_trace(test) {
        return;
    }
    let absent = common::scratch().join("no-such-device");
    let (code, out, err) = run(&[
        "--watch-device",
        absent.to_str().unwrap(),
        "--no-share",
        "-d",
        "0.2",
    ]);
    assert_eq!(code, Some(3), "{err}");
    assert!(out.is_empty(), "{out}");
    assert_eq!(
        err.lines().last(),
        Some(
            format!(
                "gpu-trace: {}: no such file; --watch-device needs a character device (e.g. \
                 /dev/null)",
                absent.display()
            )
            .as_str()
        ),
        "{err}"
    );
}

/// The `--pid` warnings, one line each, without source indentation: a pid that names no
/// process, and a thread's id (named with its process).
#[test]
fn pid_warnings_are_one_line_each() {
    let test = "pid_warnings_are_one_line_each";
    if !can_trace(test) {
        return;
    }
    let live = [
        "-q",
        "--watch-device",
        "/dev/null",
        "--no-share",
        "-d",
        "0.2",
    ];
    let (code, _, err) = run(&[&live[..], &["--pid", "8388608"]].concat());
    assert_eq!(code, Some(0), "{err}");
    assert!(
        err.lines().any(|l| l
            == "gpu-trace: warning: --pid 8388608: no such process now; waiting for it (a \
                process started later with this id is traced; nothing is printed until then)"),
        "{err}"
    );
    let (tx, rx) = std::sync::mpsc::channel();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let thread = std::thread::spawn(move || {
        // SAFETY: no arguments.
        tx.send(unsafe { libc::gettid() }).unwrap();
        let _ = done_rx.recv();
    });
    let tid = rx.recv().unwrap().to_string();
    let me = std::process::id();
    let (code, _, err) = run(&[&live[..], &["--pid", &tid]].concat());
    drop(done_tx);
    thread.join().unwrap();
    assert_eq!(code, Some(0), "{err}");
    assert!(
        err.lines().any(|l| l
            == format!(
                "gpu-trace: warning: --pid {tid} is a thread of process {me}: the filter is on \
                 processes, so nothing of {tid} will match; use --pid {me}"
            )),
        "{err}"
    );
}

/// `gpu-trace api --resolve | head -1`: the reader closing the pipe is a quiet, successful end
/// (as `replay | head -1`, as coreutils), not "writing the output: Broken pipe" and exit 1.
#[test]
fn api_resolve_into_a_closed_pipe_is_a_quiet_end() {
    use std::os::fd::{FromRawFd as _, OwnedFd};
    let test = "api_resolve_into_a_closed_pipe_is_a_quiet_end";
    if Command::new("cc").arg("--version").output().is_err() {
        common::skipped(test, "no C compiler (cc)");
        return;
    }
    // A process that maps a library defining a GPU API symbol: `cat` with a stand-in
    // libcuda.so.1 preloaded, waiting on its stdin.
    let dir = common::scratch().join(test);
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("cuda.c");
    std::fs::write(&src, "int cuInit(unsigned flags) { return (int)flags; }\n").unwrap();
    let lib = dir.join("libcuda.so.1");
    let built = Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&lib)
        .arg(&src)
        .status()
        .unwrap();
    assert!(built.success());
    let mut target = Command::new("cat")
        .env("LD_PRELOAD", &lib)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let pid = target.id().to_string();
    let maps = format!("/proc/{pid}/maps");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !std::fs::read_to_string(&maps).is_ok_and(|m| m.contains("libcuda.so.1")) {
        assert!(
            std::time::Instant::now() < deadline,
            "cat never mapped the library"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    // Its resolution has lines to print (checked), into a pipe whose reader is gone before
    // gpu-trace starts: its first write fails with EPIPE.
    let (code, out, err) = run(&["api", "--resolve", "--pid", &pid]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.starts_with(&format!("PID {pid} (cat)")), "{out}");
    let mut fds = [0; 2];
    // SAFETY: a two-int array.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: the new pipe's ends, ours alone.
    let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    drop(read);
    let closed = Command::new(BIN)
        .args(["api", "--resolve", "--pid", &pid])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::from(write))
        .output()
        .unwrap();
    let _ = target.kill();
    let _ = target.wait();
    let err = String::from_utf8_lossy(&closed.stderr);
    assert_eq!(closed.status.code(), Some(0), "{err}");
    assert_eq!(err, "", "not a word");
}

/// `--help` of gpu-trace and of `api` lists 126 and 127 among the exit codes, as the man pages
/// (same epilogue) do.
#[test]
fn help_lists_the_exit_codes_of_a_command_that_cannot_run() {
    for args in [&["--help"][..], &["api", "--help"]] {
        let (code, out, err) = run(args);
        assert_eq!(code, Some(0), "{err}");
        let flat = out.split_whitespace().collect::<Vec<_>>().join(" ");
        for line in [
            "126 with -- CMD: CMD was found but cannot be executed (a directory, not executable, \
             a bad #! interpreter), said on stderr",
            "127 with -- CMD: CMD was not found (not on PATH, no such file), said on stderr",
        ] {
            assert!(flat.contains(line), "{args:?}: {line:?} not in:\n{out}");
        }
    }
}

/// `--dump-on stuck` and `--dump-on recursion` fire only on `--api`'s records: without
/// `--api` each is refused with the reason, before anything is traced (a trigger that could
/// never fire would be a silent promise); an unknown trigger names the ones there are; with
/// `--api` and targets every trigger is taken (no usage error: the run then needs root).
#[test]
fn dump_on_an_api_trigger_without_api_is_refused_with_the_reason() {
    for (trigger, record) in [("stuck", "API_STUCK"), ("recursion", "API_RECURSION")] {
        let list = format!("refused,{trigger}");
        let err = usage_error(&["--flight-recorder", "1m", "--dump-on", &list]);
        assert!(
            err.contains(&format!(
                "`--dump-on {trigger}` fires on an API record ({record})"
            )),
            "{err}"
        );
        assert!(err.contains("add --api"), "{err}");
    }
    let err = usage_error(&["--flight-recorder", "1m", "--dump-on", "bogus"]);
    assert!(
        err.contains("give refused, recursion, stuck, dropped or signal-exit"),
        "{err}"
    );
    // The known triggers parse (--help then stops the run at the help).
    let (code, _, err) = run(&[
        "--flight-recorder",
        "1m",
        "--dump-on",
        "refused,recursion,stuck,dropped,signal-exit",
        "--api",
        "--stuck-after",
        "2s",
        "--help",
    ]);
    assert_eq!(code, Some(0), "{err}");
}
