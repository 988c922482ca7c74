//! `gpu-trace` binary: the CLI edge. Errors become one clear message and a documented exit code.

// Every line to stderr goes through `gpu_trace::say!`: `eprintln!` panics on a closed stderr.
#![deny(clippy::print_stderr)]

use std::process::ExitCode;

use anyhow::Context as _;
use gpu_trace::{
    cli::{Cli, Command, Vendor},
    launch::LaunchError,
    loader::LoadError,
    run::{self, RunError},
};

/// Exit codes (documented in `--help` and docs/troubleshooting.md).
const EXIT_RUNTIME: u8 = 1;
const EXIT_USAGE: u8 = 2;
const EXIT_UNSUPPORTED: u8 = 3;
const EXIT_DROPPED: u8 = 4;
// `doctor`'s "tracing cannot work" is the same code as a run that cannot start.
const _: () = assert!(gpu_trace::doctor::exit::UNSUPPORTED == EXIT_UNSUPPORTED);
// --help and the man pages list these codes (cli::exit).
const _: () = assert!(
    gpu_trace::cli::exit::RUNTIME == EXIT_RUNTIME
        && gpu_trace::cli::exit::USAGE == EXIT_USAGE
        && gpu_trace::cli::exit::UNSUPPORTED == EXIT_UNSUPPORTED
        && gpu_trace::cli::exit::DROPPED == EXIT_DROPPED
);

fn main() -> ExitCode {
    let mut cli = gpu_trace::cli::parse();
    run::set_quiet(match &cli.command {
        Some(Command::Replay { output, .. }) => output.quiet,
        Some(Command::Merge { output, .. }) => output.quiet,
        Some(Command::Top { trace, .. }) => trace.output.quiet,
        _ => cli.trace.output.quiet,
    });
    for warning in cli.trace.output.normalize_comms() {
        gpu_trace::say!("gpu-trace: warning: {warning}");
    }
    if let Err(code) = install_stop_signals(&cli)
        .and_then(|()| check_output_paths(&cli))
        .and_then(|()| check_terminal(&cli))
    {
        return code;
    }
    let result = match cli.command {
        Some(Command::Doctor { json }) => return doctor(json),
        Some(Command::Completions { shell }) => return completions(shell),
        Some(Command::Api(args)) => return api(&args),
        Some(Command::Replay {
            file,
            top,
            mut output,
        }) => {
            for warning in output.normalize_comms() {
                gpu_trace::say!("gpu-trace: warning: {warning}");
            }
            let result = if top {
                replay_top(&file, output)
            } else {
                run::replay(&file, &output)
            };
            result
                .map_err(|e| replay_error(e, &file))
                .with_context(|| format!("replaying {}", file.display()))
        }
        Some(Command::Merge { files, mut output }) => {
            for warning in output.normalize_comms() {
                gpu_trace::say!("gpu-trace: warning: {warning}");
            }
            run::merge(&files, &output).context("merging the recordings")
        }
        Some(Command::Top { mut trace, expire }) => {
            for warning in trace.output.normalize_comms() {
                gpu_trace::say!("gpu-trace: warning: {warning}");
            }
            top(*trace, expire)
        }
        None => {
            let mut args = cli.trace;
            args.launch = cli.launch;
            args.launch_user = cli.user;
            trace(args)
        }
    };
    exit_code(result)
}

/// A live run notes SIGINT and SIGTERM from now on: one that comes during start-up (before
/// the programs are attached) ends the run cleanly instead of being lost. Replay and doctor
/// keep the default (Ctrl-C ends them at once).
fn install_stop_signals(cli: &Cli) -> Result<(), ExitCode> {
    if matches!(cli.command, None | Some(Command::Top { .. }))
        && let Err(e) = run::install_stop_signals()
    {
        gpu_trace::say!("gpu-trace: installing the signal handlers: {e}");
        return Err(ExitCode::from(EXIT_RUNTIME));
    }
    Ok(())
}

/// Outputs that would overwrite the input or each other: refused before anything is opened.
fn check_output_paths(cli: &Cli) -> Result<(), ExitCode> {
    let paths = match &cli.command {
        Some(Command::Replay { file, output, .. }) => run::check_paths(Some(file), output, None),
        Some(Command::Merge { files, output }) => {
            (files.iter()).try_for_each(|file| run::check_paths(Some(file), output, None))
        }
        Some(Command::Doctor { .. } | Command::Completions { .. } | Command::Api(_)) => Ok(()),
        Some(Command::Top { trace, .. }) => {
            run::check_paths(None, &trace.output, trace.record.as_deref())
        }
        None => run::check_paths(None, &cli.trace.output, cli.trace.record.as_deref()),
    };
    paths.map_err(|why| {
        gpu_trace::say!("gpu-trace: {}", plain_words(&why.to_string()));
        ExitCode::from(EXIT_USAGE)
    })
}

