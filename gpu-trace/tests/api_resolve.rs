//! `gpu-trace api --resolve` on Debian's real HIP runtime (`libamdhip64.so.5`, installed by
//! scripts/setup.sh): a C client (tests/api/client.c) calls hipInit and hipMalloc under three
//! shims this test builds with `cc` and preloads. The expected answers come from how the test
//! built the processes and from the dynamic linker itself (`LD_TRACE_LOADED_OBJECTS=1` lists
//! the link map in the order ld.so binds), never from gpu-trace's own output.
//!
//! The interposer flags (issue 39): tests/api/handout_shim.c built with `-fvisibility=hidden`,
//! exporting only `dlsym`, its hidden hooks renamed after the table symbols they stand in for
//! (`-Dhook_launch=hooked_cuLaunchKernel`, …), preloaded into the same client. The expected
//! answers come from the built files themselves (`nm -D`, `nm`, `readelf -S`): the shim is
//! flagged `dlsym_override` and its hidden hooks are listed; the same shim stripped keeps the
//! flag and lists none; libc, which defines `dlsym` for real, is never flagged.
//!
//! Without the HIP runtime, a C compiler (or binutils, for the interposer flags) the tests print
//! `SKIPPED: <why>` and return.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

mod api_support;
mod common;
use api_support::{cc, toolchain};
use common::skipped;

/// The client, the three shims and the HIP runtime's path; `None` (after SKIPPED) where they
/// cannot be built.
struct Built {
    _dir: tempfile::TempDir,
    client: PathBuf,
    shims: [PathBuf; 3],
    hip: PathBuf,
}

fn build(test: &str) -> Option<Built> {
    let (hip, dir, root) = toolchain(test)?;
    let client = cc(&root, "client.c", "client", &["-l:libamdhip64.so.5"]);
    let shims = ["shim_next", "shim_recursive", "shim_stub"].map(|s| {
        cc(
            &root,
            &format!("{s}.c"),
            &format!("{s}.so"),
            &["-shared", "-fPIC"],
        )
    });
    Some(Built {
        _dir: dir,
        client,
        shims,
        hip,
    })
}

/// Kills the process when the test ends, passed or not.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The client under `LD_PRELOAD=shim`, once it has made its calls.
fn client_under(b: &Built, shim: &Path) -> Reaped {
    let mut child = Command::new(&b.client)
        .env("LD_PRELOAD", shim)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    api_support::wait_ready(&mut child);
    Reaped(child)
}

fn gpu_trace(args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_gpu-trace"))
        .args(args)
        .output()
        .unwrap();
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (out.status.code(), text(&out.stdout), text(&out.stderr))
}

fn resolve_json(pid: u32) -> Value {
    let (code, out, err) = gpu_trace(&[
        "api",
        "--resolve",
        "--format",
        "json",
        "--pid",
        &pid.to_string(),
    ]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(out.lines().count(), 1, "one object per process: {out}");
    serde_json::from_str(&out).unwrap()
}

fn symbol<'a>(v: &'a Value, name: &str) -> &'a Value {
    v["symbols"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["symbol"] == name)
        .unwrap_or_else(|| panic!("no {name} in {v}"))
}

fn dlsym_warned(v: &Value, lib: &Path) -> bool {
    v["warnings"].as_array().unwrap().iter().any(|w| {
        w["kind"] == "dlsym_interposer"
            && w["library"] == lib.to_str().unwrap()
            && w["symbols"]
                .as_array()
                .unwrap()
                .iter()
                .any(|s| s == "hipMalloc")
    })
}

/// The global scope in ld.so's own order: `LD_TRACE_LOADED_OBJECTS=1` prints the link map
/// (without running the program); the paths as /proc/PID/maps shows them (canonical).
fn ld_so_order(client: &Path, shim: &Path) -> Vec<PathBuf> {
    let out = Command::new(client)
        .env("LD_PRELOAD", shim)
        .env("LD_TRACE_LOADED_OBJECTS", "1")
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let l = l.trim();
            let path = l.split_once(" => ").map_or(l, |(_, p)| p);
            let path = path.rsplit_once(" (0x").map_or(path, |(p, _)| p);
            path.starts_with('/')
                .then(|| std::fs::canonicalize(path).unwrap())
        })
        .collect()
}

