//! The one escaping rule (escape.rs), character class by character class, for every output:
//! text events, JSON events, the JSON and text `INVENTORY`, metrics label values and Perfetto
//! names. Each row of [`CLASSES`] is checked on its own in each output, so leaving any single
//! class (or any single character of the bidi controls and U+2065..U+2069) out of the rule
//! fails a named row (issue 26: a mutant leaving U+2065..U+2069 raw passed every suite).

use std::{cell::RefCell, io::Write, rc::Rc};

use super::*;
use crate::{
    inventory::{GpuNode, Inventory, InventoryProcess},
    metrics::{Metrics, MetricsConfig},
    output::{
        Format, TimestampMode,
        clock::Clock,
        perfetto::{PerfettoSink, PerfettoWriter},
    },
    pipeline::{Pipeline, PipelineConfig},
    source::amd::decode::testing::{CreateArgs, soc15_doorbell},
    wire::RawRecord,
};

/// Every class of the rule with the characters tested one by one.
const CLASSES: &[(&str, &[char])] = &[
    (
        "C0",
        &[
            '\u{1}', '\u{7}', '\u{8}', '\u{b}', '\u{c}', '\u{1b}', '\u{1f}',
        ],
    ),
    ("C0 whitespace", &['\n', '\r', '\t']),
    ("DEL", &['\u{7f}']),
    ("C1", &['\u{80}', '\u{85}', '\u{9b}', '\u{9d}', '\u{9f}']),
    ("Zl Zp", &['\u{2028}', '\u{2029}']),
    (
        "bidi",
        &[
            '\u{61c}', '\u{200e}', '\u{200f}', '\u{202a}', '\u{202b}', '\u{202c}', '\u{202d}',
            '\u{202e}', '\u{2066}', '\u{2067}', '\u{2068}', '\u{2069}',
        ],
    ),
    ("U+2065 (unassigned, ignorable)", &['\u{2065}']),
    ("soft hyphen", &['\u{ad}']),
    (
        "zero width",
        &['\u{200b}', '\u{200c}', '\u{200d}', '\u{feff}'],
    ),
    (
        "invisible operators",
        &['\u{2060}', '\u{2061}', '\u{2062}', '\u{2063}', '\u{2064}'],
    ),
    ("deprecated format", &['\u{206a}', '\u{206f}']),
    ("Mongolian", &['\u{180e}', '\u{180b}', '\u{180f}']),
    (
        "prepended marks",
        &[
            '\u{600}', '\u{605}', '\u{6dd}', '\u{70f}', '\u{890}', '\u{8e2}',
        ],
    ),
    (
        "interlinear annotation",
        &['\u{fff9}', '\u{fffa}', '\u{fffb}'],
    ),
    (
        "Cf beyond the BMP",
        &[
            '\u{110bd}',
            '\u{110cd}',
            '\u{13430}',
            '\u{1343f}',
            '\u{1bca0}',
            '\u{1d173}',
        ],
    ),
    (
        "tags",
        &['\u{e0001}', '\u{e0020}', '\u{e0041}', '\u{e007f}'],
    ),
    (
        "default ignorable",
        &[
            '\u{34f}',
            '\u{115f}',
            '\u{1160}',
            '\u{17b4}',
            '\u{17b5}',
            '\u{3164}',
            '\u{fe00}',
            '\u{fe0f}',
            '\u{ffa0}',
            '\u{fff0}',
            '\u{e0100}',
            '\u{e0fff}',
        ],
    ),
];

