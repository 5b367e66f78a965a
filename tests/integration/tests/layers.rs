//! The workspace's layers, checked from the sources (no build needed):
//!
//! - the provider kit and the banlieue controller depend on no provider, no hypervisor client
//!   and no simulator (`Cargo.toml`);
//! - inside every crate, the top-level modules import each other without a circle: a module's
//!   `crate::…` paths (outside comments and its `#[cfg(test)]` part) form an acyclic graph.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Folders that hold no crate and many files: build outputs (the lab guest image's root
/// filesystem, a Debian tree, and the control plane's binaries).
const NOT_SOURCES: [&str; 4] = ["target", "node_modules", "out", "bin"];

/// Every crate directory of the workspace with a `src/` (not `target/`, not `.work/`, no build
/// output, no symlink: a guest image's links point into the host's `/`).
fn crate_dirs(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        let name = name.to_string_lossy();
        let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
        if !is_dir || name.starts_with('.') || NOT_SOURCES.contains(&name.as_ref()) {
            continue;
        }
        if path.join("Cargo.toml").is_file() && path.join("src").is_dir() {
            out.push(path.clone());
        }
        crate_dirs(&path, out);
    }
}

/// The top-level module a source file belongs to (`src/a.rs` and `src/a/b.rs` → `a`).
fn top_module(src: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src).ok()?;
    let first = rel
        .components()
        .next()?
        .as_os_str()
        .to_string_lossy()
        .into_owned();
    Some(first.strip_suffix(".rs").unwrap_or(&first).to_owned())
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The `crate::<module>` paths of `code` (`crate::a::X`, `crate::{a, b::{X, Y}, c}`).
fn crate_paths(code: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let ident = |s: &str| -> String {
        s.trim()
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    for (i, _) in code.match_indices("crate::") {
        let rest = &code[i + "crate::".len()..];
        let Some(group) = rest.strip_prefix('{') else {
            out.insert(ident(rest));
            continue;
        };
        // The group's top-level items, up to its own closing brace.
        let (mut depth, mut start) = (0usize, 0usize);
        for (at, c) in group.char_indices() {
            match c {
                '{' => depth += 1,
                '}' if depth == 0 => {
                    out.insert(ident(&group[start..at]));
                    break;
                }
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    out.insert(ident(&group[start..at]));
                    start = at + 1;
                }
                _ => {}
            }
        }
    }
    out.remove("");
    out
}

/// Module → the modules it imports, for one crate's `src/` (the crate root and `main.rs`
/// excluded: they wire the modules together).
fn module_graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let modules: BTreeSet<String> = files.iter().filter_map(|f| top_module(src, f)).collect();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in &files {
        let Some(module) = top_module(src, file) else {
            continue;
        };
        if module == "lib" || module == "main" {
            continue;
        }
        let text = std::fs::read_to_string(file).unwrap_or_default();
        // A file's unit tests: its `#[cfg(test)] mod …` and what follows.
        let production = text.split("#[cfg(test)]\nmod ").next().unwrap_or_default();
        let code: String = production
            .lines()
            .filter(|l| !l.trim_start().starts_with("//"))
            .collect::<Vec<_>>()
            .join("\n");
        let deps = graph.entry(module.clone()).or_default();
        deps.extend(
            crate_paths(&code)
                .into_iter()
                .filter(|d| *d != module && modules.contains(d)),
        );
    }
    graph
}

/// The circles of `graph` (strongly connected components of more than one module).
fn circles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    // Two modules are on a circle when each reaches the other.
    let reach = |from: &str| -> BTreeSet<String> {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from.to_owned()];
        while let Some(m) = todo.pop() {
            for d in graph.get(&m).into_iter().flatten() {
                if seen.insert(d.clone()) {
                    todo.push(d.clone());
                }
            }
        }
        seen
    };
    let reaches: BTreeMap<&String, BTreeSet<String>> = graph.keys().map(|m| (m, reach(m))).collect();
    let mut out: Vec<Vec<String>> = Vec::new();
    for (m, r) in &reaches {
        let circle: Vec<String> = r
            .iter()
            .filter(|o| reaches.get(o).is_some_and(|back| back.contains(*m)))
            .cloned()
            .collect();
        if circle.len() > 1 && !out.iter().any(|c| c.contains(m)) {
            out.push(circle);
        }
    }
    out
}

#[test]
fn no_crate_has_modules_importing_each_other_in_a_circle() {
    let mut dirs = Vec::new();
    crate_dirs(&workspace(), &mut dirs);
    assert!(dirs.len() > 10, "found only {dirs:?}");
    let mut found = Vec::new();
    for dir in &dirs {
        for circle in circles(&module_graph(&dir.join("src"))) {
            found.push(format!("{}: {}", dir.display(), circle.join(" ↔ ")));
        }
    }
    assert!(found.is_empty(), "module circles:\n{}", found.join("\n"));
}

#[test]
fn the_circle_check_sees_a_circle() {
    let graph: BTreeMap<String, BTreeSet<String>> = [
        ("a".to_owned(), ["b".to_owned()].into()),
        ("b".to_owned(), ["c".to_owned()].into()),
        ("c".to_owned(), ["a".to_owned()].into()),
        ("d".to_owned(), ["a".to_owned()].into()),
    ]
    .into();
    assert_eq!(
        circles(&graph),
        vec![vec!["a".to_owned(), "b".to_owned(), "c".to_owned()]]
    );
    assert_eq!(
        crate_paths("use crate::{x::{Y, Z}, z};\nlet v = crate::w::f();"),
        ["w", "x", "z"].map(str::to_owned).into()
    );
}

#[test]
fn the_kit_and_the_controller_depend_on_no_provider() {
    let forbidden = [
        "banlieue-proxmox",
        "banlieue-libvirt",
        "banlieue-vsphere",
        "banlieue-pve-client",
        "banlieue-pve-sim",
        "banlieue-vsphere-client",
        "virt",
    ];
    for manifest in ["providers/kit/Cargo.toml", "controllers/Cargo.toml"] {
        let text = std::fs::read_to_string(workspace().join(manifest)).expect(manifest);
        // Normal dependencies only: the [dependencies] table up to the next table.
        let deps = text
            .split("\n[dependencies]")
            .nth(1)
            .map(|rest| rest.split("\n[").next().unwrap_or_default())
            .unwrap_or_default();
        for line in deps.lines() {
            let name = line.split(['=', '.', ' ']).next().unwrap_or_default().trim();
            assert!(
                !forbidden.contains(&name),
                "{manifest} depends on {name}: the kit and the controller know no hypervisor"
            );
        }
    }
}