#[test]
fn a_preloaded_shim_wins_hipmalloc_and_the_real_runtime_serves_the_rest() {
    let test = "a_preloaded_shim_wins_hipmalloc_and_the_real_runtime_serves_the_rest";
    let Some(b) = build(test) else { return };
    let [next, recursive, stub] = &b.shims;
    // A stripped shim keeps its dynamic symbol table: it still wins.
    let stripped = next.with_file_name("shim_next.stripped.so");
    let status = Command::new("strip")
        .arg("--strip-all")
        .arg(next)
        .arg("-o")
        .arg(&stripped)
        .status();
    let mut shims = vec![(next, true), (recursive, true), (stub, false)];
    match status {
        Ok(s) if s.success() => shims.push((&stripped, true)),
        _ => skipped(test, "no `strip`: the stripped shim's case is left out"),
    }
    for (shim, imports_dlsym) in shims {
        let client = client_under(&b, shim);
        let v = resolve_json(client.0.id());
        let m = symbol(&v, "hipMalloc");
        assert_eq!(m["winner"], shim.to_str().unwrap(), "{shim:?}: {m}");
        assert_eq!(m["next"][0], b.hip.to_str().unwrap(), "{shim:?}: {m}");
        assert_eq!(m["real"], b.hip.to_str().unwrap());
        let i = symbol(&v, "hipInit");
        assert_eq!(i["winner"], b.hip.to_str().unwrap(), "{i}");
        assert_eq!(i["next"], Value::Array(vec![]), "{i}");
        assert_eq!(
            dlsym_warned(&v, shim),
            imports_dlsym,
            "{shim:?}: the dlsym warning is due exactly where the shim imports dlsym: {}",
            v["warnings"]
        );
        // The binding order is ld.so's: executable, the preload, DT_NEEDED breadth-first.
        let libs = v["libraries"].as_array().unwrap();
        assert_eq!(libs[0]["path"], b.client.to_str().unwrap());
        assert_eq!(libs[0]["origin"], "executable");
        assert_eq!(libs[1]["origin"], "preload");
        let ours: Vec<PathBuf> = libs[1..]
            .iter()
            .filter(|l| l["origin"] != "dlopen")
            .map(|l| PathBuf::from(l["path"].as_str().unwrap()))
            .collect();
        assert_eq!(ours, ld_so_order(&b.client, shim), "{shim:?}");
        // The text names the same winner.
        let (code, text, _) = gpu_trace(&["api", "--resolve", "--pid", &client.0.id().to_string()]);
        assert_eq!(code, Some(0));
        let line = text
            .lines()
            .find(|l| l.trim_start().starts_with("hipMalloc "))
            .unwrap();
        assert!(
            line.contains(&format!(
                "{} [LD_PRELOAD]; next: {}",
                shim.display(),
                b.hip.display()
            )),
            "{line}"
        );
    }
}

