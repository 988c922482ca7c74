//! What the guest handed back on its results port (lab/init.sh, lab/client.c), read once: the
//! `LAB` lines as records (`LAB <topic> key=value ...`), the facts, and per step of the scenario
//! its typed results (gpu-trace's JSON output and stats, its stderr and exit, each client's
//! records). The checks read these values; none parses a line of the log itself.

use std::collections::BTreeMap;

use super::events::Output;

/// The raw log: `LAB` lines and `LAB-BEGIN`/`LAB-END` blocks.
#[derive(Debug, Default)]
pub(in crate::lab) struct Results {
    /// Every `LAB <topic> ...` line, those inside blocks included, in order.
    pub lines: Vec<String>,
    pub blocks: BTreeMap<String, Block>,
    pub done: bool,
}

#[derive(Debug, Default, Clone)]
pub(in crate::lab) struct Block {
    pub text: String,
    pub rc: Option<i64>,
}

impl Results {
    pub(in crate::lab) fn parse(text: &str) -> Self {
        let mut r = Results::default();
        let mut current: Option<(String, String)> = None;
        for raw in text.lines() {
            let line = raw.trim_end_matches('\r');
            if let Some(name) = line.strip_prefix("LAB-BEGIN ") {
                current = Some((name.trim().to_owned(), String::new()));
                continue;
            }
            if let Some(rest) = line.strip_prefix("LAB-END ") {
                let mut parts = rest.split_whitespace();
                let name = parts.next().unwrap_or_default().to_owned();
                let rc = parts
                    .find_map(|p| p.strip_prefix("rc="))
                    .and_then(|v| v.parse().ok());
                let text = match current.take() {
                    Some((n, t)) if n == name => t,
                    _ => String::new(),
                };
                r.blocks.insert(name, Block { text, rc });
                continue;
            }
            if line == "LAB-DONE" {
                r.done = true;
            }
            if let Some((_, t)) = current.as_mut() {
                t.push_str(line);
                t.push('\n');
            }
            if line.starts_with("LAB ") {
                r.lines.push(line.to_owned());
            }
        }
        r
    }
}

/// One `LAB <topic> key=value ...` line.
#[derive(Clone, Debug)]
pub(in crate::lab) struct Record {
    pub topic: String,
    pub kv: Vec<(String, String)>,
}

impl Record {
    fn parse(line: &str) -> Self {
        let mut parts = line.split_whitespace().skip(1);
        let topic = parts.next().unwrap_or_default().to_owned();
        let kv = parts
            .filter_map(|p| p.split_once('='))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        Self { topic, kv }
    }

    pub fn get(&self, key: &str) -> Option<&str> {
        self.kv
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    pub fn int(&self, key: &str) -> Option<i64> {
        let v = self.get(key)?;
        match v.strip_prefix("0x") {
            Some(hex) => i64::from_str_radix(hex, 16).ok(),
            None => v.parse().ok(),
        }
    }
}

/// The records of some `LAB` lines (the whole log's, or one block's), in order, with the lines.
#[derive(Debug, Default)]
pub(in crate::lab) struct Records {
    pub lines: Vec<String>,
    pub all: Vec<Record>,
}

impl Records {
    fn of(lines: &[String]) -> Self {
        Self {
            lines: lines.to_vec(),
            all: lines.iter().map(|l| Record::parse(l)).collect(),
        }
    }

    /// The first record of `topic` that has all of `matching`.
    pub fn find(&self, topic: &str, matching: &[(&str, &str)]) -> Option<&Record> {
        self.all
            .iter()
            .find(|f| f.topic == topic && matching.iter().all(|(k, v)| f.get(k) == Some(*v)))
    }

    /// The first record of `topic` that has the field `key`.
    pub fn with_key(&self, topic: &str, key: &str) -> Option<&Record> {
        self.all
            .iter()
            .find(|f| f.topic == topic && f.get(key).is_some())
    }

    /// Every record of `topic`.
    pub fn topic<'a>(&'a self, topic: &'a str) -> impl Iterator<Item = &'a Record> + 'a {
        self.all.iter().filter(move |f| f.topic == topic)
    }

    /// The lines that start with `prefix`.
    pub fn lines_starting(&self, prefix: &str) -> Vec<&String> {
        self.lines
            .iter()
            .filter(|l| l.starts_with(prefix))
            .collect()
    }
}

