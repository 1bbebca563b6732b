//! Measuring a request: every part a provider counts, in one pass, from the JSON body as it
//! streams through the parser (nothing materialised: strings are borrowed or pass through the
//! parser's scratch buffer) or from a parsed [`LlmRequest`] (the same walk over its values).
//!
//! What is counted: every string (message and system text, tool definitions, tool calls and
//! their arguments, tool results, documents, Responses API `input`, `instructions` and
//! `prompt`, unknown fields and content-part types) by the bound of [`text`](super::text); every
//! object key below the request's top level; each object entry, number and boolean; each
//! message and tool (a fixed overhead each); images by their provider's formula instead of their
//! data. Skipped: the request's own settings the model never reads (`temperature`, `stream`,
//! `metadata`, …: [`SETTINGS`]).

use super::image::{self, ImageCost};
use super::text::{self, UNIT};
use crate::llm::request::{Content, LlmRequest};
use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::Value;
use std::fmt;

/// Top-level fields that set how the provider runs and are never shown to the model.
pub(crate) const SETTINGS: &[&str] = &[
    "stream",
    "stream_options",
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "user",
    "metadata",
    "store",
    "service_tier",
    "parallel_tool_calls",
    "logprobs",
    "top_logprobs",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
    "reasoning_effort",
    "reasoning",
    "previous_response_id",
    "truncation",
    "include",
    "background",
    "prompt_cache_key",
    "safety_identifier",
    "modalities",
    "verbosity",
];

/// The content-part types that are images (Anthropic, OpenAI chat, OpenAI Responses).
pub(crate) const IMAGE_KINDS: [&str; 3] = ["image", "image_url", "input_image"];

/// The output-side fields read from a request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Outputs {
    pub max_tokens: Option<u64>,
    pub max_completion_tokens: Option<u64>,
    pub max_output_tokens: Option<u64>,
    pub n: Option<u64>,
    pub thinking_budget: Option<u64>,
    pub extra_input: Option<u64>,
}

/// Why a walk stopped, beyond a parse error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stop {
    /// More objects than the limit.
    TooManyParts,
    /// `max_tokens` and `max_completion_tokens` both given.
    BothMaxTokens,
    /// A number field is not a non-negative integer.
    NotACount(&'static str),
}

/// What a walk found.
#[derive(Debug)]
pub(crate) struct Tally {
    /// The text bound, in [`UNIT`]s.
    pub units: u64,
    /// UTF-16 code units of the counted text.
    pub chars: u64,
    /// Messages (chat `messages`, Responses `input` items).
    pub messages: u64,
    /// Tools (`tools`, `functions`).
    pub tools: u64,
    /// Objects seen.
    pub parts: u64,
    /// The most objects allowed.
    pub max_parts: u64,
    /// The images, by their type ([`IMAGE_KINDS`]).
    pub images: [ImageCost; 3],
    /// The model named by a JSON body (a parsed request keeps its own).
    pub model: Option<String>,
    /// Output-side fields.
    pub out: Outputs,
    /// Set when the walk stopped for one of our reasons.
    pub stop: Option<Stop>,
}

impl Tally {
    pub(crate) fn new(max_parts: u64) -> Tally {
        Tally {
            units: 0,
            chars: 0,
            messages: 0,
            tools: 0,
            parts: 0,
            max_parts,
            images: [ImageCost::default(); 3],
            model: None,
            out: Outputs::default(),
            stop: None,
        }
    }

    #[inline]
    fn text(&mut self, s: &str) {
        let (units, chars) = text::measure(s);
        self.units += units;
        self.chars += chars;
    }

    /// A message's role: a short one (`assistant` is 2.7 by the bound) is in the message
    /// overhead; a longer one is not free.
    #[inline]
    fn role(&mut self, s: &str) {
        self.units += text::measure(s).0.saturating_sub(3 * UNIT);
    }

