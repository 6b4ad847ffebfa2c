//! The workspace's layout rules, checked on its sources (issue 20):
//!
//! - **modules import downward**: under any module, the sibling modules (and the module's own
//!   file, as one more sibling) never import each other in a cycle. A `mod.rs` that declares
//!   and re-exports its children holds nothing its children import;
//! - **files a reader holds in their head**: no source file over 700 lines, test files
//!   (`tests.rs`, `loom_tests.rs`, `tests/`, `benches/`) excepted;
//! - **one name per concept**: no two types of the libraries share a name, except the
//!   idioms where the name is the convention (`ResponseFuture` in a middleware's `future`
//!   module, a future's private `State`, the sealed-trait `Sealed`).
//!
//! The import check reads `use` trees and paths through `crate::`, `super::`, `self::` and
//! child modules, follows `pub use` re-exports to the module that defines the item, and
//! ignores comments and `#[cfg(test)]` / `#[cfg(loom)]` modules.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

const MAX_LINES: usize = 700;
const LIBRARIES: &[&str] = &[
    "overload-core",
    "overload-signal",
    "backoff-layer",
    "ratelimit-layer",
];
const SHARED_NAMES: &[&str] = &["ResponseFuture", "State", "Sealed"];

type ModPath = Vec<String>;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests package sits in the workspace")
        .to_path_buf()
}

fn crates() -> Vec<PathBuf> {
    let mut dirs: Vec<_> = fs::read_dir(workspace().join("crates"))
        .expect("crates/ exists")
        .map(|e| e.expect("a directory entry").path())
        .filter(|p| p.join("src").is_dir())
        .collect();
    dirs.sort();
    dirs
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

fn is_test_file(path: &Path) -> bool {
    let name = path.file_stem().and_then(|s| s.to_str()).unwrap_or("");
    name == "tests" || name.ends_with("_tests") || name == "testing"
}

/// The module path of a source file (`src/a/b.rs` and `src/a/b/mod.rs` are `a::b`).
fn module_of(src: &Path, file: &Path) -> ModPath {
    let rel = file.strip_prefix(src).expect("under src");
    let mut segs: ModPath = rel
        .with_extension("")
        .iter()
        .map(|s| s.to_string_lossy().into_owned())
        .collect();
    if segs.last().is_some_and(|s| s == "mod") {
        segs.pop();
    }
    if segs == ["lib"] {
        segs.clear();
    }
    segs
}

/// The source without comments, string literals, and test or loom modules.
fn strip(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i..].starts_with(b"//") {
            while i < bytes.len() && bytes[i] != b'\n' {
                i += 1;
            }
        } else if bytes[i..].starts_with(b"/*") {
            let end = text[i + 2..]
                .find("*/")
                .map_or(bytes.len(), |e| i + 2 + e + 2);
            i = end;
        } else if bytes[i] == b'"' {
            i += 1;
            while i < bytes.len() && bytes[i] != b'"' {
                if bytes[i] == b'\\' {
                    i += 1;
                }
                i += 1;
            }
            i += 1;
            out.push_str("\"\"");
        } else {
            out.push(bytes[i] as char);
            i += 1;
        }
    }
    // Test and loom modules: from the attribute to the module's closing brace.
    let mut result = out;
    for attr in [
        "#[cfg(test)]",
        "#[cfg(loom)]",
        "#[cfg(all(test, not(loom)))]",
        "#[cfg(all(test, loom))]",
    ] {
        while let Some(start) = find_module_after(&result, attr) {
            let open = result[start..].find('{').map(|o| start + o);
            let Some(open) = open else { break };
            let mut depth = 0usize;
            let mut end = result.len();
            for (k, c) in result[open..].char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => {
                        depth -= 1;
                        if depth == 0 {
                            end = open + k + 1;
                            break;
                        }
                    }
                    _ => {}
                }
            }
            result.replace_range(start..end, "");
        }
    }
    result
}

