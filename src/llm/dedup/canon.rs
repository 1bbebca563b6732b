//! The canonical encoding behind [`DedupKey`](super::DedupKey): an injective encoding of a
//! request (and of partitions and raw bytes), written into a reused per-thread buffer and
//! hashed in one pass with XXH3-128.
//!
//! Every piece is typed (a tag byte) or length-prefixed, so the encoding is injective; lengths
//! and counts are unsigned LEB128 (a prefix-free code: one byte below 128, two below 16,384),
//! which makes the benchmarks' 1.1 KB request 1,017 bytes to hash instead of the 1,209 it was
//! with 8-byte lengths. The encoding is no format: keys are process-local and may change
//! between versions of the crate.
//!
//! One-shot hashing of the contiguous encoding is measured faster than streaming it: on the
//! 1.1 KB request of `benches/dedup.rs` (callgrind, instructions per key), streaming the
//! encoding into `xxhash_rust::xxh3::Xxh3Default` through a 256-byte stack buffer, prompt
//! texts handed to the hasher directly, cost 3,938 against 2,834 for the buffered encoding
//! hashed at once: the streaming hasher copies every piece shorter than its 256-byte block
//! into its own buffer anyway, and pays a call and a digest of its buffered state on top. What
//! the buffered encoding spends is the traversal and the writes, so those are kept few and
//! short: a tag and the length that follows it are one piece, an empty object (most messages'
//! extra fields) is one piece without a walk, a string value in an object is written without a
//! call, the write position travels in a register (see [`Canon`]), and a string below 128
//! bytes takes one room check for its tag, its length and its bytes. Strings of at most 16
//! bytes (roles, keys) are copied with two overlapping fixed-size copies instead of a `memcpy`
//! call: with the `Vec` encoder that measured slower in instructions (2,879 against 2,712),
//! with this one it is fewer (2,611 against 2,657) and a few ns faster. Extending the
//! one-room path to strings below 16,384 bytes (the prompt texts) measured more instructions
//! (2,561 against 2,545) and was dropped.
//!
//! Per key now: 2,545 instructions (2,712 with 8-byte lengths and a `Vec`), of which the hash
//! about 865 (XXH3 over 1 KB with SSE2; 1,036 over the 1,209 bytes before), in about 145 ns
//! against 171 (criterion, minimum of several interleaved runs on the 2-core machine; the
//! hash alone about 48 ns, the same request with one-byte texts about 110 ns: the walk of the
//! request's structure is most of the time). The position in a register saved few
//! instructions but much time: with a `Vec`, every piece waited on the length the piece
//! before it stored.

use crate::llm::request::{Content, LlmRequest, Message};
use crate::vocab::class::ClassId;
use serde_json::{Map, Value};
use xxhash_rust::xxh3::xxh3_128;

thread_local! {
    static CANON_BUF: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
}

/// A buffer that grew above this is not kept for the next key on the thread.
const KEEP: usize = 1 << 16;

/// The encoder. The encoding is `buf[..pos]`; `buf` is scratch space, zero-filled when it
/// grows and reused for the next key on the thread (bytes past `pos` are stale, never read).
///
/// The pieces are written at a position passed from call to call in a register and returned
/// (`fn piece(&mut self, p, ..) -> usize`), not through a `Vec`'s length in memory: every push
/// of a `Vec` loads and stores its length, so each piece waited on the store of the one
/// before it.
pub(in crate::llm) struct Canon {
    buf: Vec<u8>,
    pos: usize,
}

impl Canon {
    #[inline]
    pub(in crate::llm) fn new() -> Canon {
        Canon {
            buf: CANON_BUF.with(std::cell::Cell::take),
            pos: 0,
        }
    }

    /// The `n` bytes at `p`, grown into when short.
    #[inline(always)]
    fn room(&mut self, p: usize, n: usize) -> &mut [u8] {
        if self.buf.len() - p < n {
            self.grow(p + n);
        }
        &mut self.buf[p..p + n]
    }

    #[cold]
    #[inline(never)]
    fn grow(&mut self, need: usize) {
        let len = need.max(2 * self.buf.len()).max(2048);
        self.buf.resize(len, 0);
    }

