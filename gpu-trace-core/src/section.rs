//! Sections: a part of an output line that renders itself, retis's shape. A record's own
//! fields (a driver event's kind as its vendor spells it, an API call, a recursion, the API
//! call a driver event happened in, …) are a [`Section`] in the record's own module; the
//! outputs (`output::text`, `output::json`) write only the common frame (the event's name,
//! time, origin and identity, then the sections, then the cgroup) and name no vendor and no
//! record kind's fields.
//!
//! Sections are static types (no `dyn`): the driver events' lines are the hot path, and each
//! section's methods inline into the writer that calls them.

use serde::Serialize;

use crate::escape;

/// A part of a record's line that writes its own text and JSON fields.
pub trait Section {
    /// Appends the text fields (after the columns the text output writes for every line).
    fn text(&self, line: &mut String);

    /// Appends the JSON fields, each as `,"KEY":VALUE` (the object is open: the frame wrote
    /// its first fields before and closes it after).
    fn json(&self, out: &mut Vec<u8>);
}

/// `,"KEY":` and `value`, terminal-safe (`key` is one of this crate's ASCII names: nothing to
/// escape).
pub fn field<T: Serialize + ?Sized>(out: &mut Vec<u8>, key: &str, value: &T) {
    out.extend_from_slice(b",\"");
    out.extend_from_slice(key.as_bytes());
    out.extend_from_slice(b"\":");
    escape::write_json(out, value);
}

/// `,"KEY":"TEXT"`, or `,"KEY":null` for `None`, where TEXT is one this crate spells in
/// printable ASCII without quotes or backslashes (keys, handles, labels): the bytes serde_json and
/// the terminal-safe escaper write for it, without scanning it twice.
pub fn plain_field(out: &mut Vec<u8>, key: &str, text: Option<&[u8]>) {
    out.extend_from_slice(b",\"");
    out.extend_from_slice(key.as_bytes());
    match text {
        Some(t) => {
            debug_assert!(
                t.iter()
                    .all(|&b| (0x20..0x7f).contains(&b) && !b"\"\\".contains(&b))
            );
            out.extend_from_slice(b"\":\"");
            out.extend_from_slice(t);
            out.push(b'"');
        }
        None => out.extend_from_slice(b"\":null"),
    }
}

/// `value`'s fields after the ones written so far: `value` serializes as an object, whose
/// braces are dropped (what `#[serde(flatten)]` does).
pub fn splice_object<T: Serialize + ?Sized>(out: &mut Vec<u8>, value: &T) {
    let at = out.len();
    escape::write_json(out, value);
    debug_assert!(out[at] == b'{' && out.last() == Some(&b'}'));
    if out.len() - at == 2 {
        // `{}`: no fields.
        out.truncate(at);
    } else {
        out[at] = b',';
        out.pop();
    }
}
