//! What the developer tasks ask of the host, one helper each: where the workspace is, whether
//! this process is root, and where a tool is on PATH.

use std::path::{Path, PathBuf};

use anyhow::{Result, anyhow};

/// The workspace root (the parent of xtask's own directory).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_path_buf()
}

/// Whether this process runs as root (effective uid 0).
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// The executable `name` on PATH, or in /usr/sbin and /sbin (which a user's PATH may lack);
/// a name with a slash is taken as a path.
pub fn find_in_path(name: &str) -> Option<PathBuf> {
    if name.contains('/') {
        let path = PathBuf::from(name);
        return path.is_file().then_some(path);
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/sbin")])
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}

/// Whether `tool` is on PATH ([`find_in_path`]).
pub fn have(tool: &str) -> bool {
    find_in_path(tool).is_some()
}

/// `tool` on PATH ([`find_in_path`]), or an error that names it.
pub fn which(tool: &str) -> Result<PathBuf> {
    find_in_path(tool).ok_or_else(|| anyhow!("{tool} not found in PATH"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sh_is_found_and_a_made_up_name_is_not() {
        // POSIX requires /bin/sh; the made-up name exists nowhere.
        let sh = find_in_path("sh").expect("sh on PATH");
        assert!(sh.is_file() && sh.ends_with("sh"), "{}", sh.display());
        assert!(!have("no-such-tool-gpu-trace-xtask"));
        assert!(
            which("no-such-tool-gpu-trace-xtask")
                .unwrap_err()
                .to_string()
                .contains("not found in PATH")
        );
        assert_eq!(find_in_path("/bin/sh"), Some(PathBuf::from("/bin/sh")));
    }

    #[test]
    fn the_workspace_root_holds_the_workspace_manifest() {
        let root = workspace_root();
        assert!(root.join("Cargo.toml").is_file());
        assert!(root.join("xtask").is_dir() && root.join("gpu-trace").is_dir());
    }
}
