//! `gpu-trace merge`: several nodes' recordings on one timeline. The core's [`Merge`] does the
//! work (a pipeline per node, records in real-time order); this opens the recordings and the
//! outputs as replay does, builds each node's pipeline from the flags as replay builds its
//! own, and ends the outputs as replay ends them.

use std::{io::BufReader, path::PathBuf, sync::Arc};

use gpu_trace_core::merge::Merge;

use super::files;
use super::{
    error::{RunError, io_err},
    outputs::{OutputFiles, end_outputs, interval, open_output_files, pipeline_config},
};
use crate::pipeline::{Pipeline, Summary};
use crate::{cli::OutputArgs, queue::Overflow, record::RecordReader};

/// Merges the recordings `paths` into the outputs `args` names.
pub fn merge(paths: &[PathBuf], args: &OutputArgs) -> Result<Summary, RunError> {
    if args.pods_dir.is_some() {
        return Err(RunError::Usage(
            "merge does not take --pods-dir (one node's pod directory names no other node's \
             pods); merge without it, or replay each node's recording with its own"
                .into(),
        ));
    }
    if !args.pods.is_empty() || !args.namespaces.is_empty() {
        return Err(RunError::Usage(
            "merge does not take --pod or --namespace (it names no pods: one node's pod \
             directory names no other node's); replay each node's recording with --pods-dir \
             and --pod or --namespace"
                .into(),
        ));
    }
    let mut readers = Vec::with_capacity(paths.len());
    for path in paths {
        let what = || format!("opening {}", path.display());
        let file = files::open_for_reading(path).map_err(io_err(what()))?;
        let reader = RecordReader::new(BufReader::new(file)).map_err(|e| RunError::Io {
            what: format!("reading {}", path.display()),
            source: std::io::Error::other(e.to_string()),
        })?;
        readers.push(reader);
    }
    let wake = Arc::new(tokio::sync::Notify::new());
    let OutputFiles {
        out,
        out_is_stdout,
        perfetto,
        record: _,
    } = open_output_files(args, None, None, Overflow::Block, &wake)?;
    let timeline = match &perfetto {
        Some((staged, _)) => {
            let file =
                (staged.file().try_clone()).map_err(io_err("writing the Perfetto timeline"))?;
            Some(Box::new(std::io::BufWriter::new(file)) as Box<dyn std::io::Write>)
        }
        None => None,
    };
    let period = interval(args);
    let merge = Merge::new(
        readers,
        out,
        timeline,
        (args.format, !args.no_stats),
        |clock, out| {
            let p =
                Pipeline::new(pipeline_config(args, clock), out).with_gpu_filter(args.gpus.clone());
            match period {
                // Each node's blocks by its own records' time, as replay's.
                Some(period) => p.with_interval(period, true, Box::new(std::io::stderr())),
                None => p,
            }
        },
    )
    .map_err(super::outputs::sink_error)?;
    let merged = merge.run(|out| out.failed());
    for (node, path) in merged.nodes.iter().zip(paths) {
        if node.recording_lost > 0 {
            crate::say!(
                "gpu-trace: {} ({}) misses {} records: its reader did not keep up during the \
                 live run (its trailer says so)",
                path.display(),
                node.host,
                node.recording_lost
            );
        }
        if node.truncated && merged.failure.is_none() {
            crate::say!(
                "gpu-trace: WARNING: {} ({}) ends without its trailer (the run was cut short, \
                 e.g. killed): what it holds was merged, but its counts may be incomplete and \
                 its kernel counters (dropped, read_failed) are unknown (shown as ?); exit \
                 status 4",
                path.display(),
                node.host
            );
        }
    }
    let failure = merged.failure.map(|e| {
        let path = paths.get(e.nth - 1).map(|p| p.display().to_string());
        RunError::Io {
            what: format!(
                "reading {} (node {}); the output holds what came before",
                path.unwrap_or_default(),
                e.host
            ),
            source: std::io::Error::other(e.source.to_string()),
        }
    });
    end_outputs(merged.finished, perfetto, out_is_stdout, failure)
}
