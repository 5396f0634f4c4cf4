//! Register fragment layouts of the matrix instructions, mirrored in Rust.
//!
//! A matrix instruction spreads each operand tile over the registers of the threads that
//! execute it together (a warp of 32, a warpgroup of 128, or a wavefront of 64). For each
//! operand of each instruction this module gives the map
//! `(lane, element) -> (row, col)` and its inverse. Kernels' tests and docs use it to place
//! data; the CPU tests below prove every map is a bijection onto its tile and that an MMA
//! emulated lane by lane from the fragments equals the matrix product. That is how the wave64
//! layouts are checked without AMD hardware.
//!
//! Conventions:
//! - `lane` is the thread's index within the group that issues the instruction:
//!   `0..32` for `mma.sync`, `0..128` for `wgmma` (the warpgroup), `0..64` for MFMA.
//! - `element` is the index of the value within that thread's fragment, low to high, as the
//!   ISA documents list them (`a0..a7`, `d0..d(N/2-1)`, ...). 16-bit inputs pack two per
//!   32-bit register: element `2j` is the low half of register `j`, element `2j + 1` the
//!   high half. fp8 inputs pack four: element `4j + b` is byte `b` of register `j`. f32
//!   accumulators take one register each.
//! - A is `m x k`, B is `k x n`, the accumulator C/D is `m x n`; `(row, col)` index those.
//!
//! Sources:
//! - `mma.sync.aligned.m16n8k16` (f16/bf16 -> f32): PTX ISA, "Matrix Fragments for
//!   mma.m16n8k16 with floating point type" (the row/col formulas given with the A, B and
//!   C/D figures).
//! - `wgmma.mma_async.m64nNk16`: PTX ISA, "Matrix Fragments for wgmma.mma_async.m64nNk16",
//!   Figures "register fragment layout for matrix A" and "... for accumulator matrix D". Those
//!   are figures without formulas; the formulas here are read off them: warp `w` of the
//!   warpgroup owns rows `16w..16w+16`, laid out as the m16n8k16 A tile (for A) and as the
//!   m16n8 accumulator repeated every 8 columns (for D).
//! - CDNA MFMA `v_mfma_f32_16x16x16_{bf16,f16}` and `v_mfma_f32_32x32x8_{bf16,f16}` (CDNA3;
//!   `..._bf16_1k` / `...f16` on CDNA2, same layouts): AMD Matrix Instruction Calculator
//!   (`matrix_calculator.py -a CDNA3 -i <op> -A|-B|-D --matrix-layout`), every lane and
//!   register compared against the formulas below.
//! - CDNA3 `v_mfma_f32_16x16x32_{fp8_fp8,bf8_bf8,...}` (gfx94x; FNUZ fp8): the same calculator
//!   (`-a CDNA3 -i v_mfma_f32_16x16x32_fp8_fp8`): A[i][k] is byte `k % 4` of register
//!   `(k / 4) % 2` of lane `16 * (k / 8) + i`; the accumulator is the 16x16x16 one.

use crate::{DType, MmaAtom, MmaKind};

/// Which operand of `D = A * B + C` a fragment holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operand {
    /// The `m x k` multiplicand.
    A,
    /// The `k x n` multiplicand.
    B,
    /// The `m x n` accumulator: the C input and the D output share one layout.
    Acc,
}

/// A matrix instruction with an f32 accumulator whose fragments this module maps. The
/// layouts do not depend on whether the inputs are bf16 or f16 (or, for fp8, e4m3 or e5m2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MmaInstr {
    /// `mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}`: one warp of 32 lanes.
    MmaSyncM16N8K16,
    /// `wgmma.mma_async.m64nNk16.f32.{bf16,f16}`: one warpgroup of 128 threads; `n` is a
    /// multiple of 8 in `8..=256`. B is always read from shared memory (no register
    /// fragment); A may come from registers.
    WgmmaM64NK16 { n: u32 },
    /// `v_mfma_f32_16x16x16_{bf16,f16}`: one wavefront of 64 lanes.
    Mfma16x16x16,
    /// `v_mfma_f32_32x32x8_{bf16,f16}`: one wavefront of 64 lanes.
    Mfma32x32x8,
    /// `v_mfma_f32_16x16x32_{fp8,bf8}_{fp8,bf8}` (CDNA3): one wavefront of 64 lanes, fp8
    /// inputs (eight per lane, in two registers).
    Mfma16x16x32Fp8,
}

