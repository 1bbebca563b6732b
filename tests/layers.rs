//! The crate's layers, checked: every `crate::` and `super::` path in every file under `src/`
//! must name a module of the same or a lower layer than the file's own (the table below), or
//! be one of the listed exceptions, each with its reason. Paths through the root re-exports
//! (`crate::Bulkhead`) are resolved to the module that defines the item, read from
//! `src/lib.rs`'s `pub use` lines. Comments (and so doc links) are not imports and are skipped.
//!
//! No two sibling modules of which one is a folder import each other (a circle the rank table
//! allows inside one layer). And no file under `src/` is longer than [`MAX_LINES`].

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

/// The layers, bottom up: module path prefix → (rank, layer). The longest prefix decides.
const LAYERS: &[(&str, u32, &str)] = &[
    (
        "sync",
        0,
        "the sync facade (std or loom primitives, test hooks)",
    ),
    (
        "os_clock",
        0,
        "the kernel's coarse clocks (Linux), read through one unsafe call",
    ),
    (
        "vocab",
        1,
        "vocabulary: demands, rejections, errors, ids, class ids",
    ),
    (
        "words",
        2,
        "words: state word layouts, limits snapshot and ring, class floors table, class table",
    ),
    (
        "record",
        3,
        "records: events and statistics, fed from above",
    ),
    (
        "grace",
        3,
        "the grace period (per-thread markers, kept in the statistics entries)",
    ),
    (
        "wait::list",
        3,
        "the intrusive waiter list (a data structure the block holds)",
    ),
    (
        "wait::multi",
        3,
        "the multi-resource wait: a FIFO of waiters each holding out for several resources",
    ),
    (
        "shared",
        4,
        "the shared block (words + ring + list + records) and its lifetime",
    ),
    (
        "protocol",
        5,
        "protocols: no-class (plain) and classed decisions, returns, hand-off, pump, hooks",
    ),
    (
        "wait",
        6,
        "waits: blocking, futures, drain, cancellation, timer",
    ),
    (
        "handle",
        7,
        "public handles: Bulkhead, builder, reconfiguration, Admission",
    ),
    ("llm", 8, "the LLM layer"),
    ("config", 8, "configuration files and control planes"),
    ("tower", 8, "the tower integration"),
    (
        "cluster",
        8,
        "cluster mode: leased shares of a global budget, over apply_limits and stats",
    ),
    ("telemetry", 8, "tracing and metrics"),
    (
        "pools",
        8,
        "gateway pools: partitions, connections, global guard, retry budgets, fallbacks",
    ),
    (
        "coordinator",
        8,
        "the client-side coordinator (seed 002), over the multi-resource wait",
    ),
    (
        "model",
        9,
        "test support: the sequential model (feature testing)",
    ),
    (
        "conformance",
        9,
        "test support: engine against model (feature testing)",
    ),
    ("contract", 10, "documentation only"),
    ("guide", 10, "documentation only"),
];

/// Imports that go up, each with why it remains: (importing module prefix, imported module
/// prefix, reason).
const EXCEPTIONS: &[(&str, &str, &str)] = &[(
    "wait::waiting",
    "handle",
    "the waits are `Bulkhead` methods (`acquire_blocking`, `acquire`, `drain`) and end by \
     counting and building the `Admission` (`Bulkhead::count_admission`, `admission_from`, \
     `Granted`); removing it needs the waits to return a grant that the handle turns into an \
     admission: a change of code, not a move",
)];

/// No source file longer than this.
const MAX_LINES: usize = 850;

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// `src/a/b.rs` → `a::b`; `src/a/mod.rs` → `a`; `src/lib.rs` → ``.
fn module_of(path: &Path) -> String {
    let rel = path.strip_prefix(src()).unwrap().with_extension("");
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if parts.last().is_some_and(|l| l == "mod" || l == "lib") {
        parts.pop();
    }
    parts.join("::")
}

