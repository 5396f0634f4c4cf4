//! The vendor-neutral tile GEMM (`kernels/device/gemm/tile.cu`): written only against the
//! shared tile vocabulary (`calico/tiles.h`), so one source runs on mma.sync (sm_80 and later)
//! and on MFMA (gfx90a, gfx942). It takes any M, N, K and any row strides, as long as each
//! operand has a unit stride somewhere (A along K or M, B along N or K, C and D along N); the
//! scalar portable kernel keeps the rest.

use super::portable::{args, GEMM_HEADERS};
use super::{Epilogue, GemmProblem, MatrixArg};
use crate::catalog::CatalogEntry;
use calico_core::{
    Arch, DType, Error, GpuBackend, HeaderSet, KernelSource, KernelVariant, LaunchConfig, MmaKind,
    Result, Vendor,
};

const SOURCE: &str = include_str!("../../device/gemm/tile.cu");
const ENTRY: &str = "calico_gemm_tile";

/// Grid y and z limit on both vendors; grid z is folded (blocks loop over batches).
const MAX_GRID_YZ: usize = 65_535;

/// Block tiles, largest first: the first that gives every compute unit a block is used.
/// 256 x 128 runs eight warps (wavefronts), the others four, each owning a 64 x 64 (or
/// smaller) quarter: the larger block loads 48 elements per lane and step for the same 64
/// MMAs per warp where 128 x 128 loads 64.
const TILES: [(usize, usize); 5] = [(256, 128), (128, 128), (128, 64), (64, 128), (64, 64)];

/// The kernel indexes rows, columns and batches with 32-bit ints (the vocabulary's `gl` and
/// `coord`); a block tile past the end must still fit.
const MAX_DIM: usize = (i32::MAX as usize) - 256;

/// One compiled form of the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Variant {
    pub in_dtype: DType,
    pub out_dtype: DType,
    pub bm: usize,
    pub bn: usize,
    /// A's K stride is 1 (row-major A); otherwise its M stride is (A^T row-major).
    pub a_k_major: bool,
    /// B's K stride is 1 (an N x K weight); otherwise its N stride is.
    pub b_k_major: bool,
    /// A's rows are 16-byte aligned (base, row and batch strides): its slabs move in 16-byte
    /// chunks instead of element by element.
    pub a_vec: bool,
    /// The same for B.
    pub b_vec: bool,
    pub epilogue: Epilogue,
    pub has_c: bool,
    pub has_bias: bool,
}

/// Whether `x` steps by one element along its rows (`along_cols`: consecutive columns are
/// adjacent) or a single row/column makes the question moot.
fn unit_along_cols(x: &MatrixArg) -> bool {
    x.col_stride == 1 || x.cols <= 1
}
fn unit_along_rows(x: &MatrixArg) -> bool {
    x.row_stride == 1 || x.rows <= 1
}

/// Whether the lines of `x` that the kernel reads as rows (`line_stride` apart) start on
/// 16-byte boundaries in every batch entry: 16-bit elements, 8 to 16 bytes.
fn lines_16b(x: &MatrixArg, line_stride: usize, batch: usize) -> bool {
    x.ptr.is_multiple_of(16)
        && line_stride.is_multiple_of(8)
        && (batch <= 1 || x.batch_stride.is_multiple_of(8))
}

impl Variant {
    /// The variant for `p` on `arch` (its layouts must be supported: see [`supports`]).
    pub(crate) fn for_problem(arch: &Arch, p: &GemmProblem) -> Variant {
        let units = arch.compute_units.max(1) as usize;
        let blocks = |(bm, bn): (usize, usize)| {
            p.m.div_ceil(bm)
                .saturating_mul(p.n.div_ceil(bn))
                .saturating_mul(p.batch)
        };
        let fits = |&(bm, _): &(usize, usize)| p.m.div_ceil(bm) <= MAX_GRID_YZ;
        let (bm, bn) = TILES
            .iter()
            .copied()
            .filter(fits)
            .find(|&t| blocks(t) >= units)
            .unwrap_or(if p.m.div_ceil(64) <= MAX_GRID_YZ {
                (64, 64)
            } else {
                (128, 64)
            });
        let a_k_major = unit_along_cols(&p.a);
        let b_k_major = !unit_along_cols(&p.b);
        let a_line = if a_k_major {
            p.a.row_stride
        } else {
            p.a.col_stride
        };
        let b_line = if b_k_major {
            p.b.col_stride
        } else {
            p.b.row_stride
        };
        Variant {
            in_dtype: p.in_dtype,
            out_dtype: p.out_dtype,
            bm,
            bn,
            a_k_major,
            b_k_major,
            a_vec: lines_16b(&p.a, a_line, p.batch),
            b_vec: lines_16b(&p.b, b_line, p.batch),
            epilogue: p.epilogue,
            has_c: p.c.is_some() && p.beta != 0.0,
            has_bias: p.bias.is_some(),
        }
    }