    /// A fixed-size piece, stored inline.
    #[inline(always)]
    fn small<const N: usize>(&mut self, p: usize, b: [u8; N]) -> usize {
        self.room(p, N).copy_from_slice(&b);
        p + N
    }

    /// Bytes as they are.
    #[inline(always)]
    fn raw(&mut self, p: usize, b: &[u8]) -> usize {
        copy(self.room(p, b.len()), b);
        p + b.len()
    }

    /// A length (or count, or class index) in unsigned LEB128: one byte below 128, two below
    /// 16,384. A prefix-free code, so every piece stays self-delimiting.
    #[inline(always)]
    fn len(&mut self, p: usize, n: usize) -> usize {
        if n < 0x80 {
            self.small(p, [n as u8])
        } else if n < 0x4000 {
            self.small(p, [(n as u8) | 0x80, (n >> 7) as u8])
        } else {
            self.leb(p, n as u64)
        }
    }

    /// LEB128 of a value of 16,384 or more.
    #[cold]
    #[inline(never)]
    fn leb(&mut self, mut p: usize, mut v: u64) -> usize {
        while v >= 0x80 {
            p = self.small(p, [(v as u8) | 0x80]);
            v >>= 7;
        }
        self.small(p, [v as u8])
    }

    /// A tag and a length, as one piece.
    #[inline(always)]
    fn tag_len(&mut self, p: usize, t: u8, n: usize) -> usize {
        if n < 0x80 {
            self.small(p, [t, n as u8])
        } else if n < 0x4000 {
            self.small(p, [t, (n as u8) | 0x80, (n >> 7) as u8])
        } else {
            let p = self.small(p, [t]);
            self.leb(p, n as u64)
        }
    }

    /// Length-prefixed bytes (below 128 bytes, one room for the length and the bytes).
    #[inline(always)]
    fn str(&mut self, p: usize, b: &[u8]) -> usize {
        let n = b.len();
        if n < 0x80 {
            let d = self.room(p, 1 + n);
            d[0] = n as u8;
            copy(&mut d[1..], b);
            return p + 1 + n;
        }
        let p = self.len(p, n);
        self.raw(p, b)
    }

    /// Tag-and-length-prefixed bytes (below 128 bytes, one room for the three).
    #[inline(always)]
    fn tagged(&mut self, p: usize, t: u8, b: &[u8]) -> usize {
        let n = b.len();
        if n < 0x80 {
            let d = self.room(p, 2 + n);
            d[0] = t;
            d[1] = n as u8;
            copy(&mut d[2..], b);
            return p + 2 + n;
        }
        let p = self.tag_len(p, t, n);
        self.raw(p, b)
    }

    fn opt_u64(&mut self, p: usize, v: Option<u64>) -> usize {
        match v {
            None => self.small(p, [0]),
            Some(v) => {
                let p = self.small(p, [1]);
                self.small(p, v.to_le_bytes())
            }
        }
    }

    fn value(&mut self, p: usize, v: &Value) -> usize {
        match v {
            Value::Null => self.small(p, [0]),
            Value::Bool(b) => self.small(p, [1, u8::from(*b)]),
            Value::Number(n) => {
                // The number's exact value, typed: an integer and a float never collide (as
                // `1` and `1.0` differ in JSON), and no text is formatted.
                if let Some(u) = n.as_u64() {
                    let p = self.small(p, [2]);
                    self.small(p, u.to_le_bytes())
                } else if let Some(i) = n.as_i64() {
                    let p = self.small(p, [11]);
                    self.small(p, i.to_le_bytes())
                } else {
                    let p = self.small(p, [12]);
                    self.small(p, n.as_f64().unwrap_or(f64::NAN).to_bits().to_le_bytes())
                }
            }
            Value::String(s) => self.tagged(p, 3, s.as_bytes()),
            Value::Array(a) => {
                let mut p = self.tag_len(p, 4, a.len());
                for x in a {
                    p = self.value(p, x);
                }
                p
            }
            Value::Object(o) => self.object(p, o),
        }
    }

