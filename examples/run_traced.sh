# Sourced by the GPU-host scripts: run_traced NAME GPU-TRACE-ARGS... -- WORKLOAD...
# Starts gpu-trace (BIN) with the arguments, output in $OUT/NAME.out and .err, runs the workload
# once the tracer has had 1.5 s to attach, then stops the tracer with SIGINT and logs its exit.
run_traced() {
  local name=$1; shift; local targs=(); while [ "$1" != "--" ]; do targs+=("$1"); shift; done; shift
  "$BIN" "${targs[@]}" >"$OUT/$name.out" 2>"$OUT/$name.err" & local tp=$!
  sleep 1.5
  "$@" >>"$OUT/workloads.log" 2>&1
  sleep 1
  kill -INT $tp; wait $tp; echo "$name: gpu-trace exit $?" >>"$OUT/workloads.log"
}
