//! Tile-level conformance of the CUDA tile vocabulary (`backend-cuda/device/calico/*.cuh`).
//!
//! Each primitive has a small test kernel in `conformance/device/tiles/*.cu`, written with the
//! tile vocabulary (global -> shared -> registers, one primitive, back out). Two kinds of test:
//!
//! - `compile_*` (CPU only, run in CI): every kernel file compiles with NVRTC for sm_80 and
//!   sm_90a (TMA and wgmma: sm_90a only) and each entry's SASS holds the instructions it exists
//!   for (HMMA, LDSM, LDGSTS, UTMALDG/UTMASTG, HGMMA, ...). Without NVRTC they print
//!   "skipped: nvrtc not found" (and fail under CI=true).
//! - the others launch the kernels on a CUDA device (random inputs, random tile counts and
//!   edge sizes that are not multiples of a tile) and compare with a host reference, including
//!   that nothing outside an output matrix was written. Without a device they print
//!   "skipped backend cuda: <reason>".
//!
//! The fragment dumps compare registers lane by lane with `calico_core::lanes`, proving the
//! Rust mirror of the fragment layouts matches the hardware (ldmatrix, mma.sync and wgmma
//! write their own layouts; the software loads must agree with them).
//!
//! The families here are CUDA's own (their kernels use the CUDA extras: mma.sync fragments by
//! register, ldmatrix, cp.async, TMA, wgmma). The vendor-neutral part of the suite, kernels
//! written only against the shared vocabulary and run on CUDA and HIP alike, is `vocab`
//! (tiles/vocab.rs).

use calico::{AsyncCopy, BackendKind, DType, Device, KernelSource, MmaKind};
use calico_conformance::compare::{check_close, check_exact, elementwise_tol};
use calico_conformance::rng::Rng;
use calico_conformance::runner::config;
use calico_conformance::tensors::{round, SENTINEL};
use calico_core::lanes::{MmaInstr, Operand};
use calico_core::{KernelArg, LaunchConfig, Storage};
use calico_cuda::tma::Swizzle;
use proptest::prelude::*;
use proptest::test_runner::{TestCaseError, TestRunner};
use std::io::Write;
use std::sync::{Arc, OnceLock};

/// The vendor-neutral tile tests (both GPU backends, one kernel source).
#[path = "tiles/vocab.rs"]
mod vocab;

// ---------------------------------------------------------------------------------------------
// Kernel files

/// One test-kernel file: its text, the entries it defines, and the SASS each entry must hold.
struct Family {
    name: &'static str,
    text: &'static str,
    /// Compiled for sm_80 too (false: sm_90a only).
    sm80: bool,
    /// Compiled for sm_100a too (Blackwell keeps TMA and cp.async; it has no wgmma).
    sm100a: bool,
    /// Every `extern "C"` entry of the file.
    entries: &'static [&'static str],
    /// (entry name fragment, opcode prefix): entries whose name contains the fragment must hold
    /// at least one instruction starting with the prefix, on every target.
    sass: &'static [(&'static str, &'static str)],
}

const FRAGMENTS: Family = Family {
    name: "fragments",
    text: include_str!("../device/tiles/fragments.cu"),
    sm80: true,
    sm100a: false,
    entries: &[
        "tiles_fragments_f32_row_m0",
        "tiles_fragments_f32_col_m0",
        "tiles_fragments_bf16_row_m0",
        "tiles_fragments_bf16_col_m0",
        "tiles_fragments_bf16_row_m1",
        "tiles_fragments_bf16_col_m1",
        "tiles_fragments_f16_row_m1",
        "tiles_fragments_f16_col_m1",
        "tiles_fragments_bf16_acc_m2",
        "tiles_fragments_f16_acc_m2",
    ],
    sass: &[
        ("_m1", "LDGSTS"),
        ("_row_m1", "LDSM.16.M88"),
        ("_col_m1", "LDSM.16.MT88"),
        ("_m2", "HMMA.16816.F32"),
    ],
};

const ROUNDTRIP: Family = Family {
    name: "roundtrip",
    text: include_str!("../device/tiles/roundtrip.cu"),
    sm80: true,
    sm100a: false,
    entries: &[
        "tiles_roundtrip_bf16_row_32x64",
        "tiles_roundtrip_bf16_col_32x64",
        "tiles_roundtrip_f16_row_16x32",
        "tiles_roundtrip_f16_col_32x16",
    ],
    sass: &[
        ("", "LDGSTS"),
        ("_row_", "LDSM.16.M88"),
        ("_col_", "LDSM.16.MT88"),
    ],
};

const CP_ASYNC: Family = Family {
    name: "cp_async",
    text: include_str!("../device/tiles/cp_async.cu"),
    sm80: true,
    sm100a: false,
    entries: &[
        "tiles_cp_async_bf16_32x64",
        "tiles_cp_async_f16_16x32",
        "tiles_cp_async_bf16_64x16",
        "tiles_cp_async_f32_16x32",
    ],
    sass: &[("", "LDGSTS")],
};

const TMA: Family = Family {
    name: "tma",
    text: include_str!("../device/tiles/tma.cu"),
    sm80: false,
    sm100a: true,
    entries: &[
        "tiles_tma_2d_bf16_32x64",
        "tiles_tma_2d_f16_16x32",
        "tiles_tma_2d_bf16_64x16",
        "tiles_tma_2d_f32_8x32",
        "tiles_tma_3d_bf16_16x128",
    ],
    sass: &[
        ("_2d_", "UTMALDG.2D"),
        ("_2d_", "UTMASTG.2D"),
        ("_3d_", "UTMALDG.3D"),
        ("_3d_", "UTMASTG.3D"),
        ("", "SYNCS.ARRIVE.TRANS64"),
    ],
};

const WGMMA: Family = Family {
    name: "wgmma",
    text: include_str!("../device/tiles/wgmma.cu"),
    sm80: false,
    sm100a: false,
    entries: &[
        "tiles_wgmma_bf16_n64_kmajor",
        "tiles_wgmma_bf16_n128_nmajor",
        "tiles_wgmma_f16_n32_kmajor",
    ],
    sass: &[
        ("_n64_", "HGMMA.64x64x16.F32.BF16"),
        ("_n128_", "HGMMA.64x128x16.F32.BF16"),
        ("_n32_", "HGMMA.64x32x16.F32"),
        ("", "WARPGROUP.ARRIVE"),
    ],
};

impl Family {
    fn source(&self, entry: &str) -> KernelSource {
        assert!(
            self.entries.contains(&entry),
            "{entry} is not an entry of {}",
            self.name
        );
        KernelSource::assemble(
            entry,
            self.text,
            &[calico_cuda::device_headers(), calico_core::device_headers()],
            &[],
        )
        .unwrap_or_else(|e| panic!("assembling {}: {e}", self.name))
    }

