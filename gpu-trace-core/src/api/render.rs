//! `gpu-trace api --resolve`'s output: text for a person, one JSON object per process
//! (docs/api.md). Paths and names come from the traced process: text escapes them
//! (`output::escape`), JSON carries them as UTF-8 (a byte that is not, as U+FFFD).

use std::fmt::Write as _;

use serde_json::{Value, json};

use super::interposer::{HIDDEN_HOOKS_CAP, Lookup, lookup_kind};
use super::resolve::{Library, Origin, Resolution, Warning};
use crate::escape::{escape_text, json_terminal_safe, lossy};

/// What was read of one process, and its resolution.
#[derive(Clone, Debug)]
pub struct ProcessReport {
    pub pid: u32,
    /// The name as `decode_lossless` carries it.
    pub comm: String,
    /// `LD_PRELOAD`'s entries (then /etc/ld.so.preload's), or why they are unknown.
    pub preload: Result<Vec<String>, String>,
    /// Preload entries no mapped library matches (ld.so could not load them, or they came
    /// after start-up).
    pub preload_unmapped: Vec<String>,
    /// The global scope in binding order, then the `dlopen`ed libraries.
    pub libraries: Vec<Library>,
    /// A GPU device (/dev/nvidia*, /dev/kfd, /dev/dri/*) is open (`None`: unknown).
    pub gpu_open: Option<bool>,
    pub resolution: Resolution,
}

/// The recursion warning's text.
pub fn dlsym_message(library: &str, symbols: &[String]) -> String {
    let first = symbols.first().map_or("", String::as_str);
    format!(
        "{library} exports {} and looks symbols up with dlsym: if it looks {first} up with \
         RTLD_DEFAULT, or RTLD_NEXT from a copy that is not in front of the real one, it finds \
         itself and recurses",
        symbols.join(", ")
    )
}

fn warning_parts(w: &Warning) -> (&'static str, usize, &[String]) {
    match w {
        Warning::DlsymInterposer {
            library, symbols, ..
        } => ("dlsym_interposer", *library, symbols),
        Warning::Shadowed { library, symbols } => ("shadowed", *library, symbols),
        Warning::PreloadLeak { library, symbols } => ("preload_leak", *library, symbols),
    }
}

/// A warning's sentence, `path` being how the output names the library.
fn warning_message(w: &Warning, path: &str) -> String {
    let (_, _, symbols) = warning_parts(w);
    match w {
        Warning::DlsymInterposer { .. } => dlsym_message(path, symbols),
        Warning::Shadowed { .. } => format!(
            "{path} defines {} but comes after the real library: its copy is never called \
             (move it to LD_PRELOAD to interpose)",
            symbols.join(", ")
        ),
        Warning::PreloadLeak { .. } => format!(
            "{path} is preloaded and defines {} in a process that has no GPU open: an \
             exported LD_PRELOAD leaked into it (set LD_PRELOAD on the GPU command only)",
            symbols.join(", ")
        ),
    }
}

fn lib_text(lib: &Library) -> String {
    let mut s = escape_text(&lib.path).into_owned();
    if let Some(so) = &lib.soname
        && so != lib.file_name()
    {
        let _ = write!(s, " ({})", escape_text(so));
    }
    s
}

