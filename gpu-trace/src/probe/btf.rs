//! Kernel structure offsets from the kernel's own BTF (`/sys/kernel/btf/vmlinux`).
//!
//! The kernel programs read a few fields of `task_struct`, `files_struct`, `fdtable`, `file`,
//! `inode` and `signal_struct` at offsets that userspace writes into their `CONFIG` global
//! ([`gpu_trace_common::KernelConfig`]). This module finds those offsets in the running kernel's
//! BTF, with a small self-contained parser:
//!
//! - the blob is a header (magic `0xeB9F`, version 1), a type section and a string section;
//! - every BTF kind up to `ENUM64` is understood well enough to be skipped with its trailing data,
//!   and an unknown kind is an error rather than a guess;
//! - **little-endian BTF only**: big-endian BTF (whose magic reads as `0x9feb` here) is rejected
//!   with [`BtfError::BadMagic`];
//! - base BTF (vmlinux) and, through [`Btf::from_split`], a module's split BTF on top of it
//!   (module type ids continue after vmlinux's, module string offsets after vmlinux's strings),
//!   so that the deep hooks can find functions, parameters and structs of `amdgpu.ko`.
//!
//! Member lookups descend into anonymous struct and union members and sum their offsets, as C
//! does for `task_struct`'s nested anonymous members.
//!
//! [`KernelBtf::load`] reads vmlinux's BTF once per start, parsed by this reader and by aya
//! (which loads BTF-typed programs only with its own type); callers pass that one value on.
//! Why not `btf-rs` or aya-obj's parser: docs/architecture.md ("Why this reader and not a crate").

use std::io;
use std::path::{Path, PathBuf};

use gpu_trace_common::KernelConfig;

/// Where the kernel exposes its BTF.
pub const VMLINUX_BTF_PATH: &str = "/sys/kernel/btf/vmlinux";

/// The BTF magic, as read little-endian.
const BTF_MAGIC: u16 = 0xeb9f;
/// The only BTF version there is.
const BTF_VERSION: u8 = 1;
/// Size of the header fields this parser reads (`struct btf_header`).
const HEADER_LEN: usize = 24;
/// Size of `struct btf_type`.
const TYPE_LEN: usize = 12;
/// Bound on typedef chains and anonymous-member nesting (guards against loops in bad data).
const MAX_DEPTH: u32 = 64;

/// BTF kinds (`BTF_KIND_*`).
mod kind {
    pub const INT: u32 = 1;
    pub const PTR: u32 = 2;
    pub const ARRAY: u32 = 3;
    pub const STRUCT: u32 = 4;
    pub const UNION: u32 = 5;
    pub const ENUM: u32 = 6;
    pub const FWD: u32 = 7;
    pub const TYPEDEF: u32 = 8;
    pub const VOLATILE: u32 = 9;
    pub const CONST: u32 = 10;
    pub const RESTRICT: u32 = 11;
    pub const FUNC: u32 = 12;
    pub const FUNC_PROTO: u32 = 13;
    pub const VAR: u32 = 14;
    pub const DATASEC: u32 = 15;
    pub const FLOAT: u32 = 16;
    pub const DECL_TAG: u32 = 17;
    pub const TYPE_TAG: u32 = 18;
    pub const ENUM64: u32 = 19;
}

/// What tells the user to report an unsupported or odd kernel.
const REPORT: &str = "please report it to the gpu-trace developers with the output of `uname -r`";

/// Errors from reading the kernel's BTF or looking up offsets in it.
#[derive(Debug, thiserror::Error)]
pub enum BtfError {
    /// The BTF file does not exist.
    #[error(
        "kernel BTF not found at {}: gpu-trace needs a kernel built with CONFIG_DEBUG_INFO_BTF=y \
         (most distribution kernels since 5.x have it)",
        path.display()
    )]
    NotFound {
        /// The path that was tried.
        path: PathBuf,
    },
    /// The BTF file exists but could not be read.
    #[error(
        "cannot read kernel BTF at {}: {source} (check that it is readable by this user; \
         running gpu-trace as root is the usual way)",
        path.display()
    )]
    Read {
        /// The path that was tried.
        path: PathBuf,
        /// What the read returned.
        #[source]
        source: io::Error,
    },
    /// The data does not start with the little-endian BTF magic.
    #[error("{}", bad_magic_message(*found))]
    BadMagic {
        /// The first two bytes, read little-endian.
        found: u16,
    },
    /// The header's version is not 1.
    #[error(
        "kernel BTF has version {version}, gpu-trace reads version {BTF_VERSION} only: \
         this kernel is not supported; {REPORT}"
    )]
    UnsupportedVersion {
        /// The version byte found.
        version: u8,
    },
    /// A section (header, type or string section) ends before its declared end.
    #[error(
        "kernel BTF is truncated in the {section}: {detail}; the data is incomplete \
         (if it came from {VMLINUX_BTF_PATH}, {REPORT})"
    )]
    Truncated {
        /// `"header"`, `"type section"` or `"string section"`.
        section: &'static str,
        /// What was cut short.
        detail: String,
    },
    /// A section holds data that breaks the BTF rules.
    #[error("kernel BTF is malformed in the {section}: {detail}; {REPORT}")]
    Malformed {
        /// `"header"`, `"type section"` or `"string section"`.
        section: &'static str,
        /// What is wrong.
        detail: String,
    },
    /// A name points outside the string section.
    #[error(
        "kernel BTF is malformed in the string section: the name of {referrer} is at offset \
         {offset}, past the end of the {len}-byte string section; {REPORT}"
    )]
    StringOutOfRange {
        /// The name offset found.
        offset: u32,
        /// Length of the string section.
        len: u32,
        /// Which type or member holds the name.
        referrer: String,
    },
    /// A type has a kind this parser does not know (newer kernel).
    #[error(
        "kernel BTF type id {type_id} has kind {kind}, which gpu-trace does not know \
         (the kernel's BTF is newer than this parser): {REPORT}"
    )]
    UnknownKind {
        /// The type id.
        type_id: u32,
        /// The kind number found.
        kind: u32,
    },
    /// No struct of that name.
    #[error(
        "kernel BTF has no struct {struct_name} (needed for {wanted}): this kernel is not \
         supported by gpu-trace; {REPORT}"
    )]
    StructNotFound {
        /// The struct looked for.
        struct_name: String,
        /// What it was needed for (`struct.member`, or its size).
        wanted: String,
    },
    /// The struct exists but has no such member, even inside its anonymous members.
    #[error(
        "kernel BTF: struct {struct_name} has no member {member} (anonymous struct and union \
         members were searched too): this kernel is not supported by gpu-trace; {REPORT}"
    )]
    MemberNotFound {
        /// The struct searched.
        struct_name: String,
        /// The member looked for.
        member: String,
    },
    /// The member is a bitfield that cannot be read as whole bytes.
    #[error(
        "kernel BTF: {struct_name}.{member} is a bitfield ({bits} bits at bit offset \
         {bit_offset}) that gpu-trace cannot read as whole bytes: this kernel is not supported \
         by gpu-trace; {REPORT}"
    )]
    Bitfield {
        /// The struct searched.
        struct_name: String,
        /// The member.
        member: String,
        /// Offset of the member in bits from the start of the struct.
        bit_offset: u64,
        /// Width in bits (0 where the BTF does not say).
        bits: u32,
    },
    /// No function of that name in this BTF (deep hooks: the module lacks it or inlined it).
    #[error("BTF has no function {func}")]
    FuncNotFound {
        /// The function looked for.
        func: String,
    },
    /// The function exists but has no parameter of that name.
    #[error("BTF: function {func} has no parameter named {param}")]
    ParamNotFound {
        /// The function.
        func: String,
        /// The parameter looked for.
        param: String,
    },
    /// The member exists but its size is not the one the kernel programs read.
    #[error(
        "kernel BTF: {struct_name}.{member} is {found} bytes on this kernel, but gpu-trace reads \
         {expected} bytes: this kernel is not supported by gpu-trace; {REPORT}"
    )]
    UnexpectedSize {
        /// The struct.
        struct_name: String,
        /// The member.
        member: String,
        /// Size the kernel programs read.
        expected: u32,
        /// Size in this kernel's BTF.
        found: u32,
    },
}

fn bad_magic_message(found: u16) -> String {
    if found == BTF_MAGIC.swap_bytes() {
        format!(
            "kernel BTF is big-endian (magic read as {found:#06x}): gpu-trace reads \
             little-endian BTF only, so this machine is not supported"
        )
    } else {
        format!(
            "data is not BTF (magic {found:#06x}, expected {BTF_MAGIC:#06x}): gpu-trace needs the \
             raw BTF blob the kernel exposes at {VMLINUX_BTF_PATH}"
        )
    }
}

