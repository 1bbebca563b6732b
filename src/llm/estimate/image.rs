//! Images: their dimensions read from the header of inline (base64) data, and each provider's
//! documented token formula.
//!
//! * OpenAI, tile models (GPT-4o, GPT-4.1, o1, o3, and unknown models): `detail: "low"` costs
//!   the base; otherwise the image is scaled to fit 2048×2048, then its shortest side to 768,
//!   and costs `base + per_tile × tiles of 512×512` (85 + 170 per tile; GPT-4o mini
//!   2,833 + 5,667).
//! * OpenAI, patch models (GPT-4.1 mini and nano, o4-mini): 32×32 patches, at most 1,536, times
//!   the model's multiplier (1.62, 2.46, 1.72).
//! * Anthropic: the long edge scaled to at most 1,568 px, then `width × height / 750`, at most
//!   1,600.
//!
//! Where the dimensions are unknown (a URL, a file id, a format whose header is not read), the
//! largest cost the formula can give is charged: 8 tiles (1,445 tokens for GPT-4o; 48,169 for
//! GPT-4o mini), 1,536 patches, 1,600 for Anthropic.

/// The largest Anthropic image cost.
pub(crate) const ANTHROPIC_MAX: u64 = 1_600;
/// The most tiles an OpenAI image can have (768 × 2048 after scaling).
const MAX_TILES: u64 = 8;
/// The most patches an OpenAI patch-model image can have.
const MAX_PATCHES: u64 = 1_536;

/// What one image costs under each formula.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct ImageCost {
    /// Images.
    pub images: u64,
    /// Images sent with `detail: "low"` (OpenAI).
    pub low: u64,
    /// 512-pixel tiles of the others (OpenAI tile models).
    pub tiles: u64,
    /// 32-pixel patches (OpenAI patch models).
    pub patches: u64,
    /// Tokens under Anthropic's formula.
    pub anthropic: u64,
}

impl ImageCost {
    /// The costs of one image of `dims` (when known), sent with `low` detail or not.
    pub(crate) fn one(dims: Option<(u32, u32)>, low: bool) -> ImageCost {
        let Some((w, h)) = dims.filter(|(w, h)| *w > 0 && *h > 0) else {
            return ImageCost {
                images: 1,
                low: u64::from(low),
                tiles: if low { 0 } else { MAX_TILES },
                patches: MAX_PATCHES,
                anthropic: ANTHROPIC_MAX,
            };
        };
        let (w, h) = (f64::from(w), f64::from(h));
        ImageCost {
            images: 1,
            low: u64::from(low),
            tiles: if low { 0 } else { tiles(w, h) },
            patches: patches(w, h),
            anthropic: anthropic(w, h),
        }
    }

    /// The sum of two.
    pub(crate) fn add(&mut self, o: ImageCost) {
        self.images += o.images;
        self.low += o.low;
        self.tiles += o.tiles;
        self.patches += o.patches;
        self.anthropic += o.anthropic;
    }

    /// The tokens for `model` (lower-cased, or `None` when unknown: the largest of the
    /// formulas).
    pub(crate) fn tokens(&self, model: Option<&[u8]>) -> u64 {
        if self.images == 0 {
            return 0;
        }
        let openai = |base: u64, tile: u64| {
            self.low * base + self.tiles * tile + (self.images - self.low) * base
        };
        let patch = |m: f64| (self.patches as f64 * m).ceil() as u64 + self.images;
        match model {
            Some(m) if m.starts_with(b"claude") => self.anthropic,
            Some(m) if m.starts_with(b"gpt-4o-mini") => openai(2_833, 5_667),
            Some(m) if m.starts_with(b"gpt-4.1-mini") => patch(1.62),
            Some(m) if m.starts_with(b"gpt-4.1-nano") => patch(2.46),
            Some(m) if m.starts_with(b"o4-mini") => patch(1.72),
            Some(m) if m.starts_with(b"gpt") || m.starts_with(b"o1") || m.starts_with(b"o3") => {
                openai(85, 170)
            }
            _ => openai(85, 170).max(self.anthropic),
        }
    }
}

