//! The vendor-neutral half of the tile suite: kernels written only against the shared tile
//! vocabulary (`calico/tiles.h`, no vendor names), in `conformance/device/tiles/vocab/*.cu`.
//! One source serves both vendors, and the same test functions run them on every GPU backend
//! present: CUDA (warps of 32, mma.sync base tiles) and HIP (wavefronts of 64, MFMA base
//! tiles), each checked against the same f64 references. A backend with no device is named
//! on stderr ("skipped backend hip: <reason>"), never passed over in silence.
//!
//! - `compile_vocab_*` (CPU only, run in CI): every file compiles for sm_80 and sm_90a (NVRTC)
//!   and for gfx90a and gfx942 (clang-19), and each entry holds the instructions it exists for
//!   (HMMA / v_mfma, LDSM / ds_read, SHFL / ds_bpermute, MUFU.EX2 / v_exp). A missing
//!   toolchain prints "skipped: ..." (and fails under CI=true).
//! - `vocab_*`: random inputs, random tile counts and edge sizes that are not multiples of a
//!   tile, compared with host references, including that nothing outside an output was written.
//!
//! The CUDA-only families (fragment dumps by register, cp.async, TMA, wgmma, mma.sync-specific
//! SASS) stay in tiles.rs.

use super::*;
use calico::tile_kernel::TileKernel;
use calico_core::Vendor;

/// One file of vendor-neutral test kernels: its text, its entries, and what each entry's
/// machine code must hold.
struct VocabFamily {
    name: &'static str,
    text: &'static str,
    entries: &'static [&'static str],
    /// (entry name fragment, NVIDIA opcode prefix, AMD instruction prefix): entries whose name
    /// contains the fragment hold at least one such instruction on every target.
    isa: &'static [(&'static str, &'static str, &'static str)],
}

const VOCAB_ROUNDTRIP: VocabFamily = VocabFamily {
    name: "vocab/roundtrip",
    text: include_str!("../../device/tiles/vocab/roundtrip.cu"),
    entries: &[
        "tiles_vocab_roundtrip_f32_row_p0_32x32",
        "tiles_vocab_roundtrip_f32_col_p0_32x32",
        "tiles_vocab_roundtrip_bf16_row_p0_32x64",
        "tiles_vocab_roundtrip_bf16_col_p0_32x64",
        "tiles_vocab_roundtrip_f16_row_p0_16x32",
        "tiles_vocab_roundtrip_f16_col_p0_16x32",
        "tiles_vocab_roundtrip_bf16_row_p2_16x64",
        "tiles_vocab_roundtrip_bf16_col_p2_16x64",
        "tiles_vocab_roundtrip_f16_row_p2_32x32",
        "tiles_vocab_roundtrip_f16_col_p2_32x32",
        "tiles_vocab_roundtrip_bf16_row_p2_32x16",
        "tiles_vocab_roundtrip_bf16_col_p2_32x16",
        "tiles_vocab_roundtrip_bf16_row_p3_16x64",
        "tiles_vocab_roundtrip_f16_col_p3_32x32",
        "tiles_vocab_roundtrip_bf16_col_p3_32x16",
    ],
    isa: &[
        ("_p2_", "STS", "ds_write_b64"),
        ("_p3_", "STS.128", "ds_write_b128"),
        ("_row_p2_", "LDSM.16.M88", "ds_read_b64"),
        ("_col_p2_", "LDSM.16.MT88", "ds_read_u16"),
    ],
};

const VOCAB_MMA: VocabFamily = VocabFamily {
    name: "vocab/mma",
    text: include_str!("../../device/tiles/vocab/mma.cu"),
    entries: &[
        "tiles_vocab_mma_bf16_ab_32x32x32",
        "tiles_vocab_mma_bf16_abt_32x32x32",
        "tiles_vocab_mma_bf16_atb_32x32x32",
        "tiles_vocab_mma_bf16_atbt_32x32x32",
        "tiles_vocab_mma_f16_ab_16x48x16",
        "tiles_vocab_mma_f16_abt_16x48x16",
        "tiles_vocab_mma_f16_atb_48x16x32",
        "tiles_vocab_mma_f16_atbt_48x16x32",
        "tiles_vocab_mma_bf16_ab_smem_32x32x32",
        "tiles_vocab_mma_f16_ab_smem_16x64x32",
    ],
    isa: &[
        ("_bf16_", "HMMA.16816.F32.BF16", "v_mfma_f32_16x16x16"),
        ("_f16_", "HMMA.16816.F32", "v_mfma_f32_16x16x16"),
        ("_smem_", "LDSM.16.MT88", "ds_read_b64"),
    ],
};

const VOCAB_REDUCE: VocabFamily = VocabFamily {
    name: "vocab/reduce",
    text: include_str!("../../device/tiles/vocab/reduce.cu"),
    entries: &[
        "tiles_vocab_reduce_f32_16x64",
        "tiles_vocab_reduce_bf16_32x32",
        "tiles_vocab_reduce_f16_16x32",
        "tiles_vocab_reduce_bf16_64x16",
    ],
    isa: &[("", "SHFL.BFLY", "ds_bpermute_b32")],
};

