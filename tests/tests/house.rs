//! House rules of the source tree, checked on every test run.
//!
//! **Imports run one way.** Inside each crate, the graph "file A names an item of
//! module B" (`use crate::…`, `crate::…` paths in code, `super::…`) has no circle.
//! A circle means two files can only be understood, tested and changed together.
//!
//! What counts as an edge, so the rule is easy to follow:
//! * a path is resolved to the longest module prefix that has its own file
//!   (`crate::units::hub::Hub` → `units/hub.rs`); a path through a re-export
//!   (`crate::Core` when `lib.rs` says `pub use core::Core`) is an edge to the
//!   re-exporting file, so code inside a crate imports from the defining module;
//! * a parent module's `mod child;` is not an edge, but a parent that *uses* an item
//!   of its child is, so a `mod.rs` holds declarations, re-exports and the items its
//!   children share only when they use none of their siblings' items through it;
//! * test code is left out: files named `tests.rs`, test directories, and everything
//!   after a `#[cfg(test)]` line (the convention here: test modules come last).
//!
//! **Folders too.** Within each folder of a crate (the crate root included), take
//! every file and every subfolder as one unit (a subfolder with everything below it,
//! the folder's own `mod.rs` or `lib.rs` as a unit of its own): the edges between
//! files give edges between units, and those have no circle either. Two folders
//! that import each other, or a folder and a file beside it, can only be understood
//! and changed together, even when no two files form a circle.
//!
//! **No room too big.** No source file of a crate that goes into the packages has
//! more than [`MAX_CODE_LINES`] code lines: lines that are neither blank nor a
//! comment (`//`, `//!`, `///`), counted up to the file's `#[cfg(test)]` module.
//! The shipped crates are the packages `make dist-build` builds (the `SHIPPED*`
//! lists of the Makefile) and every workspace crate they depend on (their
//! `[dependencies]`, not their dev-dependencies), so a new library the daemons link
//! is held to the rule without anyone listing it here. Test files (`tests.rs`,
//! `tests/` folders) are not shipped code.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ lives in the workspace")
        .to_path_buf()
}

/// Crate directories with a `src/` (the workspace members).
fn crate_dirs(root: &Path) -> Vec<PathBuf> {
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).expect("workspace manifest");
    let start = manifest.find("members").expect("members list");
    let list = &manifest[start..];
    let list = &list[list.find('[').unwrap() + 1..list.find(']').unwrap()];
    list.split(',')
        .map(|m| m.trim().trim_matches('"'))
        .filter(|m| !m.is_empty())
        .map(|m| root.join(m))
        .filter(|d| d.join("src").is_dir())
        .collect()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Module path of a file under `src/`: `lib.rs` → [], `a/mod.rs` and `a.rs` → [a],
/// `a/b.rs` → [a, b]. `None` for binary roots and test files.
fn module_of(src: &Path, file: &Path) -> Option<Vec<String>> {
    let rel = file.strip_prefix(src).ok()?;
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let last = parts.pop()?;
    if parts.iter().any(|p| p == "tests" || p == "bin") {
        return None;
    }
    match last.as_str() {
        "main.rs" | "tests.rs" => None,
        "lib.rs" if parts.is_empty() => Some(parts),
        "mod.rs" => Some(parts),
        other => {
            parts.push(other.trim_end_matches(".rs").to_string());
            Some(parts)
        }
    }
}

/// The production part of a file: everything before its first `#[cfg(test)]` line,
/// without comments.
fn production_text(text: &str) -> String {
    let mut out = String::new();
    for line in text.lines() {
        let t = line.trim_start();
        if t.starts_with("#[cfg(test)]") {
            break;
        }
        if t.starts_with("//") {
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// Expands one `use` tree (`a::{b, c::{d, e}}`) into its paths.
fn expand_use(tree: &str, prefix: &str, out: &mut Vec<String>) {
    let tree = tree.trim();
    if let Some(open) = tree.find('{') {
        let head = tree[..open].trim().trim_end_matches("::");
        let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
        let base = join(prefix, head);
        let mut depth = 0;
        let mut start = 0;
        for (i, c) in inner.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    expand_use(&inner[start..i], &base, out);
                    start = i + 1;
                }
                _ => {}
            }
        }
        expand_use(&inner[start..], &base, out);
    } else if !tree.is_empty() {
        let path = tree.split(" as ").next().unwrap_or(tree).trim();
        out.push(join(prefix, path));
    }
}