    fn targets(&self) -> &'static [&'static str] {
        match (self.sm80, self.sm100a) {
            (true, true) => &["sm_80", "sm_90a", "sm_100a"],
            (true, false) => &["sm_80", "sm_90a"],
            (false, true) => &["sm_90a", "sm_100a"],
            (false, false) => &["sm_90a"],
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Compile checks (no GPU)

fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

fn nvrtc_available() -> Result<(), String> {
    calico_cuda::probe::require_nvrtc().map_err(|e| format!("nvrtc not found ({e})"))?;
    if calico_cuda::nvrtc::include_dirs().is_empty() {
        return Err("nvrtc not found: CUDA headers missing (set CUDA_HOME)".into());
    }
    Ok(())
}

/// The SASS of one function of a `cuobjdump -sass` listing.
fn function_sass<'a>(sass: &'a str, entry: &str) -> Option<&'a str> {
    let header = format!("Function : {entry}");
    let start = sass.lines().position(|l| l.trim() == header)?;
    let body: Vec<&str> = sass.lines().skip(start + 1).collect();
    let end = body
        .iter()
        .position(|l| l.trim_start().starts_with("Function : "))
        .unwrap_or(body.len());
    // Slices of the listing, re-joined lazily: find the byte range instead of allocating.
    let first = body.first()?;
    let from = first.as_ptr() as usize - sass.as_ptr() as usize;
    let to = if end < body.len() {
        body[end].as_ptr() as usize - sass.as_ptr() as usize
    } else {
        sass.len()
    };
    Some(&sass[from..to])
}

fn compile_check(f: &Family) {
    if let Err(why) = nvrtc_available() {
        assert!(!in_ci(), "{}: toolchain missing in CI: {why}", f.name);
        println!("skipped: {why}");
        return;
    }
    // One compile per target covers every entry of the file.
    let src = f.source(f.entries[0]);
    for &target in f.targets() {
        let cubin = calico_cuda::nvrtc::compile(&src, target)
            .unwrap_or_else(|e| panic!("{} for {target}: {e}", f.name));
        let sass = match calico_cuda::disasm::sass(&cubin) {
            Ok(s) => s,
            Err(e) => {
                assert!(!in_ci(), "{}: cuobjdump missing in CI: {e}", f.name);
                println!("skipped SASS checks of {} for {target}: {e}", f.name);
                continue;
            }
        };
        let functions = sass
            .lines()
            .filter(|l| l.trim_start().starts_with("Function : "))
            .count();
        assert_eq!(
            functions,
            f.entries.len(),
            "{target}: {} defines {functions} kernels, the test lists {}",
            f.name,
            f.entries.len()
        );
        for entry in f.entries {
            let body = function_sass(&sass, entry)
                .unwrap_or_else(|| panic!("{target}: no function {entry} in the cubin"));
            for (pattern, opcode) in f.sass {
                if entry.contains(pattern) {
                    let n = calico_cuda::disasm::count_opcode(body, opcode);
                    assert!(n > 0, "{target}: {entry} has no {opcode} instruction");
                }
            }
        }
        println!(
            "{} for {target}: {} entries compiled, SASS checked",
            f.name,
            f.entries.len()
        );
    }
}

#[test]
fn compile_fragments() {
    compile_check(&FRAGMENTS);
}
#[test]
fn compile_roundtrip() {
    compile_check(&ROUNDTRIP);
}
#[test]
fn compile_cp_async() {
    compile_check(&CP_ASYNC);
}
#[test]
fn compile_tma() {
    compile_check(&TMA);
}
#[test]
fn compile_wgmma() {
    compile_check(&WGMMA);
}

#[test]
fn function_sass_splits_a_listing() {
    let s = "\t\tFunction : k_ab\n  /*0000*/ HMMA.16816.F32 R0 ;\n\t\tFunction : k_abt\n  /*0000*/ MOV R1 ;\n";
    assert_eq!(
        calico_cuda::disasm::count_opcode(function_sass(s, "k_ab").unwrap(), "HMMA"),
        1
    );
    assert_eq!(
        calico_cuda::disasm::count_opcode(function_sass(s, "k_abt").unwrap(), "HMMA"),
        0
    );
    assert!(function_sass(s, "k_a").is_none());
}

// ---------------------------------------------------------------------------------------------
// Device, buffers, launches

/// The CUDA device, opened once per test binary; `None` (after saying why) when there is none.
fn cuda(test: &str) -> Option<&'static Device> {
    static DEV: OnceLock<Result<Device, String>> = OnceLock::new();
    let dev = DEV.get_or_init(|| Device::open(BackendKind::Cuda, 0).map_err(|e| e.to_string()));
    match dev {
        Ok(d) => Some(d),
        Err(e) => {
            // Straight to stderr: the harness captures eprintln!, and a skip must be visible.
            let _ = writeln!(
                std::io::stderr().lock(),
                "[{test}] skipped backend cuda: {e}"
            );
            None
        }
    }
}

/// A device buffer of `dtype` elements (I32 words are read with `read_i32`).
struct Buf {
    storage: Arc<dyn Storage>,
    dtype: DType,
    len: usize,
}

fn encode(dtype: DType, values: &[f64]) -> Vec<u8> {
    let mut out = Vec::with_capacity(values.len() * dtype.size_bytes());
    for &v in values {
        match dtype {
            DType::BF16 => out.extend(half::bf16::from_f64(v).to_bits().to_le_bytes()),
            DType::F16 => out.extend(half::f16::from_f64(v).to_bits().to_le_bytes()),
            DType::F32 => out.extend((v as f32).to_le_bytes()),
            other => panic!("encode: {other}"),
        }
    }
    out
}

impl Buf {
    fn upload(dev: &Device, dtype: DType, values: &[f64]) -> Result<Buf, String> {
        let bytes = encode(dtype, values);
        let storage = dev
            .alloc(bytes.len().max(16))
            .map_err(|e| format!("alloc: {e}"))?;
        storage
            .write_bytes(0, &bytes)
            .map_err(|e| format!("upload: {e}"))?;
        Ok(Buf {
            storage,
            dtype,
            len: values.len(),
        })
    }

    fn filled(dev: &Device, dtype: DType, len: usize, value: f64) -> Result<Buf, String> {
        Buf::upload(dev, dtype, &vec![value; len])
    }

    /// `len` i32 words, zeroed.
    fn ints(dev: &Device, len: usize) -> Result<Buf, String> {
        let storage = dev.alloc(len * 4).map_err(|e| format!("alloc: {e}"))?;
        Ok(Buf {
            storage,
            dtype: DType::F32,
            len,
        })
    }

    fn addr(&self) -> u64 {
        self.storage.device_address().expect("a GPU buffer")
    }

    fn arg(&self) -> KernelArg {
        KernelArg::Ptr(self.addr())
    }

    fn bytes(&self) -> Result<Vec<u8>, String> {
        let mut bytes = vec![0u8; self.len * self.dtype.size_bytes()];
        self.storage
            .read_bytes(0, &mut bytes)
            .map_err(|e| format!("download: {e}"))?;
        Ok(bytes)
    }

    fn read(&self) -> Result<Vec<f64>, String> {
        let bytes = self.bytes()?;
        Ok((0..self.len)
            .map(|i| calico_core::dtype::read_f32(self.dtype, &bytes, i) as f64)
            .collect())
    }

