//! The encoding against a plain reference encoder (the one it was tuned from): the same bytes
//! in the same order, so the keys are those of the reference, and its injectivity argument
//! (every piece typed or length-prefixed) carries over. The reference's lengths changed
//! deliberately from 8 little-endian bytes to unsigned LEB128 (fewer bytes to hash; keys are
//! process-local, so no stored key is invalidated), and `lengths_are_unsigned_leb128` pins the
//! bytes of that code at its boundaries independently of the reference.

use super::*;
use xxhash_rust::xxh3::xxh3_128;

/// The reference encoder, kept as the oracle: one `Vec`, one push or extend per piece.
#[derive(Default)]
struct Reference(Vec<u8>);

impl Reference {
    fn tag(&mut self, t: u8) {
        self.0.push(t);
    }
    /// Unsigned LEB128, seven bits a byte, low bits first.
    fn len(&mut self, n: usize) {
        let mut v = n as u64;
        loop {
            let low = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                self.0.push(low);
                return;
            }
            self.0.push(low | 0x80);
        }
    }
    fn str(&mut self, s: &str) {
        self.len(s.len());
        self.0.extend_from_slice(s.as_bytes());
    }
    fn value(&mut self, v: &Value) {
        match v {
            Value::Null => self.tag(0),
            Value::Bool(b) => self.0.extend_from_slice(&[1, u8::from(*b)]),
            Value::Number(n) => {
                if let Some(u) = n.as_u64() {
                    self.tag(2);
                    self.0.extend_from_slice(&u.to_le_bytes());
                } else if let Some(i) = n.as_i64() {
                    self.tag(11);
                    self.0.extend_from_slice(&i.to_le_bytes());
                } else {
                    self.tag(12);
                    let f = n.as_f64().unwrap_or(f64::NAN).to_bits();
                    self.0.extend_from_slice(&f.to_le_bytes());
                }
            }
            Value::String(s) => {
                self.tag(3);
                self.str(s);
            }
            Value::Array(a) => {
                self.tag(4);
                self.len(a.len());
                a.iter().for_each(|x| self.value(x));
            }
            Value::Object(o) => self.object(o),
        }
    }
    fn object(&mut self, o: &Map<String, Value>) {
        self.tag(5);
        self.len(o.len());
        for (k, v) in o {
            self.str(k);
            self.value(v);
        }
    }
    fn content(&mut self, c: &Content) {
        match c {
            Content::Text(s) => {
                self.tag(3);
                self.str(s);
            }
            Content::Blocks(blocks) => {
                self.tag(4);
                self.len(blocks.len());
                blocks.iter().for_each(|b| self.value(b.json()));
            }
            Content::Other(v) => self.value(v),
        }
    }
    fn request(&mut self, r: &LlmRequest) {
        self.tag(7);
        match r.model.as_deref() {
            None => self.tag(0),
            Some(m) => {
                self.tag(1);
                self.str(m);
            }
        }
        self.len(r.messages.len());
        for m in &r.messages {
            self.tag(6);
            self.str(&m.role);
            self.content(&m.content);
            self.object(&m.extra);
        }
        match &r.system {
            None => self.tag(0),
            Some(c) => {
                self.tag(1);
                self.content(c);
            }
        }
        for v in [r.max_tokens, r.extra_input_tokens] {
            match v {
                None => self.tag(0),
                Some(v) => {
                    self.tag(1);
                    self.0.extend_from_slice(&v.to_le_bytes());
                }
            }
        }
        self.object(&r.extra);
    }
}

/// Requests with every kind of piece, short and long.
fn requests() -> Vec<LlmRequest> {
    let mut out = vec![LlmRequest::default(), LlmRequest::new("m", &["hi"])];
    for len in [
        0,
        1,
        64 - 1,
        64,
        64 + 1,
        127,
        128,
        200,
        255,
        256,
        257,
        511,
        1_000,
        5_000,
        16_383,
        16_384,
    ] {
        let text: String = "abcdefghij".repeat(len / 10 + 1)[..len].to_owned();
        let long_key = "k".repeat(len);
        let json = serde_json::json!({
            "model": "gpt-4o",
            "temperature": 0.2,
            "max_tokens": len,
            "seed": -3,
            "system": text,
            "messages": [
                {"role": "user", "content": text, "name": "n"},
                {"role": "assistant", "content": null},
                {"role": "user", "content": [{"type": "text", "text": text}, {"type": "image_url", "image_url": {"url": "u"}}]},
                {"role": "tool", "content": [1, true, null, [text.clone()]]},
            ],
            "metadata": {long_key: text, "flags": [false, 1.5, u64::MAX]},
        });
        out.push(serde_json::from_value(json).unwrap());
    }
    out
}

#[test]
fn the_encoding_is_the_reference_encoding() {
    for r in requests() {
        let mut reference = Reference::default();
        reference.request(&r);
        let mut c = Canon::new();
        c.request(&r);
        assert_eq!(c.encoded(), reference.0);
        let mut c = Canon::new();
        c.request(&r);
        assert_eq!(c.finish(), xxh3_128(&reference.0));
    }
}

#[test]
fn partitions_and_bytes_match_the_reference() {
    for scope in ["", "t", &"s".repeat(64), &"s".repeat(300)] {
        for class in [
            None,
            Some(ClassId::new(crate::vocab::class::ClassOwner::MIN, 0)),
            Some(ClassId::new(crate::vocab::class::ClassOwner::MIN, 3)),
        ] {
            let mut reference = Reference::default();
            reference.tag(10);
            reference.str(scope);
            match class {
                None => reference.tag(0),
                Some(c) => {
                    reference.tag(1);
                    reference.len(c.index());
                }
            }
            let mut c = Canon::new();
            c.tag(10);
            c.partition(scope, class);
            assert_eq!(c.finish(), xxh3_128(&reference.0));
        }
    }
}

#[test]
fn lengths_are_unsigned_leb128() {
    for (n, bytes) in [
        (0usize, &[0u8][..]),
        (127, &[0x7f]),
        (128, &[0x80, 0x01]),
        (300, &[0xac, 0x02]),
        (16_383, &[0xff, 0x7f]),
        (16_384, &[0x80, 0x80, 0x01]),
        (
            u64::MAX as usize,
            &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01],
        ),
    ] {
        let mut c = Canon::new();
        c.pos = c.len(0, n);
        assert_eq!(c.encoded(), bytes, "{n}");
        let mut c = Canon::new();
        c.pos = c.tag_len(0, 9, n);
        assert_eq!(c.encoded()[0], 9);
        assert_eq!(&c.encoded()[1..], bytes, "{n}");
    }
}

#[test]
fn short_and_long_bytes_are_copied_exactly() {
    // Every size class of `raw` (1-3, 4-7, 8-16 and longer), each byte distinct.
    let all: Vec<u8> = (1..=64u8).collect();
    for n in 0..=all.len() {
        let mut c = Canon::new();
        c.bytes(&all[..n]);
        let mut reference = Reference::default();
        reference.len(n);
        reference.0.extend_from_slice(&all[..n]);
        assert_eq!(c.encoded(), reference.0, "{n}");
    }
}