fn layer_of(module: &str) -> Option<(u32, &'static str, &'static str)> {
    LAYERS
        .iter()
        .filter(|(prefix, _, _)| is_prefix(prefix, module))
        .max_by_key(|(prefix, _, _)| prefix.len())
        .map(|&(prefix, rank, name)| (rank, prefix, name))
}

fn is_prefix(prefix: &str, module: &str) -> bool {
    module == prefix || module.starts_with(&format!("{prefix}::"))
}

/// The code of a line: its comment (`//` outside a string literal) cut off and the contents of
/// its string literals blanked. Good enough for this crate's sources: a string literal that
/// spans lines is not recognised (none names a `crate::` path).
fn code(line: &str) -> String {
    if line.trim_start().starts_with("//") {
        return String::new();
    }
    let mut out = String::with_capacity(line.len());
    let (mut in_str, mut escaped) = (false, false);
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        if in_str {
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => in_str = false,
                _ => {}
            }
            out.push(if in_str { ' ' } else { c });
            continue;
        }
        match c {
            '"' => in_str = true,
            '/' if chars.peek() == Some(&'/') => break,
            _ => {}
        }
        out.push(c);
    }
    out
}

/// A path a piece of code names: how many `super::` it starts with (0 for `crate::`), and
/// its segments after that.
type Named = (usize, Vec<String>);

/// Every path a piece of code names after `crate::` or `super::`, brace groups expanded.
fn paths(code: &str) -> Vec<Named> {
    let mut out = Vec::new();
    for kind in ["crate::", "super::"] {
        let mut rest = code;
        while let Some(at) = rest.find(kind) {
            let before = rest[..at].chars().last();
            rest = &rest[at + kind.len()..];
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                continue; // `foo::crate::`, or the second `super::` of `super::super::`
            }
            let mut s = rest;
            let mut ups = usize::from(kind == "super::");
            while let Some(r) = s.strip_prefix("super::") {
                ups += 1;
                s = r;
            }
            rest = s;
            expand(s, &[], ups, &mut out);
        }
    }
    out
}

/// Appends the paths `s` names (after `lead`): one, or one per item of a brace group.
fn expand(mut s: &str, lead: &[String], ups: usize, out: &mut Vec<Named>) {
    let mut segs = lead.to_vec();
    loop {
        let ident: String = s
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        if ident.is_empty() {
            if let Some(inner) = s.strip_prefix('{') {
                let (mut depth, mut item) = (0, String::new());
                for c in inner.chars() {
                    match c {
                        '}' if depth == 0 => break,
                        ',' if depth == 0 => {
                            group_item(&item, &segs, ups, out);
                            item.clear();
                            continue;
                        }
                        '{' => depth += 1,
                        '}' => depth -= 1,
                        _ => {}
                    }
                    item.push(c);
                }
                group_item(&item, &segs, ups, out);
                return;
            }
            break;
        }
        s = &s[ident.len()..];
        segs.push(ident);
        match s.strip_prefix("::") {
            Some(r) => s = r,
            None => break,
        }
    }
    if !segs.is_empty() {
        out.push((ups, segs));
    }
}

fn group_item(item: &str, segs: &[String], ups: usize, out: &mut Vec<Named>) {
    match item.trim() {
        "" => {}
        "self" => out.push((ups, segs.to_vec())),
        item => expand(item, segs, ups, out),
    }
}

/// The root's `pub use a::b::{X, Y};` lines: item name → defining module.
fn root_items() -> BTreeMap<String, String> {
    let lib = fs::read_to_string(src().join("lib.rs")).unwrap();
    let mut map = BTreeMap::new();
    let mut stmt = String::new();
    for line in lib.lines() {
        // Only the root's own `pub use` lines (column 0), not those of its inline modules.
        let c = code(line);
        let c = c.trim_end();
        if stmt.is_empty() && !c.starts_with("pub use ") {
            continue;
        }
        stmt.push_str(c.trim());
        stmt.push(' ');
        if !c.ends_with(';') {
            continue;
        }
        let body = stmt
            .trim_start_matches("pub use ")
            .trim()
            .trim_end_matches(';');
        let (module, items) = match body.find("::{") {
            Some(i) => (&body[..i], body[i + 3..].trim_end_matches('}').to_string()),
            None => {
                let i = body.rfind("::").unwrap();
                (&body[..i], body[i + 2..].to_string())
            }
        };
        for it in items.split(',') {
            let it = it.trim();
            if !it.is_empty() {
                map.insert(it.to_string(), module.to_string());
            }
        }
        stmt.clear();
    }
    map
}

