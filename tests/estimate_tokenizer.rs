//! The estimators against a real tokenizer: a corpus of request shapes (every part a provider
//! counts, every script, agent transcripts, adversarial text), generated here, each with the
//! tokens the provider would see counted by `tiktoken-rs` under o200k_base and cl100k_base.
//! Every shape's reservation must be at least `real / 1.25` and at most [`MAX_OVER`] × real,
//! for both estimators, through both paths (a body estimated while parsing, and a parsed
//! request), which must agree.
//!
//! The README's table: `cargo test --all-features --test estimate_tokenizer -- --nocapture`.
//!
//! What "real" is: the tokens of each text the provider shows the model (message and system
//! text, document text, tool results, `tool_use.input` and tool definitions as JSON, tool-call
//! arguments, Responses `input`/`instructions`), plus 4 per message and 3 for the reply
//! (OpenAI's chat format), and images by the provider's published formula.
#![cfg(feature = "llm")]

use llm_bulkhead::llm::{LlmRequest, ModelAwareEstimator, NaiveEstimator, TokenEstimator};
use serde_json::{json, Value};
use tiktoken_rs::{cl100k_base, o200k_base, CoreBPE};

/// The most a shape may be over-counted (stated in the README).
const MAX_OVER: f64 = 6.0;

/// A small deterministic generator.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
    fn pick<'a, T>(&mut self, xs: &'a [T]) -> &'a T {
        &xs[self.next() as usize % xs.len()]
    }
    fn chars_in(&mut self, lo: u32, hi: u32, n: usize) -> String {
        let mut s = String::new();
        while s.chars().count() < n {
            if let Some(c) = char::from_u32(lo + (self.next() as u32) % (hi - lo + 1)) {
                s.push(c);
            }
        }
        s
    }
    fn of_alphabet(&mut self, alphabet: &str, n: usize) -> String {
        let a: Vec<char> = alphabet.chars().collect();
        (0..n).map(|_| *self.pick(&a)).collect()
    }
}

const WORDS: &[&str] = &[
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "that",
    "for",
    "it",
    "as",
    "was",
    "with",
    "be",
    "by",
    "on",
    "not",
    "he",
    "this",
    "are",
    "or",
    "his",
    "from",
    "at",
    "which",
    "but",
    "have",
    "an",
    "had",
    "they",
    "you",
    "were",
    "their",
    "one",
    "all",
    "we",
    "can",
    "her",
    "has",
    "there",
    "been",
    "if",
    "more",
    "when",
    "will",
    "would",
    "who",
    "so",
    "no",
    "system",
    "request",
    "budget",
    "admission",
    "gateway",
    "concurrency",
    "provider",
    "estimate",
    "tokens",
    "model",
    "response",
    "configuration",
    "international",
    "understanding",
    "implementation",
    "however",
];

fn english(r: &mut Rng, words: usize) -> String {
    let mut s = String::new();
    for i in 0..words {
        let w = *r.pick(WORDS);
        if i % 14 == 0 {
            let mut c = w.chars();
            let first = c.next().unwrap().to_ascii_uppercase();
            s.push(first);
            s.push_str(c.as_str());
        } else {
            s.push_str(w);
        }
        s.push_str(if i % 14 == 13 {
            ". "
        } else if i % 7 == 3 {
            ", "
        } else {
            " "
        });
    }
    s
}

fn code(r: &mut Rng, lines: usize) -> String {
    let mut s = String::new();
    for i in 0..lines {
        let indent = "    ".repeat(1 + i % 3);
        let name = r.pick(&["request", "budget", "tokens", "limit", "estimate", "slot"]);
        let n = r.next() % 1000;
        s.push_str(&match i % 4 {
            0 => format!(
                "{indent}let {name}_{n} = self.{name}.checked_add({n}).ok_or(Error::Overflow)?;\n"
            ),
            1 => format!(
                "{indent}if {name}_{n} > MAX_{n} {{ return Err(Error::TooLarge({name}_{n})); }}\n"
            ),
            2 => format!("{indent}// Returns the {name} for the given {n} items.\n"),
            _ => format!("{indent}fn {name}_{n}(&mut self, x: &[u8]) -> Result<u64, Error> {{\n"),
        });
    }
    s
}

