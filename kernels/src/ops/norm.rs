//! RMSNorm and LayerNorm, with an optional fused residual add.

use super::check;
use crate::gpu::{self, cdna_rows, rows};
use crate::Device;
use calico_core::{
    Arch, DType, Error, HeaderSet, KernelArg, KernelSource, KernelVariant, Result, Tensor,
};

/// What kind of normalisation, and which optional inputs and outputs take part.
struct NormCall<'a> {
    layer: bool,
    x: &'a Tensor,
    residual: Option<&'a Tensor>,
    weight: Option<&'a Tensor>,
    bias: Option<&'a Tensor>,
    eps: f32,
    y: &'a Tensor,
    sum: Option<&'a Tensor>,
}

/// `y = x / sqrt(mean(x²) + eps) * weight` over the last dimension.
pub fn rms_norm(dev: &Device, x: &Tensor, weight: &Tensor, eps: f32, y: &mut Tensor) -> Result<()> {
    run(
        dev,
        NormCall {
            layer: false,
            x,
            residual: None,
            weight: Some(weight),
            bias: None,
            eps,
            y,
            sum: None,
        },
    )
}

/// `sum = x + residual` (rounded to the dtype), then `y = rms_norm(sum) * weight`.
pub fn add_rms_norm(
    dev: &Device,
    x: &Tensor,
    residual: &Tensor,
    weight: &Tensor,
    eps: f32,
    y: &mut Tensor,
    sum: &mut Tensor,
) -> Result<()> {
    run(
        dev,
        NormCall {
            layer: false,
            x,
            residual: Some(residual),
            weight: Some(weight),
            bias: None,
            eps,
            y,
            sum: Some(sum),
        },
    )
}

/// `y = (x - mean) / sqrt(var + eps) * weight + bias` over the last dimension.
pub fn layer_norm(
    dev: &Device,
    x: &Tensor,
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    eps: f32,
    y: &mut Tensor,
) -> Result<()> {
    run(
        dev,
        NormCall {
            layer: true,
            x,
            residual: None,
            weight,
            bias,
            eps,
            y,
            sum: None,
        },
    )
}

/// `sum = x + residual` (rounded to the dtype), then `y = layer_norm(sum)`.
#[allow(clippy::too_many_arguments)]
pub fn add_layer_norm(
    dev: &Device,
    x: &Tensor,
    residual: &Tensor,
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    eps: f32,
    y: &mut Tensor,
    sum: &mut Tensor,
) -> Result<()> {
    run(
        dev,
        NormCall {
            layer: true,
            x,
            residual: Some(residual),
            weight,
            bias,
            eps,
            y,
            sum: Some(sum),
        },
    )
}

fn validate<'a>(dev: &Device, c: &NormCall<'a>) -> Result<()> {
    let dtype = check::float_dtype("x", c.x)?;
    if c.x.shape().is_empty() {
        return Err(Error::shape("a norm needs at least one dimension"));
    }
    if !c.eps.is_finite() || c.eps < 0.0 {
        return Err(Error::unsupported(format!(
            "eps must be finite and >= 0, got {}",
            c.eps
        )));
    }
    let cols = *c.x.shape().last().expect("rank checked");
    // Fixed arrays of optional tensors: validation runs on every call and allocates nothing.
    let like_x = [("y", Some(c.y)), ("residual", c.residual), ("sum", c.sum)];
    let vectors = [("weight", c.weight), ("bias", c.bias)];
    check::on_device(dev, &[("x", c.x)])?;
    check::on_device_if_given(dev, &like_x)?;
    check::on_device_if_given(dev, &vectors)?;
    for (name, t) in like_x.iter().filter_map(check::Arg::given) {
        check::dtype_is(name, t, dtype)?;
        check::shape_is(name, t, c.x.shape())?;
    }
    for (name, t) in vectors.iter().filter_map(check::Arg::given) {
        check::dtype_is(name, t, dtype)?;
        check::shape_is(name, t, &[cols])?;
    }
    c.x.layout().as_rows()?;
    for (_, t) in like_x.iter().chain(&vectors).filter_map(check::Arg::given) {
        t.layout().as_rows()?;
    }
    let inputs = [
        ("x", Some(c.x)),
        ("residual", c.residual),
        ("weight", c.weight),
        ("bias", c.bias),
    ];
    let outputs = [("y", Some(c.y)), ("sum", c.sum)];
    check::no_overlap_if_given(&outputs, &inputs)
}

