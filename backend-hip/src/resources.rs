//! What a compiled CDNA kernel uses (registers, LDS, scratch) and the occupancy that follows,
//! read from the code object's AMDGPU metadata note with llvm-readelf-19 (no GPU needed).

use calico_core::{Error, Result};
use std::process::Command;

/// The readelf used by [`read_resources`]: `$CALICO_LLVM_READELF`, else `llvm-readelf-19`.
pub fn readelf_path() -> String {
    std::env::var("CALICO_LLVM_READELF")
        .ok()
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| "llvm-readelf-19".to_string())
}

/// One kernel's resources, as the compiler recorded them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KernelResources {
    pub name: String,
    /// Architectural VGPRs per lane.
    pub vgprs: u32,
    /// Accumulation VGPRs per lane (gfx90a and later share one file with the VGPRs).
    pub agprs: u32,
    pub sgprs: u32,
    /// Static LDS per workgroup, bytes.
    pub lds_bytes: u32,
    /// Scratch (private memory) per lane, bytes: spills and stack.
    pub scratch_bytes: u32,
    pub vgpr_spills: u32,
    pub sgpr_spills: u32,
    /// The largest workgroup the kernel was compiled for (threads).
    pub max_workgroup_size: u32,
    pub wavefront_size: u32,
}

/// Per-SIMD and per-CU limits of CDNA2/CDNA3 (gfx90a, gfx94x): a 512-entry register file per
/// lane shared by VGPRs and AGPRs, allocated in granules of 8; 800 SGPRs per SIMD in granules
/// of 16; at most 8 waves per SIMD, 4 SIMDs and 64 KiB of LDS per CU.
const REGISTER_FILE: u32 = 512;
const REGISTER_GRANULE: u32 = 8;
const SGPR_FILE: u32 = 800;
const SGPR_GRANULE: u32 = 16;
const MAX_WAVES_PER_SIMD: u32 = 8;
const SIMDS_PER_CU: u32 = 4;
const LDS_PER_CU: u32 = 64 * 1024;
/// LDS is allocated in blocks of 128 dwords.
const LDS_GRANULE: u32 = 512;

fn round_up(v: u32, granule: u32) -> u32 {
    v.div_ceil(granule) * granule
}

impl KernelResources {
    /// Registers a wave takes from the unified file: VGPRs rounded to 4, then the AGPRs, in
    /// granules of 8.
    pub fn unified_registers(&self) -> u32 {
        let vgprs = if self.agprs > 0 {
            round_up(self.vgprs, 4) + self.agprs
        } else {
            self.vgprs
        };
        round_up(vgprs.max(1), REGISTER_GRANULE)
    }

    /// Waves per SIMD that the registers allow.
    pub fn waves_per_simd_by_registers(&self) -> u32 {
        let by_vgpr = REGISTER_FILE / self.unified_registers();
        let by_sgpr = SGPR_FILE / round_up(self.sgprs.max(1), SGPR_GRANULE);
        by_vgpr.min(by_sgpr).min(MAX_WAVES_PER_SIMD)
    }

    /// Waves in one workgroup of the largest size the kernel allows.
    pub fn waves_per_workgroup(&self) -> u32 {
        self.max_workgroup_size
            .max(1)
            .div_ceil(self.wavefront_size.max(1))
    }

    /// Workgroups that fit on one CU at once (registers and LDS), with workgroups of
    /// [`Self::waves_per_workgroup`] waves spread over the 4 SIMDs.
    pub fn workgroups_per_cu(&self) -> u32 {
        let waves = self.waves_per_workgroup();
        let by_registers = SIMDS_PER_CU * self.waves_per_simd_by_registers() / waves;
        let by_lds = match self.lds_bytes {
            0 => u32::MAX,
            lds => LDS_PER_CU / round_up(lds, LDS_GRANULE),
        };
        by_registers.min(by_lds)
    }

    /// Resident waves per SIMD (0..=8): the occupancy.
    pub fn occupancy(&self) -> u32 {
        (self.workgroups_per_cu() * self.waves_per_workgroup() / SIMDS_PER_CU)
            .min(MAX_WAVES_PER_SIMD)
    }

    /// True when the kernel spills to (or otherwise uses) scratch memory.
    pub fn uses_scratch(&self) -> bool {
        self.scratch_bytes > 0 || self.vgpr_spills > 0
    }

