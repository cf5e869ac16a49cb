//! The crate's layers, checked from its source: every `crate::…` path of every file under
//! `src/` is an arrow to the file it names, and the arrows must form no circle and point only
//! down the layers DESIGN.md draws (the list in `src/lib.rs`). A backend never names the
//! public objects above it; the public objects never name a face.
//!
//! Run alone with `cargo test -p ferroce --test layers`; a failure prints the circle, or the
//! arrow that points up, with the file and line that draw it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Each top-level module's layer: a file may name its own layer and those below.
const LAYERS: &[(&str, u8)] = &[
    // 0: the machine.
    ("sys", 0),
    ("udp", 0),
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
                        code: strip_comments(&text),
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

/// The paths a file names after `crate::`, with the line of each; `crate::{a, b::c}` gives
/// each member.
fn crate_paths(code: &str) -> Vec<(usize, Vec<String>)> {
    let mut out = Vec::new();
    let bytes = code.as_bytes();
    let mut at = 0;
    while let Some(found) = code[at..].find("crate::") {
        let start = at + found;
        at = start + "crate::".len();
        // `pub(crate) fn`, `$crate::`: not a path from the crate root.
        if start > 0 && (bytes[start - 1].is_ascii_alphanumeric() || bytes[start - 1] == b'_') {
            continue;
        }
        let line = code[..start].matches('\n').count() + 1;
        if code[at..].starts_with('{') {
            let mut depth = 0;
            let mut end = at;
            for (i, c) in code[at..].char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => {
                        depth -= 1;
                        if depth == 0 {
                            end = at + i;
                            break;
                        }
                    }
                    _ => {}
                }
            }
            let group = &code[at + 1..end];
            let mut depth = 0;
            let mut item = String::new();
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        out.push((line, segments(&item)));
                        item.clear();
                        continue;
                    }
                    _ => {}
                }
                item.push(c);
            }
            out.push((line, segments(&item)));
        } else {
            let tail: String = code[at..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == ':')
                .collect();
            out.push((line, segments(&tail)));
        }
    }
    out.retain(|(_, p)| !p.is_empty());
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
        .take_while(|s| !s.is_empty() && s != "self")
        .collect()
}

/// `lib.rs`'s re-exports: a name at the crate root, and the module it comes from.
fn root_reexports(lib: &Source) -> BTreeMap<String, Vec<String>> {
    let mut names = BTreeMap::new();
    for statement in lib.code.split(';') {
        let s = statement.trim();
        let Some(path) = s
            .strip_prefix("pub use ")
            .or_else(|| s.strip_prefix("pub(crate) use "))
        else {
            continue;
        };
        let (module, members) = match path.split_once("::{") {
            Some((m, rest)) => (m, rest.trim_end_matches('}')),
            None => path.rsplit_once("::").unwrap_or((path, path)),
        };
        let module: Vec<String> = module.split("::").map(str::to_owned).collect();
        for member in members.split(',') {
            let name = member.rsplit(" as ").next().unwrap().trim();
            if !name.is_empty() {
                names.insert(name.to_owned(), module.clone());
            }
        }
    }
    names
}

/// The graph: for each file, the files it names, with the line that names each.
type Graph = BTreeMap<PathBuf, BTreeMap<PathBuf, usize>>;

fn graph(files: &BTreeMap<PathBuf, Source>) -> Graph {
    let by_module: BTreeMap<&[String], &PathBuf> = files
        .iter()
        .map(|(p, s)| (s.module.as_slice(), p))
        .collect();
    let lib = &files[Path::new("lib.rs")];
    let reexports = root_reexports(lib);
    let mut graph = Graph::new();
    for (path, source) in files {
        if source.module.is_empty() {
            continue; // lib.rs declares and re-exports; its own arrows are the layers.
        }
        let arrows = graph.entry(path.clone()).or_default();
        for (line, mut segs) in crate_paths(&source.code) {
            if let Some(module) = reexports.get(&segs[0]) {
                let rest = segs.split_off(1);
                segs = module.iter().cloned().chain(rest).collect();
            }
            // The deepest module the path names that is a file of its own.
            let target = (1..=segs.len())
                .rev()
                .find_map(|n| by_module.get(&segs[..n]).copied());
            if let Some(target) = target.filter(|t| *t != path) {
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
    let code = "use crate::{a::B, c::{D, E}, f};\npub(crate) fn g() { crate::h::i(); }";
    let paths: Vec<Vec<String>> = crate_paths(code).into_iter().map(|(_, p)| p).collect();
    assert_eq!(
        paths,
        [vec!["a", "B"], vec!["c"], vec!["f"], vec!["h", "i"]]
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
