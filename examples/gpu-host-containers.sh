#!/bin/bash
# Containers on the GPU host (docs/containers.md): two PyTorch "pods" in cgroups shaped like
# kubelet's (systemd driver; one Burstable, one BestEffort; containerd container scopes), made
# by this script under the host's cgroup2 mount, share the GPU. Checks:
#   1. every event of each pod's process names its own pod UID, container id and QoS class
#      (values this script chose), and the statistics have a row per pod;
#   2. `--cgroup POD-A` traces pod A only: no event of pod B's process;
#   3. `--container` with a prefix of pod B's container id traces pod B only.
# Usage: sudo examples/gpu-host-containers.sh BIN OUTDIR   (prints PASS/FAIL lines; exit 1 on FAIL)
set -u
BIN=$1
OUT=$2
mkdir -p "$OUT"
CG=$(awk '$3 == "cgroup2" { print $2; exit }' /proc/mounts)
[ -n "$CG" ] || { echo "FAIL no cgroup2 mount"; exit 1; }
UA=aaaaaaaa-1111-4222-8333-444444444401
UB=bbbbbbbb-1111-4222-8333-444444444402
CA=$(printf 'ca%.0s' $(seq 32))
CB=$(printf 'cb%.0s' $(seq 32))
ROOT=$CG/gpu-trace-demo.slice
PA=$ROOT/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod${UA//-/_}.slice/cri-containerd-$CA.scope
PB=$ROOT/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod${UB//-/_}.slice/cri-containerd-$CB.scope
mkdir -p "$PA" "$PB"
REL_A=${PA#$CG}
PY=$(command -v python3)
WORK='import torch
x = torch.randn(2048, 2048, device="cuda")
for _ in range(200):
    x = (x @ x).tanh()
torch.cuda.synchronize()
print("done")'

# pod DIR NAME: runs the workload inside cgroup DIR, its pid in $OUT/NAME.pid.
pod() {
  sh -c "echo \$\$ > '$1/cgroup.procs' && echo \$\$ > '$OUT/$2.pid' && exec '$PY' -c '$WORK'" \
    > "$OUT/$2.out" 2>&1
}

# trace NAME ARGS...: gpu-trace with ARGS while both pods run; JSON in $OUT/NAME.jsonl.
trace() {
  local name=$1
  shift
  "$BIN" "$@" --format json -o "$OUT/$name.jsonl" 2> "$OUT/$name.err" &
  local tracer=$!
  for _ in $(seq 300); do grep -q "hooks" "$OUT/$name.err" 2>/dev/null && break; sleep 0.1; done
  pod "$PA" "$name-a" &
  local a=$!
  pod "$PB" "$name-b" &
  local b=$!
  wait $a $b
  sleep 1
  kill -INT $tracer
  wait $tracer
  echo "tracer exit $?" >> "$OUT/$name.err"
}

trace both
trace only-a --cgroup "$REL_A"
trace only-b --container "${CB:0:10}"

python3 - "$OUT" "$UA" "$UB" "$CA" "$CB" <<'EOF' | tee "$OUT/containers-checks.txt"
import json, sys
out, ua, ub, ca, cb = sys.argv[1:]
fails = 0
def check(ok, what):
    global fails
    print(("PASS " if ok else "FAIL ") + what)
    fails += 0 if ok else 1
def load(name):
    lines = [json.loads(l) for l in open(f"{out}/{name}.jsonl") if l.startswith("{")]
    ev = [l for l in lines if l["event"] not in ("STATS", "INVENTORY")]
    stats = [l for l in lines if l["event"] == "STATS"][-1]
    return ev, stats
def pid(name):
    return int(open(f"{out}/{name}.pid").read())
for run, want in [("both", "ab"), ("only-a", "a"), ("only-b", "b")]:
    ev, stats = load(run)
    pids = {"a": pid(f"{run}-a"), "b": pid(f"{run}-b")}
    for side, uid, cid, qos in [("a", ua, ca, "burstable"), ("b", ub, cb, "best_effort")]:
        mine = [e for e in ev if e["pid"] == pids[side]]
        sched = [e for e in mine if e["event"] == "SCHEDULE"]
        if side in want:
            check(len(sched) > 0, f"{run}: pod {side} (pid {pids[side]}) scheduled {len(sched)} TSGs")
            bad = [e for e in mine if e.get("cgroup", {}).get("pod_uid") != uid
                   or e["cgroup"].get("container_id") != cid or e["cgroup"].get("qos") != qos]
            check(not bad, f"{run}: all {len(mine)} events of pod {side} name pod {uid}, container {cid[:12]}, {qos}")
        else:
            check(not mine, f"{run}: no event of pod {side} (pid {pids[side]}): {len(mine)}")
    groups = [g["group"] for g in stats.get("containers", [])]
    print(f"INFO {run}: statistics rows {groups}")
    if run == "both":
        check(any(ca[:12] in (g or "") for g in groups) and any(cb[:12] in (g or "") for g in groups),
              "both: a statistics row per pod")
sys.exit(1 if fails else 0)
EOF
rc=${PIPESTATUS[0]}
rmdir "$PA" "$PB" "$(dirname "$PA")" "$(dirname "$PB")" 2>/dev/null
rmdir "$(dirname "$(dirname "$PA")")" "$(dirname "$(dirname "$PB")")" "$ROOT/kubepods.slice" "$ROOT" 2>/dev/null
exit $rc
