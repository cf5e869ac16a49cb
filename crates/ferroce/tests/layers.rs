//! The crate's layers, checked from its source: every `crate::…` path of every file under
//! `src/` is an arrow to the file it names, and the arrows must form no circle and point only
//! down the layers DESIGN.md draws (the list in `src/lib.rs`). A backend never names the
//! public objects above it; the public objects never name a face.
//!
//! Run alone with `cargo test -p ferroce --test layers`; a failure prints the circle, or the
//! arrow that points up, with the file and line that draw it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Each top-level module's layer: a file may name its own layer and those below.
const LAYERS: &[(&str, u8)] = &[
    // 0: the machine.
    ("sys", 0),
    ("udp", 0),
    // Timed marks along the datagram path and the backend (`turn-steps`): they name nothing.
    ("steps", 0),
    // 1: data the API and both backends speak; memory kinds and tools' decoders.
    ("attr", 1),
    ("error", 1),
    ("memory", 1),
    ("device", 1),
    ("cuda", 1),
    ("capture", 1),
    ("decode", 1),
    // 2: the backends and their contract.
    ("backend", 2),
    // 3: the public objects.
    ("nic", 3),
    ("cq", 3),
    ("qp", 3),
    ("srq", 3),
    ("region", 3),
    ("ud", 3),
    ("verbs", 3),
    // 4: services on the objects, and the composition root.
    ("cm", 4),
    ("oob", 4),
    ("exchange", 4),
    ("open", 4),
    // 5: the faces.
    ("frames", 5),
    ("session", 5),
    ("cache", 5),
];

/// One source file: its module path and its text with comments taken out.
struct Source {
    module: Vec<String>,
    code: String,
}

fn src_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn read_sources() -> BTreeMap<PathBuf, Source> {
    let root = src_dir();
    let mut files = BTreeMap::new();
    let mut stack = vec![root.clone()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let rel = path.strip_prefix(&root).unwrap().to_path_buf();
                let mut module: Vec<String> = rel
                    .with_extension("")
                    .iter()
                    .map(|s| s.to_string_lossy().into_owned())
                    .collect();
                if module.last().is_some_and(|m| m == "mod" || m == "lib") {
                    module.pop();
                }
                let text = std::fs::read_to_string(&path).unwrap();
                files.insert(
                    rel,
                    Source {
                        module,
                        code: strip_test_modules(&strip_comments(&text)),
                    },
                );
            }
        }
    }
    files
}

/// The text with `//` comments (doc comments included) blanked, line numbers kept. String
/// literals that hold `//` are rare enough here not to matter: a blanked tail only hides a
/// path, never invents one.
fn strip_comments(text: &str) -> String {
    text.lines()
        .map(|line| match line.find("//") {
            Some(at) => &line[..at],
            None => line,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The code without its `#[cfg(test)] mod … { … }` blocks: a test module is not part of the
/// structure (and its `super` is the file itself, not the file's parent).
fn strip_test_modules(code: &str) -> String {
    let mut out = code.to_owned();
    while let Some(start) = out.find("#[cfg(test)]") {
        let after = start + "#[cfg(test)]".len();
        let rest = out[after..].trim_start();
        if !rest.starts_with("mod ") {
            // An item, not a module: keep it, and look past it.
            out.replace_range(start..after, "");
            continue;
        }
        let Some(open) = out[after..].find('{').map(|i| after + i) else {
            break;
        };
        let mut depth = 0;
        let mut end = out.len();
        for (i, c) in out[open..].char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = open + i + 1;
                        break;
                    }
                }
                _ => {}
            }
        }
        // Keep the line count, so that lines still point at the file.
        let blank: String = out[start..end].chars().filter(|&c| c == '\n').collect();
        out.replace_range(start..end, &blank);
    }
    out
}