fn join(a: &str, b: &str) -> String {
    match (a.is_empty(), b.is_empty()) {
        (true, _) => b.to_string(),
        (_, true) => a.to_string(),
        _ => format!("{a}::{b}"),
    }
}

/// Every path the file names that starts with `crate`, `super` or `self`.
fn paths_in(text: &str) -> Vec<String> {
    let mut paths = Vec::new();
    // `use` statements, braces and all.
    let mut rest = text;
    while let Some(pos) = find_use(rest) {
        let after = &rest[pos..];
        let end = after.find(';').unwrap_or(after.len());
        let stmt = &after[..end];
        let tree = stmt.trim_start().trim_start_matches("use").trim();
        expand_use(tree, "", &mut paths);
        rest = &after[end..];
    }
    // Paths written in code: `crate::a::b::f(..)`, `super::x`.
    let bytes = text.as_bytes();
    for start in ["crate::", "super::", "self::"] {
        let mut from = 0;
        while let Some(i) = text[from..].find(start) {
            let at = from + i;
            from = at + start.len();
            if at > 0 && (bytes[at - 1].is_ascii_alphanumeric() || bytes[at - 1] == b'_') {
                continue;
            }
            let tail = &text[at..];
            let len = tail
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
                .unwrap_or(tail.len());
            paths.push(tail[..len].trim_end_matches(':').to_string());
        }
    }
    paths
}

/// Paths into the child module `child` written without `self::` (`child::Item`),
/// returned as `self::child::Item`.
fn child_paths(text: &str, child: &str) -> Vec<String> {
    let needle = format!("{child}::");
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(i) = text[from..].find(&needle) {
        let at = from + i;
        from = at + needle.len();
        let prev = if at > 0 { bytes[at - 1] } else { b' ' };
        if prev.is_ascii_alphanumeric() || prev == b'_' || prev == b':' {
            continue;
        }
        out.push(format!("self::{child}"));
    }
    out
}

fn find_use(text: &str) -> Option<usize> {
    let mut from = 0;
    while let Some(i) = text[from..].find("use ") {
        let at = from + i;
        let before = text[..at].chars().last();
        if before.is_none_or(|c| c.is_whitespace() || c == '{' || c == ';' || c == '}') {
            let line_start = text[..at].rfind('\n').map_or(0, |n| n + 1);
            let lead = text[line_start..at].trim();
            if lead.is_empty() || lead == "pub" || lead.starts_with("pub(") {
                return Some(at);
            }
        }
        from = at + 4;
    }
    None
}

/// Resolves a path named in module `here` to the module file it points into.
fn resolve(here: &[String], path: &str, modules: &BTreeSet<Vec<String>>) -> Option<Vec<String>> {
    let mut segs = path.split("::").filter(|s| !s.is_empty());
    let first = segs.next()?;
    // `super` is the parent module, whether the file is `a/b.rs` or `a/b/mod.rs`.
    let mut base: Vec<String> = match first {
        "crate" => Vec::new(),
        "self" => here.to_vec(),
        "super" => {
            let mut b = here.to_vec();
            b.pop();
            b
        }
        _ => return None,
    };
    let mut rest: Vec<&str> = Vec::new();
    for s in segs {
        if s == "super" && rest.is_empty() {
            base.pop();
        } else {
            rest.push(s);
        }
    }
    let mut best = base.clone();
    let mut cur = base;
    for s in rest {
        cur.push(s.to_string());
        if modules.contains(&cur) {
            best = cur.clone();
        } else {
            break;
        }
    }
    Some(best)
}

/// Strongly connected components with more than one member (Tarjan).
fn circles(graph: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>) -> Vec<Vec<Vec<String>>> {
    struct T<'a> {
        g: &'a BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
        index: BTreeMap<&'a Vec<String>, usize>,
        low: BTreeMap<&'a Vec<String>, usize>,
        on: BTreeSet<&'a Vec<String>>,
        stack: Vec<&'a Vec<String>>,
        next: usize,
        out: Vec<Vec<Vec<String>>>,
    }
    impl<'a> T<'a> {
        fn visit(&mut self, v: &'a Vec<String>) {
            self.index.insert(v, self.next);
            self.low.insert(v, self.next);
            self.next += 1;
            self.stack.push(v);
            self.on.insert(v);
            if let Some(ws) = self.g.get(v) {
                for w in ws {
                    let Some((w, _)) = self.g.get_key_value(w) else {
                        continue;
                    };
                    if !self.index.contains_key(w) {
                        self.visit(w);
                        let l = self.low[w].min(self.low[v]);
                        self.low.insert(v, l);
                    } else if self.on.contains(w) {
                        let l = self.index[w].min(self.low[v]);
                        self.low.insert(v, l);
                    }
                }
            }
            if self.low[v] == self.index[v] {
                let mut comp = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on.remove(w);
                    comp.push(w.clone());
                    if w == v {
                        break;
                    }
                }
                if comp.len() > 1 {
                    comp.sort();
                    self.out.push(comp);
                }
            }
        }
    }
    let mut t = T {
        g: graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        on: BTreeSet::new(),
        stack: Vec::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in graph.keys() {
        if !t.index.contains_key(v) {
            t.visit(v);
        }
    }
    t.out
}

