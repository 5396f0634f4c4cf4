//! Softmax over the last dimension.

use super::check;
use crate::gpu::{self, cdna_rows, rows};
use crate::Device;
use calico_core::{
    Arch, DType, Error, HeaderSet, KernelArg, KernelSource, KernelVariant, Result, Tensor,
};

/// `y = exp(x - max) / sum(exp(x - max))` over the last dimension, in f32.
pub fn softmax(dev: &Device, x: &Tensor, y: &mut Tensor) -> Result<()> {
    let dtype = check::float_dtype("x", x)?;
    if x.shape().is_empty() {
        return Err(Error::shape("softmax needs at least one dimension"));
    }
    check::on_device(dev, &[("x", x), ("y", y)])?;
    check::dtype_is("y", y, dtype)?;
    check::shape_is("y", y, x.shape())?;
    let xr = x.layout().as_rows()?;
    let yr = y.layout().as_rows()?;
    check::no_overlap(&[("y", y)], &[("x", x)])?;
    if x.numel() == 0 {
        return Ok(());
    }
    let gpu = match dev {
        Device::Cpu(_) => return calico_cpu::softmax(x, y),
        _ => dev
            .as_gpu()
            .ok_or_else(|| Error::unsupported("device has no kernel launcher"))?,
    };
    let (xp, yp) = (x.device_ptr().unwrap_or(1), y.device_ptr().unwrap_or(1));
    let args = [
        KernelArg::Ptr(xp),
        KernelArg::I64(xr.row_stride as i64),
        KernelArg::Ptr(yp),
        KernelArg::I64(yr.row_stride as i64),
        KernelArg::I64(xr.rows as i64),
        KernelArg::I64(xr.cols as i64),
    ];
    let (x_at, y_at) = (rows::operand(x)?, rows::operand(y)?);
    match choose(dev.arch(), dtype, xr.rows, xr.cols, x_at, y_at) {
        SoftmaxKernel::Cdna(v) => {
            gpu.launch_variant(&v, &cdna_rows::config(xr.rows, v.plan), &args)
        }
        SoftmaxKernel::Portable(v) => {
            gpu.launch_variant(&v, &rows::config(xr.rows, v.plan, dev.arch()), &args)
        }
    }
}

/// The kernel a softmax takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SoftmaxKernel {
    Cdna(SoftmaxCdnaVariant),
    Portable(SoftmaxVariant),
}

/// The router for rows of `cols` elements of x and y, each given as (base address, row
/// stride in elements): the CDNA kernel where it applies, else the portable one (shared by
/// the launch and `ops::plan`).
pub(crate) fn choose(
    arch: &Arch,
    dtype: DType,
    rows: usize,
    cols: usize,
    x: (u64, usize),
    y: (u64, usize),
) -> SoftmaxKernel {
    let esz = dtype.size_bytes();
    let strides = [x.1, y.1];
    if let Some(plan) = cdna_rows::plan(arch, esz, cols, &[x.0, y.0], &strides) {
        return SoftmaxKernel::Cdna(SoftmaxCdnaVariant { dtype, plan });
    }
    let vec = gpu::vector_width(esz, &[x.0, y.0], &strides, cols);
    // Rows that are not 16-byte aligned (odd lengths or strides) but misaligned alike in x and
    // y: vector loads over each row's aligned body, scalar head and tail.
    let wide = 16 / esz;
    let wide_plan = rows::plan(cols, wide, arch);
    let align_body = vec < wide && !wide_plan.streaming && rows::same_misalignment(esz, x, y, rows);
    let (vec, plan) = if align_body {
        (wide, wide_plan)
    } else {
        (vec, rows::plan(cols, vec, arch))
    };
    SoftmaxKernel::Portable(SoftmaxVariant {
        dtype,
        vec,
        plan,
        align_body,
    })
}

/// One compiled form of the softmax kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct SoftmaxVariant {
    pub dtype: DType,
    pub vec: usize,
    pub plan: rows::RowPlan,
    /// Aligned body, scalar head and tail per row (see softmax.cu).
    pub align_body: bool,
}

impl KernelVariant for SoftmaxVariant {
    fn source(&self, vendor: HeaderSet) -> Result<KernelSource> {
        source(vendor, self.dtype, self.vec, self.plan, self.align_body)
    }
}

/// The softmax kernel for one dtype, vector width and row plan.
pub(crate) fn source(
    vendor: HeaderSet,
    dtype: DType,
    vec: usize,
    plan: rows::RowPlan,
    align_body: bool,
) -> Result<KernelSource> {
    let defines = [
        ("ALIGN_BODY", u8::from(align_body).to_string()),
        ("ELEM", dtype.device_type().to_string()),
        ("VEC", vec.to_string()),
        ("NV", plan.vectors_per_thread.max(1).to_string()),
        ("THREADS", plan.threads.to_string()),
        (
            "STREAMING",
            if plan.streaming { "1" } else { "0" }.to_string(),
        ),
    ];
    gpu::assemble(
        vendor,
        "calico_softmax",
        include_str!("../../device/softmax/softmax.cu"),
        &defines,
    )
}

/// One compiled form of the CDNA softmax kernel (buffer loads; kernels/device/softmax/cdna.cu).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct SoftmaxCdnaVariant {
    pub dtype: DType,
    pub plan: cdna_rows::CdnaRowPlan,
}

impl KernelVariant for SoftmaxCdnaVariant {
    fn source(&self, vendor: HeaderSet) -> Result<KernelSource> {
        let mut defines = vec![("ELEM", self.dtype.device_type().to_string())];
        defines.extend(self.plan.defines());
        gpu::assemble(
            vendor,
            "calico_softmax_cdna",
            include_str!("../../device/softmax/cdna.cu"),
            &defines,
        )
    }
}
