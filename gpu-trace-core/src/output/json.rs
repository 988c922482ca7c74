//! JSON lines output: one object per event, then one `STATS` object (and, with `--interval`,
//! periodic `STATS` objects with `"final": false` among the events).
//!
//! # Schema
//!
//! Every line is one JSON object. The field names and value spellings below are stable; new
//! fields may be added, existing ones are not renamed or removed. A value the tracer could not
//! know is `null` (what the text output prints as `?`).
//!
//! ## Common fields of every event
//!
//! | field    | type    | meaning |
//! |----------|---------|---------|
//! | `event`  | string  | `"TASK_INIT"`, `"SCHEDULE"`, `"SCHED_UPDATE"`, `"WORK_SUBMIT"`, `"TASK_DESTROY"`, `"PRETRACE_END"` or `"MPS_SHARED"` (always the first field) |
//! | `time`   | string  | wall-clock time, RFC 3339 in UTC with microseconds: `"2024-05-01T21:00:24.561798Z"` |
//! | `ts_ns`  | integer | CLOCK_MONOTONIC nanoseconds of the driver call (`bpf_ktime_get_ns`) |
//! | `cpu`    | integer | CPU the call ran on |
//! | `pid`    | integer | process id (tgid) |
//! | `tid`    | integer | thread id |
//! | `comm`   | string  | thread name of the caller (bytes that are not UTF-8 shown as U+FFFD; controls, bidi and invisible format characters written as `\uXXXX` escapes, docs/events.md "Untrusted strings") |
//! | `comm_bytes` | array of integers | only when `comm` is not the exact name (it was not UTF-8): the name's bytes |
//! | `key`    | string or null | the task's identity, unique within the run: `"PID:0xCLIENT:0xHANDLE"` (NVIDIA: process, RM client and RM handle of the TSG, 8 hex digits each), `"PID:kfd:QUEUE"` (AMD), with `"#N"` appended for the N-th task with the same three in one run (N ≥ 2); every event of one task has the same key (docs/events.md). null only for a refused AMD `CREATE_QUEUE` |
//! | `tsg`    | string  | the TSG column of the text output, same spelling: `"0x5c000015"` (RM handle), `"12"` (hardware TSG id), `"3"` (KFD queue id), `"?"` |
//! | `handle` | string or null | NVIDIA: the TSG's RM handle in hex (`"0x5c000015"`), also once `tsg` shows the hardware id; for a channel-level call on a TSG this tracer did not see created, the handle the call named. null for AMD |
//! | `client_hex` | string | `client` in hex, 8 digits (`"0xc1d0001c"`) |
//! | `task`   | object  | `{"kind": K, "value": N}`: K is `"hw_tsg"` (hardware TSG id), `"rm_handle"` (RM object handle of the TSG), `"pre_trace"` (RM handle of a TSG — or, when even the channel was never seen, of the channel — created before tracing started: late attach), `"shared"` (RM handle of a TSG the process never created although its RM client was seen: one shared into it, e.g. the MPS server's) or `"kfd_queue"` (AMD KFD queue id); N an unsigned 32-bit integer. `{"kind": "kfd_no_queue"}` (no `value`): an AMD `CREATE_QUEUE` the driver refused; `{"kind": "unknown"}`: no single task (`PRETRACE_END`) |
//! | `client` | integer | RM client handle (NVIDIA), 0 otherwise |
//! | `gpu_device` | object | NVIDIA: the GPU the task is on, as `nvidia-smi` names it, when known: `index` (nvidia-smi's, PCI bus order: the `gpu` of `TASK_INIT`/`WORK_SUBMIT` and of the text lines, what `--gpu` takes), `uuid` (string or null), `bus_id` (`"0000:00:06.0"`), `rm_device` (RM's device instance, the `rm_device` of `TASK_INIT`/`WORK_SUBMIT`). Known once the task's device instance is (its `TASK_INIT` or `WORK_SUBMIT`) and the driver said which GPU that instance is (a traced process's `NV0000_CTRL_CMD_GPU_GET_ID_INFO_V2`, which CUDA issues for each GPU it uses), or on a host with one GPU; before the `cgroup` object (docs/events.md) |
//! | `cgroup` | object  | who the process is, once its cgroup is known (live runs and their recordings, from the kernel's cgroup record or, for processes of the start-up inventory and where that record was lost, from /proc; absent in recordings made before it existed), last field of the line: `id` (cgroup v2 id; null when the path came from the start-up inventory), `path` (below the cgroup2 root; null when it could not be resolved), `container_runtime` (`"docker"`, `"containerd"`, `"cri_o"`, `"podman"`, `"kubernetes"`) and `container_id` (64 hex digits), `container_user` (the UID whose delegated subtree, `user@UID.service`, holds the container: a rootless container, that user's own claim), `pod_uid` and `qos` (`"guaranteed"`, `"burstable"`, `"best_effort"`), `pod_name`, `namespace` and `container_name` (what the node's kubelet log directory, `/var/log/pods`, names that pod and container: live runs, or replay with `--pods-dir`; docs/fleet.md), `unit` (the outermost systemd service or scope, outside containers), `ns_pid` (PID inside the process's own PID namespace); each only when known (docs/containers.md) |
//!
//! ## `TASK_INIT`: a TSG / queue was created
//!
//! | field               | type            | meaning |
//! |---------------------|-----------------|---------|
//! | `engine`            | string or null  | `"GRAPHICS"`, `"COPY"`, `"NVDEC"`, `"NVENC"`, `"NVJPEG"`, `"OFA"`, `"SEC2"`, `"OTHER"` |
//! | `engine_type`       | integer or null | raw `NV2080_ENGINE_TYPE_*` value of the allocation |
//! | `timeslice_us`      | integer or null | timeslice in microseconds |
//! | `timeslice_source`  | string          | `"observed"` (set by the process) or `"driver_default"` |
//! | `interleave`        | string or null  | `"LOW"`, `"MEDIUM"`, `"HIGH"` |
//! | `interleave_source` | string          | `"observed"` or `"driver_default"` |
//! | `runlist`           | integer or null | runlist id |
//! | `gpu`               | integer or null | NVIDIA: the GPU's index as `nvidia-smi` shows it (what `--gpu` takes, `gpu_device.index`); null until the run knows which GPU the task's device instance is (a recording made before the start-up inventory listed GPUs never does). AMD: the KFD `gpu_id` |
//! | `rm_device`         | integer or null | NVIDIA only: RM's own number of the GPU, the device instance (`deviceId`) of the task's parent device object, when seen (until this version the `gpu` field); not nvidia-smi's index in general (RM numbers GPUs in the order it initialized them) |
//!
//! ## `SCHEDULE`: the task was put on the runlist (the admission point)
//!
//! | field          | type            | meaning |
//! |----------------|-----------------|---------|
//! | `channels`     | integer or null | channels of the TSG known at this moment |
//! | `timeslice_us` | integer or null | timeslice in microseconds |
//! | `interleave`   | string or null  | `"LOW"`, `"MEDIUM"`, `"HIGH"` |
//! | `allowed`      | boolean         | the driver accepted the request |
//! | `rm_status`    | integer or null | RM status returned (0 = `NV_OK`); null when the syscall itself failed |
//! | `errno`        | integer         | negative errno of the ioctl syscall, 0 on success (e.g. -1 for `EPERM`) |
//! | `errno_name`   | string          | only when `errno` is not 0 and has a name: its symbolic name, e.g. `"ENOTTY"` beside `"errno":-25` |
//! | `via_channel`  | boolean         | the request was a channel-level schedule (`NVA06F`) |
//!
//! ## `SCHED_UPDATE`: a request that changes how the task is scheduled
//!
//! Printed for every such request, allowed or refused: NVIDIA `SET_TIMESLICE`,
//! `SET_INTERLEAVE_LEVEL` (TSG `NVA06C` and channel `NVA06F`), `PREEMPT`, `GPFIFO_SCHEDULE` with
//! `bEnable` = 0 and the enable after such a disable; AMD `UPDATE_QUEUE` and `SET_CU_MASK`.
//!
//! | field          | type            | meaning |
//! |----------------|-----------------|---------|
//! | `change`       | object          | what the request changes; `what` names it (below) |
//! | `allowed`      | boolean         | the driver accepted the request (only then is `new` the task's value) |
//! | `rm_status`    | integer or null | RM status returned (0 = `NV_OK`); null when the syscall itself failed, and for AMD |
//! | `errno`        | integer         | negative errno of the ioctl syscall, 0 on success |
//! | `errno_name`   | string          | only when `errno` is not 0 and has a name: its symbolic name, e.g. `"EPERM"` beside `"errno":-1` |
//! | `via_channel`  | boolean         | NVIDIA: sent to a channel of the TSG (`NVA06F_CTRL_CMD_SET_INTERLEAVE_LEVEL`, `NVA06F_CTRL_CMD_GPFIFO_SCHEDULE`) |
//!
//! `change` by `what` (an `old_*` value is what the tracer held just before the request, null
//! when not known, e.g. a TSG created before tracing; `old_source` where it came from,
//! `"observed"`, `"driver_default"` or `"driver_hook"`, null when not known):
//!
//! | `what`         | fields | request |
//! |----------------|--------|---------|
//! | `"timeslice"`  | `old_us`, `old_source`, `new_us` (integers, µs) | `NVA06C_CTRL_CMD_SET_TIMESLICE` |
//! | `"interleave"` | `old`, `old_source`, `new` (`"LOW"`, `"MEDIUM"`, `"HIGH"`, null for a raw level outside 0–2), `new_raw` (integer) | `NVA06C`/`NVA06F` `SET_INTERLEAVE_LEVEL` |
//! | `"preempt"`    | `wait` (`bWait`), `manual_timeout` (`bManualTimeout`), `timeout_us` (`timeoutUs`) | `NVA06C_CTRL_CMD_PREEMPT` |
//! | `"run_state"`  | `old`, `new` (`"unscheduled"`: no accepted schedule since creation, `"enabled"`, `"disabled"`; `old` null for a TSG not seen created), `skip_submit`, `skip_enable` (booleans) | `GPFIFO_SCHEDULE` with `bEnable` = 0, or = 1 after a disable (that one also prints its `SCHEDULE`) |
//! | `"amd_queue"`  | `old_priority`, `new_priority`, `old_percentage`, `new_percentage` | AMD `UPDATE_QUEUE` |
//! | `"cu_mask"`    | `old_bits`, `new_bits` | AMD `SET_CU_MASK` (bits of the CU mask) |
//!
//! ## `WORK_SUBMIT`: a work-submit token was handed out / a doorbell assigned
//!
//! | field            | type            | meaning |
//! |------------------|-----------------|---------|
//! | `channel_handle` | integer         | RM handle of the channel |
//! | `chid`           | integer or null | hardware channel id |
//! | `runlist`        | integer or null | runlist id |
//! | `token`          | integer         | the work-submit token |
//! | `gpu`            | integer or null | as in `TASK_INIT`: nvidia-smi's index (AMD: KFD `gpu_id`) |
//! | `rm_device`      | integer or null | as in `TASK_INIT`: RM's device instance (NVIDIA only) |
//!
//! ## `TASK_DESTROY`: the task ended
//!
//! | field      | type    | meaning |
//! |------------|---------|---------|
//! | `cause`    | string  | `"free"` (freed itself), `"parent_free"` (an ancestor was freed), `"fd_close"` (its fd was closed), `"process_exit"` (its process exited), `"kfd_release"` (AMD: the driver tore the process's queues down, seen by a deep hook), `"tracer_exit"` (still alive when tracing stopped) |
//! | `implicit` | boolean | the driver object was not freed explicitly |
//! | `final`    | object  | NVIDIA, when the TSG was tracked: its values at the end (the text line does not show them): `timeslice_us`, `timeslice_source`, `interleave`, `interleave_source`, `channels` (integer), `runlist` (integer or null), `run_state` (`"unscheduled"`, `"enabled"`, `"disabled"`). Absent otherwise |
//!
//! ## `PRETRACE_END`: driver objects made before tracing started ended (late attach)
//!
//! For a process that had a GPU open when tracing started (the `INVENTORY`), or whose calls
//! named an RM client never seen allocated: what it made before tracing ended because it closed
//! the fd, freed that client, or exited. Never a guessed count.
//!
//! | field    | type            | meaning |
//! |----------|-----------------|---------|
//! | `client` | integer or null | the RM client freed (cause `"parent_free"`) |
//! | `fd`     | integer or null | the fd closed (cause `"fd_close"`) |
//! | `cause`  | string          | `"fd_close"`, `"parent_free"` or `"process_exit"` |
//! | `tsgs`   | null            | how many TSGs ended: unknown (always null) |
//!
//! ## `MPS_SHARED`: an MPS client's TSG related to the MPS server's
//!
//! Once per client TSG (`task`, kind `"shared"`): the client's channels were allocated in a TSG
//! it never created, and exactly one TSG of the MPS server (`nvidia-cuda-mps-server`) is on the
//! runlist of the client's work-submit token.
//!
//! | field         | type    | meaning |
//! |---------------|---------|---------|
//! | `server_pid`  | integer | the MPS server process |
//! | `server_task` | object  | the server's TSG, as `task` |
//! | `runlist`     | integer | the runlist both are on |
//!
//! ## `INVENTORY`: processes that had a GPU open when tracing started (first line, live runs)
//!
//! One line before any event, live or replayed from a recording that holds it. It lists the
//! processes with a device node of the traced vendor open that the filters select: `--pid`,
//! `--comm` and (live) `--cgroup`/`--container`, as the events are (a recording keeps them
//! whatever `--pid`/`--comm` say). It has
//! `event` and `time` (when the walk was taken) but not the other common fields.
//!
//! | field       | type            | meaning |
//! |-------------|-----------------|---------|
//! | `taken_ns`  | integer         | CLOCK_MONOTONIC ns of the walk |
//! | `gpus`      | array           | NVIDIA GPUs from `/proc/driver/nvidia/gpus/*/information`: `minor`, `bus_id`, `uuid`, `name` (strings or null) |
//! | `processes` | array           | one object per process, by ascending pid: `pid`, `comm`, `cmdline` (array of strings), `exe` (string or null), `cgroup` (string or null) — strings from /proc as `comm` in events (U+FFFD for bytes that are not UTF-8, the rule's characters as `\uXXXX`), each followed, only where it is not exact, by its bytes: `comm_bytes`, `cmdline_bytes` (one array per argument), `exe_bytes`, `cgroup_bytes` — `gpus` (array: `minor`, `bus_id`, `uuid`, `name`, `memory_bytes` — NVML's figure, or null), `fds` (array of `[fd, {"kind": K}]`: K `"nv_ctl"`, `"nv_gpu"` with `"minor": N`, `"nv_uvm"`, `"kfd"`, `"watched"`), `mps` (`"server"`, `"control"` or null) |
//! | `vanished`  | integer         | processes that exited while the walk read them |
//! | `denied`    | integer         | processes whose fds could not be read (`hidepid`, no privileges) |
//! | `denied_because` | string      | only with `denied` > 0: what gpu-trace lacked, `"root"` (not root), `"sys_ptrace"` (root without `CAP_SYS_PTRACE`, e.g. the DaemonSet's capabilities), `"nothing"` (`hidepid` or a security module) |
//! | `nvml_note` | string          | only when NVML added nothing: why (library absent, driver not loaded) |
//!
//! ## `amd`: AMD KFD events only
//!
//! Events from `/dev/kfd` carry the fields above (NVIDIA-only ones `null`; `client` 0; `gpu` is
//! the KFD `gpu_id`; `WORK_SUBMIT`'s `token` is the doorbell's byte offset in the process's
//! doorbell pages) and, last, an `amd` object. NVIDIA events have no `amd` key.
//!
//! | field             | type            | meaning |
//! |-------------------|-----------------|---------|
//! | `via`             | string          | `SCHEDULE` and `SCHED_UPDATE` only: `"create"` (`CREATE_QUEUE`), `"update"` (`UPDATE_QUEUE`) or `"cu_mask"` (`SET_CU_MASK`) |
//! | `queue_type`      | string or null  | `"COMPUTE"`, `"COMPUTE_AQL"`, `"SDMA"`, `"SDMA_XGMI"`, `"SDMA_BY_ENG_ID"`, `"UNKNOWN"` |
//! | `queue_type_raw`  | integer or null | raw `KFD_IOC_QUEUE_TYPE_*` |
//! | `priority`        | integer or null | queue priority, 0–15 |
//! | `percentage`      | integer or null | queue percentage, 0–100 (0: inactive) |
//! | `pm4_target_xcc`  | integer or null | bits 15:8 of `queue_percentage` |
//! | `ring_size`       | integer or null | ring size in bytes |
//! | `active`          | boolean or null | ring address and percentage non-zero |
//! | `gpu_id`          | integer or null | KFD `gpu_id` |
//! | `doorbell_offset` | integer or null | mmap offset of the queue's doorbell returned by `CREATE_QUEUE` |
//! | `sdma_engine_id`  | integer or null | `sdma_engine_id` (96-byte `CREATE_QUEUE` only) |
//! | `cu_mask_bits`    | integer or null | bits of the CU mask set with `SET_CU_MASK` |
//! | `hw_doorbell`     | integer or null | `TASK_INIT`, deep hook on the DQM's `create_queue_*` only: the doorbell's absolute dword index in the doorbell BAR |
//! | `vmid`            | integer or null | `TASK_INIT`, deep hook on the DQM's `create_queue_*` only: the VMID the driver gave the queue (0 until the hardware scheduler maps the process) |
//! | `driver_active`   | boolean or null | `TASK_INIT`, deep hook on the DQM's `create_queue_*` only: the driver's own `is_active` |
//! | `mqd_init_addr`   | integer or null | `TASK_INIT`, deep hook on `init_mqd` only: address of the `init_mqd` copy (one per GPU generation) that built the queue's hardware descriptor |
//!
//! ## `api`: the API call a driver event happened in (`gpu-trace --api`)
//!
//! With `--api`, an event made by a thread inside a traced GPU API call ([api.md](api.md#driver-events-inside-api-calls---api))
//! carries an `api` object after `amd`'s place; other events, and every event without `--api`,
//! have no `api` key.
//!
//! | field     | type    | meaning |
//! |-----------|---------|---------|
//! | `symbol`  | string  | the innermost open call's symbol (`cuCtxCreate_v4`) |
//! | `library` | string  | its library's file name (`libcuda.so.1`; at most 64 bytes) |
//! | `depth`   | integer | traced calls open on the thread (1: this one alone) |
//! | `caller`  | object  | only when `depth` > 1: the call one level out, `symbol` and `library` |
//!
//! ## `API_CALL`, `API_RECURSION`, `API_STUCK`: the API records (`gpu-trace --api`, `gpu-trace api`)
//!
//! With `--api`, `API_RECURSION`: once per (thread, symbol of one library) re-entered on the
//! thread, and once per thread past 16 open calls; with `--api-calls` also `API_CALL`: one per
//! completed traced call (a ring record each: see [api.md](api.md#cost)). Among the driver
//! events, in the order the ring delivered them (a call's line comes at its return).
//! `gpu-trace api` writes the same objects (`API_CALL` with `-v`), and `API_STUCK` once per call
//! open `--stuck-after` seconds or longer. All have `event`, `time`, `ts_ns`, `cpu`, `pid`,
//! `tid`, `comm` (and `comm_bytes`) as every event (`ts_ns`: the call's return, the re-entry,
//! the moment userspace found the call stuck; `cpu`: null for `API_STUCK`, which no thread
//! made on a CPU), then:
//!
//! | field         | type    | meaning |
//! |---------------|---------|---------|
//! | `symbol`      | string  | the call's symbol (`cuCtxCreate_v4`; `#N` when the recording named no such probe) |
//! | `library`     | string  | its library: the file name in the main trace (`libcuda.so.1`; at most 64 bytes), the path as `/proc/PID/maps` shows it in `gpu-trace api` |
//! | `duration_ns` | integer | `API_CALL`: entry to return (the call began at `ts_ns − duration_ns`) |
//! | `ret`         | integer | `API_CALL`: the return value as a 32-bit signed status (`CUresult`, `cudaError_t`, `hipError_t`) |
//! | `depth`       | integer | `API_CALL`: traced calls open on the thread when it began (0: outermost); `API_RECURSION`: open calls, this one included |
//! | `caller`      | object  | `API_CALL`, only when `depth` > 0: the call one level out, `symbol` and `library` |
//! | `preload`     | boolean | `API_CALL` of `gpu-trace api` only: its library came through `LD_PRELOAD` in this process (the main trace does not know) |
//! | `why`         | string  | `API_RECURSION`: `"re-entered"` or `"max-depth"` |
//! | `chain`       | array   | `API_RECURSION`: the open calls before this one, outermost first (at most 16): `symbol`, `library` each |
//! | `open_ns`     | integer | `API_STUCK`: how long the call had been open when seen |
//! | `state`       | string  | `API_STUCK`: `/proc/PID/task/TID/stat`'s state letter (`?` unknown) |
//! | `wchan`       | string  | `API_STUCK`: the kernel function the thread waits in (`/proc/…/wchan`; `0` when running) |
//! | `syscall`     | string  | `API_STUCK`: `/proc/…/syscall`'s first field: the system call's number, `running`, or empty |
//! | `stack`       | array of strings | `API_STUCK`: the scanned user stack, innermost first: `path+0xOFFSET` and, where a symbol covers it, ` symbol+0xOFF` |
//! | `cgroup`      | object  | as for the driver events, when known |
//!
//! (Until this version `gpu-trace api` wrote objects of its own: no `time`, `ts_ns`, `cpu`;
//! `caller_library` instead of `caller`.)
//!
//! ## `GPU_SHARE`: one NVML per-process utilization sample (live runs with NVML)
//!
//! One line per sample `nvmlDeviceGetProcessUtilization` returned (`--share-interval`; not in text
//! output, whose statistics block gets the shares instead). What a sample means and how the share
//! is computed: [events.md](events.md#gpu-share-nvml-samples).
//!
//! | field    | type            | meaning |
//! |----------|-----------------|---------|
//! | `event`  | string          | `"GPU_SHARE"` |
//! | `time`   | string          | when the driver took the sample, RFC 3339 UTC with µs |
//! | `ts_us`  | integer         | the same, µs of the CPU real-time clock, as NVML gives it |
//! | `pid`    | integer         | the process NVML names |
//! | `comm`   | string or null  | its name, when gpu-trace saw it (escaped) |
//! | `gpu`    | integer         | NVML device index |
//! | `uuid`   | string or null  | NVML device UUID |
//! | `sm`, `mem`, `enc`, `dec` | integer | SM, memory-controller, encoder, decoder utilization over the sampling period, % |
//! | `cgroup` | object          | as in events, when the process's cgroup is known |
//!
//! ## `GPU_SHARE_STATS`: the shares over the run (before the final `STATS`)
//!
//! Only when samples came (and without `--no-stats`).
//!
//! | field       | type    | meaning |
//! |-------------|---------|---------|
//! | `event`     | string  | `"GPU_SHARE_STATS"` |
//! | `window_s`  | number  | the window of `share_max`: `--interval`, else 10 s |
//! | `processes` | array   | per GPU and process: `gpu`, `pid`, `share_mean` (0..1, over the run), `share_max` (largest over one window), `samples` (naming it), `points` (the GPU's sampling points), `params` (`timeslice=… us interleave=…` in force at the end, null when not seen), `changes` (each change of its timeslice/interleave: `at_us`, `before_params`, `after_params`, `share_before`, `share_after`: the share from the previous change, or the first sample, to this one, and from this one to the next or the last sample; null when no sampling point fell there) |
//! | `not_kept`  | integer | samples beyond the 1 048 576 kept (not in the figures) |
//!
//! ## `STATS`: the last line, and every `--interval` seconds
//!
//! | field                   | type            | meaning |
//! |-------------------------|-----------------|---------|
//! | `event`                 | string          | `"STATS"` |
//! | `final`                 | boolean         | true for the last line (at exit); false for the periodic ones of `--interval`, which count everything so far (the kernel counters of a live run are those of the last line only: 0 before) |
//! | `duration_s`            | number          | seconds traced (so far) |
//! | `task_init`             | integer         | `TASK_INIT` events |
//! | `schedule`              | integer         | `SCHEDULE` events |
//! | `schedule_refused`      | integer         | of those, refused (`allowed` false) |
//! | `sched_update`          | integer         | `SCHED_UPDATE` events |
//! | `sched_update_refused`  | integer         | of those, refused |
//! | `preempt`               | integer         | of those, preemption requests |
//! | `work_submit`           | integer         | `WORK_SUBMIT` events |
//! | `task_destroy`          | integer         | `TASK_DESTROY` events |
//! | `task_destroy_implicit` | integer         | of those, implicit |
//! | `kernel`                | object or null  | null when not known (the replay of a recording cut short, without its trailer: exit status 4); otherwise counters of the kernel programs: `dropped` (ring buffer full), `read_failed` (driver arguments unreadable), `ignored` (calls not of interest), `emitted` (records sent), `fd_lookup_failed` (fd not resolved), `denied` (schedules refused by `--deny-pid`), `skipped` (program runs the kernel skipped: the program was already running on that CPU; absent in the replay of a recording made before it was counted), `denied_unread` (of `denied`, those refused without reading `bEnable`: FINN-serialized or unreadable parameters), `deny_unfollowed` (processes created by a denied process that the full deny map could not take: NOT denied); `denied_unread` and `deny_unfollowed` absent in the replay of a recording made before they were counted; all integers |
//! | `malformed`             | integer         | records userspace could not parse |
//! | `decode_errors`         | integer         | driver calls whose arguments could not be decoded |
//! | `live_at_exit`          | integer         | tasks still alive when tracing stopped |
//! | `pretrace_end`          | integer         | `PRETRACE_END` events; only when not 0 |
//! | `mps_shared`            | integer         | `MPS_SHARED` events; only when not 0 |
//! | `unreported`            | object          | driver calls of interest that produced no event, by reason (`schedule_unreadable`, `unreadable_params`, `unknown_handle`, `pretrace_calls`, `replaced_handles`, `failed_tsg_allocs`, `unknown_queue`, `replaced_queues`, `deep_unmatched`, `deep_unknown`, `kfd_release_no_queues`, `untracked_handles`: handles never seen created that were not remembered past the caps of [events.md](events.md#bounded-state); `gpu_unknown`: events `--gpu` left out because their GPU was not known yet; `own_process`: records of gpu-trace's own process, its NVML thread's driver calls, left out by a live run; `unfollowed`: processes `-- CMD` created past the 1 048 576 it follows, not traced; `api_uncounted`, `api_through_uncounted`: `--api` calls (and calls through interposers) the kernel could not count, its per-process sums being full: see `--api-sums`); only non-zero reasons; integers. `pretrace_calls`: calls of an RM client made before tracing that gave no event (some are also in `unknown_handle`). The same reasons and counts are served while tracing as `gpu_trace_unreported_total{reason}` ([fleet.md](fleet.md)) |
//! | `lost_samples`          | integer or null | live runs: records the kernel sent (`emitted`) that were never read; null when none were lost |
//! | `output_lost`           | integer         | only when not 0: output lines dropped because the output's reader did not keep up (a stalled pipe, FIFO or disk) |
//! | `recording_lost`        | integer         | only when not 0: records of `--record` dropped because the recording's reader did not keep up |
//! | `flight_recorder`       | object          | only with `--flight-recorder`: `triggers` (object: the triggers that came by name, `signal`, `refused`, `recursion`, `dropped`, `signal-exit`, integers, whether a dump followed or not), `dumps` (dumps written), `not_written` (triggers past `--dump-max-per-hour`), `failed` (dumps that could not be written) ([recording.md](recording.md#flight-recorder---flight-recorder)) |
//! | `processes`             | array           | one object per process, by ascending pid: `pid`, `comm` (first seen; `comm_bytes` as in events), `task_init`, `schedule`, `schedule_refused`, `sched_update`, `preempt`, `work_submit`, `task_destroy` |
//! | `containers`            | array           | only when a traced process ran in a container or pod: per container / pod, `group` (its label: runtime and short id, `pod NAMESPACE/NAME (qos)` where the node names the pod, else `pod UID (qos)`; null for the processes outside containers, last), `processes`, and the event counts of `processes` summed |
//! | `engines`               | array           | per engine, by name: `engine` (NVIDIA `"GRAPHICS"`, `"COPY"`, ...; AMD queue type; `"?"` not known), `task_init`, `schedule`, `sched_update`, `preempt` |
//! | `gpus`                  | array           | per GPU: `gpu` (as in `TASK_INIT`: nvidia-smi's index, null when not known; AMD the KFD `gpu_id`), `rm_device` (NVIDIA only: RM's device instance, null when not seen; two rows whose `gpu` is null are two device instances), `uuid` (nvidia-smi's, only where known: see `gpu_device`), `live` (tasks alive now), `max_live` (most alive at once). Until this version `gpu` was RM's device instance and `index` nvidia-smi's |
//! | `runlists`              | array           | per GPU and runlist: `gpu`, `rm_device` (as in `gpus`), `runlist`, `live`, `max_live`; a task counts on its runlist from the first event that names it (NVIDIA: its first `WORK_SUBMIT`) |
//! | `tasks`                 | array           | per task, ended ones first in the order they ended, then the live ones: `key`, `pid`, `task` (as `tsg`), `engine`, `runlist`, `init_ns`, `first_schedule_ns` (first allowed `SCHEDULE`), `first_submit_ns` (first `WORK_SUBMIT`), `end_ns`, `end_cause` (a `cause`; null while alive), `schedule_refused`, `timeslice_us` and `interleave` (the last known values, the final ones once ended), `preemptions`, `param_changes` (accepted changes), `updates_refused`, and the derived `lifetime_ns`, `init_to_schedule_ns`, `init_to_submit_ns`, then `gpu` and `rm_device` (as in `gpus`); times are CLOCK_MONOTONIC ns, null where not known |
//! | `tasks_omitted`         | integer         | left out of `tasks`: ended tasks beyond the 10000 kept, and events of new tasks while 100000 were alive (or 4096 of the same process) |
//! | `diagnostics`           | object or null  | null with a null `kernel`; kernel-internal counters (also in `kernel`; the text output shows them with `-v`): `emitted`, `ignored` |
//!
//! ## `API_STATS` (`gpu-trace api`, `gpu-trace --api`)
//!
//! `gpu-trace api`'s tracing ([api.md](api.md#tracing)) writes one JSON object per line with
//! `--format json`: the records above, and these sums. Strings from the traced process (`library`, `symbol`, `comm`) are UTF-8, a
//! byte that is not as U+FFFD.
//!
//! `API_STATS`: one per (process, library, symbol) with completed calls, every `--interval` and at
//! the end. The main trace with `--api` writes the same objects just before each `STATS` line
//! (its periodic ones and the final one, `final` alike), with the library's file name and
//! `preload` false ([api.md](api.md#driver-events-inside-api-calls---api), Figures).
//!
//! | field          | type    | meaning |
//! |----------------|---------|---------|
//! | `event`        | string  | `"API_STATS"` |
//! | `final`        | boolean | true for the read at the end; false for the periodic ones (totals so far) |
//! | `pid`          | integer | the process |
//! | `library`      | string  | the library's path as `/proc/PID/maps` shows it (or `#N` if unknown) |
//! | `preload`      | boolean | the library came through `LD_PRELOAD` in this process |
//! | `symbol`       | string  | the symbol |
//! | `calls`        | integer | calls, counted at their entry |
//! | `untimed`      | integer | calls counted without a duration: open now, or their return was not seen (past the kernel's 64 nested return probes, a `longjmp`, an exception); `calls` less the histogram's total |
//! | `errors`       | integer | calls whose return value's low 32 bits were not 0 |
//! | `total_ns`     | integer | the timed calls' total duration |
//! | `mean_ns`      | integer | `total_ns` over the timed calls |
//! | `p50_ns_below`, `p99_ns_below` | integer | the upper bound of the histogram bucket holding the quantile |
//! | `hist_log2_ns` | array of 40 integers | bucket `i`: calls of `2^(i-1) ≤ ns < 2^i` (bucket 0: 0 ns; the last: everything longer) |
//!
//! ## `host` and `MERGE_STATS` (`gpu-trace merge`)
//!
//! `gpu-trace merge` replays several nodes' recordings on one timeline ([recording.md](recording.md#merge-several-nodes-on-one-timeline)).
//! Every line a node's recording gives (its `INVENTORY`, events, `GPU_SHARE`, `STATS`, …,
//! each as `replay` writes it) starts with one more field, before `event`:
//!
//! | field  | type   | meaning |
//! |--------|--------|---------|
//! | `host` | string | the node: its recording's host name (`"NAME#2"` for a second recording of one host, `"?"` for none) |
//!
//! The last line is one `MERGE_STATS` object, without `host`:
//!
//! | field     | type    | meaning |
//! |-----------|---------|---------|
//! | `event`   | string  | `"MERGE_STATS"` |
//! | `nodes`   | array of objects | one per node, in the order the recordings were given: `host` and the counts below |
//! | `all`     | object  | the counts of every node added up (no `host`) |
//! | `span_ns` | integer | real time from the earliest first record to the latest last record of the nodes |
//!
//! Counts (each node's `STATS` has the same ones): `events` (the events its pipeline counted),
//! `task_init`, `schedule`, `schedule_refused`, `sched_update`, `work_submit`, `task_destroy`,
//! `pretrace_end`, `mps_shared`, and `dropped` (the kernel's drops from the recording's
//! trailer; null when a recording has none, and in `all` when any node's is null).
//!