fn show(m: &[String]) -> String {
    if m.is_empty() {
        "lib".into()
    } else {
        m.join("::")
    }
}

/// The file-level import graph of one crate (see the module docs).
fn crate_graph(src: &Path) -> BTreeMap<Vec<String>, BTreeSet<Vec<String>>> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut texts = BTreeMap::new();
    for f in &files {
        if let Some(m) = module_of(src, f) {
            let text = std::fs::read_to_string(f).expect("read source");
            texts.insert(m, production_text(&text));
        }
    }
    let modules: BTreeSet<Vec<String>> = texts.keys().cloned().collect();
    let mut graph: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    for (m, text) in &texts {
        let edges = graph.entry(m.clone()).or_default();
        let children = modules
            .iter()
            .filter(|c| c.len() == m.len() + 1 && c.starts_with(m))
            .map(|c| c[m.len()].as_str());
        let relative = children.flat_map(|c| child_paths(text, c));
        for p in paths_in(text).into_iter().chain(relative) {
            if let Some(target) = resolve(m, &p, &modules)
                && &target != m
            {
                edges.insert(target);
            }
        }
    }
    graph
}

/// The unit a module belongs to inside the folder `folder`: the next segment
/// below it (a file or a subfolder), `.` for the folder's own module, `None` for
/// modules outside the folder.
fn unit_in(folder: &[String], module: &[String]) -> Option<String> {
    if !module.starts_with(folder) {
        return None;
    }
    Some(
        module
            .get(folder.len())
            .cloned()
            .unwrap_or_else(|| ".".to_string()),
    )
}

/// For every folder of a crate that holds more than one unit, the circles
/// between its units, with the file edges that make them.
fn folder_circles(graph: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>) -> Vec<String> {
    let folders: BTreeSet<Vec<String>> = graph
        .keys()
        .flat_map(|m| (0..m.len()).map(|n| m[..n].to_vec()))
        .collect();
    let mut report = Vec::new();
    for folder in folders {
        let mut units: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
        let mut why: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
        for (a, targets) in graph {
            let Some(ua) = unit_in(&folder, a) else {
                continue;
            };
            units.entry(vec![ua.clone()]).or_default();
            for b in targets {
                let Some(ub) = unit_in(&folder, b) else {
                    continue;
                };
                if ua != ub {
                    units
                        .entry(vec![ua.clone()])
                        .or_default()
                        .insert(vec![ub.clone()]);
                    why.entry((ua.clone(), ub)).or_default().push(format!(
                        "{} -> {}",
                        show(a),
                        show(b)
                    ));
                }
            }
        }
        for circle in circles(&units) {
            let names: Vec<&str> = circle.iter().map(|u| u[0].as_str()).collect();
            let mut edges = Vec::new();
            for a in &names {
                for b in &names {
                    if let Some(files) = why.get(&(a.to_string(), b.to_string())) {
                        edges.push(format!("{a} -> {b} ({})", files.join(", ")));
                    }
                }
            }
            report.push(format!(
                "folder {}: {} units in a circle: {}\n    edges: {}",
                if folder.is_empty() {
                    "src".to_string()
                } else {
                    folder.join("/")
                },
                names.len(),
                names.join(", "),
                edges.join("; ")
            ));
        }
    }
    report
}

#[test]
fn imports_between_source_files_have_no_circle() {
    let root = workspace_root();
    let mut report = Vec::new();
    for dir in crate_dirs(&root) {
        let graph = crate_graph(&dir.join("src"));
        for circle in circles(&graph) {
            let names: Vec<String> = circle.iter().map(|m| show(m)).collect();
            let mut why = Vec::new();
            for a in &circle {
                for b in &graph[a] {
                    if circle.contains(b) {
                        why.push(format!("{} -> {}", show(a), show(b)));
                    }
                }
            }
            report.push(format!(
                "{}: {} files in a circle: {}\n    edges: {}",
                dir.file_name().unwrap().to_string_lossy(),
                names.len(),
                names.join(", "),
                why.join("; ")
            ));
        }
    }
    assert!(
        report.is_empty(),
        "imports run in circles (see tests/tests/house.rs for the rule):\n{}",
        report.join("\n")
    );
}

