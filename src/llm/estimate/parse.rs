//! Parsing a request body with errors that never quote it: [`LlmRequest::from_json`] and the
//! scrubbing of serde's messages. It lives with estimation because it runs estimation's
//! streaming walk first (syntax, counts and the parts limit, before anything is materialised).

use super::tally_json;
use super::EstimateError;
use crate::llm::request::LlmRequest;

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
}