use chrono::{Datelike as _, SecondsFormat, Timelike as _};
use serde::Serialize;

use crate::event::{Event, Hex8, Origin};
use crate::event_section::EventFields;
use crate::inventory::Inventory;
use crate::model::gpus::GpuIdentity;
use crate::model::stats::Stats;
use crate::model::workload::Attribution;
use crate::output::clock::Clock;
use crate::output::stats_json::stats_json;
use crate::section::{Section, field, plain_field};
use crate::sink::{ApiEnriched, Enriched, RunEnd, ShareBatch, Sink, SinkError};

/// Appends the JSON line of `ev` to `out` (no newline), as described in the
/// [module documentation](self): with the GPU the task is on and the process's cgroup, each when
/// known. Strings are written terminal-safe ([`crate::escape::TerminalSafeJson`]).
///
/// The documented order, written by hand (this runs for every event): the frame (`event`,
/// `time`, the origin's fields, the identity fields), then the event's sections, which write
/// their own fields ([`EventFields`]: the kind's, its `gpu` numbering and its vendor detail's;
/// then the API call it happened in), then (each when there is one) `gpu_device` and `cgroup`.
/// Every value goes through serde_json and the terminal-safe escaper, as a flattened serde line
/// did.
pub fn write_event(
    out: &mut Vec<u8>,
    ev: &Event,
    clock: &Clock,
    gpu: Option<&GpuIdentity>,
    attribution: Option<&Attribution>,
) {
    // `event` names are fixed upper-case ASCII: nothing to escape.
    out.extend_from_slice(b"{\"event\":\"");
    out.extend_from_slice(ev.kind.name().as_bytes());
    out.extend_from_slice(b"\",\"time\":");
    UtcMicros::at(clock, ev.origin.ts_ns).write_quoted(out);
    write_origin(out, &ev.origin);
    let id = ev.identity();
    plain_field(
        out,
        "key",
        id.key
            .as_ref()
            .map(|k| k.text())
            .as_ref()
            .map(|k| k.as_bytes()),
    );
    plain_field(out, "tsg", Some(id.tsg.as_str().as_bytes()));
    plain_field(
        out,
        "handle",
        id.handle.map(Hex8::text).as_ref().map(|h| &h[..]),
    );
    plain_field(out, "client_hex", Some(&id.client_hex.text()[..]));
    EventFields::new(ev, gpu).json(out);
    if let Some(api) = &ev.api {
        api.json(out);
    }
    if let Some(gpu) = gpu {
        field(out, "gpu_device", gpu);
    }
    if let Some(a) = attribution {
        field(out, "cgroup", &a.json_fields());
    }
    out.push(b'}');
}