    /// An object, keys in sorted order (`serde_json::Map` is ordered by key).
    fn object(&mut self, p: usize, o: &Map<String, Value>) -> usize {
        if o.is_empty() {
            // Most messages have no field beyond role and content: no walk to set up.
            return self.small(p, [5, 0]);
        }
        let mut p = self.tag_len(p, 5, o.len());
        for (k, v) in o {
            p = self.str(p, k.as_bytes());
            p = match v {
                // The commonest value, without a call.
                Value::String(s) => self.tagged(p, 3, s.as_bytes()),
                _ => self.value(p, v),
            };
        }
        p
    }

    fn content(&mut self, p: usize, c: &Content) -> usize {
        match c {
            // The same encoding as the JSON it came from.
            Content::Text(s) => self.tagged(p, 3, s.as_bytes()),
            Content::Blocks(blocks) => {
                let mut p = self.tag_len(p, 4, blocks.len());
                for b in blocks {
                    p = self.value(p, b.json());
                }
                p
            }
            Content::Other(v) => self.value(p, v),
        }
    }

    fn message(&mut self, p: usize, m: &Message) -> usize {
        let p = self.tagged(p, 6, m.role.as_bytes());
        let p = self.content(p, &m.content);
        self.object(p, &m.extra)
    }

    /// Writes a tag.
    #[inline(always)]
    pub(in crate::llm) fn tag(&mut self, t: u8) {
        self.pos = self.small(self.pos, [t]);
    }

    /// Writes length-prefixed bytes.
    #[inline]
    pub(in crate::llm) fn bytes(&mut self, b: &[u8]) {
        self.pos = self.str(self.pos, b);
    }

    /// The XXH3-128 of everything written.
    pub(in crate::llm) fn finish(self) -> u128 {
        let h = xxh3_128(&self.buf[..self.pos]);
        // Keep the buffer for the next key on this thread, unless it grew unusually large.
        if self.buf.len() <= KEEP {
            CANON_BUF.with(|c| c.set(self.buf));
        }
        h
    }

    /// Writes a partition: a scope and a class.
    pub(in crate::llm) fn partition(&mut self, scope: &str, class: Option<ClassId>) {
        let p = self.str(self.pos, scope.as_bytes());
        self.pos = match class {
            None => self.small(p, [0]),
            Some(c) => {
                let p = self.small(p, [1]);
                self.len(p, c.index())
            }
        };
    }

    /// Writes a request.
    pub(in crate::llm) fn request(&mut self, request: &LlmRequest) {
        let mut p = self.small(self.pos, [7]);
        p = match request.model.as_deref() {
            None => self.small(p, [0]),
            Some(s) => self.tagged(p, 1, s.as_bytes()),
        };
        p = self.len(p, request.messages.len());
        for m in &request.messages {
            p = self.message(p, m);
        }
        p = match &request.system {
            None => self.small(p, [0]),
            Some(c) => {
                let p = self.small(p, [1]);
                self.content(p, c)
            }
        };
        p = self.opt_u64(p, request.max_tokens);
        p = self.opt_u64(p, request.extra_input_tokens);
        self.pos = self.object(p, &request.extra);
    }

    /// What was written.
    #[cfg(test)]
    fn encoded(&self) -> &[u8] {
        &self.buf[..self.pos]
    }
}

/// `b` into `dst` (of the same length): strings of at most 16 bytes (roles, keys) with two
/// overlapping fixed-size copies instead of a `memcpy` call.
#[inline(always)]
fn copy(dst: &mut [u8], b: &[u8]) {
    let n = b.len();
    if n > 16 {
        dst.copy_from_slice(b);
    } else if n >= 8 {
        dst[..8].copy_from_slice(&b[..8]);
        dst[n - 8..].copy_from_slice(&b[n - 8..]);
    } else if n >= 4 {
        dst[..4].copy_from_slice(&b[..4]);
        dst[n - 4..].copy_from_slice(&b[n - 4..]);
    } else if n > 0 {
        dst[0] = b[0];
        dst[n / 2] = b[n / 2];
        dst[n - 1] = b[n - 1];
    }
}

#[cfg(test)]
#[path = "canon_tests.rs"]
mod tests;
