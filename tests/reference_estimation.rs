//! Token estimation with the reference library's numbers: `llm_bulkhead.test.ts` #1–#30 and
//! `estimation_surface.test.ts` #1–#4, #6–#12 and #20 (the cases that concern estimation;
//! run, events and de-duplication come with the LLM layer's `run`). JS validation of negative or
//! fractional numbers becomes a deserialisation error naming the field.
//!
//! Where this crate now counts more than the reference (issue 30: every part, per-message
//! overheads, a script bound on text), the expected numbers say so: text is made of spaces,
//! whose script bound (a quarter token per space after a space) stays below the ratio, so the
//! reference's `ceil(chars / ratio)` still shows, plus [`MSG`] for one message.
#![cfg(feature = "llm")]

use llm_bulkhead::llm::{
    utf16_len, Content, ContentBlock, EstimateError, LlmRequest, Message, ModelAwareEstimator,
    NaiveEstimator, OpaqueBlockTokens, ReservationOverride, TokenEstimator,
};
use llm_bulkhead::{Bulkhead, Demand, Usage};
use std::sync::{Arc, Mutex};

fn req(model: Option<&str>, content: Content, max_tokens: Option<u64>) -> LlmRequest {
    LlmRequest {
        model: model.map(str::to_owned),
        messages: vec![Message {
            role: "user".into(),
            content,
            extra: Default::default(),
        }],
        max_tokens,
        ..LlmRequest::default()
    }
}

/// `n` characters of text whose tokens are the reference's `ceil(n / ratio)`.
fn text(n: usize) -> Content {
    Content::from(" ".repeat(n).as_str())
}

/// The overhead of a request with one message: 4 for the message, 3 for the reply.
const MSG: u64 = 7;

fn blocks(b: Vec<ContentBlock>) -> Content {
    Content::Blocks(b)
}

fn est(e: &impl TokenEstimator, r: &LlmRequest) -> (u64, u64) {
    let x = e.estimate(r).unwrap();
    (x.input(), x.max_output())
}

#[test]
fn counting_characters() {
    // #1–#5
    assert_eq!(Content::from("hello").text_len(), 5);
    let hw = blocks(vec![
        ContentBlock::from_text("hello"),
        ContentBlock::from_text(" world"),
    ]);
    assert_eq!(hw.text_len(), 11);
    assert_eq!(
        blocks(vec![
            ContentBlock::from_text("hello"),
            ContentBlock::of_type("image")
        ])
        .text_len(),
        5
    );
    assert_eq!(blocks(vec![]).text_len(), 0);
    assert_eq!(blocks(vec![ContentBlock::of_type("image")]).text_len(), 0);
    // UTF-16 code units, as JavaScript counts (behaviour §3.1).
    assert_eq!(utf16_len("😀😀😀😀é"), 9);
}

#[test]
fn naive_estimator() {
    // #6–#12
    assert_eq!(
        est(&NaiveEstimator, &req(None, text(400), None)),
        (100 + MSG, 2_048)
    );
    assert_eq!(
        est(&NaiveEstimator, &req(None, text(400), Some(1_024))).1,
        1_024
    );
    let mut two = req(None, text(200), None);
    two.messages.push(Message::user(&" ".repeat(200)));
    assert_eq!(est(&NaiveEstimator, &two).0, 100 + 11);
    assert_eq!(est(&NaiveEstimator, &LlmRequest::default()), (0, 2_048));
    assert_eq!(
        est(&NaiveEstimator, &req(None, text(401), None)).0,
        101 + MSG
    );
    // An image is no longer free: with no model and no dimensions, the largest formula's
    // cost (Anthropic's 1,600); the text block's keys and structure cost 7 tokens.
    let mm = blocks(vec![
        ContentBlock::from_text(" ".repeat(400)),
        ContentBlock::of_type("image"),
    ]);
    assert_eq!(
        est(&NaiveEstimator, &req(None, mm, None)).0,
        100 + MSG + 7 + 1_600
    );
}

