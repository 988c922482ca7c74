//! `gpu-trace merge`: recordings of several nodes on one timeline.
//!
//! Each recording is replayed through a pipeline of its own — exactly what `gpu-trace replay`
//! does with it alone — so its trackers, process names and statistics never see another
//! node's records, and two nodes' PIDs, handles and tasks stay apart by construction. What
//! merge adds is the order: the next record fed is, of the recordings' next records, the one
//! with the earliest **real time** (its CLOCK_MONOTONIC timestamp plus its recording's
//! `realtime_offset_ns`, the header's CLOCK_REALTIME − CLOCK_MONOTONIC); on a tie, the
//! recording given first. A recording's own records keep their order (the ring buffer
//! delivers records of several CPUs a little out of time order, and a `TASK_CGROUP` record
//! must stay before its `ATTRIBUTION`), so the merged output is each recording's output,
//! interleaved by real time. Records without a time of the run (the API layer's symbol names,
//! a malformed record) go right after their recording's previous record; a batch of NVML share
//! samples at its first sample's real time.
//!
//! Every node's pipeline writes into the one output ([`Shared`]): each line ends with
//! `host=NAME` (text) or starts with a `host` key (JSON) ([`Pipeline::with_host`]). At the end,
//! each node's statistics (its replay's, titled or keyed with its name), in the order the
//! recordings were given, then one table of all of them ([`MergeStats`]). With `--perfetto`,
//! one timeline ([`MergedTimeline`]).
//!
//! Nodes are named by their recordings' `host`; a name given twice (two recordings of one
//! node) gets `#2`, `#3`, … on its second, third recording (they are kept apart as nodes of
//! their own), an empty one `?`.

use std::io::{BufRead, Write};
use std::time::Duration;

use crate::{
    model::{share::ShareSample, stats::KernelCounters},
    output::{Format, Shared, clock::Clock, perfetto::MergedTimeline},
    pipeline::{Finished, Pipeline, Summary},
    record::{Item, RecordError, RecordReader, RecordingHeader},
    sink::SinkError,
    wire::{self, RawRecord},
};

/// A failure that stops the merge: a recording that cannot be read on.
#[derive(Debug, thiserror::Error)]
#[error("reading {host}'s recording (the {nth} given): {source}")]
pub struct MergeError {
    /// The node the recording is of.
    pub host: String,
    /// Which recording, counted from 1 in the order given.
    pub nth: usize,
    #[source]
    pub source: RecordError,
}

/// The next item of a recording, parsed, with its real time.
enum Head {
    Record(Box<RawRecord>),
    /// Bytes that are not a record (counted as `malformed`, as replay counts them).
    Malformed,
    Share(Vec<ShareSample>),
}

/// One node: its recording and its pipeline.
struct Node<R: BufRead, W: Write> {
    host: String,
    reader: RecordReader<R>,
    pipeline: Pipeline<Shared<W>>,
    /// The next item and its real time (ns); `None` at the recording's end.
    head: Option<(i128, Head)>,
    /// The real time of the item fed last (for items without a time of their own).
    last_key: i128,
}

/// What a node's recording ended with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeEnd {
    /// The node's name in the output.
    pub host: String,
    /// The recording ends without its trailer (cut short): its counts may be incomplete and
    /// its kernel counters are unknown, as `replay` says.
    pub truncated: bool,
    /// Records its trailer says the live run's recording lost (its reader did not keep up).
    pub recording_lost: u64,
}

/// What [`Merge::run`] ended with.
pub struct Merged<W> {
    /// The nodes' summaries added up (events, drops, `truncated` when any was); the output
    /// writer; every output's failure to end, by kind; the statistics as text (every node's
    /// block and the merged table; `None` with `--no-stats`).
    pub finished: Finished<W>,
    /// Per node, in the order given.
    pub nodes: Vec<NodeEnd>,
    /// The recording that could not be read on (the merge stopped there; what was read is
    /// in the output).
    pub failure: Option<MergeError>,
}