const VOCAB_MAPS: VocabFamily = VocabFamily {
    name: "vocab/maps",
    text: include_str!("../../device/tiles/vocab/maps.cu"),
    entries: &[
        "tiles_vocab_maps_f32_to_bf16_row_32x32",
        "tiles_vocab_maps_bf16_to_f32_col_32x32",
        "tiles_vocab_maps_f32_to_f16_col_16x32",
        "tiles_vocab_maps_f16_to_f32_row_16x16",
    ],
    isa: &[("", "MUFU.EX2", "v_exp_f32")],
};

const VOCAB_LAYOUT: VocabFamily = VocabFamily {
    name: "vocab/layout",
    text: include_str!("../../device/tiles/vocab/layout.cu"),
    entries: &[
        "tiles_vocab_layout_f32_row_16x16",
        "tiles_vocab_layout_f32_col_16x16",
        "tiles_vocab_layout_bf16_row_16x16",
        "tiles_vocab_layout_bf16_col_16x16",
        "tiles_vocab_layout_f16_row_16x16",
        "tiles_vocab_layout_f16_col_16x16",
    ],
    isa: &[],
};

const VOCAB_COORDS: VocabFamily = VocabFamily {
    name: "vocab/coords",
    text: include_str!("../../device/tiles/vocab/coords.cu"),
    entries: &[
        "tiles_vocab_coords_bf16_row_32x64",
        "tiles_vocab_coords_bf16_col_32x32",
        "tiles_vocab_coords_f16_col_16x48",
        "tiles_vocab_coords_f32_row_16x16",
    ],
    isa: &[("", "SHFL.BFLY", "ds_bpermute_b32")],
};

impl VocabFamily {
    fn kernel(&self, entry: &'static str) -> TileKernel {
        assert!(
            self.entries.contains(&entry),
            "{entry} is not an entry of {}",
            self.name
        );
        TileKernel::new(entry, self.text)
    }
}

// ---------------------------------------------------------------------------------------------
// Compile checks (no GPU): sm_80, sm_90a, gfx90a, gfx942

fn clang_available() -> Result<(), String> {
    calico::backends::hip::require_clang().map_err(|e| e.to_string())
}

/// One function of an `llvm-objdump -d` listing: from its `<entry>:` label to the next label.
fn amd_function<'a>(asm: &'a str, entry: &str) -> Option<&'a str> {
    let label = format!("<{entry}>:");
    let start = asm.find(&label)? + label.len();
    let rest = &asm[start..];
    let end = rest
        .lines()
        .find(|l| l.trim_end().ends_with(">:") && !l.starts_with(char::is_whitespace))
        .map(|l| l.as_ptr() as usize - rest.as_ptr() as usize)
        .unwrap_or(rest.len());
    Some(&rest[..end])
}

/// Instructions of an AMDGPU listing whose mnemonic starts with `prefix`.
fn count_amd(body: &str, prefix: &str) -> usize {
    body.lines()
        .filter(|l| l.starts_with(char::is_whitespace) && l.trim_start().starts_with(prefix))
        .count()
}

/// Says why a toolchain is missing (failing in CI) and returns whether it is there.
fn toolchain(family: &str, what: &str, available: Result<(), String>) -> bool {
    match available {
        Ok(()) => true,
        Err(why) => {
            assert!(!in_ci(), "{family}: {what} toolchain missing in CI: {why}");
            println!("skipped: {family} for {what}: {why}");
            false
        }
    }
}

fn vocab_compile_check(f: &VocabFamily) {
    // One compile per target covers every entry of the file.
    let kernel = f.kernel(f.entries[0]);
    let nvidia = toolchain(f.name, "sm_80/sm_90a", nvrtc_available());
    let amd = toolchain(f.name, "gfx90a/gfx942", clang_available());
    for (target, available) in [
        ("sm_80", nvidia),
        ("sm_90a", nvidia),
        ("gfx90a", amd),
        ("gfx942", amd),
    ] {
        if !available {
            continue;
        }
        let is_amd = target.starts_with("gfx");
        let binary = kernel
            .compile_for(target)
            .unwrap_or_else(|e| panic!("{} for {target}: {e}", f.name));
        let listing = match calico::catalog::disassemble(target, &binary) {
            Ok(l) => l,
            Err(e) => {
                assert!(!in_ci(), "{}: disassembler missing in CI: {e}", f.name);
                println!("skipped ISA checks of {} for {target}: {e}", f.name);
                continue;
            }
        };
        if is_amd {
            // Every entry, without scratch (a spill would be a sign of a wrong tile size).
            let kernels = calico::catalog::resources(target, &binary)
                .expect("code object metadata")
                .expect("an AMD target");
            assert_eq!(kernels.len(), f.entries.len(), "{target}: {}", f.name);
            for k in &kernels {
                assert_eq!(k.scratch_bytes, 0, "{target}: {} spills", k.name);
            }
        } else {
            let functions = listing
                .lines()
                .filter(|l| l.trim_start().starts_with("Function : "))
                .count();
            assert_eq!(functions, f.entries.len(), "{target}: {}", f.name);
        }
        for entry in f.entries {
            let body = if is_amd {
                amd_function(&listing, entry)
            } else {
                function_sass(&listing, entry)
            }
            .unwrap_or_else(|| panic!("{target}: no function {entry} in the binary"));
            for (pattern, nvidia_op, amd_op) in f.isa {
                if !entry.contains(pattern) {
                    continue;
                }
                let n = if is_amd {
                    count_amd(body, amd_op)
                } else {
                    calico_cuda::disasm::count_opcode(body, nvidia_op)
                };
                let op = if is_amd { amd_op } else { nvidia_op };
                assert!(n > 0, "{target}: {entry} has no {op} instruction");
            }
        }
        println!(
            "{} for {target}: {} entries compiled, ISA checked",
            f.name,
            f.entries.len()
        );
    }
}

