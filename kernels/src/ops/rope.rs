//! Rotary position embedding.

use super::check;
use crate::gpu::{self, cdna_rows};
use crate::Device;
use calico_core::{
    Arch, DType, Error, HeaderSet, KernelArg, KernelSource, KernelVariant, LaunchConfig, Result,
    Tensor,
};

/// Which elements form a rotated pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RopeMode {
    /// Pairs `(x[2i], x[2i+1])` (GPT-J, the original RoFormer).
    Interleaved,
    /// Pairs `(x[i], x[i + D/2])` (GPT-NeoX, Llama).
    HalfSplit,
}

/// Rotates `x` ([S, H, D] or [B, S, H, D]) by the angles in `cos`/`sin` (f32, [P, D/2]) at
/// positions `pos_offset + s`, writing `y` (same shape and dtype as `x`).
pub fn rope(
    dev: &Device,
    x: &Tensor,
    cos: &Tensor,
    sin: &Tensor,
    pos_offset: usize,
    mode: RopeMode,
    y: &mut Tensor,
) -> Result<()> {
    let dtype = check::float_dtype("x", x)?;
    check::on_device(dev, &[("x", x), ("cos", cos), ("sin", sin), ("y", y)])?;
    check::dtype_is("y", y, dtype)?;
    check::shape_is("y", y, x.shape())?;
    check::dtype_is("cos", cos, DType::F32)?;
    check::dtype_is("sin", sin, DType::F32)?;
    let dims = bshd(x)?;
    let [_, seq, _, dim] = dims;
    if dim % 2 != 0 {
        return Err(Error::shape(format!(
            "rope needs an even head dimension, got {dim}"
        )));
    }
    // Past usize, a wrapped sum would pass the length check below and index the tables out
    // of bounds.
    let positions = pos_offset.checked_add(seq).ok_or_else(|| {
        Error::shape(format!(
            "position offset {pos_offset} + sequence length {seq} overflows"
        ))
    })?;
    for (name, t) in [("cos", cos), ("sin", sin)] {
        if t.shape().len() != 2 || t.shape()[1] != dim / 2 || !t.layout().is_contiguous() {
            return Err(Error::shape(format!(
                "`{name}` must be contiguous [positions, {}], got {:?}",
                dim / 2,
                t.shape()
            )));
        }
        if t.shape()[0] < positions {
            return Err(Error::shape(format!(
                "`{name}` has {} positions; positions up to {positions} are needed",
                t.shape()[0],
            )));
        }
    }
    for (name, t) in [("x", x), ("y", &*y)] {
        if dim > 1 && t.strides()[t.strides().len() - 1] != 1 {
            return Err(Error::stride(format!(
                "the last dimension of `{name}` must be contiguous"
            )));
        }
    }
    check::no_overlap(&[("y", y)], &[("x", x), ("cos", cos), ("sin", sin)])?;
    if x.numel() == 0 {
        return Ok(());
    }
    let interleaved = mode == RopeMode::Interleaved;
    let gpu = match dev {
        Device::Cpu(_) => return calico_cpu::rope(x, cos, sin, pos_offset, interleaved, y),
        _ => dev
            .as_gpu()
            .ok_or_else(|| Error::unsupported("device has no kernel launcher"))?,
    };
    let g = RopeGeometry::of(x, cos, sin, y)?;
    let variant = choose(dev.arch(), dtype, mode, &g);
    let ([xs, ys], [xp, yp, cp, sp], table_bytes) = (g.strides, g.addresses, g.table_bytes);
    let esz = dtype.size_bytes();
    let [batch, seq, heads, dim] = dims;
    let (half, pairs, cdna) = (dim / 2, variant.pairs, variant.cdna);
    let span = |s: [usize; 3]| span_bytes(dims, s, esz);
    let work = batch * seq * heads * (half / pairs);
    let threads = 256u32;
    let blocks = work.div_ceil(threads as usize).clamp(1, 1 << 20) as u32;
    let args = [
        KernelArg::Ptr(xp),
        KernelArg::I64(xs[0] as i64),
        KernelArg::I64(xs[1] as i64),
        KernelArg::I64(xs[2] as i64),
        KernelArg::Ptr(yp),
        KernelArg::I64(ys[0] as i64),
        KernelArg::I64(ys[1] as i64),
        KernelArg::I64(ys[2] as i64),
        KernelArg::Ptr(cp),
        KernelArg::Ptr(sp),
        KernelArg::I64(batch as i64),
        KernelArg::I64(seq as i64),
        KernelArg::I64(heads as i64),
        KernelArg::I64(dim as i64),
        KernelArg::I64(pos_offset as i64),
        KernelArg::I64(span(xs) as i64),
        KernelArg::I64(span(ys) as i64),
        KernelArg::I64(table_bytes as i64),
    ];
    // The portable kernel takes the first 15 arguments; the CDNA one also the buffer sizes.
    let args = if cdna { &args[..] } else { &args[..15] };
    gpu.launch_variant(&variant, &LaunchConfig::linear(blocks, threads, 0), args)
}

