//! An upper bound on the tokens of any text, from its UTF-8 bytes and script classes.
//!
//! Byte-level BPE tokenizers (o200k_base, cl100k_base, Claude's) never spend more than one token
//! per byte, and spend far fewer on common text. The bound charges each class of character what
//! its worst realistic run costs under both OpenAI tokenizers (measured by the test
//! `tests/estimate_tokenizer.rs` on random text of each class), so no text is under-counted by
//! more than 1.25×, whatever its script:
//!
//! * ASCII letters: a charge per piece (a letter after a non-letter, or a capital after a small
//!   letter: where the tokenizers' pre-split starts a new word), a small charge per letter, and
//!   more for a letter with eight letters before it, so that long runs without spaces (random
//!   letters, identifiers) cost what they cost.
//! * Digits: the tokenizers split digits in groups of at most three.
//! * Punctuation, controls, and whitespace other than a single space: per character.
//! * Other characters at their UTF-8 length / 1.25 (and the space or punctuation before them,
//!   which cannot merge with them).
//!
//! Each byte's weight depends only on it and the eight bytes before it (no state carried from
//! byte to byte).

/// Fixed point: one token is this many units.
pub(crate) const UNIT: u64 = 100;

/// Weights in [`UNIT`]s (hundredths of a token). Each class's worst realistic cost per
/// character under o200k_base and cl100k_base, divided by 1.25 (measured on random text of the
/// class: random lower-case letters 0.54 tokens each, mixed-case 0.66, base64 0.72, hex 0.57,
/// digits 0.33, punctuation 0.67, whitespace 0.50, control characters 1.0); non-ASCII
/// characters at their UTF-8 length / 1.25, since no byte-level BPE token is shorter than a
/// byte (so no text of them is under-counted by more than 1.25×, whatever its script).
mod w {
    /// Each ASCII letter.
    pub const LETTER: u64 = 15;
    /// Each start of a letter piece.
    pub const PIECE: u64 = 100;
    /// Each letter after the eighth of its piece (long runs: random letters, identifiers).
    pub const LONG: u64 = 35;
    /// Each digit.
    pub const DIGIT: u64 = 34;
    /// Each start of a run of digits.
    pub const DIGIT_RUN: u64 = 66;
    /// Each ASCII punctuation mark or symbol.
    pub const PUNCT: u64 = 60;
    /// Each control character, tab, newline or carriage return.
    pub const CONTROL: u64 = 80;
    /// Each space that follows a space (runs of spaces: indentation).
    pub const SPACE_RUN: u64 = 25;
    /// Each space before a non-ASCII character (it cannot merge with it).
    pub const SPACE_BEFORE_MULTI: u64 = 80;
    /// Each punctuation mark before a non-ASCII character, beyond [`PUNCT`].
    pub const PUNCT_BEFORE_MULTI: u64 = 25;
    /// Each two-, three- and four-byte character: its length / 1.25.
    pub const MULTI: [u64; 3] = [160, 240, 320];
}

/// Whether `b` is ASCII punctuation or a symbol.
#[inline(always)]
fn is_punct(b: u8) -> bool {
    (b.wrapping_sub(b'!') < 15)
        | (b.wrapping_sub(b':') < 7)
        | (b.wrapping_sub(b'[') < 6)
        | (b.wrapping_sub(b'{') < 4)
}

#[inline(always)]
fn is_letter(b: u8) -> bool {
    (b | 0x20).wrapping_sub(b'a') < 26
}

/// How many bytes back a letter's run is looked at: a letter with this many letters before it
/// is in a long run.
const LOOKBACK: usize = 8;

/// The weight of byte `b` after byte `p`, with `long` whether `b` and the [`LOOKBACK`] bytes
/// before it are letters, in [`UNIT`]s.
#[inline(always)]
fn weight(b: u8, p: u8, long: bool) -> u16 {
    let lower = b.wrapping_sub(b'a') < 26;
    let upper = b.wrapping_sub(b'A') < 26;
    let letter = lower | upper;
    let p_lower = p.wrapping_sub(b'a') < 26;
    let p_letter = is_letter(p);
    let digit = b.wrapping_sub(b'0') < 10;
    let p_digit = p.wrapping_sub(b'0') < 10;
    let lead = b >= 0xC0;
    let piece = (letter & !p_letter) | (upper & p_lower);
    let w = |on: bool, weight: u64| u16::from(on) * weight as u16;
    w(letter, w::LETTER)
        + w(piece, w::PIECE)
        + w(long, w::LONG)
        + w(digit, w::DIGIT)
        + w(digit & !p_digit, w::DIGIT_RUN)
        + w(is_punct(b), w::PUNCT)
        + w((b < 0x20) | (b == 0x7F), w::CONTROL)
        + w((b == b' ') & (p == b' '), w::SPACE_RUN)
        + w(lead & (p == b' '), w::SPACE_BEFORE_MULTI)
        + w(lead & is_punct(p), w::PUNCT_BEFORE_MULTI)
        + w(b.wrapping_sub(0xC0) < 0x20, w::MULTI[0])
        + w(b.wrapping_sub(0xE0) < 0x10, w::MULTI[1])
        + w(b >= 0xF0, w::MULTI[2])
}

/// The bound of the bytes `s[LOOKBACK..]`, each weighed with the bytes before it. Written
/// over equal-length shifted slices with no state carried from byte to byte, so that the
/// compiler vectorises it; 16-bit sums over 128-byte chunks (at most 128 × 500).
fn units_after(s: &[u8]) -> u64 {
    let Some(n) = s.len().checked_sub(LOOKBACK) else {
        return 0;
    };
    let mut total = 0u64;
    let mut start = 0;
    while start < n {
        let len = (n - start).min(128);
        let at = |k: usize| &s[start + k..start + k + len];
        let (cur, p1, p2, p3, p4) = (at(8), at(7), at(6), at(5), at(4));
        let (p5, p6, p7, p8) = (at(3), at(2), at(1), at(0));
        let mut sum = 0u16;
        for i in 0..len {
            let long = is_letter(cur[i])
                & is_letter(p1[i])
                & is_letter(p2[i])
                & is_letter(p3[i])
                & is_letter(p4[i])
                & is_letter(p5[i])
                & is_letter(p6[i])
                & is_letter(p7[i])
                & is_letter(p8[i]);
            sum += weight(cur[i], p1[i], long);
        }
        total += u64::from(sum);
        start += len;
    }
    total
}

/// The bound of `s`, in [`UNIT`]s: the text starts after spaces.
pub(crate) fn units(s: &[u8]) -> u64 {
    // The first bytes, after padding spaces; then the rest, looking back into the text.
    let head = s.len().min(LOOKBACK);
    let mut padded = [b' '; 2 * LOOKBACK];
    padded[LOOKBACK..LOOKBACK + head].copy_from_slice(&s[..head]);
    units_after(&padded[..LOOKBACK + head]) + units_after(s)
}

/// The token bound of `s`, in [`UNIT`]s, and its length in UTF-16 code units.
pub(crate) fn measure(s: &str) -> (u64, u64) {
    (units(s.as_bytes()), super::super::utf16_len(s))
}
