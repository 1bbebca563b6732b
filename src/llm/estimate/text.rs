//! An upper bound on the tokens of any text, from its UTF-8 bytes and script classes.
//!
//! Byte-level BPE tokenizers (o200k_base, cl100k_base, Claude's) never spend more than one token
//! per byte, and spend far fewer on common text. The bound charges each class of character what
//! its worst realistic run costs under both OpenAI tokenizers (measured by the test
//! `tests/estimate_tokenizer.rs` on random text of each class), so no text is under-counted by
//! more than 1.25×, whatever its script:
//!
//! * ASCII letters: a charge per piece (a letter after a non-letter, or a capital after a small
//!   letter: where the tokenizers' pre-split starts a new word) plus a small charge per letter,
//!   so that long runs without spaces (random letters, base64) cost what they cost.
//! * Digits: the tokenizers split digits in groups of at most three.
//! * Punctuation, controls, and whitespace other than a single space: per character.
//! * Other characters by the lead byte of their UTF-8 form: two-byte (Latin accents, Greek,
//!   Cyrillic, Hebrew, Arabic, combining marks), three-byte (the rest of the Basic Multilingual
//!   Plane: Indic scripts, CJK, Hangul, symbols) and four-byte (emoji, rare CJK, mathematical
//!   alphanumerics): each at the per-character cost of its class's dense runs.
//!
//! The loop keeps byte-wide counters over chunks (as [`utf16_len`](super::super::utf16_len)
//! does), comparisons of each byte and its predecessor the compiler vectorises, and applies the
//! weights once per chunk.

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

/// Counts of one text's character classes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Classes {
    /// ASCII letters.
    pub letters: u64,
    /// Letter pieces (a letter after a non-letter, a capital after a small letter).
    pub pieces: u64,
    /// Letters after the eighth of their piece.
    pub long: u64,
    /// Digits.
    pub digits: u64,
    /// Runs of digits.
    pub digit_runs: u64,
    /// ASCII punctuation and symbols.
    pub punct: u64,
    /// Controls, tabs, newlines.
    pub controls: u64,
    /// Spaces after a space.
    pub space_runs: u64,
    /// Spaces before a non-ASCII character.
    pub space_before_multi: u64,
    /// Punctuation before a non-ASCII character.
    pub punct_before_multi: u64,
    /// Two-, three- and four-byte characters.
    pub multi: [u64; 3],
}

/// Whether `b` is ASCII punctuation or a symbol.
#[inline(always)]
fn is_punct(b: u8) -> bool {
    (b.wrapping_sub(b'!') < 15)
        | (b.wrapping_sub(b':') < 7)
        | (b.wrapping_sub(b'[') < 6)
        | (b.wrapping_sub(b'{') < 4)
}

impl Classes {
    /// Counts the classes of `s`.
    pub(crate) fn of(s: &[u8]) -> Classes {
        let mut c = Classes::default();
        // The byte before the chunk (a space before the text: the text starts a piece), and
        // the length of the current letter piece.
        let mut prev = b' ';
        let mut run = 0u32;
        for chunk in s.chunks(127) {
            let mut n = [0u8; 13];
            let mut p = prev;
            for &b in chunk {
                let lower = b.wrapping_sub(b'a') < 26;
                let upper = b.wrapping_sub(b'A') < 26;
                let letter = lower | upper;
                let p_lower = p.wrapping_sub(b'a') < 26;
                let p_letter = p_lower | (p.wrapping_sub(b'A') < 26);
                let digit = b.wrapping_sub(b'0') < 10;
                let p_digit = p.wrapping_sub(b'0') < 10;
                let lead = b >= 0xC0;
                let piece = (letter & !p_letter) | (upper & p_lower);
                run = if piece {
                    1
                } else {
                    (run + 1) * u32::from(letter)
                };
                n[0] += u8::from(letter);
                n[1] += u8::from(piece);
                n[2] += u8::from(run > 8);
                n[3] += u8::from(digit);
                n[4] += u8::from(digit & !p_digit);
                n[5] += u8::from(is_punct(b));
                n[6] += u8::from((b < 0x20) | (b == 0x7F));
                n[7] += u8::from((b == b' ') & (p == b' '));
                n[8] += u8::from(lead & (p == b' '));
                n[9] += u8::from(lead & is_punct(p));
                n[10] += u8::from(b.wrapping_sub(0xC0) < 0x20);
                n[11] += u8::from(b.wrapping_sub(0xE0) < 0x10);
                n[12] += u8::from(b >= 0xF0);
                p = b;
            }
            prev = p;
            c.letters += u64::from(n[0]);
            c.pieces += u64::from(n[1]);
            c.long += u64::from(n[2]);
            c.digits += u64::from(n[3]);
            c.digit_runs += u64::from(n[4]);
            c.punct += u64::from(n[5]);
            c.controls += u64::from(n[6]);
            c.space_runs += u64::from(n[7]);
            c.space_before_multi += u64::from(n[8]);
            c.punct_before_multi += u64::from(n[9]);
            c.multi[0] += u64::from(n[10]);
            c.multi[1] += u64::from(n[11]);
            c.multi[2] += u64::from(n[12]);
        }
        c
    }

    /// The bound, in [`UNIT`]s.
    pub(crate) fn units(&self) -> u64 {
        self.letters * w::LETTER
            + self.pieces * w::PIECE
            + self.long * w::LONG
            + self.digits * w::DIGIT
            + self.digit_runs * w::DIGIT_RUN
            + self.punct * w::PUNCT
            + self.controls * w::CONTROL
            + self.space_runs * w::SPACE_RUN
            + self.space_before_multi * w::SPACE_BEFORE_MULTI
            + self.punct_before_multi * w::PUNCT_BEFORE_MULTI
            + self.multi[0] * w::MULTI[0]
            + self.multi[1] * w::MULTI[1]
            + self.multi[2] * w::MULTI[2]
    }
}

/// The token bound of `s`, in [`UNIT`]s, and its length in UTF-16 code units, in one pass.
pub(crate) fn measure(s: &str) -> (u64, u64) {
    let c = Classes::of(s.as_bytes());
    let ascii = s.len() as u64 - c.multi[0] * 2 - c.multi[1] * 3 - c.multi[2] * 4;
    // Every character is one UTF-16 unit, except four-byte ones (two).
    let utf16 = ascii + c.multi[0] + c.multi[1] + c.multi[2] * 2;
    (c.units(), utf16)
}
