#!/usr/bin/env python3
"""What tracing costs real CUDA work, on the GPU host: untraced vs gpu-trace (and strace and
bpftrace where they are installed), interleaved, medians over repetitions.

    sudo python3 bench/gpu-host-bench.py BIN OUTDIR [--reps 8] [--rounds 20] [--matmuls 200]

BIN is a release build of gpu-trace; run from the repository root (it uses
examples/ctx_churn.py and bench/torch_loop.py). OUTDIR receives host.txt, report.md (also
printed), samples.json and gpu-trace's output of every traced run.

Workloads:
  ctx_churn  ROUNDS primary-context create/destroy rounds through libcuda (examples/ctx_churn.py):
             real RM traffic (hundreds of RM ioctls per round). Timed: the rounds (the script's
             own figure) and the whole process.
  torch      PyTorch start-up + MATMULS 2048² matmuls (bench/torch_loop.py). Timed: from before
             `import torch` to the end (the script's figure) and the whole process
             (the issue's end-to-end target: ≤ 1.01×).
Setups: untraced; gpu-trace with default options (text output to a file); strace -f -e
trace=ioctl and bpftrace counting the RM ioctls on NVIDIA devices, only where installed.

--dry-run replaces the CUDA workloads with CPU-only stand-ins (no GPU needed) to test this script.
"""
import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time

BPFTRACE_PROG = (
    "tracepoint:syscalls:sys_enter_ioctl /(args->cmd & 0xff) == 0x29 || (args->cmd & 0xff) == 0x2a "
    "|| (args->cmd & 0xff) == 0x2b || (args->cmd & 0xff) == 0xd3/ { "
    "$f = *(curtask->files->fdt->fd + args->fd); "
    "if (($f->f_inode->i_rdev >> 20) == 195) { @calls[args->cmd] = count(); } }"
)

DRY_CTX = (
    "import os,time\n"
    "r=int(os.environ.get('ROUNDS','3'));t=time.perf_counter()\n"
    "for _ in range(r*20000): os.getppid()\n"
    "e=time.perf_counter()-t\n"
    "print(f'ctx_churn: pid={os.getpid()} {r} context create/destroy rounds in {e:.3f} s (dry run)')\n"
)
DRY_TORCH = (
    "import os,time\n"
    "t=time.perf_counter();sum(i*i for i in range(300000));e=time.perf_counter()-t\n"
    "print(f'torch_loop: pid={os.getpid()} import_s=0 cuda_init_s=0 matmul_s={e:.4f} total_s={e:.4f} matmuls=0')\n"
)


def log(msg):
    print(f"gpu-host-bench: {msg}", file=sys.stderr, flush=True)


def sh(cmd):
    try:
        return subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=60).stdout.strip()
    except Exception as e:  # noqa: BLE001 - best effort host description
        return f"? ({e})"


def workloads(args):
    if args.dry_run:
        return {
            "ctx_churn": ([sys.executable, "-c", DRY_CTX], {"ROUNDS": str(args.rounds)}),
            "torch": ([sys.executable, "-c", DRY_TORCH], {"MATMULS": str(args.matmuls)}),
        }
    return {
        "ctx_churn": ([sys.executable, "examples/ctx_churn.py"], {"ROUNDS": str(args.rounds)}),
        "torch": ([sys.executable, "bench/torch_loop.py"], {"MATMULS": str(args.matmuls)}),
    }


def inner_seconds(name, stdout):
    """The workload's own timing from its last line."""
    for line in reversed(stdout.splitlines()):
        if name == "ctx_churn" and line.startswith("ctx_churn:") and " rounds in " in line:
            return float(line.split(" rounds in ")[1].split()[0])
        if name == "torch" and line.startswith("torch_loop:"):
            fields = dict(f.split("=", 1) for f in line.split()[1:] if "=" in f)
            return float(fields["total_s"])
    raise RuntimeError(f"{name} printed no timing line: {stdout[-500:]!r}")


def run_workload(name, cmd, env_extra, wrapper):
    env = dict(os.environ, **env_extra)
    full = wrapper + cmd
    t0 = time.perf_counter()
    p = subprocess.run(full, env=env, capture_output=True, text=True, timeout=1800)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(full)} failed ({p.returncode}): {p.stderr[-2000:]}")
    return {"inner_s": inner_seconds(name, p.stdout), "process_s": wall}


