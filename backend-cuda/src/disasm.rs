//! Disassembling cubins with `cuobjdump` (from the CUDA toolkit or the nvidia-cuda-cuobjdump wheel).

use crate::nvrtc::tool_path;
use calico_core::{Error, Result};
use std::process::Command;

/// The SASS of a cubin, as printed by `cuobjdump -sass`.
pub fn sass(cubin: &[u8]) -> Result<String> {
    let tool = tool_path("cuobjdump").ok_or_else(|| Error::BackendUnavailable {
        backend: "cuda",
        reason:
            "cuobjdump not found in $CUDA_HOME/bin, $CUDA_PATH/bin, /usr/local/cuda/bin or PATH"
                .into(),
    })?;
    let dir = std::env::temp_dir().join(format!("calico-disasm-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let file = dir.join(format!(
        "k{}.cubin",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0)
    ));
    std::fs::write(&file, cubin)?;
    let out = Command::new(&tool).arg("-sass").arg(&file).output();
    let _ = std::fs::remove_file(&file);
    let out = out?;
    if !out.status.success() {
        return Err(Error::Runtime {
            backend: "cuda",
            call: "cuobjdump -sass".into(),
            message: String::from_utf8_lossy(&out.stderr).into_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Counts SASS instructions whose opcode starts with `opcode` (e.g. "HGMMA", "UTMALDG").
pub fn count_opcode(sass: &str, opcode: &str) -> usize {
    // Lines look like `/*0110*/  @P0 UTMALDG.2D [UR8], [UR4] ;`: skip the address and any predicate.
    sass.lines()
        .filter_map(|l| l.split_once("*/").map(|(_, rest)| rest.trim_start()))
        .map(|rest| {
            if rest.starts_with('@') {
                rest.split_once(' ').map_or("", |(_, r)| r.trim_start())
            } else {
                rest
            }
        })
        .filter(|instr| instr.starts_with(opcode))
        .count()
}

/// One SASS instruction line: its address and its text without the predicate, up to the `;`
/// (`/*0110*/  @P0 UTMALDG.2D [UR8], [UR4] ;  /* 0x...*/` gives 0x110 and
/// `UTMALDG.2D [UR8], [UR4] `). `None` for other lines (headers, lone encoding comments).
fn instruction(line: &str) -> Option<(u64, &str)> {
    let rest = line.trim_start().strip_prefix("/*")?;
    let (addr, rest) = rest.split_once("*/")?;
    let addr = u64::from_str_radix(addr, 16).ok()?;
    let rest = rest.trim_start();
    let rest = rest.split_once(';').map_or(rest, |(instr, _)| instr);
    let text = match rest.strip_prefix('@') {
        Some(p) => p.split_once(' ').map_or("", |(_, r)| r.trim_start()),
        None => rest,
    };
    Some((addr, text))
}

/// The instructions of the shortest loop (a `BRA` back to an earlier address, and everything
/// from that address to it) that holds an instruction starting with `opcode`, e.g. a kernel's
/// innermost HGMMA loop, where spilled registers (LDL/STL) cost the most. `None` when no loop
/// holds one. Branches past the last `EXIT` do not close loops: ptxas puts the slow paths of
/// waits (an mbarrier's try-wait spin, a divergent vote) there, each jumping back to where it
/// was left.
pub fn innermost_loop_with<'a>(sass: &'a str, opcode: &str) -> Option<Vec<&'a str>> {
    let code: Vec<(u64, &str)> = sass.lines().filter_map(instruction).collect();
    let last_exit = code.iter().rposition(|(_, t)| t.starts_with("EXIT"));
    let mut best: Option<(usize, usize)> = None;
    for (end, &(addr, text)) in code.iter().enumerate() {
        if !text.starts_with("BRA") || last_exit.is_some_and(|x| end > x) {
            continue;
        }
        let target = text
            .trim_end()
            .rsplit(' ')
            .next()
            .and_then(|t| t.strip_prefix("0x"))
            .and_then(|t| u64::from_str_radix(t, 16).ok());
        let Some(start) = target
            .filter(|&t| t < addr)
            .and_then(|t| code.iter().position(|&(a, _)| a == t))
        else {
            continue;
        };
        let holds = code[start..=end].iter().any(|(_, t)| t.starts_with(opcode));
        if holds && best.is_none_or(|(s, e)| end - start < e - s) {
            best = Some((start, end));
        }
    }
    best.map(|(s, e)| code[s..=e].iter().map(|&(_, t)| t).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_shortest_loop_around_an_opcode() {
        let s = "        /*0000*/                   MOV R1, c[0x0][0x28] ;\n\
                 /* 0x000fe40000000f00 */\n\
                 /*0010*/                   HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4], RZ ;\n\
                 /*0020*/                   LDL R2, [R1] ;\n\
                 /*0030*/              @P0 BRA 0x10 ;    /* 0xfffffffc00f08947 */\n\
                 /*0040*/                   STL [R1], R2 ;\n\
                 /*0050*/              @!P1 BRA `(.L_x_3) 0x0 ;\n\
                 /*0060*/                   BRA 0x60 ;\n";
        let inner = innermost_loop_with(s, "HGMMA").expect("a loop");
        assert_eq!(inner.len(), 3, "{inner:?}");
        assert!(inner[0].starts_with("HGMMA") && inner[1].starts_with("LDL"));
        // The outer loop (0x0..0x50) holds the STL; the self-branch at 0x60 is not backward.
        assert!(!inner.iter().any(|t| t.starts_with("STL")));
        assert_eq!(innermost_loop_with(s, "UTMALDG"), None);
    }

    #[test]
    fn out_of_line_wait_stubs_past_the_exit_close_no_loop() {
        // The key loop (0x10..0x40) and, past EXIT, a try-wait stub that jumps back to 0x30:
        // [0x30, 0x80] would be shorter and hold the HGMMA at 0x30, but it is not a loop.
        let s = "        /*0000*/                   MOV R1, c[0x0][0x28] ;\n\
                 /*0010*/                   HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4], RZ ;\n\
                 /*0020*/                   FADD R2, R2, R3 ;\n\
                 /*0030*/                   HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4], R24 ;\n\
                 /*0040*/              @P0 BRA 0x10 ;\n\
                 /*0050*/                   STL [R1], R2 ;\n\
                 /*0060*/                   EXIT ;\n\
                 /*0070*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P2, [R17+URZ], R4 ;\n\
                 /*0080*/                   BRA 0x30 ;\n";
        let inner = innermost_loop_with(s, "HGMMA").expect("a loop");
        assert_eq!(inner.len(), 4, "{inner:?}");
        assert!(inner[0].starts_with("HGMMA") && inner[3].starts_with("BRA"));
    }

    #[test]
    fn counts_predicated_and_plain_opcodes() {
        let s =
            "        /*0100*/                   HGMMA.64x256x16.F32.BF16 R24, gdesc[UR4], RZ ;\n\
                 /*0110*/              @P0 UTMALDG.2D [UR8], [UR4] ;\n\
                 /*0120*/                   MOV R1, c[0x0][0x28] ;\n";
        assert_eq!(count_opcode(s, "HGMMA"), 1);
        assert_eq!(count_opcode(s, "UTMALDG"), 1);
        assert_eq!(count_opcode(s, "MOV"), 1);
        assert_eq!(count_opcode(s, "LDG"), 0);
    }
}
