//! A small deterministic generator: proptest draws a seed, the data follows from it, so a
//! failing case shrinks over shapes and seeds rather than over megabytes of values.

/// SplitMix64.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x9e37_79b9_7f4a_7c15)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.unit()
    }

    /// Standard normal (Box-Muller).
    pub fn normal(&mut self) -> f64 {
        let u = 1.0 - self.unit(); // (0, 1]
        let v = self.unit();
        (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

/// How input values are distributed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Dist {
    /// Uniform in [-scale, scale].
    Uniform { scale: f64 },
    /// Normal with standard deviation `scale`.
    Normal { scale: f64 },
    /// Uniform in [shift - 1, shift + 1]: a mean far from zero catches one-pass variances.
    Shifted { shift: f64 },
}

impl Dist {
    /// `n` values; never all zeros (a zero row hides most bugs).
    pub fn sample(self, rng: &mut Rng, n: usize) -> Vec<f64> {
        let mut v: Vec<f64> = (0..n)
            .map(|_| match self {
                Dist::Uniform { scale } => rng.uniform(-scale, scale),
                Dist::Normal { scale } => scale * rng.normal(),
                Dist::Shifted { shift } => shift + rng.uniform(-1.0, 1.0),
            })
            .collect();
        if n > 0 && v.iter().all(|x| x.abs() < 1e-3) {
            v[0] = 1.0;
        }
        v
    }
}