fn json_text(r: &mut Rng, items: usize) -> String {
    let rows: Vec<Value> = (0..items)
        .map(|i| {
            json!({"id": i, "name": english(r, 2).trim(), "score": (r.next() % 10_000) as f64 / 100.0,
                   "tags": [r.pick(WORDS), r.pick(WORDS)], "active": i % 2 == 0, "parent": null})
        })
        .collect();
    serde_json::to_string_pretty(&rows).unwrap()
}

fn b64(r: &mut Rng, n: usize) -> String {
    r.of_alphabet(
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/",
        n,
    )
}

/// A PNG header of `w`×`h`, as base64.
fn png(w: u32, h: u32) -> String {
    let mut b = b"\x89PNG\r\n\x1a\n\0\0\0\x0dIHDR".to_vec();
    b.extend_from_slice(&w.to_be_bytes());
    b.extend_from_slice(&h.to_be_bytes());
    b.extend_from_slice(&[8, 6, 0, 0, 0]);
    b.extend((0..3000u32).map(|i| (i * 7919 % 251) as u8));
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(b)
}

/// One request of a shape: its body and the tokens the provider would see.
struct Case {
    body: Value,
    /// Texts the model sees.
    texts: Vec<String>,
    messages: u64,
    /// Tokens that are not text (images).
    fixed: u64,
}

impl Case {
    fn real(&self, bpe: &CoreBPE) -> u64 {
        let text: usize = self
            .texts
            .iter()
            .map(|t| bpe.encode_ordinary(t).len())
            .sum();
        text as u64
            + self.fixed
            + if self.messages > 0 {
                self.messages * 4 + 3
            } else {
                0
            }
    }
}

fn chat(model: &str, text: String) -> Case {
    Case {
        body: json!({"model": model, "max_tokens": 100, "messages": [{"role": "user", "content": text}]}),
        texts: vec![text],
        messages: 1,
        fixed: 0,
    }
}

/// Builds a case of a shape at a size (`k`, in thousands of characters, about).
type Make = Box<dyn Fn(&mut Rng, usize) -> Case>;

