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

/// Removes the workspace's own crates from the release build of `target`, before REV's build
/// and again before this checkout's: both trees' crates have the same names and fingerprints
/// (cargo names a workspace crate by its path inside the workspace) and each records its own
/// tree's sources, unchanged, so without this cargo finds the other tree's build fresh: REV's
/// bench ran this tree's code, or every later build here ran REV's.
fn forget_workspace_crates(root: &Path, target: &Path) -> Result<()> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(root).args(["clean", "--release"]);
    for krate in ["gpu-trace", "gpu-trace-common", "gpu-trace-core", "xtask"] {
        cmd.args(["-p", krate]);
    }
    let status = cmd
        .env("CARGO_TARGET_DIR", target)
        .status()
        .context("running cargo clean")?;
    if !status.success() {
        bail!(
            "cargo clean --release -p ... in {} failed ({status})",
            root.display()
        );
    }
    Ok(())
}

impl Before {
    /// Checks REV out in `<target>/xtask-bench/against-<commit>` (a detached `git worktree`,
    /// kept for the next run) and builds its xtask in release into the same target directory
    /// (the dependencies are shared), then copies the binary out and rebuilds this checkout's
    /// xtask so that `target/release/xtask` is this one again.
    pub fn prepare(ctx: &Ctx, rev: &str) -> Result<Self> {
        let commit = git(
            &ctx.root,
            &[
                "rev-parse",
                "--verify",
                "--short=12",
                &format!("{rev}^{{commit}}"),
            ],
        )
        .with_context(|| format!("--against {rev}: not a commit of {}", ctx.root.display()))?;
        let tree = ctx.work.join(format!("against-{commit}"));
        let target = ctx
            .work
            .parent()
            .context("the bench's work dir is not in a target dir")?
            .to_path_buf();
        if !tree.join("Cargo.toml").exists() {
            progress(format!(
                "--against {rev}: git worktree add {}",
                tree.display()
            ));
            let _ = git(&ctx.root, &["worktree", "prune"]);
            let _ = fs::remove_dir_all(&tree);
            git(
                &ctx.root,
                &[
                    "worktree",
                    "add",
                    "--detach",
                    &tree.to_string_lossy(),
                    &commit,
                ],
            )?;
        }
        let xtask = ctx.work.join(format!("against-{commit}.xtask"));
        if !xtask.exists() {
            progress(format!(
                "--against {rev}: building its xtask (cargo build --release -p xtask in {})",
                tree.display()
            ));
            forget_workspace_crates(&ctx.root, &target)?;
            cargo_build_xtask(&tree, &target)?;
            fs::copy(target.join("release/xtask"), &xtask)
                .with_context(|| format!("copying {rev}'s xtask to {}", xtask.display()))?;
            progress("rebuilding this checkout's xtask (target/release/xtask is ours again)");
            forget_workspace_crates(&ctx.root, &target)?;
            cargo_build_xtask(&ctx.root, &target)?;
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
            work: ctx.work.clone(),
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