/// One node's row of the merged statistics, or all nodes' ([`MergeStats::all`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct NodeRow {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    pub events: u64,
    pub task_init: u64,
    pub schedule: u64,
    pub schedule_refused: u64,
    pub sched_update: u64,
    pub work_submit: u64,
    pub task_destroy: u64,
    pub pretrace_end: u64,
    pub mps_shared: u64,
    /// Records the kernel dropped; `None`: not known (a recording cut short).
    pub dropped: Option<u64>,
}

impl NodeRow {
    fn add(&mut self, o: &NodeRow) {
        self.events += o.events;
        self.task_init += o.task_init;
        self.schedule += o.schedule;
        self.schedule_refused += o.schedule_refused;
        self.sched_update += o.sched_update;
        self.work_submit += o.work_submit;
        self.task_destroy += o.task_destroy;
        self.pretrace_end += o.pretrace_end;
        self.mps_shared += o.mps_shared;
        self.dropped = match (self.dropped, o.dropped) {
            (Some(a), Some(b)) => Some(a + b),
            _ => None,
        };
    }
}

/// The statistics of every node and of all of them together: the events each node's
/// pipeline counted, by kind, and the kernel's drops.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct MergeStats {
    pub nodes: Vec<NodeRow>,
    pub all: NodeRow,
    /// Real time from the earliest first record to the latest last record of all nodes, ns.
    pub span_ns: u64,
}

impl MergeStats {
    /// The table (text output).
    pub fn render_text(&self) -> String {
        use std::fmt::Write as _;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "--- gpu-trace statistics of {} nodes merged ({:.1} s) ---",
            self.nodes.len(),
            Duration::from_nanos(self.span_ns).as_secs_f64()
        );
        let head = [
            "node",
            "events",
            "TASK_INIT",
            "SCHEDULE",
            "refused",
            "SCHED_UPDATE",
            "WORK_SUBMIT",
            "TASK_DESTROY",
            "PRETRACE_END",
            "MPS_SHARED",
            "dropped",
        ];
        let row = |name: &str, r: &NodeRow| -> Vec<String> {
            let mut v = vec![crate::escape::escape_text(name).into_owned()];
            v.extend(
                [
                    r.events,
                    r.task_init,
                    r.schedule,
                    r.schedule_refused,
                    r.sched_update,
                    r.work_submit,
                    r.task_destroy,
                    r.pretrace_end,
                    r.mps_shared,
                ]
                .map(|n| n.to_string()),
            );
            v.push(r.dropped.map_or("?".to_string(), |d| d.to_string()));
            v
        };
        let mut rows = vec![head.map(str::to_string).to_vec()];
        for r in &self.nodes {
            rows.push(row(r.host.as_deref().unwrap_or("?"), r));
        }
        rows.push(row("all", &self.all));
        let widths: Vec<usize> = (0..head.len())
            .map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0))
            .collect();
        for r in rows {
            let mut line = String::new();
            for (i, cell) in r.iter().enumerate() {
                if i == 0 {
                    let _ = write!(line, "{cell:<w$}", w = widths[0]);
                } else {
                    let _ = write!(line, "  {cell:>w$}", w = widths[i]);
                }
            }
            let _ = writeln!(out, "{}", line.trim_end());
        }
        out
    }

    /// The `MERGE_STATS` line (JSON output, docs/json-schema.md).
    pub fn json(&self) -> String {
        // The fields in their order, after `event` (as every line starts).
        let fields = serde_json::to_string(self).unwrap_or_else(|_| "{}".to_string());
        let rest = fields.strip_prefix('{').unwrap_or("}");
        let line = format!("{{\"event\":\"MERGE_STATS\",{rest}");
        crate::escape::json_terminal_safe(line)
    }
}

/// Several recordings through one pipeline each, in real-time order, into one output.
pub struct Merge<R: BufRead, W: Write> {
    nodes: Vec<Node<R, W>>,
    out: Shared<W>,
    timeline: Option<MergedTimeline>,
    format: Format,
    stats: bool,
}

