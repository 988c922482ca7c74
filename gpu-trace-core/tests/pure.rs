//! The core stays pure: none of its dependencies, direct or indirect, is aya (the kernel), tokio
//! (the live loop), clap (the command line) or a terminal or HTTP crate. Read from `cargo tree`,
//! so a dependency that comes in through another one counts too.

use std::{collections::BTreeSet, process::Command};

/// The crates the core must not depend on.
const SYSTEM_SIDE: &[&str] = &[
    "aya",
    "aya-obj",
    "tokio",
    "clap",
    "clap_builder",
    "ratatui",
    "crossterm",
    "hyper",
    "tokio-rustls",
    "nvml-wrapper",
];

/// Every package in `package`'s normal (non-dev, non-build) dependency tree.
fn normal_dependencies(package: &str) -> BTreeSet<String> {
    let out = Command::new(env!("CARGO"))
        .args([
            "tree",
            "--offline",
            "-p",
            package,
            "-e",
            "normal",
            "--prefix",
            "none",
            "--format",
            "{p}",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo tree runs");
    assert!(
        out.status.success(),
        "cargo tree -p {package}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

#[test]
fn the_core_depends_on_no_kernel_runtime_cli_terminal_or_http_crate() {
    let core = normal_dependencies("gpu-trace-core");
    assert!(core.contains("gpu-trace-common"), "{core:?}");
    let found: Vec<&&str> = SYSTEM_SIDE.iter().filter(|c| core.contains(**c)).collect();
    assert!(found.is_empty(), "gpu-trace-core depends on {found:?}");
    // The same reading finds them where they are: the check can fail.
    let tool = normal_dependencies("gpu-trace");
    for c in ["aya", "tokio", "clap"] {
        assert!(
            tool.contains(c),
            "cargo tree of gpu-trace lacks {c}: {tool:?}"
        );
    }
}