#[test]
fn compile_vocab_roundtrip() {
    vocab_compile_check(&VOCAB_ROUNDTRIP);
}
#[test]
fn compile_vocab_mma() {
    vocab_compile_check(&VOCAB_MMA);
}
#[test]
fn compile_vocab_reduce() {
    vocab_compile_check(&VOCAB_REDUCE);
}
#[test]
fn compile_vocab_maps() {
    vocab_compile_check(&VOCAB_MAPS);
}
#[test]
fn compile_vocab_layout() {
    vocab_compile_check(&VOCAB_LAYOUT);
}

#[test]
fn compile_vocab_coords() {
    vocab_compile_check(&VOCAB_COORDS);
}

#[test]
fn amd_function_splits_a_listing() {
    let s = "\n0000000000001800 <k_ab>:\n\tv_mfma_f32_16x16x16_bf16 a[0:3], v[0:1], v[2:3], 0\n\
             \ts_endpgm\n\n0000000000001900 <k_abt>:\n\tv_mov_b32_e32 v0, 0\n";
    assert_eq!(
        count_amd(amd_function(s, "k_ab").unwrap(), "v_mfma_f32_16x16x16"),
        1
    );
    assert_eq!(
        count_amd(amd_function(s, "k_abt").unwrap(), "v_mfma_f32_16x16x16"),
        0
    );
    assert!(amd_function(s, "k_a").is_none());
}

// ---------------------------------------------------------------------------------------------
// Devices and launches

/// The HIP device, opened once per test binary; `None` (after saying why) when there is none.
fn hip(test: &str) -> Option<&'static Device> {
    static DEV: OnceLock<Result<Device, String>> = OnceLock::new();
    let dev = DEV.get_or_init(|| Device::open(BackendKind::Hip, 0).map_err(|e| e.to_string()));
    match dev {
        Ok(d) => Some(d),
        Err(e) => {
            let _ = writeln!(
                std::io::stderr().lock(),
                "[{test}] skipped backend hip: {e}"
            );
            None
        }
    }
}

/// Every GPU backend with a device (each missing one named on stderr).
fn gpus(test: &str) -> Vec<&'static Device> {
    let found: Vec<&'static Device> = cuda(test).into_iter().chain(hip(test)).collect();
    if found.is_empty() {
        let _ = writeln!(
            std::io::stderr().lock(),
            "[{test}] ran on no GPU backend: the kernels were not run"
        );
    }
    found
}

/// Launches `entry` of `f` with one warp/wavefront per block and waits for it.
fn vocab_launch(
    dev: &Device,
    f: &VocabFamily,
    entry: &'static str,
    grid: (u32, u32, u32),
    args: &[KernelArg],
) -> Result<(), String> {
    let ok = grid.0 >= 1
        && grid.1 >= 1
        && grid.2 >= 1
        && grid.0 <= 1024
        && grid.1 <= 1024
        && grid.2 <= 64;
    if !ok {
        return Err(format!("{entry}: bad launch grid {grid:?} (test bug)"));
    }
    let lanes = dev.arch().lanes;
    let cfg = LaunchConfig {
        grid,
        block: (lanes, 1, 1),
        shared_mem_bytes: 0,
    };
    f.kernel(entry)
        .launch(dev, &cfg, args)
        .map_err(|e| format!("launching {entry}: {e}"))?;
    dev.synchronize()
        .map_err(|e| format!("running {entry}: {e}"))
}