fn kind_name(k: u32) -> &'static str {
    match k {
        0 => "void",
        kind::INT => "INT",
        kind::PTR => "PTR",
        kind::ARRAY => "ARRAY",
        kind::STRUCT => "STRUCT",
        kind::UNION => "UNION",
        kind::ENUM => "ENUM",
        kind::FWD => "FWD",
        kind::TYPEDEF => "TYPEDEF",
        kind::VOLATILE => "VOLATILE",
        kind::CONST => "CONST",
        kind::RESTRICT => "RESTRICT",
        kind::FUNC => "FUNC",
        kind::FUNC_PROTO => "FUNC_PROTO",
        kind::VAR => "VAR",
        kind::DATASEC => "DATASEC",
        kind::FLOAT => "FLOAT",
        kind::DECL_TAG => "DECL_TAG",
        kind::TYPE_TAG => "TYPE_TAG",
        kind::ENUM64 => "ENUM64",
        _ => "unknown",
    }
}

/// Reads a little-endian `u32` at `pos`; callers have checked the bounds.
fn le32(data: &[u8], pos: usize) -> u32 {
    u32::from_le_bytes([data[pos], data[pos + 1], data[pos + 2], data[pos + 3]])
}

/// One `struct btf_type`, with where its trailing data starts in the blob.
#[derive(Clone, Copy, Debug)]
struct TypeEntry {
    name_off: u32,
    info: u32,
    size_or_type: u32,
    /// Absolute offset of the kind-specific data that follows the 12-byte record.
    extra: u32,
}

impl TypeEntry {
    const VOID: TypeEntry = TypeEntry {
        name_off: 0,
        info: 0,
        size_or_type: 0,
        extra: 0,
    };

    fn kind(&self) -> u32 {
        (self.info >> 24) & 0x1f
    }

    fn vlen(&self) -> u32 {
        self.info & 0xffff
    }

    fn kind_flag(&self) -> bool {
        self.info >> 31 != 0
    }
}

/// One `struct btf_member`.
#[derive(Clone, Copy, Debug)]
struct RawMember {
    name_off: u32,
    type_id: u32,
    /// Bit offset, or (kind_flag structs) bitfield size << 24 | bit offset.
    offset: u32,
}

/// A member found by name, with its offset summed over the anonymous members it sits in.
#[derive(Clone, Copy, Debug)]
struct FoundMember {
    bit_offset: u64,
    type_id: u32,
    /// Bitfield width from a kind_flag struct (0: not a bitfield there).
    bitfield_bits: u32,
    /// The containing struct has kind_flag set (else bitfields are encoded in the INT type).
    kind_flag: bool,
}

/// A parsed BTF blob (little-endian, base BTF).
///
/// Type ids start at 1; id 0 is `void`.
pub struct Btf {
    data: Vec<u8>,
    /// Entry `i` is type id `i`; entry 0 stands for `void`.
    types: Vec<TypeEntry>,
    str_start: usize,
    str_len: usize,
    ptr_size: u32,
    /// Split BTF only: where the module's own strings are (string offsets at or past the
    /// base's `str_len` point here).
    split_strings: Option<(usize, usize)>,
    /// Split BTF only: the first type id that belongs to the module (0 for base BTF).
    first_split_id: u32,
}

impl std::fmt::Debug for Btf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Btf")
            .field("bytes", &self.data.len())
            .field("types", &self.type_count())
            .field("strings", &self.str_len)
            .field("ptr_size", &self.ptr_size)
            .finish()
    }
}

impl Btf {
    /// Parses a BTF blob (copies it).
    pub fn from_bytes(bytes: &[u8]) -> Result<Btf, BtfError> {
        Btf::from_vec(bytes.to_vec())
    }

    /// Reads and parses a BTF file, normally [`VMLINUX_BTF_PATH`].
    pub fn from_path(path: &Path) -> Result<Btf, BtfError> {
        Btf::from_vec(read_blob(path)?)
    }

    fn from_vec(data: Vec<u8>) -> Result<Btf, BtfError> {
        if data.len() >= 2 {
            let magic = u16::from_le_bytes([data[0], data[1]]);
            if magic != BTF_MAGIC {
                return Err(BtfError::BadMagic { found: magic });
            }
        }
        if data.len() < HEADER_LEN {
            return Err(BtfError::Truncated {
                section: "header",
                detail: format!(
                    "the blob is {} bytes, the header alone needs {HEADER_LEN}",
                    data.len()
                ),
            });
        }
        let version = data[2];
        if version != BTF_VERSION {
            return Err(BtfError::UnsupportedVersion { version });
        }
        let hdr_len = le32(&data, 4) as u64;
        if hdr_len < HEADER_LEN as u64 {
            return Err(BtfError::Malformed {
                section: "header",
                detail: format!("header length {hdr_len} is below the minimum {HEADER_LEN}"),
            });
        }
        if hdr_len > data.len() as u64 {
            return Err(BtfError::Truncated {
                section: "header",
                detail: format!(
                    "the header declares {hdr_len} bytes, the blob is {} bytes",
                    data.len()
                ),
            });
        }
        let (type_off, type_len) = (le32(&data, 8) as u64, le32(&data, 12) as u64);
        let (str_off, str_len) = (le32(&data, 16) as u64, le32(&data, 20) as u64);
        let type_start = hdr_len + type_off;
        let type_end = type_start + type_len;
        if type_end > data.len() as u64 {
            return Err(BtfError::Truncated {
                section: "type section",
                detail: format!(
                    "it should span bytes {type_start}..{type_end}, the blob is {} bytes",
                    data.len()
                ),
            });
        }
        let str_start = hdr_len + str_off;
        let str_end = str_start + str_len;
        if str_end > data.len() as u64 {
            return Err(BtfError::Truncated {
                section: "string section",
                detail: format!(
                    "it should span bytes {str_start}..{str_end}, the blob is {} bytes",
                    data.len()
                ),
            });
        }
        if str_len == 0 || data[str_start as usize] != 0 {
            return Err(BtfError::Malformed {
                section: "string section",
                detail: "it does not start with the empty string".into(),
            });
        }
        if data[str_end as usize - 1] != 0 {
            return Err(BtfError::Malformed {
                section: "string section",
                detail: "its last string is not NUL-terminated".into(),
            });
        }
        // All offsets now fit in the blob, whose length is a usize: the casts below are exact.
        let mut btf = Btf {
            types: Vec::new(),
            str_start: str_start as usize,
            str_len: str_len as usize,
            ptr_size: 0,
            data: Vec::new(),
            split_strings: None,
            first_split_id: 0,
        };
        btf.types = parse_types(
            &data,
            type_start as usize,
            type_end as usize,
            str_len as u32,
        )?;
        btf.data = data;
        btf.ptr_size = btf.find_ptr_size();
        Ok(btf)
    }

    /// Number of types, not counting `void` (the largest type id).
    pub fn type_count(&self) -> usize {
        self.types.len() - 1
    }

    /// Reads a module's split BTF (`/sys/kernel/btf/<module>`) on top of `base` (vmlinux's):
    /// the result resolves ids and names of both, as the kernel numbers them (module ids
    /// continue after the base's last id).
    pub fn from_split(base: &Btf, bytes: &[u8]) -> Result<Btf, BtfError> {
        if base.first_split_id != 0 {
            return Err(BtfError::Malformed {
                section: "header",
                detail: "split BTF must sit on base BTF, not on another split BTF".into(),
            });
        }
        if bytes.len() >= 2 {
            let magic = u16::from_le_bytes([bytes[0], bytes[1]]);
            if magic != BTF_MAGIC {
                return Err(BtfError::BadMagic { found: magic });
            }
        }
        if bytes.len() < HEADER_LEN {
            return Err(BtfError::Truncated {
                section: "header",
                detail: format!("the split blob is {} bytes", bytes.len()),
            });
        }
        let hdr_len = le32(bytes, 4) as u64;
        let (type_off, type_len) = (le32(bytes, 8) as u64, le32(bytes, 12) as u64);
        let (str_off, str_len) = (le32(bytes, 16) as u64, le32(bytes, 20) as u64);
        let len = bytes.len() as u64;
        if hdr_len < HEADER_LEN as u64
            || hdr_len + type_off + type_len > len
            || hdr_len + str_off + str_len > len
        {
            return Err(BtfError::Truncated {
                section: "header",
                detail: format!("split BTF sections do not fit in its {len} bytes"),
            });
        }
        if str_len > 0 && bytes[(hdr_len + str_off + str_len) as usize - 1] != 0 {
            return Err(BtfError::Malformed {
                section: "string section",
                detail: "the split BTF's last string is not NUL-terminated".into(),
            });
        }
        let at = base.data.len();
        let mut data = Vec::with_capacity(at + bytes.len());
        data.extend_from_slice(&base.data);
        data.extend_from_slice(bytes);
        let total_strings =
            u32::try_from(base.str_len as u64 + str_len).map_err(|_| BtfError::Malformed {
                section: "string section",
                detail: "too large".into(),
            })?;
        let type_start = at + (hdr_len + type_off) as usize;
        let mut split_types = parse_types(
            &data,
            type_start,
            type_start + type_len as usize,
            total_strings,
        )?;
        split_types.remove(0); // parse_types puts `void` first; the base has it already
        let mut types = base.types.clone();
        let first_split_id = types.len() as u32;
        types.extend(split_types);
        Ok(Btf {
            types,
            str_start: base.str_start,
            str_len: base.str_len,
            ptr_size: base.ptr_size,
            split_strings: Some((at + (hdr_len + str_off) as usize, str_len as usize)),
            first_split_id,
            data,
        })
    }