/// Where `attr` starts when the item it annotates is an inline module (`mod name {`).
fn find_module_after(text: &str, attr: &str) -> Option<usize> {
    let mut from = 0;
    while let Some(at) = text[from..].find(attr).map(|a| from + a) {
        let rest = text[at + attr.len()..].trim_start();
        let rest = rest
            .strip_prefix("pub(crate) ")
            .or_else(|| rest.strip_prefix("pub "))
            .unwrap_or(rest);
        if let Some(after) = rest.strip_prefix("mod ") {
            let name_end = after
                .find(|c: char| !(c.is_alphanumeric() || c == '_'))
                .unwrap_or(after.len());
            if after[name_end..].trim_start().starts_with('{') {
                return Some(at);
            }
        }
        from = at + attr.len();
    }
    None
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// Expands a `use` tree (`a::{b, c::{d, e}}`) into paths.
fn expand(tree: &str) -> Vec<String> {
    // NOTE: `as` survives the whitespace removal as ` as `, the only separator later code
    // splits an alias on (a path may contain "as", as in `class::Kind`).
    let words: Vec<&str> = tree.split_whitespace().collect();
    let tree: String = words
        .iter()
        .map(|w| if *w == "as" { " as " } else { w })
        .collect();
    let Some(open) = tree.find('{') else {
        return vec![tree];
    };
    let prefix = &tree[..open];
    let body = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
    let mut parts = Vec::new();
    let (mut depth, mut current) = (0, String::new());
    for c in body.chars() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            _ => {}
        }
        if c == ',' && depth == 0 {
            parts.push(std::mem::take(&mut current));
        } else {
            current.push(c);
        }
    }
    if !current.is_empty() {
        parts.push(current);
    }
    parts
        .iter()
        .flat_map(|p| expand(p))
        .map(|p| format!("{prefix}{p}"))
        .collect()
}

/// The `use` statements of a stripped source: (is it `pub`, its expanded paths).
fn use_statements(text: &str) -> Vec<(bool, Vec<String>)> {
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(at) = text[from..].find("use ").map(|a| from + a) {
        from = at + 4;
        if at > 0 && is_ident(text[..at].chars().last().unwrap_or(' ')) {
            continue;
        }
        let Some(end) = text[at..].find(';').map(|e| at + e) else {
            break;
        };
        let line_start = text[..at].rfind(['\n', ';', '{', '}']).map_or(0, |s| s + 1);
        let public = text[line_start..at].contains("pub");
        out.push((public, expand(&text[at + 4..end])));
        from = end;
    }
    out
}

/// Inline paths through `crate::`, `super::` and `self::`.
fn inline_paths(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for start in ["crate::", "super::", "self::"] {
        let mut from = 0;
        while let Some(at) = text[from..].find(start).map(|a| from + a) {
            from = at + start.len();
            if at > 0 && is_ident(text[..at].chars().last().unwrap_or(' ')) {
                continue;
            }
            let end = text[at..]
                .find(|c: char| !(is_ident(c) || c == ':'))
                .map_or(text.len(), |e| at + e);
            out.push(text[at..end].trim_end_matches(':').to_owned());
        }
    }
    out
}

struct Crate {
    name: String,
    modules: BTreeMap<ModPath, String>,
}

impl Crate {
    fn load(dir: &Path) -> Self {
        let src = dir.join("src");
        let mut files = Vec::new();
        rust_files(&src, &mut files);
        let modules = files
            .iter()
            .filter(|f| !is_test_file(f) && f.file_name().is_none_or(|n| n != "main.rs"))
            .map(|f| {
                let text = fs::read_to_string(f).expect("a readable source file");
                (module_of(&src, f), strip(&text))
            })
            .collect();
        Self {
            name: dir.file_name().unwrap().to_string_lossy().into_owned(),
            modules,
        }
    }