/// The nodes' names: each recording's `host`, `#2`, `#3`, … on a name's later recordings,
/// `?` for none.
pub fn node_names(headers: &[&RecordingHeader]) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for h in headers {
        let base = if h.host.is_empty() {
            "?".to_string()
        } else {
            h.host.clone()
        };
        let mut name = base.clone();
        let mut n = 1;
        while names.contains(&name) {
            n += 1;
            name = format!("{base}#{n}");
        }
        names.push(name);
    }
    names
}

impl<R: BufRead, W: Write> Merge<R, W> {
    /// The merge of `readers` (recordings opened, headers read) into `out`, and into the
    /// timeline `perfetto` when given. `pipeline` makes each node's pipeline over the shared
    /// output, from its recording's clock: the caller's flags (`--format`, `-v`, filters,
    /// `--no-stats`) as for `replay`; merge names the node and adds the timeline's sink. Each
    /// recording's start-up inventory goes to its pipeline first (JSON: an `INVENTORY` line
    /// per node), in the order given. `format` and `stats`: how and whether the merged table
    /// is written at the end.
    pub fn new(
        readers: Vec<RecordReader<R>>,
        out: W,
        perfetto: Option<Box<dyn Write>>,
        (format, stats): (Format, bool),
        mut pipeline: impl FnMut(Clock, Shared<W>) -> Pipeline<Shared<W>>,
    ) -> Result<Self, SinkError> {
        let out = Shared::new(out);
        let names = node_names(&readers.iter().map(|r| &r.header).collect::<Vec<_>>());
        let timeline = match perfetto {
            Some(file) => {
                // ts 0 at the smallest offset: every node's ts is its monotonic time plus a
                // shift of 0 or more.
                let base = (readers.iter())
                    .map(|r| r.header.realtime_offset_ns)
                    .min()
                    .unwrap_or(0);
                Some(MergedTimeline::new(file, base).map_err(SinkError::Perfetto)?)
            }
            None => None,
        };
        let mut nodes = Vec::with_capacity(readers.len());
        for (reader, host) in readers.into_iter().zip(names) {
            let clock = Clock::new(reader.header.realtime_offset_ns);
            let mut p = pipeline(clock.clone(), out.clone()).with_host(&host);
            if let Some(t) = &timeline {
                p = p.with_output(Box::new(t.node(&host, clock)));
            }
            p.start(&reader.header, &reader.state)
                .map_err(SinkError::Output)?;
            nodes.push(Node {
                host,
                reader,
                pipeline: p,
                head: None,
                last_key: i128::MIN,
            });
        }
        Ok(Self {
            nodes,
            out,
            timeline,
            format,
            stats,
        })
    }

    /// Feeds every record of every recording in real-time order (see the module's
    /// documentation), then ends each node's pipeline as `replay` ends it (its trailer's
    /// counters; without one, the kernel counters unknown) and writes the merged table.
    /// `stop(out)` is asked after each record: `true` stops the merge (the output broke).
    pub fn run(mut self, stop: impl Fn(&W) -> bool) -> Merged<W> {
        let mut failure = None;
        let mut errors = Vec::new();
        for i in 0..self.nodes.len() {
            if let Err(e) = self.advance(i) {
                failure = Some(e);
                break;
            }
        }
        while failure.is_none() && errors.is_empty() && !self.out.with(&stop) {
            // The earliest head; the first node given on a tie.
            let Some(i) = (0..self.nodes.len())
                .filter_map(|i| self.nodes[i].head.as_ref().map(|(k, _)| (*k, i)))
                .min()
                .map(|(_, i)| i)
            else {
                break;
            };
            let node = &mut self.nodes[i];
            let Some((key, head)) = node.head.take() else {
                break;
            };
            node.last_key = key;
            let fed = match head {
                Head::Record(r) => node.pipeline.feed_record(&r),
                Head::Malformed => {
                    node.pipeline.malformed();
                    Ok(())
                }
                Head::Share(samples) => node.pipeline.share_samples(&samples),
            };
            match fed {
                Ok(()) => {
                    if let Err(e) = self.advance(i) {
                        failure = Some(e);
                    }
                }
                Err(e) => errors.push(e),
            }
        }
        self.end(failure, errors)
    }