#[test]
fn model_aware_ratios() {
    let default_model = |m: &str| {
        ModelAwareEstimator::builder()
            .default_model(m)
            .build()
            .unwrap()
    };
    // #13, #15: a known built-in ratio (3.9) through the default model.
    assert_eq!(
        est(
            &default_model("claude-sonnet-4-20260101"),
            &req(None, text(390), None)
        )
        .0,
        100 + MSG
    );
    // #14: an override (2.0) for the request's model.
    let o = ModelAwareEstimator::builder()
        .ratio("custom-model", 2.0)
        .build()
        .unwrap();
    assert_eq!(
        est(&o, &req(Some("custom-model"), text(200), None)).0,
        100 + MSG
    );
    // #16: an exact-only override does not prefix-match; the longest built-in prefix wins (3.8).
    let o = ModelAwareEstimator::builder()
        .ratio("claude-3", 3.0)
        .build()
        .unwrap();
    assert_eq!(
        est(&o, &req(Some("claude-3-5-haiku-20250101"), text(380), None)).0,
        100 + MSG
    );
    // #17: an exact override beats the prefix table.
    let o = ModelAwareEstimator::builder()
        .ratio("claude-sonnet-4-custom", 2.0)
        .default_model("claude-sonnet-4-custom")
        .build()
        .unwrap();
    assert_eq!(est(&o, &req(None, text(200), None)).0, 100 + MSG);
    // #18: the override is found through the lower-cased model name.
    let o = ModelAwareEstimator::builder()
        .ratio("my-model", 2.0)
        .default_model("MY-MODEL")
        .build()
        .unwrap();
    assert_eq!(est(&o, &req(None, text(200), None)).0, 100 + MSG);
    // #19: the prefix scan is case-insensitive.
    assert_eq!(
        est(
            &default_model("CLAUDE-SONNET-4-20260101"),
            &req(None, text(390), None)
        )
        .0,
        100 + MSG
    );
    // #20: unknown models use 4.0.
    assert_eq!(
        est(
            &default_model("unknown-model-xyz"),
            &req(None, text(400), None)
        )
        .0,
        100 + MSG
    );
    // #25, #26: the request's model wins over the default; the default fills in.
    assert_eq!(
        est(
            &default_model("unknown-model"),
            &req(Some("claude-sonnet-4"), text(390), None)
        )
        .0,
        100 + MSG
    );
    assert_eq!(
        est(
            &default_model("claude-sonnet-4"),
            &req(None, text(390), None)
        )
        .0,
        100 + MSG
    );
    // #27 multimodal; #28–#30 more prefixes. The image is no longer free (Anthropic's largest
    // cost without dimensions, 1,600), nor the text block's keys and structure (7).
    let mm = blocks(vec![
        ContentBlock::from_text(" ".repeat(390)),
        ContentBlock::of_type("image"),
    ]);
    assert_eq!(
        est(&default_model("claude-sonnet-4"), &req(None, mm, None)).0,
        100 + MSG + 5 + 1_600
    );
    let e = ModelAwareEstimator::default();
    assert_eq!(
        est(&e, &req(Some("claude-haiku-4-5-20260301"), text(380), None)).0,
        100 + MSG
    );
    assert_eq!(
        est(&e, &req(Some("gpt-4.1-mini"), text(370), None)).0,
        100 + MSG
    );
    assert_eq!(
        est(&e, &req(Some("gemini-2.5-pro"), text(380), None)).0,
        100 + MSG
    );
}

#[test]
fn unknown_model_callback() {
    // #21, #22
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    let e = ModelAwareEstimator::builder()
        .on_unknown_model(move |m| s.lock().unwrap().push(m.to_owned()))
        .build()
        .unwrap();
    e.estimate(&req(Some("totally-unknown"), text(4), None))
        .unwrap();
    e.estimate(&req(Some("claude-sonnet-4"), text(4), None))
        .unwrap();
    assert_eq!(*seen.lock().unwrap(), ["totally-unknown"]);
}

#[test]
fn output_cap() {
    // #23, #24
    let e = ModelAwareEstimator::builder()
        .output_cap(512)
        .build()
        .unwrap();
    assert_eq!(est(&e, &req(Some("gpt-4o"), text(4), None)).1, 512);
    assert_eq!(est(&e, &req(Some("gpt-4o"), text(4), Some(1_024))).1, 1_024);
}

