//! Odd shapes on the Hopper kernel: when A or B has a row stride (or base) that TMA cannot
//! describe (K, N or a stride not a multiple of 8 elements), the operand is copied into a
//! row-major buffer whose rows are whole 128-byte lines (`kernels/device/gemm/pad.cu`, one
//! launch for both operands, bandwidth-bound) and the Hopper kernel runs on the copies. The
//! padding columns are never read: the tensor maps keep the true K and N, and TMA fills past
//! them with zeros. D and C need no copy (the register-store epilogue takes any row stride;
//! `CALICO_PAD_D=on` instead writes D to an aligned buffer with TMA stores and copies it back).
//!
//! The copies live in the device's workspace (`GpuBackend::with_workspace`: kept per stream,
//! grows only, so no allocation once a shape has been seen and a captured CUDA graph replays
//! without allocating; held by this call while both launches are queued, and stream order
//! keeps the GEMM's reads of it ahead of the next op's use).

use super::portable::GEMM_HEADERS;
use super::{hopper, odd_split, GemmProblem, MatrixArg};
use crate::catalog::CatalogEntry;
use calico_core::{
    Arch, DType, Error, GpuBackend, HeaderSet, KernelArg, KernelSource, KernelVariant,
    LaunchConfig, Result,
};

const SOURCE: &str = include_str!("../../device/gemm/pad.cu");
const ENTRY: &str = "calico_gemm_pad";
const THREADS: u32 = 256;
/// Pad blocks per SM (grid-stride beyond that).
const BLOCKS_PER_SM: usize = 8;
/// Padded rows are whole 128-byte lines (64 elements): a TMA box row of a 16-byte aligned but
/// line-straddling stride touches one more line per row.
const ROW_ELEMS: usize = 64;
/// Alignment of each padded operand in the workspace (bytes).
const ALIGN: usize = 256;

/// Whether odd-width 16-bit D goes through an aligned buffer and the TMA-store epilogue, then
/// a copy back: `CALICO_PAD_D=on|off` (read once) forces it; unset, it does where A or B is
/// padded anyway (H100, session 8: 4097^3 0.349 -> 0.313 ms, 8191^3 1.94 -> 1.76 ms), and an
/// odd D beside aligned operands takes the Hopper kernel's staged store instead (1000x999x1000
/// 0.0170 ms against 0.0202 through the buffer; docs/perf-log.md).
fn pad_d_forced() -> Option<bool> {
    static ON: std::sync::OnceLock<Option<bool>> = std::sync::OnceLock::new();
    *ON.get_or_init(|| {
        let v = std::env::var("CALICO_PAD_D").unwrap_or_default();
        match v.trim().to_ascii_lowercase().as_str() {
            "on" | "1" | "true" | "yes" => Some(true),
            "off" | "0" | "false" | "no" => Some(false),
            _ => None,
        }
    })
}

/// The copy back from the aligned D buffer (`calico_gemm_unpad` in pad.cu).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct UnpadVariant;

impl KernelVariant for UnpadVariant {
    fn source(&self, vendor: HeaderSet) -> Result<KernelSource> {
        KernelSource::assemble(
            "calico_gemm_unpad",
            SOURCE,
            &[vendor, calico_core::device_headers(), GEMM_HEADERS],
            &[],
        )
    }
}

/// The pad kernel has no compile-time options: one source for every call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct PadVariant;

impl KernelVariant for PadVariant {
    fn source(&self, vendor: HeaderSet) -> Result<KernelSource> {
        KernelSource::assemble(
            ENTRY,
            SOURCE,
            &[vendor, calico_core::device_headers(), GEMM_HEADERS],
            &[],
        )
    }
}

/// One operand copy: the source (in the orientation of the copy: rows x cols with `cols`
/// contiguous in the destination) and the destination's row stride.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Copy {
    src: u64,
    batch: usize,
    rows: usize,
    cols: usize,
    src_rs: usize,
    src_cs: usize,
    src_bs: usize,
    /// Destination row stride: `cols` rounded up to 64 elements.
    dst_rs: usize,
    /// Destination batch stride: 0 for a broadcast operand (copied once).
    dst_bs: usize,
    /// Byte offset of the destination in the workspace.
    offset: usize,
}