    /// The id of the first FUNC named `name`, searching the module's own types first (split
    /// BTF), then the base.
    pub fn func_id(&self, name: &str) -> Result<u32, BtfError> {
        let name_b = name.as_bytes();
        let is_it = |i: usize| {
            let t = &self.types[i];
            t.kind() == kind::FUNC && t.name_off != 0 && self.str_at(t.name_off) == name_b
        };
        let split = self.first_split_id as usize;
        (split.max(1)..self.types.len())
            .chain(1..split)
            .find(|&i| is_it(i))
            .map(|i| i as u32)
            .ok_or_else(|| BtfError::FuncNotFound { func: name.into() })
    }

    /// Parameter `i` of FUNC_PROTO `proto`, a `struct btf_param`: (name offset, type id).
    fn proto_param(&self, proto: &TypeEntry, i: u32) -> (u32, u32) {
        let at = proto.extra as usize + i as usize * 8;
        (le32(&self.data, at), le32(&self.data, at + 4))
    }

    /// The 0-based position of parameter `param` of function `func`, and the function's number
    /// of parameters.
    pub fn func_param(&self, func: &str, param: &str) -> Result<(u32, u32), BtfError> {
        let id = self.func_id(func)?;
        let proto = *self.ty(self.types[id as usize].size_or_type)?;
        if proto.kind() != kind::FUNC_PROTO {
            return Err(BtfError::Malformed {
                section: "type section",
                detail: format!("function {func} does not point at a FUNC_PROTO"),
            });
        }
        let count = proto.vlen();
        (0..count)
            .find(|&i| {
                let (name_off, _) = self.proto_param(&proto, i);
                name_off != 0 && self.str_at(name_off) == param.as_bytes()
            })
            .map(|i| (i, count))
            .ok_or_else(|| BtfError::ParamNotFound {
                func: func.into(),
                param: param.into(),
            })
    }

    /// The position of the parameter of type `struct pointee *` in the function-pointer member
    /// `member` of `struct struct_name` (an operations table such as `mqd_manager.init_mqd`),
    /// and the parameter count. By type, since the prototypes of function pointers carry no
    /// parameter names. For functions that BTF leaves out (pahole drops a static function whose
    /// name several files define, e.g. amdgpu's `init_mqd` on Debian's 7.2 kernel).
    pub fn member_fn_param(
        &self,
        struct_name: &str,
        member: &str,
        pointee: &str,
    ) -> Result<(u32, u32), BtfError> {
        let found = self.find_member(struct_name, member)?;
        let wanted = || BtfError::ParamNotFound {
            func: format!("{struct_name}.{member}"),
            param: format!("struct {pointee} *"),
        };
        let ptr = self.skip_modifiers(found.type_id)?;
        if self.ty(ptr)?.kind() != kind::PTR {
            return Err(wanted());
        }
        let proto_id = self.skip_modifiers(self.types[ptr as usize].size_or_type)?;
        let proto = *self.ty(proto_id)?;
        if proto.kind() != kind::FUNC_PROTO {
            return Err(wanted());
        }
        let count = proto.vlen();
        for i in 0..count {
            let (_, param_type) = self.proto_param(&proto, i);
            let p = self.skip_modifiers(param_type)?;
            if self.ty(p)?.kind() != kind::PTR {
                continue;
            }
            let target = self.skip_modifiers(self.types[p as usize].size_or_type)?;
            let t = self.ty(target)?;
            if t.kind() == kind::STRUCT
                && t.name_off != 0
                && self.str_at(t.name_off) == pointee.as_bytes()
            {
                return Ok((i, count));
            }
        }
        Err(wanted())
    }

    /// Whether the string section holds `name` whole (an enum value such as
    /// `BPF_FUNC_task_pt_regs` is there when the kernel knows that helper).
    pub fn has_string(&self, name: &str) -> bool {
        btf_strings_contain(&self.data, name)
    }

    /// Size of a kernel pointer in bytes: the size of `long` in this BTF (the host's pointer size
    /// where the BTF has no `long`, which no kernel BTF lacks).
    pub fn pointer_size(&self) -> u32 {
        self.ptr_size
    }

    /// Byte offset of `member` in `struct struct_name`: the first STRUCT (not forward
    /// declaration, not union) of that name; the member may sit inside anonymous struct or union
    /// members, whose offsets are added.
    ///
    /// Fails for bitfields that do not start on a byte boundary.
    pub fn member_offset(&self, struct_name: &str, member: &str) -> Result<u32, BtfError> {
        let found = self.find_member(struct_name, member)?;
        let bit_offset = found.bit_offset + self.int_bitfield(&found)?.map_or(0, |(off, _)| off);
        if !bit_offset.is_multiple_of(8) {
            let bits = match self.int_bitfield(&found)? {
                Some((_, bits)) => bits,
                None => found.bitfield_bits,
            };
            return Err(BtfError::Bitfield {
                struct_name: struct_name.into(),
                member: member.into(),
                bit_offset,
                bits,
            });
        }
        u32::try_from(bit_offset / 8).map_err(|_| BtfError::Malformed {
            section: "type section",
            detail: format!("{struct_name}.{member} is at bit offset {bit_offset}, out of range"),
        })
    }

    /// Size in bytes of `member` in `struct struct_name` (found as by [`Btf::member_offset`]).
    ///
    /// Fails for any bitfield member, byte-aligned or not.
    pub fn member_size(&self, struct_name: &str, member: &str) -> Result<u32, BtfError> {
        let found = self.find_member(struct_name, member)?;
        let bitfield = match self.int_bitfield(&found)? {
            Some((off, bits)) => Some((found.bit_offset + off, bits)),
            None if found.bitfield_bits != 0 => Some((found.bit_offset, found.bitfield_bits)),
            None => None,
        };
        if let Some((bit_offset, bits)) = bitfield {
            return Err(BtfError::Bitfield {
                struct_name: struct_name.into(),
                member: member.into(),
                bit_offset,
                bits,
            });
        }
        self.type_size(found.type_id)
    }

    /// `sizeof(struct name)`, for the first STRUCT of that name.
    pub fn struct_size(&self, name: &str) -> Result<u32, BtfError> {
        let id = self
            .find_struct(name)
            .ok_or_else(|| BtfError::StructNotFound {
                struct_name: name.into(),
                wanted: format!("sizeof(struct {name})"),
            })?;
        Ok(self.types[id as usize].size_or_type)
    }

    /// Size in bytes of a type, following typedefs and modifiers, multiplying out arrays.
    fn type_size(&self, type_id: u32) -> Result<u32, BtfError> {
        let size = self.type_size_at(type_id, 0)?;
        u32::try_from(size).map_err(|_| BtfError::Malformed {
            section: "type section",
            detail: format!("type id {type_id} is {size} bytes, too large"),
        })
    }

    fn type_size_at(&self, type_id: u32, depth: u32) -> Result<u64, BtfError> {
        if depth > MAX_DEPTH {
            return Err(too_deep(type_id));
        }
        let t = self.ty(type_id)?;
        match t.kind() {
            kind::INT
            | kind::ENUM
            | kind::ENUM64
            | kind::STRUCT
            | kind::UNION
            | kind::FLOAT
            | kind::DATASEC => Ok(t.size_or_type.into()),
            kind::PTR => Ok(self.ptr_size.into()),
            kind::TYPEDEF
            | kind::VOLATILE
            | kind::CONST
            | kind::RESTRICT
            | kind::TYPE_TAG
            | kind::VAR => self.type_size_at(t.size_or_type, depth + 1),
            kind::ARRAY => {
                let elem = le32(&self.data, t.extra as usize);
                let nelems = le32(&self.data, t.extra as usize + 8);
                let elem_size = self.type_size_at(elem, depth + 1)?;
                elem_size
                    .checked_mul(nelems.into())
                    .ok_or_else(|| BtfError::Malformed {
                        section: "type section",
                        detail: format!("array type id {type_id} is too large"),
                    })
            }
            k => Err(BtfError::Malformed {
                section: "type section",
                detail: format!("type id {type_id} ({}) has no size", kind_name(k)),
            }),
        }
    }

