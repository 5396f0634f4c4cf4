//! Matrix multiplication: `D = alpha * A @ B + beta * C (+ bias)`, then an optional epilogue.
//!
//! `ops::gemm` validates and describes the problem as a [`GemmProblem`]; the variant for the
//! device is chosen here: GEMV (M <= 16 against a K-major weight; on NVIDIA any alignment, on
//! CDNA K even), skinny (M <= 64 decode shapes, split-K over a cluster), Hopper (TMA + wgmma),
//! padded Hopper (operands with strides TMA cannot read, copied aligned first), sm_80 with a TMA
//! producer (GPUs with TMA but no wgmma: sm_100), sm_80 (mma.sync + cp.async), CDNA (MFMA
//! ping-pong on gfx90a/gfx94x), the vendor-neutral tile kernel (written on the shared tile
//! vocabulary: any sizes and row strides with a unit stride in each operand),
//! or the scalar portable kernel (operands with no unit stride, GPUs without 16-bit matrix
//! instructions); the CPU backend has its own implementation.

mod cdna;
mod cdna_gemv;
mod gemv;
mod hopper;
mod odd_split;
mod padded;
mod params;
mod plan;
mod plan_cache;
mod portable;
mod skinny;
mod sm80;
mod sm80_tma;
mod tile;
mod wave_cut;

use crate::ops_check as check;
use crate::Device;
pub use calico_core::Epilogue;
use calico_core::{DType, Error, Result, Tensor};
pub use plan::{plan_dense, GemmPlan};

/// One operand as the kernels see it: a device pointer and strides in elements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MatrixArg {
    pub ptr: u64,
    pub rows: usize,
    pub cols: usize,
    pub row_stride: usize,
    pub col_stride: usize,
    pub batch_stride: usize,
}

/// A validated GEMM, ready for a kernel variant.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GemmProblem {
    pub batch: usize,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    /// BF16 or F16 (A and B agree).
    pub in_dtype: DType,
    /// BF16, F16 or F32 (D, C and bias agree).
    pub out_dtype: DType,
    /// M x K.
    pub a: MatrixArg,
    /// K x N.
    pub b: MatrixArg,
    /// M x N, read when `beta != 0`.
    pub c: Option<MatrixArg>,
    /// M x N.
    pub d: MatrixArg,
    /// N elements.
    pub bias: Option<u64>,
    pub alpha: f32,
    pub beta: f32,
    pub epilogue: Epilogue,
}

impl MatrixArg {
    /// The `rows` x `cols` block of `self` from row `r0` and column `c0` on (elements of
    /// `elem` bytes): the same buffer, its base moved; `None` if the offset overflows.
    fn block(&self, elem: usize, r0: usize, rows: usize, c0: usize, cols: usize) -> Option<Self> {
        let offset = r0
            .checked_mul(self.row_stride)?
            .checked_add(c0.checked_mul(self.col_stride)?)?
            .checked_mul(elem)?;
        Some(MatrixArg {
            ptr: self.ptr.checked_add(u64::try_from(offset).ok()?)?,
            rows,
            cols,
            ..*self
        })
    }
}

impl GemmProblem {
    /// The part of `self` that writes D's rows `r0 .. r0 + m` and columns `c0 .. c0 + n`:
    /// views of the same buffers (A's rows, B's columns, C's and D's block, the bias's
    /// columns); `None` if an offset overflows. The odd-shape split's slivers and the wave
    /// cut's head and tail are such parts.
    fn part(&self, r0: usize, m: usize, c0: usize, n: usize) -> Option<GemmProblem> {
        let (ie, oe) = (self.in_dtype.size_bytes(), self.out_dtype.size_bytes());
        let c = match self.c {
            Some(c) => Some(c.block(oe, r0, m, c0, n)?),
            None => None,
        };
        let bias = match self.bias {
            Some(b) => Some(b.checked_add(u64::try_from(c0.checked_mul(oe)?).ok()?)?),
            None => None,
        };
        Some(GemmProblem {
            m,
            n,
            a: self.a.block(ie, r0, m, 0, self.k)?,
            b: self.b.block(ie, 0, self.k, c0, n)?,
            c,
            d: self.d.block(oe, r0, m, c0, n)?,
            bias,
            ..*self
        })
    }
}

/// The optional parts of a GEMM.
#[derive(Debug, Clone, Copy)]
pub struct GemmOptions<'a> {
    pub alpha: f32,
    pub beta: f32,
    /// Added as `beta * C`; same shape and dtype as D.
    pub c: Option<&'a Tensor>,
    /// Added to every row; N elements of D's dtype.
    pub bias: Option<&'a Tensor>,
    pub epilogue: Epilogue,
}

