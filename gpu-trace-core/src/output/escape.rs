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
//! # Text output: reversible escaping
//!
//! [`escape_text`] writes ordinary names unchanged; otherwise:
//!
//! | in the name                                                    | printed as          |
//! |----------------------------------------------------------------|---------------------|
//! | backslash                                                      | `\\`                |
//! | line feed, carriage return, tab                                | `\n`, `\r`, `\t`    |
//! | a byte that is not valid UTF-8                                 | `\xNN` (lower-case hex) |
//! | any other control character (C0, DEL, C1), a bidi or invisible format character (U+200B..U+200F, U+2028..U+202E, U+2060..U+2069, U+FEFF) | each of its UTF-8 bytes as `\xNN` |
//!
//! The result holds no control character at all, so it cannot move the cursor, change colours,
//! set a window title (OSC) or forge a line, and [`unescape_text`] turns it back into the exact
//! bytes.
//!
//! # JSON output
//!
//! `comm` is the name as UTF-8 text, each byte that is not valid UTF-8 shown as U+FFFD; where
//! that is not the exact name, `comm_bytes` (an array of the byte values) follows it.
//! [`json_terminal_safe`] also writes DEL and the C1 controls as `\u00NN` (JSON itself only
//! requires it for C0), so a JSON line shown on a terminal is inert too.

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

/// Characters printed as their bytes: controls, and invisible or bidi format characters that
/// can make a line read differently from what it holds.
fn needs_bytes(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{200B}'..='\u{200F}' | '\u{2028}'..='\u{202E}' | '\u{2060}'..='\u{2069}' | '\u{FEFF}')
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
        .any(|c| c == '\\' || needs_bytes(c) || raw_byte(c).is_some())
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
                } else if needs_bytes(c) {
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

/// A serialized JSON line with DEL and the C1 controls written as `\u00NN` escapes (the same
/// JSON value; such characters can only occur inside strings).
pub fn json_terminal_safe(line: String) -> String {
    if !line.chars().any(char::is_control) {
        return line;
    }
    let mut out = String::with_capacity(line.len() + 12);
    for c in line.chars() {
        if c.is_control() {
            out.push_str(&format!("\\u{:04x}", u32::from(c)));
        } else {
            out.push(c);
        }
    }
    out
}

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
