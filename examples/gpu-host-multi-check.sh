#!/usr/bin/env bash
# Which GPU each event is on (issue 18), checked on the GPU host against nvidia-smi and an
# independent witness (examples/rm_ids_shim.c, LD_PRELOADed into the workloads: it logs the
# driver's own answers, RM device instance → gpuId/PCI address, and nothing of gpu-trace).
#   bash examples/gpu-host-multi-check.sh BIN OUTDIR
# Workloads (examples/multi_gpu.py): MODE=each (one process, a matmul on every GPU); with two or
# more GPUs also CUDA_VISIBLE_DEVICES=1 (CUDA's device 0 is physical GPU 1) and a NCCL
# all-reduce, one process per GPU. Each is traced with --format json --record; the checks
# (CHECKS.txt, PASS/FAIL lines, exit 1 on a FAIL):
#   - every NVIDIA event naming a GPU names the one the witness says its RM device instance is,
#     by nvidia-smi's index, UUID and bus id;
#   - `each` touches every GPU; `gpu1_only` only nvidia-smi's GPU 1; all-reduce rank r only GPU r;
#   - per GPU, the live run's TASK_INIT/SCHEDULE/TASK_DESTROY counts equal its recording's replay.
set -u
BIN=$(realpath "${1:?gpu-trace binary}"); OUT=$(realpath -m "${2:?output dir}"); mkdir -p "$OUT"
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
gcc -O2 -shared -fPIC -o "$OUT/rm_ids_shim.so" examples/rm_ids_shim.c -ldl || exit 1
nvidia-smi --query-gpu=index,uuid,pci.bus_id --format=csv,noheader > "$OUT/smi.csv"
N=$(wc -l < "$OUT/smi.csv")

# run NAME ENV... : the workload under the shim, traced.
run() {
  local name=$1; shift
  "$BIN" --format json --record "$OUT/$name.gtrace" -o "$OUT/$name.jsonl" 2> "$OUT/$name.err" &
  local tp=$!
  for _ in $(seq 300); do grep -q hooks "$OUT/$name.err" 2>/dev/null && break; sleep 0.1; done
  env "$@" RM_IDS_LOG="$OUT/$name.ids" LD_PRELOAD="$OUT/rm_ids_shim.so" \
    python3 examples/multi_gpu.py > "$OUT/$name.log" 2>&1
  sleep 1
  kill -INT $tp; wait $tp; echo "tracer exit $?" >> "$OUT/$name.err"
  "$BIN" replay "$OUT/$name.gtrace" --format json > "$OUT/$name.replay.jsonl" 2>> "$OUT/$name.err"
}
run each MODE=each
if [ "$N" -ge 2 ]; then
  run gpu1_only MODE=each CUDA_VISIBLE_DEVICES=1
  run allreduce MODE=allreduce
fi

python3 - "$OUT" "$N" <<'EOF' | tee "$OUT/CHECKS.txt"
import collections, json, re, sys
out, n = sys.argv[1], int(sys.argv[2])
fails = 0
def check(ok, what):
    global fails
    print(("PASS " if ok else "FAIL ") + what)
    fails += 0 if ok else 1
smi = {}
for line in open(f"{out}/smi.csv"):
    idx, uuid, bus = [x.strip() for x in line.split(",")]
    # nvidia-smi prints an 8-digit domain: 00000000:00:06.0
    d, b, rest = bus.split(":")
    smi[int(idx)] = (uuid, (int(d, 16), int(b, 16), int(rest.split(".")[0], 16)))
def events(path):
    return [json.loads(l) for l in open(path)
            if l.startswith("{") and not l.startswith(('{"event":"STATS"', '{"event":"INVENTORY"'))]
def witness(name):
    inst = {}
    for line in open(f"{out}/{name}.ids"):
        m = re.search(r"GET_ID_INFO_V2 gpuId=0x([0-9a-f]+) deviceInstance=(\d+)", line)
        if m:
            g = int(m.group(1), 16)
            inst[int(m.group(2))] = (g >> 16, (g >> 8) & 0xff, g & 0xff)
    return inst
def counts(evs):
    c = collections.Counter()
    for e in evs:
        if "gpu_device" in e and e["event"] in ("TASK_INIT", "SCHEDULE", "TASK_DESTROY"):
            c[(e["gpu_device"]["uuid"], e["event"])] += 1
    return c
runs = ["each"] + (["gpu1_only", "allreduce"] if n >= 2 else [])
for name in runs:
    live, replay, inst = events(f"{out}/{name}.jsonl"), events(f"{out}/{name}.replay.jsonl"), witness(name)
    named = [e for e in live if "gpu_device" in e]
    check(len(named) > 0, f"{name}: {len(named)} events name their GPU")
    bad = []
    for e in named:
        g = e["gpu_device"]
        want = inst.get(g["rm_device"])
        smi_uuid, smi_pci = smi.get(g["index"], (None, None))
        if want is None or want != smi_pci or g["uuid"] != smi_uuid:
            bad.append((e["event"], e["pid"], g, want))
    check(not bad, f"{name}: every GPU named is the one the driver's answer and nvidia-smi say ({len(bad)} not){': ' + str(bad[:3]) if bad else ''}")
    used = sorted({e["gpu_device"]["index"] for e in named if e["event"] == "TASK_INIT"})
    if name == "each":
        check(used == list(range(n)), f"each: TASK_INIT on GPUs {used}, want all {list(range(n))}")
    elif name == "gpu1_only":
        check(used == [1], f"gpu1_only (CUDA_VISIBLE_DEVICES=1): TASK_INIT on GPUs {used}, want [1]")
    else:
        ranks = {}
        for line in open(f"{out}/{name}.log"):
            m = re.search(r"rank=(\d+) pid=(\d+) .*ok=True", line)
            if m:
                ranks[int(m.group(2))] = int(m.group(1))
        check(len(ranks) == n, f"allreduce: {len(ranks)} ranks summed correctly")
        wrong = [(e["pid"], ranks.get(e["pid"]), e["gpu_device"]["index"]) for e in named
                 if e["pid"] in ranks and e["gpu_device"]["index"] != ranks[e["pid"]]]
        check(not wrong, f"allreduce: each rank's events on its own GPU ({len(wrong)} not)")
    lc, rc = counts(live), counts(replay)
    check(lc == rc and len(lc) > 0, f"{name}: per-GPU counts live == replay: {dict(lc)}")
sys.exit(1 if fails else 0)
EOF
