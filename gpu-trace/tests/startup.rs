//! Start-up (issue 26, item 4): a run that fails to start leaves yesterday's files as they were,
//! and a killed run leaves no temporary file.
//!
//! - A busy metrics port (exit 1), `--cgroup` naming nothing (exit 2) and `--deny-pid` where the
//!   BPF LSM cannot run (exit 3) all stop the run after its outputs were opened: the existing
//!   `-o`, `--record` and `--perfetto` files keep their bytes, an `-o` file that did not exist
//!   is not left behind, and no `.partial` file remains.
//! - A run killed with SIGKILL while writing a Perfetto timeline leaves no
//!   `.NAME.gpu-trace-PID.partial` next to it (the timeline has no name until it is complete).
//!
//! Kernel tests need root; without it they print `SKIPPED: <why>`.

mod common;
mod rel_support;

use std::{
    path::{Path, PathBuf},
    process::Command,
    sync::{Mutex, MutexGuard},
    time::Duration,
};

use rel_support::*;

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// A fresh directory of its own for each case, so that leftovers are the case's own.
fn case_dir(name: &str) -> PathBuf {
    let d = common::scratch().join(name);
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The temporary files in `dir`.
fn partials(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".partial"))
        .collect()
}

/// Whether this kernel runs BPF LSM programs (then `--deny-pid` starts, and the exit-3 case
/// cannot be provoked), decided independently of gpu-trace as tests/cli_promises.rs does: the
/// kernel's list of active LSMs and aya's own feature probe.
fn bpf_lsm_active() -> bool {
    let listed = std::fs::read_to_string("/sys/kernel/security/lsm")
        .is_ok_and(|l| l.trim().split(',').any(|m| m == "bpf"));
    listed
        && matches!(
            aya::sys::is_program_supported(aya::programs::ProgramType::Lsm(
                aya::programs::LsmAttachType::Mac
            )),
            Ok(true)
        )
}

/// Runs gpu-trace with `extra` arguments and existing `-o`, `--record` and `--perfetto` files
/// (and, in a second run, an `-o` file that does not exist yet); asserts the exit code `code`
/// and that no file changed.
fn assert_failed_start_keeps_files(case: &str, extra: &[&str], code: i32) {
    let mut base = vec!["--watch-device", WATCHED];
    base.extend_from_slice(extra);
    assert_failed_start_keeps_files_with(case, &base, code)
}

/// [`assert_failed_start_keeps_files`] without the `--watch-device` it adds.
fn assert_failed_start_keeps_files_with(case: &str, extra: &[&str], code: i32) {
    let d = case_dir(case);
    let files = [
        (
            "-o",
            d.join("yesterday.txt"),
            b"yesterday's events\n".to_vec(),
        ),
        (
            "--record",
            d.join("yesterday.gtrace"),
            b"GTRC yesterday".to_vec(),
        ),
        (
            "--perfetto",
            d.join("yesterday.json"),
            b"{\"old\":1}".to_vec(),
        ),
    ];
    let mut args: Vec<String> = ["--duration", "5"].iter().map(|s| s.to_string()).collect();
    args.extend(extra.iter().map(|s| s.to_string()));
    for (flag, path, bytes) in &files {
        std::fs::write(path, bytes).unwrap();
        args.push(flag.to_string());
        args.push(path.to_str().unwrap().to_string());
    }
    let out = Command::new(gpu_trace_bin())
        .args(&args)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(code), "{case}: {stderr}");
    for (flag, path, bytes) in &files {
        assert_eq!(
            &std::fs::read(path).unwrap(),
            bytes,
            "{case}: the {flag} file {} lost its bytes to a run that never started: {stderr}",
            path.display()
        );
    }
    assert_eq!(partials(&d), Vec::<String>::new(), "{case}");
    // An output that did not exist is not left behind, empty.
    let fresh = d.join("fresh.txt");
    let out = Command::new(gpu_trace_bin())
        .args(&args[..args.len() - 6])
        .args(["-o", fresh.to_str().unwrap()])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(code), "{case}: {stderr}");
    assert!(!fresh.exists(), "{case}: an empty -o file was left behind");
}

