#!/usr/bin/env python3
"""Checks that gpu-trace printed every scheduling request of a run, in the order it was made.

    sched_check.py RECORDING.gtrace OUTPUT.txt [--pid PID] [--steps STEPS.log]

RECORDING is a `gpu-trace --record` file, OUTPUT the text gpu-trace printed (live or replayed).
The raw calls are read from the recording here, with this script's own decoder of the RM ABI
(NVOS21/NVOS64/NVOS54 blocks and the NVA06C/NVA06F control parameters), not with gpu-trace's
code, and listed in record order: SET_TIMESLICE, SET_INTERLEAVE_LEVEL (TSG and channel),
PREEMPT, GPFIFO_SCHEDULE with bEnable=0, and bEnable=1 after an accepted disable. Each must
match the next `SCHED_UPDATE` line of OUTPUT (same pid, TSG handle, change, new value, verdict).
`--steps` also checks the lines `examples/rm_tsg_sched.c` printed against the raw calls.
Exit status 0 when everything matches, 1 otherwise (the differences are printed).
"""
import re
import struct
import sys

RM_CONTROL, RM_ALLOC = 0x2A, 0x2B
SET_TIMESLICE, PREEMPT, TSG_INTERLEAVE = 0xA06C0103, 0xA06C0105, 0xA06C0107
TSG_SCHEDULE, CH_SCHEDULE, CH_INTERLEAVE = 0xA06C0101, 0xA06F0103, 0xA06F0109
TSG_CLASS = 0xA06C
LEVELS = {0: "LOW", 1: "MEDIUM", 2: "HIGH"}