    /// Reads node `i`'s next item into its head.
    fn advance(&mut self, i: usize) -> Result<(), MergeError> {
        let node = &mut self.nodes[i];
        let item = node.reader.next_item().map_err(|source| MergeError {
            host: node.host.clone(),
            nth: i + 1,
            source,
        })?;
        let offset = node.reader.header.realtime_offset_ns;
        node.head = item.map(|item| match item {
            Item::Record(bytes) => match wire::parse_record(&bytes) {
                // The API layer's symbol names carry no time of the run.
                Ok(RawRecord::ApiSymbol(r)) => (
                    node.last_key,
                    Head::Record(Box::new(RawRecord::ApiSymbol(r))),
                ),
                Ok(r) => (
                    i128::from(r.header().ts_ns) + offset,
                    Head::Record(Box::new(r)),
                ),
                Err(_) => (node.last_key, Head::Malformed),
            },
            Item::Share(samples) => {
                let key = samples
                    .first()
                    .map_or(node.last_key, |s| i128::from(s.ts_us) * 1000);
                (key, Head::Share(samples))
            }
        });
        Ok(())
    }

    /// Ends every node's pipeline, writes the merged table and closes the timeline.
    fn end(self, failure: Option<MergeError>, mut errors: Vec<SinkError>) -> Merged<W> {
        let mut summary = Summary::default();
        let mut stats = MergeStats::default();
        let mut ends = Vec::new();
        let mut texts = Vec::new();
        let (mut first, mut last) = (i128::MAX, i128::MIN);
        for node in self.nodes {
            let Node {
                host,
                reader,
                mut pipeline,
                ..
            } = node;
            let offset = reader.header.realtime_offset_ns;
            let (counters, duration) = match &reader.trailer {
                Some(t) => (t.kernel_counters, Duration::from_nanos(t.duration_ns)),
                None => {
                    pipeline.stats_mut().kernel_unknown = true;
                    (KernelCounters::default(), pipeline.span())
                }
            };
            if let Some((a, b)) = pipeline.record_times() {
                first = first.min(i128::from(a) + offset);
                last = last.max(i128::from(b) + offset);
            }
            let s = pipeline.stats();
            let row = NodeRow {
                host: Some(host.clone()),
                events: s.events(),
                task_init: s.task_init,
                schedule: s.schedule,
                schedule_refused: s.schedule_refused,
                sched_update: s.sched_update,
                work_submit: s.work_submit,
                task_destroy: s.task_destroy,
                pretrace_end: s.pretrace_end,
                mps_shared: s.mps_shared,
                dropped: reader.trailer.is_some().then_some(counters.dropped),
            };
            let f = pipeline.finish_all(counters, duration);
            summary.events += f.summary.events;
            summary.dropped += f.summary.dropped;
            summary.truncated |= f.summary.truncated;
            errors.extend(f.errors);
            texts.extend(f.stats_text);
            ends.push(NodeEnd {
                host,
                truncated: reader.trailer.is_none(),
                recording_lost: reader.trailer.as_ref().map_or(0, |t| t.recording_lost),
            });
            if stats.nodes.is_empty() {
                stats.all.dropped = Some(0);
            }
            stats.all.add(&row);
            stats.nodes.push(row);
        }
        stats.span_ns = u64::try_from(last.saturating_sub(first)).unwrap_or(0);
        let mut out = self.out;
        if self.stats {
            let written = match self.format {
                Format::Text => {
                    let text = stats.render_text();
                    texts.push(text.clone());
                    out.write_all(text.as_bytes())
                }
                Format::Json => writeln!(out, "{}", stats.json()),
            };
            if let Err(e) = written.and_then(|()| out.flush()) {
                errors.push(SinkError::Output(e));
            }
        }
        if let Some(t) = self.timeline
            && let Err(e) = t.finish()
        {
            errors.push(SinkError::Perfetto(e));
        }
        let out = match out.into_inner() {
            Ok(w) => w,
            // Every pipeline was dropped above, and the timeline writes its own file.
            Err(_) => {
                unreachable!("the nodes' pipelines hold no handle of the output past their end")
            }
        };
        Merged {
            finished: Finished {
                summary,
                out,
                errors,
                stats_text: self.stats.then(|| texts.concat()),
            },
            nodes: ends,
            failure,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        output::text::TimestampMode,
        pipeline::PipelineConfig,
        record::{RecordWriter, RecordingTrailer},
    };
    use serde_json::Value;

    /// A GPU host's recording, its header's host and realtime offset rewritten: the same
    /// records, as if another node had recorded them with another clock.
    fn as_node(name: &str, host: &str, offset_shift_ns: i128) -> (Vec<u8>, i128) {
        let path = format!(
            "{}/../gpu-trace/tests/fixtures/{name}",
            env!("CARGO_MANIFEST_DIR")
        );
        let bytes = std::fs::read(path).unwrap();
        let mut r = RecordReader::new(&bytes[..]).unwrap();
        let mut header = r.header.clone();
        header.host = host.to_string();
        header.realtime_offset_ns += offset_shift_ns;
        let mut w = RecordWriter::with_share(Vec::new(), &header).unwrap();
        while let Some(item) = r.next_item().unwrap() {
            match item {
                Item::Record(b) => w.record(&b).unwrap(),
                Item::Share(s) => assert!(w.share(&s).unwrap()),
            }
        }
        let trailer: RecordingTrailer = r.trailer.clone().unwrap();
        (w.finish(&trailer).unwrap(), header.realtime_offset_ns)
    }

    fn config(clock: Clock, format: Format) -> PipelineConfig {
        PipelineConfig {
            verbose: true,
            pids: Vec::new(),
            comms: Vec::new(),
            format,
            timestamps: TimestampMode::default(),
            stats: true,
            clock,
            show_container: false,
        }
    }

    /// `replay`'s loop over one recording (run/replay.rs), its output as lines.
    fn replay(bytes: &[u8], format: Format) -> Vec<String> {
        let mut r = RecordReader::new(bytes).unwrap();
        let clock = Clock::new(r.header.realtime_offset_ns);
        let mut p = Pipeline::new(config(clock, format), Vec::new());
        if let Some(inv) = r.header.inventory.clone() {
            p.inventory(&inv).unwrap();
        }
        while let Some(item) = r.next_item().unwrap() {
            match item {
                Item::Record(b) => p.feed(&b).unwrap(),
                Item::Share(s) => p.share_samples(&s).unwrap(),
            }
        }
        let t = r.trailer.clone().unwrap();
        let f = p.finish_all(t.kernel_counters, Duration::from_nanos(t.duration_ns));
        String::from_utf8(f.out)
            .unwrap()
            .lines()
            .map(str::to_string)
            .collect()
    }

    fn merge(recordings: &[&[u8]], format: Format) -> Merged<Vec<u8>> {
        let readers = recordings
            .iter()
            .map(|b| RecordReader::new(*b).unwrap())
            .collect();
        Merge::new(readers, Vec::new(), None, (format, true), |clock, out| {
            Pipeline::new(config(clock, format), out)
        })
        .unwrap()
        .run(|_| false)
    }

    /// Two nodes' recordings (the same GPU-host recording, its host and clock rewritten: B's
    /// real times 0.4 s after A's): each node's lines, its `host` key taken out, are exactly
    /// its own replay's lines, in its order (every record once, the statistics equal); the
    /// events of both are in real-time order (ts_ns + the node's offset), and really
    /// interleaved; the merged table adds up each node's events as its replay printed them.
    #[test]
    fn two_nodes_are_their_own_replays_interleaved_by_real_time() {
        for fixture in ["two_streams.gtrace", "ctx_churn.gtrace"] {
            let (a, off_a) = as_node(fixture, "node-a", 0);
            let (b, off_b) = as_node(fixture, "node-b", 400_000_123);
            let merged = merge(&[&a, &b], Format::Json);
            assert!(merged.failure.is_none() && merged.finished.errors.is_empty());
            let text = String::from_utf8(merged.finished.out).unwrap();
            let mut lines: Vec<Value> = text
                .lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect();
            let table = lines.pop().unwrap();
            assert_eq!(table["event"], "MERGE_STATS", "{table}");

            let mut per_host: std::collections::BTreeMap<String, Vec<Value>> = Default::default();
            let mut real_times = Vec::new();
            let mut hosts = Vec::new();
            for (line, raw) in lines.iter().zip(text.lines()) {
                assert!(raw.starts_with("{\"host\":"), "{raw}");
                let mut line = line.clone();
                let host = line
                    .as_object_mut()
                    .unwrap()
                    .remove("host")
                    .unwrap()
                    .as_str()
                    .unwrap()
                    .to_string();
                if let Some(ts) = line["ts_ns"].as_u64() {
                    let offset = if host == "node-a" { off_a } else { off_b };
                    real_times.push(i128::from(ts) + offset);
                    hosts.push(host.clone());
                }
                per_host.entry(host).or_default().push(line);
            }
            let mut event_counts = Vec::new();
            for (host, bytes) in [("node-a", &a), ("node-b", &b)] {
                let alone: Vec<Value> = replay(bytes, Format::Json)
                    .iter()
                    .map(|l| serde_json::from_str(l).unwrap())
                    .collect();
                let times: Vec<u64> = alone.iter().filter_map(|l| l["ts_ns"].as_u64()).collect();
                // The order below is only real-time order if each recording's is.
                assert!(times.windows(2).all(|w| w[0] <= w[1]), "{fixture}");
                assert_eq!(per_host[host], alone, "{fixture} {host}");
                event_counts.push(times.len() as u64);
            }
            assert!(
                real_times.windows(2).all(|w| w[0] <= w[1]),
                "{fixture}: not in real-time order"
            );
            let switches = hosts.windows(2).filter(|w| w[0] != w[1]).count();
            assert!(switches >= 2, "{fixture}: the nodes did not interleave");
            assert_eq!(table["nodes"][0]["host"], "node-a");
            assert_eq!(table["nodes"][1]["host"], "node-b");
            for (i, n) in event_counts.iter().enumerate() {
                assert_eq!(table["nodes"][i]["events"], *n, "{fixture}");
            }
            assert_eq!(table["all"]["events"], event_counts.iter().sum::<u64>());
            assert_eq!(table["all"]["dropped"], 0);
            assert_eq!(
                merged.finished.summary.events,
                event_counts.iter().sum::<u64>()
            );
        }
    }

    /// A tie in real time goes to the recording given first; with the same clock, the merge
    /// of a recording with itself alternates record by record, A's first.
    #[test]
    fn ties_go_to_the_recording_given_first() {
        let (a, _) = as_node("two_streams.gtrace", "x", 0);
        let (b, _) = as_node("two_streams.gtrace", "y", 0);
        let merged = merge(&[&a, &b], Format::Text);
        let text = String::from_utf8(merged.finished.out).unwrap();
        let hosts: Vec<&str> = text
            .lines()
            .filter_map(|l| l.rsplit_once(" host=").map(|(_, h)| h))
            .collect();
        let alone = replay(&a, Format::Text);
        let events = alone.iter().filter(|l| l.contains(" PID=")).count();
        assert_eq!(hosts.len(), 2 * events);
        // Events at one time (a process exit's TASK_DESTROYs) come from one record: all of
        // A's, then all of B's. So compare per record: the hosts never run ahead of each other.
        let (mut na, mut nb) = (0usize, 0usize);
        for h in hosts {
            if h == "x" {
                na += 1;
            } else {
                nb += 1;
                assert!(nb <= na, "y's event before x's of the same time");
            }
        }
        assert_eq!((na, nb), (events, events));
        // Two statistics blocks, titled by node, then the table.
        assert!(text.contains("--- gpu-trace statistics of x ("), "{text}");
        assert!(text.contains("--- gpu-trace statistics of y ("), "{text}");
        assert!(text.contains("--- gpu-trace statistics of 2 nodes merged ("));
    }

    #[test]
    fn nodes_are_named_once_each() {
        let h = |host: &str| RecordingHeader {
            host: host.to_string(),
            ..Default::default()
        };
        let (a, b, c, d) = (h("a"), h("a"), h(""), h("a"));
        assert_eq!(node_names(&[&a, &b, &c, &d]), ["a", "a#2", "?", "a#3"]);
    }
}
