#!/usr/bin/env python3
"""Checks a --perfetto timeline against the JSON lines output of the same gpu-trace run.

    python3 examples/perfetto_check.py RUN.perfetto.json RUN.jsonl

Independent of gpu-trace's code: it reads both files as a Perfetto-like importer would and
prints one ok/BAD line per check; the exit status is the number of BAD ones.
  1. every event has ph/ts/pid/tid; B/E pair up per track (stable sort by ts); nothing open;
  2. one slice per TASK_INIT in each traced process, and the same lifetime again in a "GPU N"
     track group (named "<comm> <pid>: TSG <id>", same begin and end);
  3. each lifetime's points (X, dur 0) chain by one flow: the first flow_out only, every next
     one flow_in + flow_out; a flow_in never precedes its flow_out in time;
  4. "schedules/s GPU N" steps up once per SCHEDULE event of the JSON output with that GPU
     (the count over the last second, stepped at each event and one second later);
  5. with --api-calls: every driver event drawn on a thread's track lies inside the API
     call's slice (`X` with a duration) its `api` names, the innermost one there.
Lines of the JSON output that are not JSON (a launched command's own) are skipped.
"""
import collections
import json
import sys


def main():
    trace = json.load(open(sys.argv[1]))
    lines = [json.loads(l) for l in open(sys.argv[2]) if l.startswith("{")]
    events = [l for l in lines if "ts_ns" in l and l.get("event") not in ("STATS", "INVENTORY")]
    bad = 0

    def check(name, ok, detail=""):
        nonlocal bad
        print(("ok  " if ok else "BAD ") + name + ("" if ok else f": {detail}"))
        bad += 0 if ok else 1

    evs = trace["traceEvents"]
    names = {}
    for e in evs:
        if e["ph"] == "M" and e["name"] == "process_name":
            names[e["pid"]] = e["args"]["name"]
    tracks = collections.defaultdict(list)
    for i, e in enumerate(evs):
        if e["ph"] in ("B", "E", "X"):
            tracks[(e["pid"], e["tid"])].append((float(e["ts"]), i, e))
    slices, points, problems, api_slices = [], [], [], []
    for key, tr in tracks.items():
        tr.sort(key=lambda t: (t[0], t[1]))
        stack = []
        for ts, i, e in tr:
            if e["ph"] == "B":
                stack.append([e["name"], ts, None, key, []])
            elif e["ph"] == "E":
                if not stack or stack[-1][0] != e["name"]:
                    problems.append(f"E {e['name']} at {ts} does not end the open slice")
                    continue
                s = stack.pop()
                s[2] = ts
                slices.append(s)
            elif float(e.get("dur", 0)) > 0:
                # A complete slice (an API call of --api-calls, on its thread's track): it
                # must sit inside any slice open on the track, ending before it does.
                end = ts + float(e["dur"])
                api_slices.append((key, ts, end, e["name"]))
            else:
                if not stack:
                    problems.append(f"point {e['name']} outside a slice")
                    continue
                stack[-1][4].append(e)
                points.append((ts, i, e))
        problems += [f"slice {s[0]} never ends" for s in stack]
    check("importer: slices nest, nothing left open", not problems, problems[:3])

    gpu_groups = {pid: n for pid, n in names.items() if n.startswith("GPU ") and n != "GPUs"}
    proc_slices = [s for s in slices if s[3][0] not in gpu_groups and s[3][0] < 0x7FF00000]
    gpu_slices = [s for s in slices if s[3][0] in gpu_groups]
    inits = [e for e in events if e["event"] == "TASK_INIT"]
    check("one slice per TASK_INIT", len(proc_slices) >= len(inits) and len(inits) > 0,
          f"{len(proc_slices)} slices, {len(inits)} TASK_INIT")
    with_gpu = [e for e in inits if (e.get("gpu") is not None)]
    check("each lifetime with a GPU again in its GPU's group", len(gpu_slices) == len(with_gpu),
          f"{len(gpu_slices)} in GPU groups, {len(with_gpu)} TASK_INIT with a gpu")
    by_name = {(s[0], s[1], s[2]) for s in gpu_slices}
    missing = []
    for s in proc_slices:
        owner = names.get(s[3][0], "?")
        if not any(n.endswith(f" {s[3][0]}: {s[0]}") and b == s[1] and e == s[2]
                   for (n, b, e) in by_name):
            if any(p["name"] == "TASK_INIT" for p in s[4]):
                missing.append(f"{owner} {s[3][0]}: {s[0]}")
    check("GPU group slices have the process slices' names and times", not missing, missing[:3])

    flow_bad = []
    for s in proc_slices:
        pts = [p for p in s[4] if "bind_id" in p]
        if not pts:
            continue
        ids = {p["bind_id"] for p in pts}
        if len(ids) != 1:
            flow_bad.append(f"{s[0]}: {len(ids)} flows")
        if pts[0].get("flow_in") or not pts[0].get("flow_out"):
            flow_bad.append(f"{s[0]}: first point is not a flow start")
        if any(not (p.get("flow_in") and p.get("flow_out")) for p in pts[1:]):
            flow_bad.append(f"{s[0]}: a later point does not continue the flow")
        if s[4][0]["name"] == "TASK_INIT" and pts[0]["name"] != "TASK_INIT":
            flow_bad.append(f"{s[0]}: flow does not start at TASK_INIT")
    seen = set()
    for ts, i, e in sorted(points, key=lambda t: (t[0], t[1])):
        if "bind_id" in e:
            if e.get("flow_in") and e["bind_id"] not in seen:
                flow_bad.append(f"flow {e['bind_id']} taken in before it began")
            seen.add(e["bind_id"])
    check("flows chain each lifetime from TASK_INIT", not flow_bad, flow_bad[:3])

    # SCHEDULEs per GPU: the GPU of a SCHEDULE is its task's TASK_INIT's gpu.
    gpu_of = {(e["pid"], json.dumps(e["task"], sort_keys=True)): e.get("gpu") for e in inits}
    want = collections.Counter()
    for e in events:
        if e["event"] == "SCHEDULE":
            want[gpu_of.get((e["pid"], json.dumps(e["task"], sort_keys=True)))] += 1
    # The counter is the count over the last second, stepped at each SCHEDULE (one up) and
    # one second later (one down): its steps up, per GPU, are the SCHEDULEs.
    got = collections.Counter()
    last = {}
    for e in sorted((e for e in evs if e["ph"] == "C"), key=lambda e: float(e["ts"])):
        if e["name"].startswith("schedules/s GPU "):
            g = e["name"].rsplit(" ", 1)[1]
            v = e["args"]["schedules"]
            got[None if g == "?" else int(g)] += max(0, v - last.get(e["name"], 0))
            last[e["name"]] = v
    inside = outside = 0
    for e in evs:
        a = e.get("args", {})
        if e.get("ph") == "i" and e.get("s") == "t" and isinstance(a.get("api"), dict):
            ts = float(e["ts"])
            hit = [s for s in api_slices if s[0] == (e["pid"], e["tid"]) and s[1] <= ts <= s[2]]
            inner = min(hit, key=lambda s: s[2] - s[1]) if hit else None
            if inner and inner[3] == a["api"]["symbol"]:
                inside += 1
            else:
                outside += 1
    if api_slices:
        check("driver events inside the API call they name", outside == 0 and inside > 0,
              f"{inside} inside, {outside} not")
    check("schedules/s per GPU sums to the SCHEDULE events", got == want and sum(want.values()) > 0,
          f"timeline {dict(got)}, JSON {dict(want)}")
    print(f"{len(proc_slices)} lifetimes, {len(points)} points, {len(gpu_slices)} on GPU groups, "
          f"{sum(want.values())} SCHEDULE")
    return bad


if __name__ == "__main__":
    sys.exit(main())
