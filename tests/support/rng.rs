//! xorshift64*: the stress tests' deterministic per-thread generator (no dependency, the same
//! sequence on every platform for a given seed).
#![allow(dead_code)]

/// xorshift64*: a deterministic per-thread generator. Seed it with a non-zero value.
pub struct Rng(pub u64);

impl Rng {
    /// The next 64 random bits.
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A value in `0..n` (`n` > 0; the modulo bias is irrelevant at these sizes).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}