    /// The type entry of an id, or an error naming the bad reference.
    fn ty(&self, type_id: u32) -> Result<&TypeEntry, BtfError> {
        self.types
            .get(type_id as usize)
            .ok_or_else(|| BtfError::Malformed {
                section: "type section",
                detail: format!(
                    "type id {type_id} is referenced but there are only {} types",
                    self.type_count()
                ),
            })
    }

    /// The NUL-terminated string at `off` (checked in range when parsing), without the NUL.
    fn str_at(&self, off: u32) -> &[u8] {
        let rest = match self.split_strings {
            Some((start, len)) if off as usize >= self.str_len => {
                &self.data[start + (off as usize - self.str_len)..start + len]
            }
            _ => &self.data[self.str_start + off as usize..self.str_start + self.str_len],
        };
        // The section ends with a NUL (checked when parsing).
        let len = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
        &rest[..len]
    }

    /// Member `i` of a STRUCT or UNION entry.
    fn member(&self, t: &TypeEntry, i: u32) -> RawMember {
        let pos = t.extra as usize + i as usize * 12;
        RawMember {
            name_off: le32(&self.data, pos),
            type_id: le32(&self.data, pos + 4),
            offset: le32(&self.data, pos + 8),
        }
    }

    /// Follows TYPEDEF, CONST, VOLATILE, RESTRICT and TYPE_TAG to the underlying type id.
    fn skip_modifiers(&self, mut type_id: u32) -> Result<u32, BtfError> {
        for _ in 0..MAX_DEPTH {
            match self.ty(type_id)?.kind() {
                kind::TYPEDEF | kind::CONST | kind::VOLATILE | kind::RESTRICT | kind::TYPE_TAG => {
                    type_id = self.types[type_id as usize].size_or_type;
                }
                _ => return Ok(type_id),
            }
        }
        Err(too_deep(type_id))
    }

    /// The first STRUCT (kind STRUCT, so never a FWD) named `name`.
    fn find_struct(&self, name: &str) -> Option<u32> {
        let name = name.as_bytes();
        self.types
            .iter()
            .position(|t| {
                t.kind() == kind::STRUCT && t.name_off != 0 && self.str_at(t.name_off) == name
            })
            .map(|i| i as u32)
    }

    fn find_member(&self, struct_name: &str, member: &str) -> Result<FoundMember, BtfError> {
        let id = self
            .find_struct(struct_name)
            .ok_or_else(|| BtfError::StructNotFound {
                struct_name: struct_name.into(),
                wanted: format!("{struct_name}.{member}"),
            })?;
        let not_found = || BtfError::MemberNotFound {
            struct_name: struct_name.into(),
            member: member.into(),
        };
        if member.is_empty() {
            return Err(not_found());
        }
        self.find_in(id, member.as_bytes(), 0, 0)?
            .ok_or_else(not_found)
    }

    /// Depth-first search of a STRUCT/UNION's members, descending into anonymous struct and
    /// union members; `base_bits` is the bit offset of `type_id` in the outermost struct.
    fn find_in(
        &self,
        type_id: u32,
        member: &[u8],
        base_bits: u64,
        depth: u32,
    ) -> Result<Option<FoundMember>, BtfError> {
        if depth > MAX_DEPTH {
            return Err(too_deep(type_id));
        }
        let t = *self.ty(type_id)?;
        let kind_flag = t.kind_flag();
        for i in 0..t.vlen() {
            let m = self.member(&t, i);
            let (bits, bitfield_bits) = if kind_flag {
                (m.offset & 0x00ff_ffff, m.offset >> 24)
            } else {
                (m.offset, 0)
            };
            let bit_offset = base_bits + u64::from(bits);
            if m.name_off != 0 {
                if self.str_at(m.name_off) == member {
                    return Ok(Some(FoundMember {
                        bit_offset,
                        type_id: m.type_id,
                        bitfield_bits,
                        kind_flag,
                    }));
                }
                continue;
            }
            let inner = self.skip_modifiers(m.type_id)?;
            if matches!(
                self.types[inner as usize].kind(),
                kind::STRUCT | kind::UNION
            ) && let Some(found) = self.find_in(inner, member, bit_offset, depth + 1)?
            {
                return Ok(Some(found));
            }
        }
        Ok(None)
    }

    /// For members of structs without kind_flag, a bitfield is encoded in the INT type itself:
    /// returns its (extra bit offset, bit width) when the member is such a bitfield.
    fn int_bitfield(&self, found: &FoundMember) -> Result<Option<(u64, u32)>, BtfError> {
        if found.kind_flag {
            return Ok(None);
        }
        let t = self.ty(found.type_id)?;
        if t.kind() != kind::INT {
            return Ok(None);
        }
        let encoding = le32(&self.data, t.extra as usize);
        let bits = encoding & 0xff;
        let offset = (encoding >> 16) & 0xff;
        if offset != 0 || u64::from(bits) != u64::from(t.size_or_type) * 8 {
            Ok(Some((offset.into(), bits)))
        } else {
            Ok(None)
        }
    }

    /// Size of `long` in this BTF (as libbpf determines the pointer size).
    fn find_ptr_size(&self) -> u32 {
        const LONGS: [&[u8]; 4] = [b"long int", b"long unsigned int", b"unsigned long", b"long"];
        self.types
            .iter()
            .filter(|t| t.kind() == kind::INT && t.name_off != 0)
            .filter(|t| LONGS.contains(&self.str_at(t.name_off)))
            .map(|t| t.size_or_type)
            .find(|&s| s == 4 || s == 8)
            .unwrap_or(size_of::<usize>() as u32)
    }
}

fn too_deep(type_id: u32) -> BtfError {
    BtfError::Malformed {
        section: "type section",
        detail: format!(
            "type id {type_id} is more than {MAX_DEPTH} levels deep in typedefs or nested \
             members (a loop?)"
        ),
    }
}

/// Walks the type section: checks every record and its trailing data fit, every kind is known
/// and every name is inside the string section.
fn parse_types(
    data: &[u8],
    start: usize,
    end: usize,
    str_len: u32,
) -> Result<Vec<TypeEntry>, BtfError> {
    // vmlinux has roughly one type per 40 bytes of type section.
    let mut types = Vec::with_capacity((end - start) / 32 + 1);
    types.push(TypeEntry::VOID);
    let check_name = |off: u32, referrer: &dyn Fn() -> String| {
        if off >= str_len {
            Err(BtfError::StringOutOfRange {
                offset: off,
                len: str_len,
                referrer: referrer(),
            })
        } else {
            Ok(())
        }
    };
    let mut pos = start;
    while pos < end {
        let type_id = types.len() as u32;
        if end - pos < TYPE_LEN {
            return Err(BtfError::Truncated {
                section: "type section",
                detail: format!(
                    "type id {type_id} at byte {pos} needs {TYPE_LEN} bytes, {} remain",
                    end - pos
                ),
            });
        }
        let t = TypeEntry {
            name_off: le32(data, pos),
            info: le32(data, pos + 4),
            size_or_type: le32(data, pos + 8),
            extra: (pos + TYPE_LEN) as u32,
        };
        check_name(t.name_off, &|| format!("type id {type_id}"))?;
        let vlen = t.vlen() as usize;
        // (size of each trailing record, count, offset of a name in each record)
        let (rec, count, name_at): (usize, usize, Option<usize>) = match t.kind() {
            kind::INT => (4, 1, None),
            kind::PTR
            | kind::FWD
            | kind::TYPEDEF
            | kind::VOLATILE
            | kind::CONST
            | kind::RESTRICT
            | kind::FUNC
            | kind::FLOAT
            | kind::TYPE_TAG => (0, 0, None),
            kind::ARRAY => (12, 1, None),
            kind::STRUCT | kind::UNION => (12, vlen, Some(0)),
            kind::ENUM => (8, vlen, Some(0)),
            kind::FUNC_PROTO => (8, vlen, Some(0)),
            kind::VAR => (4, 1, None),
            kind::DATASEC => (12, vlen, None),
            kind::DECL_TAG => (4, 1, None),
            kind::ENUM64 => (12, vlen, Some(0)),
            k => return Err(BtfError::UnknownKind { type_id, kind: k }),
        };
        let extra = pos + TYPE_LEN;
        let extra_len = rec * count;
        if end - extra < extra_len {
            return Err(BtfError::Truncated {
                section: "type section",
                detail: format!(
                    "type id {type_id} ({}) needs {extra_len} bytes after its header, {} remain",
                    kind_name(t.kind()),
                    end - extra
                ),
            });
        }
        if let Some(name_at) = name_at {
            for i in 0..count {
                let off = le32(data, extra + i * rec + name_at);
                check_name(off, &|| {
                    format!("member {i} of type id {type_id} ({})", kind_name(t.kind()))
                })?;
            }
        }
        types.push(t);
        pos = extra + extra_len;
    }
    Ok(types)
}

/// A BTF file's bytes.
fn read_blob(path: &Path) -> Result<Vec<u8>, BtfError> {
    std::fs::read(path).map_err(|source| {
        if source.kind() == io::ErrorKind::NotFound {
            BtfError::NotFound {
                path: path.to_path_buf(),
            }
        } else {
            BtfError::Read {
                path: path.to_path_buf(),
                source,
            }
        }
    })
}