/// The module a path names: a root item resolved through the re-exports; `super` resolved
/// against the file's own module; otherwise the longest prefix the table knows.
fn target(named: &Named, file_module: &str, roots: &BTreeMap<String, String>) -> String {
    let ups = named.0;
    let full = with_ups(named, file_module);
    if let Some(m) = full.first().and_then(|first| roots.get(first)) {
        return m.clone();
    }
    let mut best = String::new();
    for n in 1..=full.len() {
        let m = full[..n].join("::");
        if layer_of(&m).is_some() {
            best = m;
        }
    }
    if best.is_empty() && ups > 0 {
        // `super` from an inline module (`mod hooks { use super::X; }`) names the file's own
        // module or its parent in the same file: the file's own layer.
        return file_module.to_string();
    }
    best
}

#[test]
fn imports_only_go_down_the_layers() {
    let roots = root_items();
    let mut all = Vec::new();
    files(&src(), &mut all);
    all.sort();
    let mut bad = Vec::new();
    for path in &all {
        let module = module_of(path);
        if module.is_empty() {
            continue; // the root: it declares and re-exports every layer
        }
        let Some((rank, layer, _)) = layer_of(&module) else {
            bad.push(format!(
                "{}: module `{module}` is in no layer of the table",
                path.display()
            ));
            continue;
        };
        let text = fs::read_to_string(path).unwrap();
        for (n, line) in text.lines().enumerate() {
            for named in paths(&code(line)) {
                let to = target(&named, &module, &roots);
                let shown = format!(
                    "{}{}",
                    if named.0 == 0 {
                        "crate::".to_string()
                    } else {
                        "super::".repeat(named.0)
                    },
                    named.1.join("::")
                );
                let Some((to_rank, to_layer, _)) = layer_of(&to) else {
                    if named.0 == 0 && named.1.len() == 1 {
                        continue; // an item of the root itself (`crate::testing`), or a macro's
                    }
                    bad.push(format!(
                        "{}:{}: `{shown}` names no module of the table",
                        path.display(),
                        n + 1
                    ));
                    continue;
                };
                if to_rank <= rank {
                    continue;
                }
                if EXCEPTIONS
                    .iter()
                    .any(|(from, into, _)| is_prefix(from, &module) && is_prefix(into, &to))
                {
                    continue;
                }
                bad.push(format!(
                    "{}:{}: `{module}` (layer {rank}, {layer}) imports `{to}` (layer {to_rank}, \
                     {to_layer}) upward: `{shown}` in `{}`",
                    path.display(),
                    n + 1,
                    line.trim()
                ));
            }
        }
    }
    assert!(
        bad.is_empty(),
        "{} upward or unknown imports:\n{}",
        bad.len(),
        bad.join("\n")
    );
}

/// The core: every layer up to the public handles. It knows nothing of the LLM layer's observe
/// mode (bypasses, their events, counters and shadow ids) or de-duplication: those live in
/// `src/llm/`, and reach the core only through its generic hooks (`Event::Extension`, the
/// extension slot of the shared block, the reserved id space).
const CORE_MAX_RANK: u32 = 7;