/// The text block of one process.
pub fn text(r: &ProcessReport) -> String {
    let mut out = format!("PID {} ({})\n", r.pid, escape_text(&r.comm));
    match &r.preload {
        Ok(p) if p.is_empty() => out += "  LD_PRELOAD: none\n",
        Ok(p) => {
            let names: Vec<_> = p.iter().map(|s| escape_text(s)).collect();
            let _ = writeln!(out, "  LD_PRELOAD: {}", names.join(" "));
        }
        Err(why) => {
            let _ = writeln!(out, "  LD_PRELOAD: unknown ({})", escape_text(why));
        }
    }
    for p in &r.preload_unmapped {
        let _ = writeln!(
            out,
            "  LD_PRELOAD names {} but no mapped library is it",
            escape_text(p)
        );
    }
    out += "  binding order:\n";
    let mut dlopened = Vec::new();
    for (i, lib) in r.libraries.iter().enumerate() {
        if lib.origin == Origin::Dlopen {
            dlopened.push(lib);
            continue;
        }
        let _ = write!(
            out,
            "  {:>4}  {:<10}  {}",
            i + 1,
            lib.origin.name(),
            lib_text(lib)
        );
        if !lib.has_dynsym {
            out += "  [no dynamic symbol table: defines nothing for ld.so]";
        }
        out += "\n";
    }
    if !dlopened.is_empty() {
        out += "  dlopen (local scope unless RTLD_GLOBAL):\n";
        for lib in dlopened {
            let _ = writeln!(out, "        {}", lib_text(lib));
        }
    }
    for lib in &r.libraries {
        if let Some(line) = interposer_text(lib) {
            let _ = writeln!(out, "  {line}");
        }
    }
    symbols_text(r, &mut out);
    for w in &r.resolution.warnings {
        let (_, lib, _) = warning_parts(w);
        let path = escape_text(&r.libraries[lib].path);
        let _ = writeln!(out, "  warning: {}", warning_message(w, &path));
    }
    out
}

/// What a library's files say of it as an interposer, for a library that overrides a lookup
/// function or has probable hidden hooks (`None` for the others).
fn interposer_text(lib: &Library) -> Option<String> {
    let overrides = lib.overrides();
    let hooks = lib.hidden_hooks.as_ref();
    if overrides.is_empty() && hooks.is_none_or(|h| h.hooks.is_empty()) {
        return None;
    }
    let mut parts = Vec::new();
    for (kind, flag) in [
        (Lookup::Dlsym, "dlsym_override"),
        (Lookup::ProcAddress, "procaddress_override"),
    ] {
        let names: Vec<&str> = overrides
            .iter()
            .copied()
            .filter(|f| lookup_kind(f) == Some(kind))
            .collect();
        if !names.is_empty() {
            parts.push(format!("overrides {} ({flag})", names.join(", ")));
        }
    }
    parts.push(match hooks {
        None => "hidden hooks not looked for (its .symtab was not read)".to_string(),
        Some(h) if !h.symtab => "no .symtab (stripped): its hidden functions are unnamed".into(),
        Some(h) if h.hooks.is_empty() => "no probable hidden hooks in its .symtab".into(),
        Some(h) => {
            let list: Vec<String> = h
                .hooks
                .iter()
                .map(|k| format!("{} ({})", escape_text(&k.symbol), escape_text(&k.function)))
                .collect();
            let more = if h.capped {
                format!(" (the first {HIDDEN_HOOKS_CAP}; more not listed)")
            } else {
                String::new()
            };
            format!("probable hidden hooks: {}{more}", list.join(", "))
        }
    });
    Some(format!("{}: {}", escape_text(&lib.path), parts.join("; ")))
}

fn symbols_text(r: &ProcessReport, out: &mut String) {
    if r.resolution.symbols.is_empty() {
        let _ = writeln!(
            out,
            "  no GPU API library mapped (none of the {} mapped libraries defines a symbol of \
             the table; add one with --probe LIB:SYMBOL)",
            r.libraries.len()
        );
        return;
    }
    let width = r
        .resolution
        .symbols
        .iter()
        .map(|s| s.symbol.len())
        .max()
        .unwrap_or(0);
    *out += "  symbols (the copy calls reach; then what dlsym(RTLD_NEXT) from it reaches):\n";
    let path = |i: usize| escape_text(&r.libraries[i].path).into_owned();
    for s in &r.resolution.symbols {
        let _ = write!(
            out,
            "    {:<width$}  {:<12}  ",
            escape_text(&s.symbol),
            s.family
        );
        match s.winner {
            Some(w) => {
                *out += &path(w);
                if r.libraries[w].origin == Origin::Preload {
                    *out += " [LD_PRELOAD]";
                }
            }
            None => *out += "defined by no library of the global scope",
        }
        if !s.next.is_empty() {
            let next: Vec<_> = s.next.iter().map(|&i| path(i)).collect();
            let _ = write!(out, "; next: {}", next.join(", "));
        }
        if !s.dlopened.is_empty() {
            let d: Vec<_> = s.dlopened.iter().map(|&i| path(i)).collect();
            let _ = write!(out, "; dlopened copies: {}", d.join(", "));
        }
        *out += "\n";
    }
}