/// vmlinux's BTF, read and parsed once per start and passed to whoever needs it: this module's
/// parse (structure offsets, function parameters, the base of modules' split BTF) and aya's
/// parse of the same bytes (aya loads BTF-typed programs, `tp_btf` and `lsm`, only with its own
/// type, and aya-obj offers no member offsets or split BTF).
pub struct KernelBtf {
    pub vmlinux: Btf,
    /// aya's parse, `None` where aya refuses the blob (then `tp_btf` and `lsm` programs cannot
    /// load, and the loader says so).
    pub aya: Option<aya::Btf>,
}

impl KernelBtf {
    /// Reads [`VMLINUX_BTF_PATH`] once and parses it with both parsers.
    pub fn load() -> Result<KernelBtf, BtfError> {
        let bytes = read_blob(Path::new(VMLINUX_BTF_PATH))?;
        let aya = aya::Btf::parse(&bytes, aya::Endianness::default()).ok();
        Ok(KernelBtf {
            vmlinux: Btf::from_vec(bytes)?,
            aya,
        })
    }
}

/// The kernel structure offsets the kernel programs need (bytes), resolved in `btf`, as a
/// [`KernelConfig`] whose other fields are all 0 (not `ready`): the loader fills in the rest.
/// Checks that each member has the size the kernel programs read there (8-byte pointers,
/// 4-byte `max_fds`, `i_rdev` and `live`).
pub fn kernel_offsets(btf: &Btf) -> Result<KernelConfig, BtfError> {
    let get = |struct_name: &str, member: &str, expected: u32| {
        let offset = btf.member_offset(struct_name, member)?;
        let found = btf.member_size(struct_name, member)?;
        if found != expected {
            return Err(BtfError::UnexpectedSize {
                struct_name: struct_name.into(),
                member: member.into(),
                expected,
                found,
            });
        }
        Ok(offset)
    };
    Ok(KernelConfig {
        task_files: get("task_struct", "files", 8)?,
        files_fdt: get("files_struct", "fdt", 8)?,
        fdt_max_fds: get("fdtable", "max_fds", 4)?,
        fdt_fd: get("fdtable", "fd", 8)?,
        file_inode: get("file", "f_inode", 8)?,
        inode_rdev: get("inode", "i_rdev", 4)?,
        task_signal: get("task_struct", "signal", 8)?,
        signal_live: get("signal_struct", "live", 4)?,
        task_group_leader: get("task_struct", "group_leader", 8)?,
        task_thread_pid: get("task_struct", "thread_pid", 8)?,
        pid_level: get("pid", "level", 4)?,
        // A flexible array: its offset, and the element size from `struct upid`.
        pid_numbers: btf.member_offset("pid", "numbers")?,
        upid_size: btf.struct_size("upid")?,
        ..KernelConfig::default()
    })
}

/// The helpers a gpu_ext hook program calls to find its thread's user registers: since Linux
/// 5.15 (`bpf_task_pt_regs`; it wants `bpf_get_current_task_btf`'s pointer, 5.11).
pub const TASK_PT_REGS_HELPERS: [&str; 2] =
    ["BPF_FUNC_get_current_task_btf", "BPF_FUNC_task_pt_regs"];

/// x86-64 and arm64 kernel stacks without KASAN: 16 KiB (`THREAD_SIZE`).
const THREAD_SIZE: u32 = 16 * 1024;

/// For kernels without [`TASK_PT_REGS_HELPERS`] (vmlinux's `enum bpf_func_id` lacks them):
/// `task_struct.stack` and where the user registers sit from the stack's base
/// (`THREAD_SIZE - sizeof(struct pt_regs)`, as the kernel's `task_pt_regs()` computes on
/// x86-64). `(0, 0)` where the helpers exist: the programs use them.
pub fn stack_regs(btf: &Btf) -> Result<(u16, u16), BtfError> {
    if TASK_PT_REGS_HELPERS.iter().all(|h| btf.has_string(h)) {
        return Ok((0, 0));
    }
    let stack = btf.member_offset("task_struct", "stack")?;
    let regs = THREAD_SIZE - btf.struct_size("pt_regs")?;
    let narrow = |v: u32| u16::try_from(v).unwrap_or(0);
    Ok((narrow(stack), narrow(regs)))
}

/// Where the kernel exposes the BTF of loaded module `module` (split on vmlinux's).
pub fn module_btf_path(module: &str) -> String {
    format!("/sys/kernel/btf/{module}")
}

/// The raw BTF of loaded module `module`.
pub fn read_module_btf(module: &str) -> io::Result<Vec<u8>> {
    std::fs::read(module_btf_path(module))
}

/// The size of vmlinux's BTF in bytes, or why it cannot be read.
pub fn vmlinux_btf_size() -> Result<u64, String> {
    std::fs::metadata(VMLINUX_BTF_PATH)
        .map(|m| m.len())
        .map_err(|e| format!("{VMLINUX_BTF_PATH}: {e}"))
}