impl MmaInstr {
    /// The instruction that implements a 16-bit or fp8 input, f32-accumulator [`MmaAtom`],
    /// if this module maps it.
    pub fn for_atom(atom: &MmaAtom) -> Option<MmaInstr> {
        let sixteen_bit = matches!(atom.a, DType::BF16 | DType::F16) && atom.b == atom.a;
        let fp8 = matches!(atom.a, DType::F8E4M3 | DType::F8E5M2)
            && matches!(atom.b, DType::F8E4M3 | DType::F8E5M2);
        if !(sixteen_bit || fp8) || atom.acc != DType::F32 {
            return None;
        }
        let instr = match (fp8, atom.kind, atom.m, atom.n, atom.k) {
            (false, MmaKind::MmaSync, 16, 8, 16) => MmaInstr::MmaSyncM16N8K16,
            (false, MmaKind::Wgmma, 64, n, 16) => MmaInstr::WgmmaM64NK16 { n },
            (false, MmaKind::Mfma, 16, 16, 16) => MmaInstr::Mfma16x16x16,
            (false, MmaKind::Mfma, 32, 32, 8) => MmaInstr::Mfma32x32x8,
            (true, MmaKind::Mfma, 16, 16, 32) => MmaInstr::Mfma16x16x32Fp8,
            _ => return None,
        };
        instr.is_valid().then_some(instr)
    }

    /// False only for a wgmma `n` the hardware does not have.
    pub const fn is_valid(self) -> bool {
        match self {
            MmaInstr::WgmmaM64NK16 { n } => n >= 8 && n <= 256 && n % 8 == 0,
            _ => true,
        }
    }

    /// `(m, n, k)` of the instruction.
    pub const fn mnk(self) -> (usize, usize, usize) {
        match self {
            MmaInstr::MmaSyncM16N8K16 => (16, 8, 16),
            MmaInstr::WgmmaM64NK16 { n } => (64, n as usize, 16),
            MmaInstr::Mfma16x16x16 => (16, 16, 16),
            MmaInstr::Mfma32x32x8 => (32, 32, 8),
            MmaInstr::Mfma16x16x32Fp8 => (16, 16, 32),
        }
    }

    /// Bits of one input element (A and B); accumulators are f32.
    pub const fn input_bits(self) -> usize {
        match self {
            MmaInstr::Mfma16x16x32Fp8 => 8,
            _ => 16,
        }
    }

    /// Threads that execute the instruction together.
    pub const fn threads(self) -> usize {
        match self {
            MmaInstr::MmaSyncM16N8K16 => 32,
            MmaInstr::WgmmaM64NK16 { .. } => 128,
            MmaInstr::Mfma16x16x16 | MmaInstr::Mfma32x32x8 | MmaInstr::Mfma16x16x32Fp8 => 64,
        }
    }

    /// The register fragment of `operand`, or `None` where the instruction reads that operand
    /// from shared memory only (wgmma's B) or `n` is invalid.
    pub fn fragment(self, operand: Operand) -> Option<Fragment> {
        let readable = !matches!((self, operand), (MmaInstr::WgmmaM64NK16 { .. }, Operand::B));
        (self.is_valid() && readable).then_some(Fragment {
            instr: self,
            operand,
        })
    }
}

/// One operand's register fragment: which tile element each (lane, element) holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fragment {
    instr: MmaInstr,
    operand: Operand,
}

impl Fragment {
    pub const fn instr(self) -> MmaInstr {
        self.instr
    }

    pub const fn operand(self) -> Operand {
        self.operand
    }

    /// `(rows, cols)` of the tile the fragment covers.
    pub const fn shape(self) -> (usize, usize) {
        let (m, n, k) = self.instr.mnk();
        match self.operand {
            Operand::A => (m, k),
            Operand::B => (k, n),
            Operand::Acc => (m, n),
        }
    }

    /// Threads sharing the fragment (the `lane` range).
    pub const fn threads(self) -> usize {
        self.instr.threads()
    }

    /// Elements each thread holds.
    pub const fn elements_per_thread(self) -> usize {
        let (rows, cols) = self.shape();
        rows * cols / self.threads()
    }