/// Appends the JSON line of an API record of the main trace (`gpu-trace --api`; no newline):
/// `event`, `time` and the origin's fields as for a driver event, then the record's own fields
/// (its [`Section`]), and `cgroup` when known (module documentation, "API records of the main
/// trace"); or the record's own line where it has no frame
/// ([`crate::api::names::ApiEvent::own_json_line`]). False (nothing appended) for a process's
/// sums (`API_STATS`: the statistics carry them).
pub fn write_api(out: &mut Vec<u8>, ev: &ApiEnriched<'_>, clock: &Clock) -> bool {
    // The same lines as `gpu-trace api`'s (docs/api.md).
    if let Some(line) = ev.event.own_json_line() {
        out.extend_from_slice(line.as_bytes());
        return true;
    }
    let Some(name) = ev.event.name() else {
        return false;
    };
    out.extend_from_slice(b"{\"event\":\"");
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b"\",\"time\":");
    UtcMicros::at(clock, ev.origin.ts_ns).write_quoted(out);
    write_origin(out, ev.origin);
    ev.event.json(out);
    if let Some(a) = ev.cgroup {
        field(out, "cgroup", &a.json_fields());
    }
    out.push(b'}');
    true
}

/// The origin's fields, as [`Origin`]'s `Serialize` writes them: `ts_ns`, `cpu`, `pid`, `tid`,
/// `comm` and, only where that is not the exact name, `comm_bytes`.
fn write_origin(out: &mut Vec<u8>, o: &Origin) {
    let mut n = itoa::Buffer::new();
    out.extend_from_slice(b",\"ts_ns\":");
    out.extend_from_slice(n.format(o.ts_ns).as_bytes());
    out.extend_from_slice(b",\"cpu\":");
    match o.cpu() {
        Some(cpu) => out.extend_from_slice(n.format(cpu).as_bytes()),
        None => out.extend_from_slice(b"null"),
    }
    out.extend_from_slice(b",\"pid\":");
    out.extend_from_slice(n.format(o.pid).as_bytes());
    out.extend_from_slice(b",\"tid\":");
    out.extend_from_slice(n.format(o.tid).as_bytes());
    let comm = o.comm().json();
    field(out, "comm", &comm.comm);
    if let Some(bytes) = &comm.comm_bytes {
        field(out, "comm_bytes", bytes);
    }
}

