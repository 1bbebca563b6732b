//! The text bound with SSE2 (part of every x86-64 CPU): sixteen bytes at a time, each byte's
//! weight from compares on the whole vector, summed in 64-bit lanes.
//!
//! The byte before each byte comes from shifting the previous vector's last byte in, and "this
//! letter and the eight before it are letters" from and-ing the letter mask with itself shifted
//! by 1, 2, 4 and then the original mask shifted by 8 (runs of 2, 4, 8, 9), each shift taking
//! the previous vector's tail. Before the text the state is all spaces, so the result equals
//! [`super::units_scalar`] for every input (a property test checks it).

use super::w;
use std::arch::x86_64::{
    __m128i, _mm_add_epi64, _mm_add_epi8, _mm_and_si128, _mm_andnot_si128, _mm_cmpeq_epi8,
    _mm_cmplt_epi8, _mm_loadu_si128, _mm_movemask_epi8, _mm_or_si128, _mm_sad_epu8, _mm_set1_epi8,
    _mm_setzero_si128, _mm_slli_si128, _mm_srli_si128, _mm_storeu_si128,
};

/// The weights of lead bytes (and of what precedes them) are summed in units of this many
/// [`super::UNIT`]s, so that each byte's weight fits in a byte.
const SCALE: u64 = 5;

// Every weight fits in a signed byte, each byte's total in an unsigned one (a letter's three
// weights are the most), and the lead-byte weights divide by SCALE.
const _: () = {
    assert!(w::LETTER + w::PIECE + w::LONG <= 255);
    assert!(w::DIGIT + w::DIGIT_RUN <= 255 && w::PIECE <= 127 && w::DIGIT_RUN <= 127);
    assert!(w::PUNCT <= 127 && w::CONTROL <= 127);
    assert!(w::SPACE_BEFORE_MULTI % SCALE == 0 && w::PUNCT_BEFORE_MULTI % SCALE == 0);
    assert!(w::MULTI[0] % SCALE == 0 && w::MULTI[1] % SCALE == 0 && w::MULTI[2] % SCALE == 0);
    assert!((w::SPACE_BEFORE_MULTI + w::MULTI[2]) / SCALE <= 127);
};

/// `cur` shifted up by `$k` bytes, its low `$k` bytes the top ones of `prev`.
macro_rules! shift_in {
    ($k:literal, $cur:expr, $prev:expr) => {
        _mm_or_si128(
            _mm_slli_si128::<$k>($cur),
            _mm_srli_si128::<{ 16 - $k }>($prev),
        )
    };
}

/// All-ones in each byte of `x` in `lo..lo + n` (`n` ≤ 128).
#[inline(always)]
#[allow(unused_unsafe)]
fn range(x: __m128i, lo: u8, n: u8) -> __m128i {
    // Moving `lo` to -128 makes the unsigned range a signed one that starts at the bottom.
    // SAFETY: SSE2 is part of the x86_64 baseline, so these intrinsics are always available.
    unsafe {
        let moved = _mm_add_epi8(x, _mm_set1_epi8(0x80u8.wrapping_sub(lo) as i8));
        _mm_cmplt_epi8(moved, _mm_set1_epi8(n.wrapping_sub(128) as i8))
    }
}

/// `weight` in each byte where `mask` is set.
#[inline(always)]
#[allow(unused_unsafe)]
fn weigh(mask: __m128i, weight: u64) -> __m128i {
    // SAFETY: SSE2 is part of the x86_64 baseline.
    unsafe { _mm_and_si128(mask, _mm_set1_epi8(weight as i8)) }
}

/// The pass's state: the previous vector's bytes and masks, and the sums.
struct Pass {
    bytes: __m128i,
    letters: __m128i,
    runs2: __m128i,
    runs4: __m128i,
    sum: __m128i,
    sum_multi: __m128i,
}

impl Pass {
    #[inline(always)]
    #[allow(unused_unsafe)]
    fn new() -> Self {
        // SAFETY: SSE2 is part of the x86_64 baseline.
        unsafe {
            let zero = _mm_setzero_si128();
            Pass {
                bytes: _mm_set1_epi8(b' ' as i8),
                letters: zero,
                runs2: zero,
                runs4: zero,
                sum: zero,
                sum_multi: zero,
            }
        }
    }

