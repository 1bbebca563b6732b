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
//! the buffered encoding spends is the traversal and the writes, so those are kept few: a tag
//! and the length that follows it are one piece, and an empty object (most messages' extra
//! fields) is one piece without a walk. Copying short strings without `memcpy` (two
//! overlapping fixed-size copies) measured slower and was dropped. Per key now (callgrind):
//! 2,625 instructions (from 2,712 with 8-byte lengths), of which the hash about 865 (XXH3 over
//! 1 KB with SSE2; 1,036 before) and the walk of the request the rest (`serde_json` maps are
//! B-trees; the prompt texts are copied with `memcpy`).

use crate::llm::request::{Content, LlmRequest, Message};
use crate::vocab::class::ClassId;
use serde_json::{Map, Value};
use xxhash_rust::xxh3::xxh3_128;

thread_local! {
    static CANON_BUF: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
}

/// A buffer that grew above this is not kept for the next key on the thread.
const KEEP: usize = 1 << 16;

/// The encoder.
pub(in crate::llm) struct Canon {
    buf: Vec<u8>,
}

impl Canon {
    #[inline]
    pub(in crate::llm) fn new() -> Canon {
        let mut buf = CANON_BUF.with(std::cell::Cell::take);
        buf.clear();
        Canon { buf }
    }

    /// A fixed-size piece, stored inline.
    #[inline(always)]
    fn small<const N: usize>(&mut self, b: [u8; N]) {
        self.buf.extend_from_slice(&b);
    }

    #[inline(always)]
    pub(in crate::llm) fn tag(&mut self, t: u8) {
        self.buf.push(t);
    }

    /// A length (or count, or class index) in unsigned LEB128: one byte below 128, two below
    /// 16,384. A prefix-free code, so every piece stays self-delimiting.
    #[inline(always)]
    fn len(&mut self, n: usize) {
        if n < 0x80 {
            self.buf.push(n as u8);
        } else if n < 0x4000 {
            self.small([(n as u8) | 0x80, (n >> 7) as u8]);
        } else {
            self.leb(n as u64);
        }
    }

    /// LEB128 of a value of 16,384 or more.
    #[cold]
    #[inline(never)]
    fn leb(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.buf.push((v as u8) | 0x80);
            v >>= 7;
        }
        self.buf.push(v as u8);
    }

    /// A tag and a length, as one piece.
    #[inline(always)]
    fn tag_len(&mut self, t: u8, n: usize) {
        if n < 0x80 {
            self.small([t, n as u8]);
        } else if n < 0x4000 {
            self.small([t, (n as u8) | 0x80, (n >> 7) as u8]);
        } else {
            self.tag(t);
            self.leb(n as u64);
        }
    }

    /// Length-prefixed bytes.
    #[inline(always)]
    pub(in crate::llm) fn bytes(&mut self, b: &[u8]) {
        self.len(b.len());
        self.raw(b);
    }

    /// Tag-and-length-prefixed bytes.
    #[inline(always)]
    fn tagged(&mut self, t: u8, b: &[u8]) {
        self.tag_len(t, b.len());
        self.raw(b);
    }

    /// Bytes as they are.
    #[inline(always)]
    fn raw(&mut self, b: &[u8]) {
        self.buf.extend_from_slice(b);
    }

    #[inline]
    fn str(&mut self, s: &str) {
        self.bytes(s.as_bytes());
    }

    fn opt_str(&mut self, s: Option<&str>) {
        match s {
            None => self.tag(0),
            Some(s) => self.tagged(1, s.as_bytes()),
        }
    }

    fn opt_u64(&mut self, v: Option<u64>) {
        match v {
            None => self.tag(0),
            Some(v) => {
                self.tag(1);
                self.small(v.to_le_bytes());
            }
        }
    }

    fn value(&mut self, v: &Value) {
        match v {
            Value::Null => self.tag(0),
            Value::Bool(b) => self.small([1, u8::from(*b)]),
            Value::Number(n) => {
                // The number's exact value, typed: an integer and a float never collide (as
                // `1` and `1.0` differ in JSON), and no text is formatted.
                if let Some(u) = n.as_u64() {
                    self.tag(2);
                    self.small(u.to_le_bytes());
                } else if let Some(i) = n.as_i64() {
                    self.tag(11);
                    self.small(i.to_le_bytes());
                } else {
                    self.tag(12);
                    self.small(n.as_f64().unwrap_or(f64::NAN).to_bits().to_le_bytes());
                }
            }
            Value::String(s) => self.tagged(3, s.as_bytes()),
            Value::Array(a) => {
                self.tag_len(4, a.len());
                for x in a {
                    self.value(x);
                }
            }
            Value::Object(o) => self.object(o),
        }
    }

    /// An object, keys in sorted order (`serde_json::Map` is ordered by key).
    fn object(&mut self, o: &Map<String, Value>) {
        if o.is_empty() {
            // Most messages have no field beyond role and content: no walk to set up.
            self.small([5, 0]);
            return;
        }
        self.tag_len(5, o.len());
        for (k, v) in o {
            self.str(k);
            self.value(v);
        }
    }

    fn content(&mut self, c: &Content) {
        match c {
            // The same encoding as the JSON it came from.
            Content::Text(s) => self.tagged(3, s.as_bytes()),
            Content::Blocks(blocks) => {
                self.tag_len(4, blocks.len());
                for b in blocks {
                    self.value(b.json());
                }
            }
            Content::Other(v) => self.value(v),
        }
    }

    fn message(&mut self, m: &Message) {
        self.tagged(6, m.role.as_bytes());
        self.content(&m.content);
        self.object(&m.extra);
    }

    /// The XXH3-128 of everything written.
    pub(in crate::llm) fn finish(self) -> u128 {
        let h = xxh3_128(&self.buf);
        // Keep the buffer for the next key on this thread, unless it grew unusually large.
        if self.buf.capacity() <= KEEP {
            CANON_BUF.with(|c| c.set(self.buf));
        }
        h
    }

    pub(in crate::llm) fn partition(&mut self, scope: &str, class: Option<ClassId>) {
        self.str(scope);
        match class {
            None => self.tag(0),
            Some(c) => {
                self.tag(1);
                self.len(c.index());
            }
        }
    }

    pub(in crate::llm) fn request(&mut self, request: &LlmRequest) {
        self.tag(7);
        self.opt_str(request.model.as_deref());
        self.len(request.messages.len());
        for m in &request.messages {
            self.message(m);
        }
        match &request.system {
            None => self.tag(0),
            Some(c) => {
                self.tag(1);
                self.content(c);
            }
        }
        self.opt_u64(request.max_tokens);
        self.opt_u64(request.extra_input_tokens);
        self.object(&request.extra);
    }
}

#[cfg(test)]
#[path = "canon_tests.rs"]
mod tests;
