//! `--against REV`: the pipeline part of another revision, built from a `git worktree` of it
//! under target/, run one repetition at a time between this build's own repetitions, on the same
//! records (this checkout's fixtures, through `--root`), so that `after/before` comes from one
//! run on one machine at one load.
//!
//! REV's xtask reports its figures through `--emit FILE` when it has that option (this one does);
//! a revision from before it is read from its human table (`figures::parse_human`), at the
//! table's precision, and the report says so.

use super::{figures::Figure, *};

/// Another revision's pipeline bench, built and ready to run.
pub(super) struct Before {
    /// As the user named it, and the commit it resolved to.
    pub rev: String,
    pub commit: String,
    xtask: PathBuf,
    /// REV's xtask has `--emit` (else its human output is parsed).
    pub emits: bool,
    work: PathBuf,
}

fn git(root: &Path, args: &[&str]) -> Result<String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(root)
        .args(args)
        .output()
        .context("running git (install git)")?;
    if !out.status.success() {
        bail!(
            "git {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// `git rev-parse HEAD` of `root`, `+modified` when the tree has uncommitted changes, `?`
/// outside a git checkout.
pub(super) fn head_commit(root: &Path) -> String {
    let Ok(head) = git(root, &["rev-parse", "--short=12", "HEAD"]) else {
        return "?".into();
    };
    match git(root, &["status", "--porcelain", "--untracked-files=no"]) {
        Ok(s) if s.is_empty() => head,
        _ => format!("{head}+modified"),
    }
}

/// Where `--against` keeps a revision, all under the bench's work dir (`<target>/xtask-bench`).
#[derive(Debug, PartialEq)]
struct Places {
    /// REV's checkout: a detached `git worktree`, kept for the next run.
    tree: PathBuf,
    /// REV's own target directory, inside its checkout. Never this checkout's: both trees' crates
    /// have the same names and fingerprints (cargo names a workspace crate by its path inside the
    /// workspace), so sharing one target directory made cargo take either tree's build for the
    /// other's, and keeping them apart by `cargo clean -p` deleted this checkout's release build
    /// (`target/release/gpu-trace` included) on every `--against` of a new revision.
    target: PathBuf,
    /// REV's xtask, copied out of its build.
    xtask: PathBuf,
}

impl Places {
    fn new(work: &Path, commit: &str) -> Self {
        let tree = work.join(format!("against-{commit}"));
        Self {
            target: tree.join("target"),
            xtask: work.join(format!("against-{commit}.xtask")),
            tree,
        }
    }
}

impl Before {
    /// Checks REV out in `<target>/xtask-bench/against-<commit>` (a detached `git worktree`,
    /// kept for the next run) and builds its xtask in release into that checkout's own
    /// `target/` (see [`Places`]), then copies the binary out. This checkout's target directory
    /// is left as it was.
    pub fn prepare(ctx: &Ctx, rev: &str) -> Result<Self> {
        Self::prepare_with(&ctx.root, &ctx.work, rev, cargo_build_xtask)
    }

    /// [`Before::prepare`] with the build (`cargo build --release -p xtask` in the checkout
    /// `dir`, into the target directory `target`) passed in, so that a test can stand in for it.
    fn prepare_with(
        root: &Path,
        work: &Path,
        rev: &str,
        mut build: impl FnMut(&Path, &Path) -> Result<()>,
    ) -> Result<Self> {
        let commit = git(
            root,
            &[
                "rev-parse",
                "--verify",
                "--short=12",
                &format!("{rev}^{{commit}}"),
            ],
        )
        .with_context(|| format!("--against {rev}: not a commit of {}", root.display()))?;
        let Places {
            tree,
            target,
            xtask,
        } = Places::new(work, &commit);
        if !tree.join("Cargo.toml").exists() {
            progress(format!(
                "--against {rev}: git worktree add {}",
                tree.display()
            ));
            let _ = git(root, &["worktree", "prune"]);
            let _ = fs::remove_dir_all(&tree);
            git(
                root,
                &[
                    "worktree",
                    "add",
                    "--detach",
                    &tree.to_string_lossy(),
                    &commit,
                ],
            )?;
        }
        if !xtask.exists() {
            progress(format!(
                "--against {rev}: building its xtask (cargo build --release -p xtask in {}, \
                 into {})",
                tree.display(),
                target.display()
            ));
            build(&tree, &target)?;
            fs::copy(target.join("release/xtask"), &xtask)
                .with_context(|| format!("copying {rev}'s xtask to {}", xtask.display()))?;
        }
        let help = Command::new(&xtask)
            .args(["bench", "--help"])
            .output()
            .with_context(|| format!("running {}", xtask.display()))?;
        let emits = String::from_utf8_lossy(&help.stdout).contains("--emit");
        Ok(Self {
            rev: rev.to_string(),
            commit,
            xtask,
            emits,
            work: work.to_path_buf(),
        })
    }

    /// One repetition of REV's pipeline part on `records` records of `root`'s fixtures.
    pub fn run_once(&self, root: &Path, records: usize) -> Result<Vec<Figure>> {
        let emit = self.work.join(format!("against-{}.json", self.commit));
        let _ = fs::remove_file(&emit);
        // REV's bench insists on a gpu-trace binary and a loop binary even for this part
        // (before `--only pipeline` needed neither): any existing file will do.
        let any = &self.xtask;
        let mut cmd = Command::new(&self.xtask);
        cmd.args(["bench", "--only", "pipeline", "--reps", "1"])
            .arg("--pipeline-records")
            .arg(records.to_string())
            .arg("--root")
            .arg(root)
            .arg("--gpu-trace")
            .arg(any)
            .arg("--loop-bin")
            .arg(any)
            .env(NO_REEXEC, "1")
            .stdin(Stdio::null());
        if self.emits {
            cmd.arg("--emit").arg(&emit);
        }
        let out = cmd
            .output()
            .with_context(|| format!("running {}", self.xtask.display()))?;
        if !out.status.success() {
            bail!(
                "{}'s pipeline bench failed ({}): {}",
                self.rev,
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        let figures = if self.emits {
            let s = fs::read_to_string(&emit)
                .with_context(|| format!("reading {}'s --emit {}", self.rev, emit.display()))?;
            serde_json::from_str::<figures::Figures>(&s)
                .with_context(|| format!("parsing {}", emit.display()))?
                .figures
        } else {
            figures::parse_human(&String::from_utf8_lossy(&out.stdout))
        };
        if figures.is_empty() {
            bail!(
                "{}'s pipeline bench printed no figures this bench can read: compare by hand",
                self.rev
            );
        }
        Ok(figures)
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn rev_builds_into_its_own_target_dir() {
        let work = Path::new("/src/target/xtask-bench");
        let places = Places::new(work, "0123456789ab");
        assert_eq!(
            places,
            Places {
                tree: work.join("against-0123456789ab"),
                target: work.join("against-0123456789ab/target"),
                xtask: work.join("against-0123456789ab.xtask"),
            }
        );
        // Not this checkout's target directory, nor anything that holds its release build.
        assert!(!Path::new("/src/target/release").starts_with(&places.target));
        assert_ne!(
            places.target.join("release"),
            work.with_file_name("release")
        );
    }

    /// A repository of one commit, REV's build stood in for by a closure: the build goes into
    /// REV's own checkout and target directory, and this checkout's release build (here two
    /// placeholder files) is left as it was, on the first run and on the next.
    #[test]
    fn prepare_leaves_this_checkouts_build_alone() {
        let dir = std::env::temp_dir().join(format!("xtask-against-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let root = dir.join("repo");
        fs::create_dir_all(&root).unwrap();
        fs::write(root.join("Cargo.toml"), "[workspace]\n").unwrap();
        for args in [
            &["init", "-q"][..],
            &["add", "Cargo.toml"],
            &[
                "-c",
                "user.name=t",
                "-c",
                "user.email=t@t",
                "commit",
                "-q",
                "-m",
                "one",
            ],
        ] {
            git(&root, args).unwrap();
        }
        let target = root.join("target");
        let work = target.join("xtask-bench");
        fs::create_dir_all(target.join("release")).unwrap();
        fs::create_dir_all(&work).unwrap();
        let ours = ["release/gpu-trace", "release/xtask"];
        for f in ours {
            fs::write(target.join(f), f).unwrap();
        }

        let mut builds = Vec::new();
        let mut build = |tree: &Path, target: &Path| {
            builds.push((tree.to_path_buf(), target.to_path_buf()));
            assert!(tree.join("Cargo.toml").exists(), "REV's checkout");
            let xtask = target.join("release/xtask");
            fs::create_dir_all(xtask.parent().unwrap())?;
            fs::write(&xtask, "#!/bin/sh\necho '      --emit <PATH>'\n")?;
            fs::set_permissions(&xtask, fs::Permissions::from_mode(0o755))?;
            Ok(())
        };
        let before = Before::prepare_with(&root, &work, "HEAD", &mut build).unwrap();
        let again = Before::prepare_with(&root, &work, "HEAD", &mut build).unwrap();

        let places = Places::new(&work, &before.commit);
        assert_eq!(builds, [(places.tree.clone(), places.target.clone())]);
        assert_eq!((&before.xtask, before.emits), (&places.xtask, true));
        assert_eq!((again.commit, again.emits), (before.commit, true));
        for f in ours {
            assert_eq!(fs::read_to_string(target.join(f)).unwrap(), f, "{f}");
        }
        fs::remove_dir_all(&dir).unwrap();
    }
}
