//! Chat requests in the shapes gateways already receive (OpenAI and Anthropic): a model,
//! messages whose content is a string or an array of content blocks, an optional system prompt
//! (string or blocks), `max_tokens`, and an optional count of extra input tokens.
//!
//! Unknown fields are tolerated and kept (in `extra`), so that a request can be passed on and
//! hashed whole. Characters are counted as the reference library counts them: UTF-16 code units.
//!
//! Errors name the field and what it must be, never its value (nor a slice of it): gateways log
//! them, and a request may carry secrets.

use super::estimate::{tally_json, EstimateError};
use serde::de::{self, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::fmt;

/// The UTF-16 length of `s`: what JavaScript's `.length` returns, and so what the reference
/// library counts as characters.
///
/// ```
/// assert_eq!(llm_bulkhead::llm::utf16_len("😀😀😀😀é"), 9);
/// ```
#[must_use]
pub fn utf16_len(s: &str) -> u64 {
    // Every char is one UTF-16 unit, except those outside the BMP (4-byte UTF-8, lead byte
    // ≥ 0xF0), which are two. So count the bytes that start a char (not `0b10xx_xxxx`) plus
    // the 4-byte lead bytes, with byte-wide counters over chunks of 127 bytes (at most 254 per
    // chunk): a loop the compiler vectorises, unlike `encode_utf16().count()`.
    if s.is_ascii() {
        return s.len() as u64;
    }
    s.as_bytes()
        .chunks(127)
        .map(|chunk| {
            let mut n: u8 = 0;
            for &b in chunk {
                n += u8::from((b as i8) >= -0x40) + u8::from(b >= 0xF0);
            }
            u64::from(n)
        })
        .sum()
}

/// One content block (`{"type": "text", "text": "…"}`, `{"type": "image", …}`, …).
///
/// The JSON is kept as it came (so the block can be forwarded and hashed whole); its `type` and,
/// for a well-formed text block, its text are extracted once when it is made, so estimating
/// reads fields instead of searching the JSON.
///
/// ```
/// use llm_bulkhead::llm::ContentBlock;
/// let b = ContentBlock::from_text("hello");
/// assert_eq!((b.kind(), b.text()), (Some("text"), Some("hello")));
/// let img = ContentBlock::of_type("image");
/// assert_eq!((img.kind(), img.text()), (Some("image"), None));
/// let malformed = ContentBlock::from_json(serde_json::json!({"type": "text", "text": 123}));
/// assert_eq!((malformed.kind(), malformed.text()), (Some("text"), None));
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct ContentBlock {
    json: Value,
    kind: Option<String>,
    text: Option<String>,
}

impl ContentBlock {
    /// A block from its JSON.
    pub fn from_json(json: Value) -> ContentBlock {
        let kind = json.get("type").and_then(Value::as_str).map(str::to_owned);
        let text = match kind.as_deref() {
            Some("text") => json.get("text").and_then(Value::as_str).map(str::to_owned),
            _ => None,
        };
        ContentBlock { json, kind, text }
    }

    /// A well-formed text block.
    pub fn from_text(text: impl Into<String>) -> ContentBlock {
        let text = text.into();
        let mut m = Map::new();
        m.insert("type".into(), Value::from("text"));
        m.insert("text".into(), Value::from(text.clone()));
        ContentBlock {
            json: Value::Object(m),
            kind: Some("text".into()),
            text: Some(text),
        }
    }

    /// A block of another type (image, document, audio, …) with no other fields.
    #[must_use]
    pub fn of_type(kind: &str) -> ContentBlock {
        let mut m = Map::new();
        m.insert("type".into(), Value::from(kind));
        ContentBlock {
            json: Value::Object(m),
            kind: Some(kind.to_owned()),
            text: None,
        }
    }

    /// The block's JSON, as given.
    #[must_use]
    pub fn json(&self) -> &Value {
        &self.json
    }

    /// The block's `type`, when it is a string.
    #[must_use]
    pub fn kind(&self) -> Option<&str> {
        self.kind.as_deref()
    }

    /// The text of a well-formed text block (`type` is `"text"` and `text` is a string);
    /// `None` for every other block, malformed text blocks included.
    #[must_use]
    pub fn text(&self) -> Option<&str> {
        self.text.as_deref()
    }
}

impl Serialize for ContentBlock {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.json.serialize(s)
    }
}

impl<'de> Deserialize<'de> for ContentBlock {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Value::deserialize(d).map(ContentBlock::from_json)
    }
}