    pub(crate) fn defines(self) -> Vec<(&'static str, String)> {
        vec![
            ("CALICO_GEMM_IN", self.in_dtype.device_type().to_string()),
            ("CALICO_GEMM_OUT", self.out_dtype.device_type().to_string()),
            ("CALICO_GEMM_BM", self.bm.to_string()),
            ("CALICO_GEMM_BN", self.bn.to_string()),
            ("CALICO_GEMM_A_KMAJOR", u8::from(self.a_k_major).to_string()),
            ("CALICO_GEMM_B_KMAJOR", u8::from(self.b_k_major).to_string()),
            ("CALICO_GEMM_A_VEC", u8::from(self.a_vec).to_string()),
            ("CALICO_GEMM_B_VEC", u8::from(self.b_vec).to_string()),
            ("CALICO_GEMM_EPILOGUE", self.epilogue.define().to_string()),
            ("CALICO_GEMM_HAS_C", u8::from(self.has_c).to_string()),
            ("CALICO_GEMM_HAS_BIAS", u8::from(self.has_bias).to_string()),
        ]
    }

    /// Warps (wavefronts) per block.
    pub(crate) fn warps(self) -> u32 {
        if self.bm == 256 {
            8
        } else {
            4
        }
    }

    /// The vocabulary product this variant's layouts use.
    pub(crate) fn product(self) -> &'static str {
        match (self.a_k_major, self.b_k_major) {
            (true, true) => "mma_ABt",
            (true, false) => "mma_AB",
            (false, true) => "mma_AtBt",
            (false, false) => "mma_AtB",
        }
    }
}

impl KernelVariant for Variant {
    fn source(&self, vendor: HeaderSet) -> Result<KernelSource> {
        let sets = [vendor, calico_core::device_headers(), GEMM_HEADERS];
        KernelSource::assemble(ENTRY, SOURCE, &sets, &self.defines())
    }
}

/// True when the tile kernel can run `p` on `arch`: a GPU with 16-bit matrix instructions the
/// vocabulary is built on (mma.sync, MFMA), 16-bit inputs, bf16/f16/f32 output, a unit stride
/// in each operand (A along K or M, B along N or K, C and D along N), sizes the kernel's
/// 32-bit indices hold, and a grid within the launch limits.
///
/// The vocabulary's `load(rt, gl)` and `store(gl, rt)` move single elements on both vendors
/// (CUDA's tile_ops.cuh, HIP's hip_tile.h), so any row stride and any element-aligned base
/// address is read correctly: no further alignment is demanded.
pub(crate) fn supports(arch: &Arch, p: &GemmProblem) -> bool {
    let mma = match arch.vendor {
        Vendor::Nvidia => MmaKind::MmaSync,
        Vendor::Amd => MmaKind::Mfma,
        _ => return false,
    };
    let dtypes = matches!(p.in_dtype, DType::BF16 | DType::F16)
        && matches!(p.out_dtype, DType::BF16 | DType::F16 | DType::F32)
        && arch.has_mma(mma, p.in_dtype);
    let has_c = p.c.is_some() && p.beta != 0.0;
    let layouts = (unit_along_cols(&p.a) || unit_along_rows(&p.a))
        && (unit_along_cols(&p.b) || unit_along_rows(&p.b))
        && unit_along_cols(&p.d)
        && (!has_c || p.c.as_ref().is_some_and(unit_along_cols));
    let sizes = p.m <= MAX_DIM && p.n <= MAX_DIM && p.k <= MAX_DIM && p.batch <= MAX_DIM;
    dtypes && layouts && sizes && grid(p, Variant::for_problem(arch, p), arch.lanes).is_ok()
}