/// The JSON object of one process (one line).
pub fn json(r: &ProcessReport) -> String {
    let path = |i: usize| lossy(&r.libraries[i].path).into_owned();
    let paths = |v: &[usize]| v.iter().map(|&i| path(i)).collect::<Vec<_>>();
    let libraries: Vec<Value> = r
        .libraries
        .iter()
        .map(|l| {
            json!({
                "path": lossy(&l.path),
                "soname": l.soname.as_deref().map(lossy),
                "origin": l.origin.name(),
                "dynsym": l.has_dynsym,
                "imports_dlsym": l.imports_dlsym,
                "overrides": l.overrides(),
                "dlsym_override": l.dlsym_override(),
                "procaddress_override": l.procaddress_override(),
                "symtab": l.hidden_hooks.as_ref().map(|h| h.symtab),
                "probable_hidden_hooks": l.hidden_hooks.as_ref().map_or_else(Vec::new, |h| {
                    h.hooks
                        .iter()
                        .map(|k| json!({
                            "symbol": lossy(&k.symbol),
                            "function": lossy(&k.function),
                            "offset": k.offset,
                        }))
                        .collect()
                }),
                "probable_hidden_hooks_capped": l.hidden_hooks.as_ref().is_some_and(|h| h.capped),
            })
        })
        .collect();
    let symbols: Vec<Value> = r
        .resolution
        .symbols
        .iter()
        .map(|s| {
            json!({
                "symbol": s.symbol,
                "family": s.family,
                "provider": s.provider,
                "winner": s.winner.map(path),
                "next": paths(&s.next),
                "dlopened": paths(&s.dlopened),
                "real": s.real.map(path),
            })
        })
        .collect();
    let warnings: Vec<Value> = r
        .resolution
        .warnings
        .iter()
        .map(|w| {
            let (kind, lib, symbols) = warning_parts(w);
            json!({
                "kind": kind,
                "library": path(lib),
                "symbols": symbols,
                "message": warning_message(w, &path(lib)),
            })
        })
        .collect();
    let (preload, preload_error) = match &r.preload {
        Ok(p) => (
            Some(p.iter().map(|s| lossy(s).into_owned()).collect::<Vec<_>>()),
            None,
        ),
        Err(e) => (None, Some(lossy(e).into_owned())),
    };
    let v = json!({
        "pid": r.pid,
        "comm": lossy(&r.comm),
        "gpu_open": r.gpu_open,
        "preload": preload,
        "preload_error": preload_error,
        "preload_unmapped": r.preload_unmapped.iter().map(|s| lossy(s)).collect::<Vec<_>>(),
        "libraries": libraries,
        "symbols": symbols,
        "warnings": warnings,
    });
    json_terminal_safe(v.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::interposer::{HiddenHook, HiddenHooks};
    use crate::api::resolve::{Binding, resolve};
    use crate::api::symbols::SymbolTable;

    fn report(path: &str) -> ProcessReport {
        let libraries = vec![
            Library {
                path: path.to_string(),
                soname: None,
                origin: Origin::Preload,
                has_dynsym: true,
                defines: [("hipMalloc".to_string(), Binding::Global)].into(),
                imports_dlsym: true,
                exports_lookups: vec![],
                hidden_hooks: None,
            },
            Library {
                path: "/usr/lib/libamdhip64.so.5.2".into(),
                soname: Some("libamdhip64.so.5".into()),
                origin: Origin::Needed,
                has_dynsym: true,
                defines: [("hipMalloc".to_string(), Binding::Global)].into(),
                imports_dlsym: false,
                exports_lookups: vec![],
                hidden_hooks: None,
            },
        ];
        let resolution = resolve(&SymbolTable::builtin(), &libraries, Some(true));
        ProcessReport {
            pid: 7,
            comm: "c\x1b]0;x".into(),
            preload: Ok(vec![path.to_string()]),
            preload_unmapped: vec![],
            libraries,
            gpu_open: Some(true),
            resolution,
        }
    }

    #[test]
    fn text_escapes_paths_and_names_from_the_process() {
        let t = text(&report("/tmp/evil\x1b[2J\n.so"));
        assert!(!t.contains('\x1b'), "{t:?}");
        assert!(
            t.contains("/tmp/evil\\x1b[2J\\n.so [LD_PRELOAD]; next: /usr/lib/libamdhip64.so.5.2")
        );
        assert!(t.contains("(libamdhip64.so.5)"));
        assert!(t.contains("warning: /tmp/evil\\x1b[2J\\n.so exports hipMalloc and looks"));
        assert_eq!(t.lines().count(), 8, "{t}");
    }

    #[test]
    fn json_is_one_line_with_the_winner_and_the_next_copy() {
        let j = json(&report("/tmp/shim\x1b.so"));
        assert_eq!(j.lines().count(), 1);
        assert!(!j.contains('\x1b'));
        let v: Value = serde_json::from_str(&j).unwrap();
        assert_eq!(v["symbols"][0]["winner"], "/tmp/shim\x1b.so");
        assert_eq!(v["symbols"][0]["next"][0], "/usr/lib/libamdhip64.so.5.2");
        assert_eq!(v["warnings"][0]["kind"], "dlsym_interposer");
        assert_eq!(v["libraries"][0]["dlsym_override"], false);
        assert_eq!(v["libraries"][0]["probable_hidden_hooks"], json!([]));
    }

    fn hooked(hooks: HiddenHooks) -> ProcessReport {
        let mut r = report("/tmp/vgpu.so");
        r.libraries[0].exports_lookups = vec!["dlsym".into(), "dlopen".into()];
        r.libraries[0].hidden_hooks = Some(hooks);
        r
    }

    #[test]
    fn an_interposer_gets_a_line_of_its_overrides_and_hidden_hooks() {
        let hook = |symbol: &str, function: &str, offset| HiddenHook {
            symbol: symbol.into(),
            function: function.into(),
            offset,
        };
        let r = hooked(HiddenHooks {
            symtab: true,
            hooks: vec![
                hook("cuLaunchKernel", "hooked_cuLaunchKernel", 0x1139),
                hook("cuMemAlloc_v2", "my_cuMemAlloc_v2\x1b[2J", 0x1200),
            ],
            capped: false,
        });
        let t = text(&r);
        assert!(!t.contains('\x1b'), "{t:?}");
        assert!(
            t.contains(
                "\n  /tmp/vgpu.so: overrides dlsym, dlopen (dlsym_override); probable hidden \
                 hooks: cuLaunchKernel (hooked_cuLaunchKernel), cuMemAlloc_v2 \
                 (my_cuMemAlloc_v2\\x1b[2J)\n"
            ),
            "{t}"
        );
        // The real runtime is no interposer: no line.
        assert!(!t.contains("  /usr/lib/libamdhip64.so.5.2:"), "{t}");
        let v: Value = serde_json::from_str(&json(&r)).unwrap();
        let l = &v["libraries"][0];
        assert_eq!(
            (&l["dlsym_override"], &l["procaddress_override"]),
            (&json!(true), &json!(false))
        );
        assert_eq!(l["overrides"], json!(["dlsym", "dlopen"]));
        assert_eq!(l["symtab"], true);
        assert_eq!(
            l["probable_hidden_hooks"][1],
            json!({"symbol": "cuMemAlloc_v2", "function": "my_cuMemAlloc_v2\x1b[2J", "offset": 0x1200})
        );
        assert_eq!(v["libraries"][1]["symtab"], Value::Null);
    }

    #[test]
    fn a_stripped_or_capped_interposer_says_so() {
        let t = text(&hooked(HiddenHooks::default()));
        assert!(
            t.contains("/tmp/vgpu.so: overrides dlsym, dlopen (dlsym_override); no .symtab"),
            "{t}"
        );
        let hooks = HiddenHooks {
            symtab: true,
            hooks: vec![HiddenHook {
                symbol: "cuInit".into(),
                function: "my_cuInit".into(),
                offset: 1,
            }],
            capped: true,
        };
        let r = hooked(hooks);
        assert!(text(&r).contains("cuInit (my_cuInit) (the first 256; more not listed)\n"));
        let v: Value = serde_json::from_str(&json(&r)).unwrap();
        assert_eq!(v["libraries"][0]["probable_hidden_hooks_capped"], true);
    }
}