/// The JSON sink: an `INVENTORY` line first (late attach), one line per event, periodic
/// `STATS` lines with `--interval`, the final `STATS` line.
pub struct JsonSink<W> {
    clock: Clock,
    out: W,
    /// The line being written (kept to reuse its allocation).
    buf: Vec<u8>,
    /// `gpu-trace merge`: `"host":"NAME",`, the first key of every line of this node's.
    host: Option<Vec<u8>>,
}

impl<W: std::io::Write> JsonSink<W> {
    pub fn new(clock: Clock, out: W) -> Self {
        Self {
            clock,
            out,
            buf: Vec::with_capacity(1024),
            host: None,
        }
    }

    /// `gpu-trace merge`: every line (events, `INVENTORY`, `STATS`, …) starts with a `host`
    /// key.
    pub fn set_host(&mut self, host: &str) {
        let mut key = b"\"host\":".to_vec();
        let name = serde_json::Value::from(crate::escape::lossy(host).into_owned()).to_string();
        key.extend_from_slice(crate::escape::json_terminal_safe(name).as_bytes());
        key.push(b',');
        self.host = Some(key);
    }

    /// Writes the line in `self.buf` (an object, with its newline), with the `host` key
    /// first where set.
    fn write_buf(&mut self) -> Result<(), SinkError> {
        if let Some(key) = &self.host
            && self.buf.first() == Some(&b'{')
        {
            self.buf.splice(1..1, key.iter().copied());
        }
        self.out.write_all(&self.buf).map_err(SinkError::Output)
    }