impl Default for GemmOptions<'_> {
    fn default() -> Self {
        GemmOptions {
            alpha: 1.0,
            beta: 0.0,
            c: None,
            bias: None,
            epilogue: Epilogue::None,
        }
    }
}

/// `D = A @ B`. A is [M, K] or [batch, M, K], B [K, N] or [batch, K, N], D [M, N] or
/// [batch, M, N]; transposed operands are views with swapped strides.
pub fn matmul(dev: &Device, a: &Tensor, b: &Tensor, d: &mut Tensor) -> Result<()> {
    gemm(dev, a, b, d, &GemmOptions::default())
}

/// `D = epilogue(alpha * A @ B + beta * C + bias)`, accumulating in f32.
pub fn gemm(
    dev: &Device,
    a: &Tensor,
    b: &Tensor,
    d: &mut Tensor,
    opts: &GemmOptions,
) -> Result<()> {
    let p = describe(dev, a, b, d, opts)?;
    if p.m == 0 || p.n == 0 || p.batch == 0 {
        return Ok(());
    }
    match dev {
        Device::Cpu(_) => calico_cpu::gemm(
            a,
            b,
            opts.c,
            d,
            opts.alpha,
            opts.beta,
            opts.epilogue,
            opts.bias,
        ),
        _ => launch(dev, &p),
    }
}

/// The GPU GEMM kernels (`kernels/device/gemm/`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GemmKernel {
    /// Decode GEMV, M <= 16 against a K-major weight (gemv.cu).
    Gemv,
    /// Decode GEMV on gfx90a/gfx94x, M <= 16 against a K-major weight (cdna_gemv.cu).
    CdnaGemv,
    /// Split-K over a thread-block cluster, M <= 64 (skinny.cu).
    Skinny,
    /// TMA + wgmma, sm_90a (hopper.cu).
    Hopper,
    /// The Hopper kernel on operands first copied to 16-byte aligned rows (pad.cu).
    Padded,
    /// TMA + mma.sync: sm80.cu's MMA warps fed by a TMA producer warp; GPUs with TMA but no
    /// wgmma (sm_100).
    Sm80Tma,
    /// cp.async + mma.sync, sm_80 and later (sm80.cu).
    Sm80,
    /// MFMA 8-wave ping-pong, gfx90a and gfx94x (cdna.cu).
    Cdna,
    /// The shared tile vocabulary on mma.sync or MFMA: any sizes, a unit stride in each
    /// operand (tile.cu).
    Tile,
    /// Any vendor, any strides, no matrix instructions (portable.cu).
    Portable,
}

/// The fastest kernel that supports `p` on `arch`.
fn route(arch: &calico_core::Arch, p: &GemmProblem) -> Result<GemmKernel> {
    if gemv::supports(arch, p) {
        return Ok(GemmKernel::Gemv);
    }
    if cdna_gemv::supports(arch, p) {
        return Ok(GemmKernel::CdnaGemv);
    }
    // The Hopper kernel's tile count, if it runs `p`: the skinny router weighs it too.
    let hopper_tiles = hopper::tiles(arch, p);
    if skinny::supports(arch, p) && skinny::prefers(arch, p, hopper_tiles) {
        Ok(GemmKernel::Skinny)
    } else if hopper_tiles.is_some() && !padded::pads_d_only(arch, p) {
        Ok(GemmKernel::Hopper)
    } else if padded::supports(arch, p) {
        Ok(GemmKernel::Padded)
    } else if sm80_tma::supports(arch, p) {
        Ok(GemmKernel::Sm80Tma)
    } else if sm80::supports(arch, p) {
        Ok(GemmKernel::Sm80)
    } else if cdna::supports(arch, p) {
        Ok(GemmKernel::Cdna)
    } else if tile::supports(arch, p) {
        Ok(GemmKernel::Tile)
    } else if portable::supports(arch, p) {
        Ok(GemmKernel::Portable)
    } else {
        Err(Error::unsupported(format!(
            "no GEMM kernel for this problem on {} ({p:?})",
            arch.target
        )))
    }
}

/// Picks the fastest variant that supports the problem on this device.
fn launch(dev: &Device, p: &GemmProblem) -> Result<()> {
    let gpu = dev
        .as_gpu()
        .ok_or_else(|| Error::unsupported("device has no kernel launcher"))?;
    launch_kernel(gpu, route_on(gpu.arch(), p)?, p)
}