    fn read_i32(&self) -> Result<Vec<i32>, String> {
        Ok(self
            .bytes()?
            .chunks_exact(4)
            .map(|w| i32::from_le_bytes(w.try_into().expect("4 bytes")))
            .collect())
    }
}

/// Launches `entry` of `f` and waits for it. Refuses configurations that cannot be right
/// rather than handing them to the driver.
fn launch(
    dev: &Device,
    f: &Family,
    entry: &str,
    grid: (u32, u32, u32),
    threads: u32,
    args: &[KernelArg],
) -> Result<(), String> {
    let ok = grid.0 >= 1
        && grid.1 >= 1
        && grid.2 >= 1
        && grid.0 <= 1024
        && grid.1 <= 1024
        && grid.2 <= 64
        && threads.is_multiple_of(32)
        && (32..=1024).contains(&threads);
    if !ok {
        return Err(format!(
            "{entry}: bad launch grid {grid:?} x {threads} (test bug)"
        ));
    }
    let gpu = dev.as_gpu().ok_or("the CUDA device has no GPU interface")?;
    let cfg = LaunchConfig {
        grid,
        block: (threads, 1, 1),
        shared_mem_bytes: 0,
    };
    gpu.launch(&f.source(entry), &cfg, args)
        .map_err(|e| format!("launching {entry}: {e}"))?;
    dev.synchronize()
        .map_err(|e| format!("running {entry}: {e}"))
}

fn run_property<S: Strategy>(
    test: &str,
    default_cases: u32,
    strategy: S,
    case: impl Fn(&S::Value) -> Result<(), String>,
) {
    let mut runner = TestRunner::new(config(default_cases));
    if let Err(e) = runner.run(&strategy, |v| case(&v).map_err(TestCaseError::fail)) {
        panic!("{test} on backend cuda: {e}");
    }
}

fn dtype_of(entry: &str) -> DType {
    if entry.contains("_bf16_") {
        DType::BF16
    } else if entry.contains("_f16_") {
        DType::F16
    } else {
        DType::F32
    }
}

/// `R x C` from an entry name ending in `_<R>x<C>` (or `_<M>x<N>x<K>`).
fn dims_of(entry: &str) -> Vec<usize> {
    entry
        .rsplit('_')
        .next()
        .unwrap()
        .split('x')
        .map(|d| d.parse().expect("entry ends in a tile shape"))
        .collect()
}

fn div_up(a: usize, b: usize) -> usize {
    a.div_ceil(b)
}

/// A (batch of) row-major matrices inside a larger buffer: the rest is poisoned.
#[derive(Debug, Clone, Copy)]
struct Mat {
    rows: usize,
    cols: usize,
    stride: usize,
    batch: usize,
    batch_stride: usize,
    /// Buffer length: the batches plus a guard region after them.
    len: usize,
}

impl Mat {
    /// `pad` extra elements per row, `gap` between batches, `guard` after the last.
    fn new(rows: usize, cols: usize, batch: usize, pad: usize, gap: usize, guard: usize) -> Mat {
        let stride = cols + pad;
        let batch_stride = rows * stride + gap;
        Mat {
            rows,
            cols,
            stride,
            batch,
            batch_stride,
            len: batch * batch_stride + guard,
        }
    }

    fn at(&self, b: usize, r: usize, c: usize) -> usize {
        b * self.batch_stride + r * self.stride + c
    }

    /// Whether buffer index `i` is an element of the matrix.
    fn inside(&self, i: usize) -> bool {
        let b = i / self.batch_stride;
        let rem = i % self.batch_stride;
        b < self.batch && rem / self.stride < self.rows && rem % self.stride < self.cols
    }

    /// A buffer holding `f(b, r, c)` in the matrix and `outside` elsewhere.
    fn fill(&self, outside: f64, mut f: impl FnMut(usize, usize, usize) -> f64) -> Vec<f64> {
        let mut v = vec![outside; self.len];
        for b in 0..self.batch {
            for r in 0..self.rows {
                for c in 0..self.cols {
                    v[self.at(b, r, c)] = f(b, r, c);
                }
            }
        }
        v
    }

    /// The matrix elements of a buffer, in order.
    fn gather(&self, buf: &[f64]) -> Vec<f64> {
        (0..self.batch)
            .flat_map(|b| self.gather_batch(buf, b))
            .collect()
    }

    /// The elements of batch entry `b` of a buffer, in order.
    fn gather_batch(&self, buf: &[f64], b: usize) -> Vec<f64> {
        (0..self.rows * self.cols)
            .map(|i| buf[self.at(b, i / self.cols, i % self.cols)])
            .collect()
    }

    /// Every buffer element outside the matrix still holds the sentinel.
    fn untouched(&self, what: &str, dtype: DType, buf: &[f64]) -> Result<(), String> {
        let poison = round(dtype, SENTINEL);
        match (0..self.len).find(|&i| !self.inside(i) && buf[i] != poison) {
            Some(i) => Err(format!(
                "`{what}`: element {i} outside the matrix ({self:?}) was written: {}",
                buf[i]
            )),
            None => Ok(()),
        }
    }
}

impl Mat {
    /// `untouched`, except that the row tails `cols..tail_end` of the rows `(b, r)` for which
    /// `tail` holds may also hold `tail_value` (a store that writes whole chunks of a row).
    /// Returns how many tail elements were written and how many there are.
    fn untouched_but_tails(
        &self,
        what: &str,
        dtype: DType,
        buf: &[f64],
        tail_end: usize,
        tail_value: f64,
        tail: impl Fn(usize, usize) -> bool,
    ) -> Result<(usize, usize), String> {
        let poison = round(dtype, SENTINEL);
        let (mut written, mut len) = (0, 0);
        for (i, &v) in buf.iter().enumerate().take(self.len) {
            if self.inside(i) {
                continue;
            }
            let (b, rem) = (i / self.batch_stride, i % self.batch_stride);
            let (r, c) = (rem / self.stride, rem % self.stride);
            let in_tail =
                b < self.batch && r < self.rows && (self.cols..tail_end).contains(&c) && tail(b, r);
            len += usize::from(in_tail);
            if v == poison {
                continue;
            }
            if !(in_tail && v == tail_value) {
                return Err(format!(
                    "`{what}`: element {i} (batch {b}, row {r}, column {c}) outside the matrix \
                     ({self:?}) was written: {v}{}",
                    if in_tail {
                        format!(
                            " (a row's tail up to column {tail_end} may only receive {tail_value})"
                        )
                    } else {
                        String::new()
                    }
                ));
            }
            written += 1;
        }
        Ok((written, len))
    }
}

