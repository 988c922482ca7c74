//! What a run fails with, and `--vendor auto`'s choice.

use std::{io, path::Path};

use thiserror::Error;

use crate::{cli::Vendor, loader::LoadError, probe::cgroup::CgroupError, record::RecordError};

#[derive(Debug, Error)]
pub enum RunError {
    /// The system cannot support what was asked (exit code 3).
    #[error("{0}")]
    Unsupported(String),
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error(transparent)]
    Record(#[from] RecordError),
    #[error("{what}: {source}")]
    Io { what: String, source: io::Error },
    /// The Perfetto timeline could not be written or put in place.
    #[error("{what}: {source}")]
    Perfetto { what: String, source: io::Error },
    #[error(transparent)]
    Metrics(#[from] crate::metrics::server::ServeError),
    /// A cgroup or container given on the command line names nothing usable (exit code 2).
    #[error(transparent)]
    Cgroup(#[from] CgroupError),
    /// `-- CMD` could not be started (a bad `--user` is bad usage, exit code 2).
    #[error(transparent)]
    Launch(#[from] crate::launch::LaunchError),
    /// Options that do not go together (exit code 2).
    #[error("{0}")]
    Usage(String),
}

impl RunError {
    /// The system cannot support what was asked (exit code 3), as opposed to a runtime failure.
    pub fn is_unsupported(&self) -> bool {
        match self {
            Self::Unsupported(_) => true,
            Self::Load(e) => e.is_unsupported(),
            Self::Cgroup(e) => e.is_unsupported(),
            _ => false,
        }
    }
}

pub(crate) fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> RunError {
    let what = what.into();
    move |source| RunError::Io { what, source }
}

/// `--vendor auto`: the driver whose device nodes or module are present.
pub fn detect_vendor() -> Result<Vendor, RunError> {
    let nvidia = Path::new("/sys/module/nvidia").exists() || Path::new("/dev/nvidiactl").exists();
    let amd = Path::new("/dev/kfd").exists();
    match (nvidia, amd) {
        (true, _) => Ok(Vendor::Nvidia),
        (false, true) => Ok(Vendor::Amd),
        (false, false) => Err(RunError::Unsupported(
            "--vendor auto found no GPU driver: neither the nvidia module (/sys/module/nvidia, \
             /dev/nvidiactl) nor AMD KFD (/dev/kfd) is present. Load the driver, or name the \
             vendor with --vendor to trace processes that will start later."
                .into(),
        )),
    }
}