fn launch_kernel(
    gpu: &dyn calico_core::GpuBackend,
    kernel: GemmKernel,
    p: &GemmProblem,
) -> Result<()> {
    match kernel {
        GemmKernel::Gemv => gemv::launch(gpu, p),
        GemmKernel::CdnaGemv => cdna_gemv::launch(gpu, p),
        GemmKernel::Skinny => skinny::launch(gpu, p),
        GemmKernel::Padded => padded::launch(gpu, p),
        GemmKernel::Hopper => hopper::launch(gpu, p),
        GemmKernel::Sm80Tma => sm80_tma::launch(gpu, p),
        GemmKernel::Sm80 => sm80::launch(gpu, p),
        GemmKernel::Cdna => cdna::launch(gpu, p),
        GemmKernel::Tile => tile::launch(gpu, p),
        GemmKernel::Portable => portable::launch(gpu, p),
    }
}

/// [`gemm`] on a chosen GPU kernel instead of the router's choice, for tests and comparisons:
/// the vendor-neutral kernels ([`GemmKernel::Tile`], [`GemmKernel::Portable`]) and the TMA +
/// mma.sync kernel ([`GemmKernel::Sm80Tma`], Blackwell's, which runs on any GPU with TMA), each
/// wherever its requirements hold; an `Err` when the kernel cannot take the problem.
pub fn gemm_with_kernel(
    dev: &Device,
    kernel: GemmKernel,
    a: &Tensor,
    b: &Tensor,
    d: &mut Tensor,
    opts: &GemmOptions,
) -> Result<()> {
    let p = describe(dev, a, b, d, opts)?;
    if p.m == 0 || p.n == 0 || p.batch == 0 {
        return Ok(());
    }
    let gpu = dev
        .as_gpu()
        .ok_or_else(|| Error::unsupported("a chosen GEMM kernel needs a GPU device"))?;
    match kernel {
        GemmKernel::Tile | GemmKernel::Portable => launch_kernel(gpu, kernel, &p),
        GemmKernel::Sm80Tma if sm80_tma::can_run(gpu.arch(), &p) => launch_kernel(gpu, kernel, &p),
        GemmKernel::Sm80Tma => Err(Error::unsupported(format!(
            "the TMA + mma.sync GEMM kernel cannot run this problem on {} (it needs TMA and \
             operands TMA can read: 16-byte aligned rows, unit stride along K or N)",
            gpu.arch().target
        ))),
        _ => Err(Error::unsupported(format!(
            "the {kernel:?} GEMM kernel cannot be chosen by hand; only Tile, Portable and \
             Sm80Tma can"
        ))),
    }
}

/// The kernel [`gemm`] would run these operands with on `dev` (`None` on the CPU, or when the
/// problem is empty), after the same checks: for tests and tools that must know which path
/// they exercise.
pub fn gemm_kernel(
    dev: &Device,
    a: &Tensor,
    b: &Tensor,
    d: &Tensor,
    opts: &GemmOptions,
) -> Result<Option<GemmKernel>> {
    let p = describe(dev, a, b, d, opts)?;
    if p.m == 0 || p.n == 0 || p.batch == 0 || matches!(dev, Device::Cpu(_)) {
        return Ok(None);
    }
    route_on(dev.arch(), &p).map(Some)
}

/// [`route`] for a device, honouring `CALICO_GEMM_KERNEL` and `CALICO_GEMM_ROUTE_AS` (plan.rs),
/// planned once per problem shape ([`plan_cache`]).
fn route_on(arch: &calico_core::Arch, p: &GemmProblem) -> Result<GemmKernel> {
    static ROUTES: plan_cache::PlanMemo<GemmKernel> = plan_cache::PlanMemo::new();
    ROUTES.get_or_plan(plan_cache::PlanKey::of(arch, p), || {
        route_unremembered(arch, p)
    })
}

/// [`route_on`] planned afresh (the knobs it reads are fixed for the process).
fn route_unremembered(arch: &calico_core::Arch, p: &GemmProblem) -> Result<GemmKernel> {
    match plan::forced_kernel() {
        Some(GemmKernel::Tile) if tile::supports(arch, p) => return Ok(GemmKernel::Tile),
        Some(GemmKernel::Portable) if portable::supports(arch, p) => {
            return Ok(GemmKernel::Portable)
        }
        _ => {}
    }
    match plan::route_as(arch) {
        Some(as_target) => route(&as_target, p),
        None => route(arch, p),
    }
}