class Background:
    """A tracer in the background; ready once `ready` appears on the chosen stream."""

    def __init__(self, cmd, ready, stream="stderr", stdout_path=None):
        self.lines = []
        out = open(stdout_path, "w") if stdout_path else subprocess.PIPE
        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=out if stream == "stderr" else subprocess.PIPE,
            stderr=subprocess.PIPE if stream == "stderr" else subprocess.DEVNULL,
            text=True,
        )
        pipe = self.proc.stderr if stream == "stderr" else self.proc.stdout
        self.ready = threading.Event()
        self.reader = threading.Thread(target=self._read, args=(pipe, ready), daemon=True)
        self.reader.start()
        if not self.ready.wait(90):
            self.proc.kill()
            raise RuntimeError(f"{cmd[0]} did not start: {self.lines}")
        if self.proc.poll() is not None:
            raise RuntimeError(f"{cmd[0]} exited at start: {self.lines}")

    def _read(self, pipe, ready):
        for line in pipe:
            self.lines.append(line.rstrip("\n"))
            if ready in line:
                self.ready.set()
        self.ready.set()

    def stop(self):
        self.proc.send_signal(signal.SIGINT)
        try:
            rc = self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
        self.reader.join(10)
        return rc


def gpu_trace_stats(path):
    stats = {}
    with open(path) as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 2 and parts[0] in ("emitted", "ignored", "dropped", "read_failed") and parts[1].isdigit():
                stats[parts[0]] = int(parts[1])
    return stats


def spread(values):
    return statistics.median(values), min(values), max(values)