    /// The tile coordinate `(row, col)` of `element` of `lane`'s fragment, or `None` when
    /// either is out of range.
    pub fn coord(self, lane: usize, element: usize) -> Option<(usize, usize)> {
        if lane >= self.threads() || element >= self.elements_per_thread() {
            return None;
        }
        let (l, e) = (lane, element);
        // mma.sync names: groupID = lane / 4, threadID_in_group = lane % 4.
        let (group, tig) = (l % 32 / 4, l % 4);
        Some(match (self.instr, self.operand) {
            (MmaInstr::MmaSyncM16N8K16, Operand::A) => m16n8k16_a(group, tig, e),
            (MmaInstr::MmaSyncM16N8K16, Operand::B) => (tig * 2 + (e & 1) + 8 * (e >> 1), group),
            (MmaInstr::MmaSyncM16N8K16, Operand::Acc) => (group + 8 * (e >> 1), tig * 2 + (e & 1)),
            // wgmma: warp l/32 owns rows 16*(l/32)..; within it A is the m16n8k16 A tile and D
            // repeats the m16n8 accumulator every 8 columns (d0..d3 cover columns 0..8).
            (MmaInstr::WgmmaM64NK16 { .. }, Operand::A) => {
                let (r, c) = m16n8k16_a(group, tig, e);
                (16 * (l / 32) + r, c)
            }
            (MmaInstr::WgmmaM64NK16 { .. }, Operand::Acc) => (
                16 * (l / 32) + group + 8 * ((e >> 1) & 1),
                8 * (e >> 2) + tig * 2 + (e & 1),
            ),
            (MmaInstr::WgmmaM64NK16 { .. }, Operand::B) => return None,
            // MFMA 16x16x16: lane l holds row/col l % 16 and four consecutive k (A, B) or
            // rows (D) starting at 4 * (l / 16).
            (MmaInstr::Mfma16x16x16, Operand::A) => (l % 16, 4 * (l / 16) + e),
            (MmaInstr::Mfma16x16x16, Operand::B) => (4 * (l / 16) + e, l % 16),
            (MmaInstr::Mfma16x16x16, Operand::Acc) => (4 * (l / 16) + e, l % 16),
            // MFMA 32x32x8: lane l holds row/col l % 32 and four consecutive k starting at
            // 4 * (l / 32); D's 16 registers are four groups of 4 rows, 8 rows apart.
            (MmaInstr::Mfma32x32x8, Operand::A) => (l % 32, 4 * (l / 32) + e),
            (MmaInstr::Mfma32x32x8, Operand::B) => (4 * (l / 32) + e, l % 32),
            (MmaInstr::Mfma32x32x8, Operand::Acc) => (8 * (e / 4) + 4 * (l / 32) + e % 4, l % 32),
            // MFMA 16x16x32 fp8: lane l holds row/col l % 16 and eight consecutive k starting
            // at 8 * (l / 16); D is the 16x16x16 accumulator.
            (MmaInstr::Mfma16x16x32Fp8, Operand::A) => (l % 16, 8 * (l / 16) + e),
            (MmaInstr::Mfma16x16x32Fp8, Operand::B) => (8 * (l / 16) + e, l % 16),
            (MmaInstr::Mfma16x16x32Fp8, Operand::Acc) => (4 * (l / 16) + e, l % 16),
        })
    }

    /// The `(lane, element)` that holds tile element `(row, col)`, or `None` outside the tile.
    pub fn owner(self, row: usize, col: usize) -> Option<(usize, usize)> {
        let (rows, cols) = self.shape();
        if row >= rows || col >= cols {
            return None;
        }
        // Closed forms, one per map above; the tests check each is the inverse of `coord`.
        let (r, c) = (row, col);
        Some(match (self.instr, self.operand) {
            (MmaInstr::MmaSyncM16N8K16, Operand::A) => m16n8k16_a_owner(r, c),
            (MmaInstr::MmaSyncM16N8K16, Operand::B) => {
                ((c * 4 + (r % 8) / 2), (r & 1) + 2 * (r / 8))
            }
            (MmaInstr::MmaSyncM16N8K16, Operand::Acc) => {
                ((r % 8) * 4 + c / 2, (c & 1) + 2 * (r / 8))
            }
            (MmaInstr::WgmmaM64NK16 { .. }, Operand::A) => {
                let (lane, e) = m16n8k16_a_owner(r % 16, c);
                (32 * (r / 16) + lane, e)
            }
            (MmaInstr::WgmmaM64NK16 { .. }, Operand::Acc) => {
                let lane = 32 * (r / 16) + (r % 8) * 4 + (c % 8) / 2;
                (lane, (c & 1) + 2 * ((r / 8) & 1) + 4 * (c / 8))
            }
            (MmaInstr::WgmmaM64NK16 { .. }, Operand::B) => return None,
            (MmaInstr::Mfma16x16x16, Operand::A) => (16 * (c / 4) + r, c % 4),
            (MmaInstr::Mfma16x16x16, Operand::B | Operand::Acc) => (16 * (r / 4) + c, r % 4),
            (MmaInstr::Mfma32x32x8, Operand::A) => (32 * (c / 4) + r, c % 4),
            (MmaInstr::Mfma32x32x8, Operand::B) => (32 * (r / 4) + c, r % 4),
            (MmaInstr::Mfma32x32x8, Operand::Acc) => (32 * ((r / 4) % 2) + c, 4 * (r / 8) + r % 4),
            (MmaInstr::Mfma16x16x32Fp8, Operand::A) => (16 * (c / 8) + r, c % 8),
            (MmaInstr::Mfma16x16x32Fp8, Operand::B) => (16 * (r / 8) + c, r % 8),
            (MmaInstr::Mfma16x16x32Fp8, Operand::Acc) => (16 * (r / 4) + c, r % 4),
        })
    }
}