/// The paths a file names after `root::` (`crate`, `super` or `self`), with the line of each;
/// `crate::{a, b::c}` gives each member.
fn rooted_paths(code: &str, root: &str) -> Vec<(usize, Vec<String>)> {
    let mut out = Vec::new();
    let bytes = code.as_bytes();
    let needle = format!("{root}::");
    let mut at = 0;
    while let Some(found) = code[at..].find(&needle) {
        let start = at + found;
        at = start + needle.len();
        // `pub(crate) fn`, `$crate::`, `super::super::`: not a path from this root.
        if start > 0
            && (bytes[start - 1].is_ascii_alphanumeric()
                || bytes[start - 1] == b'_'
                || bytes[start - 1] == b'$'
                || bytes[start - 1] == b':')
        {
            continue;
        }
        let line = code[..start].matches('\n').count() + 1;
        // `super::super::x`: each `super` climbs one module.
        let mut ups = vec![root.to_owned()];
        while root == "super" && code[at..].starts_with("super::") {
            ups.push("super".to_owned());
            at += "super::".len();
        }
        for path in group_members(&code[at..]) {
            let full: Vec<String> = ups.iter().cloned().chain(path).collect();
            if full.len() > 1 {
                out.push((line, full));
            }
        }
    }
    out
}

/// The paths at the start of `text`: one path, or each member of a `{…}` group.
fn group_members(text: &str) -> Vec<Vec<String>> {
    if !text.starts_with('{') {
        let tail: String = text
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == ':')
            .collect();
        return vec![segments(&tail)];
    }
    let mut depth = 0;
    let mut end = text.len();
    for (i, c) in text.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    end = i;
                    break;
                }
            }
            _ => {}
        }
    }
    let mut members = Vec::new();
    let (mut depth, mut item) = (0, String::new());
    for c in text[1..end].chars() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                members.push(segments(&item));
                item.clear();
                continue;
            }
            _ => {}
        }
        item.push(c);
    }
    members.push(segments(&item));
    members
}

/// The paths of `use` statements that start at a child module of this file (`use child::X`
/// in a `mod.rs`), made absolute.
fn child_paths(code: &str, children: &BTreeSet<String>) -> Vec<(usize, Vec<String>)> {
    let mut out = Vec::new();
    for (i, line) in code.lines().enumerate() {
        let t = line.trim_start();
        let Some(rest) = ["pub use ", "pub(crate) use ", "pub(super) use ", "use "]
            .iter()
            .find_map(|p| t.strip_prefix(p))
        else {
            continue;
        };
        let first = segments(rest).into_iter().next().unwrap_or_default();
        if children.contains(&first) {
            for path in group_members(rest) {
                out.push((i + 1, path));
            }
        }
    }
    out
}

/// Every path a file names that may lead to another file of the crate, each starting with
/// its root (`crate`, `super`, `self`, or a child module).
fn crate_paths(code: &str, children: &BTreeSet<String>) -> Vec<(usize, Vec<String>)> {
    let mut out = rooted_paths(code, "crate");
    out.extend(rooted_paths(code, "super"));
    out.extend(rooted_paths(code, "self"));
    out.extend(child_paths(code, children));
    out
}

fn segments(path: &str) -> Vec<String> {
    path.split("::")
        .map(|s| {
            s.trim()
                .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .next()
                .unwrap_or("")
                .to_owned()
        })
        .take_while(|s| !s.is_empty() && s != "self" && s != "*")
        .collect()
}

/// A file's re-exports (`pub use`, `pub(crate) use`, `pub(super) use`): each name it gives
/// other modules, and the absolute path it comes from.
fn reexports(source: &Source, children: &BTreeSet<String>) -> BTreeMap<String, Vec<String>> {
    let mut names = BTreeMap::new();
    for statement in source.code.split(';') {
        let s = statement.trim();
        let Some(path) = ["pub use ", "pub(crate) use ", "pub(super) use "]
            .iter()
            .find_map(|p| s.strip_prefix(p))
        else {
            continue;
        };
        let (module, members) = match path.split_once("::{") {
            Some((m, rest)) => (m, rest.trim_end_matches('}')),
            None => path.rsplit_once("::").unwrap_or((path, path)),
        };
        let relative: Vec<String> = module.split("::").map(str::to_owned).collect();
        let Some(module) = absolute(&source.module, &relative, children) else {
            continue;
        };
        for member in members.split(',') {
            let name = member.rsplit(" as ").next().unwrap().trim();
            let original = member.split(" as ").next().unwrap().trim();
            if !name.is_empty() && name != "self" {
                let mut target = module.clone();
                target.push(original.to_owned());
                names.insert(name.to_owned(), target);
            }
        }
    }
    names
}