    fn part<E: de::Error>(&mut self) -> Result<(), E> {
        self.parts += 1;
        if self.parts > self.max_parts {
            return Err(self.stop(Stop::TooManyParts));
        }
        Ok(())
    }

    fn stop<E: de::Error>(&mut self, why: Stop) -> E {
        self.stop = Some(why);
        E::custom(match why {
            Stop::TooManyParts => "too many parts",
            Stop::BothMaxTokens => "both max_tokens and max_completion_tokens",
            Stop::NotACount(_) => "not a count",
        })
    }

    /// Walks a JSON body.
    pub(crate) fn of_json(body: &[u8], max_parts: u64) -> (Tally, Result<(), serde_json::Error>) {
        let mut t = Tally::new(max_parts);
        let mut de = serde_json::Deserializer::from_slice(body);
        let r = (&mut de)
            .deserialize_map(TopVisitor { t: &mut t })
            .and_then(|()| de.end());
        (t, r)
    }

    /// Walks a parsed request. Its typed fields are read directly, the rest through the same
    /// walk as a body's.
    pub(crate) fn of_request(r: &LlmRequest, max_parts: u64) -> Result<Tally, Stop> {
        let mut t = Tally::new(max_parts);
        let res: Result<(), serde_json::Error> = (|| {
            t.part()?;
            for m in &r.messages {
                t.messages += 1;
                t.part()?;
                t.role(&m.role);
                content(&mut t, &m.content)?;
                for (k, v) in &m.extra {
                    t.text(k);
                    t.units += UNIT;
                    Any::plain(&mut t).deserialize(v)?;
                }
            }
            if let Some(s) = &r.system {
                content(&mut t, s)?;
            }
            t.out.max_tokens = r.max_tokens;
            t.out.extra_input = r.extra_input_tokens;
            for (k, v) in &r.extra {
                top_field(&mut t, top_key(k), Some(k), v)?;
            }
            Ok(())
        })();
        match (res, t.stop) {
            (_, Some(stop)) => Err(stop),
            (Err(_), None) => Err(Stop::NotACount("request")),
            (Ok(()), None) => Ok(t),
        }
    }
}

/// Message or system content of a parsed request: as its JSON would be walked.
fn content(t: &mut Tally, c: &Content) -> Result<(), serde_json::Error> {
    match c {
        Content::Text(s) => t.text(s),
        Content::Blocks(blocks) => {
            for b in blocks {
                Any::plain(t).deserialize(b.json())?;
            }
        }
        Content::Other(Value::Null) => {}
        Content::Other(v) => {
            Any::plain(t).deserialize(v)?;
        }
    }
    Ok(())
}

/// A top-level field, by what the walk does with it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Top {
    Model,
    Count(&'static str),
    Thinking,
    Messages,
    Tools,
    Setting,
    Content,
    Other,
}

fn top_key(k: &str) -> Top {
    match k {
        "model" => Top::Model,
        "max_tokens" => Top::Count("max_tokens"),
        "max_completion_tokens" => Top::Count("max_completion_tokens"),
        "max_output_tokens" => Top::Count("max_output_tokens"),
        "n" => Top::Count("n"),
        "extra_input_tokens" | "extraInputTokens" => Top::Count("extra_input_tokens"),
        "thinking" => Top::Thinking,
        "messages" | "input" => Top::Messages,
        "tools" | "functions" => Top::Tools,
        "system" => Top::Content,
        k if SETTINGS.contains(&k) => Top::Setting,
        _ => Top::Other,
    }
}

