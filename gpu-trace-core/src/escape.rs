//! Strings that come from traced processes (the thread name `comm` today) are untrusted: any
//! process that can open a GPU device can name its threads with escape sequences, CR/LF, bidi
//! controls or bytes that are not UTF-8. This module keeps their bytes exactly and prints them
//! safely.
//!
//! # Carrying the exact bytes
//!
//! [`decode_lossless`] turns the kernel's bytes into a `String` without losing any: valid UTF-8
//! stays as it is; every byte that is not part of valid UTF-8 becomes one character of the
//! private-use range U+10FF80..=U+10FFFF (byte `b` → U+10FF00 + `b`, like Python's
//! `surrogateescape`). A name that really contains one of those rare characters has that
//! character's four bytes carried the same way, so the mapping is one-to-one and
//! [`raw_bytes`] gives back the original bytes.
//!
//! # The rule: which characters are never written as they are
//!
//! One predicate, [`is_hidden`], decides for every output (text, JSON events and the
//! `INVENTORY` line, metrics label values, Perfetto names, `top`, start-up and doctor lines).
//! A character is escaped when it is:
//!
//! | class | characters |
//! |-------|------------|
//! | C0 control, DEL, C1 control (general category Cc) | U+0000..U+001F, U+007F, U+0080..U+009F |
//! | line and paragraph separator (Zl, Zp) | U+2028, U+2029 |
//! | bidi control (all Cf) | U+061C, U+200E, U+200F, U+202A..U+202E, U+2066..U+2069 |
//! | invisible format character (general category Cf) | U+00AD, U+0600..U+0605, U+06DD, U+070F, U+0890..U+0891, U+08E2, U+180E, U+200B..U+200D, U+2060..U+2064, U+206A..U+206F, U+FEFF, U+FFF9..U+FFFB, U+110BD, U+110CD, U+13430..U+1343F, U+1BCA0..U+1BCA3, U+1D173..U+1D17A, U+E0001, the tag block U+E0020..U+E007F |
//! | other default-ignorable code point (renders as nothing) | U+034F, U+115F, U+1160, U+17B4, U+17B5, U+180B..U+180F, U+2065, U+3164, U+FE00..U+FE0F, U+FFA0, U+FFF0..U+FFF8, U+E0000..U+E0FFF |
//!
//! The Cf, Zl and Zp sets are Unicode 16.0's general categories (a unit test checks them
//! against the Unicode data of the machine's Python, where there is one); the last row is
//! Unicode's `Default_Ignorable_Code_Point` property (DerivedCoreProperties.txt) beyond Cf.
//! A byte that is not valid UTF-8 is escaped too, always as `\xNN` or its exact value, never
//! as the internal carrier character nor (outside JSON) as U+FFFD.
//!
//! # Text output: reversible escaping
//!
//! [`escape_text`] writes ordinary names unchanged; otherwise:
//!
//! | in the name                                                    | printed as          |
//! |----------------------------------------------------------------|---------------------|
//! | backslash                                                      | `\\`                |
//! | line feed, carriage return, tab                                | `\n`, `\r`, `\t`    |
//! | a byte that is not valid UTF-8                                 | `\xNN` (lower-case hex) |
//! | any other character of the rule above                          | each of its UTF-8 bytes as `\xNN` |
//!
//! The result holds no character of the rule, so it cannot move the cursor, change colours,
//! set a window title (OSC), forge a line or reorder what a reader sees, and
//! [`unescape_text`] turns it back into the exact bytes. The same text is what metrics label
//! values and Perfetto process and track names carry.
//!
//! # JSON output
//!
//! `comm` is the name as UTF-8 text, each byte that is not valid UTF-8 shown as U+FFFD (a JSON
//! string cannot hold a byte); where that is not the exact name, `comm_bytes` (an array of the
//! byte values) follows it. The `INVENTORY` line does the same for `comm`, `cmdline`, `exe`
//! and `cgroup` (`comm_bytes`, `cmdline_bytes`, `exe_bytes`, `cgroup_bytes`).
//! [`json_terminal_safe`] writes every character of the rule as a `\uXXXX` escape (a
//! surrogate pair above U+FFFF): the same JSON value, so a JSON line shown on a terminal is
//! inert too.

use std::borrow::Cow;

/// Byte `b` (≥ 0x80) that is not valid UTF-8 is carried as `char::from_u32(RAW_BASE + b)`.
const RAW_BASE: u32 = 0x10_FF00;
const RAW_FIRST: char = '\u{10FF80}';
const RAW_LAST: char = '\u{10FFFF}';