/// `path` as seen from `module`, from the crate root; `None` for another crate's.
fn absolute(
    module: &[String],
    path: &[String],
    children: &BTreeSet<String>,
) -> Option<Vec<String>> {
    let first = path.first()?;
    let mut base: Vec<String> = match first.as_str() {
        "crate" => Vec::new(),
        "self" => module.to_vec(),
        "super" => {
            let ups = path.iter().take_while(|s| *s == "super").count();
            let mut base = module.to_vec();
            base.truncate(base.len().checked_sub(ups)?);
            base.extend(path[ups..].iter().cloned());
            return Some(base);
        }
        child if children.contains(child) => module.to_vec(),
        _ => return None,
    };
    let skip = usize::from(matches!(first.as_str(), "crate" | "self"));
    base.extend(path[skip..].iter().cloned());
    Some(base)
}

/// The graph: for each file, the files it names, with the line that names each.
type Graph = BTreeMap<PathBuf, BTreeMap<PathBuf, usize>>;

fn graph(files: &BTreeMap<PathBuf, Source>) -> Graph {
    let by_module: BTreeMap<&[String], &PathBuf> = files
        .iter()
        .map(|(p, s)| (s.module.as_slice(), p))
        .collect();
    let children_of = |module: &[String]| -> BTreeSet<String> {
        files
            .values()
            .filter(|s| s.module.len() == module.len() + 1 && s.module.starts_with(module))
            .map(|s| s.module.last().unwrap().clone())
            .collect()
    };
    let reexported: BTreeMap<&[String], BTreeMap<String, Vec<String>>> = files
        .values()
        .map(|s| (s.module.as_slice(), reexports(s, &children_of(&s.module))))
        .collect();
    // The file a path names: the deepest module it goes through, following that module's
    // re-export of the next name (`crate::Nic` is `nic.rs`, `super::Cq` in a backend is its
    // `cq.rs`).
    let resolve = |mut segs: Vec<String>| -> Option<&PathBuf> {
        for _ in 0..8 {
            let depth = (0..=segs.len())
                .rev()
                .find(|&n| by_module.contains_key(&segs[..n]))?;
            let next = segs.get(depth);
            match next.and_then(|n| reexported[&segs[..depth]].get(n)) {
                Some(target) => {
                    let rest = segs.split_off(depth + 1);
                    segs = target.iter().cloned().chain(rest).collect();
                }
                None => return by_module.get(&segs[..depth]).copied(),
            }
        }
        None
    };
    let mut graph = Graph::new();
    for (path, source) in files {
        if source.module.is_empty() {
            continue; // lib.rs declares and re-exports; its own arrows are the layers.
        }
        let children = children_of(&source.module);
        let arrows = graph.entry(path.clone()).or_default();
        for (line, relative) in crate_paths(&source.code, &children) {
            let Some(abs) = absolute(&source.module, &relative, &children) else {
                continue;
            };
            // lib.rs only declares and re-exports, which `resolve` follows.
            let target = resolve(abs).filter(|t| *t != path && t.as_path() != Path::new("lib.rs"));
            if let Some(target) = target {
                arrows.entry(target.clone()).or_insert(line);
            }
        }
    }
    graph
}