#[test]
fn a_shell_with_the_shim_preloaded_is_listed_as_a_leak() {
    let test = "a_shell_with_the_shim_preloaded_is_listed_as_a_leak";
    let Some(b) = build(test) else { return };
    let shim = &b.shims[0];
    let shell = |preload: bool| {
        let mut c = Command::new("bash");
        c.args(["-c", "sleep 30; true"]);
        if preload {
            c.env("LD_PRELOAD", shim);
        }
        Reaped(c.spawn().unwrap())
    };
    let leaky = shell(true);
    let clean = shell(false);
    // bash has started (its maps hold the shim) once the loader is done with it.
    let deadline = Instant::now() + Duration::from_secs(5);
    while !std::fs::read_to_string(format!("/proc/{}/maps", leaky.0.id()))
        .is_ok_and(|m| m.contains(shim.to_str().unwrap()))
    {
        assert!(Instant::now() < deadline, "bash never mapped the shim");
        std::thread::sleep(Duration::from_millis(20));
    }
    let (code, out, err) = gpu_trace(&["api", "--resolve", "--format", "json"]);
    assert_eq!(code, Some(0), "{err}");
    let objects: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let of = |pid: u32| objects.iter().find(|o| o["pid"] == pid);
    let leak = of(leaky.0.id()).expect("the preloaded bash maps a library defining hipMalloc");
    assert_eq!(leak["comm"], "bash");
    assert_eq!(leak["gpu_open"], false);
    assert!(
        leak["warnings"]
            .as_array()
            .unwrap()
            .iter()
            .any(|w| { w["kind"] == "preload_leak" && w["library"] == shim.to_str().unwrap() }),
        "{leak}"
    );
    assert!(
        of(clean.0.id()).is_none(),
        "a bash without the shim maps no GPU API library"
    );
    let (_, text, _) = gpu_trace(&["api", "--resolve"]);
    let summary = text
        .split("LD_PRELOAD leak: ")
        .nth(1)
        .expect("a leak summary");
    assert!(
        summary.contains(&format!("PID {} (bash): {}", leaky.0.id(), shim.display())),
        "{summary}"
    );
    assert!(!summary.contains(&format!("PID {} ", clean.0.id())));
}

#[test]
fn api_without_resolve_and_bad_targets_say_what_to_do() {
    // Tracing without a target: a usage error that names the choices.
    let (code, _, err) = gpu_trace(&["api"]);
    assert_eq!(code, Some(2));
    assert!(
        err.contains("give --pid, --comm, --cgroup, --container or `-- CMD`"),
        "{err}"
    );
    let (code, _, err) = gpu_trace(&["api", "--resolve", "--probe", "nocolon"]);
    assert_eq!(code, Some(2));
    assert!(err.contains("is not LIB:SYMBOL"), "{err}");
    // A PID that no process has: the kernel's pid_max is at most 2^22.
    let (code, _, err) = gpu_trace(&["api", "--resolve", "--pid", "4194305"]);
    assert_eq!(code, Some(1));
    assert!(err.contains("PID 4194305: no such process"), "{err}");
    // Not root: another user's process cannot be read, and the message says what to do.
    // SAFETY: no arguments.
    if unsafe { libc::geteuid() } == 0 {
        use std::os::unix::process::CommandExt as _;
        let out = Command::new(env!("CARGO_BIN_EXE_gpu-trace"))
            .args(["api", "--resolve", "--pid", &std::process::id().to_string()])
            .uid(65534)
            .gid(65534)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert!(
            err.contains("permission denied") && err.contains("run as root"),
            "{err}"
        );
    } else {
        skipped(
            "api_without_resolve_and_bad_targets_say_what_to_do",
            "not root: the unprivileged case is left out",
        );
    }
    // This test's own process maps no GPU API library: said, not an empty answer.
    let (code, out, _) = gpu_trace(&["api", "--resolve", "--pid", &std::process::id().to_string()]);
    assert_eq!(code, Some(0));
    assert!(out.contains("no GPU API library mapped"), "{out}");
}