/// OpenAI's tile count for a `w`×`h` image at high detail.
fn tiles(mut w: f64, mut h: f64) -> u64 {
    let long = w.max(h);
    if long > 2048.0 {
        w *= 2048.0 / long;
        h *= 2048.0 / long;
    }
    let short = w.min(h);
    if short > 768.0 {
        w *= 768.0 / short;
        h *= 768.0 / short;
    }
    ((w / 512.0).ceil() * (h / 512.0).ceil()) as u64
}

/// OpenAI's 32-pixel patch count, at most 1,536.
fn patches(w: f64, h: f64) -> u64 {
    (((w / 32.0).ceil() * (h / 32.0).ceil()) as u64).min(MAX_PATCHES)
}

/// Anthropic's `w × h / 750` after scaling the long edge to at most 1,568.
fn anthropic(mut w: f64, mut h: f64) -> u64 {
    let long = w.max(h);
    if long > 1568.0 {
        w *= 1568.0 / long;
        h *= 1568.0 / long;
    }
    ((w * h / 750.0).ceil() as u64).min(ANTHROPIC_MAX)
}

/// The dimensions of an inline image: a `data:` URL or bare base64 whose decoded header is PNG,
/// GIF, WebP or JPEG. Decodes only as far as the header (JPEG: up to 64 KiB), without
/// allocating.
pub(crate) fn dims(s: &str) -> Option<(u32, u32)> {
    let b64 = match s.strip_prefix("data:") {
        Some(rest) => &rest[rest.find(";base64,")? + 8..],
        None => s,
    };
    let mut bytes = Base64::new(b64.as_bytes());
    let mut head = [0u8; 30];
    let n = bytes.fill(&mut head);
    let head = &head[..n];
    let be32 = |i: usize| Some(u32::from_be_bytes(head.get(i..i + 4)?.try_into().ok()?));
    let le16 = |i: usize| {
        Some(u32::from(u16::from_le_bytes(
            head.get(i..i + 2)?.try_into().ok()?,
        )))
    };
    let le24 = |i: usize| {
        let b = head.get(i..i + 3)?;
        Some(u32::from(b[0]) | u32::from(b[1]) << 8 | u32::from(b[2]) << 16)
    };
    if head.starts_with(b"\x89PNG\r\n\x1a\n") {
        return Some((be32(16)?, be32(20)?));
    }
    if head.starts_with(b"GIF8") {
        return Some((le16(6)?, le16(8)?));
    }
    if head.starts_with(b"RIFF") && head.get(8..12) == Some(b"WEBP") {
        return match head.get(12..16)? {
            b"VP8X" => Some((le24(24)? + 1, le24(27)? + 1)),
            b"VP8 " => Some((le16(26)? & 0x3FFF, le16(28)? & 0x3FFF)),
            b"VP8L" => {
                let b = head.get(21..25)?;
                let v = u32::from_le_bytes(b.try_into().ok()?);
                Some(((v & 0x3FFF) + 1, ((v >> 14) & 0x3FFF) + 1))
            }
            _ => None,
        };
    }
    if head.starts_with(b"\xFF\xD8") {
        return jpeg(head, bytes);
    }
    None
}

/// A JPEG's dimensions from its first start-of-frame marker, reading on from `head`.
fn jpeg(head: &[u8], rest: Base64<'_>) -> Option<(u32, u32)> {
    let mut it = head[2..].iter().copied().chain(rest).take(64 * 1024);
    loop {
        // Find a marker: 0xFF then a byte that is not 0xFF.
        let mut m = it.next()?;
        if m != 0xFF {
            return None;
        }
        while m == 0xFF {
            m = it.next()?;
        }
        let len = u32::from(it.next()?) << 8 | u32::from(it.next()?);
        let sof = matches!(m, 0xC0..=0xC3 | 0xC5..=0xC7 | 0xC9..=0xCB | 0xCD..=0xCF);
        if sof {
            let _precision = it.next()?;
            let h = u32::from(it.next()?) << 8 | u32::from(it.next()?);
            let w = u32::from(it.next()?) << 8 | u32::from(it.next()?);
            return Some((w, h));
        }
        for _ in 0..len.checked_sub(2)? {
            it.next()?;
        }
    }
}