def fmt(values, unit=""):
    m, lo, hi = spread(values)
    return f"{m:.3f}{unit} [{lo:.3f}–{hi:.3f}]"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bin", help="gpu-trace binary (release build)")
    ap.add_argument("outdir")
    ap.add_argument("--reps", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=20, help="ctx_churn rounds per run")
    ap.add_argument("--matmuls", type=int, default=200, help="matmuls per torch run")
    ap.add_argument("--dry-run", action="store_true", help="CPU-only stand-in workloads (tests this script)")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("gpu-host-bench: run as root (gpu-trace and bpftrace load BPF programs)")
    os.makedirs(args.outdir, exist_ok=True)
    host = "\n".join(
        [
            "date: " + sh("date -u '+%Y-%m-%d %H:%M UTC'"),
            "kernel: " + sh("uname -r"),
            "cpu: " + sh("grep -m1 'model name' /proc/cpuinfo | cut -d: -f2") + f", {os.cpu_count()} CPUs",
            "load: " + sh("cat /proc/loadavg"),
            "driver: " + sh("head -1 /proc/driver/nvidia/version"),
            "gpus: " + sh("nvidia-smi -L"),
            "torch: " + sh(f"{sys.executable} -c 'import torch; print(torch.__version__)'"),
            "gpu-trace: " + sh(f"{args.bin} --version"),
        ]
    )
    with open(os.path.join(args.outdir, "host.txt"), "w") as f:
        f.write(host + "\n")
    print(host, flush=True)

    setups = ["untraced", "gpu-trace"]
    notes = []
    strace, bpftrace = shutil.which("strace"), shutil.which("bpftrace")
    if strace:
        setups.append("strace")
    else:
        notes.append("strace is not installed on this host: left out")
    if bpftrace:
        setups.append("bpftrace")
    else:
        notes.append("bpftrace is not installed on this host: left out")
    wls = workloads(args)
    samples = {}  # "wl|setup" -> list of {inner_s, process_s, ...}
    for rep in range(args.reps):
        for i in range(len(setups)):
            setup = setups[(i + rep) % len(setups)]
            for name, (cmd, env_extra) in wls.items():
                log(f"rep {rep + 1}/{args.reps}: {name} {setup}")
                tracer, wrapper, extra = None, [], {}
                trace_out = os.path.join(args.outdir, f"trace-{name}-{rep}.txt")
                if setup == "gpu-trace":
                    tracer = Background([args.bin, "-o", trace_out], "hooks:")
                elif setup == "bpftrace":
                    tracer = Background([bpftrace, "-e", BPFTRACE_PROG], "Attaching", stream="stdout")
                    time.sleep(0.5)  # it prints "Attaching" just before attaching
                elif setup == "strace":
                    wrapper = [strace, "-f", "-e", "trace=ioctl", "-o", "/dev/null"]
                try:
                    r = run_workload(name, cmd, env_extra, wrapper)
                finally:
                    if tracer is not None:
                        time.sleep(0.3)
                        extra["tracer_rc"] = tracer.stop()
                if setup == "gpu-trace":
                    extra.update(gpu_trace_stats(trace_out))
                    extra["hooks"] = next((l for l in tracer.lines if "hooks:" in l), "?")
                if setup == "bpftrace":
                    extra["counted"] = sum(
                        int(l.rsplit(":", 1)[1]) for l in tracer.lines if l.startswith("@calls[")
                    )
                r.update(extra)
                samples.setdefault(f"{name}|{setup}", []).append(r)
    with open(os.path.join(args.outdir, "samples.json"), "w") as f:
        json.dump(samples, f, indent=1)

    out = []
    out.append(f"\n## GPU host: real CUDA work ({args.reps} repetitions, setups interleaved)\n")
    out.append("Medians [min–max] in seconds; ratios are paired per repetition (traced / untraced).\n")
    out.append("| workload | setup | workload's own time (s) | vs untraced | whole process (s) | vs untraced |")
    out.append("|---|---|---|---|---|---|")
    for name in wls:
        base = samples[f"{name}|untraced"]
        for setup in setups:
            s = samples[f"{name}|{setup}"]
            row = [name, setup, fmt([x["inner_s"] for x in s])]
            if setup == "untraced":
                row.append("1")
            else:
                row.append(fmt([a["inner_s"] / b["inner_s"] for a, b in zip(s, base)], "×"))
            row.append(fmt([x["process_s"] for x in s]))
            if setup == "untraced":
                row.append("1")
            else:
                row.append(fmt([a["process_s"] / b["process_s"] for a, b in zip(s, base)], "×"))
            out.append("| " + " | ".join(row) + " |")
    out.append("")
    for name in wls:
        gt = samples[f"{name}|gpu-trace"]
        base = samples[f"{name}|untraced"]
        calls = statistics.median([x.get("emitted", 0) + x.get("ignored", 0) for x in gt])
        dropped = sum(x.get("dropped", 0) for x in gt)
        added = statistics.median([a["process_s"] - b["process_s"] for a, b in zip(gt, base)])
        per_call = f"{added / calls * 1e6:.1f} µs" if calls else "n/a"
        out.append(
            f"- {name}: gpu-trace saw {calls:.0f} RM calls per run (emitted + ignored), dropped {dropped} "
            f"in all runs; added process time per RM call seen: {per_call} (median difference / calls; "
            f"noise included); hooks: {gt[0].get('hooks', '?')}"
        )
        if "bpftrace" in setups:
            counted = [x.get("counted", 0) for x in samples[f"{name}|bpftrace"]]
            out.append(f"- {name}: bpftrace counted {statistics.median(counted):.0f} RM-shaped ioctls per run")
    tp = samples["torch|gpu-trace"]
    tb = samples["torch|untraced"]
    ratios = [a["process_s"] / b["process_s"] for a, b in zip(tp, tb)]
    r = statistics.median(ratios)
    q1, _, q3 = statistics.quantiles(ratios, n=4) if len(ratios) >= 2 else (r, r, r)
    # A 1 % target is only decided when the run-to-run noise allows it.
    if q3 <= 1.01:
        verdict = "met"
    elif q1 > 1.01:
        verdict = "MISSED"
    else:
        verdict = f"not resolved at this noise (quartiles of the paired ratios {q1:.3f}–{q3:.3f})"
    out.append(f"- torch end to end (whole process), gpu-trace / untraced = {r:.4f}× → target ≤ 1.01×: {verdict}")
    for n in notes:
        out.append(f"- {n}")
    text = "\n".join(out) + "\n"
    with open(os.path.join(args.outdir, "report.md"), "w") as f:
        f.write(host + "\n" + text)
    print(text, flush=True)


if __name__ == "__main__":
    main()