impl Copy {
    fn new(x: &MatrixArg, batch: usize, rows: usize, cols: usize, transposed: bool) -> Copy {
        let (src_rs, src_cs) = if transposed {
            (x.col_stride, x.row_stride)
        } else {
            (x.row_stride, x.col_stride)
        };
        let broadcast = batch > 1 && x.batch_stride == 0;
        let copies = if broadcast { 1 } else { batch.max(1) };
        let dst_rs = cols.div_ceil(ROW_ELEMS) * ROW_ELEMS;
        Copy {
            src: x.ptr,
            batch: copies,
            rows,
            cols,
            src_rs,
            src_cs,
            src_bs: if copies > 1 { x.batch_stride } else { 0 },
            dst_rs,
            dst_bs: if copies > 1 { rows * dst_rs } else { 0 },
            offset: 0,
        }
    }

    fn bytes(&self) -> usize {
        (self.batch * self.rows * self.dst_rs * 2).div_ceil(ALIGN) * ALIGN
    }
}

/// What to pad for `p` and the problem the Hopper kernel then runs (with zero pointers for
/// the workspace operands, filled in at launch).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Plan {
    a: Option<Copy>,
    b: Option<Copy>,
    /// B padded K-major (an N x K weight) rather than N-major.
    b_kmajor: bool,
    /// D written to an aligned buffer (row stride, byte offset in the workspace) by the
    /// TMA-store epilogue and copied to the real D after: when D's rows are not 16-byte
    /// aligned, the register-store epilogue would write it element by element.
    d: Option<(usize, usize)>,
    /// The caller's D (the copy's destination when `d` is set).
    original_d: MatrixArg,
    padded: GemmProblem,
    workspace_bytes: usize,
}

fn a_ready(p: &GemmProblem) -> bool {
    hopper::a_fits(p) && p.a.ptr.is_multiple_of(16)
}

fn b_ready(p: &GemmProblem) -> bool {
    hopper::b_k_major(p).is_some() && p.b.ptr.is_multiple_of(16)
}

/// D through an aligned buffer when only the register epilogue could write it as it is
/// (16-bit, contiguous rows that TMA cannot store) and [`pad_d_forced`] or, by default, a
/// padded A or B asks for it.
fn d_to_buffer(p: &GemmProblem) -> bool {
    let out_16 = matches!(p.out_dtype, DType::BF16 | DType::F16);
    let d_contiguous = p.d.col_stride == 1 || p.n <= 1;
    let wanted = pad_d_forced().unwrap_or(!(a_ready(p) && b_ready(p)));
    wanted && out_16 && d_contiguous && !hopper::d_tma_ok(p)
}

/// True when the padded path takes `p` only for its D (`CALICO_PAD_D=on`): the router then
/// prefers it to the Hopper kernel's register-store epilogue.
pub(crate) fn pads_d_only(arch: &Arch, p: &GemmProblem) -> bool {
    a_ready(p) && b_ready(p) && plan(arch, p).is_some()
}