/// Shims that bear the real library's name are resolved by the file they are, not by that
/// name (issue 39): (1) `shim_next.c` built as `…/byname/libamdhip64.so.5` and preloaded by
/// that path — the real runtime is mapped too, lower, and was taken for the preload; (2)
/// `shim_soname.c` with the soname `libamdhip64.so.5`, which satisfies the client's
/// `DT_NEEDED` itself and `dlopen`s the real runtime by path — the real one was put in the
/// global scope as needed. The oracle is ld.so's own link map (`LD_TRACE_LOADED_OBJECTS=1`).
#[test]
fn a_shim_with_the_real_librarys_name_is_resolved_by_the_file_it_is() {
    let test = "a_shim_with_the_real_librarys_name_is_resolved_by_the_file_it_is";
    let Some(b) = build(test) else { return };
    let root = b.client.parent().unwrap();
    let hip_name = b.hip.file_name().unwrap().to_str().unwrap().to_string();
    let mut cases = Vec::new();
    for (dir, source, extra) in [
        ("byname", "shim_next.c", vec!["-shared", "-fPIC"]),
        (
            "soname",
            "shim_soname.c",
            vec!["-shared", "-fPIC", "-Wl,-soname,libamdhip64.so.5"],
        ),
    ] {
        std::fs::create_dir_all(root.join(dir)).unwrap();
        let out = format!("{dir}/libamdhip64.so.5");
        cases.push((dir, cc(root, source, &out, &extra)));
    }
    for (case, shim) in &cases {
        let mut child = Command::new(&b.client)
            .env("LD_PRELOAD", shim)
            .env("GT_REAL_HIP", &b.hip)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        api_support::wait_ready(&mut child);
        let client = Reaped(child);
        let v = resolve_json(client.0.id());
        let libs = v["libraries"].as_array().unwrap();
        let origin_of = |p: &Path| {
            libs.iter()
                .find(|l| l["path"] == p.to_str().unwrap())
                .map(|l| l["origin"].as_str().unwrap().to_string())
        };
        assert_eq!(origin_of(shim).as_deref(), Some("preload"), "{case}: {v}");
        let m = symbol(&v, "hipMalloc");
        assert_eq!(m["winner"], shim.to_str().unwrap(), "{case}: {m}");
        let ours: Vec<PathBuf> = libs[1..]
            .iter()
            .filter(|l| l["origin"] != "dlopen")
            .map(|l| PathBuf::from(l["path"].as_str().unwrap()))
            .collect();
        assert_eq!(ours, ld_so_order(&b.client, shim), "{case}: {v}");
        let real = origin_of(&b.hip);
        if *case == "soname" {
            assert_eq!(real.as_deref(), Some("dlopen"), "{case}: {hip_name} {v}");
        } else {
            assert_eq!(real.as_deref(), Some("needed"), "{case}: {hip_name} {v}");
        }
        assert!(
            v["preload_unmapped"].as_array().unwrap().is_empty(),
            "{case}: {v}"
        );
    }
}

/// The table symbols the shim's hidden hooks are named after, and the macro that renames each
/// (handout_shim.c's own names hold none).
const RENAMES: [(&str, &str); 3] = [
    ("hook_launch", "hooked_cuLaunchKernel"),
    ("hook_alloc", "hook_cuMemAlloc_v2"),
    ("hook_getproc", "my_cuGetProcAddress_v2"),
];
const SYMBOLS: [&str; 3] = ["cuLaunchKernel", "cuMemAlloc_v2", "cuGetProcAddress_v2"];

fn tool(args: &[&str], file: &Path) -> Option<String> {
    let out = Command::new(args[0])
        .args(&args[1..])
        .arg(file)
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `nm`'s defined symbols of `file` (`-D`: the dynamic ones): (address, type letter, name).
fn nm(file: &Path, dynamic: bool) -> Vec<(u64, char, String)> {
    let args: &[&str] = if dynamic {
        &["nm", "-D", "--defined-only"]
    } else {
        &["nm", "--defined-only"]
    };
    tool(args, file)
        .expect("nm")
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let addr = u64::from_str_radix(f.next()?, 16).ok()?;
            let kind = f.next()?.chars().next()?;
            Some((addr, kind, f.next()?.to_string()))
        })
        .collect()
}

/// The file offset of address `addr` of `file`, by its section headers (`readelf -SW`).
fn file_offset(file: &Path, addr: u64) -> u64 {
    let text = tool(&["readelf", "-SW"], file).expect("readelf");
    for line in text.lines() {
        // "  [14] .text  PROGBITS  0000000000001040 001040 000123 00  AX  0   0 16"
        let Some((_, rest)) = line.split_once(']') else {
            continue;
        };
        let f: Vec<&str> = rest.split_whitespace().collect();
        let (Some(a), Some(o), Some(s)) = (f.get(2), f.get(3), f.get(4)) else {
            continue;
        };
        let hex = |s: &str| u64::from_str_radix(s, 16).ok();
        if let (Some(a), Some(o), Some(s)) = (hex(a), hex(o), hex(s))
            && f[1] != "NOBITS"
            && (a..a + s).contains(&addr)
        {
            return addr - a + o;
        }
    }
    panic!("no section of {} holds {addr:#x}", file.display());
}

