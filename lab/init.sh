#!/bin/busybox sh
# gpu-trace lab: PID 1 of the QEMU guest (packed as /init by `cargo xtask lab`).
#
# Loads the amdgpu module chain, prints the kernel's facts, runs the scenario (gpu-trace and the
# test client /bin/lab-client), and powers off. Human-readable progress goes to the console
# (ttyS0, with the kernel's messages); the results go to the second serial port (ttyS1), which
# carries nothing else, as `LAB ...` lines and `LAB-BEGIN name` ... `LAB-END name rc=N` blocks.
# The host judges them (xtask/src/lab/judge.rs); nothing here decides PASS or FAIL.

/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mount -t tmpfs tmp /tmp
mount -t securityfs none /sys/kernel/security
mount -t tracefs none /sys/kernel/tracing
mount -t debugfs none /sys/kernel/debug
mount -t bpf none /sys/fs/bpf 2>>/tmp/lab-quiet

# The results port: ttyS1 on x86-64; the host names another on the command line where the
# machine has a single UART (arm64's `virt`: `lab.results=ttyS0`, a PCI 16550).
RES=/dev/ttyS1
for arg in $(cat /proc/cmdline); do
  case "$arg" in lab.results=*) RES="/dev/${arg#lab.results=}" ;; esac
done
# Error output the scenario does not want goes to /tmp/lab-quiet, never to /dev/null: a shell
# builtin's redirection (`kill -0 … 2>…`) holds the file open in this process (PID 1) for a
# moment, and a tracer started with `--watch-device /dev/null` then counts PID 1 as a GPU user
# at its start-up inventory (it happened: 22 close notices of init's in b.records).
uptime_s() { cut -d' ' -f1 /proc/uptime; }
out() { echo "$*" > "$RES"; echo "$*"; }
# alive PID: the process exists and is not a zombie waiting to be reaped.
alive() {
  [ -e "/proc/$1/stat" ] && [ "$(sed 's/.*) //' "/proc/$1/stat" 2>>/tmp/lab-quiet | cut -d' ' -f1)" != Z ]
}
# limit PID SECS WHAT: waits for the shell's child PID, at most SECS seconds. Past that it says
# so (`LAB timeout`, a failure for the judge, with where each of its threads sleeps in the
# kernel), kills it, and the scenario goes on: one hung step must not cost the others' results
# (the host's watchdog then only catches a guest that hangs as a whole). Returns PID's exit code
# (137 when killed).
limit() {
  local i=0 n=$(($2 * 5)) t
  while [ $i -lt $n ] && alive "$1"; do sleep 0.2; i=$((i + 1)); done
  if alive "$1"; then
    out "LAB timeout what=$3 after=${2}s t=$(uptime_s)"
    for t in /proc/$1/task/*; do
      out "LAB timeout_stack what=$3 tid=${t##*/} wchan=$(cat $t/wchan 2>>/tmp/lab-quiet) stack=$(tr '\n' ' ' 2>>/tmp/lab-quiet < $t/stack)"
    done
    kill -KILL "$1" 2>>/tmp/lab-quiet
  fi
  wait "$1"
}
# Limits (seconds) of one client or gpu-trace command, and of a tracer's stop after SIGINT; a
# step that normally takes a second or two under TCG.
CMD_LIMIT=240
STOP_LIMIT=60
# block NAME CMD...: runs CMD (at most CMD_LIMIT s), its stdout+stderr become one block.
block() {
  local name=$1 rc
  shift
  echo "LAB-BEGIN $name" > "$RES"
  "$@" > /tmp/block.out 2>&1 &
  limit $! $CMD_LIMIT "$name"
  rc=$?
  cat /tmp/block.out > "$RES"
  echo "LAB-END $name rc=$rc" > "$RES"
  echo "lab: $name rc=$rc"; cat /tmp/block.out
}
# dump NAME FILE: a file as one block.
dump() {
  echo "LAB-BEGIN $1" > "$RES"
  [ -f "$2" ] && cat "$2" > "$RES"
  echo "LAB-END $1 rc=0" > "$RES"
}
step() { out "LAB step $1 t=$(uptime_s)"; }

# Traces with gpu-trace while `lab-client $2` runs: NAME, CLIENT-SUBCOMMAND, gpu-trace args.
# Waits (at most 120 s) for the tracer to report its hooks (it prints them once attached), runs
# the client, stops the tracer with SIGINT, and dumps the tracer's stderr, JSON output and exit
# code.
# wait_ready PID ERRFILE: sets READY=yes once the tracer reported its hooks, READY=no if it exited
# or 120 s passed (attaching is slow under TCG). Not run in a $(subshell): there the tracer would
# not be reaped and `kill -0` would keep finding its zombie.
wait_ready() {
  local i=0
  READY=no
  while [ $i -lt 600 ]; do
    if grep -q "hooks" "$2" 2>>/tmp/lab-quiet; then READY=yes; return; fi
    if ! kill -0 "$1" 2>>/tmp/lab-quiet; then return; fi
    sleep 0.2; i=$((i + 1))
  done
}