/// Message or system content: a string, or an array of blocks.
///
/// ```
/// use llm_bulkhead::llm::{Content, ContentBlock};
/// assert_eq!(Content::from("héllo").text_len(), 5);
/// let blocks = Content::Blocks(vec![ContentBlock::from_text("ab"), ContentBlock::of_type("image")]);
/// assert_eq!(blocks.text_len(), 2);
/// ```
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Content {
    /// Plain text.
    Text(String),
    /// Content blocks.
    Blocks(Vec<ContentBlock>),
    /// Anything else (`null`, as OpenAI sends for tool-call-only assistant messages, or an
    /// unexpected shape): no characters and no blocks.
    Other(Value),
}

/// A string, an array of blocks, or any other value, read in place (serde's untagged enums
/// would buffer the whole value first).
impl<'de> Deserialize<'de> for Content {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Content;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string or an array of content blocks")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Content, E> {
                Ok(Content::Text(s.to_owned()))
            }
            fn visit_string<E: de::Error>(self, s: String) -> Result<Content, E> {
                Ok(Content::Text(s))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Content, A::Error> {
                let mut blocks = Vec::new();
                while let Some(b) = seq.next_element()? {
                    blocks.push(b);
                }
                Ok(Content::Blocks(blocks))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Content, A::Error> {
                Value::deserialize(de::value::MapAccessDeserializer::new(map)).map(Content::Other)
            }
            fn visit_unit<E: de::Error>(self) -> Result<Content, E> {
                Ok(Content::Other(Value::Null))
            }
            fn visit_none<E: de::Error>(self) -> Result<Content, E> {
                Ok(Content::Other(Value::Null))
            }
            fn visit_some<D: serde::Deserializer<'de>>(self, d: D) -> Result<Content, D::Error> {
                d.deserialize_any(self)
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<Content, E> {
                Ok(Content::Other(Value::from(v)))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Content, E> {
                Ok(Content::Other(Value::from(v)))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Content, E> {
                Ok(Content::Other(Value::from(v)))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Content, E> {
                Ok(Content::Other(Value::from(v)))
            }
        }
        d.deserialize_any(V)
    }
}

impl From<&str> for Content {
    fn from(s: &str) -> Content {
        Content::Text(s.to_owned())
    }
}

impl Content {
    /// Characters of text (UTF-16 code units): the string, or the sum over well-formed text
    /// blocks. Every other block counts 0.
    pub fn text_len(&self) -> u64 {
        match self {
            Content::Text(s) => utf16_len(s),
            Content::Blocks(b) => b.iter().filter_map(ContentBlock::text).map(utf16_len).sum(),
            Content::Other(_) => 0,
        }
    }

    /// The blocks that are not well-formed text blocks (the "opaque" ones: images, documents,
    /// audio, malformed text). String content has none.
    pub fn opaque_blocks(&self) -> impl Iterator<Item = &ContentBlock> {
        let blocks: &[ContentBlock] = match self {
            Content::Blocks(b) => b,
            _ => &[],
        };
        blocks.iter().filter(|b| b.text().is_none())
    }
}

/// One chat message.
///
/// ```
/// use llm_bulkhead::llm::Message;
/// let m = Message::user("hi");
/// assert_eq!(m.role, "user");
/// ```
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Message {
    /// `user`, `assistant`, `system`, `tool`, …
    pub role: String,
    /// The content (`null` when absent).
    pub content: Content,
    /// Every other field, kept as given.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// The fields of a message: `role` (a string), `content`, the rest kept; read in place (serde's
/// `flatten` would buffer the whole message first).
impl<'de> Deserialize<'de> for Message {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Message;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a message object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Message, A::Error> {
                let mut m = Message {
                    role: String::new(),
                    content: Content::Other(Value::Null),
                    extra: Map::new(),
                };
                let (mut role, mut content) = (false, false);
                while let Some(k) = map.next_key::<String>()? {
                    match k.as_str() {
                        "role" if !role => {
                            role = true;
                            m.role = map
                                .next_value::<Option<Text>>()?
                                .map(|t| t.0)
                                .unwrap_or_default();
                        }
                        "content" if !content => {
                            content = true;
                            m.content = map.next_value()?;
                        }
                        "role" | "content" => {
                            return Err(de::Error::custom(format!("duplicate field `{k}`")))
                        }
                        _ => {
                            m.extra.insert(k, map.next_value()?);
                        }
                    }
                }
                Ok(m)
            }
        }
        d.deserialize_map(V)
    }
}

/// A string field, refused without quoting what it was.
struct Text(String);

impl<'de> Deserialize<'de> for Text {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Text;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Text, E> {
                Ok(Text(s.to_owned()))
            }
            fn visit_string<E: de::Error>(self, s: String) -> Result<Text, E> {
                Ok(Text(s))
            }
        }
        d.deserialize_string(V)
    }
}