#[test]
fn system_prompt_and_extra_input_tokens() {
    // estimation_surface #1: 4-char message + 8-char system → 3; without system → 1.
    let mut r = req(None, text(4), None);
    assert_eq!(est(&NaiveEstimator, &r).0, 1 + MSG);
    r.system = Some(text(8));
    assert_eq!(est(&NaiveEstimator, &r).0, 3 + MSG);
    // #2: gpt-4o (3.7), 37 chars + system [text 37, marker] → {20, 5}. The marker is no
    // longer free: a part of an unknown type costs its size (here 15 with the text block's).
    let mut r = req(Some("gpt-4o"), text(37), Some(5));
    r.system = Some(blocks(vec![
        ContentBlock::from_text(" ".repeat(37)),
        ContentBlock::of_type("cache_control_marker"),
    ]));
    assert_eq!(est(&ModelAwareEstimator::default(), &r), (20 + MSG + 15, 5));
    // #3: extra 500 added verbatim by both estimators.
    let mut r = req(Some("unknown"), text(40), None);
    r.extra_input_tokens = Some(500);
    assert_eq!(est(&NaiveEstimator, &r).0, 510 + MSG);
    assert_eq!(est(&ModelAwareEstimator::default(), &r).0, 510 + MSG);
}

#[test]
fn invalid_numbers_are_refused_when_deserialising() {
    // estimation_surface #4 and llm_bulkhead #53: negative and fractional counts.
    for body in [
        r#"{"messages": [], "extraInputTokens": -1}"#,
        r#"{"messages": [], "extra_input_tokens": 1.5}"#,
        r#"{"messages": [], "max_tokens": -1}"#,
        r#"{"messages": [], "max_tokens": 1.5}"#,
    ] {
        assert!(serde_json::from_str::<LlmRequest>(body).is_err(), "{body}");
    }
}

#[test]
fn opaque_block_charges() {
    // estimation_surface #6–#11, as this crate now reads them: a configured cost replaces an
    // image's formula (`image`, `image_url`, `input_image`); every other part, of any type,
    // costs its size and is never free.
    let image_only = |costs| {
        let e = ModelAwareEstimator::builder()
            .opaque_block_costs(costs)
            .build()
            .unwrap();
        let r = req(
            Some("gpt-4o"),
            blocks(vec![ContentBlock::of_type("image")]),
            Some(3),
        );
        est(&e, &r)
    };
    // A `{"type": "image"}` block is 3 tokens of structure besides the image itself.
    assert_eq!(image_only(OpaqueBlockTokens::Flat(2_048)), (2_048 + MSG, 3));
    let listed = OpaqueBlockTokens::by_type(Some(100), [("image", 1_500)]);
    assert_eq!(image_only(listed), (1_500 + MSG, 3));
    // No cost for the type and no default: the formula (gpt-4o, no dimensions: 8 tiles).
    let unlisted = OpaqueBlockTokens::by_type(None, [("image_url", 1_500)]);
    assert_eq!(image_only(unlisted), (85 + 170 * 8 + MSG, 3));
    // Without the option, the formula too.
    assert_eq!(
        est(
            &ModelAwareEstimator::default(),
            &req(
                Some("gpt-4o"),
                blocks(vec![ContentBlock::of_type("image")]),
                Some(3)
            )
        ),
        (85 + 170 * 8 + MSG, 3)
    );
    // Documents, audio and malformed text blocks cost their size, whatever the option.
    let e = ModelAwareEstimator::builder()
        .opaque_block_tokens(9_999)
        .build()
        .unwrap();
    let malformed: ContentBlock = serde_json::from_str(r#"{"type": "text", "text": 123}"#).unwrap();
    for block in [
        ContentBlock::of_type("document"),
        ContentBlock::of_type("audio"),
        malformed,
    ] {
        let (input, _) = est(&e, &req(Some("gpt-4o"), blocks(vec![block.clone()]), None));
        assert!((MSG + 2..MSG + 16).contains(&input), "{block:?}: {input}");
    }
}

#[test]
fn invalid_ratio_is_refused_at_construction() {
    // estimation_surface #12 adapted (costs are u64, so only ratios can be invalid here), and
    // reference bug B14 (a 0 ratio gives an infinite estimate there).
    // And ratios beyond sane bounds (1e300 made every estimate 1, 1e-10 reserved 4×10¹³ for
    // 4,000 characters), and one model given twice in different cases.
    for bad in [0.0, -1.0, f64::NAN, f64::INFINITY, 1e300, 1e-10, 0.49, 32.5] {
        let e = ModelAwareEstimator::builder()
            .ratio("m", bad)
            .build()
            .unwrap_err();
        assert!(matches!(e, EstimateError::InvalidRatio { .. }), "{bad}");
    }
    let twice = ModelAwareEstimator::builder()
        .ratio("My-Model", 2.0)
        .ratio("my-model", 3.0);
    assert!(matches!(
        twice.build().unwrap_err(),
        EstimateError::InvalidRatio { .. }
    ));
    let e = ModelAwareEstimator::builder()
        .ratio("My-Model", 2.0)
        .build()
        .unwrap();
    assert_eq!(e.ratio_for("MY-MODEL"), (2.0, true));
    // Output caps: 0, and one so large every estimate would overflow; parts limit 0.
    for cap in [0, llm_bulkhead::llm::MAX_OUTPUT_CAP + 1, u64::MAX] {
        let e = ModelAwareEstimator::builder()
            .output_cap(cap)
            .build()
            .unwrap_err();
        assert!(
            matches!(
                e,
                EstimateError::InvalidSetting {
                    field: "output_cap",
                    ..
                }
            ),
            "{cap}"
        );
    }
    let e = ModelAwareEstimator::builder()
        .max_parts(0)
        .build()
        .unwrap_err();
    assert!(matches!(
        e,
        EstimateError::InvalidSetting {
            field: "max_parts",
            ..
        }
    ));
}

#[test]
fn gateway_shaped_request_end_to_end() {
    // estimation_surface #20: Anthropic-shaped JSON, claude-sonnet-4 estimator with 2048 per
    // image; request claude-sonnet-4-5, system 39 chars, 39-char text + image, max 1024,
    // extra 350 → the reference's {2418, 1024, 3442}, plus this crate's 7 for the message and
    // 7 for the text block's keys; admitted with that reservation and released.
    let body = format!(
        r#"{{"model": "claude-sonnet-4-5", "system": "{}", "max_tokens": 1024, "extraInputTokens": 350,
            "metadata": {{"user_id": "u-1"}},
            "messages": [{{"role": "user", "content": [{{"type": "text", "text": "{}"}},
                {{"type": "image", "source": {{"type": "base64", "media_type": "image/png", "data": "AA=="}}}}]}}]}}"#,
        " ".repeat(39),
        " ".repeat(39)
    );
    let request: LlmRequest = serde_json::from_str(&body).unwrap();
    assert!(request.extra.contains_key("metadata"));
    let e = ModelAwareEstimator::builder()
        .default_model("claude-sonnet-4")
        .opaque_block_tokens(2_048)
        .build()
        .unwrap();
    let r = e.estimate(&request).unwrap();
    assert_eq!(
        (r.input(), r.max_output(), r.total()),
        (2_432, 1_024, 3_456)
    );
    let b = Bulkhead::builder()
        .max_concurrent(2)
        .token_budget(10_000)
        .build()
        .unwrap();
    let a = b.try_acquire(Demand::tokens(r)).unwrap();
    assert_eq!(b.stats().token_budget.unwrap().in_flight_tokens, 3_456);
    a.release(Some(Usage::new(2_000, 500))).unwrap();
    assert_eq!(b.stats().token_budget.unwrap().in_flight_tokens, 0);
}