#[test]
fn whole_chunk_store_tails_are_told_from_stray_writes() {
    // bf16, 9 columns in rows of 24: a store writing whole 16-byte chunks also writes
    // columns 9..16 of the rows it stores (here all but row 1 of batch 1).
    let m = Mat::new(3, 9, 2, 7 + 8, 8, 32);
    let poison = round(DType::BF16, SENTINEL);
    let stored = |b: usize, r: usize| !(b == 1 && r == 1);
    let mut buf = m.fill(poison, |b, r, c| (100 * b + 10 * r + c) as f64);
    let check = |buf: &[f64]| m.untouched_but_tails("t", DType::BF16, buf, 16, 0.0, stored);
    assert_eq!(check(&buf), Ok((0, 5 * 7)));
    for b in 0..2 {
        for r in 0..3 {
            for c in 9..16 {
                if stored(b, r) {
                    buf[m.at(b, r, c)] = 0.0;
                }
            }
        }
    }
    assert_eq!(check(&buf), Ok((5 * 7, 5 * 7)));
    // Past the chunk, in a refused row, another value, past the last row: all stray writes.
    for (b, r, c, v) in [
        (0, 0, 16, 0.0),
        (1, 1, 9, 0.0),
        (0, 2, 15, 1.0),
        (1, 2, 23, 0.0),
    ] {
        let mut bad = buf.clone();
        bad[m.at(b, r, c)] = v;
        assert!(check(&bad).is_err(), "({b}, {r}, {c}) = {v} went unnoticed");
    }
    let mut bad = buf.clone();
    bad[m.at(0, 3, 0)] = 0.0;
    assert!(
        check(&bad).is_err(),
        "a write past the last row went unnoticed"
    );
    let mut bad = buf;
    bad[m.len - 1] = 0.0;
    assert!(check(&bad).is_err(), "a write in the guard went unnoticed");
}

/// `n` random values rounded to `dtype`.
fn random_values(rng: &mut Rng, dtype: DType, n: usize, scale: f64) -> Vec<f64> {
    (0..n)
        .map(|_| round(dtype, scale * rng.uniform(-1.0, 1.0)))
        .collect()
}

/// A row count of 1..=`tiles` tiles of `r`, not always a multiple of `r`.
fn extent(tiles: usize, rem: usize, r: usize) -> usize {
    (tiles - 1) * r + 1 + rem % r
}

// ---------------------------------------------------------------------------------------------
// Fragment dumps: the hardware's layouts against calico_core::lanes

/// What a fragment dump holds: dump value = 16 * row + col of the element it came from.
fn expected_dump(entry: &str) -> Vec<(usize, f64)> {
    let instr = MmaInstr::MmaSyncM16N8K16;
    let mut want = Vec::new();
    let value = |r: usize, c: usize| (16 * r + c) as f64;
    let acc = |want: &mut Vec<(usize, f64)>| {
        // Accumulator tile: 8-column half h is registers {2h, 2h + 1} (= c0c1, c2c3).
        let f = instr.fragment(Operand::Acc).unwrap();
        for lane in 0..32 {
            for h in 0..2 {
                for e in 0..4 {
                    let (r, c) = f.coord(lane, e).unwrap();
                    let (reg, p) = (2 * h + e / 2, e % 2);
                    want.push((lane * 8 + 2 * reg + p, value(r, c + 8 * h)));
                }
            }
        }
    };
    if entry.contains("_acc_") {
        acc(&mut want);
    } else if entry.contains("_row_") {
        // row_l: the A fragment, element e = register e / 2, half e % 2.
        let f = instr.fragment(Operand::A).unwrap();
        for lane in 0..32 {
            for e in 0..8 {
                let (r, c) = f.coord(lane, e).unwrap();
                want.push((lane * 8 + e, value(r, c)));
            }
        }
        if dtype_of(entry) == DType::F32 {
            // A float row_l tile is also the accumulator layout.
            acc(&mut want);
        }
    } else {
        // col_l: the B fragment (16 x 8) of 8-column half h is registers {h, h + 2}.
        let f = instr.fragment(Operand::B).unwrap();
        for lane in 0..32 {
            for h in 0..2 {
                for e in 0..4 {
                    let (k, n) = f.coord(lane, e).unwrap();
                    let (reg, p) = (h + 2 * (e / 2), e % 2);
                    want.push((lane * 8 + 2 * reg + p, value(k, n + 8 * h)));
                }
            }
        }
    }
    want
}

/// The expectations above, derived from the lane maps, agree with tile.cuh's own statement of
/// the layouts (`base_coord`: reg k of lane (g, t) starts at (g + 8 (k & 1), 2t + 8 (k >> 1)),
/// transposed for col_l; pairs run along rows for row_l, down columns for col_l). On the GPU
/// the dumps then tie the hardware, the Rust lane maps and tile.cuh together.
#[test]
fn expected_dumps_agree_with_tile_cuh_layout() {
    for entry in FRAGMENTS.entries {
        let col = entry.contains("_col_");
        let mut from_tile_cuh = vec![f64::NAN; 256];
        for lane in 0..32 {
            let (g, t) = (lane / 4, lane % 4);
            for reg in 0..4 {
                let (r, c) = (g + 8 * (reg & 1), 2 * t + 8 * (reg >> 1));
                let (r, c) = if col { (c, r) } else { (r, c) };
                for p in 0..2 {
                    let (rp, cp) = if col { (r + p, c) } else { (r, c + p) };
                    from_tile_cuh[lane * 8 + 2 * reg + p] = (16 * rp + cp) as f64;
                }
            }
        }
        let want = expected_dump(entry);
        let mut covered = [false; 256];
        for (i, v) in want {
            assert_eq!(v, from_tile_cuh[i], "{entry}: dump slot {i}");
            covered[i] = true;
        }
        assert!(covered.iter().all(|&c| c), "{entry}: every slot is checked");
    }
}