fn raw_char(b: u8) -> char {
    char::from_u32(RAW_BASE + u32::from(b)).unwrap_or(char::REPLACEMENT_CHARACTER)
}

/// The byte a carried character stands for, if it is one.
fn raw_byte(c: char) -> Option<u8> {
    (RAW_FIRST..=RAW_LAST)
        .contains(&c)
        .then(|| (u32::from(c) - RAW_BASE) as u8)
}

/// The bytes up to the first NUL as a `String` that keeps every byte (see the module docs).
pub fn decode_lossless(bytes: &[u8]) -> String {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    let mut out = String::with_capacity(end);
    for chunk in bytes[..end].utf8_chunks() {
        for c in chunk.valid().chars() {
            if raw_byte(c).is_some() {
                let mut buf = [0u8; 4];
                out.extend(c.encode_utf8(&mut buf).bytes().map(raw_char));
            } else {
                out.push(c);
            }
        }
        out.extend(chunk.invalid().iter().map(|&b| raw_char(b)));
    }
    out
}

/// The exact bytes a [`decode_lossless`] string came from.
pub fn raw_bytes(s: &str) -> Cow<'_, [u8]> {
    if is_exact(s) {
        return Cow::Borrowed(s.as_bytes());
    }
    let mut out = Vec::with_capacity(s.len());
    for c in s.chars() {
        match raw_byte(c) {
            Some(b) => out.push(b),
            None => out.extend_from_slice(c.encode_utf8(&mut [0u8; 4]).as_bytes()),
        }
    }
    Cow::Owned(out)
}

/// The string is its own bytes (no carried non-UTF-8 byte).
pub fn is_exact(s: &str) -> bool {
    !s.chars().any(|c| raw_byte(c).is_some())
}

/// The name as UTF-8 text for JSON: each carried byte becomes U+FFFD.
pub fn lossy(s: &str) -> Cow<'_, str> {
    if is_exact(s) {
        Cow::Borrowed(s)
    } else {
        Cow::Owned(
            s.chars()
                .map(|c| match raw_byte(c) {
                    Some(_) => char::REPLACEMENT_CHARACTER,
                    None => c,
                })
                .collect(),
        )
    }
}

/// Invisible or bidi format characters and other default-ignorable code points, inclusive
/// ranges in ascending order (the module docs' table without Cc, Zl and Zp).
const HIDDEN: &[(u32, u32)] = &[
    (0x00AD, 0x00AD),
    (0x034F, 0x034F),
    (0x0600, 0x0605),
    (0x061C, 0x061C),
    (0x06DD, 0x06DD),
    (0x070F, 0x070F),
    (0x0890, 0x0891),
    (0x08E2, 0x08E2),
    (0x115F, 0x1160),
    (0x17B4, 0x17B5),
    (0x180B, 0x180F),
    (0x200B, 0x200F),
    (0x202A, 0x202E),
    (0x2060, 0x206F),
    (0x3164, 0x3164),
    (0xFE00, 0xFE0F),
    (0xFEFF, 0xFEFF),
    (0xFFA0, 0xFFA0),
    (0xFFF0, 0xFFFB),
    (0x110BD, 0x110BD),
    (0x110CD, 0x110CD),
    (0x13430, 0x1343F),
    (0x1BCA0, 0x1BCA3),
    (0x1D173, 0x1D17A),
    (0xE0000, 0xE0FFF),
];

/// The one rule (module docs): a character no output writes as it is. Controls (C0, DEL,
/// C1), the line and paragraph separators, bidi controls, invisible format characters and
/// the other default-ignorable code points.
pub fn is_hidden(c: char) -> bool {
    if c.is_control() || matches!(c, '\u{2028}' | '\u{2029}') {
        return true;
    }
    let u = u32::from(c);
    if u < 0xAD {
        return false;
    }
    HIDDEN
        .binary_search_by(|&(lo, hi)| {
            if hi < u {
                std::cmp::Ordering::Less
            } else if lo > u {
                std::cmp::Ordering::Greater
            } else {
                std::cmp::Ordering::Equal
            }
        })
        .is_ok()
}

fn push_hex(out: &mut String, b: u8) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.push_str("\\x");
    out.push(HEX[usize::from(b >> 4)] as char);
    out.push(HEX[usize::from(b & 15)] as char);
}