#[test]
fn openai_shape_and_round_trip() {
    let body = r#"{"model": "gpt-4o-mini", "temperature": 0.3, "stream": true,
        "messages": [{"role": "system", "content": "Be brief."},
                     {"role": "user", "content": [{"type": "text", "text": "Describe"}, {"type": "image_url", "image_url": {"url": "https://x"}}]},
                     {"role": "assistant", "content": null, "tool_calls": []}],
        "max_completion_tokens": 300}"#;
    let r: LlmRequest = serde_json::from_str(body).unwrap();
    // `max_completion_tokens` stays as sent (o-series models refuse `max_tokens`).
    assert_eq!(
        (r.text_len(), r.max_tokens, r.opaque_blocks().count()),
        (17, None, 1)
    );
    assert_eq!(r.extra["max_completion_tokens"], 300);
    // gpt-4o-mini's image cost without dimensions: 2,833 + 5,667 × 8 tiles.
    let (input, output) = est(&ModelAwareEstimator::default(), &r);
    assert_eq!(output, 300);
    assert!(
        (2_833 + 5_667 * 8..2_833 + 5_667 * 8 + 40).contains(&input),
        "{input}"
    );
    // Unknown fields survive a round trip, so a gateway can forward the request unchanged.
    let sent = serde_json::to_string(&r).unwrap();
    assert!(sent.contains(r#""max_completion_tokens":300"#) && !sent.contains("max_tokens\""));
    let again: LlmRequest = serde_json::from_str(&sent).unwrap();
    assert_eq!(again, r);
    // Both caps: refused, naming both.
    let both = r#"{"max_tokens": 1, "max_completion_tokens": 2, "messages": []}"#;
    let e = serde_json::from_str::<LlmRequest>(both)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("max_tokens") && e.contains("max_completion_tokens"),
        "{e}"
    );
    let e = NaiveEstimator.estimate_body(both.as_bytes()).unwrap_err();
    assert_eq!(
        e,
        EstimateError::ConflictingFields {
            fields: ["max_tokens", "max_completion_tokens"]
        }
    );
}