impl Message {
    /// A user message with string content.
    #[must_use]
    pub fn user(text: &str) -> Message {
        Message {
            role: "user".into(),
            content: Content::from(text),
            extra: Map::new(),
        }
    }
}

/// A chat request as a gateway receives it (OpenAI chat completions, OpenAI Responses, or
/// Anthropic messages).
///
/// `max_tokens` is the request's `max_tokens`; `max_completion_tokens` and the Responses API's
/// `max_output_tokens` stay in `extra` as sent (o-series models refuse `max_tokens`, so a
/// round trip must not rename it), and a request with both `max_tokens` and
/// `max_completion_tokens` is refused, naming both. `extra_input_tokens` (also
/// `extraInputTokens`) adds input tokens the body does not show (a cached prefix, …). Negative
/// or fractional token counts are refused with the field's name. Every other field is kept in
/// `extra`, and the estimators read it.
///
/// ```
/// use llm_bulkhead::llm::LlmRequest;
/// let openai: LlmRequest = serde_json::from_str(r#"{"model": "o3", "temperature": 0.2,
///     "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
///     "max_completion_tokens": 256}"#).unwrap();
/// assert_eq!((openai.max_tokens, openai.text_len()), (None, 11));
/// assert_eq!(openai.extra["max_completion_tokens"], 256);
/// assert!(serde_json::to_string(&openai).unwrap().contains(r#""max_completion_tokens":256"#));
///
/// let bad = serde_json::from_str::<LlmRequest>(r#"{"messages": [], "max_tokens": -1}"#);
/// assert!(bad.unwrap_err().to_string().contains("max_tokens"));
/// let both = serde_json::from_str::<LlmRequest>(r#"{"max_tokens": 1, "max_completion_tokens": 2}"#);
/// assert!(both.unwrap_err().to_string().contains("both max_tokens and max_completion_tokens"));
/// ```
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct LlmRequest {
    /// The model, if the request names one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// The messages.
    pub messages: Vec<Message>,
    /// Anthropic-style top-level system prompt.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub system: Option<Content>,
    /// The output cap the caller asked for (`max_tokens`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u64>,
    /// Input tokens to add to the estimate.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub extra_input_tokens: Option<u64>,
    /// Every other field, kept as given.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// The request's fields, read in place (serde's `flatten` would buffer the whole body first).
impl<'de> Deserialize<'de> for LlmRequest {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = LlmRequest;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a request object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<LlmRequest, A::Error> {
                let mut r = LlmRequest::default();
                let mut seen = [false; 5];
                while let Some(k) = map.next_key::<String>()? {
                    let field = match k.as_str() {
                        "model" => 0,
                        "messages" => 1,
                        "system" => 2,
                        "max_tokens" => 3,
                        "extra_input_tokens" | "extraInputTokens" => 4,
                        _ => {
                            let v: Value = map.next_value()?;
                            if k == "max_completion_tokens" || k == "max_output_tokens" {
                                count(&k, &v)?;
                            }
                            r.extra.insert(k, v);
                            continue;
                        }
                    };
                    if std::mem::replace(&mut seen[field], true) {
                        return Err(de::Error::custom(format!("duplicate field `{k}`")));
                    }
                    match field {
                        0 => r.model = map.next_value::<Option<Text>>()?.map(|t| t.0),
                        1 => r.messages = map.next_value::<Option<_>>()?.unwrap_or_default(),
                        2 => r.system = map.next_value()?,
                        3 => r.max_tokens = count("max_tokens", &map.next_value()?)?,
                        _ => {
                            r.extra_input_tokens = count("extra_input_tokens", &map.next_value()?)?
                        }
                    }
                }
                if r.max_tokens.is_some() && r.extra.contains_key("max_completion_tokens") {
                    return Err(de::Error::custom(EstimateError::ConflictingFields {
                        fields: ["max_tokens", "max_completion_tokens"],
                    }));
                }
                Ok(r)
            }
        }
        d.deserialize_map(V)
    }
}

/// A token count: a non-negative integer or null; refused without quoting the value.
fn count<E: de::Error>(field: &str, v: &Value) -> Result<Option<u64>, E> {
    match v {
        Value::Null => Ok(None),
        v => v.as_u64().map(Some).ok_or_else(|| {
            E::custom(format!(
                "invalid value: field `{field}` must be a non-negative integer"
            ))
        }),
    }
}