/// One top-level field's value.
fn top_field<'de, D: Deserializer<'de>>(
    t: &mut Tally,
    key: Top,
    name: Option<&str>,
    d: D,
) -> Result<(), D::Error> {
    match key {
        Top::Model => {
            t.model = d.deserialize_any(ModelVisitor)?;
        }
        Top::Count(field) => {
            let v = d.deserialize_any(Count { t: &mut *t, field })?;
            let slot = match field {
                "max_tokens" => &mut t.out.max_tokens,
                "max_completion_tokens" => &mut t.out.max_completion_tokens,
                "max_output_tokens" => &mut t.out.max_output_tokens,
                "n" => &mut t.out.n,
                _ => &mut t.out.extra_input,
            };
            *slot = v;
            if t.out.max_tokens.is_some() && t.out.max_completion_tokens.is_some() {
                return Err(t.stop(Stop::BothMaxTokens));
            }
        }
        Top::Thinking => {
            t.out.thinking_budget = d.deserialize_any(Thinking { t: &mut *t })?;
        }
        Top::Messages => {
            d.deserialize_any(List { t, messages: true })?;
        }
        Top::Tools => {
            d.deserialize_any(List { t, messages: false })?;
        }
        Top::Setting => {
            d.deserialize_ignored_any(IgnoredAny)?;
        }
        Top::Content => {
            Any {
                t,
                slot: Slot::Null,
            }
            .deserialize(d)?;
        }
        Top::Other => {
            // An unknown field: its name (unless the key seed counted it) and its value.
            if let Some(name) = name {
                t.text(name);
            }
            Any::plain(t).deserialize(d)?;
        }
    }
    Ok(())
}

/// The request object.
struct TopVisitor<'t> {
    t: &'t mut Tally,
}

impl<'de> Visitor<'de> for TopVisitor<'_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a request object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        self.t.part()?;
        while let Some(key) = map.next_key_seed(TopKeySeed { t: &mut *self.t })? {
            map.next_value_seed(TopValueSeed {
                t: &mut *self.t,
                key,
            })?;
        }
        Ok(())
    }
}

/// A top-level key: classified, and its name counted when it is unknown.
struct TopKeySeed<'t> {
    t: &'t mut Tally,
}

impl<'de> DeserializeSeed<'de> for TopKeySeed<'_> {
    type Value = Top;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Top, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for TopKeySeed<'_> {
    type Value = Top;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a field name")
    }
    fn visit_str<E: de::Error>(self, k: &str) -> Result<Top, E> {
        let key = top_key(k);
        if key == Top::Other {
            self.t.text(k);
        }
        Ok(key)
    }
}

struct TopValueSeed<'t> {
    t: &'t mut Tally,
    key: Top,
}

impl<'de> DeserializeSeed<'de> for TopValueSeed<'_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        // An unknown key's name was counted by the key seed.
        top_field(self.t, self.key, None, d)
    }
}

/// `model`: a string (kept) or null.
struct ModelVisitor;

impl<'de> Visitor<'de> for ModelVisitor {
    type Value = Option<String>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string")
    }
    fn visit_str<E: de::Error>(self, s: &str) -> Result<Self::Value, E> {
        Ok(Some(s.to_owned()))
    }
    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
        Err(E::custom(
            "field `model`: expected a string, found a boolean",
        ))
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
        Err(E::custom(
            "field `model`: expected a string, found a number",
        ))
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
        Err(E::custom(
            "field `model`: expected a string, found a number",
        ))
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
        Err(E::custom(
            "field `model`: expected a string, found a number",
        ))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, _: A) -> Result<Self::Value, A::Error> {
        Err(de::Error::custom(
            "field `model`: expected a string, found an array",
        ))
    }
    fn visit_map<A: MapAccess<'de>>(self, _: A) -> Result<Self::Value, A::Error> {
        Err(de::Error::custom(
            "field `model`: expected a string, found an object",
        ))
    }
}

/// A token count: a non-negative integer, or null.
struct Count<'t> {
    t: &'t mut Tally,
    field: &'static str,
}

impl Count<'_> {
    fn refuse<E: de::Error>(self) -> E {
        self.t.stop(Stop::NotACount(self.field))
    }
}

