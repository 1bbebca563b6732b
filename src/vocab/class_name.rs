//! Class names as the bulkhead and its configuration compare them: one canonical spelling per
//! name, and names no log or dashboard can be misled by refused.

use std::borrow::Cow;
use unicode_normalization::{is_nfc_quick, IsNormalized, UnicodeNormalization};

/// Why a class name is refused (the reason [`ConfigProblem::ClassTable`] carries).
///
/// [`ConfigProblem::ClassTable`]: crate::ConfigProblem::ClassTable
pub(crate) const EMPTY: &str = "a class name must not be empty";
/// See [`EMPTY`].
pub(crate) const UNPRINTABLE: &str =
    "a class name must not contain control or bidirectional formatting characters";

/// The canonical spelling of a class name: trimmed of Unicode white space (`"a "`, `"a\t"` and
/// `"a\u{a0}"` are `"a"`) and in Unicode normalisation form C (a precomposed `"é"` and `"e"`
/// with a combining accent are one name). Borrowed when `name` is already canonical (the
/// common case: no allocation on a lookup).
///
/// # Errors
/// [`EMPTY`] for a name that is only white space, [`UNPRINTABLE`] for a name with a control
/// character or a bidirectional formatting character (an override can make a log line show
/// one name and mean another).
pub(crate) fn canonical(name: &str) -> Result<Cow<'_, str>, &'static str> {
    let name = name.trim();
    if name.is_empty() {
        return Err(EMPTY);
    }
    if name.chars().any(|c| c.is_control() || is_bidi_format(c)) {
        return Err(UNPRINTABLE);
    }
    Ok(match is_nfc_quick(name.chars()) {
        IsNormalized::Yes => Cow::Borrowed(name),
        IsNormalized::No | IsNormalized::Maybe => Cow::Owned(name.nfc().collect()),
    })
}

/// The canonical spelling for a lookup: like [`canonical`], and a name it refuses is looked up
/// as given (it matches no class, since every stored name is canonical).
pub(crate) fn lookup_key(name: &str) -> Cow<'_, str> {
    canonical(name).unwrap_or(Cow::Borrowed(name))
}

/// Unicode's bidirectional formatting characters (`Bidi_Control`): marks, embeddings,
/// overrides and isolates.
fn is_bidi_format(c: char) -> bool {
    matches!(c, '\u{061C}' | '\u{200E}' | '\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trimming_and_normalisation_give_one_spelling() {
        for spelling in ["a", "a ", " a", "a\t", "a\u{a0}", "\u{3000}a\n"] {
            assert_eq!(canonical(spelling).unwrap(), "a", "{spelling:?}");
        }
        // "é" precomposed, and "e" followed by a combining acute accent.
        assert_eq!(
            canonical("caf\u{e9}").unwrap(),
            canonical("cafe\u{301}").unwrap()
        );
        assert!(matches!(
            canonical("batch").unwrap(),
            Cow::Borrowed("batch")
        ));
    }

    #[test]
    fn blank_control_and_bidi_names_are_refused() {
        assert_eq!(canonical(" \t").unwrap_err(), EMPTY);
        for bad in [
            "a\u{0}b",
            "a\u{1b}[31mb",
            "a\u{7f}",
            "a\u{85}b",
            "adm\u{202e}nim",
            "a\u{2066}b",
            "a\u{200f}",
        ] {
            assert_eq!(canonical(bad).unwrap_err(), UNPRINTABLE, "{bad:?}");
        }
        assert_eq!(lookup_key("a\u{202e}"), "a\u{202e}");
    }
}
