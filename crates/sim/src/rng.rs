//! A tiny deterministic RNG (xorshift64*), seeded through splitmix64 so that small or
//! similar seeds still give unrelated streams. Not for cryptography.

/// xorshift64* generator. The same seed always yields the same sequence on every
/// platform.
#[derive(Debug, Clone)]
pub struct Rng {
    state: u64,
}

/// One splitmix64 step: spreads the bits of a seed (xorshift needs a non-zero state).
fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Rng {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Rng {
        let state = splitmix64(seed);
        Rng {
            // splitmix64 is a bijection, so exactly one seed maps to 0.
            state: if state == 0 {
                0x2545_F491_4F6C_DD1D
            } else {
                state
            },
        }
    }

    /// The next 64 pseudo-random bits.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.state;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.state = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A value in `0..n` (multiply-shift reduction; bias is at most n / 2^64).
    ///
    /// # Panics
    /// If `n == 0`.
    pub fn below(&mut self, n: u64) -> u64 {
        assert!(n > 0, "Rng::below(0): empty range");
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// `true` with probability `p_num / p_den` (always `true` if `p_num >= p_den`).
    ///
    /// # Panics
    /// If `p_den == 0`.
    pub fn chance(&mut self, p_num: u64, p_den: u64) -> bool {
        self.below(p_den) < p_num
    }

    /// A value in `lo..hi`.
    ///
    /// # Panics
    /// If `lo >= hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        assert!(lo < hi, "Rng::range({lo}, {hi}): empty range");
        lo + self.below(hi - lo)
    }

    /// Fills `buf` with random bytes.
    pub fn fill_bytes(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            let v = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic() {
        let a: Vec<u64> = {
            let mut r = Rng::new(42);
            (0..100).map(|_| r.next_u64()).collect()
        };
        let b: Vec<u64> = {
            let mut r = Rng::new(42);
            (0..100).map(|_| r.next_u64()).collect()
        };
        assert_eq!(a, b);
        let mut c = Rng::new(43);
        assert_ne!(a[0], c.next_u64());
    }

    #[test]
    fn zero_seed_works() {
        let mut r = Rng::new(0);
        let v: Vec<u64> = (0..10).map(|_| r.next_u64()).collect();
        assert!(v.iter().any(|&x| x != 0));
    }

    #[test]
    fn below_in_range_and_covers() {
        let mut r = Rng::new(7);
        let mut seen = [false; 10];
        for _ in 0..1000 {
            let x = r.below(10);
            assert!(x < 10);
            seen[x as usize] = true;
        }
        assert!(seen.iter().all(|&s| s));
        assert_eq!(r.below(1), 0);
    }

    #[test]
    fn chance_extremes_and_rough_rate() {
        let mut r = Rng::new(9);
        assert!((0..100).all(|_| !r.chance(0, 5)));
        assert!((0..100).all(|_| r.chance(5, 5)));
        let hits = (0..10_000).filter(|_| r.chance(1, 4)).count();
        assert!((2000..3000).contains(&hits), "{hits}");
    }

    #[test]
    fn range_and_fill() {
        let mut r = Rng::new(1);
        for _ in 0..100 {
            let x = r.range(5, 8);
            assert!((5..8).contains(&x));
        }
        let mut buf = [0u8; 13];
        r.fill_bytes(&mut buf);
        assert!(buf.iter().any(|&b| b != 0));
    }
}