def records(path):
    """The ring-buffer records of a recording (gpu-trace/src/record.rs)."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:8] != b"GPUTRACE":
        sys.exit(f"{path}: not a gpu-trace recording")
    hdr_len = struct.unpack_from("<I", data, 12)[0]
    at = 16 + hdr_len
    while at + 4 <= len(data):
        n = struct.unpack_from("<I", data, at)[0]
        at += 4
        if n == 0:
            break  # trailer
        yield data[at:at + n]
        at += n


def raw_updates(path, pid_filter):
    """(pid, tsg handle, what, new value, allowed) per scheduling request, in record order."""
    channels = {}  # (pid, client, channel) -> parent handle
    state = {}  # (pid, client, tsg) -> "enabled" | "disabled"
    out, unreadable = [], 0
    for rec in records(path):
        kind, _cpu, _ts, pid = struct.unpack_from("<IIQI", rec, 0)
        if kind != 1 or len(rec) < 264 or (pid_filter and pid != pid_filter):
            continue
        ret = struct.unpack_from("<q", rec, 40)[0]
        escape, psize, flags, plen, slen = struct.unpack_from("<IIIII", rec, 60)
        params, sub = rec[80:128], rec[128:264]
        if escape == RM_ALLOC and plen >= 32:
            root, parent, new, cls = struct.unpack_from("<IIII", params, 0)
            status = struct.unpack_from("<I", params, 40 if psize == 48 else 28)[0]
            if ret == 0 and status == 0:
                if cls & 0xFF == 0x6F:
                    channels[(pid, root, new)] = parent
                if cls == TSG_CLASS:
                    state.pop((pid, root, new), None)
            continue
        if escape != RM_CONTROL or plen < 32:
            continue
        client, obj, cmd, cflags = struct.unpack_from("<IIII", params, 0)
        status = struct.unpack_from("<I", params, 28)[0]
        if cmd not in (SET_TIMESLICE, PREEMPT, TSG_INTERLEAVE, TSG_SCHEDULE, CH_SCHEDULE,
                       CH_INTERLEAVE):
            continue
        if cflags & 0x4 or slen < 3:  # FINN-serialized or not read: gpu-trace cannot decode it
            unreadable += 1
            continue
        allowed = ret == 0 and status == 0
        tsg = channels.get((pid, client, obj), obj) if cmd in (CH_SCHEDULE, CH_INTERLEAVE) else obj
        if cmd == SET_TIMESLICE:
            out.append((pid, tsg, "timeslice", struct.unpack_from("<Q", sub, 0)[0], allowed))
        elif cmd in (TSG_INTERLEAVE, CH_INTERLEAVE):
            level = struct.unpack_from("<I", sub, 0)[0]
            out.append((pid, tsg, "interleave", LEVELS.get(level, f"INVALID({level})"), allowed))
        elif cmd == PREEMPT:
            out.append((pid, tsg, "preempt", "yes" if sub[0] else "no", allowed))
        else:
            key, enable = (pid, client, tsg), sub[0] != 0
            if not enable or state.get(key) == "disabled":
                new = "enabled" if enable else "disabled"
                out.append((pid, tsg, "run_state", new, allowed))
                if allowed:
                    state[key] = new
            elif allowed:
                state[key] = "enabled"
    return out, unreadable


LINE = re.compile(r"\] SCHED_UPDATE PID=(\d+) +.*? TSG=(\S+) +(.*)$")


def printed_updates(path, pid_filter):
    out = []
    with open(path, errors="replace") as f:
        for line in f:
            m = LINE.search(line.rstrip("\n"))
            if not m:
                continue
            pid, tsg, rest = int(m.group(1)), m.group(2), m.group(3)
            if pid_filter and pid != pid_filter:
                continue
            allowed = " allowed=yes" in rest
            if rest.startswith("timeslice="):
                what, new = "timeslice", int(re.search(r"-> (\d+) us", rest).group(1))
            elif rest.startswith("interleave="):
                what, new = "interleave", re.search(r"-> (\S+)", rest).group(1)
            elif rest.startswith("preempt "):
                what, new = "preempt", re.search(r"wait=(\S+)", rest).group(1)
            elif rest.startswith("run_state="):
                what, new = "run_state", re.search(r"-> (\S+)", rest).group(1)
            else:
                continue  # AMD updates
            handle = int(tsg, 16) if tsg.startswith("0x") else None
            out.append((pid, handle, what, new, allowed, line.strip()))
    return out


STEPS = {  # examples/rm_tsg_sched.c step -> (what, new value)
    "interleave_high": ("interleave", "HIGH"), "timeslice_4096": ("timeslice", 4096),
    "disable": ("run_state", "disabled"), "reenable": ("run_state", "enabled"),
    "preempt_wait": ("preempt", "yes"), "preempt_manual_1000us": ("preempt", "no"),
    "interleave_low": ("interleave", "LOW"), "interleave_invalid": ("interleave", "INVALID(7)"),
}


def main():
    args = sys.argv[1:]
    pid = int(args[args.index("--pid") + 1]) if "--pid" in args else None
    steps = args[args.index("--steps") + 1] if "--steps" in args else None
    rec, txt = [a for i, a in enumerate(args) if not a.startswith("--")
                and (i == 0 or not args[i - 1].startswith("--"))][:2]
    raw, unreadable = raw_updates(rec, pid)
    printed = printed_updates(txt, pid)
    bad = 0
    for i in range(max(len(raw), len(printed))):
        r = raw[i] if i < len(raw) else None
        p = printed[i] if i < len(printed) else None
        ok = (r is not None and p is not None and r[0] == p[0] and r[2:] == p[2:5]
              and (p[1] is None or p[1] == r[1]))
        print(f"{'ok ' if ok else 'BAD'} raw={r} printed={p[5] if p else None}")
        bad += not ok
    if steps:
        with open(steps) as f:
            taken = [re.match(r"step (\S+) .*ret=(-?\d+) errno=\d+ status=0x([0-9a-f]+)", l)
                     for l in f]
        want, disabled = [], False
        for m in taken:
            if not m or m.group(1) not in STEPS:
                continue
            allowed = m.group(2) == "0" and int(m.group(3), 16) == 0
            # A re-enable is an update only after an accepted disable.
            if m.group(1) == "reenable" and not disabled:
                continue
            if m.group(1) in ("disable", "reenable") and allowed:
                disabled = m.group(1) == "disable"
            want.append((STEPS[m.group(1)], allowed))
        got = [((r[2], r[3]), r[4]) for r in raw if r[0] == pid] if pid else []
        # The first enable of a never-scheduled TSG is a SCHEDULE, not an update: not listed.
        print(f"steps: {len(want)} scheduling updates made, {len(got)} in the recording")
        if want != got:
            print(f"BAD steps differ from the recording:\n  made {want}\n  recorded {got}")
            bad += 1
    print(f"{len(raw)} raw scheduling updates, {len(printed)} SCHED_UPDATE lines, "
          f"{unreadable} unreadable raw calls, {bad} mismatches")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
