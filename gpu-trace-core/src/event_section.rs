//! A driver event's own fields as a [`Section`]: its kind's, as its vendor spells them. The
//! text fields follow the `TSG=` column (`output::text` writes the columns before it), the JSON
//! fields follow the identity fields (`output::json` writes those, and `gpu_device` and
//! `cgroup` after the sections). A vendor's detail ([`Event::amd`]) renders its own part
//! ([`AmdFields`]) and says which GPU numbering the event's `gpu` is ([`Event::gpu_numbering`]);
//! the kinds' own fields are [`crate::event_fields`]'.

use crate::event::{Event, GpuNumbering};
use crate::event_fields::write_fields;
use crate::model::gpus::GpuIdentity;
use crate::section::{Section, field, splice_object};
use crate::source::amd::render::AmdFields;

/// A driver event's own fields ([module documentation](self)).
pub struct EventFields<'a> {
    event: &'a Event,
    /// The GPU the pipeline found the task on, where known (nvidia-smi's index is the `gpu` of
    /// an event numbered by RM device instance).
    gpu: Option<&'a GpuIdentity>,
}

impl<'a> EventFields<'a> {
    #[inline]
    pub fn new(event: &'a Event, gpu: Option<&'a GpuIdentity>) -> Self {
        Self { event, gpu }
    }
}

impl Section for EventFields<'_> {
    /// The kind's fields, or the vendor detail's where the event has one.
    #[inline]
    fn text(&self, line: &mut String) {
        let kind = &self.event.kind;
        match &self.event.amd {
            Some(detail) => AmdFields::new(kind, detail).text(line),
            None => write_fields(line, kind, self.gpu.map(|g| g.index)),
        }
    }

    /// The kind's fields (the kind serializes itself as an object, spliced in); for the kinds
    /// that name their GPU, `gpu` (and `rm_device`) as the event's numbering says (where the
    /// derive wrote it until the numbers split); then the vendor detail's object.
    #[inline]
    fn json(&self, out: &mut Vec<u8>) {
        let ev = self.event;
        splice_object(out, &ev.kind);
        if let Some(driver) = ev.kind.driver_gpu() {
            match ev.gpu_numbering() {
                GpuNumbering::Driver => field(out, "gpu", &driver),
                GpuNumbering::RmDevice => {
                    field(out, "gpu", &self.gpu.map(|g| g.index));
                    field(out, "rm_device", &driver);
                }
            }
        }
        if let Some(detail) = &ev.amd {
            AmdFields::new(&ev.kind, detail).json(out);
        }
    }
}