/// Bytes decoded from standard or URL-safe base64, on the fly; stops at the first byte that is
/// not base64.
struct Base64<'a> {
    src: &'a [u8],
    buf: u32,
    bits: u32,
}

impl<'a> Base64<'a> {
    fn new(src: &'a [u8]) -> Self {
        Base64 {
            src,
            buf: 0,
            bits: 0,
        }
    }

    /// Fills `out` as far as the data goes; the count filled.
    fn fill(&mut self, out: &mut [u8]) -> usize {
        let mut n = 0;
        for slot in out.iter_mut() {
            match self.next() {
                Some(b) => *slot = b,
                None => break,
            }
            n += 1;
        }
        n
    }
}

impl Iterator for Base64<'_> {
    type Item = u8;
    fn next(&mut self) -> Option<u8> {
        while self.bits < 8 {
            let (&c, rest) = self.src.split_first()?;
            self.src = rest;
            let v = match c {
                b'A'..=b'Z' => c - b'A',
                b'a'..=b'z' => c - b'a' + 26,
                b'0'..=b'9' => c - b'0' + 52,
                b'+' | b'-' => 62,
                b'/' | b'_' => 63,
                _ => return None,
            };
            self.buf = (self.buf << 6) | u32::from(v);
            self.bits += 6;
        }
        self.bits -= 8;
        Some((self.buf >> self.bits) as u8)
    }
}

#[cfg(test)]
mod tests {
    use super::{dims, ImageCost};

    fn b64(bytes: &[u8]) -> String {
        use base64::Engine;
        base64::engine::general_purpose::STANDARD_NO_PAD.encode(bytes)
    }

    #[test]
    fn headers() {
        let mut png = b"\x89PNG\r\n\x1a\n\0\0\0\x0dIHDR".to_vec();
        png.extend_from_slice(&1024u32.to_be_bytes());
        png.extend_from_slice(&768u32.to_be_bytes());
        png.extend_from_slice(&[0; 20]);
        assert_eq!(
            dims(&format!("data:image/png;base64,{}", b64(&png))),
            Some((1024, 768))
        );
        assert_eq!(dims(&b64(&png)), Some((1024, 768)));
        let gif = b"GIF89a\x20\x03\x58\x02rest-of-it".to_vec();
        assert_eq!(dims(&b64(&gif)), Some((800, 600)));
        // A JPEG with an APP0 segment before its SOF0.
        let mut jpg = b"\xFF\xD8\xFF\xE0\x00\x10JFIF\0\x01\x01\0\0\x01\0\x01\0\0".to_vec();
        jpg.extend_from_slice(b"\xFF\xC0\x00\x11\x08\x02\x58\x03\x20\x03\x01\x22\x00");
        jpg.extend_from_slice(&[0; 12]);
        assert_eq!(dims(&b64(&jpg)), Some((800, 600)));
        assert_eq!(dims("https://example.com/cat.png"), None);
    }

    #[test]
    fn documented_examples() {
        // OpenAI: 1024×1024 high detail is 4 tiles (765 tokens); 2048×4096 is 768×1536: 6 tiles
        // (1,105 tokens); low detail is 85.
        let one = ImageCost::one(Some((1024, 1024)), false);
        assert_eq!(one.tokens(Some(b"gpt-4o")), 765);
        assert_eq!(
            ImageCost::one(Some((2048, 4096)), false).tokens(Some(b"gpt-4o")),
            1_105
        );
        assert_eq!(
            ImageCost::one(Some((4096, 4096)), true).tokens(Some(b"gpt-4o")),
            85
        );
        // Anthropic: 1092×1092 is about 1,590 tokens; 200×200 about 54.
        assert_eq!(
            ImageCost::one(Some((1092, 1092)), false).tokens(Some(b"claude-x")),
            1_590
        );
        assert_eq!(
            ImageCost::one(Some((200, 200)), false).tokens(Some(b"claude-x")),
            54
        );
        // Unknown dimensions: the largest the formula gives.
        let unknown = ImageCost::one(None, false);
        assert_eq!(unknown.tokens(Some(b"gpt-4o")), 85 + 170 * 8);
        assert_eq!(unknown.tokens(Some(b"claude-3")), 1_600);
        assert_eq!(unknown.tokens(None), 1_600);
    }
}