/// (grid, threads): x over N tiles, y over M tiles, z over batches (folded past the limit).
fn grid(p: &GemmProblem, v: Variant, lanes: u32) -> Result<LaunchConfig> {
    let threads = v.warps() * lanes;
    let x = p.n.div_ceil(v.bn).max(1);
    let y = p.m.div_ceil(v.bm).max(1);
    let z = p.batch.clamp(1, MAX_GRID_YZ);
    // HIP counts the grid in work-items, in 32 bits.
    if y > MAX_GRID_YZ || x > (u32::MAX / threads) as usize {
        return Err(Error::unsupported(format!(
            "GEMM of {}x{} is too large for one launch grid",
            p.m, p.n
        )));
    }
    Ok(LaunchConfig {
        grid: (x as u32, y as u32, z as u32),
        block: (threads, 1, 1),
        shared_mem_bytes: 0,
    })
}

/// Launches the tile GEMM for `p`.
pub(crate) fn launch(gpu: &dyn GpuBackend, p: &GemmProblem) -> Result<()> {
    let arch = gpu.arch();
    if !supports(arch, p) {
        return Err(Error::unsupported(format!(
            "the tile GEMM does not support this problem on {}",
            arch.target
        )));
    }
    let v = Variant::for_problem(arch, p);
    let config = grid(p, v, arch.lanes)?;
    gpu.launch_variant(&v, &config, &args(p, v.has_c, config.grid.2)?)
}

