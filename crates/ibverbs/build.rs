//! Generates, from `src/exports.txt`, the linker version script and the
//! assembly labels of the exported C names; links the cdylib as
//! `libibverbs.so.1`; builds the stub `libmlx5.so.1` / `libefa.so.1` that
//! Debian's perftest needs beside it; and assembles the install directory
//! `target/<profile>/uroce-lib/` (symlinks to the cdylib plus the stubs).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Version nodes in order, each with its parent (rdma-core's chains).
const NODES: &[(&str, Option<&str>)] = &[
    ("IBVERBS_1.0", None),
    ("IBVERBS_1.1", Some("IBVERBS_1.0")),
    ("IBVERBS_1.5", Some("IBVERBS_1.1")),
    ("IBVERBS_1.6", Some("IBVERBS_1.5")),
    ("IBVERBS_1.7", Some("IBVERBS_1.6")),
    ("IBVERBS_1.8", Some("IBVERBS_1.7")),
    ("IBVERBS_1.9", Some("IBVERBS_1.8")),
    ("IBVERBS_1.10", Some("IBVERBS_1.9")),
    ("IBVERBS_1.11", Some("IBVERBS_1.10")),
    ("IBVERBS_1.12", Some("IBVERBS_1.11")),
    ("IBVERBS_1.13", Some("IBVERBS_1.12")),
    ("IBVERBS_1.14", Some("IBVERBS_1.13")),
    ("IBVERBS_PRIVATE_34", None),
    ("RDMACM_1.0", None),
    ("RDMACM_1.1", Some("RDMACM_1.0")),
    ("RDMACM_1.2", Some("RDMACM_1.1")),
    ("RDMACM_1.3", Some("RDMACM_1.2")),
];

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap());
    let table = std::fs::read_to_string(manifest.join("src/exports.txt")).unwrap();
    println!("cargo:rerun-if-changed=src/exports.txt");
    println!("cargo:rerun-if-changed=stubs");

    let mut entries = Vec::new();
    for line in table.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')) {
        let w: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(w.len(), 3, "exports.txt: bad line {line:?}");
        assert!(NODES.iter().any(|(n, _)| *n == w[1]), "exports.txt: unknown node {}", w[1]);
        entries.push((w[0], w[1], w[2]));
    }

    // The version script: `local: *` once, in the first node.
    let mut map = String::new();
    for (i, (node, parent)) in NODES.iter().enumerate() {
        let _ = writeln!(map, "{node} {{");
        let names: Vec<_> = entries.iter().filter(|e| e.1 == *node).collect();
        if !names.is_empty() {
            map.push_str("  global:\n");
            for (name, _, _) in names {
                let _ = writeln!(map, "    {name};");
            }
        }
        if i == 0 {
            map.push_str("  local: *;\n");
        }
        match parent {
            Some(p) => {
                let _ = writeln!(map, "}} {p};");
            }
            None => map.push_str("};\n"),
        }
    }
    let map_path = out.join("exports.map");
    std::fs::write(&map_path, map).unwrap();

    // One label per name that jumps to the Rust function; `@byte` names a
    // one-byte variable instead (a flag providers set, never read here).
    let mut asm = String::new();
    for (name, _, module) in &entries {
        if *module == "@byte" {
            let _ = writeln!(
                asm,
                "core::arch::global_asm!(\".pushsection .bss.{name},\\\"aw\\\",@nobits\\n.globl {name}\\n.type {name},@object\\n.size {name}, 1\\n{name}:\\n  .zero 1\\n.popsection\");"
            );
            continue;
        }
        let _ = writeln!(
            asm,
            "core::arch::global_asm!(\".globl {name}\\n.type {name},@function\\n{name}:\\n  jmp {{f}}\\n.size {name}, .-{name}\", f = sym crate::{module}::{name}, options(att_syntax));"
        );
    }
    std::fs::write(out.join("exports_asm.rs"), asm).unwrap();

    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") {
        println!("cargo:rustc-cdylib-link-arg=-Wl,--version-script={}", map_path.display());
        println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libibverbs.so.1");
        install_dir(&manifest, &out);
    }
}

/// `target/<profile>/uroce-lib/`: what `LD_LIBRARY_PATH` points at.
fn install_dir(manifest: &Path, out: &Path) {
    // OUT_DIR is target/<profile>/build/<pkg>-<hash>/out.
    let Some(profile_dir) = out.ancestors().nth(3) else { return };
    let dir = profile_dir.join("uroce-lib");
    std::fs::create_dir_all(&dir).unwrap();
    for name in ["libibverbs.so.1", "librdmacm.so.1"] {
        let link = dir.join(name);
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink("../liburoce_ibverbs.so", &link).unwrap();
    }
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    for (stub, soname) in [("mlx5", "libmlx5.so.1"), ("efa", "libefa.so.1")] {
        let src = manifest.join("stubs").join(format!("{stub}.c"));
        let ver = manifest.join("stubs").join(format!("{stub}.map"));
        let status = Command::new(&cc)
            .args(["-shared", "-fPIC", "-O2", "-Wall", "-Werror", "-o"])
            .arg(dir.join(soname))
            .arg(format!("-Wl,-soname,{soname}"))
            .arg(format!("-Wl,--version-script={}", ver.display()))
            .arg(&src)
            .status()
            .expect("running the C compiler for the provider stubs");
        assert!(status.success(), "building {soname} failed");
    }
}