impl<'de> Visitor<'de> for Count<'_> {
    type Value = Option<u64>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a non-negative integer")
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
        Ok(Some(v))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
        u64::try_from(v).map(Some).map_err(|_| self.refuse())
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
        Err(self.refuse())
    }
    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
        Err(self.refuse())
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
        Err(self.refuse())
    }
    fn visit_seq<A: SeqAccess<'de>>(self, _: A) -> Result<Self::Value, A::Error> {
        Err(self.refuse())
    }
    fn visit_map<A: MapAccess<'de>>(self, _: A) -> Result<Self::Value, A::Error> {
        Err(self.refuse())
    }
}

/// `thinking`: `{"type": "enabled", "budget_tokens": N}`; only the budget is read.
struct Thinking<'t> {
    t: &'t mut Tally,
}

impl<'de> Visitor<'de> for Thinking<'_> {
    type Value = Option<u64>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut budget = None;
        while let Some(k) = map.next_key::<KeyName>()? {
            if k.0 {
                budget = map.next_value_seed(CountSeed {
                    t: &mut *self.t,
                    field: "thinking.budget_tokens",
                })?;
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(budget)
    }
    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
    // Anything else (a string such as "enabled") carries no budget; it is not shown to the
    // model either.
    fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(None)
    }
}

/// Whether a key is `budget_tokens`.
struct KeyName(bool);

impl<'de> de::Deserialize<'de> for KeyName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = KeyName;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a field name")
            }
            fn visit_str<E: de::Error>(self, k: &str) -> Result<KeyName, E> {
                Ok(KeyName(k == "budget_tokens"))
            }
        }
        d.deserialize_str(V)
    }
}

struct CountSeed<'t> {
    t: &'t mut Tally,
    field: &'static str,
}

impl<'de> DeserializeSeed<'de> for CountSeed<'_> {
    type Value = Option<u64>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Option<u64>, D::Error> {
        d.deserialize_any(Count {
            t: self.t,
            field: self.field,
        })
    }
}

/// `messages`/`input` (each element a message) or `tools`/`functions` (each a tool); a string
/// `input` is text.
struct List<'t> {
    t: &'t mut Tally,
    messages: bool,
}

impl<'de> Visitor<'de> for List<'_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an array")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        loop {
            if self.messages {
                self.t.messages += 1;
            } else {
                self.t.tools += 1;
            }
            let seed = Any::plain(&mut *self.t);
            if seq.next_element_seed(seed)?.is_none() {
                break;
            }
        }
        // The loop counted one past the last element.
        if self.messages {
            self.t.messages -= 1;
        } else {
            self.t.tools -= 1;
        }
        Ok(())
    }
    fn visit_str<E: de::Error>(self, s: &str) -> Result<(), E> {
        self.t.text(s);
        Ok(())
    }
    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<(), E> {
        Any::plain(self.t).visit_bool(v).map(drop)
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<(), E> {
        Any::plain(self.t).visit_u64(v).map(drop)
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<(), E> {
        Any::plain(self.t).visit_i64(v).map(drop)
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<(), E> {
        Any::plain(self.t).visit_f64(v).map(drop)
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<(), A::Error> {
        Any::plain(self.t).visit_map(map).map(drop)
    }
}

/// What a string means where it sits.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Slot {
    Plain,
    /// A `type`: an image's kind?
    Kind,
    /// `data`, `url`, `image_url`: inline image data?
    Data,
    /// `detail`: `"low"`?
    Detail,
    /// A message's `content`: its key is part of the message overhead, and null is no content.
    Null,
    /// A message's `role`: its key is part of the message overhead.
    Role,
}

/// What a value tells its enclosing object about images.
#[derive(Clone, Copy, Default)]
struct Node {
    /// An image type, by its index in [`IMAGE_KINDS`].
    image: Option<usize>,
    dims: Option<(u32, u32)>,
    low: bool,
}

impl Node {
    fn merge(&mut self, o: Node) {
        self.image = self.image.or(o.image);
        self.dims = self.dims.or(o.dims);
        self.low |= o.low;
    }
}

/// Any JSON value, counted.
struct Any<'t> {
    t: &'t mut Tally,
    slot: Slot,
}

impl<'t> Any<'t> {
    fn plain(t: &'t mut Tally) -> Self {
        Any {
            t,
            slot: Slot::Plain,
        }
    }
}

impl<'de> DeserializeSeed<'de> for Any<'_> {
    type Value = Node;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Node, D::Error> {
        d.deserialize_any(self)
    }
}