/// What the core must not mention, in code or comments: (needle, case-insensitive). The queue
/// bypass of the classed protocol (`src/protocol/classed/bypass.rs`, "bypasses the queue") is
/// another meaning of "bypass" and the core's own, so the bare word is allowed and only observe
/// mode's identifiers are matched.
const LLM_ONLY: &[(&str, bool)] = &[
    ("observe mode", true),
    ("observe-mode", true),
    ("Mode::Observe", false),
    ("ObserveStats", false),
    ("ObserveCounters", false),
    ("shadow", true),
    ("dedup", true),
    ("de-dup", true),
    ("BypassEvent", false),
    ("BypassUsage", false),
    ("BypassRelease", false),
    ("Event::Bypass", false),
    ("Bypassed", false),
    ("bypassed_by_reason", false),
    ("race_bypassed", false),
    ("bypass_settled", false),
    ("bypass_usage", false),
    ("bypass_release", false),
    ("bypass_input", false),
    ("bypass_output", false),
];

/// The `LLM_ONLY` needles a text mentions.
fn llm_mentions(text: &str) -> Vec<&'static str> {
    let lower = text.to_lowercase();
    LLM_ONLY
        .iter()
        .filter(|(needle, fold)| {
            if *fold {
                lower.contains(&needle.to_lowercase())
            } else {
                text.contains(needle)
            }
        })
        .map(|(needle, _)| *needle)
        .collect()
}

#[test]
fn the_core_knows_nothing_of_observe_mode_or_de_duplication() {
    let mut all = Vec::new();
    files(&src(), &mut all);
    all.sort();
    let mut bad = Vec::new();
    let mut core_files = 0;
    for path in &all {
        let module = module_of(path);
        let Some((rank, _, _)) = layer_of(&module) else {
            continue; // the root, or a module the layer test reports
        };
        if module.is_empty() || rank > CORE_MAX_RANK {
            continue;
        }
        core_files += 1;
        let text = fs::read_to_string(path).unwrap();
        for (n, line) in text.lines().enumerate() {
            let found = llm_mentions(line);
            if !found.is_empty() {
                bad.push(format!(
                    "{}:{}: mentions {found:?}: `{}`",
                    path.display(),
                    n + 1,
                    line.trim()
                ));
            }
        }
    }
    assert!(core_files > 20, "only {core_files} core files found");
    assert!(
        bad.is_empty(),
        "{} mentions of the LLM layer in the core:\n{}",
        bad.len(),
        bad.join("\n")
    );
}

#[test]
fn the_llm_only_check_sees_what_it_must_and_not_the_queue_bypass() {
    assert_eq!(
        llm_mentions("Event::Bypass(Box::new(e))"),
        ["Event::Bypass"]
    );
    assert_eq!(
        llm_mentions("pub observe: Option<ObserveStats>,"),
        ["ObserveStats"]
    );
    assert_eq!(llm_mentions("AdmissionId::new_shadow(p, k, n)"), ["shadow"]);
    assert_eq!(llm_mentions("/// Observe-mode bypasses"), ["observe-mode"]);
    assert_eq!(llm_mentions("Event::Dedup(DedupEvent { .. })"), ["dedup"]);
    assert_eq!(llm_mentions("c.race_bypassed.add(1)"), ["race_bypassed"]);
    assert!(llm_mentions("//! In-floor newcomers bypass the queue").is_empty());
    assert!(llm_mentions("pub(crate) fn may_bypass(shared: &Shared) -> bool").is_empty());
    assert!(llm_mentions("the unique thread that observed the last owner").is_empty());
}

/// A named path's segments with its `super::`s applied to `file_module`.
fn with_ups((ups, segs): &Named, file_module: &str) -> Vec<String> {
    let mut base: Vec<String> = file_module
        .split("::")
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect();
    if *ups == 0 {
        base.clear();
    }
    for _ in 0..*ups {
        base.pop();
    }
    base.extend(segs.iter().cloned());
    base
}

/// The module path a named path resolves to, as far as it can be followed: `super::`s applied
/// to the file's module and a root re-export (`crate::Bulkhead`) replaced by its module; item
/// names may trail.
fn full_target(named: &Named, file_module: &str, roots: &BTreeMap<String, String>) -> Vec<String> {
    let full = with_ups(named, file_module);
    if let Some(m) = full.first().and_then(|first| roots.get(first)) {
        return m.split("::").map(str::to_string).collect();
    }
    full
}