    /// `pub use child::Name` in each module: the child module that defines `Name`.
    fn reexports(&self) -> BTreeMap<ModPath, BTreeMap<String, Option<ModPath>>> {
        let mut all = BTreeMap::new();
        for (module, text) in &self.modules {
            let mut names = BTreeMap::new();
            for (public, paths) in use_statements(text) {
                if !public {
                    continue;
                }
                for path in paths {
                    let (path, alias) = match path.split_once(" as ") {
                        Some((p, a)) => (p.to_owned(), Some(a.to_owned())),
                        None => (path.clone(), None),
                    };
                    let name = alias
                        .unwrap_or_else(|| path.rsplit("::").next().unwrap_or_default().to_owned());
                    // NOTE: a re-export of another crate's item (`pub use overload_core::ConfigError`)
                    // is recorded as external: importing it through this module is importing
                    // that crate, not this module.
                    match self.resolve(module, &path, &BTreeMap::new()) {
                        Some(target) if target != *module => {
                            names.insert(name, Some(target));
                        }
                        Some(_) => {}
                        None => {
                            names.insert(name, None);
                        }
                    }
                }
            }
            all.insert(module.clone(), names);
        }
        all
    }

    /// The module a path from `module` names (the deepest module along it), following one
    /// level of re-export per hop.
    fn resolve(
        &self,
        module: &ModPath,
        path: &str,
        reexports: &BTreeMap<ModPath, BTreeMap<String, Option<ModPath>>>,
    ) -> Option<ModPath> {
        let mut segs: Vec<&str> = path.split("::").filter(|s| !s.is_empty()).collect();
        let mut base: ModPath = match segs.first().copied() {
            Some("crate") => {
                segs.remove(0);
                Vec::new()
            }
            Some("super" | "self") => {
                let mut base = module.clone();
                while let Some(&s @ ("super" | "self")) = segs.first() {
                    if s == "super" {
                        base.pop();
                    }
                    segs.remove(0);
                }
                base
            }
            Some(first) => {
                let mut child = module.clone();
                child.push(first.to_owned());
                if !self.modules.contains_key(&child) {
                    return None;
                }
                module.clone()
            }
            None => return None,
        };
        let segs: Vec<&str> = segs
            .into_iter()
            .filter(|s| *s != "*" && *s != "self")
            .collect();
        let mut rest = segs.as_slice();
        while let Some((first, tail)) = rest.split_first() {
            let mut next = base.clone();
            next.push((*first).to_owned());
            if self.modules.contains_key(&next) {
                base = next;
                rest = tail;
            } else {
                break;
            }
        }
        // Follow re-exports (`crate::Thing` defined in `crate::thing`), a few hops at most.
        let mut hops = 0;
        while let Some(first) = rest.first() {
            match reexports.get(&base).and_then(|names| names.get(*first)) {
                Some(Some(target)) if hops < 8 => {
                    base = target.clone();
                    hops += 1;
                }
                Some(None) => return None,
                _ => break,
            }
        }
        Some(base)
    }

    fn edges(&self) -> BTreeSet<(ModPath, ModPath)> {
        let reexports = self.reexports();
        let mut edges = BTreeSet::new();
        for (module, text) in &self.modules {
            let mut paths: Vec<String> = use_statements(text)
                .into_iter()
                .flat_map(|(_, p)| p)
                .map(|p| p.split(" as ").next().unwrap_or_default().to_owned())
                .collect();
            paths.extend(inline_paths(text));
            for path in paths {
                if let Some(target) = self.resolve(module, &path, &reexports) {
                    if target != *module {
                        edges.insert((module.clone(), target));
                    }
                }
            }
        }
        edges
    }

    /// Every cycle among siblings, each as the file-level imports that make it.
    fn cycles(&self) -> Vec<String> {
        // Sibling-level edges, grouped by the parent module.
        let mut groups: BTreeMap<ModPath, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
        let mut witnesses: BTreeMap<(ModPath, String, String), Vec<String>> = BTreeMap::new();
        for (a, b) in self.edges() {
            let common = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
            let parent: ModPath = a[..common].to_vec();
            let side = |m: &ModPath| m.get(common).cloned().unwrap_or_else(|| "(self)".into());
            let (sa, sb) = (side(&a), side(&b));
            let group = groups.entry(parent.clone()).or_default();
            group.entry(sa.clone()).or_default().insert(sb.clone());
            group.entry(sb.clone()).or_default();
            witnesses.entry((parent, sa, sb)).or_default().push(format!(
                "{} -> {}",
                show(&a),
                show(&b)
            ));
        }
        let mut found = Vec::new();
        for (parent, graph) in &groups {
            for component in strongly_connected(graph) {
                let mut lines = vec![format!(
                    "{}: cycle among the children of `{}`: {:?}",
                    self.name,
                    show(parent),
                    component
                )];
                for ((p, a, b), w) in &witnesses {
                    if p == parent && component.contains(a) && component.contains(b) {
                        lines.extend(w.iter().map(|w| format!("    {w}")));
                    }
                }
                found.push(lines.join("\n"));
            }
        }
        found
    }
}