/// The hidden hooks `nm` shows in `shim`: its local functions (type `t`) whose names hold one
/// of [`SYMBOLS`], as (symbol, function, file offset).
fn hooks_by_nm(shim: &Path) -> BTreeSet<(String, String, u64)> {
    nm(shim, false)
        .into_iter()
        .filter(|(_, kind, _)| *kind == 't')
        .filter_map(|(addr, _, name)| {
            let symbol = SYMBOLS
                .iter()
                .filter(|s| name.contains(*s))
                .max_by_key(|s| s.len())?;
            Some((symbol.to_string(), name, file_offset(shim, addr)))
        })
        .collect()
}

/// `--resolve`'s JSON object and text of `pid`.
fn resolve(pid: u32) -> (Value, String) {
    let (code, text, err) = gpu_trace(&["api", "--resolve", "--pid", &pid.to_string()]);
    assert_eq!(code, Some(0), "{err}");
    (resolve_json(pid), text)
}

fn library<'a>(v: &'a Value, path: &Path) -> &'a Value {
    v["libraries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["path"] == path.to_str().unwrap())
        .unwrap_or_else(|| panic!("no {} in {v}", path.display()))
}

/// The hooks a library object lists, as (symbol, function, offset).
fn listed(lib: &Value) -> BTreeSet<(String, String, u64)> {
    lib["probable_hidden_hooks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| {
            (
                h["symbol"].as_str().unwrap().to_string(),
                h["function"].as_str().unwrap().to_string(),
                h["offset"].as_u64().unwrap(),
            )
        })
        .collect()
}

/// libc's mapped file in a report, and that it defines `dlsym` (`nm -D`): a real provider.
fn libc_of(v: &Value) -> PathBuf {
    let libc = v["libraries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| PathBuf::from(l["path"].as_str().unwrap()))
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("libc.so."))
        })
        .unwrap_or_else(|| panic!("no libc in {v}"));
    assert!(
        nm(&libc, true)
            .iter()
            .any(|(_, k, n)| *k == 'T' && (n == "dlsym" || n.starts_with("dlsym@"))),
        "{} defines dlsym",
        libc.display()
    );
    libc
}