    /// One line for tools: `name: VGPR v, AGPR a, SGPR s, LDS b B, scratch b B -> o waves/SIMD`.
    pub fn summary(&self) -> String {
        format!(
            "{}: VGPR {}, AGPR {}, SGPR {} ({} spilled to VGPR lanes), LDS {} B, scratch {} B ({} VGPRs spilled), workgroup {} -> {} workgroup(s)/CU, occupancy {} waves/SIMD",
            self.name,
            self.vgprs,
            self.agprs,
            self.sgprs,
            self.sgpr_spills,
            self.lds_bytes,
            self.scratch_bytes,
            self.vgpr_spills,
            self.max_workgroup_size,
            self.workgroups_per_cu(),
            self.occupancy()
        )
    }

    /// A table of labelled kernels' registers, LDS, scratch and occupancy, one line per row
    /// after a header line.
    pub fn table(rows: &[(String, KernelResources)]) -> String {
        let width = rows.iter().map(|(l, _)| l.len()).max().unwrap_or(7).max(7);
        let mut out = format!(
            "{:<width$} {:>5} {:>5} {:>5} {:>7} {:>8} {:>6} {:>10}\n",
            "variant", "VGPR", "AGPR", "SGPR", "LDS", "scratch", "WG/CU", "waves/SIMD"
        );
        for (label, k) in rows {
            out += &format!(
                "{label:<width$} {:>5} {:>5} {:>5} {:>7} {:>8} {:>6} {:>10}\n",
                k.vgprs,
                k.agprs,
                k.sgprs,
                k.lds_bytes,
                k.scratch_bytes,
                k.workgroups_per_cu(),
                k.occupancy()
            );
        }
        out
    }
}

/// Every kernel's resources in an AMDGPU code object.
pub fn read_resources(code_object: &[u8]) -> Result<Vec<KernelResources>> {
    let dir = std::env::temp_dir().join(format!(
        "calico-hip-notes-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0)
    ));
    std::fs::create_dir_all(&dir)?;
    let path = dir.join("kernel.co");
    std::fs::write(&path, code_object)?;
    let tool = readelf_path();
    let output = Command::new(&tool).arg("--notes").arg(&path).output();
    let _ = std::fs::remove_dir_all(&dir);
    let output = output.map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => Error::BackendUnavailable {
            backend: "hip",
            reason: format!("{tool} not found (install llvm-19 or set CALICO_LLVM_READELF)"),
        },
        _ => Error::Io(e),
    })?;
    if !output.status.success() {
        return Err(Error::Runtime {
            backend: "hip",
            call: tool,
            message: String::from_utf8_lossy(&output.stderr).into_owned(),
        });
    }
    let kernels = parse_metadata(&String::from_utf8_lossy(&output.stdout));
    if kernels.is_empty() {
        return Err(Error::Runtime {
            backend: "hip",
            call: "read_resources".into(),
            message: "no amdhsa.kernels metadata in the code object".into(),
        });
    }
    Ok(kernels)
}

