//! The workspace's source layout rules, checked on the source text:
//!
//! - no circle of imports between the modules of a crate (a file that
//!   needs another's items and is needed by it back is one module split
//!   in two, and neither can be read, tested or moved alone). A module's
//!   own submodules may use their parent (`super::`): they are its parts.
//! - every library crate denies or forbids `unsafe` at its root, so that
//!   `unsafe` is allowed only in the modules that name it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

type Module = Vec<String>;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn crate_dirs() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(workspace().join("crates"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("src").is_dir())
        .collect();
    v.sort();
    v
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// `src/qp/mod.rs` → `qp`, `src/qp/responder/check.rs` → `qp::responder::check`.
fn module_of(src: &Path, file: &Path) -> Module {
    let rel = file.strip_prefix(src).unwrap().with_extension("");
    let mut parts: Module = rel.iter().map(|s| s.to_string_lossy().into_owned()).collect();
    if matches!(parts.last().map(String::as_str), Some("mod" | "lib" | "main")) {
        parts.pop();
    }
    parts
}

/// The code of a file without its comments and its unit-test module.
fn code_of(file: &Path) -> String {
    let text = std::fs::read_to_string(file).unwrap();
    let text = match text.find("#[cfg(test)]\nmod tests") {
        Some(i) => &text[..i],
        None => &text[..],
    };
    strip_comments(text)
}

fn strip_comments(text: &str) -> String {
    text.lines().map(|l| l.split("//").next().unwrap_or("")).collect::<Vec<_>>().join("\n")
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The paths a file's code names starting at `crate::`, `super::` or
/// `self::`, resolved to absolute module paths (possibly ending in items).
fn references(module: &Module, code: &str) -> Vec<Module> {
    let mut out = Vec::new();
    let bytes = code.as_bytes();
    let mut i = 0;
    while i < code.len() {
        if !code.is_char_boundary(i) {
            i += 1;
            continue;
        }
        let start_ok = i == 0 || !is_ident(bytes[i - 1] as char);
        let rest = &code[i..];
        let (mut base, skip) = if start_ok && rest.starts_with("crate::") {
            (Vec::new(), "crate::".len())
        } else if start_ok && rest.starts_with("self::") {
            (module.clone(), "self::".len())
        } else if start_ok && rest.starts_with("super::") {
            // `super` of `a::b` (file b.rs or b/mod.rs) is `a`.
            let mut m = module.clone();
            let mut n = 0;
            while code[i + n..].starts_with("super::") {
                m.pop();
                n += "super::".len();
            }
            (m, n)
        } else {
            i += 1;
            continue;
        };
        let tail: String =
            code[i + skip..].chars().take_while(|&c| is_ident(c) || c == ':').collect();
        base.extend(tail.split("::").filter(|s| !s.is_empty()).map(str::to_string));
        out.push(base);
        i += skip + tail.len().max(1);
    }
    out
}

/// For each crate: module → the modules it imports.
fn graph(crate_dir: &Path) -> BTreeMap<Module, BTreeSet<Module>> {
    let src = crate_dir.join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let modules: BTreeMap<Module, PathBuf> =
        files.into_iter().map(|f| (module_of(&src, &f), f)).collect();
    let mut edges: BTreeMap<Module, BTreeSet<Module>> = BTreeMap::new();
    for (m, f) in &modules {
        let e = edges.entry(m.clone()).or_default();
        for r in references(m, &code_of(f)) {
            // The longest prefix of the path that is a module file.
            let Some(target) =
                (1..=r.len()).rev().map(|k| r[..k].to_vec()).find(|p| modules.contains_key(p))
            else {
                continue;
            };
            let is_ancestor = m.len() >= target.len() && m[..target.len()] == target[..];
            if !is_ancestor {
                e.insert(target);
            }
        }
    }
    edges
}

/// The strongly connected components with more than one module (Tarjan).
fn circles(g: &BTreeMap<Module, BTreeSet<Module>>) -> Vec<Vec<Module>> {
    struct State<'a> {
        g: &'a BTreeMap<Module, BTreeSet<Module>>,
        index: BTreeMap<&'a Module, usize>,
        low: BTreeMap<&'a Module, usize>,
        stack: Vec<&'a Module>,
        next: usize,
        out: Vec<Vec<Module>>,
    }
    fn visit<'a>(s: &mut State<'a>, v: &'a Module) {
        s.index.insert(v, s.next);
        s.low.insert(v, s.next);
        s.next += 1;
        s.stack.push(v);
        for w in s.g.get(v).into_iter().flatten() {
            if !s.index.contains_key(w) {
                let w = s.g.get_key_value(w).map_or(w, |(k, _)| k);
                visit(s, w);
                let lw = s.low[w];
                let lv = s.low.get_mut(v).unwrap();
                *lv = (*lv).min(lw);
            } else if s.stack.contains(&w) {
                let iw = s.index[w];
                let lv = s.low.get_mut(v).unwrap();
                *lv = (*lv).min(iw);
            }
        }
        if s.low[v] == s.index[v] {
            let mut comp = Vec::new();
            while let Some(w) = s.stack.pop() {
                comp.push(w.clone());
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                s.out.push(comp);
            }
        }
    }
    let mut s = State {
        g,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in g.keys() {
        if !s.index.contains_key(v) {
            visit(&mut s, v);
        }
    }
    s.out
}

fn name(m: &Module) -> String {
    if m.is_empty() { "lib".into() } else { m.join("::") }
}

#[test]
fn no_import_circles_between_modules() {
    let mut found = Vec::new();
    for dir in crate_dirs() {
        let g = graph(&dir);
        for comp in circles(&g) {
            let crate_name = dir.file_name().unwrap().to_string_lossy().into_owned();
            let detail: Vec<String> = comp
                .iter()
                .map(|m| {
                    let to: Vec<String> =
                        g[m].iter().filter(|t| comp.contains(t)).map(name).collect();
                    format!("{} -> {}", name(m), to.join(", "))
                })
                .collect();
            found.push(format!("{crate_name}: {}", detail.join("; ")));
        }
    }
    assert!(found.is_empty(), "import circles:\n{}", found.join("\n"));
}

#[test]
fn the_checker_finds_a_circle() {
    let a: Module = vec!["a".into()];
    let b: Module = vec!["b".into()];
    let c: Module = vec!["c".into()];
    let code = strip_comments("use crate::b::Thing; // crate::c::Not\nfn f() { super::x(); }");
    let refs = references(&a, &code);
    assert_eq!(refs, vec![vec!["b".to_string(), "Thing".into()], vec!["x".to_string()]]);
    let mut g = BTreeMap::new();
    g.insert(a.clone(), BTreeSet::from([b.clone()]));
    g.insert(b.clone(), BTreeSet::from([c.clone()]));
    g.insert(c.clone(), BTreeSet::from([a.clone()]));
    assert_eq!(circles(&g).len(), 1);
    g.get_mut(&c).unwrap().clear();
    assert!(circles(&g).is_empty());
}

#[test]
fn library_crates_keep_unsafe_out_by_default() {
    for dir in crate_dirs() {
        let lib = dir.join("src/lib.rs");
        if !lib.exists() {
            continue;
        }
        let text = std::fs::read_to_string(&lib).unwrap();
        assert!(
            text.contains("#![forbid(unsafe_code)]") || text.contains("#![deny(unsafe_code)]"),
            "{} neither forbids nor denies unsafe_code at its root",
            lib.display()
        );
        assert!(!text.contains("#![allow(unsafe_code)]"), "{}: crate-wide unsafe", lib.display());
    }
}
