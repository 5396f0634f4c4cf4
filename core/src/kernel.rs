//! `KernelSource`: one self-contained device C++ text, ready for NVRTC, hipRTC or clang.
//!
//! Device code lives in header files embedded with `include_str!`. `#include "calico/..."`
//! lines are resolved here, each header once, so the compilers need no include paths for
//! Calico's own code and the whole text can be hashed for the compile cache.

use crate::{Error, Result};
use sha2::{Digest, Sha256};
use std::collections::HashSet;

/// A set of embedded headers: (include name, text).
pub type HeaderSet = &'static [(&'static str, &'static str)];

/// Device source for one kernel entry point.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelSource {
    /// The `extern "C"` entry point name.
    pub entry: String,
    /// The complete source text, defines first.
    pub text: String,
    /// SHA-256 of `text` and `entry`: identifies the kernel in the in-memory caches.
    pub digest: [u8; 32],
}

impl KernelSource {
    /// Builds a source from `main` with `#define NAME VALUE` lines for `defines` in front, and
    /// every `#include "..."` resolved from `headers` (searched in order). Angle-bracket
    /// includes are left for the compiler.
    pub fn assemble(
        entry: &str,
        main: &str,
        headers: &[HeaderSet],
        defines: &[(&str, String)],
    ) -> Result<KernelSource> {
        let mut text = String::with_capacity(main.len() * 2);
        for (name, value) in defines {
            text.push_str(&format!("#define {name} {value}\n"));
        }
        let mut seen = HashSet::new();
        expand(main, "<main>", headers, &mut seen, &mut text, 0)?;
        let mut h = Sha256::new();
        h.update(entry.as_bytes());
        h.update([0]);
        h.update(text.as_bytes());
        Ok(KernelSource {
            entry: entry.to_string(),
            text,
            digest: h.finalize().into(),
        })
    }

    /// Hex of the digest, for logs and file names.
    pub fn digest_hex(&self) -> String {
        hex(&self.digest)
    }
}

fn expand(
    src: &str,
    from: &str,
    headers: &[HeaderSet],
    seen: &mut HashSet<&'static str>,
    out: &mut String,
    depth: usize,
) -> Result<()> {
    if depth > 32 {
        return Err(Error::unsupported(format!(
            "include depth exceeded while expanding {from}"
        )));
    }
    for line in src.lines() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("#pragma once") {
            continue;
        }
        if let Some(name) = quoted_include(trimmed) {
            let (key, body) = headers
                .iter()
                .flat_map(|set| set.iter())
                .find(|(k, _)| *k == name)
                .ok_or_else(|| {
                    Error::unsupported(format!(
                        "{from} includes \"{name}\", which no header set provides"
                    ))
                })?;
            if seen.insert(key) {
                out.push_str(&format!("// ---- {key}\n"));
                expand(body, key, headers, seen, out, depth + 1)?;
            }
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    Ok(())
}

fn quoted_include(line: &str) -> Option<&str> {
    let rest = line.strip_prefix("#include")?.trim_start();
    let rest = rest.strip_prefix('"')?;
    rest.split('"').next()
}

/// Lower-case hex of bytes.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SET: HeaderSet = &[
        (
            "calico/a.h",
            "#pragma once\n#include \"calico/b.h\"\nint a;\n",
        ),
        ("calico/b.h", "#pragma once\nint b;\n"),
    ];

    #[test]
    fn includes_resolve_once_and_defines_come_first() {
        let src = KernelSource::assemble(
            "k",
            "#include \"calico/a.h\"\n#include \"calico/b.h\"\n#include <cuda_bf16.h>\nvoid k();\n",
            &[SET],
            &[("N", "4".into())],
        )
        .unwrap();
        assert!(src.text.starts_with("#define N 4\n"));
        assert_eq!(src.text.matches("int b;").count(), 1);
        assert!(src.text.find("int b;").unwrap() < src.text.find("int a;").unwrap());
        assert!(src.text.contains("#include <cuda_bf16.h>"));
    }

    #[test]
    fn unknown_include_is_an_error() {
        let err = KernelSource::assemble("k", "#include \"calico/missing.h\"\n", &[SET], &[])
            .unwrap_err();
        assert!(err.to_string().contains("calico/missing.h"));
    }

    #[test]
    fn digest_depends_on_defines() {
        let a = KernelSource::assemble("k", "x", &[], &[("N", "1".into())]).unwrap();
        let b = KernelSource::assemble("k", "x", &[], &[("N", "2".into())]).unwrap();
        assert_ne!(a.digest, b.digest);
    }
}