/// Bytes from the first element of a [B, S, H, D] operand with element strides `s` (batch,
/// position, head; D contiguous) to one past its last, saturating.
fn span_bytes([batch, seq, heads, dim]: [usize; 4], s: [usize; 3], esz: usize) -> usize {
    [(batch, s[0]), (seq, s[1]), (heads, s[2])]
        .iter()
        .fold(dim, |acc, &(n, st)| {
            acc.saturating_add(n.saturating_sub(1).saturating_mul(st))
        })
        .saturating_mul(esz)
}

/// What the rope router sees of a call's tensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RopeGeometry {
    /// [B, S, H, D].
    pub dims: [usize; 4],
    /// Element strides (batch, position, head) of x and y.
    pub strides: [[usize; 3]; 2],
    /// Addresses of x, y, cos and sin (1, misaligned, when unknown).
    pub addresses: [u64; 4],
    /// Bytes of the cos table.
    pub table_bytes: usize,
}

impl RopeGeometry {
    /// The geometry of a call's tensors (the launch's; `ops::plan` tests compare it).
    pub(crate) fn of(x: &Tensor, cos: &Tensor, sin: &Tensor, y: &Tensor) -> Result<Self> {
        let address = |t: &Tensor| t.device_ptr().unwrap_or(1);
        Ok(RopeGeometry {
            dims: bshd(x)?,
            strides: [bshd_strides(x), bshd_strides(y)],
            addresses: [address(x), address(y), address(cos), address(sin)],
            table_bytes: cos.numel().saturating_mul(4),
        })
    }
}

/// The router for a [B, S, H, D] rope over x and y (element strides of batch, position and
/// head) with the addresses of x, y, cos and sin: pairs per thread, x's access width, and the
/// CDNA kernel where it applies (shared by the launch and `ops::plan`).
pub(crate) fn choose(arch: &Arch, dtype: DType, mode: RopeMode, g: &RopeGeometry) -> RopeVariant {
    let (dims, [xs, ys], [xp, yp, cp, sp]) = (g.dims, g.strides, g.addresses);
    let interleaved = mode == RopeMode::Interleaved;
    let dim = dims[3];
    let half = dim / 2;
    let esz = dtype.size_bytes();
    // Pairs per thread: a whole 16-byte vector of x per access where alignment allows.
    let elems_per_vector = gpu::vector_width(
        esz,
        &[xp, yp],
        &[xs[0], xs[1], xs[2], ys[0], ys[1], ys[2]],
        if interleaved { dim } else { half },
    );
    let mut pairs = if interleaved {
        (elems_per_vector / 2).max(1)
    } else {
        elems_per_vector
    };
    // cos/sin rows must allow the same number of f32 at a time (at most 4 per 16 bytes, but
    // wider loads are split, so only alignment to min(16, 4*pairs) bytes matters).
    while pairs > 1
        && (half % pairs != 0
            || !aligned(&[cp, sp], (4 * pairs).min(16) as u64, half * 4)
            || (interleaved && elems_per_vector < 2 * pairs))
    {
        pairs /= 2;
    }
    // Elements of x per access: a whole chunk when aligned, else single elements.
    let x_width = if interleaved {
        (2 * pairs).min(elems_per_vector)
    } else {
        pairs.min(elems_per_vector)
    };
    // CDNA: buffer loads over the whole of x, y, cos and sin, when each spans under 2 GiB and
    // x moves in accesses of at least a dword.
    let cdna = cdna_rows::is_cdna(arch)
        && x_width * esz >= 4
        && [
            span_bytes(dims, xs, esz),
            span_bytes(dims, ys, esz),
            g.table_bytes,
        ]
        .iter()
        .all(|&b| b < MAX_BUFFER_BYTES);
    RopeVariant {
        dtype,
        pairs,
        x_width,
        mode,
        cdna,
    }
}

