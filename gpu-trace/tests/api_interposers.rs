//! Interposers as GPU-sharing systems ship them (issue 39): a shim of HAMi-core's shape, built
//! with `-fvisibility=hidden`, that exports only `dlsym` and hands out hidden hooks through it
//! and through its own `cuGetProcAddress_v2`, in front of a driver stand-in that hands out its
//! entry points, under a client that finds them the way CUDA runtimes do. The oracle is the
//! programs' own counts: the client's calls (`client launch=N alloc=M`) and the shim's
//! (`shim through launch=N alloc=M getproc=K`), printed by the programs themselves.

mod api_support;
mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use api_support::{c_compiler, cc, uprobes};

/// The stand-ins, built in a new directory: `libcuda.so.1`, the shim (`libshim.so`, full;
/// `libshim_partial.so`, no `cuMemAlloc_v2` hook; `libshim_stripped.so`, the full one with no
/// symbol table; `libshim_getproc.so`, its `cuGetProcAddress_v2` hook exported), and the
/// client.
fn build(test: &str) -> Option<(tempfile::TempDir, PathBuf)> {
    if !uprobes(test) || !c_compiler(test) {
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(dir.path()).unwrap();
    cc(
        &root,
        "handout_cuda.c",
        "libcuda.so.1",
        &["-shared", "-fPIC"],
    );
    let shim = ["-shared", "-fPIC", "-fvisibility=hidden", "-ldl"];
    cc(&root, "handout_shim.c", "libshim.so", &shim);
    cc(
        &root,
        "handout_shim.c",
        "libshim_partial.so",
        &[&shim[..], &["-DNO_ALLOC_HOOK"]].concat(),
    );
    cc(
        &root,
        "handout_shim.c",
        "libshim_getproc.so",
        &[&shim[..], &["-DEXPORT_GETPROC"]].concat(),
    );
    std::fs::copy(root.join("libshim.so"), root.join("libshim_stripped.so")).unwrap();
    let status = Command::new("strip")
        .arg("--strip-all")
        .arg(root.join("libshim_stripped.so"))
        .status()
        .expect("strip");
    assert!(status.success());
    let lib_dir = format!("-L{}", root.display());
    let rpath = format!("-Wl,-rpath,{}", root.display());
    cc(
        &root,
        "handout_client.c",
        "client",
        &[&lib_dir, "-l:libcuda.so.1", "-ldl", &rpath],
    );
    Some((dir, root))
}

/// What one run printed: gpu-trace's JSON lines, the client's and the shim's own counts.
struct Run {
    lines: Vec<Value>,
    client: HashMap<String, u64>,
    shim: HashMap<String, u64>,
    out: String,
}

fn fields(line: &str) -> HashMap<String, u64> {
    line.split_whitespace()
        .filter_map(|f| f.split_once('='))
        .map(|(k, v)| (k.to_string(), v.parse().unwrap()))
        .collect()
}

/// `gpu-trace api -v --format json -- env LD_PRELOAD=SHIM client MODE`; with `main`, the main
/// trace instead (`gpu-trace --watch-device /dev/full --api -v --format json -- …`: the same
/// API records among the driver's).
fn run(root: &Path, shim: &str, mode: &str, main: bool) -> Run {
    let command: &[&str] = match main {
        false => &["api"],
        true => &["--watch-device", "/dev/full", "--api"],
    };
    let out = Command::new(env!("CARGO_BIN_EXE_gpu-trace"))
        .args(command)
        .args(["-v", "--format", "json", "--", "env"])
        .arg(format!("LD_PRELOAD={}", root.join(shim).display()))
        .arg(root.join("client"))
        .arg(mode)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let all = format!("{stdout}{stderr}");
    assert_eq!(out.status.code(), Some(0), "{all}");
    let line = |prefix: &str| {
        all.lines()
            .find_map(|l| l.strip_prefix(prefix))
            .map(fields)
            .unwrap_or_else(|| panic!("no {prefix:?} line: {all}"))
    };
    Run {
        lines: stdout
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect(),
        client: line("client "),
        shim: line("shim through "),
        out: all,
    }
}

impl Run {
    /// The final `API_PATH` of the library whose file name is `lib`.
    fn path(&self, lib: &str) -> &Value {
        self.lines
            .iter()
            .find(|v| {
                v["event"] == "API_PATH"
                    && v["final"] == true
                    && v["library"]
                        .as_str()
                        .is_some_and(|l| l.ends_with(&format!("/{lib}")))
            })
            .unwrap_or_else(|| panic!("no API_PATH for {lib}: {}", self.out))
    }

    /// `symbol` → (through, total) of an `API_PATH`.
    fn symbols(&self, lib: &str) -> HashMap<String, (u64, u64)> {
        self.path(lib)["symbols"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| {
                (
                    s["symbol"].as_str().unwrap().to_string(),
                    (s["through"].as_u64().unwrap(), s["total"].as_u64().unwrap()),
                )
            })
            .collect()
    }

    /// The hidden hand-outs (`API_HANDOUT` with `hidden`) of `symbol`.
    fn hidden(&self, symbol: &str) -> Vec<&Value> {
        self.lines
            .iter()
            .filter(|v| v["event"] == "API_HANDOUT" && v["symbol"] == symbol && v["hidden"] == true)
            .collect()
    }
}

/// The shim's hooks are on the path of every call: `through` is the shim's own count, `total`
/// the client's (each hook calls the driver's copy once).
fn on_the_path(test: &str, shim: &str, main: bool) -> Option<Run> {
    let (_dir, root) = build(test)?;
    let r = run(&root, shim, "runtime", main);
    assert_eq!(r.client["launch"], 1000, "{}", r.out);
    assert_eq!(r.client["alloc"], 100, "{}", r.out);
    assert_eq!(r.shim["launch"], 1000, "{}", r.out);
    let syms = r.symbols(shim);
    assert_eq!(
        syms["cuLaunchKernel"],
        (r.shim["launch"], r.client["launch"]),
        "{}",
        r.out
    );
    assert_eq!(
        syms["cuMemAlloc_v2"],
        (r.shim["alloc"], r.client["alloc"]),
        "{}",
        r.out
    );
    // The client asked the hook twice; the hook asked the driver's copy twice.
    assert_eq!(
        syms["cuGetProcAddress_v2"],
        (r.shim["getproc"], r.shim["getproc"]),
        "{}",
        r.out
    );
    assert_eq!(r.path(shim)["verdict"], "on_path", "{}", r.out);
    // `env LD_PRELOAD=…` inside the command preloaded it (it exports no table symbol).
    assert_eq!(r.path(shim)["preload"], true, "{}", r.out);
    // Its lookups: the client's calls of its dlsym (one, for a GPU API symbol) and, where the
    // hook is exported (a lookup function of its own), the client's calls of it.
    let exported = shim.contains("getproc");
    let (overrides, lookups) = if exported {
        (
            serde_json::json!(["cuGetProcAddress_v2", "dlsym"]),
            r.shim["lookups"] + r.shim["getproc"],
        )
    } else {
        (serde_json::json!(["dlsym"]), r.shim["lookups"])
    };
    assert_eq!(r.path(shim)["overrides"], overrides, "{}", r.out);
    assert_eq!(r.path(shim)["lookups"], lookups, "{}", r.out);
    assert_eq!(r.path(shim)["api_lookups"], lookups, "{}", r.out);
    Some(r)
}

#[test]
fn hooks_handed_out_through_dlsym_and_cugetprocaddress_are_counted_on_the_path() {
    on_the_path(
        "hooks_handed_out_through_dlsym_and_cugetprocaddress_are_counted_on_the_path",
        "libshim.so",
        false,
    );
}

#[test]
fn a_stripped_shims_hooks_are_counted_the_same() {
    on_the_path(
        "a_stripped_shims_hooks_are_counted_the_same",
        "libshim_stripped.so",
        false,
    );
}

/// A `cuGetProcAddress_v2` the shim exports: what it hands out is seen, and the hidden hook is
/// probed at its address, its calls counted under the shim with the symbol asked for and the
/// function's own name from the shim's symbol table.
#[test]
fn hooks_handed_out_by_an_exported_cugetprocaddress_are_probed_with_their_names() {
    let test = "hooks_handed_out_by_an_exported_cugetprocaddress_are_probed_with_their_names";
    let Some(r) = on_the_path(test, "libshim_getproc.so", false) else {
        return;
    };
    let hooks = r.hidden("cuLaunchKernel");
    assert_eq!(hooks.len(), 1, "{}", r.out);
    assert!(
        hooks[0]["library"]
            .as_str()
            .unwrap()
            .ends_with("/libshim_getproc.so"),
        "{}",
        r.out
    );
    assert_eq!(hooks[0]["function"], "hook_launch", "{}", r.out);
    assert_eq!(hooks[0]["lookup"], "cuGetProcAddress_v2", "{}", r.out);
    // The hook's own probe: its calls under the shim, named by the symbol asked for.
    let row = r
        .lines
        .iter()
        .find(|v| {
            v["event"] == "API_STATS"
                && v["symbol"] == "cuLaunchKernel"
                && v["library"]
                    .as_str()
                    .is_some_and(|l| l.ends_with("/libshim_getproc.so"))
        })
        .unwrap_or_else(|| panic!("no API_STATS row of the hook: {}", r.out));
    assert_eq!(row["calls"], r.shim["launch"], "{}", r.out);
}

#[test]
fn a_client_that_binds_the_driver_directly_bypasses_the_shim() {
    let test = "a_client_that_binds_the_driver_directly_bypasses_the_shim";
    let Some((_dir, root)) = build(test) else {
        return;
    };
    let r = run(&root, "libshim.so", "direct", false);
    assert_eq!(r.shim["launch"], 0, "{}", r.out);
    let syms = r.symbols("libshim.so");
    assert_eq!(syms["cuLaunchKernel"], (0, r.client["launch"]), "{}", r.out);
    assert_eq!(syms["cuMemAlloc_v2"], (0, r.client["alloc"]), "{}", r.out);
    assert_eq!(r.path("libshim.so")["verdict"], "bypassed", "{}", r.out);
    assert_eq!(r.path("libshim.so")["preload"], true, "{}", r.out);
    assert!(r.hidden("cuLaunchKernel").is_empty(), "{}", r.out);
}

#[test]
fn a_shim_that_hooks_some_symbols_is_partial() {
    let test = "a_shim_that_hooks_some_symbols_is_partial";
    let Some((_dir, root)) = build(test) else {
        return;
    };
    let r = run(&root, "libshim_partial.so", "runtime", false);
    assert_eq!(r.shim["alloc"], 0, "{}", r.out);
    let syms = r.symbols("libshim_partial.so");
    assert_eq!(
        syms["cuLaunchKernel"],
        (r.shim["launch"], r.client["launch"]),
        "{}",
        r.out
    );
    assert_eq!(syms["cuMemAlloc_v2"], (0, r.client["alloc"]), "{}", r.out);
    assert_eq!(
        r.path("libshim_partial.so")["verdict"],
        "partial",
        "{}",
        r.out
    );
}

/// The main trace (`gpu-trace --api`) gives the same records through its one stream: the
/// verdict and counts on the path (the programs' own counts), the hidden hook's hand-out with
/// `-v`, and `bypassed` for the client that binds the driver directly.
#[test]
fn the_main_trace_gives_the_same_verdicts_and_hand_outs() {
    let test = "the_main_trace_gives_the_same_verdicts_and_hand_outs";
    let Some(r) = on_the_path(test, "libshim_getproc.so", true) else {
        return;
    };
    let hooks = r.hidden("cuLaunchKernel");
    assert_eq!(hooks.len(), 1, "{}", r.out);
    assert_eq!(hooks[0]["function"], "hook_launch", "{}", r.out);
    let (_dir, root) = build(test).expect("built above");
    let r = run(&root, "libshim.so", "direct", true);
    assert_eq!(r.shim["launch"], 0, "{}", r.out);
    let syms = r.symbols("libshim.so");
    assert_eq!(syms["cuLaunchKernel"], (0, r.client["launch"]), "{}", r.out);
    assert_eq!(r.path("libshim.so")["verdict"], "bypassed", "{}", r.out);
}