#[test]
fn a_busy_metrics_port_keeps_yesterdays_files() {
    let _serial = serial();
    if skip_unless_root("a_busy_metrics_port_keeps_yesterdays_files") {
        return;
    }
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = busy.local_addr().unwrap().to_string();
    assert_failed_start_keeps_files("busy_port", &["--metrics", &addr], 1);
}

#[test]
fn a_cgroup_that_does_not_exist_keeps_yesterdays_files() {
    let _serial = serial();
    if skip_unless_root("a_cgroup_that_does_not_exist_keeps_yesterdays_files") {
        return;
    }
    assert_failed_start_keeps_files("no_cgroup", &["--cgroup", "/gpu-trace-test-nonexist"], 2);
}

#[test]
fn a_refused_deny_program_keeps_yesterdays_files() {
    let _serial = serial();
    let test = "a_refused_deny_program_keeps_yesterdays_files";
    if skip_unless_root(test) {
        return;
    }
    if bpf_lsm_active() {
        common::skipped(
            test,
            "this kernel runs BPF LSM programs: --deny-pid starts here, so it cannot stand for \
             a program the kernel refuses (the busy-port and --cgroup cases still run)",
        );
        return;
    }
    let me = std::process::id().to_string();
    assert_failed_start_keeps_files("lsm_refused", &["--deny-pid", &me], 3);
}

#[test]
fn amd_without_kfd_keeps_yesterdays_files() {
    let _serial = serial();
    let test = "amd_without_kfd_keeps_yesterdays_files";
    if skip_unless_root(test) {
        return;
    }
    if Path::new("/dev/kfd").exists() {
        common::skipped(test, "/dev/kfd exists: an AMD run starts here");
        return;
    }
    // Without KFD's device number (and no --watch-device standing in) the run stops, exit 3.
    assert_failed_start_keeps_files_with("no_kfd", &["--vendor", "amd"], 3);
}

#[test]
fn a_killed_run_leaves_no_partial_timeline() {
    let _serial = serial();
    if skip_unless_root("a_killed_run_leaves_no_partial_timeline") {
        return;
    }
    let d = case_dir("killed");
    let timeline = d.join("killed.json");
    std::fs::write(&timeline, b"old").unwrap();
    let traced = Traced::start(&[
        "--watch-device",
        WATCHED,
        "-o",
        "/dev/null",
        "--perfetto",
        timeline.to_str().unwrap(),
    ])
    .expect("gpu-trace starts");
    traced.signal(libc::SIGKILL);
    let f = traced.wait(Duration::from_secs(10));
    assert_eq!(f.status.code(), None, "killed: {f:?}");
    assert_eq!(partials(&d), Vec::<String>::new(), "a SIGKILLed run");
    assert_eq!(std::fs::read(&timeline).unwrap(), b"old");
}

// ---------------------------------------------------------------------------------------------
// The start-up inventory with exactly the DaemonSet's capabilities (CAP_BPF + CAP_PERFMON).

/// A shell holding `dev` open on fd 7 until its stdin closes, run through `pre` (e.g. setpriv
/// to another user); returns once it holds the device.
fn holder(pre: &[&str], dev: &str) -> std::process::Child {
    use std::io::BufRead as _;
    let script = format!("exec 7<{dev}; echo ready; read a");
    let mut cmd = match pre.split_first() {
        Some((first, rest)) => {
            let mut c = Command::new(first);
            c.args(rest).arg("--");
            c
        }
        None => Command::new("env"),
    };
    let mut child = cmd
        .args(["bash", "-c", &script])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("spawn the holder");
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "ready", "the holder opened {dev}");
    child
}

fn setpriv() -> Option<&'static str> {
    ["/usr/bin/setpriv", "/bin/setpriv"]
        .into_iter()
        .find(|p| Path::new(p).exists())
}

/// The DaemonSet's capabilities for a root process: every other one out of the bounding set.
const DAEMONSET_CAPS: [&str; 2] = ["--bounding-set=-all,+bpf,+perfmon", "--inh-caps=-all"];