/// Parses the `amdhsa.kernels` list of a `llvm-readelf --notes` listing: each kernel starts
/// with `  - .key:` and its own keys sit at four spaces (nested lists such as `.args` deeper).
pub fn parse_metadata(notes: &str) -> Vec<KernelResources> {
    let mut kernels = Vec::new();
    let mut in_kernels = false;
    for line in notes.lines() {
        if line.starts_with("amdhsa.kernels:") {
            in_kernels = true;
            continue;
        }
        if !in_kernels {
            continue;
        }
        if !line.starts_with(' ') && !line.is_empty() {
            in_kernels = false; // the next top-level key (amdhsa.target, ...)
            continue;
        }
        let key_value = if let Some(rest) = line.strip_prefix("  - ") {
            kernels.push(KernelResources::default());
            rest
        } else if let Some(rest) = line.strip_prefix("    ") {
            if rest.starts_with(' ') || rest.starts_with('-') {
                continue; // nested (.args entries)
            }
            rest
        } else {
            continue;
        };
        let Some(k) = kernels.last_mut() else {
            continue;
        };
        let Some((key, value)) = key_value.split_once(':') else {
            continue;
        };
        let value = value.trim();
        let number = || value.parse::<u32>().unwrap_or(0);
        match key.trim() {
            ".name" => k.name = value.to_string(),
            ".vgpr_count" => k.vgprs = number(),
            ".agpr_count" => k.agprs = number(),
            ".sgpr_count" => k.sgprs = number(),
            ".group_segment_fixed_size" => k.lds_bytes = number(),
            ".private_segment_fixed_size" => k.scratch_bytes = number(),
            ".vgpr_spill_count" => k.vgpr_spills = number(),
            ".sgpr_spill_count" => k.sgpr_spills = number(),
            ".max_flat_workgroup_size" => k.max_workgroup_size = number(),
            ".wavefront_size" => k.wavefront_size = number(),
            _ => {}
        }
    }
    // On gfx90a and later `.vgpr_count` is the unified count (LLVM's NumVGPRsForWavesPerEU:
    // the architectural VGPRs rounded up to 4, then the AGPRs), not the architectural one: a
    // kernel whose highest VGPR is v154 with a[0:63] reports 220. Keep the fields apart.
    for k in &mut kernels {
        k.vgprs = k.vgprs.saturating_sub(k.agprs);
    }
    kernels
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOTES: &str = "Displaying notes found in: .note
  Owner                Data size \tDescription
  AMDGPU               0x0000060c\tNT_AMDGPU_METADATA (AMDGPU Metadata)
    AMDGPU Metadata:
        ---
amdhsa.kernels:
  - .agpr_count:     0
    .args:
      - .address_space:  global
        .offset:         0
        .size:           8
        .value_kind:     global_buffer
    .group_segment_fixed_size: 34816
    .max_flat_workgroup_size: 512
    .name:           calico_gemm_cdna
    .private_segment_fixed_size: 0
    .sgpr_count:     106
    .sgpr_spill_count: 68
    .vgpr_count:     202
    .vgpr_spill_count: 0
    .wavefront_size: 64
  - .agpr_count:     4
    .group_segment_fixed_size: 0
    .max_flat_workgroup_size: 256
    .name:           small
    .private_segment_fixed_size: 16
    .sgpr_count:     20
    .vgpr_count:     30
    .vgpr_spill_count: 2
    .wavefront_size: 64
amdhsa.target:   amdgcn-amd-amdhsa--gfx942
amdhsa.version:
  - 1
  - 2
";

    #[test]
    fn parses_every_kernel_and_skips_nested_lists() {
        let k = parse_metadata(NOTES);
        assert_eq!(k.len(), 2);
        assert_eq!(
            k[0],
            KernelResources {
                name: "calico_gemm_cdna".into(),
                vgprs: 202,
                agprs: 0,
                sgprs: 106,
                lds_bytes: 34816,
                scratch_bytes: 0,
                vgpr_spills: 0,
                sgpr_spills: 68,
                max_workgroup_size: 512,
                wavefront_size: 64,
            }
        );
        assert_eq!(k[1].name, "small");
        assert!(k[1].uses_scratch());
        assert!(!k[0].uses_scratch());
    }

    #[test]
    fn occupancy_follows_registers_and_lds() {
        let k = parse_metadata(NOTES);
        // 202 VGPRs -> 208 of 512: 2 waves/SIMD; 8 waves per workgroup -> 1 per CU; SGPRs
        // (112 of 800) would allow 7.
        assert_eq!(k[0].unified_registers(), 208);
        assert_eq!(k[0].waves_per_simd_by_registers(), 2);
        assert_eq!(k[0].workgroups_per_cu(), 1);
        assert_eq!(k[0].occupancy(), 2);
        // .vgpr_count 30 with 4 AGPRs: 26 VGPRs (-> 28) + 4 AGPRs = 32: 16 by registers,
        // capped at 8.
        assert_eq!((k[1].vgprs, k[1].agprs), (26, 4));
        assert_eq!(k[1].unified_registers(), 32);
        assert_eq!(k[1].occupancy(), 8);
        // LDS-bound: 40 KiB per workgroup leaves room for one.
        let lds = KernelResources {
            lds_bytes: 40 * 1024,
            ..k[1].clone()
        };
        assert_eq!(lds.workgroups_per_cu(), 1);
        assert_eq!(lds.occupancy(), 1);
        assert!(k[0].summary().contains("occupancy 2 waves/SIMD"));
    }
}
