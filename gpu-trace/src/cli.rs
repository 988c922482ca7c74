//! Command line (clap). `--help` is written to teach: each common task has an example.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

const EXAMPLES: &str = "\
Examples:
  Check what this machine allows (hooks, BTF, LSMs, driver) before tracing:
      sudo gpu-trace doctor
  Trace every process on the default (NVIDIA) driver until Ctrl-C:
      sudo gpu-trace
  Also show work-submit tokens, for one process, for 30 seconds:
      sudo gpu-trace -v --pid 4242 --duration 30
  AMD GPUs: KFD compute and SDMA queues (/dev/kfd); `-v` adds each queue's doorbell:
      sudo gpu-trace --vendor amd -v
  Only processes whose name is python3, as JSON lines, into a file:
      sudo gpu-trace --comm python3 --format json -o trace.jsonl
  Timestamps in seconds since the first event instead of wall-clock time:
      sudo gpu-trace --timestamps relative
  A timeline for the Perfetto UI (ui.perfetto.dev: Open trace file), next to the usual output:
      sudo gpu-trace --perfetto trace.json
  Record the raw driver calls and replay them later, on any machine, without root, with the
  same output options (-v, --pid, --comm, --format, -o, --timestamps, --perfetto):
      sudo gpu-trace --record run.gtrace
      gpu-trace replay run.gtrace -v --perfetto run.json -o run.txt
  Serve Prometheus metrics on a loopback port while tracing, printing nothing else:
      sudo gpu-trace --metrics 127.0.0.1:9464 --quiet
  Refuse GPU scheduling to one process while tracing (needs an active BPF LSM; see doctor):
      sudo gpu-trace --deny-pid 4242

Output: one line per event (TASK_INIT, SCHEDULE, WORK_SUBMIT with -v, TASK_DESTROY); a field the
driver layer cannot know is printed as `?`. On exit (Ctrl-C, SIGTERM, --duration) a statistics
block: counts per event, dropped, read_failed, and a per-process table.

Exit status: 0 on success; 1 on a runtime error; 2 on bad usage; 3 when the kernel or system
cannot support tracing (missing privileges, BTF, hooks); 4 when events were dropped. `doctor`:
0 when tracing and --deny-pid can both work, 5 when tracing can but --deny-pid cannot, 3 when
tracing cannot.
See docs/cli.md for every option, docs/json-schema.md for the JSON fields, docs/events.md for
the events and docs/troubleshooting.md for errors.";

const REPLAY_EXAMPLES: &str = "\
Examples:
  Print a recording exactly as the live run printed it (-v if the live run had it):
      gpu-trace replay run.gtrace -v
  The same events as JSON lines, into a file; or only one process:
      gpu-trace replay run.gtrace --format json -o run.jsonl
      gpu-trace replay run.gtrace --pid 4242
  A Perfetto timeline of the recording, without the text output:
      gpu-trace replay run.gtrace --perfetto run.json -o /dev/null

Exit status: 0 on success; 1 when the file cannot be read or decoded; 2 on bad usage; 4 when
the live run had dropped records (its trailer says so).";

const DOCTOR_EXAMPLES: &str = "\
Examples:
  The table (root: the trials load test programs):
      sudo gpu-trace doctor
  In a script: go on only where tracing works, and know whether --deny-pid will:
      sudo gpu-trace doctor --json > doctor.json; case $? in 0) echo all;; 5) echo no deny;; *) echo none;; esac";

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
    #[command(after_long_help = REPLAY_EXAMPLES)]
    Replay {
        /// The recording file.
        file: PathBuf,
        #[command(flatten)]
        output: OutputArgs,
    },
    /// Show what this machine allows, per vendor and per hook, and why not (each "no" names
    /// the fix).
    ///
    /// Checks privileges, kernel BTF (vmlinux and per module), tracefs, kprobes, BPF
    /// trampolines, the active LSMs, lockdown, kallsyms and ftrace's function list, the NVIDIA
    /// and AMD KFD drivers (flavour, version, device nodes and majors), tries every hook with a
    /// trivial program and loads gpu-trace's own programs, then detaches everything. Run it as
    /// root.
    ///
    /// Exit status: 0 when tracing and --deny-pid can both work, 5 when tracing can but
    /// --deny-pid cannot, 3 when tracing cannot.
    #[command(after_long_help = DOCTOR_EXAMPLES)]
    Doctor {
        /// Print the report as one JSON object instead of a table.
        #[arg(long)]
        json: bool,
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
    /// One JSON object per line (schema: docs/json-schema.md).
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

    /// Write events and statistics to FILE instead of standard output (any --format).
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,

    /// Also write a timeline to FILE for the Perfetto UI (Chrome JSON trace format): a track
    /// group per process, a slice per TSG/queue lifetime, instants for SCHEDULE and
    /// WORK_SUBMIT (always, -v or not), every field as args. Filters apply.
    #[arg(long, value_name = "FILE")]
    pub perfetto: Option<PathBuf>,

    /// Timestamp style of the text output (JSON lines always carry both `time`, UTC wall clock,
    /// and `ts_ns`, CLOCK_MONOTONIC).
    #[arg(long, value_enum, default_value_t = Timestamps::Wall)]
    pub timestamps: Timestamps,

    /// Do not print the statistics block at exit.
    #[arg(long)]
    pub no_stats: bool,

    /// Print no events and no statistics (e.g. with --metrics, or with only --perfetto or
    /// --record).
    #[arg(short, long, conflicts_with = "output")]
    pub quiet: bool,
}

/// `--metrics`: Prometheus metrics while tracing (docs/fleet.md).
#[derive(Clone, Debug, Default, Args)]
pub struct MetricsArgs {
    /// Serve Prometheus metrics at http://ADDR/metrics while tracing, e.g. 127.0.0.1:9464
    /// (port 0: any free port). A loopback address unless --metrics-allow-remote.
    #[arg(long = "metrics", value_name = "ADDR")]
    pub addr: Option<std::net::SocketAddr>,

    /// Allow --metrics on a non-loopback address (e.g. 0.0.0.0:9464 in a Kubernetes pod). The
    /// endpoint has no authentication: anyone who can reach it reads process names.
    #[arg(long, requires = "addr")]
    pub metrics_allow_remote: bool,
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

    /// Do not attach to the drivers' own functions (AMD KFD functions in amdgpu.ko, the
    /// scheduling hooks of a gpu_ext-patched NVIDIA driver); use the syscall layer only. By
    /// default gpu-trace attaches to them where the kernel allows it, and the start-up report
    /// says which it uses and why not the others.
    #[arg(long)]
    pub no_deep_hooks: bool,

    /// Attach types the deep hooks may use: auto (a trampoline through the module's BTF, else a
    /// kprobe), kprobe, or trampoline. For comparisons, and for kernels where one misbehaves.
    #[arg(long, value_enum, value_name = "TYPE", default_value_t = crate::loader::DeepAttach::Auto)]
    pub deep_attach: crate::loader::DeepAttach,

    #[command(flatten)]
    pub metrics: MetricsArgs,

    #[command(flatten)]
    pub output: OutputArgs,
}