    /// Adds the weights of the sixteen bytes `x`.
    #[inline(always)]
    #[allow(unused_unsafe)]
    fn step(&mut self, x: __m128i) {
        // SAFETY: SSE2 is part of the x86_64 baseline; no intrinsic here touches memory.
        unsafe {
            let p = shift_in!(1, x, self.bytes);
            let lower = range(x, b'a', 26);
            let upper = range(x, b'A', 26);
            let letter = _mm_or_si128(lower, upper);
            let p_letter = shift_in!(1, letter, self.letters);
            let runs2 = _mm_and_si128(letter, p_letter);
            let runs4 = _mm_and_si128(runs2, shift_in!(2, runs2, self.runs2));
            let runs8 = _mm_and_si128(runs4, shift_in!(4, runs4, self.runs4));
            let long = _mm_and_si128(runs8, shift_in!(8, letter, self.letters));
            let piece = _mm_or_si128(
                _mm_andnot_si128(p_letter, letter),
                _mm_and_si128(upper, range(p, b'a', 26)),
            );
            let digit = range(x, b'0', 10);
            let p_digit = range(p, b'0', 10);
            let punct = _mm_andnot_si128(_mm_or_si128(letter, digit), range(x, b'!', 94));
            let control = _mm_or_si128(range(x, 0, 32), _mm_cmpeq_epi8(x, _mm_set1_epi8(0x7F)));
            let p_space = _mm_cmpeq_epi8(p, _mm_set1_epi8(b' ' as i8));
            let space_run = _mm_and_si128(_mm_cmpeq_epi8(x, _mm_set1_epi8(b' ' as i8)), p_space);
            let weights = [
                weigh(letter, w::LETTER),
                weigh(piece, w::PIECE),
                weigh(long, w::LONG),
                weigh(digit, w::DIGIT),
                weigh(_mm_andnot_si128(p_digit, digit), w::DIGIT_RUN),
                weigh(punct, w::PUNCT),
                weigh(control, w::CONTROL),
                weigh(space_run, w::SPACE_RUN),
            ];
            let sum = weights
                .into_iter()
                .fold(_mm_setzero_si128(), |a, b| _mm_add_epi8(a, b));
            self.sum = _mm_add_epi64(self.sum, _mm_sad_epu8(sum, _mm_setzero_si128()));
            // Bytes of multi-byte characters are rare in most text: skip them when absent.
            if _mm_movemask_epi8(x) != 0 {
                let lead = range(x, 0xC0, 64);
                let p_punct = _mm_andnot_si128(_mm_or_si128(p_letter, p_digit), range(p, b'!', 94));
                let three = range(x, 0xE0, 32);
                let four = range(x, 0xF0, 16);
                let weights = [
                    weigh(_mm_and_si128(lead, p_space), w::SPACE_BEFORE_MULTI / SCALE),
                    weigh(_mm_and_si128(lead, p_punct), w::PUNCT_BEFORE_MULTI / SCALE),
                    weigh(lead, w::MULTI[0] / SCALE),
                    weigh(three, (w::MULTI[1] - w::MULTI[0]) / SCALE),
                    weigh(four, (w::MULTI[2] - w::MULTI[1]) / SCALE),
                ];
                let sum = weights
                    .into_iter()
                    .fold(_mm_setzero_si128(), |a, b| _mm_add_epi8(a, b));
                self.sum_multi =
                    _mm_add_epi64(self.sum_multi, _mm_sad_epu8(sum, _mm_setzero_si128()));
            }
            (self.bytes, self.letters, self.runs2, self.runs4) = (x, letter, runs2, runs4);
        }
    }

    /// The total, in [`super::UNIT`]s.
    fn total(self) -> u64 {
        let lanes = |v: __m128i| {
            let mut out = [0u64; 2];
            // SAFETY: `out` is 16 writable bytes; the store is unaligned.
            unsafe { _mm_storeu_si128(out.as_mut_ptr().cast(), v) };
            out[0] + out[1]
        };
        lanes(self.sum) + SCALE * lanes(self.sum_multi)
    }
}

/// The bound of `s`, in [`super::UNIT`]s: the text starts after spaces.
pub(super) fn units(s: &[u8]) -> u64 {
    let mut pass = Pass::new();
    let mut chunks = s.chunks_exact(16);
    for chunk in &mut chunks {
        // SAFETY: `chunk` is 16 readable bytes; the load is unaligned.
        pass.step(unsafe { _mm_loadu_si128(chunk.as_ptr().cast()) });
    }
    let rest = chunks.remainder();
    if !rest.is_empty() {
        // The last bytes, padded with continuation bytes, which weigh nothing (and nothing
        // comes after them).
        let mut last = [0x80u8; 16];
        last[..rest.len()].copy_from_slice(rest);
        // SAFETY: `last` is 16 readable bytes; the load is unaligned.
        pass.step(unsafe { _mm_loadu_si128(last.as_ptr().cast()) });
    }
    pass.total()
}