/// Whether `parent::name` is a folder under `src/` (a module with files of its own below it).
fn is_folder(parent: &[String], name: &str) -> bool {
    let mut p = src();
    for s in parent {
        p.push(s);
    }
    p.push(name);
    p.is_dir()
}

/// Every import between two siblings (modules with the same parent), as (parent, from, to),
/// with one place it is made.
fn sibling_imports() -> BTreeMap<(Vec<String>, String, String), String> {
    let roots = root_items();
    let mut all = Vec::new();
    files(&src(), &mut all);
    all.sort();
    let mut edges = BTreeMap::new();
    for path in &all {
        let module = module_of(path);
        let from: Vec<String> = module
            .split("::")
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect();
        let text = fs::read_to_string(path).unwrap();
        for (n, line) in text.lines().enumerate() {
            for named in paths(&code(line)) {
                let to = full_target(&named, &module, &roots);
                let common = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
                // An import of an ancestor, or of something inside the importer: no siblings.
                let (Some(x), Some(y)) = (from.get(common), to.get(common)) else {
                    continue;
                };
                edges
                    .entry((from[..common].to_vec(), x.clone(), y.clone()))
                    .or_insert_with(|| format!("{}:{}: {}", path.display(), n + 1, line.trim()));
            }
        }
    }
    edges
}

/// The import circles of [`sibling_imports`] between two siblings of which at least one is a
/// folder: each as its two places.
fn folder_circles(edges: &BTreeMap<(Vec<String>, String, String), String>) -> Vec<String> {
    let mut bad = Vec::new();
    for ((parent, x, y), at) in edges {
        if x >= y || !(is_folder(parent, x) || is_folder(parent, y)) {
            continue;
        }
        if let Some(back) = edges.get(&(parent.clone(), y.clone(), x.clone())) {
            bad.push(format!(
                "`{0}{x}` and `{0}{y}` import each other:\n  {at}\n  {back}",
                parent.iter().map(|s| format!("{s}::")).collect::<String>()
            ));
        }
    }
    bad
}

/// Circles between siblings that were there before this check, each with why it is left: (one
/// sibling, the other, reason). No new one may join, and each must still exist (remove it from
/// here once it is gone).
const KNOWN_CIRCLES: &[(&str, &str, &str)] = &[
    (
        "protocol",
        "wait",
        "the folder `wait` holds two layers: `wait::list` (below `protocol`) and the waits (above)",
    ),
    (
        "shared",
        "wait",
        "the folder `wait` holds two layers: `wait::list` (below `shared`) and the waits (above)",
    ),
    (
        "handle::admission",
        "handle::events",
        "one layer: the event hooks take the admission's class code",
    ),
    (
        "handle::builder",
        "handle::bulkhead",
        "one layer: the builder builds the handle it is reached from",
    ),
    (
        "handle::bulkhead",
        "handle::events",
        "one layer: `subscribe` is a `Bulkhead` method beside the hooks",
    ),
    (
        "llm::dedup",
        "llm::events",
        "one layer: the event enum names each feature's payload",
    ),
    (
        "llm::events",
        "llm::observe",
        "one layer: the event enum names each feature's payload",
    ),
    (
        "protocol::class_pump",
        "protocol::classed",
        "one layer: the pump decides with the class protocol, whose decreases pump",
    ),
    (
        "protocol::classed",
        "protocol::token_wait",
        "one layer: token waiting reads class refusals; class refunds feed it",
    ),
];