/// A string from a traced process, safe to print on a terminal or into a log (see the module
/// docs for the escaping). Ordinary names come back unchanged (borrowed).
pub fn escape_text(s: &str) -> Cow<'_, str> {
    if !s
        .chars()
        .any(|c| c == '\\' || is_hidden(c) || raw_byte(c).is_some())
    {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c => {
                if let Some(b) = raw_byte(c) {
                    push_hex(&mut out, b);
                } else if is_hidden(c) {
                    for b in c.encode_utf8(&mut [0u8; 4]).bytes() {
                        push_hex(&mut out, b);
                    }
                } else {
                    out.push(c);
                }
            }
        }
    }
    Cow::Owned(out)
}

/// The exact bytes an [`escape_text`] output stands for; `None` if `s` is not such an output.
pub fn unescape_text(s: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.extend_from_slice(c.encode_utf8(&mut [0u8; 4]).as_bytes());
            continue;
        }
        match chars.next()? {
            '\\' => out.push(b'\\'),
            'n' => out.push(b'\n'),
            'r' => out.push(b'\r'),
            't' => out.push(b'\t'),
            'x' => {
                let hi = chars.next()?.to_digit(16)?;
                let lo = chars.next()?.to_digit(16)?;
                out.push((hi * 16 + lo) as u8);
            }
            _ => return None,
        }
    }
    Some(out)
}