/// A traced run of the scenario (`<run>.jsonl`, `<run>.stderr`, `LAB <run> tracer_ready=…
/// tracer_exit=…`).
#[derive(Debug, Default)]
pub(in crate::lab) struct Run {
    /// gpu-trace's stdout.
    pub output: Output,
    pub stderr: String,
    /// `tracer_exit=`.
    pub exit: Option<i64>,
}

impl Run {
    /// gpu-trace's lines that name its hooks, joined.
    pub fn hooks(&self) -> String {
        self.stderr
            .lines()
            .filter(|l| l.contains("hooks"))
            .collect::<Vec<_>>()
            .join(" / ")
    }
}

/// Everything the guest handed back, typed.
#[derive(Debug, Default)]
pub(in crate::lab) struct Guest {
    /// `LAB-DONE` was printed: the scenario finished.
    pub done: bool,
    /// Every `LAB` line of the log (blocks' included).
    pub records: Records,
    facts: Vec<(String, String)>,
    /// Each block's text and `rc=`, by name.
    blocks: BTreeMap<String, Block>,
    /// The records of each block that is not a run's output or stderr (clients' and others').
    clients: BTreeMap<String, Records>,
    /// Each traced run, by name.
    runs: BTreeMap<String, Run>,
    none: Records,
    no_run: Run,
}

impl Guest {
    pub fn read(r: &Results) -> Self {
        let records = Records::of(&r.lines);
        let facts = r
            .lines
            .iter()
            .filter_map(|l| l.strip_prefix("LAB fact "))
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        let mut runs: BTreeMap<String, Run> = BTreeMap::new();
        let mut clients = BTreeMap::new();
        for (name, b) in &r.blocks {
            if let Some(run) = name.strip_suffix(".jsonl") {
                runs.entry(run.to_owned()).or_default().output = Output::parse(&b.text);
            } else if let Some(run) = name.strip_suffix(".stderr") {
                runs.entry(run.to_owned()).or_default().stderr = b.text.clone();
            }
            let lines: Vec<String> = Results::parse(&b.text).lines;
            clients.insert(name.clone(), Records::of(&lines));
        }
        // A run's exit is known where its output is not (a log cut inside a block).
        for f in records
            .all
            .iter()
            .filter(|f| f.get("tracer_exit").is_some())
        {
            runs.entry(f.topic.clone()).or_default();
        }
        for (name, run) in runs.iter_mut() {
            run.exit = records
                .with_key(name, "tracer_exit")
                .and_then(|f| f.int("tracer_exit"));
        }
        Self {
            done: r.done,
            records,
            facts,
            blocks: r.blocks.clone(),
            clients,
            runs,
            none: Records::default(),
            no_run: Run::default(),
        }
    }

    /// `LAB fact key=value...`: the value of the first.
    pub fn fact(&self, key: &str) -> Option<&str> {
        self.facts
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    pub fn block(&self, name: &str) -> Option<&Block> {
        self.blocks.get(name)
    }

    /// The records of one block only (none when the block is missing): several steps run the
    /// same client subcommand.
    pub fn client(&self, block: &str) -> &Records {
        self.clients.get(block).unwrap_or(&self.none)
    }

    /// A traced run (an empty one when the guest did not run it).
    pub fn run(&self, name: &str) -> &Run {
        self.runs.get(name).unwrap_or(&self.no_run)
    }

    /// The run's `LAB <run> tracer_ready=…` record, when the guest got to start its tracer.
    pub fn started(&self, name: &str) -> Option<&Record> {
        self.records
            .find(name, &[])
            .filter(|f| f.get("tracer_ready").is_some())
    }

    /// Whether the run's tracer reported its hooks (`tracer_ready=yes`).
    pub fn ready(&self, name: &str) -> bool {
        self.records
            .find(name, &[("tracer_ready", "yes")])
            .is_some()
    }

    /// Whether the test module `name` was loaded (`LAB test_module name=… loaded=yes`).
    pub fn module_loaded(&self, name: &str) -> bool {
        self.module(name).and_then(|m| m.get("loaded")) == Some("yes")
    }

    pub fn module(&self, name: &str) -> Option<&Record> {
        self.records.find("test_module", &[("name", name)])
    }

    /// The kernel's version (`LAB fact kernel=`) is at least `since`; a kernel the log does not
    /// name counts as new (its checks then want everything).
    pub fn kernel_at_least(&self, since: (u32, u32)) -> bool {
        self.fact("kernel")
            .and_then(gpu_trace::probe::kernel::KernelVersion::parse)
            .is_none_or(|v| (v.major, v.minor) >= since)
    }
}