/// Checks `case` for every value `strategy` draws, on every GPU backend present.
fn vocab_property<S: Strategy>(
    test: &str,
    default_cases: u32,
    strategy: S,
    case: impl Fn(&Device, &S::Value) -> Result<(), String>,
) {
    for dev in gpus(test) {
        let mut runner = TestRunner::new(config(default_cases));
        if let Err(e) = runner.run(&strategy, |v| case(dev, &v).map_err(TestCaseError::fail)) {
            panic!("{test} on backend {}: {e}", dev.kind());
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Which lane holds which element: the lane maps of calico_core::lanes

/// The lane that holds element (r, c) of a 16 x 16 register tile `entry` loads, by the lane
/// maps: on NVIDIA the mma.sync m16n8k16 fragments (16-bit row_l: A; f32 row_l: the
/// accumulator, whose 16 x 8 map repeats for columns 8..16; col_l: B, likewise), on CDNA the
/// MFMA 16x16x16 ones (row_l: A; f32 row_l: the accumulator transposed, as mma_AB computes
/// D^T = B^T A^T on the matrix core (hip_tile.h); col_l: B).
fn expected_owners(vendor: Vendor, entry: &str) -> Vec<f64> {
    let operand = if entry.contains("_col_") {
        Operand::B
    } else if dtype_of(entry) == DType::F32 {
        Operand::Acc
    } else {
        Operand::A
    };
    let amd = vendor == Vendor::Amd;
    let instr = if amd {
        MmaInstr::Mfma16x16x16
    } else {
        MmaInstr::MmaSyncM16N8K16
    };
    let frag = instr.fragment(operand).expect("a register fragment");
    (0..256)
        .map(|i| {
            let (r, c) = (i / 16, i % 16);
            let at = match (amd, operand) {
                (true, Operand::Acc) => frag.owner(c, r),
                (true, _) | (false, Operand::A) => frag.owner(r, c),
                (false, _) => frag.owner(r, c % 8),
            };
            at.expect("inside the fragment").0 as f64
        })
        .collect()
}

/// The owners above agree with the headers' own statements of the layouts: tile.cuh's
/// `base_coord` (register k of lane (g, t) starts at (g + 8 (k & 1), 2t + 8 (k >> 1)), pairs
/// along rows for row_l, transposed for col_l) and hip_tile.h's (lane l holds row l % 16,
/// columns 4 (l / 16) .. + 3 for row_l, transposed for col_l), every lane holding 256 / lanes
/// elements. On a GPU the layout test then ties the hardware, the lane maps and the headers.
#[test]
fn vocab_expected_owners_agree_with_the_headers() {
    for entry in VOCAB_LAYOUT.entries {
        let col = entry.contains("_col_");
        let mut tile_cuh = vec![f64::NAN; 256];
        for lane in 0..32 {
            let (g, t) = (lane / 4, lane % 4);
            for reg in 0..4 {
                for p in 0..2 {
                    let (r, c) = (g + 8 * (reg & 1), 2 * t + 8 * (reg >> 1) + p);
                    let (r, c) = if col { (c, r) } else { (r, c) };
                    tile_cuh[16 * r + c] = lane as f64;
                }
            }
        }
        let mut hip_tile_h = vec![f64::NAN; 256];
        for lane in 0..64 {
            for e in 0..4 {
                let (r, c) = (lane % 16, 4 * (lane / 16) + e);
                let (r, c) = if col { (c, r) } else { (r, c) };
                hip_tile_h[16 * r + c] = lane as f64;
            }
        }
        for (vendor, header, lanes) in [
            (Vendor::Nvidia, &tile_cuh, 32),
            (Vendor::Amd, &hip_tile_h, 64),
        ] {
            let want = expected_owners(vendor, entry);
            assert_eq!(&want, header, "{entry} on {vendor:?}");
            for lane in 0..lanes {
                let held = want.iter().filter(|&&l| l == lane as f64).count();
                assert_eq!(held, 256 / lanes, "{entry} on {vendor:?}: lane {lane}");
            }
        }
    }
}

#[test]
fn vocab_register_layouts_match_lane_maps() {
    const TEST: &str = "vocab_register_layouts_match_lane_maps";
    for dev in gpus(TEST) {
        for &entry in VOCAB_LAYOUT.entries {
            let dtype = dtype_of(entry);
            let src: Vec<f64> = (0..256).map(|i| i as f64).collect();
            let run = || -> Result<(), String> {
                let x = Buf::upload(dev, dtype, &src)?;
                let owner = Buf::filled(dev, DType::F32, 256, f64::NAN)?;
                vocab_launch(
                    dev,
                    &VOCAB_LAYOUT,
                    entry,
                    (1, 1, 1),
                    &[x.arg(), owner.arg()],
                )?;
                let got = owner.read()?;
                let want = expected_owners(dev.arch().vendor, entry);
                match (0..256).find(|&i| got[i] != want[i]) {
                    None => Ok(()),
                    Some(i) => Err(format!(
                        "element ({}, {}) is held by lane {}, the lane map says lane {}",
                        i / 16,
                        i % 16,
                        got[i],
                        want[i]
                    )),
                }
            };
            if let Err(e) = run() {
                panic!("{entry} on backend {}: {e}", dev.kind());
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Register-tile round trips (global, and through shared tiles)

#[test]
fn vocab_register_tile_round_trips() {
    let strategy = (
        0..VOCAB_ROUNDTRIP.entries.len(),
        (1usize..=3, 0usize..64),
        (1usize..=3, 0usize..64),
        1usize..=2,
        0usize..=2,
        any::<u64>(),
    );
    vocab_property(
        "vocab_register_tile_round_trips",
        12,
        strategy,
        |dev, &(v, (tr, rr), (tc, rc), batch, pad, seed)| {
            let entry = VOCAB_ROUNDTRIP.entries[v];
            let dtype = dtype_of(entry);
            let shape = dims_of(entry);
            let (r, c) = (shape[0], shape[1]);
            let (rows, cols) = (extent(tr, rr, r), extent(tc, rc, c));
            // Path 3 (gt) reads 16-byte chunks: its source rows start on 16-byte boundaries.
            let pad = if entry.contains("_p3_") {
                (8 - cols % 8) % 8 + 8 * pad
            } else {
                3 * pad
            };
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
            vocab_launch(dev, &VOCAB_ROUNDTRIP, entry, grid, &args)?;
            let got = dst.read()?;
            check_exact(entry, &dst_m.gather(&got), &src_m.gather(&values))?;
            dst_m.untouched(entry, dtype, &got)
        },
    );
}

// ---------------------------------------------------------------------------------------------
// Products: mma_AB, mma_ABt, mma_AtB, mma_AtBt (and mma_AB through shared tiles)

#[test]
fn vocab_tile_products() {
    let strategy = (
        0..VOCAB_MMA.entries.len(),
        (1usize..=3, 0usize..64),
        (1usize..=3, 0usize..64),
        (1usize..=3, 0usize..64),
        0usize..=3,
        any::<u64>(),
    );
    vocab_property(
        "vocab_tile_products",
        12,
        strategy,
        |dev, &(v, (tm, rm), (tn, rn), (tk, rk), pad, seed)| {
            let entry = VOCAB_MMA.entries[v];
            let dtype = dtype_of(entry);
            let shape = dims_of(entry);
            let (m, n, k) = (
                extent(tm, rm, shape[0]),
                extent(tn, rn, shape[1]),
                extent(tk, rk, shape[2]),
            );
            // `_ab_smem_` is an `_ab_` form: the first match decides.
            let form = ["_ab_", "_abt_", "_atb_", "_atbt_"]
                .iter()
                .position(|f| entry.contains(f))
                .expect("entry names its form");
            let (a_t, b_t) = (form >= 2, form % 2 == 1);
            let mut rng = Rng::new(seed);
            let a = random_values(&mut rng, dtype, m * k, 1.0); // a[i * k + kk]
            let b = random_values(&mut rng, dtype, k * n, 1.0); // b[kk * n + j]
            let c = random_values(&mut rng, DType::F32, m * n, 1.0);
            let a_m = if a_t {
                Mat::new(k, m, 1, pad, 0, 0)
            } else {
                Mat::new(m, k, 1, pad, 0, 0)
            };
            let b_m = if b_t {
                Mat::new(n, k, 1, pad + 1, 0, 0)
            } else {
                Mat::new(k, n, 1, pad + 1, 0, 0)
            };
            let c_m = Mat::new(m, n, 1, 2, 0, 0);
            let d_m = Mat::new(m, n, 1, pad, 0, 29);
            let a_buf = a_m.fill(
                777.0,
                |_, r, cc| {
                    if a_t {
                        a[cc * k + r]
                    } else {
                        a[r * k + cc]
                    }
                },
            );
            let b_buf = b_m.fill(
                777.0,
                |_, r, cc| {
                    if b_t {
                        b[cc * n + r]
                    } else {
                        b[r * n + cc]
                    }
                },
            );
            let c_buf = c_m.fill(777.0, |_, r, cc| c[r * n + cc]);
            let ga = Buf::upload(dev, dtype, &a_buf)?;
            let gb = Buf::upload(dev, dtype, &b_buf)?;
            let gc = Buf::upload(dev, DType::F32, &c_buf)?;
            let gd = Buf::filled(dev, DType::F32, d_m.len, SENTINEL)?;
            let grid = (div_up(n, shape[1]) as u32, div_up(m, shape[0]) as u32, 1);
            let args = [
                ga.arg(),
                gb.arg(),
                gc.arg(),
                gd.arg(),
                KernelArg::I32(m as i32),
                KernelArg::I32(n as i32),
                KernelArg::I32(k as i32),
                KernelArg::I64(a_m.stride as i64),
                KernelArg::I64(b_m.stride as i64),
                KernelArg::I64(c_m.stride as i64),
                KernelArg::I64(d_m.stride as i64),
            ];
            vocab_launch(dev, &VOCAB_MMA, entry, grid, &args)?;
            let want: Vec<f64> = (0..m * n)
                .map(|ij| {
                    let (i, j) = (ij / n, ij % n);
                    c[ij] + (0..k).map(|kk| a[i * k + kk] * b[kk * n + j]).sum::<f64>()
                })
                .collect();
            let got = gd.read()?;
            // Products of 16-bit inputs are exact in f32; only the f32 accumulation rounds.
            check_close(entry, &d_m.gather(&got), &want, 2e-3)?;
            d_m.untouched(entry, DType::F32, &got)
        },
    );
}

// ---------------------------------------------------------------------------------------------
// Reductions and broadcasts

#[test]
fn vocab_reductions_and_broadcasts() {
    let strategy = (
        0..VOCAB_REDUCE.entries.len(),
        (1usize..=3, 0usize..64),
        (1usize..=3, 0usize..64),
        0usize..=3,
        any::<u64>(),
    );
    vocab_property(
        "vocab_reductions_and_broadcasts",
        10,
        strategy,
        |dev, &(v, (tr, rr), (tc, rc), pad, seed)| {
            let entry = VOCAB_REDUCE.entries[v];
            let dtype = dtype_of(entry);
            let shape = dims_of(entry);
            let (tile_r, tile_c) = (shape[0], shape[1]);
            let (rows, cols) = (extent(tr, rr, tile_r), extent(tc, rc, tile_c));
            let (gx_tiles, gy_tiles) = (div_up(cols, tile_c), div_up(rows, tile_r));
            let mut rng = Rng::new(seed);
            let x_m = Mat::new(rows, cols, 1, pad, 0, 0);
            let x_buf = x_m.fill(777.0, |_, _, _| round(dtype, 3.0 * rng.normal()));
            let x = x_m.gather(&x_buf);
            let v_row: Vec<f64> = (0..rows)
                .map(|_| {
                    let s = if rng.below(2) == 0 { -1.0 } else { 1.0 };
                    s * round(DType::F32, rng.uniform(0.5, 2.0))
                })
                .collect();
            let v_col = random_values(&mut rng, DType::F32, cols, 2.0);
            // The vectors as whole-tile matrices (constant rows / columns; 1 past the edges).
            let (v_rows, v_cols) = (gy_tiles * tile_r, gx_tiles * tile_c);
            let spread = |by_row: bool| -> Vec<f64> {
                (0..v_rows * v_cols)
                    .map(|i| {
                        let (r, c) = (i / v_cols, i % v_cols);
                        match (by_row, r < rows, c < cols) {
                            (true, true, _) => v_row[r],
                            (false, _, true) => v_col[c],
                            _ => 1.0,
                        }
                    })
                    .collect()
            };
            let red_m = Mat::new(rows, cols, 4, 0, 3, 7);
            let y_m = Mat::new(rows, cols, 5, pad + 2, 3, 11);
            let gx = Buf::upload(dev, dtype, &x_buf)?;
            let gvr = Buf::upload(dev, DType::F32, &spread(true))?;
            let gvc = Buf::upload(dev, DType::F32, &spread(false))?;
            let red = Buf::filled(dev, DType::F32, red_m.len, SENTINEL)?;
            let y = Buf::filled(dev, dtype, y_m.len, SENTINEL)?;
            let args = [
                gx.arg(),
                gvr.arg(),
                gvc.arg(),
                red.arg(),
                y.arg(),
                KernelArg::I32(rows as i32),
                KernelArg::I32(cols as i32),
                KernelArg::I32(v_rows as i32),
                KernelArg::I32(v_cols as i32),
                KernelArg::I64(x_m.stride as i64),
                KernelArg::I64(red_m.batch_stride as i64),
                KernelArg::I64(y_m.stride as i64),
                KernelArg::I64(y_m.batch_stride as i64),
            ];
            let grid = (gx_tiles as u32, gy_tiles as u32, 1);
            vocab_launch(dev, &VOCAB_REDUCE, entry, grid, &args)?;

            // Reductions run over the whole tile: zeros past the matrix edges count.
            let at = |r: usize, c: usize| {
                if r < rows && c < cols {
                    x[r * cols + c]
                } else {
                    0.0
                }
            };
            let tile_row = |r: usize, c: usize| {
                let c0 = c / tile_c * tile_c;
                (c0..c0 + tile_c).map(move |cc| at(r, cc))
            };
            let tile_col = |r: usize, c: usize| {
                let r0 = r / tile_r * tile_r;
                (r0..r0 + tile_r).map(move |rr| at(rr, c))
            };
            let red_got = red.read()?;
            let got = |b: usize| red_m.gather_batch(&red_got, b);
            let each = |f: &dyn Fn(usize, usize) -> f64| -> Vec<f64> {
                (0..rows * cols).map(|i| f(i / cols, i % cols)).collect()
            };
            check_exact(
                &format!("{entry} row_max broadcast"),
                &got(0),
                &each(&|r, c| tile_row(r, c).fold(f64::MIN, f64::max)),
            )?;
            check_exact(
                &format!("{entry} col_max broadcast"),
                &got(2),
                &each(&|r, c| tile_col(r, c).fold(f64::MIN, f64::max)),
            )?;
            for (b, name) in [(1, "row_sum"), (3, "col_sum")] {
                let terms = |r: usize, c: usize| -> Vec<f64> {
                    if b == 1 {
                        tile_row(r, c).collect()
                    } else {
                        tile_col(r, c).collect()
                    }
                };
                let sums = got(b);
                // f32 sums of up to 64 terms: a few f32 roundings of the sum of magnitudes.
                for (i, &s) in sums.iter().enumerate() {
                    let t = terms(i / cols, i % cols);
                    let want: f64 = t.iter().sum();
                    let scale: f64 = t.iter().map(|v| v.abs()).sum();
                    if !within(s, want, 1e-5 * scale + 1e-30) {
                        return Err(format!(
                            "{entry} {name} broadcast at ({}, {}): got {s}, expected {want}",
                            i / cols,
                            i % cols
                        ));
                    }
                }
            }
            red_m.untouched(entry, DType::F32, &red_got)?;

            let y_got = y.read()?;
            let ops: [Broadcast; 5] = [
                ("sub_row", |x, v| x - v, true),
                ("mul_row", |x, v| x * v, true),
                ("div_row", |x, v| x / v, true),
                ("add_col", |x, v| x + v, false),
                ("mul_col", |x, v| x * v, false),
            ];
            for (b, (name, f, by_row)) in ops.iter().enumerate() {
                let want: Vec<f64> = (0..rows * cols)
                    .map(|i| {
                        let (r, c) = (i / cols, i % cols);
                        round(dtype, f(x[i], if *by_row { v_row[r] } else { v_col[c] }))
                    })
                    .collect();
                let got = y_m.gather_batch(&y_got, b);
                check_close(
                    &format!("{entry} {name}"),
                    &got,
                    &want,
                    elementwise_tol(dtype),
                )?;
            }
            y_m.untouched(entry, dtype, &y_got)
        },
    );
}

// ---------------------------------------------------------------------------------------------
// Maps and conversions

#[test]
fn vocab_maps_and_conversions() {
    let strategy = (
        0..VOCAB_MAPS.entries.len(),
        (1usize..=3, 0usize..64),
        (1usize..=3, 0usize..64),
        0usize..=3,
        -3.0f64..3.0,
        any::<u64>(),
    );
    vocab_property(
        "vocab_maps_and_conversions",
        10,
        strategy,
        |dev, &(v, (tr, rr), (tc, rc), pad, s, seed)| {
            let entry = VOCAB_MAPS.entries[v];
            let (ti, to) = if entry.starts_with("tiles_vocab_maps_f32_to_bf16") {
                (DType::F32, DType::BF16)
            } else if entry.starts_with("tiles_vocab_maps_bf16_") {
                (DType::BF16, DType::F32)
            } else if entry.starts_with("tiles_vocab_maps_f32_to_f16") {
                (DType::F32, DType::F16)
            } else {
                (DType::F16, DType::F32)
            };
            let shape = dims_of(entry);
            let (rows, cols) = (extent(tr, rr, shape[0]), extent(tc, rc, shape[1]));
            let mut rng = Rng::new(seed);
            let in_m = Mat::new(rows, cols, 1, pad, 0, 0);
            let x_buf = in_m.fill(777.0, |_, _, _| round(ti, rng.uniform(-6.0, 6.0)));
            let y_buf = in_m.fill(777.0, |_, _, _| round(ti, rng.uniform(-2.0, 2.0)));
            let (x, y) = (in_m.gather(&x_buf), in_m.gather(&y_buf));
            let s = s as f32 as f64;
            let z_m = Mat::new(rows, cols, 5, pad + 1, 2, 9);
            let w_m = Mat::new(rows, cols, 1, 3, 0, 17);
            let gx = Buf::upload(dev, ti, &x_buf)?;
            let gy = Buf::upload(dev, ti, &y_buf)?;
            let gz = Buf::filled(dev, ti, z_m.len, SENTINEL)?;
            let gw = Buf::filled(dev, to, w_m.len, SENTINEL)?;
            let args = [
                gx.arg(),
                gy.arg(),
                gz.arg(),
                gw.arg(),
                KernelArg::I32(rows as i32),
                KernelArg::I32(cols as i32),
                KernelArg::I64(in_m.stride as i64),
                KernelArg::I64(z_m.stride as i64),
                KernelArg::I64(z_m.batch_stride as i64),
                KernelArg::I64(w_m.stride as i64),
                KernelArg::F32(s as f32),
            ];
            let grid = (
                div_up(cols, shape[1]) as u32,
                div_up(rows, shape[0]) as u32,
                1,
            );
            vocab_launch(dev, &VOCAB_MAPS, entry, grid, &args)?;
            let z_got = gz.read()?;
            let z = |b: usize| z_m.gather_batch(&z_got, b);
            let map = |f: &dyn Fn(usize) -> f64| -> Vec<f64> {
                (0..rows * cols).map(|i| round(ti, f(i))).collect()
            };
            // exp2 is one hardware instruction on both vendors (within 2 ulp of 2^x); the rest
            // is one f32 operation and one rounding.
            let (exp_tol, tol) = if ti == DType::F32 {
                (4.0 * f32::EPSILON as f64, f32::EPSILON as f64)
            } else {
                (elementwise_tol(ti), elementwise_tol(ti))
            };
            check_relative(
                &format!("{entry} exp2"),
                &z(0),
                &map(&|i| x[i].exp2()),
                exp_tol,
            )?;
            check_relative(&format!("{entry} add"), &z(1), &map(&|i| x[i] + y[i]), tol)?;
            check_relative(&format!("{entry} mul"), &z(2), &map(&|i| x[i] * y[i]), tol)?;
            check_relative(
                &format!("{entry} mul scalar"),
                &z(3),
                &map(&|i| x[i] * s),
                tol,
            )?;
            check_exact(
                &format!("{entry} fill"),
                &z(4),
                &vec![from_f32(ti, s); rows * cols],
            )?;
            z_m.untouched(entry, ti, &z_got)?;
            let w_got = gw.read()?;
            let cast: Vec<f64> = x.iter().map(|&v| from_f32(to, v)).collect();
            check_exact(
                &format!("{entry} copy (conversion)"),
                &w_m.gather(&w_got),
                &cast,
            )?;
            w_m.untouched(entry, to, &w_got)
        },
    );
}

// ---------------------------------------------------------------------------------------------
// Element coordinates (map_rc) and register-vector maps

#[test]
fn vocab_coordinates_and_vector_maps() {
    let strategy = (
        0..VOCAB_COORDS.entries.len(),
        (1usize..=3, 0usize..64),
        (1usize..=3, 0usize..64),
        0usize..=3,
        -3.0f64..3.0,
        any::<u64>(),
    );
    vocab_property(
        "vocab_coordinates_and_vector_maps",
        10,
        strategy,
        |dev, &(v, (tr, rr), (tc, rc), pad, s, seed)| {
            let entry = VOCAB_COORDS.entries[v];
            let dtype = dtype_of(entry);
            let shape = dims_of(entry);
            let (tile_r, tile_c) = (shape[0], shape[1]);
            let (rows, cols) = (extent(tr, rr, tile_r), extent(tc, rc, tile_c));
            let mut rng = Rng::new(seed);
            let x_m = Mat::new(rows, cols, 1, pad, 0, 0);
            let x_buf = x_m.fill(777.0, |_, _, _| round(dtype, 4.0 * rng.normal()));
            let x = x_m.gather(&x_buf);
            let s = s as f32 as f64;
            let z_m = Mat::new(rows, cols, 6, pad + 1, 2, 9);
            let gx = Buf::upload(dev, dtype, &x_buf)?;
            let gz = Buf::filled(dev, DType::F32, z_m.len, SENTINEL)?;
            let zt_m = Mat::new(cols, rows, 1, pad + 2, 0, 5);
            let gzt = Buf::filled(dev, DType::F32, zt_m.len, SENTINEL)?;
            let args = [
                gx.arg(),
                gz.arg(),
                gzt.arg(),
                KernelArg::I32(rows as i32),
                KernelArg::I32(cols as i32),
                KernelArg::I64(x_m.stride as i64),
                KernelArg::I64(z_m.stride as i64),
                KernelArg::I64(z_m.batch_stride as i64),
                KernelArg::I64(zt_m.stride as i64),
                KernelArg::F32(s as f32),
            ];
            let grid = (div_up(cols, tile_c) as u32, div_up(rows, tile_r) as u32, 1);
            vocab_launch(dev, &VOCAB_COORDS, entry, grid, &args)?;
            let z_got = gz.read()?;
            let z = |b: usize| z_m.gather_batch(&z_got, b);
            let each = |f: &dyn Fn(usize, usize) -> f64| -> Vec<f64> {
                (0..rows * cols).map(|i| f(i / cols, i % cols)).collect()
            };
            // Maxima run over the whole tile: zeros past the matrix edges count.
            let at = |r: usize, c: usize| {
                if r < rows && c < cols {
                    x[r * cols + c]
                } else {
                    0.0
                }
            };
            let row_max = |r: usize, c: usize| {
                let c0 = c / tile_c * tile_c;
                (c0..c0 + tile_c)
                    .map(|cc| at(r, cc))
                    .fold(f64::MIN, f64::max)
            };
            let col_max = |r: usize, c: usize| {
                let r0 = r / tile_r * tile_r;
                (r0..r0 + tile_r)
                    .map(|rr| at(rr, c))
                    .fold(f64::MIN, f64::max)
            };
            // Every value below is exact in f32 (and the coordinates in every dtype), except
            // map/map2's, whose f32 rounding the reference repeats.
            check_exact(
                &format!("{entry} map_rc row"),
                &z(0),
                &each(&|r, _| (r % tile_r) as f64),
            )?;
            check_exact(
                &format!("{entry} map_rc col"),
                &z(1),
                &each(&|_, c| (c % tile_c) as f64),
            )?;
            let signed = |r: usize, c: usize| {
                let v = x[r * cols + c];
                if ((r % tile_r) + 2 * (c % tile_c)).is_multiple_of(3) {
                    v
                } else {
                    -v
                }
            };
            check_exact(&format!("{entry} map_rc value"), &z(2), &each(&signed))?;
            // (2m + 1) - m in f32, rounded as the device rounds each step (2m is exact, so
            // a fused multiply-add rounds 2m + 1 once, as this does): m + 1 only when m's
            // bits allow it (f32 inputs need not).
            let plus_one = |m: f64| {
                let m = m as f32;
                f64::from((2.0f32 * m + 1.0f32) - m)
            };
            check_exact(
                &format!("{entry} rv map/map2"),
                &z(3),
                &each(&|r, c| plus_one(row_max(r, c))),
            )?;
            check_exact(
                &format!("{entry} rv map (per_col)"),
                &z(4),
                &each(&|r, c| 0.5 * col_max(r, c)),
            )?;
            check_exact(&format!("{entry} rv fill"), &z(5), &vec![s; rows * cols])?;
            z_m.untouched(entry, DType::F32, &z_got)?;
            let zt_got = gzt.read()?;
            let x_t: Vec<f64> = (0..rows * cols)
                .map(|i| x[(i % rows) * cols + i / rows])
                .collect();
            check_exact(&format!("{entry} transpose"), &zt_m.gather(&zt_got), &x_t)?;
            zt_m.untouched(entry, DType::F32, &zt_got)
        },
    );
}