/// The shapes.
fn shapes() -> Vec<(&'static str, Make)> {
    let text_shape = |f: fn(&mut Rng, usize) -> String| {
        Box::new(move |r: &mut Rng, k: usize| chat("gpt-4o", f(r, k))) as Make
    };
    vec![
        (
            "English text in one message",
            text_shape(|r, k| english(r, k * 180)),
        ),
        ("code", text_shape(|r, k| code(r, k * 18))),
        ("JSON", text_shape(|r, k| json_text(r, k * 8))),
        (
            "CJK",
            text_shape(|r, k| {
                let common = "的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年得就那要下以生会自着去之过家学对可她里后小么心多天而能好都然没日于起还发成事只作当想看文无开手十用主行方又如前所本见经头面公同三已老从动两长";
                r.of_alphabet(common, k * 1000)
            }),
        ),
        (
            "rare CJK (Extension B)",
            text_shape(|r, k| r.chars_in(0x20000, 0x2A6DF, k * 250)),
        ),
        (
            "emoji",
            text_shape(|r, k| r.chars_in(0x1F300, 0x1F64F, k * 250)),
        ),
        (
            "combining marks",
            text_shape(|r, k| {
                (0..k * 300)
                    .map(|i| format!("{}{}", ['a', 'e', 'o'][i % 3], r.chars_in(0x300, 0x36F, 2)))
                    .collect()
            }),
        ),
        (
            "math alphanumerics",
            text_shape(|r, k| r.chars_in(0x1D400, 0x1D7FF, k * 250)),
        ),
        (
            "hex",
            text_shape(|r, k| r.of_alphabet("0123456789abcdef", k * 1000)),
        ),
        (
            "punctuation",
            text_shape(|r, k| r.of_alphabet("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~", k * 1000)),
        ),
        ("base64", text_shape(|r, k| b64(r, k * 1000))),
        (
            "random letters",
            text_shape(|r, k| r.of_alphabet("abcdefghijklmnopqrstuvwxyz", k * 1000)),
        ),
        (
            "Cyrillic and Greek",
            text_shape(|r, k| {
                let w: Vec<String> = (0..k * 150)
                    .map(|i| {
                        if i % 2 == 0 {
                            r.chars_in(0x430, 0x44F, 5)
                        } else {
                            r.chars_in(0x3B1, 0x3C9, 4)
                        }
                    })
                    .collect();
                w.join(" ")
            }),
        ),
        (
            "random BMP",
            text_shape(|r, k| r.chars_in(0x800, 0xD7FF, k * 330)),
        ),
        (
            "Anthropic document (text source)",
            Box::new(|r: &mut Rng, k: usize| {
                let t = english(r, k * 180);
                Case {
                    body: json!({"model": "claude-sonnet-4-5", "max_tokens": 100, "messages": [{"role": "user", "content": [
                    {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": t}},
                    {"type": "text", "text": "Summarise."}]}]}),
                    texts: vec![t, "Summarise.".into()],
                    messages: 1,
                    fixed: 0,
                }
            }),
        ),
        (
            "tool_result content",
            Box::new(|r: &mut Rng, k: usize| {
                let a = json_text(r, k * 4);
                let b = code(r, k * 9);
                Case {
                    body: json!({"model": "claude-sonnet-4-5", "max_tokens": 100, "messages": [{"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_01", "content": a},
                    {"type": "tool_result", "tool_use_id": "toolu_02", "content": [{"type": "text", "text": b}]}]}]}),
                    texts: vec![a, b],
                    messages: 1,
                    fixed: 0,
                }
            }),
        ),
        (
            "tool_use.input",
            Box::new(|r: &mut Rng, k: usize| {
                let input = json!({"query": english(r, k * 60), "rows": serde_json::from_str::<Value>(&json_text(r, k * 3)).unwrap()});
                Case {
                    texts: vec![input.to_string()],
                    body: json!({"model": "claude-sonnet-4-5", "max_tokens": 100, "messages": [{"role": "assistant", "content": [
                    {"type": "tool_use", "id": "toolu_01", "name": "search", "input": input}]}]}),
                    messages: 1,
                    fixed: 0,
                }
            }),
        ),
        (
            "OpenAI tools",
            Box::new(|r: &mut Rng, k: usize| {
                let tools: Vec<Value> = (0..k * 4).map(|i| json!({"type": "function", "function": {
                "name": format!("tool_{i}"), "description": english(r, 30),
                "parameters": {"type": "object", "properties": {"query": {"type": "string", "description": english(r, 10)},
                "limit": {"type": "integer"}}, "required": ["query"]}}})).collect();
                Case {
                    texts: vec![serde_json::to_string(&tools).unwrap(), "hi".into()],
                    body: json!({"model": "gpt-4o", "tools": tools, "tool_choice": "auto", "messages": [{"role": "user", "content": "hi"}]}),
                    messages: 1,
                    fixed: 0,
                }
            }),
        ),
        (
            "assistant tool_calls arguments",
            Box::new(|r: &mut Rng, k: usize| {
                let args = json!({"code": code(r, k * 9), "note": english(r, k * 40)}).to_string();
                Case {
                    body: json!({"model": "gpt-4o", "messages": [{"role": "assistant", "content": null, "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "run", "arguments": args}}]},
                    {"role": "tool", "tool_call_id": "call_1", "content": "ok"}]}),
                    texts: vec![args, "run".into(), "ok".into()],
                    messages: 2,
                    fixed: 0,
                }
            }),
        ),
        (
            "Responses input / instructions / prompt",
            Box::new(|r: &mut Rng, k: usize| {
                let (a, b, c) = (english(r, k * 60), english(r, k * 60), english(r, k * 60));
                Case {
                    body: json!({"model": "gpt-4.1", "max_output_tokens": 500, "instructions": a,
                    "prompt": {"id": "pmpt_1", "variables": {"topic": c}},
                    "input": [{"role": "user", "content": [{"type": "input_text", "text": b}]}]}),
                    texts: vec![a, b, c],
                    messages: 1,
                    fixed: 0,
                }
            }),
        ),
        (
            "input_text parts, type TEXT",
            Box::new(|r: &mut Rng, k: usize| {
                let (a, b) = (english(r, k * 90), english(r, k * 90));
                Case {
                    body: json!({"model": "gpt-4o", "messages": [{"role": "user", "content": [
                    {"type": "input_text", "text": a}, {"type": "TEXT", "text": b}]}]}),
                    texts: vec![a, b],
                    messages: 1,
                    fixed: 0,
                }
            }),
        ),
        (
            "100 images, OpenAI high detail 1024×1024",
            Box::new(|_: &mut Rng, _: usize| {
                let parts: Vec<Value> = (0..100)
                    .map(|_| {
                        json!({"type": "image_url", "image_url": {
                "url": format!("data:image/png;base64,{}", png(1024, 1024)), "detail": "high"}})
                    })
                    .collect();
                Case {
                    body: json!({"model": "gpt-4o", "messages": [{"role": "user", "content": parts}]}),
                    texts: vec![],
                    messages: 1,
                    fixed: 100 * 765,
                }
            }),
        ),
        (
            "100 images, Anthropic 1092×1092",
            Box::new(|_: &mut Rng, _: usize| {
                let parts: Vec<Value> = (0..100)
                    .map(|_| {
                        json!({"type": "image", "source": {
                "type": "base64", "media_type": "image/png", "data": png(1092, 1092)}})
                    })
                    .collect();
                Case {
                    body: json!({"model": "claude-sonnet-4-5", "max_tokens": 10, "messages": [{"role": "user", "content": parts}]}),
                    texts: vec![],
                    messages: 1,
                    fixed: 100 * 1_590,
                }
            }),
        ),
        (
            "empty messages (many)",
            Box::new(|_: &mut Rng, k: usize| {
                let n = k * 5_000;
                let messages: Vec<Value> = (0..n)
                    .map(|_| json!({"role": "user", "content": ""}))
                    .collect();
                Case {
                    body: json!({"model": "gpt-4o", "messages": messages}),
                    texts: vec![],
                    messages: n as u64,
                    fixed: 0,
                }
            }),
        ),
        (
            "agent transcript",
            Box::new(|r: &mut Rng, k: usize| {
                let mut messages = vec![json!({"role": "system", "content": english(r, 120)})];
                let mut texts = vec![];
                texts.push(messages[0]["content"].as_str().unwrap().to_owned());
                for i in 0..k * 2 {
                    let ask = english(r, 25);
                    let args =
                        json!({"path": format!("src/file_{i}.rs"), "pattern": r.pick(WORDS)})
                            .to_string();
                    let out = if i % 2 == 0 {
                        code(r, 12)
                    } else {
                        json_text(r, 4)
                    };
                    texts.extend([ask.clone(), args.clone(), "grep".into(), out.clone()]);
                    messages.push(json!({"role": "user", "content": ask}));
                    messages.push(json!({"role": "assistant", "content": null, "tool_calls": [
                    {"id": format!("call_{i}"), "type": "function", "function": {"name": "grep", "arguments": args}}]}));
                    messages.push(json!({"role": "tool", "tool_call_id": format!("call_{i}"), "content": out}));
                }
                let n = messages.len() as u64;
                Case {
                    body: json!({"model": "gpt-4o", "max_tokens": 2000, "messages": messages}),
                    texts,
                    messages: n,
                    fixed: 0,
                }
            }),
        ),
        (
            "adversarial mix",
            Box::new(|r: &mut Rng, k: usize| {
                let mut s = String::new();
                while s.len() < k * 1500 {
                    s.push_str(&match r.next() % 8 {
                        0 => r.chars_in(0x20000, 0x2A6DF, 20),
                        1 => r.of_alphabet("0123456789abcdef", 40),
                        2 => r.of_alphabet("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~", 40),
                        3 => b64(r, 40),
                        4 => r.chars_in(0x1D400, 0x1D7FF, 20),
                        5 => r.chars_in(0x300, 0x36F, 20),
                        6 => r.of_alphabet(" \t\n", 20),
                        _ => r.of_alphabet("0123456789", 40),
                    });
                }
                chat("gpt-4o", s)
            }),
        ),
    ]
}

