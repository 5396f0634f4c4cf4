//! Odd shapes a few rows or columns past a whole number of tiles (4097 = 16 x 256 + 1): on the
//! padded copies the Hopper kernel spends an extra wave on 1-row and 1-column tiles (4097^3:
//! 561 tiles of 128x256 on 132 SMs, 5 waves instead of 4). With `CALICO_GEMM_ODD=split` the
//! padded problem is cut into the bulk (M and N rounded down to the tile) for the Hopper kernel
//! and the slivers left over (at most 16 rows and 16 columns), which the router sends to the
//! GEMV: the row sliver against B as the weight, the column sliver transposed (D^T = B^T A^T,
//! A as the weight) so that it streams A once over every SM. The slivers run first, while the
//! pad's copies are still partly in L2. The default (`off`) runs the padded problem whole.
//! With `CALICO_PAD_D=on` all parts write the aligned D buffer that is then copied to D.

use super::{hopper, launch_kernel, route, GemmKernel, GemmProblem, MatrixArg};
use calico_core::{Arch, GpuBackend, Result};

/// The widest sliver split off: the GEMV's largest M.
const MAX_SLIVER: usize = super::gemv::MAX_M;

/// True when `CALICO_GEMM_ODD` (read once) names `key`: `split`, `staged` or both; unset (or
/// empty), both are on: the H100 measured split + the padded D 16% faster at 4097^3 and the
/// staged store 11% faster at 1000x999x1000 (docs/perf-log.md, session 8). `off` turns both
/// off (A/B runs).
fn mode_has(key: &str) -> bool {
    static MODE: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let mode = MODE.get_or_init(|| std::env::var("CALICO_GEMM_ODD").unwrap_or_default());
    parse_mode(mode, key)
}

fn parse_mode(text: &str, key: &str) -> bool {
    if text.trim().is_empty() {
        return true;
    }
    text.split([',', ' ', ';'])
        .any(|item| item.trim().eq_ignore_ascii_case(key))
}

/// The bulk and the slivers (on unless `CALICO_GEMM_ODD` leaves `split` out).
pub(super) fn enabled() -> bool {
    mode_has("split")
}

/// 16-bit D rows TMA cannot store (odd widths) take the Hopper kernel's staging boxes, written
/// out by its threads with 16-byte stores on D's own 16-byte boundaries (hopper.cu
/// `store_box_rows`), instead of the register epilogue's element stores (on unless
/// `CALICO_GEMM_ODD` leaves `staged` out). Where A or B is padded anyway, D goes to the
/// aligned buffer instead (padded.rs).
pub(super) fn staged() -> bool {
    mode_has("staged")
}

/// The aligned bulk and the slivers (each with the kernel the router gives it).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Split {
    bulk: GemmProblem,
    rows: Option<(GemmKernel, GemmProblem)>,
    cols: Option<(GemmKernel, GemmProblem)>,
}

fn transposed(x: MatrixArg) -> MatrixArg {
    MatrixArg {
        rows: x.cols,
        cols: x.rows,
        row_stride: x.col_stride,
        col_stride: x.row_stride,
        ..x
    }
}

/// `p` as D^T = B^T A^T (only without a bias: the bias runs along D's columns).
fn transpose_problem(p: &GemmProblem) -> Option<GemmProblem> {
    p.bias.is_none().then(|| GemmProblem {
        m: p.n,
        n: p.m,
        a: transposed(p.b),
        b: transposed(p.a),
        c: p.c.map(transposed),
        d: transposed(p.d),
        ..*p
    })
}

/// A sliver's kernel: any the router picks but the padded path, which would take the
/// workspace this call holds (with `CALICO_PAD_D=on` it asks for an odd-width D: the Hopper
/// kernel stores that from registers instead).
fn routed(arch: &Arch, p: GemmProblem) -> Option<(GemmKernel, GemmProblem)> {
    match route(arch, &p).ok()? {
        GemmKernel::Padded => hopper::tiles(arch, &p).map(|_| (GemmKernel::Hopper, p)),
        kernel => Some((kernel, p)),
    }
}

/// The split of `q` (a problem the Hopper kernel runs as it is: the padded copies), or `None`
/// when it would not save a wave of the Hopper kernel's tiles or a sliver has no kernel.
pub(super) fn split(arch: &Arch, q: &GemmProblem) -> Option<Split> {
    if q.batch > 1 || q.k == 0 {
        return None;
    }
    let (bm, bn, ctas) = hopper::tile_shape(arch, q)?;
    let sliver = |extent: usize, tile: usize| {
        let left = extent % tile;
        if extent > tile && (1..=MAX_SLIVER).contains(&left) {
            left
        } else {
            0
        }
    };
    let (ms, ns) = (sliver(q.m, bm), sliver(q.n, bn));
    if ms == 0 && ns == 0 {
        return None;
    }
    let (mb, nb) = (q.m - ms, q.n - ns);
    let bulk = q.part(0, mb, 0, nb)?;
    let waves = |tiles: usize| tiles.div_ceil(ctas);
    if waves(hopper::tiles(arch, &bulk)?) >= waves(hopper::tiles(arch, q)?) {
        return None;
    }
    let rows = match ms {
        0 => None,
        _ => Some(routed(arch, q.part(mb, ms, 0, q.n)?)?),
    };
    let cols = match ns {
        0 => None,
        _ => {
            let p = q.part(0, mb, nb, ns)?;
            let gemv = transpose_problem(&p)
                .and_then(|t| routed(arch, t))
                .filter(|(kernel, _)| *kernel == GemmKernel::Gemv);
            Some(gemv.or_else(|| routed(arch, p))?)
        }
    };
    Some(Split { bulk, rows, cols })
}