#[test]
fn a_hidden_shim_exporting_dlsym_is_flagged_with_its_hidden_hooks() {
    let test = "a_hidden_shim_exporting_dlsym_is_flagged_with_its_hidden_hooks";
    let Some(b) = build(test) else { return };
    let root = b.client.parent().unwrap();
    for t in ["nm", "strip", "readelf"] {
        if Command::new(t).arg("--version").output().is_err() {
            skipped(test, format!("no `{t}` (binutils)"));
            return;
        }
    }
    let renames: Vec<String> = RENAMES.iter().map(|(a, b)| format!("-D{a}={b}")).collect();
    let mut flags = vec!["-shared", "-fPIC", "-fvisibility=hidden"];
    flags.extend(renames.iter().map(String::as_str));
    let shim = cc(root, "handout_shim.c", "libhooks.so", &flags);
    let stripped = root.join("libhooks.stripped.so");
    let status = Command::new("strip")
        .arg("--strip-all")
        .arg(&shim)
        .arg("-o")
        .arg(&stripped)
        .status()
        .unwrap();
    assert!(status.success());

    // What the files are: the shim exports dlsym and no table symbol; the stripped copy too,
    // without local symbols.
    for s in [&shim, &stripped] {
        let exports: Vec<String> = nm(s, true)
            .into_iter()
            .filter(|(_, k, _)| *k == 'T')
            .map(|(_, _, n)| n)
            .collect();
        assert_eq!(exports, ["dlsym"], "{}", s.display());
    }
    let hooks = hooks_by_nm(&shim);
    assert_eq!(
        hooks.iter().map(|h| h.0.as_str()).collect::<BTreeSet<_>>(),
        SYMBOLS.into_iter().collect(),
        "nm shows a hidden hook per renamed function: {hooks:?}"
    );
    assert!(tool(&["nm"], &stripped).is_none_or(|o| o.trim().is_empty()));

    for (s, expected) in [(&shim, hooks), (&stripped, BTreeSet::new())] {
        let c = client_under(&b, s);
        let (v, text) = resolve(c.0.id());
        let lib = library(&v, s);
        assert_eq!(lib["origin"], "preload", "{lib}");
        assert_eq!(lib["dlsym_override"], true, "{lib}");
        assert_eq!(lib["procaddress_override"], false, "{lib}");
        assert_eq!(lib["overrides"], serde_json::json!(["dlsym"]), "{lib}");
        assert_eq!(listed(lib), expected, "{}: {lib}", s.display());
        assert_eq!(lib["symtab"], s == &shim, "{lib}");
        assert_eq!(lib["probable_hidden_hooks_capped"], false);
        // libc defines dlsym (and dlopen) for real: never flagged, no line.
        let libc = libc_of(&v);
        let l = library(&v, &libc);
        assert_eq!(
            (&l["dlsym_override"], &l["procaddress_override"]),
            (&Value::Bool(false), &Value::Bool(false)),
            "{l}"
        );
        assert!(!text.contains(&format!("  {}: ", libc.display())), "{text}");
        // The text: one line for the shim.
        let prefix = format!("  {}: overrides dlsym (dlsym_override); ", s.display());
        let lines: Vec<&str> = text.lines().filter(|l| l.starts_with(&prefix)).collect();
        assert_eq!(lines.len(), 1, "{text}");
        if expected.is_empty() {
            assert!(lines[0].contains("no .symtab"), "{}", lines[0]);
        } else {
            assert!(lines[0].contains("probable hidden hooks: "), "{}", lines[0]);
            for (symbol, function, _) in &expected {
                assert!(
                    lines[0].contains(&format!("{symbol} ({function})")),
                    "{}",
                    lines[0]
                );
            }
        }
    }
}

/// The same shim with its `cuGetProcAddress_v2` hook exported under that name
/// (`-DEXPORT_GETPROC`): a `procaddress_override` as well; the HIP runtime, which is no
/// interposer, is not flagged.
#[test]
fn a_shim_exporting_cugetprocaddress_is_a_procaddress_override() {
    let test = "a_shim_exporting_cugetprocaddress_is_a_procaddress_override";
    let Some(b) = build(test) else { return };
    let root = b.client.parent().unwrap();
    if Command::new("nm").arg("--version").output().is_err() {
        skipped(test, "no `nm` (binutils)");
        return;
    }
    let shim = cc(
        root,
        "handout_shim.c",
        "libgetproc.so",
        &[
            "-shared",
            "-fPIC",
            "-fvisibility=hidden",
            "-DEXPORT_GETPROC",
            "-Dhook_launch=hooked_cuLaunchKernel",
        ],
    );
    let exports: BTreeSet<String> = nm(&shim, true)
        .into_iter()
        .filter(|(_, k, _)| *k == 'T')
        .map(|(_, _, n)| n)
        .collect();
    assert_eq!(
        exports,
        ["cuGetProcAddress_v2", "dlsym"].map(String::from).into()
    );
    let c = client_under(&b, &shim);
    let (v, text) = resolve(c.0.id());
    let lib = library(&v, &shim);
    assert_eq!(
        (&lib["dlsym_override"], &lib["procaddress_override"]),
        (&Value::Bool(true), &Value::Bool(true)),
        "{lib}"
    );
    assert_eq!(listed(lib), hooks_by_nm(&shim), "{lib}");
    assert!(
        text.contains(&format!(
            "  {}: overrides dlsym (dlsym_override); overrides cuGetProcAddress_v2 \
             (procaddress_override); probable hidden hooks: ",
            shim.display()
        )),
        "{text}"
    );
    let h = library(&v, &b.hip);
    assert_eq!(
        (&h["dlsym_override"], &h["procaddress_override"]),
        (&Value::Bool(false), &Value::Bool(false)),
        "{h}"
    );
}