fn median(xs: &mut [f64]) -> f64 {
    xs.sort_by(|a, b| a.partial_cmp(b).unwrap());
    xs[xs.len() / 2]
}

#[test]
fn every_shape_within_bounds_against_o200k_and_cl100k() {
    let o200k = o200k_base().unwrap();
    let cl100k = cl100k_base().unwrap();
    let aware = ModelAwareEstimator::default();
    let estimators: [(&str, &dyn TokenEstimator); 2] =
        [("naive", &NaiveEstimator), ("model-aware", &aware)];
    let mut rng = Rng(0x5eed);
    let mut failures = vec![];
    println!("| shape | naive: min / median / max | model-aware (default): min / median / max | before (d3a8dfa's formulas), naive / model-aware: median |");
    println!("|---|---|---|---|");
    for (name, make) in shapes() {
        let mut ratios = [vec![], vec![], vec![], vec![]];
        for k in [1usize, 2, 4] {
            let case = make(&mut rng, k);
            let body = serde_json::to_vec(&case.body).unwrap();
            let input_out = case
                .body
                .get("max_tokens")
                .or(case.body.get("max_output_tokens"))
                .and_then(Value::as_u64)
                .unwrap_or(2_048);
            let parsed = LlmRequest::from_json(&body, u64::MAX).unwrap();
            // Before (printed only): `ceil(text / 4)` and `ceil(text / ratio)` over message and
            // system text alone (`LlmRequest::text_len`), what d3a8dfa's estimators computed.
            let model = parsed.model.as_deref().unwrap_or("");
            let before = [4.0, aware.ratio_for(model).0].map(|r| {
                (parsed.text_len() as f64 / r).ceil()
                    + parsed.extra_input_tokens.unwrap_or(0) as f64
            });
            for bpe in [&o200k, &cl100k] {
                let real = case.real(bpe) as f64;
                ratios[2].push(before[0] / real);
                ratios[3].push(before[1] / real);
            }
            for (i, (ename, e)) in estimators.iter().enumerate() {
                let streamed = e.estimate_body(&body).unwrap();
                let typed = e.estimate(&parsed).unwrap();
                assert_eq!(
                    streamed, typed,
                    "{name} {ename}: body and parsed request disagree"
                );
                assert_eq!(streamed.max_output(), input_out, "{name}");
                for bpe in [&o200k, &cl100k] {
                    let real = case.real(bpe) as f64;
                    let ratio = streamed.input() as f64 / real;
                    ratios[i].push(ratio);
                    if !(1.0 / 1.25..=MAX_OVER).contains(&ratio) {
                        failures.push(format!(
                            "{name} (k={k}) {ename}: reserved {} real {real} ratio {ratio:.2}",
                            streamed.input()
                        ));
                    }
                }
            }
        }
        let cell = |r: &mut Vec<f64>| {
            let (min, max) = (
                r.iter().cloned().fold(f64::MAX, f64::min),
                r.iter().cloned().fold(0.0, f64::max),
            );
            format!("{min:.2} / {:.2} / {max:.2}", median(r))
        };
        println!(
            "| {name} | {} | {} | {:.2} / {:.2} |",
            cell(&mut ratios[0]),
            cell(&mut ratios[1]),
            median(&mut ratios[2]),
            median(&mut ratios[3]),
        );
    }
    assert!(
        failures.is_empty(),
        "out of bounds:\n{}",
        failures.join("\n")
    );
}