/// `v` as a 64-bit kernel argument; `what` names it in the (never expected) overflow error.
pub(crate) fn as_i64(v: usize, what: &str) -> Result<i64> {
    i64::try_from(v).map_err(|_| {
        Error::unsupported(format!("GEMM {what} = {v} exceeds the 64-bit signed range"))
    })
}

/// The same values as [`weight_params`], as the positional argument list of the GEMVs (CUDA
/// gemv.cu and HIP cdna_gemv.cu): the CUDA GEMV's K loop is scheduled worse when its pointers
/// come from a by-value struct (see gemv.cu's entry).
pub(crate) fn weight_args(p: &GemmProblem, has_c: bool) -> Result<[calico_core::KernelArg; 16]> {
    use calico_core::KernelArg;
    let (c_ptr, c_rs, c_cs) = match p.c.filter(|_| has_c) {
        Some(c) => (c.ptr, c.row_stride, c.col_stride),
        None => (0, 0, 0),
    };
    Ok([
        KernelArg::Ptr(p.a.ptr),
        KernelArg::I64(as_i64(p.a.row_stride, "A row stride")?),
        KernelArg::Ptr(p.b.ptr),
        KernelArg::I64(as_i64(p.b.col_stride, "B column stride")?),
        KernelArg::Ptr(c_ptr),
        KernelArg::I64(as_i64(c_rs, "C row stride")?),
        KernelArg::I64(as_i64(c_cs, "C column stride")?),
        KernelArg::Ptr(p.d.ptr),
        KernelArg::I64(as_i64(p.d.row_stride, "D row stride")?),
        KernelArg::I64(as_i64(p.d.col_stride, "D column stride")?),
        KernelArg::Ptr(p.bias.unwrap_or(0)),
        KernelArg::I64(as_i64(p.m, "M")?),
        KernelArg::I64(as_i64(p.n, "N")?),
        KernelArg::I64(as_i64(p.k, "K")?),
        KernelArg::F32(p.alpha),
        KernelArg::F32(p.beta),
    ])
}

/// The parameters of the small-M kernels that stream a K-major weight (skinny and GEMV):
/// C only when it is read; strides in elements.
pub(crate) fn weight_params(p: &GemmProblem, has_c: bool) -> Result<params::WeightParams> {
    let (c_ptr, c_rs, c_cs) = match p.c.filter(|_| has_c) {
        Some(c) => (c.ptr, c.row_stride, c.col_stride),
        None => (0, 0, 0),
    };
    Ok(params::WeightParams {
        a: p.a.ptr,
        a_rs: as_i64(p.a.row_stride, "A row stride")?,
        w: p.b.ptr,
        w_rs: as_i64(p.b.col_stride, "B column stride")?,
        c: c_ptr,
        c_rs: as_i64(c_rs, "C row stride")?,
        c_cs: as_i64(c_cs, "C column stride")?,
        d: p.d.ptr,
        d_rs: as_i64(p.d.row_stride, "D row stride")?,
        d_cs: as_i64(p.d.col_stride, "D column stride")?,
        bias: p.bias.unwrap_or(0),
        m: as_i64(p.m, "M")?,
        n: as_i64(p.n, "N")?,
        k: as_i64(p.k, "K")?,
        alpha: p.alpha,
        beta: p.beta,
    })
}

/// (batch, rows, cols, batch stride) of a rank-2 or rank-3 operand.
fn matrix(name: &str, t: &Tensor) -> Result<(usize, MatrixArg)> {
    let s = t.strides();
    let (batch, rows, cols, rs, cs, bs) = match *t.shape() {
        [r, c] => (1, r, c, s[0], s[1], 0),
        [b, r, c] => (b, r, c, s[1], s[2], s[0]),
        _ => {
            return Err(Error::shape(format!(
                "`{name}` must be a matrix or a batch of matrices, got shape {:?}",
                t.shape()
            )))
        }
    };
    let ptr = t.device_ptr().unwrap_or(0);
    Ok((
        batch,
        MatrixArg {
            ptr,
            rows,
            cols,
            row_stride: rs,
            col_stride: cs,
            batch_stride: bs,
        },
    ))
}