/// A serde_json error's message without the value it may quote: serde's "invalid type" and
/// "invalid value" messages keep what was found (`string`, `integer`, `map`, …) and what was
/// expected; any other message is cut at its first quote; at most 200 bytes.
pub(crate) fn scrub(e: &serde_json::Error) -> String {
    let full = e.to_string();
    let at = format!(" at line {} column {}", e.line(), e.column());
    let msg = full.strip_suffix(at.as_str()).unwrap_or(&full);
    let mut out = String::new();
    for prefix in ["invalid type: ", "invalid value: "] {
        if let Some(rest) = msg.strip_prefix(prefix) {
            let found = rest.split(['"', '`', ',']).next().unwrap_or("").trim_end();
            // The value comes before serde's own ", expected": the last one is serde's.
            let expected = rest.rfind(", expected ").map_or("", |i| &rest[i..]);
            out = format!("{prefix}{found}{expected}");
        }
    }
    if out.is_empty() {
        out = msg
            .split(['"', '`'])
            .next()
            .unwrap_or("")
            .trim_end()
            .to_owned();
    }
    if out.len() > 200 {
        let mut end = 200;
        while !out.is_char_boundary(end) {
            end -= 1;
        }
        out.truncate(end);
    }
    out
}

impl LlmRequest {
    /// Parses a JSON request body, with errors that name the field and never quote the body,
    /// and a limit on its parts checked before anything is materialised.
    ///
    /// # Errors
    /// [`EstimateError::InvalidJson`] (syntax, or a field of the wrong type),
    /// [`EstimateError::InvalidField`], [`EstimateError::ConflictingFields`], or
    /// [`EstimateError::TooManyParts`] for more than `max_parts` objects.
    ///
    /// ```
    /// use llm_bulkhead::llm::{EstimateError, LlmRequest};
    /// let e = LlmRequest::from_json(br#"{"max_tokens": "my password is hunter2"}"#, 100).unwrap_err();
    /// assert_eq!(e.to_string(), "field `max_tokens` must be a non-negative integer");
    /// let e = LlmRequest::from_json(br#"{"messages": "my password is hunter2"}"#, 100).unwrap_err();
    /// assert!(!e.to_string().contains("hunter2"), "{e}");
    /// let many = format!(r#"{{"messages": [{}]}}"#, vec![r#"{"content": "x"}"#; 10].join(","));
    /// assert_eq!(LlmRequest::from_json(many.as_bytes(), 5).unwrap_err(), EstimateError::TooManyParts { limit: 5 });
    /// ```
    pub fn from_json(body: &[u8], max_parts: u64) -> Result<LlmRequest, EstimateError> {
        // The streaming walk checks syntax, counts and the parts limit without materialising.
        tally_json(body, max_parts)?;
        let mut de = serde_json::Deserializer::from_slice(body);
        serde_path_to_error::deserialize(&mut de).map_err(|e| {
            let path = e.path().to_string();
            let inner = e.into_inner();
            let mut problem = scrub(&inner);
            if path != "." && path.len() <= 100 {
                problem = format!("{path}: {problem}");
            }
            EstimateError::InvalidJson {
                line: inner.line(),
                column: inner.column(),
                problem,
            }
        })
    }

    /// A request with the given model and user messages and nothing else.
    ///
    /// ```
    /// # use llm_bulkhead::llm::LlmRequest;
    /// let r = LlmRequest::new("gpt-4o", &["hello", "world"]);
    /// assert_eq!(r.text_len(), 10);
    /// ```
    #[must_use]
    pub fn new(model: &str, user_messages: &[&str]) -> LlmRequest {
        LlmRequest {
            model: Some(model.to_owned()),
            messages: user_messages.iter().map(|m| Message::user(m)).collect(),
            ..LlmRequest::default()
        }
    }

    /// Characters of text in the messages and the system prompt (UTF-16 code units).
    pub fn text_len(&self) -> u64 {
        let messages: u64 = self.messages.iter().map(|m| m.content.text_len()).sum();
        messages + self.system.as_ref().map_or(0, Content::text_len)
    }

    /// Every opaque (non-text) block of the messages and of a block-array system prompt.
    pub fn opaque_blocks(&self) -> impl Iterator<Item = &ContentBlock> {
        self.messages
            .iter()
            .map(|m| &m.content)
            .chain(self.system.as_ref())
            .flat_map(Content::opaque_blocks)
    }
}