/// The m16n8k16 A tile (16 x 16): a0,a1 row g; a2,a3 row g+8; a4..a7 the same 8 columns on.
fn m16n8k16_a(group: usize, tig: usize, e: usize) -> (usize, usize) {
    (group + 8 * ((e >> 1) & 1), tig * 2 + (e & 1) + 8 * (e >> 2))
}

fn m16n8k16_a_owner(r: usize, c: usize) -> (usize, usize) {
    (
        (r % 8) * 4 + (c % 8) / 2,
        (c & 1) + 2 * (r / 8) + 4 * (c / 8),
    )
}

/// Every fragment this module maps, for tests and tools (wgmma at a few widths).
pub fn all_fragments() -> Vec<Fragment> {
    let instrs = [
        MmaInstr::MmaSyncM16N8K16,
        MmaInstr::WgmmaM64NK16 { n: 8 },
        MmaInstr::WgmmaM64NK16 { n: 64 },
        MmaInstr::WgmmaM64NK16 { n: 256 },
        MmaInstr::Mfma16x16x16,
        MmaInstr::Mfma32x32x8,
        MmaInstr::Mfma16x16x32Fp8,
    ];
    instrs
        .iter()
        .flat_map(|i| {
            [Operand::A, Operand::B, Operand::Acc]
                .into_iter()
                .filter_map(move |o| i.fragment(o))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Arch;

    fn instrs() -> Vec<MmaInstr> {
        let mut v = vec![
            MmaInstr::MmaSyncM16N8K16,
            MmaInstr::Mfma16x16x16,
            MmaInstr::Mfma32x32x8,
            MmaInstr::Mfma16x16x32Fp8,
        ];
        v.extend((8..=256).step_by(8).map(|n| MmaInstr::WgmmaM64NK16 { n }));
        v
    }

    #[test]
    fn every_map_is_a_bijection_and_owner_inverts_coord() {
        for instr in instrs() {
            for op in [Operand::A, Operand::B, Operand::Acc] {
                let Some(f) = instr.fragment(op) else {
                    continue;
                };
                let (rows, cols) = f.shape();
                assert_eq!(f.threads() * f.elements_per_thread(), rows * cols, "{f:?}");
                let mut hit = vec![false; rows * cols];
                for lane in 0..f.threads() {
                    for e in 0..f.elements_per_thread() {
                        let (r, c) = f.coord(lane, e).unwrap();
                        assert!(r < rows && c < cols, "{f:?} {lane} {e}");
                        assert!(!hit[r * cols + c], "{f:?}: ({r},{c}) held twice");
                        hit[r * cols + c] = true;
                        assert_eq!(f.owner(r, c), Some((lane, e)), "{f:?}");
                    }
                }
                assert!(hit.iter().all(|&h| h), "{f:?} misses elements");
                assert_eq!(f.coord(f.threads(), 0), None);
                assert_eq!(f.coord(0, f.elements_per_thread()), None);
                assert_eq!(f.owner(rows, 0), None);
            }
        }
    }

    #[test]
    fn fragment_sizes_match_the_isa() {
        let size = |i: MmaInstr, o| i.fragment(o).map(|f| f.elements_per_thread());
        assert_eq!(size(MmaInstr::MmaSyncM16N8K16, Operand::A), Some(8));
        assert_eq!(size(MmaInstr::MmaSyncM16N8K16, Operand::B), Some(4));
        assert_eq!(size(MmaInstr::MmaSyncM16N8K16, Operand::Acc), Some(4));
        assert_eq!(
            size(MmaInstr::WgmmaM64NK16 { n: 256 }, Operand::Acc),
            Some(128)
        );
        assert_eq!(size(MmaInstr::WgmmaM64NK16 { n: 256 }, Operand::A), Some(8));
        assert_eq!(size(MmaInstr::WgmmaM64NK16 { n: 256 }, Operand::B), None);
        assert_eq!(size(MmaInstr::Mfma16x16x16, Operand::A), Some(4));
        assert_eq!(size(MmaInstr::Mfma16x16x16, Operand::Acc), Some(4));
        assert_eq!(size(MmaInstr::Mfma32x32x8, Operand::B), Some(4));
        assert_eq!(size(MmaInstr::Mfma32x32x8, Operand::Acc), Some(16));
        // fp8: 8 elements = 2 registers of 4 bytes for A and B; 4 f32 accumulators.
        assert_eq!(size(MmaInstr::Mfma16x16x32Fp8, Operand::A), Some(8));
        assert_eq!(size(MmaInstr::Mfma16x16x32Fp8, Operand::B), Some(8));
        assert_eq!(size(MmaInstr::Mfma16x16x32Fp8, Operand::Acc), Some(4));
        assert_eq!(
            MmaInstr::WgmmaM64NK16 { n: 12 }.fragment(Operand::Acc),
            None
        );
    }

    #[test]
    fn spot_entries_from_the_sources() {
        let at = |i: MmaInstr, o, lane, e| i.fragment(o).unwrap().coord(lane, e).unwrap();
        // PTX m16n8k16: lane 5 is groupID 1, threadID_in_group 1.
        assert_eq!(at(MmaInstr::MmaSyncM16N8K16, Operand::A, 5, 3), (9, 3));
        assert_eq!(at(MmaInstr::MmaSyncM16N8K16, Operand::A, 5, 6), (9, 10));
        assert_eq!(at(MmaInstr::MmaSyncM16N8K16, Operand::B, 5, 2), (10, 1));
        assert_eq!(at(MmaInstr::MmaSyncM16N8K16, Operand::Acc, 5, 2), (9, 2));
        // wgmma D: thread 0 holds (0,0) (0,1) (8,0) (8,1), then the same 8 columns on.
        let wg = MmaInstr::WgmmaM64NK16 { n: 64 };
        let d0: Vec<_> = (0..6).map(|e| at(wg, Operand::Acc, 0, e)).collect();
        assert_eq!(d0, [(0, 0), (0, 1), (8, 0), (8, 1), (0, 8), (0, 9)]);
        assert_eq!(at(wg, Operand::Acc, 127, 31), (63, 63));
        assert_eq!(at(wg, Operand::A, 37, 0), (17, 2));
        // AMD Matrix Instruction Calculator, CDNA3.
        assert_eq!(at(MmaInstr::Mfma16x16x16, Operand::A, 17, 2), (1, 6));
        assert_eq!(at(MmaInstr::Mfma16x16x16, Operand::B, 50, 1), (13, 2));
        assert_eq!(at(MmaInstr::Mfma16x16x16, Operand::Acc, 17, 2), (6, 1));
        assert_eq!(at(MmaInstr::Mfma32x32x8, Operand::A, 33, 1), (1, 5));
        assert_eq!(at(MmaInstr::Mfma32x32x8, Operand::B, 40, 2), (6, 8));
        assert_eq!(at(MmaInstr::Mfma32x32x8, Operand::Acc, 33, 5), (13, 1));
        assert_eq!(at(MmaInstr::Mfma32x32x8, Operand::Acc, 0, 4), (8, 0));
        assert_eq!(at(MmaInstr::Mfma32x32x8, Operand::Acc, 63, 15), (31, 31));
        // Calculator, v_mfma_f32_16x16x32_fp8_fp8: "A k: 8 * floor(lane / 16) + 4 * GPR_num +
        // floor(GPR_bits / 8)"; lane 37, GPR 1, bits 15:8 is element 5.
        assert_eq!(at(MmaInstr::Mfma16x16x32Fp8, Operand::A, 37, 5), (5, 21));
        assert_eq!(at(MmaInstr::Mfma16x16x32Fp8, Operand::B, 63, 7), (31, 15));
        assert_eq!(at(MmaInstr::Mfma16x16x32Fp8, Operand::Acc, 33, 3), (11, 1));
    }

    #[test]
    fn wave64_maps_use_all_64_lanes() {
        for instr in [
            MmaInstr::Mfma16x16x16,
            MmaInstr::Mfma32x32x8,
            MmaInstr::Mfma16x16x32Fp8,
        ] {
            for op in [Operand::A, Operand::B, Operand::Acc] {
                let f = instr.fragment(op).unwrap();
                assert_eq!(f.threads(), 64);
                let (rows, cols) = f.shape();
                let mut used = [false; 64];
                for r in 0..rows {
                    for c in 0..cols {
                        used[f.owner(r, c).unwrap().0] = true;
                    }
                }
                assert!(used.iter().all(|&u| u), "{f:?}");
            }
        }
    }

    /// Small-integer values, so every product and sum below is exact in f32.
    fn random_matrix(rows: usize, cols: usize, seed: &mut u64) -> Vec<f32> {
        (0..rows * cols)
            .map(|_| {
                *seed ^= *seed << 13;
                *seed ^= *seed >> 7;
                *seed ^= *seed << 17;
                (*seed % 9) as f32 - 4.0
            })
            .collect()
    }

    /// Per-lane register files of a row-major tile, gathered through `f`.
    fn gather(f: Fragment, tile: &[f32]) -> Vec<Vec<f32>> {
        let cols = f.shape().1;
        (0..f.threads())
            .map(|l| {
                (0..f.elements_per_thread())
                    .map(|e| {
                        let (r, c) = f.coord(l, e).unwrap();
                        tile[r * cols + c]
                    })
                    .collect()
            })
            .collect()
    }

    /// D = A * B + C computed the way the hardware does it: every lane's D registers from the
    /// A and B values that the lanes' fragments hold, then scattered back into a tile.
    fn emulate(instr: MmaInstr, a: &[f32], b: &[f32], c: &[f32]) -> Vec<f32> {
        let (m, n, k) = instr.mnk();
        let fa = instr.fragment(Operand::A).unwrap();
        let facc = instr.fragment(Operand::Acc).unwrap();
        let regs_a = gather(fa, a);
        let regs_c = gather(facc, c);
        // wgmma reads B from shared memory; the others from B's fragment.
        let regs_b = instr.fragment(Operand::B).map(|fb| (fb, gather(fb, b)));
        let a_at = |r: usize, kk: usize| {
            let (l, e) = fa.owner(r, kk).unwrap();
            regs_a[l][e]
        };
        let b_at = |kk: usize, col: usize| match &regs_b {
            Some((fb, regs)) => {
                let (l, e) = fb.owner(kk, col).unwrap();
                regs[l][e]
            }
            None => b[kk * n + col],
        };
        let mut d = vec![f32::NAN; m * n];
        for (lane, c_regs) in regs_c.iter().enumerate() {
            for (e, c_reg) in c_regs.iter().enumerate() {
                let (r, col) = facc.coord(lane, e).unwrap();
                let dot: f32 = (0..k).map(|kk| a_at(r, kk) * b_at(kk, col)).sum();
                d[r * n + col] = dot + c_reg;
            }
        }
        d
    }

    #[test]
    fn lane_by_lane_mma_equals_the_matrix_product() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        for instr in instrs() {
            let (m, n, k) = instr.mnk();
            let a = random_matrix(m, k, &mut seed);
            let b = random_matrix(k, n, &mut seed);
            let c = random_matrix(m, n, &mut seed);
            let d = emulate(instr, &a, &b, &c);
            for i in 0..m {
                for j in 0..n {
                    let want: f32 =
                        c[i * n + j] + (0..k).map(|kk| a[i * k + kk] * b[kk * n + j]).sum::<f32>();
                    assert_eq!(d[i * n + j], want, "{instr:?} at ({i},{j})");
                }
            }
        }
    }

    #[test]
    fn atoms_of_every_arch_have_maps() {
        for target in ["sm_80", "sm_90a", "gfx90a", "gfx942"] {
            let arch = Arch::for_target(target).unwrap();
            // Every 16-bit atom, and the AMD fp8 ones (NVIDIA's fp8 fragments are not mapped).
            let mapped = arch
                .mma
                .iter()
                .filter(|a| a.a.size_bytes() == 2 || a.kind == MmaKind::Mfma);
            for atom in mapped {
                assert!(MmaInstr::for_atom(atom).is_some(), "{target}: {atom:?}");
            }
        }
        let gfx942 = Arch::for_target("gfx942").unwrap();
        let fp8: Vec<_> = gfx942
            .mma
            .iter()
            .filter(|a| a.a.size_bytes() == 1)
            .map(|a| MmaInstr::for_atom(a).unwrap())
            .collect();
        assert_eq!(fp8, [MmaInstr::Mfma16x16x32Fp8; 2], "e4m3 and e5m2");
        assert_eq!(all_fragments().len(), 3 + 2 * 3 + 3 + 3 + 3);
    }

    /// Where the AMD Matrix Instruction Calculator (`-a CDNA3 -i <op> --detail-instruction`,
    /// "Matrix element to register mapping") puts element `(i, k)` of A (or `(k, j)` of B, with
    /// the same formulas in `j`) and `(i, j)` of D: `(lane, register, first bit)`. Written out
    /// separately from `coord`/`owner` so the emulation below checks one against the other.
    fn calculator_input(instr: MmaInstr, mn: usize, k: usize) -> (usize, usize, usize) {
        match instr {
            // v_mfma_f32_16x16x16_{bf16,f16}: GPR (k/2)%2, bits 16*(k%2); lane 16*(k/4) + i.
            MmaInstr::Mfma16x16x16 => (16 * (k / 4) + mn, (k / 2) % 2, 16 * (k % 2)),
            // v_mfma_f32_32x32x8_{bf16,f16}: GPR (k/2)%2, bits 16*(k%2); lane 32*(k/4) + i.
            MmaInstr::Mfma32x32x8 => (32 * (k / 4) + mn, (k / 2) % 2, 16 * (k % 2)),
            // v_mfma_f32_16x16x32_fp8_fp8: GPR (k/4)%2, bits 8*(k%4); lane 16*(k/8) + i.
            MmaInstr::Mfma16x16x32Fp8 => (16 * (k / 8) + mn, (k / 4) % 2, 8 * (k % 4)),
            _ => unreachable!("MFMA only"),
        }
    }

    fn calculator_acc(instr: MmaInstr, i: usize, j: usize) -> (usize, usize) {
        match instr {
            // GPR i%4; lane 16*(i/4) + j.
            MmaInstr::Mfma16x16x16 | MmaInstr::Mfma16x16x32Fp8 => (16 * (i / 4) + j, i % 4),
            // GPR 4*(i/8) + i%4; lane 32*((i/4)%2) + j.
            MmaInstr::Mfma32x32x8 => (32 * ((i / 4) % 2) + j, 4 * (i / 8) + i % 4),
            _ => unreachable!("MFMA only"),
        }
    }

    /// An input encoding: element bits from a value (exact for the small integers used here)
    /// and back.
    struct Encoding {
        name: &'static str,
        bits: usize,
        encode: fn(f64) -> u32,
        decode: fn(u32) -> f64,
    }

    /// CDNA3 fp8 e4m3 FNUZ: bias 8, no infinities, 0x80 is the only NaN, no negative zero.
    fn fnuz_e4m3_decode(bits: u32) -> f64 {
        let (sign, exp, man) = ((bits >> 7) & 1, (bits >> 3) & 0xf, bits & 7);
        assert_ne!(bits, 0x80, "NaN");
        let mag = if exp == 0 {
            f64::from(man) / 8.0 * 2f64.powi(-7)
        } else {
            (1.0 + f64::from(man) / 8.0) * 2f64.powi(exp as i32 - 8)
        };
        if sign == 1 {
            -mag
        } else {
            mag
        }
    }

    fn fnuz_e4m3_encode(v: f64) -> u32 {
        (0..256u32)
            .filter(|&b| b != 0x80)
            .find(|&b| fnuz_e4m3_decode(b) == v)
            .unwrap_or_else(|| panic!("{v} is not exact in e4m3 FNUZ"))
    }

    const ENCODINGS_16: [Encoding; 2] = [
        Encoding {
            name: "bf16",
            bits: 16,
            encode: |v| u32::from(half::bf16::from_f64(v).to_bits()),
            decode: |b| half::bf16::from_bits(b as u16).to_f64(),
        },
        Encoding {
            name: "f16",
            bits: 16,
            encode: |v| u32::from(half::f16::from_f64(v).to_bits()),
            decode: |b| half::f16::from_bits(b as u16).to_f64(),
        },
    ];

    const ENCODING_FP8: Encoding = Encoding {
        name: "fp8 e4m3 fnuz",
        bits: 8,
        encode: fnuz_e4m3_encode,
        decode: fnuz_e4m3_decode,
    };

    /// Packs a row-major tile into per-lane 32-bit registers through the Rust map `f`: element
    /// `e` of a lane lands in register `e * bits / 32` at bit `e * bits % 32`.
    fn pack(f: Fragment, tile: &[f64], enc: &Encoding) -> Vec<Vec<u32>> {
        let cols = f.shape().1;
        let regs = f.elements_per_thread() * enc.bits / 32;
        (0..f.threads())
            .map(|lane| {
                let mut r = vec![0u32; regs];
                for e in 0..f.elements_per_thread() {
                    let (row, col) = f.coord(lane, e).unwrap();
                    let bits = (enc.encode)(tile[row * cols + col]);
                    r[e * enc.bits / 32] |= bits << (e * enc.bits % 32);
                }
                r
            })
            .collect()
    }

    /// One MFMA as the ISA defines it: every input element read from the register file
    /// where the calculator says it is, D written likewise. D's registers are then read back
    /// into a tile through the Rust accumulator map.
    fn emulate_mfma(instr: MmaInstr, enc: &Encoding, a: &[f64], b: &[f64], c: &[f32]) -> Vec<f64> {
        let (m, n, k) = instr.mnk();
        let ra = pack(instr.fragment(Operand::A).unwrap(), a, enc);
        let rb = pack(instr.fragment(Operand::B).unwrap(), b, enc);
        let facc = instr.fragment(Operand::Acc).unwrap();
        let mut rd: Vec<Vec<u32>> = (0..64)
            .map(|lane| {
                (0..facc.elements_per_thread())
                    .map(|e| {
                        let (i, j) = facc.coord(lane, e).unwrap();
                        c[i * n + j].to_bits()
                    })
                    .collect()
            })
            .collect();
        let mask = (1u64 << enc.bits) as u32 - 1;
        let read = |regs: &[Vec<u32>], mn: usize, kk: usize| {
            let (lane, gpr, bit) = calculator_input(instr, mn, kk);
            (enc.decode)((regs[lane][gpr] >> bit) & mask)
        };
        let mut updates = Vec::new();
        for i in 0..m {
            for j in 0..n {
                let (lane, gpr) = calculator_acc(instr, i, j);
                let acc = f64::from(f32::from_bits(rd[lane][gpr]));
                let dot: f64 = (0..k).map(|kk| read(&ra, i, kk) * read(&rb, j, kk)).sum();
                updates.push((lane, gpr, (acc + dot) as f32));
            }
        }
        for (lane, gpr, v) in updates {
            rd[lane][gpr] = v.to_bits();
        }
        let mut d = vec![f64::NAN; m * n];
        for (lane, regs) in rd.iter().enumerate() {
            for (e, bits) in regs.iter().enumerate() {
                let (i, j) = facc.coord(lane, e).unwrap();
                d[i * n + j] = f64::from(f32::from_bits(*bits));
            }
        }
        d
    }

    /// The product check cannot see a permutation of k applied to A and B alike (the hardware
    /// could not either); this compares every element's place with the calculator directly.
    #[test]
    fn mfma_maps_put_every_element_where_the_calculator_does() {
        for instr in [
            MmaInstr::Mfma16x16x16,
            MmaInstr::Mfma32x32x8,
            MmaInstr::Mfma16x16x32Fp8,
        ] {
            let (m, n, k) = instr.mnk();
            let bits = instr.input_bits();
            let element = |gpr: usize, bit: usize| gpr * (32 / bits) + bit / bits;
            let fa = instr.fragment(Operand::A).unwrap();
            let fb = instr.fragment(Operand::B).unwrap();
            let facc = instr.fragment(Operand::Acc).unwrap();
            for kk in 0..k {
                for i in 0..m {
                    let (lane, gpr, bit) = calculator_input(instr, i, kk);
                    assert_eq!(
                        fa.owner(i, kk),
                        Some((lane, element(gpr, bit))),
                        "{instr:?}"
                    );
                }
                for j in 0..n {
                    let (lane, gpr, bit) = calculator_input(instr, j, kk);
                    assert_eq!(
                        fb.owner(kk, j),
                        Some((lane, element(gpr, bit))),
                        "{instr:?}"
                    );
                }
            }
            for i in 0..m {
                for j in 0..n {
                    assert_eq!(
                        facc.owner(i, j),
                        Some(calculator_acc(instr, i, j)),
                        "{instr:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn mfma_emulated_from_packed_registers_equals_the_matrix_product() {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let cases = [
            (MmaInstr::Mfma16x16x16, &ENCODINGS_16[0]),
            (MmaInstr::Mfma16x16x16, &ENCODINGS_16[1]),
            (MmaInstr::Mfma32x32x8, &ENCODINGS_16[0]),
            (MmaInstr::Mfma32x32x8, &ENCODINGS_16[1]),
            (MmaInstr::Mfma16x16x32Fp8, &ENCODING_FP8),
        ];
        for (instr, enc) in cases {
            let (m, n, k) = instr.mnk();
            for _ in 0..4 {
                let wide = |v: Vec<f32>| v.into_iter().map(f64::from).collect::<Vec<_>>();
                let a = wide(random_matrix(m, k, &mut seed));
                let b = wide(random_matrix(k, n, &mut seed));
                let c = random_matrix(m, n, &mut seed);
                let d = emulate_mfma(instr, enc, &a, &b, &c);
                for i in 0..m {
                    for j in 0..n {
                        let want = f64::from(c[i * n + j])
                            + (0..k).map(|kk| a[i * k + kk] * b[kk * n + j]).sum::<f64>();
                        assert_eq!(d[i * n + j], want, "{instr:?} {} at ({i},{j})", enc.name);
                    }
                }
            }
        }
    }
}