/// The padding plan for `p` on `arch`, or `None` when the Hopper kernel runs `p` as it is, or
/// would not run it even with both operands padded (device, dtypes, D layout, sizes).
fn plan(arch: &Arch, p: &GemmProblem) -> Option<Plan> {
    if p.k == 0 || (a_ready(p) && b_ready(p) && !d_to_buffer(p)) {
        return None;
    }
    // The workspace sums below are unchecked: each padded copy must stay under 2^62 bytes
    // (three of them under usize). Only views that repeat elements come near it.
    let padded_bytes = |rows: usize, cols: usize| {
        let row = cols.checked_next_multiple_of(ROW_ELEMS)?.checked_mul(2)?;
        p.batch
            .max(1)
            .checked_mul(rows)?
            .checked_mul(row)?
            .checked_add(ALIGN)
    };
    let sizes = [(p.m, p.k), (p.n, p.k), (p.k, p.n), (p.m, p.n)];
    if sizes
        .iter()
        .any(|&(r, c)| padded_bytes(r, c).is_none_or(|b| b > 1 << 62))
    {
        return None;
    }
    let mut padded = *p;
    let mut offset = 0;
    let mut take = |mut c: Copy| {
        c.offset = offset;
        offset += c.bytes();
        c
    };
    let a = (!a_ready(p)).then(|| take(Copy::new(&p.a, p.batch, p.m, p.k, false)));
    if let Some(c) = &a {
        padded.a = MatrixArg {
            ptr: 0,
            rows: p.m,
            cols: p.k,
            row_stride: c.dst_rs,
            col_stride: 1,
            batch_stride: c.dst_bs,
        };
    }
    // B keeps its contiguous dimension when it has one (the copy then reads rows), else
    // becomes K-major.
    let b_kmajor = p.b.col_stride != 1 || p.b.row_stride == 1;
    let b = (!b_ready(p)).then(|| {
        if b_kmajor {
            take(Copy::new(&p.b, p.batch, p.n, p.k, true))
        } else {
            take(Copy::new(&p.b, p.batch, p.k, p.n, false))
        }
    });
    if let Some(c) = &b {
        padded.b = if b_kmajor {
            MatrixArg {
                ptr: 0,
                rows: p.k,
                cols: p.n,
                row_stride: 1,
                col_stride: c.dst_rs,
                batch_stride: c.dst_bs,
            }
        } else {
            MatrixArg {
                ptr: 0,
                rows: p.k,
                cols: p.n,
                row_stride: c.dst_rs,
                col_stride: 1,
                batch_stride: c.dst_bs,
            }
        };
    }
    let d = d_to_buffer(p).then(|| {
        let stride = p.n.div_ceil(ROW_ELEMS) * ROW_ELEMS;
        let at = offset;
        offset += (p.batch.max(1) * p.m * stride * 2).div_ceil(ALIGN) * ALIGN;
        padded.d = MatrixArg {
            ptr: 0,
            rows: p.m,
            cols: p.n,
            row_stride: stride,
            col_stride: 1,
            batch_stride: if p.batch > 1 { p.m * stride } else { 0 },
        };
        (stride, at)
    });
    // Check with a stand-in aligned address: only alignment matters to the router.
    let mut probe = padded;
    if d.is_some() {
        probe.d.ptr = 3 << 20;
    }
    if a.is_some() {
        probe.a.ptr = 1 << 20;
    }
    if b.is_some() {
        probe.b.ptr = 2 << 20;
    }
    hopper::tiles(arch, &probe)?;
    Some(Plan {
        a,
        b,
        b_kmajor,
        d,
        original_d: p.d,
        padded,
        workspace_bytes: offset,
    })
}

/// True when `p` should run padded on the Hopper kernel (see [`plan`]).
pub(crate) fn supports(arch: &Arch, p: &GemmProblem) -> bool {
    plan(arch, p).is_some()
}

fn i64_of(v: usize) -> Result<i64> {
    i64::try_from(v).map_err(|_| Error::unsupported(format!("{v} exceeds the 64-bit range")))
}

fn copy_args(c: &Copy, base: u64) -> Result<[KernelArg; 10]> {
    Ok([
        KernelArg::Ptr(c.src),
        KernelArg::Ptr(base + c.offset as u64),
        KernelArg::I64(i64_of(c.batch)?),
        KernelArg::I64(i64_of(c.rows)?),
        KernelArg::I64(i64_of(c.cols)?),
        KernelArg::I64(i64_of(c.src_rs)?),
        KernelArg::I64(i64_of(c.src_cs)?),
        KernelArg::I64(i64_of(c.src_bs)?),
        KernelArg::I64(i64_of(c.dst_rs)?),
        KernelArg::I64(i64_of(c.dst_bs)?),
    ])
}