/// Whether a BTF blob's bytes hold `name` as a whole NUL-terminated string (a split module BTF
/// stores the names of the module's own functions in its string section).
pub fn btf_strings_contain(bytes: &[u8], name: &str) -> bool {
    let mut needle = Vec::with_capacity(name.len() + 2);
    needle.push(0);
    needle.extend_from_slice(name.as_bytes());
    needle.push(0);
    bytes.windows(needle.len()).any(|w| w == needle.as_slice())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::OnceLock;

    /// The live BTF bytes, or `None` (after a loud SKIPPED line) where the kernel has none.
    fn live_bytes(test: &str) -> Option<&'static [u8]> {
        static BYTES: OnceLock<Option<Vec<u8>>> = OnceLock::new();
        let bytes = BYTES.get_or_init(|| match std::fs::read(VMLINUX_BTF_PATH) {
            Ok(b) => Some(b),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => panic!("{VMLINUX_BTF_PATH} exists but cannot be read: {e}"),
        });
        if bytes.is_none() {
            gpu_trace_core::skip::skipped(
                test,
                format!("no {VMLINUX_BTF_PATH}: this kernel exposes no BTF, nothing was checked"),
            );
        }
        bytes.as_deref()
    }

    /// The live BTF, parsed once.
    fn live_btf(test: &str) -> Option<&'static Btf> {
        static BTF: OnceLock<Btf> = OnceLock::new();
        let bytes = live_bytes(test)?;
        Some(BTF.get_or_init(|| Btf::from_bytes(bytes).expect("the live BTF must parse")))
    }

    fn set32(b: &mut [u8], pos: usize, v: u32) {
        b[pos..pos + 4].copy_from_slice(&v.to_le_bytes());
    }

    /// Offset of the type section in the blob, and its length.
    fn type_section(b: &[u8]) -> (usize, usize) {
        let hdr = le32(b, 4) as usize;
        (hdr + le32(b, 8) as usize, le32(b, 12) as usize)
    }

    #[test]
    fn module_btf_strings_are_matched_whole() {
        let blob = b"\x9f\xeb\x01\0...\0nvidia_unlocked_ioctl\0nvidia_open\0";
        assert!(btf_strings_contain(blob, "nvidia_unlocked_ioctl"));
        assert!(btf_strings_contain(blob, "nvidia_open"));
        assert!(!btf_strings_contain(blob, "nvidia_unlocked"));
        assert!(!btf_strings_contain(blob, "ioctl"));
    }

    #[test]
    fn live_offsets_resolve_and_are_consistent() {
        let Some(btf) = live_btf("live_offsets_resolve_and_are_consistent") else {
            return;
        };
        let off = kernel_offsets(btf).expect("all 8 offsets must resolve");
        crate::say!("kernel offsets: {off:?} ({} types)", btf.type_count());

        // Each offset, plus the member's size, lies inside its struct.
        let pairs = [
            (off.task_files, "task_struct", "files"),
            (off.files_fdt, "files_struct", "fdt"),
            (off.fdt_max_fds, "fdtable", "max_fds"),
            (off.fdt_fd, "fdtable", "fd"),
            (off.file_inode, "file", "f_inode"),
            (off.inode_rdev, "inode", "i_rdev"),
            (off.task_signal, "task_struct", "signal"),
            (off.signal_live, "signal_struct", "live"),
        ];
        for (value, s, m) in pairs {
            assert_eq!(value, btf.member_offset(s, m).unwrap(), "{s}.{m}");
            let size = btf.member_size(s, m).unwrap();
            let struct_size = btf.struct_size(s).unwrap();
            assert!(
                value + size <= struct_size,
                "{s}.{m}: offset {value} + size {size} is outside sizeof {struct_size}"
            );
            // Natural alignment: every one of these is a pointer or a 4-byte integer.
            assert!(
                value.is_multiple_of(size),
                "{s}.{m} at {value} is not {size}-aligned"
            );
        }
        assert_ne!(off.fdt_fd, off.fdt_max_fds);
        assert_ne!(off.task_files, off.task_signal);
        // `struct fdtable { unsigned int max_fds; struct file **fd; ... }` on every kernel.
        assert_eq!(off.fdt_max_fds, 0);
        assert_eq!(btf.member_size("inode", "i_rdev").unwrap(), 4);
        assert_eq!(btf.member_size("signal_struct", "live").unwrap(), 4);
        assert_eq!(
            btf.member_size("fdtable", "fd").unwrap(),
            btf.pointer_size()
        );
        // `struct list_head { next, prev }` has not changed in decades.
        let ptr = btf.pointer_size();
        assert_eq!(btf.member_offset("list_head", "next").unwrap(), 0);
        assert_eq!(btf.member_offset("list_head", "prev").unwrap(), ptr);
        assert_eq!(btf.struct_size("list_head").unwrap(), 2 * ptr);
        #[cfg(target_pointer_width = "64")]
        assert_eq!(ptr, 8);
        // The big structs are big.
        assert!(btf.struct_size("task_struct").unwrap() > 1024);
    }

    #[test]
    fn offsets_fill_exactly_the_offset_fields() {
        let Some(btf) = live_btf("offsets_fill_exactly_the_offset_fields") else {
            return;
        };
        let cfg = kernel_offsets(btf).unwrap();
        // Every other field is the loader's: 0 here, and not ready.
        let only_offsets = KernelConfig {
            task_files: cfg.task_files,
            files_fdt: cfg.files_fdt,
            fdt_max_fds: cfg.fdt_max_fds,
            fdt_fd: cfg.fdt_fd,
            file_inode: cfg.file_inode,
            inode_rdev: cfg.inode_rdev,
            task_signal: cfg.task_signal,
            signal_live: cfg.signal_live,
            nv_major: 0,
            extra_rdev: 0,
            filter_tgid: 0,
            kfd_major: 0,
            extra_kfd_rdev: 0,
            ready: 0,
            filter_cgroups: 0,
            deny_cgroups: 0,
            task_group_leader: cfg.task_group_leader,
            task_thread_pid: cfg.task_thread_pid,
            pid_level: cfg.pid_level,
            pid_numbers: cfg.pid_numbers,
            upid_size: cfg.upid_size,
            task_stack: 0,
            stack_regs: 0,
        };
        assert_eq!(cfg, only_offsets);
        assert_eq!(
            cfg.task_files,
            btf.member_offset("task_struct", "files").unwrap()
        );
        assert_eq!(
            cfg.signal_live,
            btf.member_offset("signal_struct", "live").unwrap()
        );
    }

    #[test]
    fn kernel_btf_load_matches_from_btf() {
        let Some(btf) = live_btf("kernel_btf_load_matches_from_btf") else {
            return;
        };
        // The one parse per start gives the same offsets, and aya takes the same bytes.
        let once = KernelBtf::load().unwrap();
        assert_eq!(
            kernel_offsets(&once.vmlinux).unwrap(),
            kernel_offsets(btf).unwrap()
        );
        assert!(once.aya.is_some(), "aya refused the live vmlinux BTF");
    }

    /// The test's own walk: every byte-aligned, non-bitfield named member reachable from
    /// `type_id` through anonymous members only, with its offset in bits from `base_bits`
    /// (as `(name, bit offset, nesting depth)`).
    fn anon_walk(
        btf: &Btf,
        type_id: u32,
        base_bits: u64,
        depth: u32,
        out: &mut Vec<(String, u64, u32)>,
    ) {
        let t = btf.types[type_id as usize];
        for i in 0..t.vlen() {
            let m = btf.member(&t, i);
            let (bits, width) = if t.kind_flag() {
                (m.offset & 0xff_ffff, m.offset >> 24)
            } else {
                (m.offset, 0)
            };
            let at = base_bits + u64::from(bits);
            if m.name_off != 0 {
                if depth > 0 && at.is_multiple_of(8) && width == 0 {
                    let name = String::from_utf8(btf.str_at(m.name_off).to_vec()).unwrap();
                    out.push((name, at, depth));
                }
                continue;
            }
            let mut tid = m.type_id;
            while matches!(
                btf.types[tid as usize].kind(),
                kind::TYPEDEF | kind::CONST | kind::VOLATILE
            ) {
                tid = btf.types[tid as usize].size_or_type;
            }
            if matches!(btf.types[tid as usize].kind(), kind::STRUCT | kind::UNION) {
                anon_walk(btf, tid, at, depth + 1, out);
            }
        }
    }

    /// Members inside anonymous structs/unions resolve to the sum of the offsets on the way,
    /// as computed by the test's own walk, for the structs the programs read and for structs
    /// found in the live BTF with anonymous members nested two or more deep.
    #[test]
    fn anonymous_members_have_summed_offsets() {
        let Some(btf) = live_btf("anonymous_members_have_summed_offsets") else {
            return;
        };
        let mut names: Vec<String> = [
            "task_struct",
            "file",
            "inode",
            "signal_struct",
            "files_struct",
        ]
        .map(String::from)
        .into();
        // A few structs (the first of their name) with anonymous members two levels deep.
        let mut deep = 0;
        for (id, t) in btf.types.iter().enumerate() {
            if deep == 8 {
                break;
            }
            if t.kind() != kind::STRUCT || t.name_off == 0 {
                continue;
            }
            let mut found = Vec::new();
            anon_walk(btf, id as u32, 0, 0, &mut found);
            if found.iter().any(|&(_, _, d)| d >= 2) {
                let name = String::from_utf8(btf.str_at(t.name_off).to_vec()).unwrap();
                if btf.find_struct(&name) == Some(id as u32) && !names.contains(&name) {
                    names.push(name);
                    deep += 1;
                }
            }
        }
        assert!(
            deep > 0,
            "the live BTF has no struct with doubly nested anonymous members"
        );

        let (mut checked, mut nonzero_base, mut nested2) = (0, 0, 0);
        for s in &names {
            let id = btf.find_struct(s).unwrap();
            let size = btf.struct_size(s).unwrap();
            let mut found = Vec::new();
            anon_walk(btf, id, 0, 0, &mut found);
            for (name, bits, depth) in found {
                let got = btf.member_offset(s, &name).unwrap();
                assert_eq!(u64::from(got), bits / 8, "{s}.{name} (depth {depth})");
                assert!(got < size, "{s}.{name} at {got}, sizeof {size}");
                checked += 1;
                nonzero_base += usize::from(got > 0);
                nested2 += usize::from(depth >= 2);
            }
        }
        crate::say!(
            "anonymous members checked: {checked} in {names:?} ({nonzero_base} at a non-zero \
             offset, {nested2} nested two or more deep)"
        );
        assert!(nonzero_base > 0 && nested2 > 0);

        // `struct inode` has had `union { const unsigned int i_nlink; unsigned int __i_nlink; }`
        // since 3.2, after `i_mode` and more: both names share one non-zero offset.
        let i_nlink = btf.member_offset("inode", "i_nlink").unwrap();
        assert_eq!(i_nlink, btf.member_offset("inode", "__i_nlink").unwrap());
        assert!(i_nlink > 0 && i_nlink < btf.struct_size("inode").unwrap());
        assert_eq!(btf.member_size("inode", "i_nlink").unwrap(), 4);
    }

    /// A bitfield in task_struct that does not start on a byte boundary is refused.
    #[test]
    fn unaligned_bitfield_is_refused() {
        let Some(btf) = live_btf("unaligned_bitfield_is_refused") else {
            return;
        };
        let id = btf.find_struct("task_struct").unwrap();
        let t = btf.types[id as usize];
        assert!(
            t.kind_flag(),
            "task_struct has bitfields, so kind_flag is set"
        );
        let (name, bit_offset) = (0..t.vlen())
            .map(|i| btf.member(&t, i))
            .filter(|m| m.name_off != 0 && m.offset >> 24 != 0 && m.offset & 7 != 0)
            .map(|m| {
                let name = String::from_utf8(btf.str_at(m.name_off).to_vec()).unwrap();
                (name, u64::from(m.offset & 0xff_ffff))
            })
            .next()
            .expect("task_struct has unaligned bitfields (sched_reset_on_fork and co.)");
        match btf.member_offset("task_struct", &name) {
            Err(BtfError::Bitfield {
                bit_offset: got, ..
            }) => assert_eq!(got, bit_offset),
            other => panic!("task_struct.{name}: expected a bitfield error, got {other:?}"),
        }
        assert!(matches!(
            btf.member_size("task_struct", &name),
            Err(BtfError::Bitfield { .. })
        ));
    }

    #[test]
    fn missing_struct_and_member_name_both() {
        let Some(btf) = live_btf("missing_struct_and_member_name_both") else {
            return;
        };
        let err = btf
            .member_offset("gpu_trace_no_such_struct", "files")
            .unwrap_err();
        assert!(matches!(err, BtfError::StructNotFound { .. }), "{err:?}");
        let msg = err.to_string();
        assert!(msg.contains("gpu_trace_no_such_struct.files"), "{msg}");
        assert!(
            msg.contains("not supported") && msg.contains("uname -r"),
            "{msg}"
        );

        let err = btf
            .member_offset("task_struct", "gpu_trace_no_such_member")
            .unwrap_err();
        assert!(matches!(err, BtfError::MemberNotFound { .. }), "{err:?}");
        let msg = err.to_string();
        assert!(
            msg.contains("task_struct") && msg.contains("gpu_trace_no_such_member"),
            "{msg}"
        );
        assert!(
            msg.contains("not supported") && msg.contains("uname -r"),
            "{msg}"
        );

        // A member of a nested *named* struct member is not a member of the outer struct:
        // `task_struct.se` is a `struct sched_entity`, which holds `vruntime`.
        btf.member_offset("sched_entity", "vruntime").unwrap();
        btf.member_offset("task_struct", "se").unwrap();
        assert!(matches!(
            btf.member_offset("task_struct", "vruntime"),
            Err(BtfError::MemberNotFound { .. })
        ));
        // The empty name would otherwise match the first anonymous member.
        assert!(matches!(
            btf.member_offset("file", ""),
            Err(BtfError::MemberNotFound { .. })
        ));
        assert!(matches!(
            btf.struct_size("gpu_trace_no_such_struct"),
            Err(BtfError::StructNotFound { .. })
        ));
    }

    /// The id of the first type of `kind` named `name` in base BTF.
    fn base_id(btf: &Btf, k: u32, name: &str) -> u32 {
        btf.types
            .iter()
            .position(|t| {
                t.kind() == k && t.name_off != 0 && btf.str_at(t.name_off) == name.as_bytes()
            })
            .unwrap_or_else(|| panic!("{name} not in the live BTF")) as u32
    }

    /// A module-style split BTF blob on top of `base`: a struct with a member of a base type,
    /// a pointer to a base struct, a function prototype and a function, named in the blob's
    /// own string section (offsets continuing after the base's strings), ids continuing after
    /// the base's last id — the layout `pahole` gives a module's `.BTF` and the kernel exposes
    /// in `/sys/kernel/btf/<module>`.
    fn split_blob(base: &Btf) -> Vec<u8> {
        let n = base.type_count() as u32;
        let uint = base_id(base, kind::INT, "unsigned int");
        let int = base_id(base, kind::INT, "int");
        let task = base_id(base, kind::STRUCT, "task_struct");
        let strings = b"\0gt_props\0queue_id\0owner\0pqm\0properties\0gt_func\0gt_ops\0gt_op\0";
        let s = |name: &[u8]| {
            let at = strings
                .windows(name.len() + 2)
                .position(|w| w[0] == 0 && &w[1..=name.len()] == name && w[name.len() + 1] == 0);
            base.str_len as u32 + at.expect("name in the table") as u32 + 1
        };
        let info = |k: u32, vlen: u32| (k << 24) | vlen;
        let mut t = Vec::new();
        let mut put = |words: &[u32]| {
            words
                .iter()
                .for_each(|w| t.extend_from_slice(&w.to_le_bytes()))
        };
        // n+1: struct gt_props { struct task_struct *owner; unsigned int queue_id; } (16 bytes)
        put(&[s(b"gt_props"), info(kind::STRUCT, 2), 16]);
        put(&[s(b"owner"), n + 2, 0]);
        put(&[s(b"queue_id"), uint, 64]);
        // n+2: struct task_struct *
        put(&[0, info(kind::PTR, 0), task]);
        // n+3: int (*)(int pqm, struct gt_props *properties)
        put(&[0, info(kind::FUNC_PROTO, 2), int]);
        put(&[s(b"pqm"), int]);
        put(&[s(b"properties"), n + 4]);
        // n+4: struct gt_props *
        put(&[0, info(kind::PTR, 0), n + 1]);
        // n+5: FUNC gt_func (global linkage)
        put(&[s(b"gt_func"), info(kind::FUNC, 1), n + 3]);
        // n+6: struct gt_ops { int (*gt_op)(int, struct gt_props *); } (8 bytes)
        put(&[s(b"gt_ops"), info(kind::STRUCT, 1), 8]);
        put(&[s(b"gt_op"), n + 7, 0]);
        // n+7: pointer to n+8
        put(&[0, info(kind::PTR, 0), n + 8]);
        // n+8: int (*)(int, struct gt_props *), unnamed parameters as in a member's prototype
        put(&[0, info(kind::FUNC_PROTO, 2), int]);
        put(&[0, int]);
        put(&[0, n + 4]);
        let mut b = Vec::new();
        for w in [
            0x0001_eb9fu32,
            HEADER_LEN as u32,
            0,
            t.len() as u32,
            t.len() as u32,
            strings.len() as u32,
        ] {
            b.extend_from_slice(&w.to_le_bytes());
        }
        b.extend_from_slice(&t);
        b.extend_from_slice(strings);
        b
    }

    #[test]
    fn split_btf_continues_the_base_ids_and_strings() {
        let Some(base) = live_btf("split_btf_continues_the_base_ids_and_strings") else {
            return;
        };
        let n = base.type_count() as u32;
        let split = Btf::from_split(base, &split_blob(base)).expect("the split blob parses");
        assert_eq!(split.type_count() as u32, n + 8);
        // A function pointer member's parameter, found by its type.
        assert_eq!(
            split
                .member_fn_param("gt_ops", "gt_op", "gt_props")
                .unwrap(),
            (1, 2)
        );
        assert!(matches!(
            split.member_fn_param("gt_ops", "gt_op", "task_struct"),
            Err(BtfError::ParamNotFound { .. })
        ));
        assert_eq!(split.func_id("gt_func").unwrap(), n + 5);
        assert_eq!(split.func_param("gt_func", "properties").unwrap(), (1, 2));
        assert_eq!(split.func_param("gt_func", "pqm").unwrap(), (0, 2));
        assert!(matches!(
            split.func_param("gt_func", "qid"),
            Err(BtfError::ParamNotFound { .. })
        ));
        assert_eq!(split.member_offset("gt_props", "queue_id").unwrap(), 8);
        assert_eq!(split.member_size("gt_props", "owner").unwrap(), 8);
        assert_eq!(split.struct_size("gt_props").unwrap(), 16);
        // The base is still there, unchanged, and base functions resolve to base ids.
        assert_eq!(
            split.member_offset("task_struct", "files").unwrap(),
            base.member_offset("task_struct", "files").unwrap()
        );
        let base_func = base.func_id("do_exit").unwrap();
        assert_eq!(split.func_id("do_exit").unwrap(), base_func);
        assert!(base_func <= n);
        assert!(matches!(
            base.func_id("gt_func"),
            Err(BtfError::FuncNotFound { .. })
        ));
        // A split blob cut short is refused, as is split BTF on split BTF.
        let blob = split_blob(base);
        assert!(Btf::from_split(base, &blob[..blob.len() - 10]).is_err());
        assert!(Btf::from_split(&split, &blob).is_err());
    }

    /// On a kernel with modules that have BTF (the GPU host's `nvidia`, the lab's `amdgpu`),
    /// every one of them parses on top of vmlinux's and names its functions.
    #[test]
    fn live_module_btf_parses_on_vmlinux() {
        let Some(base) = live_btf("live_module_btf_parses_on_vmlinux") else {
            return;
        };
        let modules: Vec<_> = std::fs::read_dir("/sys/kernel/btf")
            .map(|d| {
                d.flatten()
                    .map(|e| e.path())
                    .filter(|p| !p.ends_with("vmlinux"))
                    .collect()
            })
            .unwrap_or_default();
        if modules.is_empty() {
            gpu_trace_core::skip::skipped(
                "live_module_btf_parses_on_vmlinux",
                "no module BTF in /sys/kernel/btf (this kernel has no modules with BTF); the lab \
                 checks amdgpu's (f.deep_select)",
            );
            return;
        }
        for path in modules {
            let bytes = std::fs::read(&path).unwrap();
            let split =
                Btf::from_split(base, &bytes).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            assert!(split.type_count() > base.type_count(), "{}", path.display());
        }
    }

    #[test]
    fn missing_file_says_what_to_do() {
        let err = Btf::from_path(Path::new("/nonexistent/gpu-trace/vmlinux")).unwrap_err();
        assert!(matches!(err, BtfError::NotFound { .. }), "{err:?}");
        let msg = err.to_string();
        assert!(msg.contains("/nonexistent/gpu-trace/vmlinux"), "{msg}");
        assert!(msg.contains("CONFIG_DEBUG_INFO_BTF=y"), "{msg}");
    }

    #[test]
    fn truncated_header_is_refused() {
        let Some(bytes) = live_bytes("truncated_header_is_refused") else {
            return;
        };
        for n in [0, 1, 2, 10, HEADER_LEN - 1] {
            match Btf::from_bytes(&bytes[..n]) {
                Err(BtfError::Truncated { section, .. }) => assert_eq!(section, "header", "{n}"),
                other => panic!("{n} bytes: expected a truncated header, got {other:?}"),
            }
        }
        // The whole header but nothing after it: the type section is missing.
        match Btf::from_bytes(&bytes[..HEADER_LEN]) {
            Err(BtfError::Truncated { section, .. }) => assert_eq!(section, "type section"),
            other => panic!("expected a truncated type section, got {other:?}"),
        }
    }

    #[test]
    fn truncated_sections_are_named() {
        let Some(bytes) = live_bytes("truncated_sections_are_named") else {
            return;
        };
        let (type_start, type_len) = type_section(bytes);
        let str_end = le32(bytes, 4) as usize + le32(bytes, 16) as usize + le32(bytes, 20) as usize;
        assert_eq!(
            str_end,
            bytes.len(),
            "vmlinux BTF ends with its string section"
        );

        // Cut in the middle of the type section.
        let cut = &bytes[..type_start + type_len / 2];
        match Btf::from_bytes(cut) {
            Err(BtfError::Truncated { section, .. }) => assert_eq!(section, "type section"),
            other => panic!("expected a truncated type section, got {other:?}"),
        }
        // One byte short of the string section.
        match Btf::from_bytes(&bytes[..bytes.len() - 1]) {
            Err(e @ BtfError::Truncated { section, .. }) => {
                assert_eq!(section, "string section");
                assert!(e.to_string().contains("string section"));
            }
            other => panic!("expected a truncated string section, got {other:?}"),
        }
        // A type section that ends inside type id 2's record (the header says so).
        let mut b = bytes.to_vec();
        let first_len = TYPE_LEN + extra_len_of_first_type(bytes);
        set32(&mut b, 12, (first_len + 4) as u32);
        match Btf::from_bytes(&b) {
            Err(BtfError::Truncated { section, detail }) => {
                assert_eq!(section, "type section");
                assert!(detail.contains("type id 2"), "{detail}");
            }
            other => panic!("expected a truncated type record, got {other:?}"),
        }
    }

    /// Trailing bytes of type id 1 in the live BTF (computed without the parser).
    fn extra_len_of_first_type(bytes: &[u8]) -> usize {
        let (start, _) = type_section(bytes);
        let info = le32(bytes, start + 4);
        let vlen = (info & 0xffff) as usize;
        match (info >> 24) & 0x1f {
            kind::INT | kind::VAR | kind::DECL_TAG => 4,
            kind::ARRAY => 12,
            kind::STRUCT | kind::UNION | kind::DATASEC | kind::ENUM64 => 12 * vlen,
            kind::ENUM | kind::FUNC_PROTO => 8 * vlen,
            _ => 0,
        }
    }

    #[test]
    fn bad_magic_and_version_are_refused() {
        let Some(bytes) = live_bytes("bad_magic_and_version_are_refused") else {
            return;
        };
        let mut b = bytes.to_vec();
        b[0] ^= 0xff;
        let err = Btf::from_bytes(&b).unwrap_err();
        assert!(matches!(err, BtfError::BadMagic { .. }), "{err:?}");
        assert!(err.to_string().contains("not BTF"), "{err}");

        // Byte-swapped magic: big-endian BTF.
        let mut b = bytes.to_vec();
        b.swap(0, 1);
        let err = Btf::from_bytes(&b).unwrap_err();
        assert!(
            matches!(err, BtfError::BadMagic { found: 0x9feb }),
            "{err:?}"
        );
        assert!(err.to_string().contains("big-endian"), "{err}");

        // Bad magic is reported even when the data is also too short for a header.
        assert!(matches!(
            Btf::from_bytes(&b[..4]),
            Err(BtfError::BadMagic { .. })
        ));

        let mut b = bytes.to_vec();
        b[2] = 2;
        assert!(matches!(
            Btf::from_bytes(&b),
            Err(BtfError::UnsupportedVersion { version: 2 })
        ));
    }

    #[test]
    fn string_offset_out_of_range_is_refused() {
        let Some(bytes) = live_bytes("string_offset_out_of_range_is_refused") else {
            return;
        };
        let str_len = le32(bytes, 20);
        let (type_start, _) = type_section(bytes);

        // Type id 1's name one past the end of the string section.
        let mut b = bytes.to_vec();
        set32(&mut b, type_start, str_len);
        let err = Btf::from_bytes(&b).unwrap_err();
        let msg = err.to_string();
        match err {
            BtfError::StringOutOfRange {
                offset,
                len,
                referrer,
            } => {
                assert_eq!((offset, len), (str_len, str_len));
                assert_eq!(referrer, "type id 1");
                assert!(msg.contains("string section"), "{msg}");
            }
            other => panic!("expected a string offset error, got {other:?}"),
        }
        // The last in-range offset is accepted (it is the final NUL: an empty name).
        let mut b = bytes.to_vec();
        set32(&mut b, type_start, str_len - 1);
        Btf::from_bytes(&b).expect("offset str_len - 1 is in range");

        // A member name out of range: the first STRUCT with members.
        let btf = live_btf("string_offset_out_of_range_is_refused").unwrap();
        let (id, t) = btf
            .types
            .iter()
            .enumerate()
            .find(|(_, t)| t.kind() == kind::STRUCT && t.vlen() > 1)
            .unwrap();
        let mut b = bytes.to_vec();
        set32(&mut b, t.extra as usize + 12, u32::MAX);
        match Btf::from_bytes(&b) {
            Err(BtfError::StringOutOfRange { referrer, .. }) => {
                assert_eq!(referrer, format!("member 1 of type id {id} (STRUCT)"));
            }
            other => panic!("expected a string offset error, got {other:?}"),
        }
    }

    #[test]
    fn unknown_kind_is_refused() {
        let Some(bytes) = live_bytes("unknown_kind_is_refused") else {
            return;
        };
        let (type_start, _) = type_section(bytes);
        let mut b = bytes.to_vec();
        let info = le32(&b, type_start + 4);
        set32(&mut b, type_start + 4, (info & !(0x1f << 24)) | (31 << 24));
        match Btf::from_bytes(&b) {
            Err(BtfError::UnknownKind { type_id, kind }) => assert_eq!((type_id, kind), (1, 31)),
            other => panic!("expected an unknown kind error, got {other:?}"),
        }
    }

    /// The parser walks the whole type section: every kind the live kernel uses must be skipped
    /// with exactly its trailing data. A slip desynchronises the walk, after which names and
    /// type references read from the wrong bytes: check they all make sense.
    #[test]
    fn live_btf_walk_stays_in_step() {
        let Some(btf) = live_btf("live_btf_walk_stays_in_step") else {
            return;
        };
        let ident = |off: u32| {
            let s = btf.str_at(off);
            !s.is_empty()
                && !s[0].is_ascii_digit()
                && s.iter().all(|&c| c.is_ascii_alphanumeric() || c == b'_')
        };
        let count = btf.types.len() as u32;
        let mut kinds = [0usize; 20];
        let mut members = 0usize;
        for (id, t) in btf.types.iter().enumerate().skip(1) {
            kinds[t.kind() as usize] += 1;
            match t.kind() {
                kind::STRUCT | kind::UNION => {
                    assert!(t.name_off == 0 || ident(t.name_off), "type id {id} name");
                    for i in 0..t.vlen() {
                        let m = btf.member(t, i);
                        assert!(m.name_off == 0 || ident(m.name_off), "member {i} of {id}");
                        assert!(m.type_id != 0 && m.type_id < count, "member {i} of {id}");
                        members += 1;
                    }
                }
                kind::TYPEDEF | kind::FUNC => {
                    assert!(ident(t.name_off), "type id {id} name");
                    assert!(t.size_or_type < count, "type id {id} target");
                }
                kind::PTR | kind::CONST | kind::VOLATILE | kind::RESTRICT => {
                    assert!(t.size_or_type < count, "type id {id} target");
                }
                kind::ENUM => {
                    for i in 0..t.vlen() {
                        let name_off = le32(&btf.data, t.extra as usize + 8 * i as usize);
                        assert!(ident(name_off), "enumerator {i} of {id}");
                    }
                }
                _ => {}
            }
        }
        crate::say!(
            "live BTF: {} types, {members} struct/union members, count by kind: {kinds:?}",
            btf.type_count()
        );
        assert!(btf.type_count() > 1000);
        for k in [
            kind::INT,
            kind::PTR,
            kind::STRUCT,
            kind::UNION,
            kind::ENUM,
            kind::FUNC,
        ] {
            assert!(kinds[k as usize] > 0, "no {} in the live BTF", kind_name(k));
        }
    }
}