/// A serialized JSON line with every character of the rule (module docs) written as a
/// `\uXXXX` escape: the same JSON value (such characters can only occur inside strings:
/// JSON's own syntax is ASCII). A carried non-UTF-8 byte, which no JSON field should hold,
/// becomes `\ufffd` rather than show the internal carrier.
pub fn json_terminal_safe(line: String) -> String {
    if !line.chars().any(|c| is_hidden(c) || raw_byte(c).is_some()) {
        return line;
    }
    let mut out = String::with_capacity(line.len() + 12);
    for c in line.chars() {
        if raw_byte(c).is_some() {
            out.push_str("\\ufffd");
        } else if is_hidden(c) {
            for unit in c.encode_utf16(&mut [0u16; 2]) {
                out.push_str(&format!("\\u{unit:04x}"));
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// A `serde_json` formatter that writes strings as [`json_terminal_safe`] would leave them:
/// a character that is not the exact byte (U+FFFD-bound) as `\ufffd`, a hidden one as its
/// `\uXXXX` escapes (UTF-16 units). serde_json has already escaped quotes, backslashes and
/// the C0 controls; everything else passes through. One pass, while the line is written.
#[derive(Clone, Copy, Debug, Default)]
pub struct TerminalSafeJson;

impl serde_json::ser::Formatter for TerminalSafeJson {
    fn write_string_fragment<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        fragment: &str,
    ) -> std::io::Result<()> {
        // Printable ASCII (serde_json escaped the C0 controls before this): nothing to do.
        // One pass: every byte below DEL (bytes ≥ 0x80 start non-ASCII characters).
        if fragment.bytes().all(|b| b < 0x7f) {
            return w.write_all(fragment.as_bytes());
        }
        for c in fragment.chars() {
            if raw_byte(c).is_some() {
                w.write_all(b"\\ufffd")?;
            } else if is_hidden(c) {
                for unit in c.encode_utf16(&mut [0u16; 2]) {
                    write!(w, "\\u{unit:04x}")?;
                }
            } else {
                w.write_all(c.encode_utf8(&mut [0u8; 4]).as_bytes())?;
            }
        }
        Ok(())
    }
}

/// Appends `value` as JSON to `out`, strings terminal-safe ([`TerminalSafeJson`]).
///
/// # Panics
///
/// Never for gpu-trace's output types: they always serialize (no maps with non-string keys,
/// no fallible `Serialize` impls), and writing to a `Vec` cannot fail.
pub fn write_json<T: serde::Serialize + ?Sized>(out: &mut Vec<u8>, value: &T) {
    let mut ser = serde_json::Serializer::with_formatter(out, TerminalSafeJson);
    value
        .serialize(&mut ser)
        .expect("gpu-trace's JSON lines always serialize");
}

#[cfg(test)]
#[path = "escape_tests.rs"]
mod every_class;

#[cfg(test)]
mod tests {
    use super::*;

    /// The hostile names of issue 11, as the kernel would hand them over (≤ 15 bytes + NUL).
    const HOSTILE: &[&[u8]] = &[
        b"\x1b[31mEVIL",
        b"\rforged\n",
        b"\"'\\",
        b"\x1b]0;pwn\x07",
        b"a\xffb\xc3",
        b"\xc2\x9b31m",
        b"\xe2\x80\xaeabc",
        b"\xf4\x8f\xbe\x80x",
        b"tab\there\x7f",
    ];

    #[test]
    fn ordinary_names_are_unchanged_and_borrowed() {
        for name in [
            "python3",
            "cuda-EvtHandlr",
            "hip_app",
            "a b",
            "Zürich-ü",
            "",
        ] {
            let s = decode_lossless(name.as_bytes());
            assert_eq!(s, name);
            assert!(matches!(escape_text(&s), Cow::Borrowed(n) if n == name));
            assert!(matches!(lossy(&s), Cow::Borrowed(_)));
            assert!(is_exact(&s));
        }
    }

    #[test]
    fn escapes_are_spelled_as_documented() {
        // Expected strings written by hand from the table in the module docs.
        let cases: &[(&[u8], &str)] = &[
            (b"\x1b[31mEVIL", "\\x1b[31mEVIL"),
            (b"\rforged\n", "\\rforged\\n"),
            (b"\"'\\", "\"'\\\\"),
            (b"\x1b]0;pwn\x07", "\\x1b]0;pwn\\x07"),
            (b"a\xffb\xc3", "a\\xffb\\xc3"),
            (b"\xc2\x9b31m", "\\xc2\\x9b31m"),
            (b"\xe2\x80\xaeabc", "\\xe2\\x80\\xaeabc"),
            (b"\xf4\x8f\xbe\x80x", "\\xf4\\x8f\\xbe\\x80x"),
            (b"tab\there\x7f", "tab\\there\\x7f"),
        ];
        for (raw, want) in cases {
            assert_eq!(escape_text(&decode_lossless(raw)), *want, "{raw:?}");
        }
    }

    #[test]
    fn hostile_names_escape_to_inert_text_and_back_to_their_bytes() {
        for raw in HOSTILE {
            let s = decode_lossless(raw);
            assert_eq!(&*raw_bytes(&s), *raw, "carried exactly");
            let shown = escape_text(&s);
            assert!(!shown.chars().any(|c| c.is_control()), "{shown:?}");
            assert_eq!(unescape_text(&shown).as_deref(), Some(*raw), "{shown:?}");
        }
    }

    #[test]
    fn every_short_byte_string_round_trips() {
        // All one- and two-byte names, and a deterministic spread of longer ones.
        let mut names: Vec<Vec<u8>> = (1..=255u8).map(|b| vec![b]).collect();
        for a in 1..=255u8 {
            for b in (1..=255u8).step_by(7) {
                names.push(vec![a, b]);
            }
        }
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for _ in 0..20_000 {
            let len = (x % 15) as usize + 1;
            let name: Vec<u8> = (0..len)
                .map(|i| {
                    x = x
                        .wrapping_mul(6_364_136_223_846_793_005)
                        .wrapping_add(1 + i as u64);
                    ((x >> 33) as u8).max(1)
                })
                .collect();
            names.push(name);
        }
        for raw in &names {
            let s = decode_lossless(raw);
            assert_eq!(&*raw_bytes(&s), &raw[..]);
            let shown = escape_text(&s);
            assert!(!shown.chars().any(|c| c.is_control()), "{raw:x?}");
            assert_eq!(unescape_text(&shown).as_deref(), Some(&raw[..]), "{raw:x?}");
        }
    }

    #[test]
    fn different_invalid_names_stay_different() {
        let a = decode_lossless(b"x\xff");
        let b = decode_lossless(b"x\xfe");
        assert_ne!(a, b);
        assert_eq!(lossy(&a), "x\u{fffd}");
        assert_eq!(lossy(&b), "x\u{fffd}");
        assert_ne!(escape_text(&a), escape_text(&b));
    }

    #[test]
    fn nul_ends_the_name() {
        assert_eq!(decode_lossless(b"python\0\0junk"), "python");
        assert_eq!(decode_lossless(&[0u8; 16]), "");
    }

    #[test]
    fn json_lines_keep_their_value_without_raw_controls() {
        let line = serde_json::to_string(&serde_json::json!({"comm": "a\u{7f}b\u{9b}c"})).unwrap();
        let safe = json_terminal_safe(line);
        assert_eq!(safe, r#"{"comm":"a\u007fb\u009bc"}"#);
        let back: serde_json::Value = serde_json::from_str(&safe).unwrap();
        assert_eq!(back["comm"], "a\u{7f}b\u{9b}c");
    }
}