/// The views draw in a terminal: without one they would fail at the first frame with an
/// errno, after tracing had started.
fn check_terminal(cli: &Cli) -> Result<(), ExitCode> {
    let view = match &cli.command {
        Some(Command::Top { .. }) => Some("gpu-trace top"),
        Some(Command::Replay { top: true, .. }) => Some("replay --top"),
        _ => None,
    };
    if let Some(view) = view {
        use std::io::IsTerminal as _;
        if !std::io::stdout().is_terminal() || !std::io::stdin().is_terminal() {
            gpu_trace::say!(
                "gpu-trace: {view} draws in a terminal and reads its keys, but standard input or \
                 output is not one; without the view, gpu-trace prints one line per event \
                 (add -o FILE to keep them)"
            );
            return Err(ExitCode::from(EXIT_USAGE));
        }
    }
    Ok(())
}

/// `gpu-trace api`: `--resolve`, or tracing (exit status: the launched command's).
fn api(args: &gpu_trace::cli::ApiArgs) -> ExitCode {
    use gpu_trace::api::trace::TraceError;
    if !args.resolve {
        return match run::run_api(args) {
            Ok(t) => {
                let status = command_status_after_stop().unwrap_or(t.child_status);
                status.map_or(ExitCode::SUCCESS, |s| ExitCode::from(s.clamp(0, 255) as u8))
            }
            // Standard output closed by its reader (`| head`): a quiet end, as coreutils.
            Err(TraceError::Api(e)) if closed_pipe(&e) => ExitCode::SUCCESS,
            Err(e) => {
                gpu_trace::say!("gpu-trace: {}", plain_words(&e.to_string()));
                if let TraceError::Launch(LaunchError::CannotRun { code, .. }) = &e {
                    return ExitCode::from(*code);
                }
                let usage = matches!(&e, TraceError::NoTarget)
                    || matches!(&e, TraceError::Api(a) if a.is_usage());
                ExitCode::from(if usage { EXIT_USAGE } else { EXIT_RUNTIME })
            }
        };
    }
    match gpu_trace::api::resolve(args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(EXIT_RUNTIME),
        // `api --resolve | head -1`: a quiet, successful end, as `replay | head -1` is.
        Err(e) if closed_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            gpu_trace::say!("gpu-trace: {}", plain_words(&e.to_string()));
            ExitCode::from(if e.is_usage() {
                EXIT_USAGE
            } else {
                EXIT_RUNTIME
            })
        }
    }
}

/// `gpu-trace api`'s standard output closed by its reader (EPIPE): nothing is wrong, the reader
/// took what it wanted.
fn closed_pipe(e: &gpu_trace::api::ApiError) -> bool {
    matches!(e, gpu_trace::api::ApiError::Output(io) if io.kind() == std::io::ErrorKind::BrokenPipe)
}

/// `gpu-trace api -- CMD` stopped by SIGINT or SIGTERM while the command ran: the command's
/// status as the main trace gives it (`Some(status)`: it ended within
/// [`launch::STOP_GRACE`](gpu_trace::launch::STOP_GRACE), a signal sent to the process group
/// reaching it too; `Some(None)`: it still runs, said on stderr, and the status is gpu-trace's
/// own). `None`: no stop, or the tracing already collected the command's status.
fn command_status_after_stop() -> Option<Option<i32>> {
    use gpu_trace::launch;
    if !run::stop_requested() {
        return None;
    }
    let pid = launch::unreaped()?;
    let status = launch::reap_within(pid, launch::STOP_GRACE);
    if status.is_none() {
        gpu_trace::say!("gpu-trace: {}", run::still_runs(pid));
    }
    Some(status)
}

/// An error's text for a person: without Rust's `(os error N)` after the system's words (the
/// words say it; the number is for programs).
fn plain_words(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(" (os error ") {
        out.push_str(&rest[..at]);
        let tail = &rest[at + " (os error ".len()..];
        let digits = tail
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(tail.len());
        if digits > 0 && tail[digits..].starts_with(')') {
            rest = &tail[digits + 1..];
        } else {
            out.push_str(" (os error ");
            rest = tail;
        }
    }
    out.push_str(rest);
    out
}