trace_client() {
  local name=$1 sub=$2 tracer
  shift 2
  rm -f /tmp/$name.err /tmp/$name.jsonl
  gpu-trace "$@" --format json -o /tmp/$name.jsonl 2> /tmp/$name.err &
  tracer=$!
  wait_ready $tracer /tmp/$name.err
  out "LAB $name tracer_ready=$READY t=$(uptime_s)"
  # The client runs either way: what it sees of the driver is checked on its own. ($sub may be
  # two words: `storm nvobj`.)
  block $name.client lab-client $sub
  stop_tracer $name $tracer
}

# stop_tracer NAME PID: SIGINT, then its exit code, stderr and JSON output. No wait first: the
# clients have exited, so every record of theirs was sent (the driver's teardown at exit runs
# before the parent can reap them), and a stopping gpu-trace detaches, then reads until it has
# read every record the kernel counted as sent (what it could not read, it counts as lost).
stop_tracer() {
  kill -INT $2 2>>/tmp/lab-quiet
  limit $2 $STOP_LIMIT $1.tracer_stop
  out "LAB $1 tracer_exit=$?"
  dump $1.stderr /tmp/$1.err
  dump $1.jsonl /tmp/$1.jsonl
}

step boot
out "LAB fact kernel=$(uname -r)"
out "LAB fact cmdline=$(cat /proc/cmdline)"
out "LAB fact cpus=$(grep -c ^processor /proc/cpuinfo)"

step modules
while read -r mod; do
  if ! insmod "/lib/modules/lab/$mod" 2>/tmp/insmod.err; then
    out "LAB module_failed=$mod $(cat /tmp/insmod.err)"
  fi