/// Bytes that are not UTF-8 (a lone high byte, a truncated sequence, an encoded surrogate).
const NOT_UTF8: &[&[u8]] = &[b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xf4\x8f\xbe\x80"];

/// Near misses: visible characters around the ranges, never escaped.
const VISIBLE: &[char] = &[
    'a',
    '~',
    '\u{a0}',
    '\u{ac}',
    '\u{ae}',
    'é',
    '\u{34e}',
    '\u{350}',
    '\u{606}',
    '\u{17b3}',
    '\u{17b6}',
    '\u{61b}',
    '\u{61d}',
    '\u{200a}',
    '\u{2010}',
    '\u{2027}',
    '\u{202f}',
    '\u{205f}',
    '\u{2070}',
    '\u{3163}',
    '\u{3165}',
    '\u{fdff}',
    '\u{fe10}',
    '\u{fefe}',
    '\u{ff00}',
    '\u{ffef}',
    '\u{fffc}',
    '\u{fffd}',
    '中',
    '😀',
    '\u{1d172}',
    '\u{1d17b}',
    '\u{e1000}',
];

/// The text rule's spelling of `c`: each UTF-8 byte as `\xNN` (`\n`, `\r`, `\t` by name).
fn text_of(c: char) -> String {
    match c {
        '\n' => "\\n".into(),
        '\r' => "\\r".into(),
        '\t' => "\\t".into(),
        c => c
            .encode_utf8(&mut [0u8; 4])
            .bytes()
            .map(|b| format!("\\x{b:02x}"))
            .collect(),
    }
}

/// Every case: (class, the name's bytes, how the text rule shows the odd part).
fn cases() -> Vec<(String, Vec<u8>, String)> {
    let mut out = Vec::new();
    for (class, chars) in CLASSES {
        for &c in *chars {
            let mut name = b"x".to_vec();
            name.extend_from_slice(c.encode_utf8(&mut [0u8; 4]).as_bytes());
            name.push(b'y');
            out.push((
                format!("{class} U+{:04X}", u32::from(c)),
                name,
                format!("x{}y", text_of(c)),
            ));
        }
    }
    for raw in NOT_UTF8 {
        let mut name = b"x".to_vec();
        name.extend_from_slice(raw);
        name.push(b'y');
        let shown: String = raw.iter().map(|b| format!("\\x{b:02x}")).collect();
        out.push((format!("not UTF-8 {raw:x?}"), name, format!("x{shown}y")));
    }
    out
}

/// Neither the tested character (`what` names it as `U+XXXX`, or none for bytes that are not
/// UTF-8) nor a carried byte in `s`; judged without [`is_hidden`], so a character left out of
/// the rule is caught here.
fn inert(s: &str, what: &str) -> bool {
    let tested = what
        .rsplit_once(" U+")
        .and_then(|(_, hex)| u32::from_str_radix(hex, 16).ok())
        .and_then(char::from_u32)
        .filter(|&c| c != '\n');
    !s.chars()
        .any(|c| Some(c) == tested || (RAW_FIRST..=RAW_LAST).contains(&c))
}

#[test]
fn the_rule_holds_every_class_and_spares_visible_characters() {
    for (class, chars) in CLASSES {
        for &c in *chars {
            assert!(is_hidden(c), "{class}: U+{:04X}", u32::from(c));
        }
    }
    for &c in VISIBLE {
        assert!(!is_hidden(c), "U+{:04X} is visible", u32::from(c));
    }
    // The table's ranges are sorted and disjoint (the binary search needs it), and each
    // bound is hidden while its outer neighbour is decided by the rule, not by accident.
    for w in HIDDEN.windows(2) {
        assert!(w[0].1 < w[1].0 && w[0].0 <= w[0].1, "{w:x?}");
    }
    for &(lo, hi) in HIDDEN {
        for u in [lo, hi] {
            assert!(is_hidden(char::from_u32(u).unwrap()), "{u:x}");
        }
    }
}

/// The code point ranges the module docs' table lists (escape.rs, "The rule"), every row.
fn documented_ranges() -> Vec<(u32, u32)> {
    let source = include_str!("escape.rs");
    let table: Vec<&str> = source
        .lines()
        .skip_while(|l| !l.starts_with("//! | class | characters |"))
        .skip(2)
        .take_while(|l| l.starts_with("//! | "))
        .collect();
    assert_eq!(table.len(), 5, "the table's rows: {table:#?}");
    let hex = |s: &str| -> (u32, usize) {
        let n = s.bytes().take_while(u8::is_ascii_hexdigit).count();
        (u32::from_str_radix(&s[..n], 16).unwrap(), n)
    };
    let mut ranges = Vec::new();
    for row in table {
        let mut rest = row;
        while let Some(at) = rest.find("U+") {
            let (lo, n) = hex(&rest[at + 2..]);
            rest = &rest[at + 2 + n..];
            let hi = match rest.strip_prefix("..U+") {
                Some(tail) => {
                    let (hi, n) = hex(tail);
                    rest = &tail[n..];
                    hi
                }
                None => lo,
            };
            ranges.push((lo, hi));
        }
    }
    ranges
}

// The rule is its documented table, code point by code point: every character the table lists
// is hidden and no other is. (Unicode's own data checks the Cf, Zl, Zp and Cc rows below, where
// the machine has Python; the default-ignorable row, U+17B4 and U+17B5 among it, is beyond
// those categories and is held to the table here.)
#[test]
fn the_rule_is_the_documented_table_code_point_by_code_point() {
    let ranges = documented_ranges();
    assert!(ranges.contains(&(0x17B5, 0x17B5)), "{ranges:x?}");
    for u in 0..=0x10FFFFu32 {
        let Some(c) = char::from_u32(u) else {
            continue;
        };
        let listed = ranges.iter().any(|&(lo, hi)| (lo..=hi).contains(&u));
        assert_eq!(
            is_hidden(c),
            listed,
            "U+{u:04X}: listed in the table: {listed}"
        );
    }
    // In text output each listed character is spelled as its bytes, never written raw.
    for &(lo, hi) in &ranges {
        for u in [lo, hi, lo + (hi - lo) / 2] {
            let c = char::from_u32(u).unwrap();
            let name = format!("x{c}y");
            assert_eq!(escape_text(&name), format!("x{}y", text_of(c)), "U+{u:04X}");
        }
    }
}

#[test]
fn general_categories_cf_zl_zp_cc_match_unicode_data() {
    // Unicode's own data, as the machine's Python has it (Python 3.11: Unicode 14).
    let out = std::process::Command::new("python3")
        .args([
            "-c",
            "import unicodedata as u\n\
             print(u.unidata_version)\n\
             print(' '.join('%x' % c for c in range(0x110000) \
             if u.category(chr(c)) in ('Cf', 'Zl', 'Zp', 'Cc')))",
        ])
        .output();
    let Some(out) = out.ok().filter(|o| o.status.success()) else {
        crate::skip::skipped(
            "general_categories_cf_zl_zp_cc_match_unicode_data",
            "no python3 with unicodedata to read Unicode's general categories",
        );
        return;
    };
    let text = String::from_utf8(out.stdout).unwrap();
    let mut lines = text.lines();
    let version = lines.next().unwrap();
    let listed: Vec<u32> = lines
        .next()
        .unwrap()
        .split(' ')
        .map(|h| u32::from_str_radix(h, 16).unwrap())
        .collect();
    assert!(listed.len() > 150, "Unicode {version}: {}", listed.len());
    for u in listed {
        let c = char::from_u32(u).unwrap();
        assert!(
            is_hidden(c),
            "U+{u:04X} is Cf/Zl/Zp/Cc in Unicode {version}"
        );
    }
}

#[test]
fn text_rule_spells_each_class_and_round_trips() {
    for (what, name, want) in cases() {
        let s = decode_lossless(&name);
        assert_eq!(escape_text(&s), want, "{what}");
        assert_eq!(unescape_text(&want).as_deref(), Some(&name[..]), "{what}");
    }
}

#[test]
fn json_rule_escapes_each_class_and_keeps_the_value() {
    for (what, name, _) in cases() {
        let s = decode_lossless(&name);
        let line = json_terminal_safe(
            serde_json::to_string(&serde_json::json!({"v": &*lossy(&s)})).unwrap(),
        );
        // Only ASCII (the `\uXXXX` escapes) and, for bytes that are not UTF-8, U+FFFD.
        assert!(
            line.chars()
                .all(|c| c.is_ascii() && !c.is_ascii_control() || c == '\u{fffd}'),
            "{what}: {line:?}"
        );
        let back: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(back["v"], *lossy(&s), "{what}");
    }
    // A carried byte never shows its carrier, even where a caller forgot `lossy`.
    let carried = decode_lossless(b"a\xffb");
    let line = json_terminal_safe(serde_json::to_string(&carried).unwrap());
    assert_eq!(line, "\"a\\ufffdb\"");
}

/// The formatter's fast path (a fragment of printable ASCII, written as is) takes nothing
/// else: a string made only of DEL, only of a hidden non-ASCII character, only of a carried
/// byte, or only of visible non-ASCII is written by the rule, whole. (cargo-mutants: a fast
/// path that took every all-DEL or every all-non-ASCII fragment survived every other test,
/// which only ever put such characters beside ASCII ones.)
#[test]
fn strings_made_only_of_one_class_are_written_by_the_rule() {
    let carried = decode_lossless(b"\xff\xfe");
    for (s, want) in [
        ("\u{7f}", r#""\u007f""#),
        ("\u{7f}\u{7f}", r#""\u007f\u007f""#),
        ("\u{202e}", r#""\u202e""#),
        ("\u{85}\u{2066}", r#""\u0085\u2066""#),
        (carried.as_str(), r#""\ufffd\ufffd""#),
        ("é", r#""é""#),
        ("~", r#""~""#),
    ] {
        let mut out = Vec::new();
        write_json(&mut out, s);
        assert_eq!(String::from_utf8(out).unwrap(), want, "{s:?}");
    }
}

/// A writer whose bytes the test reads after the pipeline consumed it.
#[derive(Clone, Default)]
struct Shared(Rc<RefCell<Vec<u8>>>);

impl Write for Shared {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.borrow_mut().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

struct Outputs {
    text: String,
    json: String,
    metrics: String,
    perfetto: String,
}

/// One traced process named `name` (the kernel's bytes), in the start-up inventory with that
/// name as its comm, command line, executable and cgroup, through every output.
fn run(name: &[u8]) -> Outputs {
    let s = decode_lossless(name);
    let inv = o_inventory(&s);
    let mut comm = [0u8; 16];
    comm[..name.len()].copy_from_slice(name);
    let mut created = CreateArgs {
        queue_id: 2,
        doorbell_offset: soc15_doorbell(0xbeef, 16),
        ..CreateArgs::default()
    }
    .created(4242, 5);
    created.hdr.comm = comm;
    let render = |format: Format, extras: bool| {
        let config = PipelineConfig {
            show_container: false,
            verbose: true,
            pids: Vec::new(),
            comms: Vec::new(),
            format,
            timestamps: TimestampMode::Relative,
            stats: false,
            clock: Clock::new(0),
        };
        let out = Shared::default();
        let perfetto = Shared::default();
        let mut p = Pipeline::new(config, out.clone());
        let mut registry = None;
        if extras {
            let m = Metrics::new(MetricsConfig::default());
            registry = Some(m.registry());
            let writer =
                PerfettoWriter::new(Box::new(perfetto.clone()) as Box<dyn Write>, Clock::new(0))
                    .unwrap();
            p = p
                .with_output(Box::new(m))
                .with_output(Box::new(PerfettoSink::new(writer, Clock::new(0))));
        }
        p.inventory(&inv).unwrap();
        p.feed(RawRecord::KfdIoctl(created).as_bytes()).unwrap();
        let metrics = registry
            .map(|r| crate::metrics::encode(&r))
            .unwrap_or_default();
        p.finish(Default::default(), Default::default()).unwrap();
        let text = |b: &Shared| String::from_utf8(b.0.borrow().clone()).unwrap();
        (text(&out), metrics, text(&perfetto))
    };
    let (text, _, _) = render(Format::Text, false);
    let (json, metrics, perfetto) = render(Format::Json, true);
    Outputs {
        text,
        json,
        metrics,
        perfetto,
    }
}

#[test]
fn every_output_applies_the_rule_to_every_class() {
    for (what, name, shown) in cases() {
        let s = decode_lossless(&name);
        let o = run(&name);

        // Text events.
        assert!(inert(&o.text, &what), "{what}: text {:?}", o.text);
        assert!(
            o.text.contains(&format!(" {shown} ")),
            "{what}: text {:?}",
            o.text
        );

        // Text INVENTORY (the start-up report).
        let lines = crate::inventory::render_text(&o_inventory(&s)).join("\n");
        assert!(inert(&lines, &what), "{what}: inventory text {lines:?}");
        for field in [
            format!(" {shown} "),
            format!("cgroup=/user.slice/{shown} "),
            format!("cmd=\"{shown} --flag\""),
        ] {
            assert!(lines.contains(&field), "{what}: {field} in {lines:?}");
        }

        // JSON: the INVENTORY line and the events; the values are the lossy text, exact bytes
        // beside them where it is not exact.
        assert!(inert(&o.json, &what), "{what}: json {:?}", o.json);
        let lines: Vec<serde_json::Value> = o
            .json
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let inventory = &lines[0];
        assert_eq!(inventory["event"], "INVENTORY");
        let p = &inventory["processes"][0];
        let want = lossy(&s);
        assert_eq!(p["comm"], *want, "{what}");
        assert_eq!(p["cmdline"][0], *want, "{what}");
        assert_eq!(p["exe"], format!("/bin/{want}"), "{what}");
        assert_eq!(p["cgroup"], format!("/user.slice/{want}"), "{what}");
        let bytes = |v: &serde_json::Value| -> Vec<u8> {
            v.as_array()
                .unwrap()
                .iter()
                .map(|b| b.as_u64().unwrap() as u8)
                .collect()
        };
        if is_exact(&s) {
            assert!(p.get("comm_bytes").is_none() && p.get("cmdline_bytes").is_none());
        } else {
            assert_eq!(bytes(&p["comm_bytes"]), name, "{what}");
            assert_eq!(bytes(&p["cmdline_bytes"][0]), name, "{what}");
            assert_eq!(bytes(&p["cmdline_bytes"][1]), b"--flag", "{what}");
            assert_eq!(&bytes(&p["exe_bytes"])[5..], name, "{what}");
            assert_eq!(&bytes(&p["cgroup_bytes"])[12..], name, "{what}");
        }
        let events: Vec<&serde_json::Value> = lines[1..]
            .iter()
            .filter(|l| l["event"] != "STATS")
            .collect();
        assert!(!events.is_empty(), "{what}: {:?}", o.json);
        for ev in events {
            assert_eq!(ev["comm"], *want, "{what}");
            if !is_exact(&s) {
                assert_eq!(bytes(&ev["comm_bytes"]), name, "{what}");
            }
        }

        // Metrics: the label value is the text rule's spelling (then the exposition format's
        // own escaping of `\`).
        assert!(inert(&o.metrics, &what), "{what}: metrics {:?}", o.metrics);
        let label = format!("comm=\"{}\"", shown.replace('\\', "\\\\"));
        assert!(
            o.metrics.contains(&label),
            "{what}: {label} in {}",
            o.metrics
        );

        // Perfetto: valid JSON, names as the text shows them, no raw character anywhere.
        assert!(
            inert(&o.perfetto, &what),
            "{what}: perfetto {:?}",
            o.perfetto
        );
        let trace: serde_json::Value = serde_json::from_str(&o.perfetto).unwrap();
        let names: Vec<&str> = trace["traceEvents"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["name"] == "process_name" && e["pid"] == 4242)
            .map(|e| e["args"]["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, [shown.as_str()], "{what}");
    }
}

fn o_inventory(s: &str) -> Inventory {
    Inventory {
        processes: vec![InventoryProcess {
            pid: 4242,
            comm: s.to_string(),
            cmdline: vec![s.to_string(), "--flag".into()],
            exe: Some(format!("/bin/{s}")),
            cgroup: Some(format!("/user.slice/{s}")),
            gpus: Vec::new(),
            fds: vec![(5, GpuNode::Kfd)],
            mps: None,
        }],
        ..Inventory::default()
    }
}