/// The circles of `folder_circles` that [`KNOWN_CIRCLES`] does not list, and the listed ones
/// that are gone.
fn circles_beyond_known(
    edges: &BTreeMap<(Vec<String>, String, String), String>,
) -> (Vec<String>, Vec<String>) {
    let found = folder_circles(edges);
    let named = |a: &str, b: &str| format!("`{a}` and `{b}` import each other:");
    let new = found
        .iter()
        .filter(|c| {
            !KNOWN_CIRCLES
                .iter()
                .any(|(a, b, _)| c.starts_with(&named(a, b)))
        })
        .cloned()
        .collect();
    let gone = KNOWN_CIRCLES
        .iter()
        .filter(|(a, b, _)| !found.iter().any(|c| c.starts_with(&named(a, b))))
        .map(|(a, b, _)| format!("{a} <-> {b}"))
        .collect();
    (new, gone)
}

#[test]
fn no_import_circle_between_a_folder_and_a_sibling() {
    // Two siblings that import each other cannot be read (or moved) one without the other; the
    // rank table allows it inside one layer (`grace` and `record` were such a pair).
    let (new, gone) = circles_beyond_known(&sibling_imports());
    assert!(
        new.is_empty(),
        "{} import circles:\n{}",
        new.len(),
        new.join("\n")
    );
    assert!(
        gone.is_empty(),
        "circles no longer there: remove them from KNOWN_CIRCLES: {gone:?}"
    );
    for (a, b, why) in KNOWN_CIRCLES {
        assert!(!why.trim().is_empty(), "circle {a} <-> {b} has no reason");
    }
}

#[test]
fn the_circle_check_sees_a_circle() {
    // The check itself, on a made-up pair: `record` (a folder) and `grace` (a file beside it).
    let mut edges = sibling_imports();
    let key = |x: &str, y: &str| (Vec::new(), x.to_string(), y.to_string());
    edges.insert(key("grace", "record"), "grace.rs: use crate::record".into());
    edges.insert(
        key("record", "grace"),
        "record/stats.rs: use crate::grace".into(),
    );
    assert_eq!(circles_beyond_known(&edges).0.len(), 1);
}

#[test]
fn every_exception_is_still_needed_and_explained() {
    for (from, into, why) in EXCEPTIONS {
        assert!(
            !why.trim().is_empty(),
            "exception {from} -> {into} has no reason"
        );
        let (f, _, _) = layer_of(from).expect("exception from an unknown module");
        let (t, _, _) = layer_of(into).expect("exception into an unknown module");
        assert!(t > f, "exception {from} -> {into} is not upward: remove it");
    }
}

#[test]
fn no_source_file_is_too_long() {
    let mut all = Vec::new();
    files(&src(), &mut all);
    let long: Vec<String> = all
        .iter()
        .filter_map(|p| {
            let n = fs::read_to_string(p).unwrap().lines().count();
            (n > MAX_LINES).then(|| format!("{}: {n} lines", p.display()))
        })
        .collect();
    assert!(
        long.is_empty(),
        "files over {MAX_LINES} lines:\n{}",
        long.join("\n")
    );
}

#[test]
fn the_checker_sees_paths() {
    // The parser itself: groups, nested groups, `super`, root items, comments.
    let roots = root_items();
    let at = |code_line: &str, module: &str| -> Vec<String> {
        paths(&code(code_line))
            .iter()
            .map(|n| {
                layer_of(&target(n, module, &roots))
                    .map_or("?", |l| l.1)
                    .to_string()
            })
            .collect()
    };
    assert_eq!(
        at(
            "use crate::{vocab::demand::Demand, words::{state::Word, limits}}; // crate::handle",
            "protocol::x"
        ),
        ["vocab", "words", "words"]
    );
    assert_eq!(
        at(
            "let b: crate::Bulkhead = s(\"crate::llm\"); // crate::llm",
            "wait::x"
        ),
        ["handle"]
    );
    assert_eq!(
        at("use super::list::Waiter;", "wait::waiting"),
        ["wait::list"]
    );
    assert_eq!(at("use super::super::X;", "sync"), ["sync"]);
    assert!(layer_of("handle::bulkhead").unwrap().0 > layer_of("wait::waiting").unwrap().0);
    assert_eq!(layer_of("wait::list").unwrap().0, 3);
}