#[test]
fn fragments_match_lane_maps() {
    let Some(dev) = cuda("fragments_match_lane_maps") else {
        return;
    };
    for entry in FRAGMENTS.entries {
        let dtype = dtype_of(entry);
        let src: Vec<f64> = (0..256).map(|i| i as f64).collect();
        let run = || -> Result<(), String> {
            let x = Buf::upload(dev, dtype, &src)?;
            let out = Buf::filled(dev, DType::F32, 256, f64::NAN)?;
            launch(dev, &FRAGMENTS, entry, (1, 1, 1), 32, &[x.arg(), out.arg()])?;
            let got = out.read()?;
            for (i, want) in expected_dump(entry) {
                if got[i] != want {
                    let (lane, reg, half) = (i / 8, (i % 8) / 2, i % 2);
                    return Err(format!(
                        "lane {lane} register {reg} half {half}: holds element ({}, {}), \
                         the lane map says ({}, {})",
                        got[i] as i64 / 16,
                        got[i] as i64 % 16,
                        want as i64 / 16,
                        want as i64 % 16
                    ));
                }
            }
            Ok(())
        };
        if let Err(e) = run() {
            panic!("{entry} on backend cuda: {e}");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Register-tile round trips through cp.async (the vendor-neutral paths: vocab.rs)

#[test]
fn cp_async_register_tile_round_trips() {
    let Some(dev) = cuda("cp_async_register_tile_round_trips") else {
        return;
    };
    let strategy = (
        0..ROUNDTRIP.entries.len(),
        (1usize..=3, 0usize..64),
        (1usize..=3, 0usize..64),
        1usize..=2,
        0usize..=2,
        any::<u64>(),
    );
    run_property(
        "cp_async_register_tile_round_trips",
        16,
        strategy,
        |&(v, (tr, rr), (tc, rc), batch, pad, seed)| {
            let entry = ROUNDTRIP.entries[v];
            let dtype = dtype_of(entry);
            let shape = dims_of(entry);
            let (r, c) = (shape[0], shape[1]);
            let rows = extent(tr, rr, r);
            // load_async moves 16-byte pieces: whole pieces per row.
            let cols = div_up(extent(tc, rc, c), 8) * 8;
            // cp.async rows must start 16-byte aligned: pads of whole pieces there.
            let pad = 8 * pad;
            let mut rng = Rng::new(seed);
            let src_m = Mat::new(rows, cols, batch, pad, 8 * pad, 0);
            let dst_m = Mat::new(rows, cols, batch, pad + 1, 5, 37);
            let values = src_m.fill(777.0, |_, _, _| round(dtype, 4.0 * rng.normal()));
            let src = Buf::upload(dev, dtype, &values)?;
            let dst = Buf::filled(dev, dtype, dst_m.len, SENTINEL)?;
            let grid = (div_up(cols, c) as u32, div_up(rows, r) as u32, batch as u32);
            let args = [
                src.arg(),
                dst.arg(),
                KernelArg::I32(rows as i32),
                KernelArg::I32(cols as i32),
                KernelArg::I64(src_m.stride as i64),
                KernelArg::I64(src_m.batch_stride as i64),
                KernelArg::I64(dst_m.stride as i64),
                KernelArg::I64(dst_m.batch_stride as i64),
            ];
            launch(dev, &ROUNDTRIP, entry, grid, 32, &args)?;
            let got = dst.read()?;
            check_exact(entry, &dst_m.gather(&got), &src_m.gather(&values))?;
            dst_m.untouched(entry, dtype, &got)
        },
    );
}

// ---------------------------------------------------------------------------------------------
// Comparisons and conversions (also used by the vocabulary tests, vocab.rs)

/// |got - want| <= bound; false for NaN.
fn within(got: f64, want: f64, bound: f64) -> bool {
    (got - want).abs() <= bound
}

/// A broadcast output: name, the operation, and whether its vector runs along rows.
type Broadcast = (&'static str, fn(f64, f64) -> f64, bool);

/// What the device makes of `v` converted to `dtype`: the f32 it holds (`v` as uploaded or
/// passed), rounded to `dtype` to nearest even (`__float2bfloat16_rn`, `__floats2half2_rn`: the
/// `cvt.rn` of `pack` and `from_float`). Not `round(dtype, v)`: half's `bf16::from_f64` (and the
/// fallback of `f16::from_f64`) looks only at the upper 32 bits of the f64 for the sticky bit,
/// so an f32 just above a halfway point whose remaining bits sit in the lower word (mantissa
/// bits 21..23) is taken for a tie and rounded down to even, one ulp below the device.
fn from_f32(dtype: DType, v: f64) -> f64 {
    let f = v as f32;
    match dtype {
        DType::BF16 => half::bf16::from_f32(f).to_f64(),
        DType::F16 => half::f16::from_f32(f).to_f64(),
        DType::F32 => f as f64,
        other => panic!("from_f32: {other} is not a standard float"),
    }
}

#[test]
fn conversions_round_the_f32_to_nearest_even() {
    // 5.203125 is halfway between the bf16 neighbours 5.1875 (even) and 5.21875.
    let tie = 5.203125f32;
    let above = f32::from_bits(tie.to_bits() + 1);
    let below = f32::from_bits(tie.to_bits() - 1);
    assert_eq!(from_f32(DType::BF16, tie as f64), 5.1875);
    assert_eq!(from_f32(DType::BF16, above as f64), 5.21875);
    assert_eq!(from_f32(DType::BF16, below as f64), 5.1875);
    assert_eq!(from_f32(DType::BF16, -(above as f64)), -5.21875);
    // f16 at [4, 8): ulp 2^-8; 4 + 2^-9 is a tie to 4 (even), one f32 ulp more rounds up.
    let tie = 4.0f32 + 2f32.powi(-9);
    assert_eq!(from_f32(DType::F16, tie as f64), 4.0);
    let above = f32::from_bits(tie.to_bits() + 1);
    assert_eq!(from_f32(DType::F16, above as f64), 4.0 + 2f64.powi(-8));
    assert_eq!(from_f32(DType::F32, 0.1), 0.1f32 as f64);
}

/// |got - want| <= tol * |want| for every element.
fn check_relative(what: &str, got: &[f64], want: &[f64], tol: f64) -> Result<(), String> {
    match (0..want.len()).find(|&i| !within(got[i], want[i], tol * want[i].abs() + 1e-30)) {
        Some(i) => Err(format!(
            "`{what}`: element {i} is {}, expected {} (relative tolerance {tol:.1e})",
            got[i], want[i]
        )),
        None => Ok(()),
    }
}

// ---------------------------------------------------------------------------------------------
// Shared tiles: cp.async, the swizzle, TMA

/// Byte offset of element (r, c) in `st<T, rows, cols>` (tile.cuh): 16-byte units XORed with
/// the row within each 8-row block of swizzle-width rows, chunks of swizzle width back to back.
fn st_offset(rows: usize, cols: usize, elem: usize, r: usize, c: usize) -> usize {
    let row_bytes = cols * elem;
    let width = [128, 64, 32]
        .into_iter()
        .find(|w| row_bytes.is_multiple_of(*w))
        .unwrap();
    let chunk_cols = width / elem;
    let linear = (c / chunk_cols) * rows * width + r * width + (c % chunk_cols) * elem;
    let mask = width / 16 - 1;
    linear ^ (((linear >> 7) & mask) << 4)
}

#[test]
fn st_offset_is_a_permutation_within_each_tile() {
    for (rows, cols, elem) in [
        (32, 64, 2),
        (16, 32, 2),
        (64, 16, 2),
        (16, 32, 4),
        (16, 128, 2),
    ] {
        let mut seen = vec![false; rows * cols];
        for r in 0..rows {
            for c in 0..cols {
                let o = st_offset(rows, cols, elem, r, c);
                assert_eq!(o % elem, 0);
                assert!(!seen[o / elem], "{rows}x{cols}x{elem}: ({r}, {c}) collides");
                seen[o / elem] = true;
            }
        }
    }
}

#[test]
fn cp_async_global_to_shared() {
    let Some(dev) = cuda("cp_async_global_to_shared") else {
        return;
    };
    let strategy = (
        0..CP_ASYNC.entries.len(),
        (1usize..=3, 0usize..64),
        (1usize..=3, 0usize..64),
        1usize..=2,
        0usize..=2,
        any::<u64>(),
    );
    run_property(
        "cp_async_global_to_shared",
        12,
        strategy,
        |&(v, (tr, rr), (tc, rc), batch, pad, seed)| {
            let entry = CP_ASYNC.entries[v];
            let dtype = dtype_of(entry);
            let elem = dtype.size_bytes();
            let piece = 16 / elem;
            let shape = dims_of(entry);
            let (tile_r, tile_c) = (shape[0], shape[1]);
            let rows = extent(tr, rr, tile_r);
            let cols = div_up(extent(tc, rc, tile_c), piece) * piece;
            let mut rng = Rng::new(seed);
            let m = Mat::new(rows, cols, batch, pad * piece, 2 * piece, 0);
            let buf = m.fill(777.0, |_, _, _| round(dtype, 4.0 * rng.normal()));
            let (gx, gy) = (div_up(cols, tile_c), div_up(rows, tile_r));
            let tiles = gx * gy * batch;
            let words = tile_r * tile_c * elem / 2;
            let src = Buf::upload(dev, dtype, &buf)?;
            let tile_out = Buf::filled(dev, dtype, tiles * tile_r * tile_c, SENTINEL)?;
            let raw_out = Buf::ints(dev, tiles * words / 2)?;
            let args = [
                src.arg(),
                tile_out.arg(),
                raw_out.arg(),
                KernelArg::I32(rows as i32),
                KernelArg::I32(cols as i32),
                KernelArg::I64(m.stride as i64),
                KernelArg::I64(m.batch_stride as i64),
            ];
            launch(
                dev,
                &CP_ASYNC,
                entry,
                (gx as u32, gy as u32, batch as u32),
                96,
                &args,
            )?;
            // Expected tiles: the matrix, zeros past its edges; and their swizzled bytes.
            let mut want = Vec::with_capacity(tiles * tile_r * tile_c);
            let mut want_raw = vec![0u8; tiles * tile_r * tile_c * elem];
            for b in 0..batch {
                for ty in 0..gy {
                    for tx in 0..gx {
                        let tile = (b * gy + ty) * gx + tx;
                        for r in 0..tile_r {
                            for c in 0..tile_c {
                                let (gr, gc) = (ty * tile_r + r, tx * tile_c + c);
                                let value = if gr < rows && gc < cols {
                                    buf[m.at(b, gr, gc)]
                                } else {
                                    0.0
                                };
                                want.push(value);
                                let at = tile * tile_r * tile_c * elem
                                    + st_offset(tile_r, tile_c, elem, r, c);
                                want_raw[at..at + elem].copy_from_slice(&encode(dtype, &[value]));
                            }
                        }
                    }
                }
            }
            check_exact(
                &format!("{entry} tile via st::ptr"),
                &tile_out.read()?,
                &want,
            )?;
            let raw = raw_out.bytes()?;
            if let Some(i) = (0..raw.len()).find(|&i| raw[i] != want_raw[i]) {
                let tile_bytes = tile_r * tile_c * elem;
                return Err(format!(
                    "{entry}: shared tile {} byte {} is {:#04x}, the swizzle formula expects {:#04x}",
                    i / tile_bytes,
                    i % tile_bytes,
                    raw[i],
                    want_raw[i]
                ));
            }
            Ok(())
        },
    );
}

/// The TMA swizzle that matches `st<T, R, C>` for rows of `row_bytes` (one chunk per box).
fn swizzle_for(row_bytes: usize) -> Swizzle {
    match row_bytes {
        b if b % 128 == 0 => Swizzle::B128,
        b if b % 64 == 0 => Swizzle::B64,
        _ => Swizzle::B32,
    }
}

/// Whether the device runs `what` (TMA or wgmma: sm_90a); says so when it does not.
fn hopper(dev: &Device, test: &str, what: &str) -> bool {
    let arch = dev.arch();
    let ok = arch.target == "sm_90a"
        && arch.has_async_copy(AsyncCopy::Tma)
        && arch.has_mma(MmaKind::Wgmma, DType::BF16);
    if !ok {
        let _ = writeln!(
            std::io::stderr().lock(),
            "[{test}] skipped: {what} needs sm_90a; the device is {}",
            arch.target
        );
    }
    ok
}

fn check_status(entry: &str, status: &[i32]) -> Result<(), String> {
    match status.iter().position(|&s| s != 1) {
        None => Ok(()),
        Some(i) => Err(format!(
            "{entry}: block {i} reported {} ({})",
            status[i],
            match status[i] {
                -1 => "shared tile not 1024-byte aligned",
                -2 => "mbarrier never completed",
                0 => "did not finish",
                _ => "unknown",
            }
        )),
    }
}

/// Where a TMA round trip puts its boxes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Origin {
    /// Boxes from element (0, 0): the last ones hang past the end of the tensor (loads read
    /// zeros there, stores skip it, but for the rest of a row's last 16-byte chunk: TMA stores
    /// write whole chunks, so a row padding up to its 16-byte boundary may receive those zeros).
    Zero,
    /// 2-D: boxes from a negative origin (columns, rows or both), so the first ones start
    /// before the tensor. The loads read zeros there; the stores of those boxes are refused
    /// (`tma::try_store_2d`: status -3) and their in-bounds part stays unwritten.
    Before,
    /// As `Before` but with the stores issued unchecked: the hardware faults.
    BeforeUnchecked,
}

/// Runs `body` in a child process of its own (this test binary, filtered to `test`), so that a
/// GPU fault, which poisons the CUDA context of the whole process, fails this test alone. The
/// child's output is passed on; `expect_fault` inverts the verdict (the child must fail with an
/// illegal instruction).
fn isolated(test: &str, expect_fault: bool, body: impl FnOnce(&Device)) {
    const CHILD: &str = "CALICO_TILES_ISOLATED";
    let Some(dev) = cuda(test) else {
        return;
    };
    if !hopper(dev, test, "TMA") {
        return;
    }
    if std::env::var(CHILD).as_deref() == Ok(test) {
        body(dev);
        return;
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    let out = std::process::Command::new(exe)
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD, test)
        .output()
        .expect("running the test binary for an isolated test");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = writeln!(std::io::stderr().lock(), "[{test}] child process:\n{text}");
    let ran = text.contains("1 passed") || text.contains("1 failed");
    assert!(ran, "{test}: the child process did not run the test");
    if expect_fault {
        let lower = text.to_lowercase();
        assert!(
            !out.status.success()
                && (lower.contains("illegal_instruction") || lower.contains("illegal instruction")),
            "{test}: expected the unchecked TMA store to fault with an illegal instruction; it did not"
        );
    } else {
        assert!(out.status.success(), "{test} failed (output above)");
    }
}

/// One drawn TMA case: (tiles, remainder) of rows and columns, batch, (input, output) row
/// padding in 16-byte pieces, which origins are negative (bit 0 columns, bit 1 rows), seed.
type TmaCase = (
    (usize, usize),
    (usize, usize),
    usize,
    (usize, usize),
    usize,
    u64,
);

/// A TMA round trip through one `tiles_tma_*` entry, `cases` property cases (one fixed case
/// for `BeforeUnchecked`).
fn tma_round_trip(dev: &Device, test: &str, entry: &'static str, origin: Origin, cases: u32) {
    assert!(TMA.entries.contains(&entry), "{entry} is not a TMA entry");
    let three_d = entry.contains("_3d_");
    assert!(
        !(three_d && origin != Origin::Zero),
        "{entry}: 3-D boxes are placed by tile coordinates (load_tma), never before the tensor"
    );
    let strategy = (
        (1usize..=3, 0usize..64),
        (1usize..=3, 0usize..128),
        1usize..=2,
        (0usize..=2, 0usize..=2),
        1usize..=3,
        any::<u64>(),
    );
    let case = |&((tr, rr), (tc, rc), batch, (pad_in, pad_out), shift, seed): &TmaCase|
     -> Result<(), String> {
        let dtype = dtype_of(entry);
        let elem = dtype.size_bytes();
        let piece = 16 / elem;
        let shape = dims_of(entry);
        let (tile_r, tile_c) = (shape[0], shape[1]);
        let rows = extent(tr, rr, tile_r);
        let cols = extent(tc, rc, tile_c);
        let batch = if three_d { batch } else { 1 };
        // Row strides must be multiples of 16 bytes; the padding holds junk the loads
        // must not see (it would show in the dump instead of zeros).
        let round_pad = div_up(cols, piece) * piece - cols;
        let in_m = Mat::new(rows, cols, batch, round_pad + pad_in * piece, 3 * piece, 0);
        let out_m = Mat::new(
            rows,
            cols,
            batch,
            round_pad + pad_out * piece,
            piece,
            2 * tile_c,
        );
        // Before the tensor: one 16-byte piece of columns (the innermost coordinate stays on a
        // 16-byte boundary), 3 rows, or both.
        let before = origin != Origin::Zero;
        let col_origin: i64 = if before && shift & 1 != 0 {
            -(piece as i64)
        } else {
            0
        };
        let row_origin: i64 = if before && shift & 2 != 0 { -3 } else { 0 };
        let gx = div_up(cols + col_origin.unsigned_abs() as usize, tile_c);
        let gy = div_up(rows + row_origin.unsigned_abs() as usize, tile_r);
        let tiles = gx * gy * batch;
        // Which boxes the stores may write (the host mirror of tma::store_coords_ok).
        let stored: Vec<bool> = (0..tiles)
            .map(|t| {
                let (tx, ty, b) = (t % gx, (t / gx) % gy, t / (gx * gy));
                let c0 = col_origin + (tx * tile_c) as i64;
                let r0 = row_origin + (ty * tile_r) as i64;
                let coords: Vec<i64> = if three_d {
                    vec![c0, r0, b as i64]
                } else {
                    vec![c0, r0]
                };
                calico_cuda::tma::check_coords(dtype, &coords, true).is_ok()
            })
            .collect();
        let mut rng = Rng::new(seed);
        let in_buf = in_m.fill(777.0, |_, _, _| round(dtype, 4.0 * rng.normal()));
        let src = Buf::upload(dev, dtype, &in_buf)?;
        let dst = Buf::filled(dev, dtype, out_m.len, SENTINEL)?;
        let dump = Buf::filled(dev, dtype, tiles * tile_r * tile_c, SENTINEL)?;
        let status = Buf::ints(dev, tiles)?;
        let map = |buf: &Buf, m: &Mat| {
            let stride = (m.stride * elem) as u64;
            if three_d {
                calico_cuda::tma::encode_tiled_3d(
                    buf.addr(),
                    dtype,
                    [cols as u64, rows as u64, batch as u64],
                    [stride, (m.batch_stride * elem) as u64],
                    [64, tile_r as u32, 1],
                    Swizzle::B128,
                )
            } else {
                calico_cuda::tma::encode_tiled_2d(
                    buf.addr(),
                    dtype,
                    [cols as u64, rows as u64],
                    stride,
                    [tile_c as u32, tile_r as u32],
                    swizzle_for(tile_c * elem),
                )
            }
            .map_err(|e| format!("encoding a tensor map: {e}"))
        };
        let args = [
            KernelArg::Opaque128(map(&src, &in_m)?),
            KernelArg::Opaque128(map(&dst, &out_m)?),
            dump.arg(),
            status.arg(),
            KernelArg::I32(col_origin as i32),
            KernelArg::I32(row_origin as i32),
            KernelArg::I32((origin == Origin::BeforeUnchecked) as i32),
        ];
        launch(
            dev,
            &TMA,
            entry,
            (gx as u32, gy as u32, batch as u32),
            32,
            &args,
        )?;
        let status = status.read_i32()?;
        let want_status: Vec<i32> = stored.iter().map(|&s| if s { 1 } else { -3 }).collect();
        if let Some(i) = (0..tiles).find(|&i| status[i] != want_status[i]) {
            check_status(entry, &status)?;
            return Err(format!(
                "{entry}: block {i} (origin {col_origin}, {row_origin}) reported {}, expected {} ({})",
                status[i],
                want_status[i],
                if want_status[i] == 1 {
                    "stored"
                } else {
                    "store refused: it starts before the tensor"
                }
            ));
        }
        // What landed in shared memory: the box, zeros outside the tensor.
        let mut want = Vec::with_capacity(tiles * tile_r * tile_c);
        for b in 0..batch {
            for ty in 0..gy {
                for tx in 0..gx {
                    for r in 0..tile_r {
                        for c in 0..tile_c {
                            let gr = row_origin + (ty * tile_r + r) as i64;
                            let gc = col_origin + (tx * tile_c + c) as i64;
                            let inside =
                                (0..rows as i64).contains(&gr) && (0..cols as i64).contains(&gc);
                            want.push(if inside {
                                in_buf[in_m.at(b, gr as usize, gc as usize)]
                            } else {
                                0.0
                            });
                        }
                    }
                }
            }
        }
        check_exact(
            &format!("{entry} boxes in shared memory"),
            &dump.read()?,
            &want,
        )?;
        // The stores wrote the tensor back exactly where their boxes were stored (all of it
        // unless some were refused), and nothing around it.
        let poison = round(dtype, SENTINEL);
        let mut want_out = Vec::with_capacity(batch * rows * cols);
        for b in 0..batch {
            for r in 0..rows {
                for c in 0..cols {
                    let tx = (c as i64 - col_origin) as usize / tile_c;
                    let ty = (r as i64 - row_origin) as usize / tile_r;
                    want_out.push(if stored[(b * gy + ty) * gx + tx] {
                        in_buf[in_m.at(b, r, c)]
                    } else {
                        poison
                    });
                }
            }
        }
        let got = dst.read()?;
        check_exact(
            &format!("{entry} stored tensor"),
            &out_m.gather(&got),
            &want_out,
        )?;
        // Nothing around the tensor was written, except that TMA stores write whole 16-byte
        // chunks of a row: where `cols` ends inside a chunk, the rest of that chunk (row
        // padding up to the next 16-byte boundary) may receive what the box holds there, the
        // zeros its load filled in. Only rows a store was issued for (not refused) may show it.
        let (tail_written, tail_len) = out_m.untouched_but_tails(
            &format!("{entry} store"),
            dtype,
            &got,
            div_up(cols, piece) * piece,
            0.0,
            |b, r| {
                let tx = (cols as i64 - 1 - col_origin) as usize / tile_c;
                let ty = (r as i64 - row_origin) as usize / tile_r;
                stored[(b * gy + ty) * gx + tx]
            },
        )?;
        if tail_written > 0 {
            let _ = writeln!(
                std::io::stderr().lock(),
                "[{test}] {cols} columns: the stores wrote {tail_written} of {tail_len} padding \
                 elements up to the rows' 16-byte boundaries (whole 16-byte chunks)"
            );
        }
        Ok(())
    };
    if origin == Origin::BeforeUnchecked {
        // Both origins negative: every kind of refused box is issued.
        let fixed = ((2, 5), (2, 7), 1, (0, 1), 3, 1);
        match case(&fixed) {
            Ok(()) => {}
            Err(e) => panic!("{test}: {e}"),
        }
        return;
    }
    run_property(test, cases, strategy, case);
}

/// One #[test] per TMA entry and origin, each in its own process (see `isolated`).
macro_rules! tma_tests {
    ($($name:ident: $entry:literal, $origin:ident;)*) => {$(
        #[test]
        fn $name() {
            isolated(stringify!($name), false, |dev| {
                tma_round_trip(dev, stringify!($name), $entry, Origin::$origin, 6)
            });
        }
    )*};
}

tma_tests! {
    tma_2d_bf16_32x64: "tiles_tma_2d_bf16_32x64", Zero;
    tma_2d_f16_16x32: "tiles_tma_2d_f16_16x32", Zero;
    tma_2d_bf16_64x16: "tiles_tma_2d_bf16_64x16", Zero;
    tma_2d_f32_8x32: "tiles_tma_2d_f32_8x32", Zero;
    tma_3d_bf16_16x128: "tiles_tma_3d_bf16_16x128", Zero;
    tma_2d_bf16_32x64_before_the_tensor: "tiles_tma_2d_bf16_32x64", Before;
    tma_2d_f16_16x32_before_the_tensor: "tiles_tma_2d_f16_16x32", Before;
    tma_2d_bf16_64x16_before_the_tensor: "tiles_tma_2d_bf16_64x16", Before;
    tma_2d_f32_8x32_before_the_tensor: "tiles_tma_2d_f32_8x32", Before;
}

/// The rule the refusals above rest on: a TMA store whose box starts before the tensor is an
/// illegal instruction (the context is lost, hence its own process).
#[test]
fn tma_2d_store_before_the_tensor_faults_unchecked() {
    const TEST: &str = "tma_2d_store_before_the_tensor_faults_unchecked";
    isolated(TEST, true, |dev| {
        tma_round_trip(
            dev,
            TEST,
            "tiles_tma_2d_bf16_64x16",
            Origin::BeforeUnchecked,
            1,
        )
    });
}

// ---------------------------------------------------------------------------------------------
// wgmma

#[test]
fn wgmma_ss_tile_products() {
    let Some(dev) = cuda("wgmma_ss_tile_products") else {
        return;
    };
    if !hopper(dev, "wgmma_ss_tile_products", "wgmma") {
        return;
    }
    let strategy = (
        0..WGMMA.entries.len(),
        (1usize..=2, 0usize..64),
        (1usize..=2, 0usize..128),
        (1usize..=2, 0usize..64),
        0usize..=2,
        any::<u64>(),
    );
    run_property(
        "wgmma_ss_tile_products",
        12,
        strategy,
        |&(v, (tm, rm), (tn, rn), (tk, rk), pad, seed)| {
            let entry = WGMMA.entries[v];
            let dtype = dtype_of(entry);
            let kmajor = entry.ends_with("_kmajor");
            let wg_n: usize = entry
                .split('_')
                .find_map(|p| p.strip_prefix('n').and_then(|n| n.parse().ok()))
                .expect("entry names N");
            let m = extent(tm, rm, 64);
            let mut n = extent(tn, rn, wg_n);
            if !kmajor {
                n = div_up(n, 8) * 8; // B's rows are n long: whole 16-byte pieces
            }
            let k = div_up(extent(tk, rk, 64), 8) * 8;
            let mut rng = Rng::new(seed);
            let a = random_values(&mut rng, dtype, m * k, 1.0);
            let b = random_values(&mut rng, dtype, k * n, 1.0);
            let a_m = Mat::new(m, k, 1, 8 * pad, 0, 0);
            let b_m = if kmajor {
                Mat::new(n, k, 1, 8 * pad, 0, 0)
            } else {
                Mat::new(k, n, 1, 8 * pad, 0, 0)
            };
            let d_m = Mat::new(m, n, 1, pad + 1, 0, 23);
            let a_buf = a_m.fill(777.0, |_, r, c| a[r * k + c]);
            let b_buf = b_m.fill(
                777.0,
                |_, r, c| if kmajor { b[c * n + r] } else { b[r * n + c] },
            );
            let (gx, gy) = (div_up(n, wg_n), div_up(m, 64));
            let tiles = gx * gy;
            let ga = Buf::upload(dev, dtype, &a_buf)?;
            let gb = Buf::upload(dev, dtype, &b_buf)?;
            let gd = Buf::filled(dev, DType::F32, d_m.len, SENTINEL)?;
            let raw = Buf::filled(dev, DType::F32, tiles * 128 * wg_n / 2, f64::NAN)?;
            let status = Buf::ints(dev, tiles)?;
            let args = [
                ga.arg(),
                gb.arg(),
                gd.arg(),
                raw.arg(),
                status.arg(),
                KernelArg::I32(m as i32),
                KernelArg::I32(n as i32),
                KernelArg::I32(k as i32),
                KernelArg::I64(a_m.stride as i64),
                KernelArg::I64(b_m.stride as i64),
                KernelArg::I64(d_m.stride as i64),
            ];
            launch(dev, &WGMMA, entry, (gx as u32, gy as u32, 1), 128, &args)?;
            check_status(entry, &status.read_i32()?)?;
            let product = |i: usize, j: usize| -> f64 {
                if i < m && j < n {
                    (0..k).map(|kk| a[i * k + kk] * b[kk * n + j]).sum()
                } else {
                    0.0 // zero-filled operands past the edges
                }
            };
            let want: Vec<f64> = (0..m * n).map(|ij| product(ij / n, ij % n)).collect();
            let got = gd.read()?;
            check_close(entry, &d_m.gather(&got), &want, 2e-3)?;
            d_m.untouched(entry, DType::F32, &got)?;
            // The accumulator registers against the Rust mirror of wgmma's D fragment.
            let frag = MmaInstr::WgmmaM64NK16 { n: wg_n as u32 }
                .fragment(Operand::Acc)
                .expect("wgmma accumulator map");
            let per_thread = wg_n / 2;
            let mut want_raw = Vec::with_capacity(tiles * 128 * per_thread);
            for ty in 0..gy {
                for tx in 0..gx {
                    for thread in 0..128 {
                        for e in 0..per_thread {
                            let (r, c) = frag.coord(thread, e).unwrap();
                            want_raw.push(product(64 * ty + r, wg_n * tx + c));
                        }
                    }
                }
            }
            check_close(
                &format!("{entry} accumulator registers"),
                &raw.read()?,
                &want_raw,
                2e-3,
            )
        },
    );
}