    pub fn out(&self) -> &W {
        &self.out
    }

    /// The writer itself, for what a caller writes between two events.
    pub fn out_mut(&mut self) -> &mut W {
        &mut self.out
    }

    pub fn into_out(self) -> W {
        self.out
    }

    fn line(&mut self, line: &str) -> Result<(), SinkError> {
        if self.host.is_none() {
            return writeln!(self.out, "{line}").map_err(SinkError::Output);
        }
        self.buf.clear();
        self.buf.extend_from_slice(line.as_bytes());
        self.buf.push(b'\n');
        self.write_buf()
    }

    /// `--api`: one `API_STATS` line per (process, library, symbol) with figures, before a
    /// `STATS` line (`final_`: the last one).
    fn api_stats_lines(&mut self, stats: &Stats, final_: bool) -> Result<(), SinkError> {
        for row in stats.api_rows() {
            self.line(&crate::api::stats::json(row, final_))?;
        }
        Ok(())
    }
}

impl<W: std::io::Write> Sink for JsonSink<W> {
    fn inventory(&mut self, _inv: &Inventory, selected: &Inventory) -> Result<(), SinkError> {
        let line = inventory_json(selected, &self.clock);
        self.line(&line)
    }

    fn event(&mut self, ev: &Enriched<'_>) -> Result<(), SinkError> {
        self.buf.clear();
        write_event(&mut self.buf, ev.event, &self.clock, ev.gpu, ev.cgroup);
        self.buf.push(b'\n');
        self.write_buf()
    }

    fn api(&mut self, ev: &ApiEnriched<'_>) -> Result<(), SinkError> {
        self.buf.clear();
        if !write_api(&mut self.buf, ev, &self.clock) {
            return Ok(());
        }
        self.buf.push(b'\n');
        self.write_buf()
    }

    /// A `GPU_SHARE` line per sample ([`super::share`]).
    fn shares(&mut self, batch: &ShareBatch<'_>) -> Result<(), SinkError> {
        for s in batch.samples {
            self.line(&super::share::share_json(s.sample, s.process, s.cgroup))?;
        }
        Ok(())
    }

    fn periodic(&mut self, stats: &Stats) -> Result<(), SinkError> {
        self.api_stats_lines(stats, false)?;
        self.line(&stats_json(stats, false))
    }

    fn flush(&mut self, _stats: &Stats, _untracked: u64) -> Result<(), SinkError> {
        self.out.flush().map_err(SinkError::Output)
    }

    fn finish(&mut self, end: &RunEnd<'_>) -> Result<(), SinkError> {
        if end.stats_text.is_some() {
            let share = &end.stats.share;
            if !share.is_empty() {
                let line = super::share::share_stats_json(share, end.share_window_us);
                self.line(&line)?;
            }
            self.api_stats_lines(end.stats, true)?;
            self.line(&stats_json(end.stats, true))?;
        }
        self.out.flush().map_err(SinkError::Output)
    }
}

/// The JSON line of an event (no newline), without GPU and cgroup: see [`write_event`].
pub fn event_json(ev: &Event, clock: &Clock) -> String {
    let mut out = Vec::with_capacity(384);
    write_event(&mut out, ev, clock, None, None);
    String::from_utf8(out).expect("serde_json writes UTF-8")
}

/// A wall-clock time as RFC 3339 in UTC with microseconds (`2024-05-01T21:00:24.561798Z`),
/// serialized without an intermediate string (chrono's own formatting for years it would
/// spell otherwise).
#[derive(Clone, Copy)]
struct UtcMicros(chrono::DateTime<chrono::Utc>);

impl UtcMicros {
    fn at(clock: &Clock, ts_ns: u64) -> Self {
        Self(clock.utc(ts_ns))
    }
}

impl std::fmt::Display for UtcMicros {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let t = self.0;
        if !(0..=9999).contains(&t.year()) {
            return f.write_str(&t.to_rfc3339_opts(SecondsFormat::Micros, true));
        }
        // A leap second shows as :60, as chrono does.
        let (sec, nanos) = match t.nanosecond() {
            n if n >= 1_000_000_000 => (t.second() + 1, n - 1_000_000_000),
            n => (t.second(), n),
        };
        let mut buf = *b"0000-00-00T00:00:00.000000Z";
        let mut put = |at: usize, width: usize, mut v: u32| {
            for i in (at..at + width).rev() {
                buf[i] = b'0' + (v % 10) as u8;
                v /= 10;
            }
        };
        put(0, 4, t.year() as u32);
        put(5, 2, t.month());
        put(8, 2, t.day());
        put(11, 2, t.hour());
        put(14, 2, t.minute());
        put(17, 2, sec);
        put(20, 6, nanos / 1000);
        f.write_str(std::str::from_utf8(&buf).map_err(|_| std::fmt::Error)?)
    }
}