/// The digits of `v`, by groups of three: a token each.
fn digit_tokens(v: u64) -> u64 {
    let digits = v.checked_ilog10().unwrap_or(0) + 1;
    u64::from(digits.div_ceil(3))
}

impl<'de> Visitor<'de> for Any<'_> {
    type Value = Node;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_str<E: de::Error>(self, s: &str) -> Result<Node, E> {
        if self.slot == Slot::Role {
            self.t.role(s);
        } else {
            self.t.text(s);
        }
        Ok(match self.slot {
            Slot::Kind => Node {
                image: IMAGE_KINDS.iter().position(|k| *k == s),
                ..Node::default()
            },
            Slot::Data if s.len() >= 16 => Node {
                dims: image::dims(s),
                ..Node::default()
            },
            Slot::Detail => Node {
                low: s == "low",
                ..Node::default()
            },
            _ => Node::default(),
        })
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Node, E> {
        self.t.units += digit_tokens(v) * UNIT;
        Ok(Node::default())
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Node, E> {
        self.t.units += (digit_tokens(v.unsigned_abs()) + 1) * UNIT;
        Ok(Node::default())
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Node, E> {
        // At most 17 significant digits, a point, a sign and an exponent.
        self.t.units += 8 * UNIT;
        Ok(Node::default())
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Node, E> {
        self.t.units += UNIT;
        Ok(Node::default())
    }
    fn visit_unit<E: de::Error>(self) -> Result<Node, E> {
        if self.slot != Slot::Null {
            self.t.units += UNIT;
        }
        Ok(Node::default())
    }
    fn visit_none<E: de::Error>(self) -> Result<Node, E> {
        self.visit_unit()
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Node, D::Error> {
        d.deserialize_any(self)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Node, A::Error> {
        let mut node = Node::default();
        while let Some(n) = seq.next_element_seed(Any::plain(&mut *self.t))? {
            node.merge(Node { image: None, ..n });
        }
        Ok(node)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Node, A::Error> {
        let t = self.t;
        t.part()?;
        let start = (t.units, t.chars);
        let mut node = Node::default();
        while let Some(slot) = map.next_key_seed(KeySeed { t: &mut *t })? {
            if !matches!(slot, Slot::Null | Slot::Role) {
                // The entry's structure (quotes, colon, comma).
                t.units += UNIT;
            }
            node.merge(map.next_value_seed(Any { t: &mut *t, slot })?);
        }
        if let Some(kind) = node.image {
            // The image's own fields (its data above all) are not text: its formula counts.
            (t.units, t.chars) = start;
            t.images[kind].add(ImageCost::one(node.dims, node.low));
            return Ok(Node::default());
        }
        Ok(Node {
            image: None,
            ..node
        })
    }
}

/// An object key: counted, and what its value means.
struct KeySeed<'t> {
    t: &'t mut Tally,
}

impl<'de> DeserializeSeed<'de> for KeySeed<'_> {
    type Value = Slot;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Slot, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for KeySeed<'_> {
    type Value = Slot;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a field name")
    }
    fn visit_str<E: de::Error>(self, k: &str) -> Result<Slot, E> {
        let slot = match k {
            "type" => Slot::Kind,
            "data" | "url" | "image_url" => Slot::Data,
            "detail" => Slot::Detail,
            "content" => Slot::Null,
            "role" => Slot::Role,
            _ => Slot::Plain,
        };
        if !matches!(slot, Slot::Null | Slot::Role) {
            self.t.text(k);
        }
        Ok(slot)
    }
}