#[test]
fn imports_between_folders_have_no_circle() {
    let root = workspace_root();
    let mut report = Vec::new();
    for dir in crate_dirs(&root) {
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        for circle in folder_circles(&crate_graph(&dir.join("src"))) {
            report.push(format!("{name}: {circle}"));
        }
    }
    assert!(
        report.is_empty(),
        "folders import each other in circles (see tests/tests/house.rs for the rule):\n{}",
        report.join("\n")
    );
}

/// The most code lines a shipped source file may have (see the module docs).
const MAX_CODE_LINES: usize = 800;

/// Code lines of a file (see the module docs): not blank, not a comment, before
/// the first `#[cfg(test)]` line.
fn code_lines(text: &str) -> usize {
    text.lines()
        .map(str::trim_start)
        .take_while(|t| !t.starts_with("#[cfg(test)]"))
        .filter(|t| !t.is_empty() && !t.starts_with("//"))
        .count()
}

/// The `[dependencies]` of a crate manifest that are workspace crates (`drover-…`
/// or `droverctl`), by package name.
fn workspace_dependencies(manifest: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut in_deps = false;
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            in_deps = line == "[dependencies]";
            continue;
        }
        if !in_deps {
            continue;
        }
        let key = line
            .split(['=', '.'])
            .next()
            .unwrap_or_default()
            .trim()
            .to_string();
        if key.starts_with("drover") {
            out.push(key);
        }
    }
    out
}

/// The package name of a crate manifest (`[package]`'s `name`).
fn package_name(manifest: &str) -> Option<String> {
    let package = &manifest[manifest.find("[package]")?..];
    let line = package
        .lines()
        .find(|l| l.trim_start().starts_with("name"))?;
    Some(line.split('=').nth(1)?.trim().trim_matches('"').to_string())
}

/// The crate directories whose sources go into the packages: what the Makefile's
/// `SHIPPED*` lists name (`-p PACKAGE`), and the workspace crates they depend on.
fn shipped_crates(root: &Path) -> BTreeMap<String, PathBuf> {
    let by_name: BTreeMap<String, PathBuf> = crate_dirs(root)
        .into_iter()
        .filter_map(|dir| {
            let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).ok()?;
            Some((package_name(&manifest)?, dir))
        })
        .collect();
    let makefile = std::fs::read_to_string(root.join("Makefile")).expect("Makefile");
    let mut todo: Vec<String> = makefile
        .lines()
        .filter(|l| l.starts_with("SHIPPED"))
        .flat_map(|l| {
            let words: Vec<&str> = l.split_whitespace().collect();
            words
                .windows(2)
                .filter(|w| w[0] == "-p")
                .map(|w| w[1].to_string())
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(!todo.is_empty(), "the Makefile names no SHIPPED package");
    let mut shipped = BTreeMap::new();
    while let Some(name) = todo.pop() {
        if shipped.contains_key(&name) {
            continue;
        }
        let dir = by_name
            .get(&name)
            .unwrap_or_else(|| panic!("shipped package {name} is no workspace member"));
        let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).expect("crate manifest");
        todo.extend(workspace_dependencies(&manifest));
        shipped.insert(name, dir.clone());
    }
    shipped
}

#[test]
fn no_shipped_source_file_is_over_the_line_budget() {
    let root = workspace_root();
    let shipped = shipped_crates(&root);
    // What goes into the packages, and what does not (a change to the Makefile
    // or a manifest that drops one of these is a change to this rule).
    for name in [
        "drover-manager",
        "drover-agent",
        "drover-proxy",
        "droverctl",
        "drover-dns",
        "drover-tls",
        "drover-config",
        "drover-protocol",
        "drover-bus",
    ] {
        assert!(shipped.contains_key(name), "{name} ships: {shipped:?}");
    }
    for name in [
        "drover-testkit",
        "drover-sandbox",
        "drover-bench",
        "drover-tests",
    ] {
        assert!(!shipped.contains_key(name), "{name} does not ship");
    }
    let mut over = Vec::new();
    let mut checked = 0;
    for dir in shipped.values() {
        let mut files = Vec::new();
        rust_files(&dir.join("src"), &mut files);
        for file in files {
            let rel = file.strip_prefix(&root).unwrap_or(&file).to_path_buf();
            if rel.file_name().is_some_and(|n| n == "tests.rs") || rel.iter().any(|p| p == "tests")
            {
                continue;
            }
            let text = std::fs::read_to_string(&file).expect("read source");
            let n = code_lines(&text);
            checked += 1;
            if n > MAX_CODE_LINES {
                over.push(format!("{}: {n} code lines", rel.display()));
            }
        }
    }
    over.sort();
    assert!(
        over.is_empty(),
        "shipped files over {MAX_CODE_LINES} code lines (cut them at their seams, see \
         tests/tests/house.rs):\n{}",
        over.join("\n")
    );
    assert!(checked > 0, "no shipped source found");
}