/// Pads the operands of `p` that TMA cannot read and runs the Hopper GEMM on the copies.
pub(crate) fn launch(gpu: &dyn GpuBackend, p: &GemmProblem) -> Result<()> {
    let arch = gpu.arch();
    let Some(plan) = plan(arch, p) else {
        return Err(Error::unsupported(
            "the padded Hopper GEMM does not apply to this problem",
        ));
    };
    gpu.with_workspace(plan.workspace_bytes, &mut |base| {
        launch_in(gpu, &plan, base)
    })
}

/// Queues the pad and the GEMM with the copies at `base` (the workspace's address).
fn launch_in(gpu: &dyn GpuBackend, plan: &Plan, base: u64) -> Result<()> {
    let arch = gpu.arch();
    // The second parameter set repeats the first when only one operand is padded (grid y = 1
    // never reads it); no pad launch when only D goes through the buffer.
    let copies = match (&plan.a, &plan.b) {
        (Some(a), Some(b)) => Some((a, b)),
        (Some(c), None) | (None, Some(c)) => Some((c, c)),
        (None, None) if plan.d.is_some() => None,
        (None, None) => return Err(Error::unsupported("nothing to pad")),
    };
    if let Some((first, second)) = copies {
        let matrices: u32 = if plan.a.is_some() && plan.b.is_some() {
            2
        } else {
            1
        };
        let (x, y) = (copy_args(first, base)?, copy_args(second, base)?);
        let args: [KernelArg; 20] = std::array::from_fn(|i| if i < 10 { x[i] } else { y[i - 10] });
        // One block per row (grid-stride over rows).
        let rows = |c: &Copy| c.batch * c.rows;
        let blocks = rows(first)
            .max(rows(second))
            .clamp(1, BLOCKS_PER_SM * arch.compute_units.max(1) as usize);
        let config = LaunchConfig {
            grid: (blocks as u32, matrices, 1),
            block: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        gpu.launch_variant(&PadVariant, &config, &args)?;
    }

    let mut q = plan.padded;
    if let Some(c) = &plan.a {
        q.a.ptr = base + c.offset as u64;
    }
    if let Some(c) = &plan.b {
        q.b.ptr = base + c.offset as u64;
    }
    if let Some((_, at)) = plan.d {
        q.d.ptr = base + at as u64;
    }
    let padded_d = plan.d.is_some();
    match odd_split::enabled()
        .then(|| odd_split::split(arch, &q))
        .flatten()
    {
        Some(split) => odd_split::launch(gpu, &split, padded_d)?,
        None if padded_d => hopper::launch_into_padded_d(gpu, &q)?,
        None => hopper::launch_unsplit(gpu, &q)?,
    }
    let Some((stride, _)) = plan.d else {
        return Ok(());
    };
    // The aligned D back into the caller's D, a block per row.
    let d = &plan.original_d;
    let batch = plan.padded.batch.max(1);
    let rows = batch * plan.padded.m;
    let args = [
        KernelArg::Ptr(q.d.ptr),
        KernelArg::I64(i64_of(stride)?),
        KernelArg::I64(i64_of(q.d.batch_stride)?),
        KernelArg::Ptr(d.ptr),
        KernelArg::I64(i64_of(d.row_stride)?),
        KernelArg::I64(i64_of(d.col_stride)?),
        KernelArg::I64(i64_of(if batch > 1 { d.batch_stride } else { 0 })?),
        KernelArg::I64(i64_of(batch)?),
        KernelArg::I64(i64_of(plan.padded.m)?),
        KernelArg::I64(i64_of(plan.padded.n)?),
    ];
    let config = LaunchConfig {
        grid: (
            rows.clamp(1, BLOCKS_PER_SM * arch.compute_units.max(1) as usize) as u32,
            1,
            1,
        ),
        block: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    gpu.launch_variant(&UnpadVariant, &config, &args)
}

/// The pad kernel, for `calico compile` and the offline compile checks (Hopper targets).
pub(crate) fn catalog(vendor: HeaderSet) -> Result<Vec<CatalogEntry>> {
    Ok(vec![
        CatalogEntry {
            op: "gemm",
            label: "pad (odd shapes for the Hopper GEMM)".into(),
            source: PadVariant.source(vendor)?,
        },
        CatalogEntry {
            op: "gemm",
            label: "unpad (odd-width D from the Hopper GEMM)".into(),
            source: UnpadVariant.source(vendor)?,
        },
    ])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gemm::portable::tests::{h100, problem};

    #[test]
    fn aligned_problems_need_no_padding() {
        assert!(plan(&h100(), &problem(4096, 4096, 4096, true)).is_none());
        assert!(plan(&h100(), &problem(4096, 4096, 4096, false)).is_none());
    }

    #[test]
    fn odd_k_pads_both_operands_k_major() {
        let p = problem(4097, 4097, 4097, true);
        let plan = plan(&h100(), &p).expect("padded");
        let (a, b) = (plan.a.unwrap(), plan.b.unwrap());
        assert_eq!(
            (a.rows, a.cols, a.dst_rs, a.src_rs, a.src_cs),
            (4097, 4097, 4160, 4097, 1)
        );
        assert_eq!(
            (b.rows, b.cols, b.dst_rs, b.src_rs, b.src_cs),
            (4097, 4097, 4160, 4097, 1)
        );
        assert!(plan.b_kmajor);
        assert_eq!(b.offset, a.bytes());
        assert_eq!(plan.padded.a.row_stride, 4160);
        // D (4097 columns) goes to the aligned buffer beside padded A and B unless
        // CALICO_PAD_D=off.
        if pad_d_forced().unwrap_or(true) {
            assert_eq!(plan.d, Some((4160, a.bytes() + b.bytes())));
            assert_eq!(plan.padded.d.row_stride, 4160);
        } else {
            assert_eq!(plan.d, None);
            assert_eq!(plan.workspace_bytes, a.bytes() + b.bytes());
        }
        assert_eq!(plan.padded.b.col_stride, 4160);
    }

    #[test]
    fn odd_n_pads_only_row_major_b() {
        // 1000 x 999 x 1000 with row-major B: A's rows (K = 1000) are aligned, B's (N = 999) not.
        let p = problem(1000, 999, 1000, false);
        let plan = plan(&h100(), &p).expect("padded");
        assert!(plan.a.is_none());
        let b = plan.b.unwrap();
        assert!(!plan.b_kmajor);
        assert_eq!((b.rows, b.cols, b.dst_rs, b.offset), (1000, 999, 1024, 0));
        assert_eq!(plan.padded.b.row_stride, 1024);
        // The weight layout with N odd needs no operand copy (its rows are K long); only D,
        // and only with CALICO_PAD_D=on (by default the Hopper kernel's staged store writes it).
        let p = problem(1000, 999, 1000, true);
        match super::plan(&h100(), &p) {
            Some(plan) => {
                assert!(pad_d_forced() == Some(true) && pads_d_only(&h100(), &p));
                assert!(plan.a.is_none() && plan.b.is_none());
                assert_eq!(plan.d, Some((1024, 0)));
            }
            None => assert!(pad_d_forced() != Some(true) && !pads_d_only(&h100(), &p)),
        }
    }

    #[test]
    fn other_devices_are_declined() {
        let p = problem(4097, 4097, 4097, true);
        assert!(plan(&Arch::for_target("sm_80").unwrap(), &p).is_none());
        assert!(plan(&Arch::for_target("gfx942").unwrap(), &p).is_none());
        let mut p = problem(100, 100, 0, true);
        p.k = 0;
        assert!(plan(&h100(), &p).is_none());
    }

    #[test]
    fn source_assembles() {
        let c = catalog(calico_cuda::device_headers()).unwrap();
        assert!(c[0].source.text.contains("calico_gemm_pad"));
    }
}
