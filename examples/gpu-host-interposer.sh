#!/bin/bash
# Issue 39 on the GPU host: an interposer of HAMi-core's shape (examples/interposer/
# hami_like_shim.c: exports only dlsym, hands out hidden cuGetProcAddress/cuLaunchKernel/
# cuMemAlloc hooks) preloaded under PyTorch, traced by `gpu-trace api -v -- env LD_PRELOAD=…`,
# with tracefs uprobes on the shim's hidden hooks (offsets from its .symtab) and on libcuda's
# cuLaunchKernel in the same run as the truth; then the same with SHIM_OFF=1 (the shim loaded,
# overriding dlsym, on no call's path). Each twice: `gpu-trace api` and the main trace
# (`gpu-trace --api`, the same records through its one stream, among the driver's events).
#   examples/gpu-host-interposer.sh BIN OUT
set -u
B=$1; O=$2/interposer
mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
date -u; uname -r; nvidia-smi -L
T=/sys/kernel/tracing
[ -e $T/uprobe_events ] || mount -t tracefs nodev $T
SHIM="$O/libhami_like.so"
gcc -shared -fPIC -fvisibility=hidden -O1 -o "$SHIM" "$(dirname "$0")/interposer/hami_like_shim.c" -ldl || exit 1
nm -D --defined-only "$SHIM" | awk '{print "  exported:", $3}'
LIBCUDA=$(python3 -c 'import torch; torch.zeros(1, device="cuda"); print([l.split()[-1] for l in open("/proc/self/maps") if "libcuda.so" in l][0])')
# File offset of a symbol from the table of type $3 (2: .symtab, 11: .dynsym).
off() {
  python3 - "$1" "$2" "$3" <<'PY'
import struct, sys
path, name, want = sys.argv[1], sys.argv[2].encode(), int(sys.argv[3])
d = open(path, "rb").read()
shoff, = struct.unpack_from("<Q", d, 0x28); shnum, = struct.unpack_from("<H", d, 0x3c)
secs = [struct.unpack_from("<IIQQQQIIQQ", d, shoff + i * 64) for i in range(shnum)]
for s in secs:
    if s[1] != want: continue
    strtab = secs[s[6]]
    for i in range(s[5] // 24):
        st_name, info, other, shndx, value, size = struct.unpack_from("<IBBHQQ", d, s[4] + i * 24)
        n = d[strtab[4] + st_name:d.index(b"\0", strtab[4] + st_name)]
        if n == name and shndx and shndx < 0xff00:
            sec = secs[shndx]
            print(hex(value - sec[3] + sec[4])); sys.exit(0)
sys.exit(1)
PY
}
echo > $T/uprobe_events
for h in hook_launch hook_alloc hook_getproc; do
  o=$(off "$SHIM" $h 2) && echo "p:gti/$h $SHIM:$o" >> $T/uprobe_events && echo "probe $h at $o"
done
o=$(off "$LIBCUDA" cuLaunchKernel 11) && echo "p:gti/cuLaunchKernel $LIBCUDA:$o" >> $T/uprobe_events
cat > "$O/w.py" <<'PY'
import torch
x = torch.randn(64, 64, device="cuda")
for _ in range(1000): y = x + x
big = [torch.empty(256 << 20, device="cuda") for _ in range(3)]
torch.cuda.synchronize()
print("done 1000", flush=True)
PY
one() {  # $1: name, $2: api (gpu-trace api) or main (gpu-trace --api), then env assignments
  local n=$1 mode=$2; shift 2
  local cmd=(api -v --format json)
  [ "$mode" = main ] && cmd=(--api -v --format json)
  echo > $T/trace; echo 1 > $T/events/gti/enable
  local t0=$(date +%s.%N)
  timeout -s INT 90 "$B" "${cmd[@]}" -- env "$@" LD_PRELOAD="$SHIM" python3 "$O/w.py" > "$O/$n.jsonl" 2> "$O/$n.stderr"
  echo "$n: exit $? in $(python3 -c "print(round($(date +%s.%N)-$t0,2))") s"
  echo 0 > $T/events/gti/enable; cat $T/trace > "$O/$n.tracefs.txt"
  grep -E '^shim |uprobes attached|cannot|gpu-trace:' "$O/$n.stderr" | head -8
  ps -o pid,stat,wchan:20,cmd -C python3 | head -5; pkill -KILL -f "$O/w.py"
  python3 - "$O/$n" <<'PY'
import json, sys, collections, re
base = sys.argv[1]
truth = collections.Counter()
for l in open(base + ".tracefs.txt"):
    m = re.search(r" (\w+): \(0x", l)
    if m: truth[m.group(1)] += 1
print("  tracefs:", dict(truth))
for l in open(base + ".jsonl"):
    try: e = json.loads(l)
    except ValueError: continue
    if e.get("event") == "API_PATH" and e.get("final"):
        print(f"  API_PATH {e['library'].rsplit('/',1)[-1]} verdict={e['verdict']} lookups={e['lookups']} api_lookups={e['api_lookups']} overrides={e['overrides']}")
        for s in e["symbols"][:8]: print(f"    {s['symbol']:28} through {s['through']:6} total {s['total']:6}")
hand = [e for e in map(lambda l: json.loads(l) if l.startswith("{") else {}, open(base + ".jsonl")) if e.get("event") == "API_HANDOUT"]
print(f"  API_HANDOUT lines: {len(hand)}, hidden: {[(h['symbol'], h['function']) for h in hand if h['hidden']]}")
kinds = collections.Counter(e.get("event") for e in map(lambda l: json.loads(l) if l.startswith("{") else {}, open(base + ".jsonl")))
print("  records by kind:", dict(kinds))
PY
}
echo "== control: the shim under PyTorch, untraced $(date -u +%T)"
timeout 60 env LD_PRELOAD="$SHIM" python3 "$O/w.py"; echo "control exit $?"
echo "== on the path $(date -u +%T)"; one on_path api -u SHIM_OFF
echo "== SHIM_OFF=1: loaded, bypassed $(date -u +%T)"; one bypassed api SHIM_OFF=1
echo "== main trace --api, on the path $(date -u +%T)"; one main_on_path main -u SHIM_OFF
echo "== main trace --api, SHIM_OFF=1 $(date -u +%T)"; one main_bypassed main SHIM_OFF=1
echo > $T/uprobe_events
date -u