/// Representative variants, for `calico compile` and the offline compile checks: each of the
/// four layout products, both input types, every output type and epilogue, each block tile.
pub(crate) fn catalog(vendor: HeaderSet) -> Result<Vec<CatalogEntry>> {
    let mut out = Vec::new();
    let shapes = [
        (128, 128, true, true),
        (64, 64, true, false),
        (128, 64, false, true),
        (64, 128, false, false),
        (256, 128, true, true),
    ];
    for (i, (bm, bn, a_k_major, b_k_major)) in shapes.into_iter().enumerate() {
        for in_dtype in [DType::BF16, DType::F16] {
            let out_dtype = [DType::BF16, DType::F16, DType::F32][i % 3];
            let epilogue = [Epilogue::None, Epilogue::Gelu, Epilogue::Silu][i % 3];
            let v = Variant {
                in_dtype,
                out_dtype,
                bm,
                bn,
                a_k_major,
                b_k_major,
                a_vec: i != 1,
                b_vec: i != 3,
                epilogue,
                has_c: i % 2 == 0,
                has_bias: i % 2 == 1,
            };
            let label = format!(
                "tile {in_dtype}->{out_dtype} {bm}x{bn} {} {epilogue:?} vec a={} b={}",
                v.product(),
                v.a_vec,
                v.b_vec
            );
            out.push(CatalogEntry {
                op: "gemm",
                label,
                source: v.source(vendor)?,
            });
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gemm::portable::tests::problem;

    #[test]
    fn layouts_pick_the_product_and_unit_strides_are_required() {
        let arch = Arch::for_target("gfx942").unwrap();
        let weight = Variant::for_problem(&arch, &problem(100, 100, 77, true));
        assert_eq!(weight.product(), "mma_ABt");
        assert_eq!(
            Variant::for_problem(&arch, &problem(9, 9, 9, false)).product(),
            "mma_AB"
        );
        let mut p = problem(33, 17, 5, false);
        p.a.row_stride = 1;
        p.a.col_stride = 33; // column-major A
        assert!(supports(&arch, &p));
        assert_eq!(Variant::for_problem(&arch, &p).product(), "mma_AtB");
        p.b.row_stride = 1;
        p.b.col_stride = 5; // and an N x K weight
        assert_eq!(Variant::for_problem(&arch, &p).product(), "mma_AtBt");
        // No unit stride in A: the scalar portable kernel's.
        p.a.row_stride = 2;
        assert!(!supports(&arch, &p));
        // Column-major D.
        let mut p = problem(33, 17, 5, false);
        p.d.row_stride = 1;
        p.d.col_stride = 33;
        assert!(!supports(&arch, &p));
        assert!(!supports(&Arch::cpu(4), &problem(16, 16, 16, false)));
    }

    #[test]
    fn odd_strides_are_taken_and_sizes_past_32_bits_are_not() {
        let arch = Arch::for_target("sm_80").unwrap();
        let mut p = problem(1000, 999, 1001, true);
        p.a.row_stride = 1003;
        assert!(supports(&arch, &p));
        let v = Variant::for_problem(&arch, &p);
        assert_eq!(grid(&p, v, 32).unwrap().block, (128, 1, 1));
        assert!(!supports(&arch, &problem(8, 8, 1 << 31, true)));
        let mut p = problem(64, 64, 64, false);
        p.batch = 100_000;
        let v = Variant::for_problem(&arch, &p);
        assert_eq!(grid(&p, v, 32).unwrap().grid.2, 65_535);
        // sm_75 has no bf16 mma.sync.
        assert!(!supports(
            &Arch::for_target("sm_75").unwrap(),
            &problem(64, 64, 64, false)
        ));
    }

    #[test]
    fn rows_on_16_byte_boundaries_move_in_chunks() {
        let arch = Arch::for_target("sm_90a").unwrap();
        let v = Variant::for_problem(&arch, &problem(1000, 999, 1000, true));
        assert!(v.a_vec && v.b_vec, "{v:?}");
        // K = 77: A's rows and the weight's rows are 154 bytes apart.
        let v = Variant::for_problem(&arch, &problem(257, 129, 77, true));
        assert!(!v.a_vec && !v.b_vec, "{v:?}");
        // A view at an odd element offset; B's rows (N = 100) 200 bytes apart.
        let mut p = problem(64, 100, 64, false);
        p.a.ptr += 2;
        let v = Variant::for_problem(&arch, &p);
        assert!(!v.a_vec && !v.b_vec, "{v:?}");
        // Column-major A: its lines are columns, M apart.
        let mut p = problem(48, 64, 64, false);
        p.a.row_stride = 1;
        p.a.col_stride = 48;
        let v = Variant::for_problem(&arch, &p);
        assert!(!v.a_k_major && v.a_vec && v.b_vec, "{v:?}");
        // Batches whose entries do not start on 16-byte boundaries.
        let mut p = problem(16, 16, 16, true);
        p.batch = 2;
        p.a.batch_stride = 16 * 16 + 4;
        assert!(!Variant::for_problem(&arch, &p).a_vec);
    }

    /// The kernel is written on the shared names alone: it includes the vocabulary and the
    /// shared epilogue (which includes nothing), and names no vendor's types or instructions.
    #[test]
    fn the_kernel_includes_only_the_shared_vocabulary() {
        let includes = |text: &str| -> Vec<String> {
            text.lines()
                .filter(|l| l.trim_start().starts_with("#include"))
                .map(str::to_string)
                .collect()
        };
        assert_eq!(
            includes(SOURCE),
            [
                "#include \"calico/tiles.h\"",
                "#include \"gemm/epilogue.cuh\""
            ]
        );
        let epilogue = include_str!("../../device/gemm/epilogue.cuh");
        assert!(includes(epilogue).is_empty());
        for vendor in [
            "__nv",
            "__half",
            "hip::",
            "mfma",
            "mma_sync",
            "ldmatrix",
            "asm",
            "__builtin",
        ] {
            assert!(!SOURCE.contains(vendor), "tile.cu names `{vendor}`");
            assert!(!epilogue.contains(vendor), "epilogue.cuh names `{vendor}`");
        }
    }

    #[test]
    fn sources_assemble_for_both_vendors() {
        for vendor in [calico_cuda::device_headers(), calico_hip::hip_headers()] {
            let entries = catalog(vendor).unwrap();
            for product in ["mma_AB", "mma_ABt", "mma_AtB", "mma_AtBt"] {
                assert!(entries
                    .iter()
                    .any(|e| e.label.contains(&format!(" {product} "))));
            }
            assert!(entries
                .iter()
                .all(|e| e.source.text.contains("calico_gemm_tile")));
        }
    }
}
