//! The built-in ratio lookup against its definition.

use super::{built_in_ratio, BUILT_IN_RATIOS};
use proptest::prelude::*;

/// The definition: the ratio of the longest table entry that prefixes `name`.
fn scan(name: &[u8]) -> Option<f64> {
    BUILT_IN_RATIOS
        .iter()
        .filter(|(prefix, _)| name.starts_with(prefix.as_bytes()))
        .max_by_key(|(prefix, _)| prefix.len())
        .map(|(_, r)| *r)
}

#[test]
fn lookup_equals_the_longest_prefix_scan() {
    let mut names: Vec<Vec<u8>> = vec![Vec::new()];
    for (entry, _) in BUILT_IN_RATIOS {
        let e = entry.as_bytes();
        for n in 0..=e.len() {
            names.push(e[..n].to_vec());
        }
        for tail in [&b"-20250101"[..], b"x", b"-", b".", b"5", b"o", b"-mini"] {
            names.push([e, tail].concat());
        }
        // Every one-byte change of the entry, over the table's own alphabet.
        for i in 0..e.len() {
            for c in b"abcdeghiklmnoprstuvz0123456789-." {
                let mut m = e.to_vec();
                m[i] = *c;
                names.push(m);
            }
        }
    }
    for name in &names {
        assert_eq!(
            built_in_ratio(name),
            scan(name),
            "{}",
            String::from_utf8_lossy(name)
        );
    }
}

proptest! {
    #[test]
    fn random_names_agree(name in "(claude-|gpt-|gemini-|o)?[0-9a-z.-]{0,12}") {
        prop_assert_eq!(built_in_ratio(name.as_bytes()), scan(name.as_bytes()));
    }
}

proptest! {
    /// The text bound's one pass also counts UTF-16 units: the same as `utf16_len`, for any
    /// text and across its 127-byte chunks; and the bound is at least `bytes / 1.25` for text
    /// without ASCII letters, digits or single spaces (the classes it prices below a byte).
    #[test]
    fn text_pass_counts_utf16_and_bounds_dense_text(s in "\\PC{0,400}") {
        let (units, utf16) = super::text::measure(&s);
        prop_assert_eq!(utf16, crate::llm::utf16_len(&s));
        let dense = s.bytes().all(|b| b >= 0x80);
        if dense {
            prop_assert!(units * 125 >= s.len() as u64 * 100 * super::text::UNIT);
        }
    }
}