fn show(m: &ModPath) -> String {
    if m.is_empty() {
        "crate".into()
    } else {
        m.join("::")
    }
}

/// Tarjan's algorithm; components of more than one node.
fn strongly_connected(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct Tarjan<'g> {
        graph: &'g BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'g str, usize>,
        low: BTreeMap<&'g str, usize>,
        stack: Vec<&'g str>,
        next: usize,
        out: Vec<Vec<String>>,
    }
    impl<'g> Tarjan<'g> {
        fn visit(&mut self, v: &'g str) {
            self.index.insert(v, self.next);
            self.low.insert(v, self.next);
            self.next += 1;
            self.stack.push(v);
            for w in &self.graph[v] {
                if !self.index.contains_key(w.as_str()) {
                    self.visit(w);
                    let low = self.low[w.as_str()].min(self.low[v]);
                    self.low.insert(v, low);
                } else if self.stack.contains(&w.as_str()) {
                    let low = self.index[w.as_str()].min(self.low[v]);
                    self.low.insert(v, low);
                }
            }
            if self.low[v] == self.index[v] {
                let mut component = Vec::new();
                while let Some(w) = self.stack.pop() {
                    component.push(w.to_owned());
                    if w == v {
                        break;
                    }
                }
                if component.len() > 1 {
                    component.sort();
                    self.out.push(component);
                }
            }
        }
    }
    let mut t = Tarjan {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in graph.keys() {
        if !t.index.contains_key(v.as_str()) {
            t.visit(v);
        }
    }
    t.out
}

#[test]
fn no_module_imports_in_a_cycle() {
    let cycles: Vec<String> = crates()
        .iter()
        .flat_map(|c| Crate::load(c).cycles())
        .collect();
    assert!(cycles.is_empty(), "import cycles:\n{}", cycles.join("\n"));
}

#[test]
fn no_source_file_is_over_700_lines() {
    let mut files = Vec::new();
    for dir in crates() {
        for sub in ["src", "examples"] {
            rust_files(&dir.join(sub), &mut files);
        }
    }
    rust_files(&workspace().join("tests/src"), &mut files);
    let long: Vec<String> = files
        .iter()
        .filter(|f| !is_test_file(f))
        .filter_map(|f| {
            let lines = fs::read_to_string(f).expect("readable").lines().count();
            (lines > MAX_LINES).then(|| format!("{} ({lines} lines)", f.display()))
        })
        .collect();
    assert!(
        long.is_empty(),
        "files over {MAX_LINES} lines:\n{}",
        long.join("\n")
    );
}

#[test]
fn no_two_library_types_share_a_name() {
    let mut seen: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for dir in crates() {
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        if !LIBRARIES.contains(&name.as_str()) {
            continue;
        }
        let mut files = Vec::new();
        rust_files(&dir.join("src"), &mut files);
        for file in files.iter().filter(|f| !is_test_file(f)) {
            let text = strip(&fs::read_to_string(file).expect("readable"));
            for line in text.lines() {
                // Items at the start of a line, indented or not, but never an associated
                // type (`type Error = ..;` inside an impl is indented and has `=`).
                let item = line.trim_start();
                let item = item
                    .strip_prefix("pub(crate) ")
                    .or_else(|| item.strip_prefix("pub(super) "))
                    .or_else(|| item.strip_prefix("pub "))
                    .unwrap_or(item);
                let Some(rest) = ["struct ", "enum ", "trait "]
                    .iter()
                    .find_map(|k| item.strip_prefix(k))
                else {
                    continue;
                };
                let ident: String = rest.chars().take_while(|c| is_ident(*c)).collect();
                if ident.is_empty() || SHARED_NAMES.contains(&ident.as_str()) {
                    continue;
                }
                let rel = file.strip_prefix(workspace()).unwrap_or(file);
                seen.entry(ident)
                    .or_default()
                    .push(rel.display().to_string());
            }
        }
    }
    let dupes: Vec<String> = seen
        .into_iter()
        .filter(|(_, files)| files.len() > 1)
        .map(|(name, files)| format!("{name}: {}", files.join(", ")))
        .collect();
    assert!(
        dupes.is_empty(),
        "types that share a name:\n{}",
        dupes.join("\n")
    );
}