fn describe(
    dev: &Device,
    a: &Tensor,
    b: &Tensor,
    d: &Tensor,
    opts: &GemmOptions,
) -> Result<GemmProblem> {
    check::on_device(dev, &[("a", a), ("b", b), ("d", d)])?;
    for (name, t) in [("c", opts.c), ("bias", opts.bias)] {
        if let Some(t) = t {
            check::on_device(dev, &[(name, t)])?;
        }
    }
    let in_dtype = a.dtype();
    if !matches!(in_dtype, DType::BF16 | DType::F16) {
        return Err(Error::DType {
            expected: "bf16 or f16 for `a`".into(),
            got: in_dtype,
        });
    }
    check::dtype_is("b", b, in_dtype)?;
    let out_dtype = check::float_dtype("d", d)?;
    let (ba, am) = matrix("a", a)?;
    let (bb, bm) = matrix("b", b)?;
    let (bd, dm) = matrix("d", d)?;
    if a.shape().len() != d.shape().len()
        || b.shape().len() != d.shape().len()
        || ba != bd
        || bb != bd
    {
        return Err(Error::shape(format!(
            "batched shapes disagree: a {:?}, b {:?}, d {:?}",
            a.shape(),
            b.shape(),
            d.shape()
        )));
    }
    let (m, k, n) = (am.rows, am.cols, bm.cols);
    if bm.rows != k {
        return Err(Error::shape(format!(
            "a is {m}x{k} but b is {}x{n}",
            bm.rows
        )));
    }
    if dm.rows != m || dm.cols != n {
        return Err(Error::shape(format!(
            "d must be {m}x{n}, got {}x{}",
            dm.rows, dm.cols
        )));
    }
    let c = match opts.c {
        Some(c) => {
            check::dtype_is("c", c, out_dtype)?;
            check::shape_is("c", c, d.shape())?;
            Some(matrix("c", c)?.1)
        }
        None if opts.beta != 0.0 => {
            return Err(Error::shape("beta is non-zero but no `c` was given"))
        }
        None => None,
    };
    if let Some(bias) = opts.bias {
        check::dtype_is("bias", bias, out_dtype)?;
        check::shape_is("bias", bias, &[n])?;
    }
    if !opts.alpha.is_finite() || !opts.beta.is_finite() {
        return Err(Error::unsupported("alpha and beta must be finite"));
    }
    // D may be C itself (an in-place update reads each element before writing it), but must not
    // overlap A, B or the bias.
    check::no_overlap(&[("d", d)], &[("a", a), ("b", b)])?;
    if let Some(bias) = opts.bias {
        check::no_overlap(&[("d", d)], &[("bias", bias)])?;
    }
    if let Some(c) = opts.c {
        // The one allowed overlap is C being exactly D's view (same storage, same layout).
        if c.overlaps(d) && !(c.same_storage(d) && c.layout() == d.layout()) {
            return Err(Error::Aliasing(
                "`c` partly overlaps `d`; pass the same view for an in-place update".into(),
            ));
        }
    }
    Ok(GemmProblem {
        batch: bd,
        m,
        n,
        k,
        in_dtype,
        out_dtype,
        a: am,
        b: bm,
        c,
        d: dm,
        bias: opts.bias.and_then(|t| t.device_ptr()),
        alpha: opts.alpha,
        beta: opts.beta,
        epilogue: opts.epilogue,
    })
}

/// The GEMM kernel variants for `arch` (for `calico compile` and the compile checks).
pub(crate) fn catalog(
    arch: &calico_core::Arch,
    vendor: calico_core::HeaderSet,
) -> Result<Vec<crate::catalog::CatalogEntry>> {
    let mut out = gemv::catalog(arch, vendor)?;
    out.extend(cdna_gemv::catalog(arch, vendor)?);
    out.extend(skinny::catalog(arch, vendor)?);
    if arch.has_mma(calico_core::MmaKind::Wgmma, DType::BF16) && arch.target.ends_with('a') {
        out.extend(hopper::catalog(vendor)?);
        out.extend(padded::catalog(vendor)?);
    }
    if arch.has_mma(calico_core::MmaKind::MmaSync, DType::BF16) {
        out.extend(sm80::catalog(vendor)?);
    }
    out.extend(sm80_tma::catalog(arch, vendor)?);
    if arch.has_mma(calico_core::MmaKind::Mfma, DType::BF16) {
        out.extend(cdna::catalog(vendor)?);
    }
    if arch.has_mma(calico_core::MmaKind::MmaSync, DType::BF16)
        || arch.has_mma(calico_core::MmaKind::Mfma, DType::BF16)
    {
        out.extend(tile::catalog(vendor)?);
    }
    out.extend(portable::catalog(vendor)?);
    Ok(out)
}