/// A replay's error in words that say what to do, where Rust's alone would not: a file cut
/// short inside its header ("failed to fill whole buffer"), a recording that is not there, an
/// output that cannot be created there.
fn replay_error(e: RunError, file: &std::path::Path) -> anyhow::Error {
    use gpu_trace_core::record::RecordError;
    // What run::replay says when the recording itself cannot be opened.
    let opening = format!("opening {}", file.display());
    match &e {
        RunError::Record(RecordError::Io(io)) if io.kind() == std::io::ErrorKind::UnexpectedEof => {
            anyhow::anyhow!(
                "the recording ends inside its header: the file was cut short (copied while \
                 gpu-trace was still writing it?); copy it again, or record again"
            )
        }
        RunError::Io { what, source } if source.kind() == std::io::ErrorKind::NotFound => {
            if *what == opening {
                anyhow::anyhow!(
                    "{what}: No such file or directory; check the path (`gpu-trace --record \
                     FILE` makes a recording)"
                )
            } else {
                anyhow::anyhow!(
                    "{what}: No such file or directory; name a file in a directory where files \
                     can be created"
                )
            }
        }
        RunError::Io { what, source }
            if source.kind() == std::io::ErrorKind::IsADirectory && *what == opening =>
        {
            anyhow::anyhow!("{what}: Is a directory; name a recording file in it")
        }
        _ => e.into(),
    }
}

/// `gpu-trace completions SHELL`: the script on stdout.
fn completions(shell: clap_complete::Shell) -> ExitCode {
    use std::io::Write as _;
    let script = gpu_trace::cli::completion_script(shell);
    match std::io::stdout().lock().write_all(&script) {
        // `| head`: the reader took what it wanted, a quiet end (as coreutils).
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            gpu_trace::say!(
                "gpu-trace: writing the {shell} completions to standard output: {}",
                plain_words(&e.to_string())
            );
            ExitCode::from(EXIT_RUNTIME)
        }
        _ => ExitCode::SUCCESS,
    }
}

/// The exit status of a run or replay: with `-- CMD`, the command's (when it ended while
/// traced; gpu-trace's own troubles are said on stderr), else gpu-trace's own ([`own_exit_code`]).
fn exit_code(result: anyhow::Result<run::Summary>) -> ExitCode {
    let child = result.as_ref().ok().and_then(|s| s.child_status);
    let own = own_exit_code(result);
    child.map_or(own, |s| {
        ExitCode::from(u8::try_from(s.clamp(0, 255)).unwrap_or(255))
    })
}

/// gpu-trace's own exit status (and its last words on stderr): records or output lines lost, a
/// metrics endpoint that died, or the error and what kind it is.
fn own_exit_code(result: anyhow::Result<run::Summary>) -> ExitCode {
    // A metrics endpoint that died during the run (said on stderr when it happened; tracing went
    // on and the statistics are complete): the run did not do all it was asked, exit 1.
    if result.is_ok() && gpu_trace::metrics::server::endpoint_failed() {
        gpu_trace::say!(
            "gpu-trace: the metrics endpoint stopped serving during the run (see above); exit 1"
        );
        return ExitCode::from(EXIT_RUNTIME);
    }
    match result {
        // A recording cut short has said so (run::replay_with): its counts are incomplete.
        Ok(summary) if summary.dropped > 0 || summary.output_lost > 0 || summary.truncated => {
            if summary.dropped > 0 {
                gpu_trace::say!(
                    "gpu-trace: {} records were dropped (ring buffer full); the counts above \
                     are incomplete. Raise --ring-size.",
                    summary.dropped
                );
            }
            if summary.output_lost > 0 {
                gpu_trace::say!(
                    "gpu-trace: {} output lines were dropped because the output's reader did \
                     not keep up (a stalled pipe, FIFO or disk); the statistics count them.",
                    summary.output_lost
                );
            }
            ExitCode::from(EXIT_DROPPED)
        }
        Ok(_) => ExitCode::SUCCESS,
        Err(err) => {
            gpu_trace::say!("gpu-trace: {}", plain_words(&chain_without_repeats(&err)));
            error_exit_code(&err)
        }
    }
}

