//! Which files a command's dynamic linker will load at start, found the way `ld.so(8)` finds
//! them, so that `gpu-trace api -- CMD` can attach its probes before the command runs: for each
//! `DT_NEEDED` name of an object, a name with a slash is a path; otherwise the object's
//! `DT_RPATH` (only when it has no `DT_RUNPATH`; the executable's `DT_RPATH` too, which its
//! dependencies inherit), then `LD_LIBRARY_PATH`, then the object's `DT_RUNPATH`, then the
//! linker's cache (`ldconfig -p`), then the default directories. `$ORIGIN` (and `${ORIGIN}`)
//! stands for the directory of the object that holds the path. Not followed: `$LIB` and
//! `$PLATFORM` (entries holding them are skipped), hardware-capability subdirectories, and the
//! secure-execution rules of set-user-ID programs.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

/// An object's dependencies and search paths, as its dynamic section states them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Dependencies {
    pub needed: Vec<String>,
    pub rpath: Option<String>,
    pub runpath: Option<String>,
}

/// Where the dynamic linker of a command about to start will look.
pub struct Linker {
    ld_library_path: Option<String>,
    cache: HashMap<String, PathBuf>,
    defaults: Vec<PathBuf>,
}

impl Linker {
    /// This process's `LD_LIBRARY_PATH` (the command inherits it) and the linker's cache.
    pub fn from_env() -> Self {
        Self {
            ld_library_path: std::env::var("LD_LIBRARY_PATH").ok(),
            cache: ldconfig_cache(),
            defaults: ["/lib", "/usr/lib", "/lib64", "/usr/lib64"]
                .iter()
                .map(PathBuf::from)
                .collect(),
        }
    }

    /// Every object `exe` loads at start, with the `DT_NEEDED` name that brought it in, in the
    /// order found (breadth first); names not found are left out, as the linker would fail.
    /// `read` gives an object's dynamic section (`probe::libraries::dependencies_of`).
    pub fn closure(
        &self,
        exe: &Path,
        read: impl Fn(&Path) -> Option<Dependencies>,
    ) -> Vec<(String, PathBuf)> {
        let Some(top) = read(exe) else {
            return Vec::new();
        };
        // The executable's DT_RPATH applies to every object without a DT_RUNPATH.
        let exe_rpath = if top.runpath.is_none() {
            expand(top.rpath.as_deref(), exe)
        } else {
            Vec::new()
        };
        let mut out = Vec::new();
        let mut seen: HashSet<String> = HashSet::new();
        let mut queue = std::collections::VecDeque::from([(exe.to_path_buf(), top)]);
        while let Some((object, deps)) = queue.pop_front() {
            for name in &deps.needed {
                if !seen.insert(name.clone()) {
                    continue;
                }
                let Some(path) = self.find(name, &object, &deps, &exe_rpath) else {
                    continue;
                };
                if let Some(next) = read(&path) {
                    queue.push_back((path.clone(), next));
                }
                out.push((name.clone(), path));
            }
        }
        out
    }

    /// Where `name`, needed by `object`, is found.
    fn find(
        &self,
        name: &str,
        object: &Path,
        deps: &Dependencies,
        exe_rpath: &[PathBuf],
    ) -> Option<PathBuf> {
        if name.contains('/') {
            let p = PathBuf::from(name);
            return p.is_file().then_some(p);
        }
        let mut dirs: Vec<PathBuf> = Vec::new();
        if deps.runpath.is_none() {
            dirs.extend(expand(deps.rpath.as_deref(), object));
            dirs.extend(exe_rpath.iter().cloned());
        }
        dirs.extend(split(self.ld_library_path.as_deref()).map(PathBuf::from));
        dirs.extend(expand(deps.runpath.as_deref(), object));
        dirs.iter()
            .map(|d| d.join(name))
            .find(|p| p.is_file())
            .or_else(|| self.cache.get(name).cloned())
            .or_else(|| {
                self.defaults
                    .iter()
                    .map(|d| d.join(name))
                    .find(|p| p.is_file())
            })
    }
}

/// The non-empty entries of a colon-separated path list.
fn split(list: Option<&str>) -> impl Iterator<Item = &str> {
    list.unwrap_or("").split(':').filter(|d| !d.is_empty())
}

/// A `DT_RPATH`/`DT_RUNPATH` of the object at `object` as directories, `$ORIGIN` expanded.
fn expand(list: Option<&str>, object: &Path) -> Vec<PathBuf> {
    let origin = std::fs::canonicalize(object)
        .ok()
        .and_then(|p| p.parent().map(Path::to_path_buf))
        .unwrap_or_default();
    let origin = origin.to_string_lossy();
    split(list)
        .map(|d| d.replace("${ORIGIN}", &origin).replace("$ORIGIN", &origin))
        .filter(|d| !d.contains('$'))
        .map(PathBuf::from)
        .collect()
}

/// `ldconfig -p`: each name's first entry (the one `ld.so` uses).
fn ldconfig_cache() -> HashMap<String, PathBuf> {
    let Some(out) = ["/sbin/ldconfig", "/usr/sbin/ldconfig", "ldconfig"]
        .iter()
        .find_map(|l| std::process::Command::new(l).arg("-p").output().ok())
    else {
        return HashMap::new();
    };
    let mut cache = HashMap::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        if let Some((name, path)) = line.trim().split_once(" => ") {
            let name = name.split(' ').next().unwrap_or("").to_string();
            cache
                .entry(name)
                .or_insert_with(|| PathBuf::from(path.trim()));
        }
    }
    cache
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origin_is_the_objects_directory_and_unknown_tokens_are_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let obj = dir.path().join("a.so");
        std::fs::write(&obj, b"").unwrap();
        let real = std::fs::canonicalize(dir.path()).unwrap();
        let got = expand(Some("$ORIGIN/lib::${ORIGIN}:/opt/$LIB:/x"), &obj);
        assert_eq!(
            got,
            vec![real.join("lib"), real.clone(), PathBuf::from("/x")]
        );
    }

    #[test]
    fn rpath_before_ld_library_path_before_runpath_before_the_cache() {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        for d in ["r", "l", "u", "c"] {
            std::fs::create_dir(root.join(d)).unwrap();
            std::fs::write(root.join(d).join("libx.so.1"), b"").unwrap();
        }
        let linker = Linker {
            ld_library_path: Some(root.join("l").to_string_lossy().into_owned()),
            cache: HashMap::from([("libx.so.1".to_string(), root.join("c/libx.so.1"))]),
            defaults: Vec::new(),
        };
        let obj = root.join("exe");
        std::fs::write(&obj, b"").unwrap();
        let rpath = Dependencies {
            rpath: Some("$ORIGIN/r".into()),
            ..Default::default()
        };
        let find = |d: &Dependencies| linker.find("libx.so.1", &obj, d, &[]).unwrap();
        assert_eq!(find(&rpath), root.join("r/libx.so.1"));
        // A DT_RUNPATH turns the object's DT_RPATH off, and comes after LD_LIBRARY_PATH.
        let both = Dependencies {
            runpath: Some(format!("{}/u", root.display())),
            ..rpath.clone()
        };
        assert_eq!(find(&both), root.join("l/libx.so.1"));
        let runpath_only = Linker {
            ld_library_path: None,
            ..linker
        };
        assert_eq!(
            runpath_only.find("libx.so.1", &obj, &both, &[]).unwrap(),
            root.join("u/libx.so.1")
        );
        assert_eq!(
            runpath_only
                .find("libx.so.1", &obj, &Dependencies::default(), &[])
                .unwrap(),
            root.join("c/libx.so.1")
        );
    }
}
