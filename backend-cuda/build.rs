//! Embeds every header under device/ so new tile headers need no Rust edits.
use std::fmt::Write;
use std::path::Path;

fn collect(dir: &Path, root: &Path, out: &mut Vec<String>) {
    // A build without its headers compiles no kernel: fail here, not at the first launch.
    let entries = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("reading the device headers in {}: {e}", dir.display()));
    let mut entries: Vec<_> = entries.flatten().map(|e| e.path()).collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            collect(&path, root, out);
        } else if matches!(path.extension().and_then(|e| e.to_str()), Some("h" | "cuh")) {
            let rel = path
                .strip_prefix(root)
                .expect("under root")
                .to_string_lossy()
                .replace('\\', "/");
            out.push(rel);
        }
    }
}

fn main() {
    // The manifest directory of this run, not of the build that compiled this script: cargo
    // reuses one compiled build script for checkouts that share a target directory (a git
    // worktree built into the same target/ left every later build reading the worktree's
    // headers, and none once it was removed).
    let manifest = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let root = Path::new(&manifest).join("device");
    println!("cargo:rerun-if-changed={}", root.display());
    let mut files = Vec::new();
    collect(&root, &root, &mut files);
    assert!(
        !files.is_empty(),
        "no device headers under {}",
        root.display()
    );
    let mut code = String::from("const DEVICE_HEADERS: HeaderSet = &[\n");
    for rel in &files {
        println!("cargo:rerun-if-changed={}", root.join(rel).display());
        writeln!(code, "    ({rel:?}, include_str!(concat!(env!(\"CARGO_MANIFEST_DIR\"), \"/device/{rel}\"))),").unwrap();
    }
    code.push_str("];\n");
    let out = Path::new(&std::env::var("OUT_DIR").unwrap()).join("device_headers.rs");
    std::fs::write(out, code).unwrap();
}