done < /lib/modules/lab/order
out "LAB modules_loaded=$(wc -l < /proc/modules) t=$(uptime_s)"
# Test modules built against this kernel's headers (lab/modules/*), e.g. nvlab: NVIDIA-like
# char major 195 with an RM object table of its own and gpu_ext's hook functions.
for m in /lib/modules/lab-extra/*.ko; do
  [ -e "$m" ] || continue
  if insmod "$m" 2>/tmp/insmod.err; then
    out "LAB test_module name=$(basename "$m" .ko) loaded=yes"
  else
    out "LAB test_module name=$(basename "$m" .ko) loaded=no $(cat /tmp/insmod.err)"
  fi
done
if grep -q ' nvidia-lab$' /proc/devices; then
  mknod /dev/nvidiactl c 195 255
  mknod /dev/nvidia0 c 195 0
fi

step facts
if [ -c /dev/kfd ]; then
  out "LAB fact kfd=present dev=$(stat -c '%t:%T' /dev/kfd) proc_devices_major=$(awk '$2 == "kfd" {print $1}' /proc/devices)"
else
  out "LAB fact kfd=absent"
fi
out "LAB fact arch=$(uname -m)"
# Whether the kernel was built with KFD at all (Debian's arm64 kernels are not): the host packs
# the kernel's config beside the modules.
if grep -q '^CONFIG_HSA_AMD=y' /lib/modules/lab/config; then
  out "LAB fact hsa_amd=y"
else
  out "LAB fact hsa_amd=n $(grep -m1 'CONFIG_HSA_AMD' /lib/modules/lab/config || echo '(not in the config)')"
fi
out "LAB fact lsm=$(cat /sys/kernel/security/lsm 2>>/tmp/lab-quiet || echo unreadable)"
out "LAB fact lockdown=$(cat /sys/kernel/security/lockdown 2>>/tmp/lab-quiet || echo none)"
out "LAB fact kprobe_pmu=$([ -e /sys/bus/event_source/devices/kprobe/type ] && cat /sys/bus/event_source/devices/kprobe/type || echo absent)"
out "LAB fact kprobe_events=$([ -e /sys/kernel/tracing/kprobe_events ] && echo present || echo absent)"
out "LAB fact vmlinux_btf=$(stat -c %s /sys/kernel/btf/vmlinux 2>>/tmp/lab-quiet || echo absent)"
out "LAB fact amdgpu_btf=$(stat -c %s /sys/kernel/btf/amdgpu 2>>/tmp/lab-quiet || echo absent)"
out "LAB fact nvlab_btf=$(stat -c %s /sys/kernel/btf/nvlab 2>>/tmp/lab-quiet || echo absent)"
block client.facts lab-client facts
# Why KFD refused the client's open(), in the kernel's words (Linux 7.0 on: "no gpu node!"
# while no AMD GPU is initialised; printed at KERN_WARNING, below the console's loglevel). Its
# message has no newline, so the kernel's log holds it open for a continuation until the next
# message: one is written first.
echo "lab: after client facts" > /dev/kmsg
out "LAB fact kfd_refusal=$(dmesg | grep -m1 -i 'Cannot create KFD process' | sed 's/^\[[^]]*\] //' || true)"

# Every shipped feature runs: nothing here asks the binary whether it has a feature (a build
# without one must fail the lab, not skip it).
step doctor
block doctor gpu-trace doctor

step nvidia
trace_client nv nv --watch-device /dev/null

step nvidia-device
if [ -c /dev/nvidiactl ]; then
  # The syscall layer alone, then with nvlab's gpu_ext hook functions hooked (deep hooks).
  trace_client nvdev nvdev --no-deep-hooks
  trace_client nvdev_gx nvdev
  trace_client nvdev_gxk nvdev --deep-attach kprobe
  # nvlab as an RM of its own: its objects, refusals and work-submit tokens (the client prints
  # what the module answered), traced with the gpu_ext hooks (default).
  trace_client nvobj nvobj
  # The driver's entry points (issue 17): 100000 unrelated getppid() and pipe ioctls, then
  # nvobj's RM calls, with the kernel counting every program run (--bpf-stats). Hooked at the
  # driver's entry points, no program may run for the storm and the ioctl program runs once
  # per RM call; with the syscall layer alone (the comparison) one runs for every syscall.
  trace_client nventry "storm nvobj" --bpf-stats
  trace_client nventry_sys "storm nvobj" --bpf-stats --no-deep-hooks
else
  out "LAB nvdev=absent"
fi

step amd
block amd.probe gpu-trace --vendor amd --duration 0.1 --format json -o /tmp/amd-probe.jsonl
# The syscall layer alone (what every kernel has), then the same calls with the driver's own
# functions hooked where this kernel allows it (issue 3's deep hooks), to compare.
trace_client amd kfd-create --vendor amd --no-deep-hooks
trace_client ops_syscall kfd-ops --vendor amd --no-deep-hooks
trace_client ops_deep kfd-ops --vendor amd
# The same with kprobes only: the fallback every deep hook has where trampolines are refused.
trace_client ops_kprobe kfd-ops --vendor amd --deep-attach kprobe
# The same proof by counts as nventry, for the real amdgpu (issue 17).
trace_client kfdentry "storm kfd-ops" --vendor amd --bpf-stats

# --deny-pid (issue 4): NAME SUB gpu-trace-args. Two identical clients wait, on /tmp/go and
# /tmp/go2; gpu-trace denies the first. Then the denied PID is handed to a new process
# (ns_last_pid), which must not be denied: the policy follows the process, not the number.
deny_trace() {
  local name=$1 sub=$2 denied other tracer
  shift 2
  rm -f /tmp/go /tmp/go2 /tmp/$name.*
  lab-client wait /tmp/go "$sub" > /tmp/$name.denied 2>&1 &
  denied=$!
  lab-client wait /tmp/go2 "$sub" > /tmp/$name.other 2>&1 &
  other=$!
  gpu-trace --deny-pid $denied "$@" --format json -o /tmp/$name.jsonl 2> /tmp/$name.err &
  tracer=$!
  wait_ready $tracer /tmp/$name.err
  out "LAB $name tracer_ready=$READY denied_pid=$denied other_pid=$other t=$(uptime_s)"
  # One after the other (see deny_cgroup_trace).
  touch /tmp/go
  limit $denied $CMD_LIMIT $name.denied
  wait_forked /tmp/$name.denied $name.denied
  touch /tmp/go2
  limit $other $CMD_LIMIT $name.other
  wait_forked /tmp/$name.other $name.other
  # The denied process is reaped: its denial ended in the kernel at its exit (sched_process_exit),
  # before its parent could reap it, so its pid may be handed on at once.
  cp /bin/lab-client /tmp/lab-reuse   # its own comm, to tell its events from the denied one's
  echo $((denied - 1)) > /proc/sys/kernel/ns_last_pid
  /tmp/lab-reuse "$sub" > /tmp/$name.reuse 2>&1 &
  limit $! $CMD_LIMIT $name.reuse
  wait_forked /tmp/$name.reuse $name.reuse
  dump $name.denied /tmp/$name.denied
  dump $name.other /tmp/$name.other
  dump $name.reuse /tmp/$name.reuse
  stop_tracer $name $tracer
}

# wait_forked FILE NAME: a `fork-SUB` client's parent has exited; wait (at most CMD_LIMIT s) for
# its child's last line (the child is reparented to this shell, not its job).
wait_forked() {
  local i=0 n=$((CMD_LIMIT * 5))
  grep -q "^LAB fork_parent" "$1" 2>>/tmp/lab-quiet || return 0
  while [ $i -lt $n ] && ! grep -q "^LAB fork_child done" "$1"; do sleep 0.2; i=$((i + 1)); done
  grep -q "^LAB fork_child done" "$1" || out "LAB timeout what=$2.fork_child after=${CMD_LIMIT}s t=$(uptime_s)"
}

# deny_runs FUNC NAME: FUNC as NAME_nv on nvlab's device (when loaded) and as NAME_amd on KFD,
# with the clients that try every form of request a policy must refuse (nvdeny, kfd-deny).
deny_runs() {
  if [ -c /dev/nvidiactl ]; then
    $1 "$2_nv" nvdeny
  else
    out "LAB $2_nv=no_device"
  fi
  $1 "$2_amd" kfd-deny --vendor amd
}

step deny
deny_runs deny_trace deny

# --deny-pid covers what the denied process creates, and fails closed on a schedule it cannot
# read (issue 26): the same three clients, each forking a child that runs nvdeny after its
# parent has exited (reparented); then FINN-serialized schedules (nvdeny-finn).
step deny_fork
if [ -c /dev/nvidiactl ]; then
  deny_trace deny_fork_nv fork-nvdeny
  deny_trace deny_finn_nv nvdeny-finn
else
  out "LAB deny_fork_nv=no_device"
  out "LAB deny_finn_nv=no_device"
fi

# --deny-pid on the compat ioctl path (issue 40): the same three roles, each becoming the 32-bit
# x86 client (lab/client32.c), whose schedules reach the LSM hook file_ioctl_compat, not
# file_ioctl. x86-64 guests only (the arm64 kernel's compat processes are AArch32).
step deny_compat
if [ -c /dev/nvidiactl ] && [ -x /bin/lab-client32 ]; then
  deny_trace deny_compat_nv nvdeny32
else
  out "LAB deny_compat_nv=no_client32 arch=$(uname -m)"
fi

# --deny-cgroup (issue 14): NAME SUB gpu-trace-args. gpu-trace denies the cgroup gt-denied, which
# is empty when it starts; then one client joins it and waits on /tmp/go, an identical client
# stays outside. Only the one that entered the cgroup after the start is refused.
deny_cgroup_trace() {
  local name=$1 sub=$2 cg denied other tracer
  shift 2
  cg=$(awk '$3 == "cgroup2" { print $2; exit }' /proc/mounts)
  if [ -z "$cg" ]; then
    mkdir -p /sys/fs/cgroup && mount -t cgroup2 none /sys/fs/cgroup && cg=/sys/fs/cgroup
  fi
  mkdir -p "$cg/gt-denied"
  rm -f /tmp/go /tmp/go2 /tmp/$name.*
  gpu-trace --deny-cgroup /gt-denied "$@" --format json -o /tmp/$name.jsonl 2> /tmp/$name.err &
  tracer=$!
  wait_ready $tracer /tmp/$name.err
  sh -c "echo \$\$ > $cg/gt-denied/cgroup.procs && exec lab-client wait /tmp/go $sub" \
    > /tmp/$name.denied 2>&1 &
  denied=$!
  lab-client wait /tmp/go2 "$sub" > /tmp/$name.other 2>&1 &
  other=$!
  # The denied client is in the cgroup from its first instruction (the shell joins, then execs
  # it), and neither client makes a driver call before /tmp/go or /tmp/go2 exists.
  out "LAB $name tracer_ready=$READY denied_pid=$denied other_pid=$other cgroup2=$cg t=$(uptime_s)"
  # One after the other: run together, each could lose calls to the kernel skipping a program
  # run while the other's run is preempted on the same CPU (seen under TCG on 7.2's lazy
  # preemption; gpu-trace reports such skips at exit), which is not what this step checks.
  touch /tmp/go
  limit $denied $CMD_LIMIT $name.denied
  touch /tmp/go2
  limit $other $CMD_LIMIT $name.other
  dump $name.denied /tmp/$name.denied
  dump $name.other /tmp/$name.other
  stop_tracer $name $tracer
}

step deny_cgroup
deny_runs deny_cgroup_trace deny_cgroup

step kprobe
block kprobe lab-client kprobe

step fentry
block fentry lab-client fentry

step lsm
block lsm lab-client lsm

step done
out "LAB-DONE"
sync
poweroff -f