fn run(dev: &Device, c: NormCall) -> Result<()> {
    validate(dev, &c)?;
    if c.x.numel() == 0 {
        return Ok(());
    }
    match dev {
        Device::Cpu(_) => {
            if c.layer {
                calico_cpu::layer_norm(c.x, c.residual, c.weight, c.bias, c.eps, c.y, c.sum)
            } else {
                let w = c.weight.expect("rms_norm always has a weight");
                calico_cpu::rms_norm(c.x, c.residual, w, c.eps, c.y, c.sum)
            }
        }
        _ => launch(dev, &c),
    }
}

fn launch(dev: &Device, c: &NormCall) -> Result<()> {
    let gpu = dev
        .as_gpu()
        .ok_or_else(|| Error::unsupported("device has no kernel launcher"))?;
    let xr = c.x.layout().as_rows()?;
    let yr = c.y.layout().as_rows()?;
    let ptr = |t: Option<&Tensor>| t.map(|t| t.device_ptr().unwrap_or(0)).unwrap_or(0);
    let stride = |t: Option<&Tensor>| -> Result<usize> {
        Ok(match t {
            Some(t) => t.layout().as_rows()?.row_stride,
            None => 0,
        })
    };
    let geometry = NormGeometry::of(c.x, c.residual, c.weight, c.bias, c.y, c.sum)?;
    let args = norm_args(
        c,
        &ptr,
        &stride,
        xr.rows,
        xr.cols,
        xr.row_stride,
        yr.row_stride,
    )?;
    match choose(dev.arch(), c.x.dtype(), c.layer, &geometry) {
        NormKernel::Cdna(v) => gpu.launch_variant(&v, &cdna_rows::config(xr.rows, v.plan), &args),
        NormKernel::Portable(v) => {
            gpu.launch_variant(&v, &rows::config(xr.rows, v.plan, dev.arch()), &args)
        }
    }
}

/// A row operand: base address and row stride in elements.
pub(crate) type RowOperand = (u64, usize);

/// Where a norm's operands lie (absent ones are `None`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct NormGeometry {
    pub rows: usize,
    pub cols: usize,
    pub x: RowOperand,
    pub residual: Option<RowOperand>,
    pub y: RowOperand,
    pub sum: Option<RowOperand>,
    pub weight: Option<u64>,
    pub bias: Option<u64>,
}

impl NormGeometry {
    /// The geometry of the tensors of a call (the launch's; `ops::plan` tests compare it).
    pub(crate) fn of(
        x: &Tensor,
        residual: Option<&Tensor>,
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        y: &Tensor,
        sum: Option<&Tensor>,
    ) -> Result<NormGeometry> {
        let xr = x.layout().as_rows()?;
        let optional = |t: Option<&Tensor>| t.map(rows::operand).transpose();
        Ok(NormGeometry {
            rows: xr.rows,
            cols: xr.cols,
            x: rows::operand(x)?,
            residual: optional(residual)?,
            y: rows::operand(y)?,
            sum: optional(sum)?,
            weight: weight.map(|t| t.device_ptr().unwrap_or(1)),
            bias: bias.map(|t| t.device_ptr().unwrap_or(1)),
        })
    }
}

/// The kernel a norm takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NormKernel {
    Cdna(NormCdnaVariant),
    Portable(NormVariant),
}

/// The router: the CDNA kernel where it applies, else the portable one with the widest
/// vector the operands allow (shared by the launch and `ops::plan`).
pub(crate) fn choose(arch: &Arch, dtype: DType, layer: bool, g: &NormGeometry) -> NormKernel {
    let esz = dtype.size_bytes();
    // Absent tensors count as aligned (address 0).
    let addresses = [
        Some(g.x.0),
        g.residual.map(|o| o.0),
        g.weight,
        g.bias,
        Some(g.y.0),
        g.sum.map(|o| o.0),
    ]
    .map(|a| a.unwrap_or(0));
    let strides = [
        g.x.1,
        g.residual.map_or(0, |o| o.1),
        g.y.1,
        g.sum.map_or(0, |o| o.1),
    ];
    if let Some(plan) = cdna_rows::plan(arch, esz, g.cols, &addresses, &strides) {
        return NormKernel::Cdna(NormCdnaVariant {
            dtype,
            plan,
            layer,
            residual: g.residual.is_some(),
            weight: g.weight.is_some(),
            bias: g.bias.is_some(),
        });
    }
    let vec = gpu::vector_width(esz, &addresses, &strides, g.cols);
    // RMSNorm rows that are not 16-byte aligned (odd lengths or strides) but misaligned alike
    // in every row operand: vector loads over each row's aligned body, scalar head and tail.
    let wide = 16 / esz;
    let aim = if layer {
        rows::TARGET_VECTORS
    } else {
        rows::RMS_TARGET_VECTORS
    };
    let wide_plan = rows::plan_aiming(g.cols, wide, arch, aim);
    let alike =
        |o: Option<RowOperand>| o.is_none_or(|o| rows::same_misalignment(esz, g.x, o, g.rows));
    let align_body = vec < wide
        && !layer
        && !wide_plan.streaming
        && alike(Some(g.y))
        && alike(g.residual)
        && alike(g.sum)
        && g.weight.is_none_or(|w| w % esz as u64 == 0);
    let (vec, plan) = if align_body {
        (wide, wide_plan)
    } else {
        (vec, rows::plan_aiming(g.cols, vec, arch, aim))
    };
    NormKernel::Portable(NormVariant {
        dtype,
        vec,
        plan,
        align_body,
        layer,
        residual: g.residual.is_some(),
        weight: g.weight.is_some(),
        bias: g.bias.is_some(),
    })
}