/// One compiled form of the rope kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct RopeVariant {
    pub dtype: DType,
    pub pairs: usize,
    pub x_width: usize,
    pub mode: RopeMode,
    /// The CDNA kernel (kernels/device/rope/cdna.cu, buffer loads) instead of rope.cu.
    pub cdna: bool,
}

impl KernelVariant for RopeVariant {
    fn source(&self, vendor: HeaderSet) -> Result<KernelSource> {
        if self.cdna {
            cdna_source(vendor, self.dtype, self.pairs, self.x_width, self.mode)
        } else {
            source(vendor, self.dtype, self.pairs, self.x_width, self.mode)
        }
    }
}

/// Bytes one buffer resource of the CDNA kernel may span (offsets stay below 2^31, and the
/// kernel's out-of-range marker is 2^31).
const MAX_BUFFER_BYTES: usize = 1 << 31;

fn aligned(addresses: &[u64], bytes: u64, row_bytes: usize) -> bool {
    addresses.iter().all(|a| a % bytes == 0) && (row_bytes as u64).is_multiple_of(bytes)
}

/// [B, S, H, D] of a rank-3 or rank-4 tensor (B = 1 for rank 3).
fn bshd(t: &Tensor) -> Result<[usize; 4]> {
    match *t.shape() {
        [s, h, d] => Ok([1, s, h, d]),
        [b, s, h, d] => Ok([b, s, h, d]),
        _ => Err(Error::shape(format!(
            "rope takes [S, H, D] or [B, S, H, D], got {:?}",
            t.shape()
        ))),
    }
}

/// Strides of B, S and H (B's stride is irrelevant for rank 3).
fn bshd_strides(t: &Tensor) -> [usize; 3] {
    match *t.strides() {
        [s, h, _] => [0, s, h],
        [b, s, h, _] => [b, s, h],
        _ => [0, 0, 0],
    }
}

fn defines(
    dtype: DType,
    pairs: usize,
    x_width: usize,
    mode: RopeMode,
) -> [(&'static str, String); 4] {
    let half_split = u8::from(mode == RopeMode::HalfSplit);
    [
        ("ELEM", dtype.device_type().to_string()),
        ("P", pairs.to_string()),
        ("XW", x_width.to_string()),
        ("HALF_SPLIT", half_split.to_string()),
    ]
}

/// The CDNA rope kernel (buffer loads); x moves `x_width` elements (4, 8 or 16 bytes) at a time.
pub(crate) fn cdna_source(
    vendor: HeaderSet,
    dtype: DType,
    pairs: usize,
    x_width: usize,
    mode: RopeMode,
) -> Result<KernelSource> {
    gpu::assemble(
        vendor,
        "calico_rope_cdna",
        include_str!("../../device/rope/cdna.cu"),
        &defines(dtype, pairs, x_width, mode),
    )
}

/// The rope kernel for one dtype, pairs per thread and mode.
pub(crate) fn source(
    vendor: HeaderSet,
    dtype: DType,
    pairs: usize,
    x_width: usize,
    mode: RopeMode,
) -> Result<KernelSource> {
    gpu::assemble(
        vendor,
        "calico_rope",
        include_str!("../../device/rope/rope.cu"),
        &defines(dtype, pairs, x_width, mode),
    )
}