impl UtcMicros {
    /// The time as a JSON string: what its `Serialize` writes (ASCII digits, `-`, `+`, `:`, `.`,
    /// `T`, `Z`: nothing to escape), without serde_json's escaping pass.
    fn write_quoted(&self, out: &mut Vec<u8>) {
        use std::io::Write as _;
        out.push(b'"');
        let _ = write!(out, "{self}");
        out.push(b'"');
    }
}

impl Serialize for UtcMicros {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        // One string from the stack (27 bytes for the years 0–9999).
        let mut buf = [0u8; 40];
        let total = buf.len();
        let mut w = &mut buf[..];
        let _ = std::io::Write::write_fmt(&mut w, format_args!("{self}"));
        let len = total - w.len();
        match std::str::from_utf8(&buf[..len]) {
            Ok(text) if len < total => s.serialize_str(text),
            _ => s.collect_str(self),
        }
    }
}

/// The `{"event":"INVENTORY",...}` line (no newline): the processes that had a GPU open when
/// tracing started, as the start-up inventory found them (`taken_ns`: when, CLOCK_MONOTONIC).
/// `event` and `time` first, like every other line; then the inventory's own fields
/// ([`Inventory::write_json_fields`]).
pub fn inventory_json(inv: &Inventory, clock: &Clock) -> String {
    let mut out = Vec::new();
    out.extend_from_slice(b"{\"event\":\"INVENTORY\",\"time\":");
    UtcMicros::at(clock, inv.taken_ns).write_quoted(&mut out);
    inv.write_json_fields(&mut out);
    out.push(b'}');
    String::from_utf8(out).expect("serde_json writes UTF-8")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::escape;
    use crate::event::{
        DestroyCause, Engine, EventKind, FinalParams, Interleave, Origin, RunState, SchedChange,
        SchedParams, TaskId, TaskKey, ValueSource,
    };
    use crate::model::stats::KernelCounters;
    use serde_json::{Value, json};
    use std::time::Duration;

    const T0: u64 = 5_000_000_000_000;
    /// 2024-05-01T21:00:24.561798123Z
    const WALL0: i128 = 1_714_597_224_561_798_123;

    fn clock() -> Clock {
        Clock::new(WALL0 - i128::from(T0))
    }

    /// The line as a flattened serde struct wrote it before [`write_event`] was written by
    /// hand: the reference that writer must equal byte for byte.
    #[derive(Serialize)]
    struct FlatLine<'a> {
        event: &'static str,
        time: UtcMicros,
        #[serde(flatten)]
        origin: &'a Origin,
        #[serde(flatten)]
        identity: crate::event::Identity,
        #[serde(flatten)]
        kind: &'a EventKind,
        /// The kinds that name their GPU: `gpu` (nvidia-smi's index; AMD's `gpu_id`) and
        /// NVIDIA's `rm_device`.
        #[serde(flatten)]
        numbers: Option<FlatGpu>,
        #[serde(skip_serializing_if = "Option::is_none")]
        amd: Option<&'a crate::event::AmdDetail>,
        #[serde(skip_serializing_if = "Option::is_none")]
        gpu_device: Option<&'a GpuIdentity>,
        #[serde(skip_serializing_if = "Option::is_none")]
        cgroup: Option<crate::model::workload::CgroupFields<'a>>,
    }

    #[derive(Serialize)]
    struct FlatGpu {
        gpu: Option<u32>,
        #[serde(skip_serializing_if = "Option::is_none")]
        rm_device: Option<Option<u32>>,
    }

    fn flat_line(
        ev: &Event,
        clock: &Clock,
        gpu: Option<&GpuIdentity>,
        a: Option<&Attribution>,
    ) -> Vec<u8> {
        let mut out = Vec::new();
        let numbers = ev.kind.driver_gpu().map(|driver| match ev.amd {
            Some(_) => FlatGpu {
                gpu: driver,
                rm_device: None,
            },
            None => FlatGpu {
                gpu: gpu.map(|g| g.index),
                rm_device: Some(driver),
            },
        });
        let line = FlatLine {
            event: ev.kind.name(),
            time: UtcMicros::at(clock, ev.origin.ts_ns),
            origin: &ev.origin,
            identity: ev.identity(),
            kind: &ev.kind,
            numbers,
            amd: ev.amd.as_ref(),
            gpu_device: gpu,
            cgroup: a.map(Attribution::json_fields),
        };
        escape::write_json(&mut out, &line);
        out
    }

    /// Every event of every NVIDIA recording under gpu-trace/tests/fixtures, under hostile and
    /// ordinary names, with and without AMD detail, GPU and cgroup: the hand-ordered line is the
    /// flattened serde line, byte for byte.
    #[test]
    fn hand_ordered_line_is_the_flattened_serde_line_byte_for_byte() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../gpu-trace/tests");
        let mut files = Vec::new();
        for dir in [
            "fixtures",
            "fixtures/h200x2",
            "fixtures/h200x2_gpu_ids",
            "fixtures/h100_late_mps",
            "fixtures/h100_live",
        ] {
            for e in std::fs::read_dir(root.join(dir)).unwrap() {
                let path = e.unwrap().path();
                if path.extension().is_some_and(|x| x == "gtrace") {
                    files.push(path);
                }
            }
        }
        assert!(files.len() >= 10, "recordings: {files:?}");
        let gpu = GpuIdentity {
            index: 1,
            uuid: Some("GPU-\u{1b}[31m".into()),
            bus_id: "0000:00:06.0".into(),
            rm_device: 1,
        };
        let cgroup = Attribution::new(
            77,
            Some("/kubepods/pod1234/cri-containerd-abc\u{202e}".into()),
            Some(7),
        );
        let amd = crate::event::AmdDetail {
            priority: Some(15),
            ring_size: Some(4096),
            ..Default::default()
        };
        let names = [
            "python3",
            "\u{1b}[31mEVIL\"\\",
            "a\u{10FFFF}b\u{7f}\u{2028}",
            "",
        ];
        let (clock, mut events) = (clock(), 0usize);
        for path in &files {
            let file = std::fs::File::open(path).unwrap();
            let mut reader =
                crate::record::RecordReader::new(std::io::BufReader::new(file)).unwrap();
            let mut sources = crate::source::Sources::new();
            while let Some(bytes) = reader.next_record().unwrap() {
                let Ok(record) = crate::wire::parse_record(&bytes) else {
                    continue;
                };
                for mut ev in sources.events_of(&record) {
                    events += 1;
                    for (i, name) in names.iter().enumerate() {
                        ev.origin.comm = (*name).into();
                        ev.amd = (i == 1).then(|| amd.clone());
                        let (g, a) = ((i != 2).then_some(&gpu), (i > 1).then_some(&cgroup));
                        let mut hand = Vec::new();
                        write_event(&mut hand, &ev, &clock, g, a);
                        let flat = flat_line(&ev, &clock, g, a);
                        assert_eq!(
                            String::from_utf8_lossy(&hand),
                            String::from_utf8_lossy(&flat),
                            "{}",
                            path.display()
                        );
                        assert_eq!(hand, flat);
                    }
                }
            }
        }
        assert!(events > 400, "{events} events");
    }

    fn origin(ts_ns: u64) -> Origin {
        Origin {
            ts_ns,
            cpu: 1,
            pid: 637320,
            tid: 637321,
            comm: "py\"th\\on3".into(),
        }
    }

    fn parse(line: &str) -> Value {
        assert!(!line.contains('\n'), "one line: {line}");
        serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"))
    }

    fn keys(v: &Value) -> Vec<&str> {
        v.as_object().unwrap().keys().map(String::as_str).collect()
    }

    fn common(v: &Value, event: &str, ts_ns: u64) {
        assert_eq!(v["event"], event);
        assert_eq!(v["ts_ns"], ts_ns);
        assert_eq!(v["cpu"], 1);
        assert_eq!(v["pid"], 637320);
        assert_eq!(v["tid"], 637321);
        assert_eq!(v["comm"], "py\"th\\on3");
    }

    #[test]
    fn task_init_fields() {
        let ev = Event {
            key: None,
            amd: None,
            api: None,
            origin: origin(T0),
            kind: EventKind::TaskInit {
                task: TaskId::HwTsg(1),
                client: 0xc1d0_0001,
                engine: Some(Engine::Copy),
                engine_type: Some(13),
                timeslice_us: Some(1024),
                timeslice_source: ValueSource::DriverDefault,
                interleave: None,
                interleave_source: ValueSource::Observed,
                runlist: Some(0),
                gpu: None,
            },
        };
        let line = event_json(&ev, &clock());
        assert!(
            line.starts_with(
                r#"{"event":"TASK_INIT","time":"2024-05-01T21:00:24.561798Z","ts_ns":5000000000000,"#
            ),
            "{line}"
        );
        let v = parse(&line);
        common(&v, "TASK_INIT", T0);
        assert_eq!(v["time"], "2024-05-01T21:00:24.561798Z");
        assert_eq!(v["task"], json!({"kind": "hw_tsg", "value": 1}));
        assert_eq!(v["client"], 0xc1d0_0001u32);
        assert_eq!(v["engine"], "COPY");
        assert_eq!(v["engine_type"], 13);
        assert_eq!(v["timeslice_us"], 1024);
        assert_eq!(v["timeslice_source"], "driver_default");
        assert_eq!(v["interleave"], Value::Null);
        assert_eq!(v["interleave_source"], "observed");
        assert_eq!(v["runlist"], 0);
        assert_eq!(v["gpu"], Value::Null);
        assert_eq!(v["rm_device"], Value::Null);
        let mut k = keys(&v);
        k.sort_unstable();
        assert_eq!(
            k,
            [
                "client",
                "client_hex",
                "comm",
                "cpu",
                "engine",
                "engine_type",
                "event",
                "gpu",
                "handle",
                "interleave",
                "interleave_source",
                "key",
                "pid",
                "rm_device",
                "runlist",
                "task",
                "tid",
                "time",
                "timeslice_source",
                "timeslice_us",
                "ts_ns",
                "tsg",
            ]
        );
    }

    #[test]
    fn schedule_fields() {
        let ev = Event {
            key: None,
            amd: None,
            api: None,
            origin: origin(T0 + 29_827_000),
            kind: EventKind::Schedule {
                task: TaskId::RmHandle(0x5c00_0002),
                client: 7,
                channels: Some(8),
                timeslice_us: None,
                interleave: Some(Interleave::Low),
                allowed: false,
                rm_status: None,
                errno: -1,
                via_channel: true,
            },
        };
        let v = parse(&event_json(&ev, &clock()));
        common(&v, "SCHEDULE", T0 + 29_827_000);
        assert_eq!(v["time"], "2024-05-01T21:00:24.591625Z");
        assert_eq!(
            v["task"],
            json!({"kind": "rm_handle", "value": 0x5c00_0002u32})
        );
        assert_eq!(v["channels"], 8);
        assert_eq!(v["timeslice_us"], Value::Null);
        assert_eq!(v["interleave"], "LOW");
        assert_eq!(v["allowed"], false);
        assert_eq!(v["rm_status"], Value::Null);
        assert_eq!(v["errno"], -1);
        assert_eq!(v["errno_name"], "EPERM");
        assert_eq!(v["via_channel"], true);
        assert_eq!(keys(&v).len(), 21);
    }

    #[test]
    fn errno_name_sits_beside_a_non_zero_errno_only() {
        let schedule = |errno| Event {
            key: None,
            amd: None,
            api: None,
            origin: origin(T0),
            kind: EventKind::Schedule {
                task: TaskId::RmHandle(0x5c00_0002),
                client: 7,
                channels: None,
                timeslice_us: None,
                interleave: None,
                allowed: errno == 0,
                rm_status: None,
                errno,
                via_channel: false,
            },
        };
        let line = event_json(&schedule(-25), &clock());
        assert!(
            line.contains(r#""errno":-25,"errno_name":"ENOTTY","via_channel""#),
            "{line}"
        );
        let line = event_json(&schedule(0), &clock());
        assert!(!line.contains("errno_name"), "{line}");
        // A number without a name: the number alone.
        let line = event_json(&schedule(-4095), &clock());
        assert!(!line.contains("errno_name"), "{line}");
        assert!(line.contains(r#""errno":-4095,"#), "{line}");
    }

    #[test]
    fn work_submit_and_destroy_fields() {
        let submit = Event {
            key: None,
            amd: None,
            api: None,
            origin: origin(T0),
            kind: EventKind::WorkSubmit {
                task: TaskId::KfdQueue(3),
                client: 0,
                channel_handle: 0x5c00_0010,
                chid: Some(2),
                runlist: None,
                token: 1_073_741_826,
                gpu: Some(0),
            },
        };
        let v = parse(&event_json(&submit, &clock()));
        common(&v, "WORK_SUBMIT", T0);
        assert_eq!(v["task"], json!({"kind": "kfd_queue", "value": 3}));
        assert_eq!(v["channel_handle"], 0x5c00_0010u32);
        assert_eq!(v["chid"], 2);
        assert_eq!(v["runlist"], Value::Null);
        assert_eq!(v["token"], 1_073_741_826u32);
        // RM's device instance 0, the GPU not known: `gpu` null, never the instance.
        assert_eq!(v["gpu"], Value::Null);
        assert_eq!(v["rm_device"], 0);
        // Known as nvidia-smi's GPU 1: `gpu` is that index, `rm_device` still RM's number.
        let second = GpuIdentity {
            index: 1,
            uuid: None,
            bus_id: "0000:41:00.0".into(),
            rm_device: 0,
        };
        let mut out = Vec::new();
        write_event(&mut out, &submit, &clock(), Some(&second), None);
        let v = parse(std::str::from_utf8(&out).unwrap());
        assert_eq!(
            (&v["gpu"], &v["rm_device"], &v["gpu_device"]["index"]),
            (&json!(1), &json!(0), &json!(1))
        );
        // AMD: `gpu` is the KFD gpu_id as it is, no `rm_device`.
        let amd = Event {
            amd: Some(crate::event::AmdDetail::default()),
            ..submit.clone()
        };
        let v = parse(&event_json(&amd, &clock()));
        assert_eq!(v["gpu"], 0);
        assert!(v.get("rm_device").is_none(), "{v}");

        for (cause, name) in [
            (DestroyCause::Free, "free"),
            (DestroyCause::ParentFree, "parent_free"),
            (DestroyCause::FdClose, "fd_close"),
            (DestroyCause::ProcessExit, "process_exit"),
            (DestroyCause::KfdRelease, "kfd_release"),
            (DestroyCause::TracerExit, "tracer_exit"),
        ] {
            let ev = Event {
                key: None,
                amd: None,
                api: None,
                origin: origin(T0),
                kind: EventKind::TaskDestroy {
                    final_params: None,
                    task: TaskId::HwTsg(1),
                    client: 1,
                    cause,
                    implicit: cause.is_implicit(),
                },
            };
            let line = event_json(&ev, &clock());
            assert!(
                line.starts_with(r#"{"event":"TASK_DESTROY","time":"#),
                "{line}"
            );
            let v = parse(&line);
            common(&v, "TASK_DESTROY", T0);
            assert_eq!(v["cause"], name);
            assert_eq!(v["implicit"], cause.is_implicit());
            assert_eq!(keys(&v).len(), 15);
        }
    }

    /// A traced process's name in the `STATS` line, final or periodic (`--interval`), is
    /// written by the terminal-safe rule: a bidi override as `\u202e`, never raw. (The periodic
    /// line used to be written without the rule.)
    #[test]
    fn stats_lines_final_or_periodic_write_names_terminal_safe() {
        let mut stats = Stats::new();
        let mut o = origin(T0);
        o.comm = "evil\u{202e}gpj.exe".into();
        stats.record(&Event {
            key: None,
            amd: None,
            api: None,
            origin: o,
            kind: EventKind::PretraceEnd {
                client: None,
                fd: None,
                cause: DestroyCause::ProcessExit,
                tsgs: None,
            },
        });
        for is_final in [true, false] {
            let line = stats_json(&stats, is_final);
            assert!(!line.contains('\u{202e}'), "{line}");
            assert!(line.contains(r#""comm":"evil\u202egpj.exe""#), "{line}");
        }
    }

    #[test]
    fn stats_line() {
        let mut stats = Stats::new();
        stats.record(&Event {
            key: None,
            amd: None,
            api: None,
            origin: origin(T0),
            kind: EventKind::Schedule {
                task: TaskId::HwTsg(1),
                client: 1,
                channels: None,
                timeslice_us: None,
                interleave: None,
                allowed: false,
                rm_status: Some(0x1f),
                errno: 0,
                via_channel: false,
            },
        });
        stats.kernel = KernelCounters {
            dropped: 1,
            read_failed: 2,
            ignored: 3,
            emitted: 4,
            fd_lookup_failed: 5,
            denied: 0,
            skipped: Some(11),
            denied_unread: Some(12),
            deny_unfollowed: Some(13),
        };
        stats.malformed = 6;
        stats.decode_errors = 7;
        stats.live_at_exit = 8;
        stats.elapsed = Some(Duration::from_millis(12_300));
        let line = stats_json(&stats, true);
        assert!(line.starts_with(r#"{"event":"STATS","#), "{line}");
        let v = parse(&line);
        assert_eq!(
            v,
            json!({
                "event": "STATS",
                "final": true,
                "duration_s": 12.3,
                "task_init": 0,
                "schedule": 1,
                "schedule_refused": 1,
                "sched_update": 0,
                "sched_update_refused": 0,
                "preempt": 0,
                "work_submit": 0,
                "task_destroy": 0,
                "task_destroy_implicit": 0,
                "kernel": {
                    "dropped": 1,
                    "read_failed": 2,
                    "ignored": 3,
                    "emitted": 4,
                    "fd_lookup_failed": 5,
                    "denied": 0,
                    "skipped": 11,
                    "denied_unread": 12,
                    "deny_unfollowed": 13
                },
                "malformed": 6,
                "decode_errors": 7,
                "live_at_exit": 8,
                "unreported": {},
                "lost_samples": null,
                "processes": [{
                    "pid": 637320,
                    "comm": "py\"th\\on3",
                    "task_init": 0,
                    "schedule": 1,
                    "schedule_refused": 1,
                    "sched_update": 0,
                    "preempt": 0,
                    "work_submit": 0,
                    "task_destroy": 0
                }],
                // The event had no key: no per-task, engine or GPU entries.
                "engines": [],
                "gpus": [],
                "runlists": [],
                "tasks": [],
                "tasks_omitted": 0,
                "diagnostics": {"emitted": 4, "ignored": 3}
            })
        );
        stats.lost_samples = Some(9);
        assert_eq!(parse(&stats_json(&stats, true))["lost_samples"], 9);
        assert_eq!(parse(&stats_json(&stats, false))["final"], false);
    }

    #[test]
    fn deny_counters_not_known_are_absent_not_zero() {
        // A recording made before the deny counters were counted: no key, not an invented 0.
        let mut stats = Stats::new();
        stats.kernel = KernelCounters {
            denied: 2,
            ..KernelCounters::default()
        };
        let v = parse(&stats_json(&stats, true));
        let kernel = v["kernel"].as_object().unwrap();
        assert_eq!(kernel["denied"], 2);
        for key in ["denied_unread", "deny_unfollowed", "skipped"] {
            assert!(!kernel.contains_key(key), "{key} in {kernel:?}");
        }
        // Known: there, also when 0.
        stats.kernel.denied_unread = Some(0);
        stats.kernel.deny_unfollowed = Some(0);
        let v = parse(&stats_json(&stats, true));
        assert_eq!(v["kernel"]["denied_unread"], 0);
        assert_eq!(v["kernel"]["deny_unfollowed"], 0);
    }

    #[test]
    fn sched_update_identity_and_final_fields() {
        let key = TaskKey {
            pid: 427,
            client: Some(0xc1d0_001c),
            object: 0x5c00_0015,
            generation: 1,
        };
        let ev = Event {
            key: Some(key),
            amd: None,
            api: None,
            origin: origin(T0),
            kind: EventKind::SchedUpdate {
                // Named by its hardware id: `handle` still gives the RM handle.
                task: TaskId::HwTsg(3),
                client: 0xc1d0_001c,
                change: SchedChange::Timeslice {
                    old_us: Some(1024),
                    old_source: Some(ValueSource::DriverDefault),
                    new_us: 2048,
                },
                allowed: false,
                rm_status: Some(0x1f),
                errno: 0,
                via_channel: false,
            },
        };
        let v = parse(&event_json(&ev, &clock()));
        common(&v, "SCHED_UPDATE", T0);
        assert_eq!(v["key"], "427:0xc1d0001c:0x5c000015");
        assert_eq!(v["tsg"], "3");
        assert_eq!(v["handle"], "0x5c000015");
        assert_eq!(v["client_hex"], "0xc1d0001c");
        assert_eq!(
            v["change"],
            json!({"what": "timeslice", "old_us": 1024, "old_source": "driver_default",
                "new_us": 2048})
        );
        assert_eq!(
            (v["allowed"].clone(), v["rm_status"].clone()),
            (false.into(), 0x1f.into())
        );
        // A later generation of the same handle gets `#2`.
        let ev = Event {
            key: Some(TaskKey {
                generation: 2,
                ..key
            }),
            amd: None,
            api: None,
            origin: origin(T0),
            kind: EventKind::TaskDestroy {
                task: TaskId::RmHandle(0x5c00_0015),
                client: 0xc1d0_001c,
                cause: DestroyCause::Free,
                implicit: false,
                final_params: Some(FinalParams {
                    sched: SchedParams {
                        timeslice_us: Some(2048),
                        timeslice_source: ValueSource::Observed,
                        interleave: Some(Interleave::High),
                        interleave_source: ValueSource::DriverHook,
                        runlist: Some(13),
                        run_state: RunState::Disabled,
                    },
                    channels: 8,
                }),
            },
        };
        let v = parse(&event_json(&ev, &clock()));
        assert_eq!(v["key"], "427:0xc1d0001c:0x5c000015#2");
        assert_eq!(v["tsg"], "0x5c000015");
        assert_eq!(
            v["final"],
            json!({"timeslice_us": 2048, "timeslice_source": "observed", "interleave": "HIGH",
                "interleave_source": "driver_hook", "channels": 8, "runlist": 13,
                "run_state": "disabled"})
        );
    }

    /// `gpu-trace --api`'s JSON lines: the driver events' common fields, then the call site
    /// and the record's own fields in the documented order; names terminal-safe, exact once
    /// parsed.
    #[test]
    fn api_lines_have_the_common_fields_then_the_call() {
        use crate::api::events::samples;
        use crate::api::names::ApiEvent;
        let lib = "/tmp/\u{1b}[2Jlib.so";
        let call = ApiEvent::Call(samples::call("python3", lib));
        let rec = ApiEvent::Recursion(samples::recursion("python3"));
        let line = |event: &ApiEvent| {
            let origin = samples::origin_of(event, 1_000, 3);
            let ev = ApiEnriched {
                event,
                origin: &origin,
                process: "python3",
                cgroup: None,
            };
            let mut out = Vec::new();
            write_api(&mut out, &ev, &clock()).then(|| String::from_utf8(out).unwrap())
        };
        let text = line(&call).unwrap();
        assert!(!text.contains('\u{1b}'), "{text}");
        let v = parse(&text);
        let order = [
            "event",
            "time",
            "ts_ns",
            "cpu",
            "pid",
            "tid",
            "comm",
            "symbol",
            "library",
            "duration_ns",
            "ret",
            "depth",
            "caller",
        ];
        assert_eq!(keys(&v).len(), order.len(), "{text}");
        let at: Vec<usize> = order
            .iter()
            .map(|k| text.find(&format!("\"{k}\":")).unwrap())
            .collect();
        assert!(at.windows(2).all(|w| w[0] < w[1]), "{text}");
        assert_eq!(
            (v["event"] == "API_CALL", v["ts_ns"] == 1_000),
            (true, true)
        );
        assert_eq!(
            (v["pid"] == 4242, v["tid"] == 4243, v["cpu"] == 3),
            (true, true, true)
        );
        assert_eq!(v["library"], lib);
        assert_eq!(
            v["caller"],
            serde_json::json!({"symbol": "cudaMalloc", "library": "libcudart.so.12"})
        );
        let v = parse(&line(&rec).unwrap());
        assert_eq!(v["why"], "re-entered");
        assert_eq!(
            v["chain"],
            serde_json::json!([{"symbol": "cuInit", "library": "shim.so"}])
        );
        let stats = ApiEvent::Stats(crate::api::stats::CallStats {
            pid: 1,
            library: String::new(),
            preload: false,
            symbol: String::new(),
            calls: 0,
            errors: 0,
            total_ns: 0,
            hist: vec![],
        });
        assert_eq!(line(&stats), None);
    }

    /// `API_STUCK` as JSON: `cpu` null (made in userspace, on no CPU), the /proc fields and the
    /// stack; an `API_CALL` whose run knows the `LD_PRELOAD` mark carries `preload`.
    #[test]
    fn a_stuck_call_has_a_null_cpu_and_its_stack() {
        use crate::api::events::{StuckEvent, samples};
        use crate::api::names::ApiEvent;
        let render = |event: &ApiEvent, cpu: u32| {
            let mut origin = samples::origin_of(event, 1_000, 3);
            origin.cpu = cpu;
            let ev = ApiEnriched {
                event,
                origin: &origin,
                process: "c",
                cgroup: None,
            };
            let mut out = Vec::new();
            assert!(write_api(&mut out, &ev, &clock()));
            parse(std::str::from_utf8(&out).unwrap())
        };
        let v = render(
            &ApiEvent::Stuck(StuckEvent {
                pid: 7,
                tid: 8,
                comm: "c".into(),
                site: samples::site("cuInit", "libcuda.so.1"),
                open_ns: 2_000_000_000,
                state: "D".into(),
                wchan: "w".into(),
                syscall: "16".into(),
                stack: vec!["a+0x1".into(), "b+0x2".into()],
            }),
            Origin::NO_CPU,
        );
        assert_eq!(v["event"], "API_STUCK");
        assert!(v["cpu"].is_null(), "{v}");
        assert_eq!(
            (v["tid"] == 8, v["open_ns"] == 2_000_000_000u64),
            (true, true)
        );
        assert_eq!(v["stack"], serde_json::json!(["a+0x1", "b+0x2"]));
        let mut call = samples::call("c", "/opt/shim.so");
        call.preload = Some(true);
        let v = render(&ApiEvent::Call(call), 3);
        assert_eq!((v["preload"] == true, v["cpu"] == 3), (true, true));
    }
}