/// Child body of `the_inventory_with_the_daemonsets_capabilities_says_what_it_missed`: walks
/// the proc tree named by `GPU_TRACE_TEST_PROC` and prints `WALK processes denied`, then the
/// inventory's text lines.
#[test]
#[ignore = "child process body for the inventory test"]
fn inventory_walk_child() {
    use std::os::unix::fs::MetadataExt as _;
    let Ok(root) = std::env::var("GPU_TRACE_TEST_PROC") else {
        return;
    };
    let opts = gpu_trace::probe::inventory::WalkOptions {
        nvidia: true,
        watched_rdev: Some(std::fs::metadata(WATCHED).unwrap().rdev()),
        ..Default::default()
    };
    let inv = gpu_trace::probe::inventory::walk(Path::new(&root), &opts);
    println!("WALK {} {}", inv.processes.len(), inv.denied);
    for line in gpu_trace_core::inventory::render_text(&inv) {
        println!("LINE {line}");
    }
}

#[test]
fn the_inventory_with_the_daemonsets_capabilities_says_what_it_missed() {
    let _serial = serial();
    let test = "the_inventory_with_the_daemonsets_capabilities_says_what_it_missed";
    if skip_unless_root(test) {
        return;
    }
    let Some(setpriv) = setpriv() else {
        common::skipped(test, "setpriv (util-linux) is not installed");
        return;
    };
    // Two processes hold the watched device: one of user nobody, one of root with every
    // capability (this test's child). With CAP_BPF + CAP_PERFMON only, root may list the
    // second one's /proc/PID/fd but not read its links; the first one's not even list.
    let mut nobody = holder(
        &[
            setpriv,
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--inh-caps=-all",
        ],
        WATCHED,
    );
    let mut rooted = holder(&[], WATCHED);
    // A proc tree of exactly these two processes: links to their real /proc entries, so the
    // kernel's own checks answer.
    let d = case_dir("inventory_proc");
    for c in [&nobody, &rooted] {
        std::os::unix::fs::symlink(format!("/proc/{}", c.id()), d.join(c.id().to_string()))
            .unwrap();
    }
    let walk = |pre: &[&str]| {
        let mut cmd = if pre.is_empty() {
            Command::new(std::env::current_exe().unwrap())
        } else {
            let mut c = Command::new(setpriv);
            c.args(pre).arg("--").arg(std::env::current_exe().unwrap());
            c
        };
        let out = cmd
            .args([
                "--ignored",
                "--exact",
                "inventory_walk_child",
                "--nocapture",
                "--test-threads",
                "1",
            ])
            .env("GPU_TRACE_TEST_PROC", &d)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let field = |out: &str| -> Vec<u32> {
        out.lines()
            .find_map(|l| l.split_once("WALK ").map(|x| x.1.to_string()))
            .unwrap_or_else(|| panic!("no WALK line: {out}"))
            .split(' ')
            .map(|n| n.parse().unwrap())
            .collect()
    };
    // With every capability both are found: the setup is what it claims.
    let full = walk(&[]);
    assert_eq!(field(&full), vec![2, 0], "{full}");
    // With the DaemonSet's: both are missed, both are counted, and it says what was lacking.
    let limited = walk(&DAEMONSET_CAPS);
    assert_eq!(
        field(&limited),
        vec![0, 2],
        "two processes missed, two refusals counted: {limited}"
    );
    assert!(
        limited.contains("of 2 processes could not be read")
            && limited.contains("runs as root without CAP_SYS_PTRACE")
            && !limited.contains("run as root"),
        "says exactly what was missed and why: {limited}"
    );
    // The binary says the same at start-up.
    let out = Command::new(setpriv)
        .args(DAEMONSET_CAPS)
        .arg("--")
        .arg(gpu_trace_bin())
        .args([
            "--watch-device",
            WATCHED,
            "--duration",
            "1",
            "-o",
            "/dev/null",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    for c in [&mut nobody, &mut rooted] {
        drop(c.stdin.take());
        let _ = c.wait();
    }
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains("could not be read")
            && stderr.contains("without CAP_SYS_PTRACE")
            && !stderr.contains("run as root"),
        "{stderr}"
    );
    for c in [&nobody, &rooted] {
        assert!(
            !stderr.contains(&format!("PID {} ", c.id())),
            "not listed: {stderr}"
        );
    }
}
