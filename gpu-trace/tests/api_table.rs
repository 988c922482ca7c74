//! The built-in symbol table covers every launch path of the real runtimes (issue 37): each
//! exported C function (`cu…`, `hip…`) of a real library whose name holds `Launch` (`nm -D --defined-only`,
//! binutils' own reading of the file, is the oracle) must be matched by the table. Here:
//! Debian's HIP runtime (`libamdhip64.so.5`, scripts/setup.sh installs it); on a GPU host,
//! also every library in `GPU_TRACE_LAUNCH_LIBS` (colon-separated paths: libcuda, libcudart).
//!
//! Without the HIP runtime or `nm` the test prints `SKIPPED: <why>` for that library.

use std::path::Path;
use std::process::Command;

use gpu_trace_core::api::symbols::SymbolTable;

mod api_support;
mod common;
use common::skipped;

/// The defined dynamic symbols of `lib` whose name holds `Launch`, versions cut off.
fn launch_exports(lib: &Path) -> Option<Vec<String>> {
    let out = Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(lib)
        .output()
        .ok()?;
    assert!(out.status.success(), "nm -D {}", lib.display());
    Some(
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| {
                let mut f = l.split_whitespace();
                let kind = f.nth(1)?;
                let name = f.next()?.split('@').next()?;
                // C entry points of the API (C++ overloads and helpers, `_Z…`, are not, nor
                // libcuda's debugger interface, `cudbg…`).
                let api = (name.starts_with("cu") && !name.starts_with("cudbg"))
                    || name.starts_with("hip");
                (matches!(kind, "T" | "W" | "i") && api && name.contains("Launch"))
                    .then(|| name.into())
            })
            .collect(),
    )
}

fn check(test: &str, lib: &Path) {
    let Some(exports) = launch_exports(lib) else {
        skipped(test, "no nm (binutils) to list the library's exports");
        return;
    };
    assert!(!exports.is_empty(), "{} exports no launch", lib.display());
    let table = SymbolTable::builtin();
    let missing: Vec<&String> = exports
        .iter()
        .filter(|s| table.entry_for(s).is_none())
        .collect();
    assert!(
        missing.is_empty(),
        "launch exports of {} the table does not trace: {missing:?}",
        lib.display()
    );
}

#[test]
fn every_launch_export_of_the_real_runtimes_is_in_the_table() {
    let test = "every_launch_export_of_the_real_runtimes_is_in_the_table";
    match api_support::hip_runtime() {
        Some(hip) => check(test, &hip),
        None => skipped(
            test,
            "Debian's HIP runtime (libamdhip64.so.5) is not installed: run scripts/setup.sh",
        ),
    }
    for lib in std::env::var("GPU_TRACE_LAUNCH_LIBS")
        .unwrap_or_default()
        .split(':')
        .filter(|p| !p.is_empty())
    {
        check(test, Path::new(lib));
    }
}