/// A circle of files, if there is one.
fn find_circle(graph: &Graph) -> Option<Vec<PathBuf>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        Open,
        Done,
    }
    fn visit(
        node: &PathBuf,
        graph: &Graph,
        marks: &mut BTreeMap<PathBuf, Mark>,
        stack: &mut Vec<PathBuf>,
    ) -> Option<Vec<PathBuf>> {
        match marks.get(node) {
            Some(Mark::Done) => return None,
            Some(Mark::Open) => {
                let from = stack.iter().position(|n| n == node).unwrap();
                return Some(stack[from..].to_vec());
            }
            None => {}
        }
        marks.insert(node.clone(), Mark::Open);
        stack.push(node.clone());
        for next in graph.get(node).into_iter().flat_map(BTreeMap::keys) {
            if let Some(circle) = visit(next, graph, marks, stack) {
                return Some(circle);
            }
        }
        stack.pop();
        marks.insert(node.clone(), Mark::Done);
        None
    }
    let mut marks = BTreeMap::new();
    graph
        .keys()
        .find_map(|node| visit(node, graph, &mut marks, &mut Vec::new()))
}

fn layer_of(module: &[String]) -> u8 {
    let top = module.first().map_or("", String::as_str);
    LAYERS
        .iter()
        .find(|(name, _)| *name == top)
        .map(|(_, layer)| *layer)
        .unwrap_or_else(|| panic!("module `{top}` is in no layer: add it to LAYERS"))
}

#[test]
fn no_file_imports_a_file_that_imports_it_back() {
    let files = read_sources();
    let graph = graph(&files);
    if let Some(circle) = find_circle(&graph) {
        let mut text = String::new();
        for (i, from) in circle.iter().enumerate() {
            let to = &circle[(i + 1) % circle.len()];
            let line = graph[from][to];
            text.push_str(&format!(
                "\n  {} (line {line}) -> {}",
                from.display(),
                to.display()
            ));
        }
        panic!("an import circle in crates/ferroce/src:{text}");
    }
}

#[test]
fn every_arrow_points_down_the_layers() {
    let files = read_sources();
    let graph = graph(&files);
    let mut up = Vec::new();
    for (from, arrows) in &graph {
        let from_layer = layer_of(&files[from].module);
        for (to, line) in arrows {
            let to_layer = layer_of(&files[to].module);
            if to_layer > from_layer {
                up.push(format!(
                    "\n  {}:{line} (layer {from_layer}) names {} (layer {to_layer})",
                    from.display(),
                    to.display()
                ));
            }
        }
    }
    assert!(up.is_empty(), "arrows that point up:{}", up.concat());
}

#[test]
fn the_check_sees_arrows_and_circles() {
    // The parser finds grouped, nested and inline paths, and skips `pub(crate)`.
    let code = "use crate::{a::B, c::{D, E}, f};\npub(crate) fn g() { crate::h::i(); }\n\
                use super::super::j::K;\nuse child::L;";
    let children = BTreeSet::from(["child".to_owned()]);
    let paths: Vec<Vec<String>> = crate_paths(code, &children)
        .into_iter()
        .map(|(_, p)| p)
        .collect();
    assert_eq!(
        paths,
        [
            vec!["crate", "a", "B"],
            vec!["crate", "c"],
            vec!["crate", "f"],
            vec!["crate", "h", "i"],
            vec!["super", "super", "j", "K"],
            vec!["child", "L"],
        ]
    );
    let module = ["backend".to_owned(), "soft".to_owned(), "qp".to_owned()];
    assert_eq!(
        absolute(&module, &paths[4], &children),
        Some(vec!["backend".to_owned(), "j".to_owned(), "K".to_owned()])
    );
    // A circle of two is found; the real graph has arrows to check at all.
    let mut g = Graph::new();
    g.entry("x.rs".into()).or_default().insert("y.rs".into(), 1);
    g.entry("y.rs".into()).or_default().insert("x.rs".into(), 1);
    assert_eq!(find_circle(&g).map(|c| c.len()), Some(2));
    let real = graph(&read_sources());
    let arrows: usize = real.values().map(BTreeMap::len).sum();
    assert!(
        arrows > 40,
        "only {arrows} arrows: the parser lost the imports"
    );
    assert!(
        real[Path::new("cm.rs")].contains_key(Path::new("qp.rs")),
        "cm.rs names crate::qp"
    );
}
