//! Command line (clap). `--help` is written to teach: each common task has an example.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

const EXAMPLES: &str = "\
Examples:
  Trace every process on the default (NVIDIA) driver until Ctrl-C:
      sudo gpu-trace
  Also show work-submit tokens, for one process, for 30 seconds:
      sudo gpu-trace -v --pid 4242 --duration 30
  AMD GPUs: KFD compute and SDMA queues (/dev/kfd); `-v` adds each queue's doorbell:
      sudo gpu-trace --vendor amd -v
  Only processes whose name is python3, as JSON lines, into a file:
      sudo gpu-trace --comm python3 --format json -o trace.jsonl
  Record the raw driver calls and replay them later, on any machine, without root:
      sudo gpu-trace --record run.gtrace
      gpu-trace replay run.gtrace -v

Output: one line per event (TASK_INIT, SCHEDULE, WORK_SUBMIT with -v, TASK_DESTROY); a field the
driver layer cannot know is printed as `?`. On exit (Ctrl-C, SIGTERM, --duration) a statistics
block: counts per event, dropped, read_failed, and a per-process table.

Exit status: 0 on success; 1 on a runtime error; 2 on bad usage; 3 when the kernel or system
cannot support tracing (missing privileges, BTF, hooks); 4 when events were dropped.
See docs/events.md for every field and docs/troubleshooting.md for errors.";

#[derive(Debug, Parser)]
#[command(
    name = "gpu-trace",
    version,
    about = "Trace how GPU drivers schedule work for Linux processes (eBPF)",
    long_about = "Trace how GPU drivers schedule work for Linux processes.\n\n\
        gpu-trace attaches eBPF programs to the ioctl layer of the GPU driver and prints, for \
        every process, when the driver creates a channel group (TSG), puts it on the runlist, \
        hands out work-submit tokens, and tears it down.",
    after_long_help = EXAMPLES,
    after_help = "Run `gpu-trace --help` for examples, exit codes and output fields."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,

    #[command(flatten)]
    pub trace: TraceArgs,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Decode a recording made with --record and print it as the live run did (no root needed).
    Replay {
        /// The recording file.
        file: PathBuf,
        #[command(flatten)]
        output: OutputArgs,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Vendor {
    /// NVIDIA (open or proprietary kernel module): the RM ioctl layer.
    Nvidia,
    /// AMD KFD compute and SDMA queues (/dev/kfd; the TSG column holds the queue id).
    Amd,
    /// Whichever driver is loaded (NVIDIA when both are).
    Auto,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// One aligned line per event.
    Text,
    /// One JSON object per line (schema: docs/events.md).
    Json,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Timestamps {
    /// Local wall-clock time with microseconds.
    Wall,
    /// Seconds since the first event.
    Relative,
}

/// Filters and output options shared by live tracing and replay.
#[derive(Clone, Debug, Args)]
pub struct OutputArgs {
    /// Also print WORK_SUBMIT events (work-submit tokens handed out).
    #[arg(short, long)]
    pub verbose: bool,

    /// Only this process (repeatable). With exactly one, the kernel filters too.
    #[arg(short, long = "pid", value_name = "PID")]
    pub pids: Vec<u32>,

    /// Only threads or processes with this name (exact `comm`, 15 characters max; repeatable).
    #[arg(short, long = "comm", value_name = "NAME")]
    pub comms: Vec<String>,

    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub format: Format,

    /// Write events and statistics to FILE instead of standard output.
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,

    /// Timestamp style.
    #[arg(long, value_enum, default_value_t = Timestamps::Wall)]
    pub timestamps: Timestamps,

    /// Do not print the statistics block at exit.
    #[arg(long)]
    pub no_stats: bool,
}

#[derive(Clone, Debug, Args)]
pub struct TraceArgs {
    /// GPU driver to trace.
    #[arg(long, value_enum, default_value_t = Vendor::Nvidia)]
    pub vendor: Vendor,

    /// Stop after this many seconds (default: until Ctrl-C or SIGTERM).
    #[arg(short, long, value_name = "SECONDS")]
    pub duration: Option<f64>,

    /// Also write the raw driver calls to FILE, for `gpu-trace replay FILE`.
    #[arg(long, value_name = "FILE")]
    pub record: Option<PathBuf>,

    /// Ring-buffer size in bytes (power of two, ≥ 4096). Raise it if `dropped` is not 0.
    #[arg(long, value_name = "BYTES", default_value_t = crate::loader::DEFAULT_RING_BYTES)]
    pub ring_size: u32,

    /// Treat this character device as a device of the traced vendor too: an NVIDIA device, or
    /// /dev/kfd with --vendor amd (experiments and tests; e.g. /dev/null to watch RM- or
    /// KFD-shaped ioctls a test program issues).
    #[arg(long, value_name = "PATH")]
    pub watch_device: Option<PathBuf>,

    /// Refuse scheduling requests (GPFIFO_SCHEDULE with bEnable) from this process, all its
    /// threads, while gpu-trace runs (repeatable). Needs a kernel with an active BPF LSM
    /// (`bpf` in /sys/kernel/security/lsm); otherwise gpu-trace stops at start-up and says why.
    /// Refused requests show as `SCHEDULE … allowed=no errno=EPERM`, counted as `denied`.
    #[arg(long = "deny-pid", value_name = "PID")]
    pub deny_pids: Vec<u32>,

    /// Attach type for the syscall hook (default: the cheapest the kernel allows). For
    /// comparisons and for kernels where the automatic choice misbehaves.
    #[arg(long, value_enum, value_name = "TYPE")]
    pub syscall_hook: Option<crate::loader::SyscallHook>,

    #[command(flatten)]
    pub output: OutputArgs,
}
