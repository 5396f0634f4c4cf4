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

#[cfg(test)]
mod tests {
    use super::*;

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