/// One compiled form of the norm kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct NormVariant {
    pub dtype: DType,
    pub vec: usize,
    pub plan: rows::RowPlan,
    /// Aligned-body rows (RMSNorm only; see norm.cu).
    pub align_body: bool,
    pub layer: bool,
    pub residual: bool,
    pub weight: bool,
    pub bias: bool,
}

impl KernelVariant for NormVariant {
    fn source(&self, vendor: HeaderSet) -> Result<KernelSource> {
        let flag = |b: bool| if b { "1" } else { "0" }.to_string();
        let defines = [
            ("ELEM", self.dtype.device_type().to_string()),
            ("VEC", self.vec.to_string()),
            ("NV", self.plan.vectors_per_thread.max(1).to_string()),
            ("THREADS", self.plan.threads.to_string()),
            ("STREAMING", flag(self.plan.streaming)),
            ("LAYER", flag(self.layer)),
            ("HAS_RESIDUAL", flag(self.residual)),
            ("HAS_WEIGHT", flag(self.weight)),
            ("HAS_BIAS", flag(self.bias)),
            ("ALIGN_BODY", flag(self.align_body)),
        ];
        gpu::assemble(
            vendor,
            "calico_norm",
            include_str!("../../device/norm/norm.cu"),
            &defines,
        )
    }
}

/// One compiled form of the CDNA norm kernel (buffer loads; kernels/device/norm/cdna.cu).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct NormCdnaVariant {
    pub dtype: DType,
    pub plan: cdna_rows::CdnaRowPlan,
    pub layer: bool,
    pub residual: bool,
    pub weight: bool,
    pub bias: bool,
}

impl KernelVariant for NormCdnaVariant {
    fn source(&self, vendor: HeaderSet) -> Result<KernelSource> {
        let flag = |b: bool| u8::from(b).to_string();
        let mut defines = vec![
            ("ELEM", self.dtype.device_type().to_string()),
            ("LAYER", flag(self.layer)),
            ("HAS_RESIDUAL", flag(self.residual)),
            ("HAS_WEIGHT", flag(self.weight)),
            ("HAS_BIAS", flag(self.bias)),
        ];
        defines.extend(self.plan.defines());
        gpu::assemble(
            vendor,
            "calico_norm_cdna",
            include_str!("../../device/norm/cdna.cu"),
            &defines,
        )
    }
}

/// The kernel's parameters, in the order of `calico_norm` in norm.cu (absent tensors are null).
#[allow(clippy::too_many_arguments)]
fn norm_args(
    c: &NormCall,
    ptr: &dyn Fn(Option<&Tensor>) -> u64,
    stride: &dyn Fn(Option<&Tensor>) -> Result<usize>,
    rows: usize,
    cols: usize,
    x_stride: usize,
    y_stride: usize,
) -> Result<[KernelArg; 13]> {
    Ok([
        KernelArg::Ptr(ptr(Some(c.x))),
        KernelArg::I64(x_stride as i64),
        KernelArg::Ptr(ptr(c.residual)),
        KernelArg::I64(stride(c.residual)? as i64),
        KernelArg::Ptr(ptr(c.weight)),
        KernelArg::Ptr(ptr(c.bias)),
        KernelArg::Ptr(ptr(Some(c.y))),
        KernelArg::I64(y_stride as i64),
        KernelArg::Ptr(ptr(c.sum)),
        KernelArg::I64(stride(c.sum)? as i64),
        KernelArg::I64(rows as i64),
        KernelArg::I64(cols as i64),
        KernelArg::F32(c.eps),
    ])
}