#[test]
fn reservation_override_consistency() {
    // v38_features #9, #10
    let bad = ReservationOverride {
        input: 100,
        max_output: 20,
        reserved: Some(999),
    };
    assert_eq!(
        bad.resolve().unwrap_err().to_string(),
        "reservation.reserved (999) must equal reservation.input + reservation.max_output (120)"
    );
    let plain: ReservationOverride =
        serde_json::from_str(r#"{"input": 100, "maxOutput": 20}"#).unwrap();
    assert_eq!(plain.resolve().unwrap().total(), 120);
    let overflow = ReservationOverride {
        input: u64::MAX,
        max_output: 1,
        reserved: None,
    };
    assert!(matches!(
        overflow.resolve(),
        Err(EstimateError::Overflow { .. })
    ));
}

#[test]
fn custom_estimator_closure() {
    // llm_bulkhead #51: a custom estimator is used as given.
    let calls = Arc::new(Mutex::new(0));
    let c = calls.clone();
    let custom = move |_: &LlmRequest| {
        *c.lock().unwrap() += 1;
        llm_bulkhead::Reservation::new(50, 50).map_err(|_| EstimateError::Overflow { field: "x" })
    };
    assert_eq!(
        custom.estimate(&LlmRequest::default()).unwrap().total(),
        100
    );
    assert_eq!(*calls.lock().unwrap(), 1);
}

mod properties {
    use llm_bulkhead::llm::utf16_len;
    use proptest::prelude::*;

    proptest! {
        /// The fast UTF-16 count equals the decoding one on any string.
        #[test]
        fn utf16_len_matches_encode_utf16(s in any::<String>()) {
            prop_assert_eq!(utf16_len(&s), s.encode_utf16().count() as u64);
        }
    }
}

#[test]
fn output_side_n_thinking_budgets_and_responses_caps() {
    // Issue 30: `n` multiplies the output reserve; a thinking budget above the cap raises it;
    // the Responses API's `max_output_tokens` is read; each through the body and the parsed
    // request alike.
    let e = ModelAwareEstimator::default();
    let out = |body: &str| {
        let streamed = e.estimate_body(body.as_bytes()).unwrap();
        let parsed = e
            .estimate(&LlmRequest::from_json(body.as_bytes(), 100).unwrap())
            .unwrap();
        assert_eq!(streamed, parsed, "{body}");
        streamed.max_output()
    };
    assert_eq!(
        out(r#"{"model": "gpt-4o", "n": 3, "max_tokens": 100, "messages": []}"#),
        300
    );
    assert_eq!(
        out(r#"{"model": "gpt-4o", "n": 4, "messages": []}"#),
        4 * 2_048
    );
    assert_eq!(
        out(r#"{"model": "o3", "max_completion_tokens": 700, "messages": []}"#),
        700
    );
    assert_eq!(
        out(r#"{"model": "gpt-4.1", "max_output_tokens": 900, "input": "hi"}"#),
        900
    );
    assert_eq!(
        out(r#"{"model": "claude-sonnet-4-5", "max_tokens": 1000,
            "thinking": {"type": "enabled", "budget_tokens": 16000}, "messages": []}"#),
        16_000
    );
    let overflow = r#"{"n": 18446744073709551615, "max_tokens": 2, "messages": []}"#;
    assert_eq!(
        e.estimate_body(overflow.as_bytes()).unwrap_err(),
        EstimateError::Overflow {
            field: "max_output"
        }
    );
    // Images: OpenAI's low detail is the base (85), without dimensions the formula's largest.
    let img = |detail: &str| {
        let body = format!(
            r#"{{"model": "gpt-4o", "messages": [{{"role": "user", "content": [{{"type": "image_url",
                "image_url": {{"url": "https://example.com/a.png", "detail": "{detail}"}}}}]}}]}}"#
        );
        e.estimate_body(body.as_bytes()).unwrap().input()
    };
    assert_eq!(img("low"), 85 + MSG);
    assert_eq!(img("high"), 85 + 170 * 8 + MSG);
}
