//! Architecture invariants of the engine, checked on its source (see ARCHITECTURE.md):
//! the top-level modules of `crates/core/src` form layers, and every `crate::` path
//! points down. That keeps the module graph free of cycles and the tools out of the
//! engine. `cargo test -p ubtrfs-core --test architecture -- --nocapture` prints the
//! graph.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Bottom to top. A module may use only modules listed before it.
const LAYERS: &[&str] = &[
    "error",
    "tree",
    "io",
    "fs",
    "alloc",
    "backref",
    "qgroup",
    "transaction",
    "inode",
    "subvol",
    "relocation",
    "tree_log",
    "check",
    "tools",
    "fuzzing",
];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).expect("read src") {
        let p = e.expect("dir entry").path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The source without its trailing `#[cfg(test)] mod tests { ... }` (tests may
/// reach anywhere).
fn without_tests(text: &str) -> &str {
    match text.find("#[cfg(test)]\nmod tests") {
        Some(i) => &text[..i],
        None => text,
    }
}

/// Top-level modules named by `crate::x` paths, including `use crate::{x, y}`.
fn used_modules(text: &str, known: &BTreeSet<String>) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = text;
    while let Some(i) = rest.find("crate::") {
        rest = &rest[i + "crate::".len()..];
        let names: Vec<&str> = if let Some(group) = rest.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            group[..end]
                .split(',')
                .map(|s| s.trim().split("::").next().unwrap_or(""))
                .collect()
        } else {
            let end = rest
                .find(|c: char| !(c.is_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            vec![&rest[..end]]
        };
        for n in names {
            if known.contains(n) {
                out.insert(n.to_string());
            }
        }
    }
    out
}

fn module_graph() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let owner = |p: &Path| -> Option<String> {
        let rel = p.strip_prefix(&src).ok()?;
        let first = rel.components().next()?.as_os_str().to_str()?.to_string();
        let name = first.trim_end_matches(".rs").to_string();
        (name != "lib").then_some(name)
    };
    let known: BTreeSet<String> = files.iter().filter_map(|p| owner(p)).collect();
    let mut graph: BTreeMap<String, BTreeSet<String>> =
        known.iter().map(|m| (m.clone(), BTreeSet::new())).collect();
    for f in &files {
        let Some(m) = owner(f) else { continue };
        let text = std::fs::read_to_string(f).expect("read source");
        for used in used_modules(without_tests(&text), &known) {
            if used != m {
                graph.get_mut(&m).expect("known").insert(used);
            }
        }
    }
    graph
}

#[test]
fn modules_form_layers_and_every_import_points_down() {
    let graph = module_graph();
    println!("module graph of crates/core/src (bottom to top):");
    for m in LAYERS {
        let deps: Vec<&str> = graph
            .get(*m)
            .map_or(Vec::new(), |d| d.iter().map(String::as_str).collect());
        println!("  {m:<12} -> {}", deps.join(", "));
    }
    let layer = |m: &str| LAYERS.iter().position(|l| *l == m);
    let mut wrong = Vec::new();
    for (m, deps) in &graph {
        let Some(lm) = layer(m) else {
            wrong.push(format!(
                "module `{m}` is in no layer: add it to LAYERS and ARCHITECTURE.md"
            ));
            continue;
        };
        for d in deps {
            let below = matches!(layer(d), Some(ld) if ld < lm);
            if !below {
                wrong.push(format!("`{m}` uses `{d}`, which is not below it"));
            }
        }
    }
    assert!(wrong.is_empty(), "layering broken:\n{}", wrong.join("\n"));
}

#[test]
fn the_engine_never_imports_its_tools() {
    let graph = module_graph();
    for (m, deps) in &graph {
        if m != "tools" && m != "fuzzing" {
            assert!(!deps.contains("tools"), "`{m}` imports `tools`");
        }
    }
}