#[test]
fn the_checks_find_what_they_look_for() {
    // Model tests kept in the file they test are left out, as test modules are.
    assert!(!strip("#[cfg(all(test, loom))]\nmod loom_tests { use super::*; }").contains("super"));
    // A cycle between a module file and its child, and one through a re-export.
    let mut modules = BTreeMap::new();
    modules.insert(
        vec!["a".to_owned()],
        strip("mod b; pub use b::Thing; pub struct Other;"),
    );
    modules.insert(
        vec!["a".to_owned(), "b".to_owned()],
        strip("use super::Other; pub struct Thing; // use crate::z;"),
    );
    modules.insert(
        vec!["c".to_owned()],
        strip("use crate::a::Thing;\n#[cfg(test)]\nmod tests { use crate::d; }"),
    );
    modules.insert(
        vec!["d".to_owned()],
        strip("use crate::c::X; pub struct Y;"),
    );
    // An alias, a path containing "as", and an external re-export imported through the root.
    modules.insert(
        Vec::new(),
        strip("mod a; mod e; pub use other_crate::Error; pub use e::Thing as Renamed;"),
    );
    modules.insert(vec!["e".to_owned()], strip("pub struct Thing;"));
    modules.insert(
        vec!["f".to_owned()],
        strip("use crate::Error; use crate::Renamed; use crate::e::class_as::Kind as K;"),
    );
    let krate = Crate {
        name: "fixture".into(),
        modules,
    };
    let cycles = krate.cycles();
    assert_eq!(cycles.len(), 1, "{cycles:#?}");
    assert!(cycles[0].contains("a::b -> a"), "{}", cycles[0]);
    // `c -> a` resolves through the re-export to `a::b`, and `d -> c` is one way only.
    let edges = krate.edges();
    assert!(edges.contains(&(vec!["c".into()], vec!["a".into(), "b".into()])));
    assert!(!edges.contains(&(vec!["c".into()], vec!["d".into()])));
    assert!(
        edges.contains(&(vec!["f".into()], vec!["e".into()])),
        "{edges:?}"
    );
    assert!(
        !edges.contains(&(vec!["f".into()], Vec::new())),
        "an external re-export is no import of the root: {edges:?}"
    );

    // Names that contain "as" are not aliases; an alias is followed to what it names.
    let mut modules = BTreeMap::new();
    modules.insert(
        Vec::new(),
        strip("mod classify; mod retry; pub use classify::GiveUpReason; pub use retry::Layer;"),
    );
    modules.insert(
        vec!["classify".to_owned()],
        strip("pub struct GiveUpReason;"),
    );
    modules.insert(
        vec!["retry".to_owned()],
        strip(
            "use crate::classify::GiveUpReason;\nuse crate::GiveUpReason as Reason;\n\
               use crate::classify as sorting; pub struct Layer;",
        ),
    );
    let krate = Crate {
        name: "fixture".into(),
        modules,
    };
    assert!(krate.cycles().is_empty(), "{:#?}", krate.cycles());
    let edges = krate.edges();
    let to_classify = (vec!["retry".to_owned()], vec!["classify".to_owned()]);
    assert!(edges.contains(&to_classify), "{edges:?}");
    assert!(
        !edges
            .iter()
            .any(|(a, b)| a == &to_classify.0 && b.is_empty()),
        "{edges:?}"
    );
    let reexports = krate.reexports();
    assert_eq!(
        reexports[&Vec::new()]["GiveUpReason"],
        Some(vec!["classify".to_owned()])
    );
}