#[test]
fn the_line_counter_skips_blanks_comments_and_tests() {
    let text = "//! Module doc.\n\nuse std::fmt;\n/// An item.\n    // a note\nfn a() {\n    1;\n}\n\
                #[cfg(test)]\nmod tests {\n    fn b() {}\n}\n";
    assert_eq!(code_lines(text), 4);
    let manifest = "[package]\nname = \"drover-x\"\n[dependencies]\n\
                    drover-protocol = { workspace = true }\ndrover-config.workspace = true\n\
                    anyhow = \"1\"\n[dev-dependencies]\ndrover-testkit.workspace = true\n";
    assert_eq!(package_name(manifest).as_deref(), Some("drover-x"));
    assert_eq!(
        workspace_dependencies(manifest),
        ["drover-protocol", "drover-config"]
    );
}

#[test]
fn the_checker_finds_a_circle_and_resolves_paths() {
    let modules: BTreeSet<Vec<String>> = [
        vec![],
        vec!["a".to_string()],
        vec!["a".to_string(), "b".to_string()],
        vec!["c".to_string()],
    ]
    .into_iter()
    .collect();
    let a = vec!["a".to_string()];
    let ab = vec!["a".to_string(), "b".to_string()];
    assert_eq!(resolve(&ab, "super::X", &modules), Some(a.clone()));
    assert_eq!(resolve(&[], "crate::a::b::f", &modules), Some(ab.clone()));
    assert_eq!(resolve(&a, "crate::Core", &modules), Some(vec![]));
    assert_eq!(resolve(&a, "std::x", &modules), None);
    let mut p = Vec::new();
    expand_use("crate::{a::{b::X, Y}, c}", "", &mut p);
    assert_eq!(p, ["crate::a::b::X", "crate::a::Y", "crate::c"]);
    let mut g: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    g.entry(a.clone()).or_default().insert(ab.clone());
    g.entry(ab.clone()).or_default().insert(a.clone());
    g.entry(vec!["c".to_string()])
        .or_default()
        .insert(a.clone());
    assert_eq!(circles(&g), vec![vec![a, ab]]);

    // Folders: `a/x` -> `b` and `b` -> `a/y` is no circle between files, but
    // one between the folder `a` and the file `b`; inside `a`, none.
    let m = |p: &[&str]| p.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let mut g: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    g.entry(m(&["a", "x"])).or_default().insert(m(&["b"]));
    g.entry(m(&["b"])).or_default().insert(m(&["a", "y"]));
    g.entry(m(&["a", "y"])).or_default();
    let found = folder_circles(&g);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].starts_with("folder src: 2 units in a circle: a, b"),
        "{found:?}"
    );
    assert!(found[0].contains("a -> b (a::x -> b)"), "{found:?}");
    // The same edges one level down (`c/a/x`, `c/b`) are found in folder `c`.
    let mut g: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    g.entry(m(&["c", "a", "x"]))
        .or_default()
        .insert(m(&["c", "b"]));
    g.entry(m(&["c", "b"]))
        .or_default()
        .insert(m(&["c", "a", "y"]));
    g.entry(m(&["c", "a", "y"])).or_default();
    let found = folder_circles(&g);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].starts_with("folder c: 2 units in a circle"),
        "{found:?}"
    );
    // A folder's own file counts as a unit: `a` (a/mod.rs) -> `a/x` -> `a` is a
    // file circle and a circle inside folder `a`, not one at the top.
    let mut g: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    g.entry(m(&["a"])).or_default().insert(m(&["a", "x"]));
    g.entry(m(&["a", "x"])).or_default().insert(m(&["a"]));
    let found = folder_circles(&g);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].starts_with("folder a: 2 units in a circle: ., x"),
        "{found:?}"
    );
}
