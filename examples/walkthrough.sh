#!/bin/bash
# A new user's first session with gpu-trace on a machine without a GPU (docs/walkthrough.md
# quotes what this printed): the short help, doctor, a replay of the project's own H200
# recording, the mistakes a new user makes, a live run, completion, JSON, merge, a pipe.
#   examples/walkthrough.sh [BINARY]     (BINARY defaults to target/release/gpu-trace)
# Run as root from the checkout; it writes only under a fresh temporary directory.
set -u
B=$(realpath "${1:-target/release/gpu-trace}")
R=$(pwd)/examples/outputs/share-h200/share.gtrace
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
mkdir -p "$W/bin" && ln -s "$B" "$W/bin/gpu-trace"
export PATH="$W/bin:$PATH"
cd "$W" || exit 1
cp "$R" share.gtrace
# step N COMMAND...: the command as typed, the first N lines of what it printed (both
# streams), and its exit status.
step() {
  local n=$1
  shift
  printf '$ %s\n' "$*"
  bash -c "$*" > out.txt 2>&1
  local rc=$?
  head -n "$n" out.txt
  [ "$(wc -l < out.txt)" -gt "$n" ] && echo "[… $(($(wc -l < out.txt) - n)) more lines]"
  echo "[exit $rc]"
  echo
}
echo "# $(date -u +%FT%TZ) $(uname -r) $(gpu-trace --version)"
echo
step 40 "gpu-trace -h"
step 6 "gpu-trace doctor"
step 9 "gpu-trace replay share.gtrace"
step 3 "gpu-trace replay share.gtrace --gpu 3 --no-stats"
step 4 "gpu-trace replya share.gtrace"
step 4 "gpu-trace sleep 1"
step 5 "gpu-trace --duration -1"
step 8 "gpu-trace --duration 1 -- sleep 5"
step 1 "gpu-trace replay share.gtrace --format json --no-stats 2>/dev/null | head -1"
step 5 "gpu-trace merge share.gtrace share.gtrace --no-stats 2>&1 | head -5"
step 3 "gpu-trace replay share.gtrace 2>&1 | head -1; echo \"gpu-trace exit \${PIPESTATUS[0]}\""
cp share.gtrace 'second run.gtrace.0002'
touch notes.json
# What bash's TAB offers after `gpu-trace replay ` here (the completion script asks the binary).
step 6 "source <(gpu-trace completions bash); COMP_WORDS=(gpu-trace replay ''); COMP_CWORD=2; \
_clap_complete_gpu_trace gpu-trace '' replay; printf '%s\n' \"\${COMPREPLY[@]}\" | grep -v '^-'"