/// A cgroup or container on the command line that names nothing is bad usage; a system that
/// cannot support the run, unsupported; anything else, a runtime failure.
fn error_exit_code(err: &anyhow::Error) -> ExitCode {
    // `-- CMD` that cannot run: 126 or 127, as a shell would exit.
    if let Some(code) = err
        .chain()
        .find_map(|c| match c.downcast_ref::<RunError>() {
            Some(RunError::Launch(LaunchError::CannotRun { code, .. })) => Some(*code),
            _ => None,
        })
    {
        return ExitCode::from(code);
    }
    if err
        .chain()
        .any(|c| matches!(c.downcast_ref::<RunError>(), Some(RunError::Cgroup(e)) if !e.is_unsupported()))
        || err.chain().any(|c| {
            matches!(
                c.downcast_ref::<RunError>(),
                Some(
                    RunError::Launch(LaunchError::User { .. })
                        | RunError::Usage(_)
                )
            )
        })
    {
        return ExitCode::from(EXIT_USAGE);
    }
    let unsupported = err.chain().any(|cause| {
        cause
            .downcast_ref::<RunError>()
            .is_some_and(RunError::is_unsupported)
            || cause
                .downcast_ref::<LoadError>()
                .is_some_and(LoadError::is_unsupported)
    });
    ExitCode::from(if unsupported {
        EXIT_UNSUPPORTED
    } else {
        EXIT_RUNTIME
    })
}

/// `gpu-trace doctor`: the report on stdout; the exit status is the verdict (see
/// `gpu_trace::doctor::exit`).
fn doctor(json: bool) -> ExitCode {
    use std::io::Write as _;
    let report = gpu_trace::doctor::evaluate(&gpu_trace::doctor::Facts::gather());
    let text = if json {
        report.render_json() + "\n"
    } else {
        report.render_text()
    };
    // `doctor | head`: a reader that closed the pipe took what it wanted; the verdict stands
    // (a panic on the closed pipe was the answer before).
    match std::io::stdout().lock().write_all(text.as_bytes()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            gpu_trace::say!(
                "gpu-trace: writing the report to standard output: {}",
                plain_words(&e.to_string())
            );
            ExitCode::from(EXIT_RUNTIME)
        }
        _ => ExitCode::from(report.exit_code),
    }
}

/// `gpu-trace top`: the live run with the terminal view; event lines and statistics go only
/// to an `-o FILE` (the view owns the terminal).
fn top(mut args: gpu_trace::cli::TraceArgs, expire: f64) -> anyhow::Result<run::Summary> {
    if args.output.output.is_none() {
        args.output.quiet = true;
    }
    if args.vendor == Vendor::Auto {
        args.vendor = run::detect_vendor()?;
    }
    let what = match args.vendor {
        Vendor::Amd => "AMD KFD queues",
        _ => "NVIDIA RM calls",
    };
    let mut view = gpu_trace::top::Top::new(what).expire(expire);
    // No driver to trace: said on screen from the first frame (issue 41 item 6).
    if let Some(notice) = gpu_trace::top::driver_notice(args.vendor) {
        view = view.notice(notice);
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let result = runtime.block_on(run::run_live_with(&args, Some(&mut view)));
    view.stop();
    Ok(result?)
}

/// `gpu-trace replay FILE --top`: steps through the recording in the view; event lines and
/// statistics go only to an `-o FILE`.
fn replay_top(
    file: &std::path::Path,
    mut output: gpu_trace::cli::OutputArgs,
) -> Result<run::Summary, RunError> {
    if output.output.is_none() {
        output.quiet = true;
    }
    // The path's bytes as they are (`\xNN` for a byte that is not UTF-8, never U+FFFD).
    let name = {
        use gpu_trace_core::escape::{decode_lossless, escape_text};
        use std::os::unix::ffi::OsStrExt;
        escape_text(&decode_lossless(file.as_os_str().as_bytes())).into_owned()
    };
    let mut view = gpu_trace::top::Top::stepping(format!("replay of {name}"));
    let result = run::replay_with(file, &output, Some(&mut view));
    view.stop();
    result
}

fn trace(mut args: gpu_trace::cli::TraceArgs) -> anyhow::Result<run::Summary> {
    let dump_on = &args.recording.dump_on;
    if let Some(why) = gpu_trace::cli::recording::dump_on_without_api(dump_on, args.api) {
        <Cli as clap::CommandFactory>::command()
            .error(clap::error::ErrorKind::ArgumentConflict, why)
            .exit();
    }
    if let Err(e) = gpu_trace::metrics::server::check_args(&args.metrics) {
        // A usage error (exit 2), before anything loads.
        <Cli as clap::CommandFactory>::command()
            .error(
                clap::error::ErrorKind::ArgumentConflict,
                plain_words(&e.to_string()),
            )
            .exit();
    }
    // Resolved before anything loads: with no GPU driver at all, `auto` stops here.
    if args.vendor == Vendor::Auto {
        args.vendor = run::detect_vendor()?;
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    Ok(runtime.block_on(run::run_live(&args))?)
}

/// The error and its causes on one line, leaving out a cause whose text the line already
/// holds (our errors often name their cause in their own message).
fn chain_without_repeats(err: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in err.chain() {
        let text = cause.to_string();
        if line.contains(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line
}