/// Queues the slivers, then the bulk on the Hopper kernel; `padded_d`: D is the padded path's
/// aligned buffer, which the bulk may write past its last column (TMA stores).
pub(super) fn launch(gpu: &dyn GpuBackend, s: &Split, padded_d: bool) -> Result<()> {
    // The padded path holds the device's workspace while this runs: nothing here may take it
    // again (the Hopper kernel's split-K form would wait on it forever).
    for (kernel, p) in s.rows.iter().chain(s.cols.iter()) {
        match kernel {
            GemmKernel::Hopper => hopper::launch_unsplit(gpu, p)?,
            _ => launch_kernel(gpu, *kernel, p)?,
        }
    }
    if padded_d {
        hopper::launch_into_padded_d(gpu, &s.bulk)
    } else {
        hopper::launch_unsplit(gpu, &s.bulk)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gemm::portable::tests::{h100, problem};

    /// `m x n x k` with the operands as the padded path leaves them (rows of `k` rounded up to
    /// 64 elements, B as an N x K weight) and D with its odd rows.
    fn padded(m: usize, n: usize, k: usize) -> GemmProblem {
        let mut q = problem(m, n, k, true);
        let rs = k.div_ceil(64) * 64;
        q.a.row_stride = rs;
        q.b.col_stride = rs;
        q
    }

    #[test]
    fn the_mode_is_opt_in() {
        assert!(parse_mode("split", "split"));
        assert!(parse_mode(" Split ,x", "split"));
        assert!(parse_mode("split,staged", "staged"));
        assert!(!parse_mode("split", "staged"));
        assert!(parse_mode("", "split") && parse_mode(" ", "staged"));
        assert!(!parse_mode("off", "split"));
    }

    #[test]
    fn one_past_a_tile_splits_into_bulk_and_two_gemv_slivers() {
        let q = padded(4097, 4097, 4097);
        let s = split(&h100(), &q).expect("split");
        assert_eq!((s.bulk.m, s.bulk.n, s.bulk.k), (4096, 4096, 4097));
        assert_eq!(hopper::tiles(&h100(), &s.bulk), Some(512));
        let (kernel, rows) = s.rows.unwrap();
        assert_eq!(kernel, GemmKernel::Gemv);
        assert_eq!((rows.m, rows.n), (1, 4097));
        assert_eq!(rows.a.ptr, q.a.ptr + 4096 * 4160 * 2);
        assert_eq!(rows.b, q.b);
        assert_eq!(rows.d.ptr, q.d.ptr + 4096 * 4097 * 2);
        // The column sliver transposed: B's last row is the activation, A the weight.
        let (kernel, cols) = s.cols.unwrap();
        assert_eq!(kernel, GemmKernel::Gemv);
        assert_eq!((cols.m, cols.n, cols.k), (1, 4096, 4097));
        assert_eq!(cols.a.ptr, q.b.ptr + 4096 * 4160 * 2);
        assert_eq!((cols.a.row_stride, cols.a.col_stride), (4160, 1));
        assert_eq!((cols.b.row_stride, cols.b.col_stride), (1, 4160));
        assert_eq!(cols.b.ptr, q.a.ptr);
        assert_eq!(cols.d.ptr, q.d.ptr + 4096 * 2);
        assert_eq!((cols.d.row_stride, cols.d.col_stride), (1, 4097));
    }

    #[test]
    fn a_bias_keeps_the_column_sliver_untransposed() {
        let mut q = padded(4097, 4097, 4097);
        q.bias = Some(5 << 20);
        let s = split(&h100(), &q).expect("split");
        let (kernel, cols) = s.cols.unwrap();
        assert_ne!(kernel, GemmKernel::Padded);
        assert_eq!((cols.m, cols.n), (4096, 1));
        assert_eq!(cols.bias, Some((5 << 20) + 4096 * 2));
        assert_eq!(s.rows.unwrap().1.bias, Some(5 << 20));
    }

    #[test]
    fn c_follows_d() {
        let mut q = padded(4100, 2050, 1001);
        let mut c = q.d;
        c.ptr = 7 << 20;
        q.c = Some(c);
        q.beta = 1.0;
        let s = split(&h100(), &q).expect("split");
        assert_eq!((s.bulk.m, s.bulk.n), (4096, 2048));
        let (_, rows) = s.rows.unwrap();
        assert_eq!(rows.c.unwrap().ptr, (7 << 20) + 4096 * 2050 * 2);
        let (kernel, cols) = s.cols.unwrap();
        assert_eq!(kernel, GemmKernel::Gemv);
        assert_eq!(cols.m, 2);
        let c = cols.c.unwrap();
        assert_eq!(c.ptr, (7 << 20) + 2048 * 2);
        assert_eq!((c.row_stride, c.col_stride), (1, 2050));
    }

    #[test]
    fn no_split_without_a_saved_wave() {
        for (m, n, k) in [
            (4096, 4096, 4095),
            (8191, 8191, 8191),
            (1000, 999, 1000),
            (300, 513, 4097),
        ] {
            assert!(split(&h100(), &padded(m, n, k)).is_none(), "{m}x{n}x{k}");
        }
        let mut batched = padded(4097, 4097, 4097);
        batched.batch = 2;
        assert!(split(&h100(), &batched).is_none());
    }
}
