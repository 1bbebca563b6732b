//! Reading and writing the configuration types as JSON (feature `json`) and TOML (feature
//! `toml`), and the file helper for a control plane.

use super::error::bounded;
use super::{BulkheadConfig, Format, LimitsConfig, LoadError};
use crate::{ApplyLimitsError, Bulkhead, LimitsChange};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::path::Path;

/// A JSON error's message, bounded, with its position.
#[cfg(feature = "json")]
fn json_message(e: &serde_json::Error) -> String {
    let whole = e.to_string();
    let at = format!(" at line {} column {}", e.line(), e.column());
    match whole.strip_suffix(&at) {
        Some(message) if e.line() > 0 => format!("{}{at}", bounded(message)),
        _ => bounded(&whole),
    }
}

/// A TOML error's message, bounded, with the line and column of its span and a short excerpt
/// of that line (the parser's own rendering quotes the whole line, whatever its length).
#[cfg(feature = "toml")]
fn toml_message(e: &toml::de::Error, text: &str) -> String {
    let message = bounded(e.message().trim_end());
    let Some(span) = e.span() else {
        return message;
    };
    let start = span.start.min(text.len());
    let before = text.get(..start).unwrap_or("");
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let column = before[line_start..].chars().count() + 1;
    // Up to 40 characters of its line either side of the error.
    let lead: String = {
        let mut back: Vec<char> = before[line_start..].chars().rev().take(40).collect();
        back.reverse();
        back.into_iter().collect()
    };
    let rest: String = text
        .get(start..)
        .and_then(|t| t.lines().next())
        .unwrap_or("")
        .chars()
        .take(40)
        .collect();
    let excerpt = format!("{lead}{rest}");
    format!("line {line}, column {column}: {message} (near {excerpt:?})")
}

/// Parses `text` as `format`, naming the field of any error (also the pools'
/// configuration). Messages and paths are bounded ([`MAX_QUOTED`](super::error::MAX_QUOTED)).
pub(crate) fn parse<T: DeserializeOwned>(format: Format, text: &str) -> Result<T, LoadError> {
    let fail = |path: &str, message: String| LoadError::Parse {
        format,
        path: bounded(path),
        message,
    };
    match format {
        #[cfg(feature = "json")]
        Format::Json => {
            let mut de = serde_json::Deserializer::from_str(text);
            let value: T = serde_path_to_error::deserialize(&mut de)
                .map_err(|e| fail(&e.path().to_string(), json_message(e.inner())))?;
            de.end().map_err(|e| fail("", json_message(&e)))?;
            Ok(value)
        }
        #[cfg(feature = "toml")]
        Format::Toml => {
            let de =
                toml::Deserializer::parse(text).map_err(|e| fail("", toml_message(&e, text)))?;
            serde_path_to_error::deserialize(de)
                .map_err(|e| fail(&e.path().to_string(), toml_message(e.inner(), text)))
        }
        #[allow(unreachable_patterns)]
        _ => Err(fail(
            "",
            format!(
                "this build cannot read {} (enable the `{}` feature)",
                format.as_str(),
                format.as_str()
            ),
        )),
    }
}

/// Writes `value` as `format`.
fn write<T: Serialize>(format: Format, value: &T) -> String {
    match format {
        // Serialising these types cannot fail: their maps have string keys and no value is
        // a float, so the fallbacks are never taken.
        #[cfg(feature = "json")]
        Format::Json => serde_json::to_string_pretty(value).unwrap_or_default(),
        #[cfg(feature = "toml")]
        Format::Toml => toml::to_string(value).unwrap_or_default(),
        #[allow(unreachable_patterns)]
        _ => String::new(),
    }
}

fn read(path: &Path) -> Result<(Format, String), LoadError> {
    let format = Format::from_path(path).ok_or_else(|| LoadError::UnsupportedFormat {
        path: path.to_owned(),
    })?;
    if !cfg!(feature = "json") && format == Format::Json
        || !cfg!(feature = "toml") && format == Format::Toml
    {
        return Err(LoadError::UnsupportedFormat {
            path: path.to_owned(),
        });
    }
    let text = std::fs::read_to_string(path).map_err(|source| LoadError::Io {
        path: path.to_owned(),
        source,
    })?;
    Ok((format, text))
}

macro_rules! text_methods {
    ($ty:ty, $what:literal) => {
        impl $ty {
            /// Parses
            #[doc = $what]
            /// from `text` in `format`.
            ///
            /// # Errors
            /// [`LoadError::Parse`] with the field's path and the parser's message.
            ///
            /// ```
            /// # #[cfg(feature = "json")] {
            /// use llm_bulkhead::config::*;
            #[doc = concat!("assert!(", stringify!($ty), "::parse(Format::Json, \"{\\\"bogus\\\": 1}\").is_err());")]
            /// # }
            /// ```
            pub fn parse(format: Format, text: &str) -> Result<Self, LoadError> {
                parse(format, text)
            }

            /// Writes
            #[doc = $what]
            /// in `format` (JSON pretty-printed; absent optional fields are left out).
            ///
            /// ```
            /// # #[cfg(feature = "json")] {
            /// use llm_bulkhead::config::*;
            #[doc = concat!("let v = ", stringify!($ty), "::default();")]
            #[doc = concat!("assert_eq!(", stringify!($ty), "::parse(Format::Json, &v.write(Format::Json)).unwrap(), v);")]
            /// # }
            /// ```
            pub fn write(&self, format: Format) -> String {
                write(format, self)
            }

            /// Reads
            #[doc = $what]
            /// from a `.json` or `.toml` file.
            ///
            /// # Errors
            /// [`LoadError::UnsupportedFormat`], [`LoadError::Io`] or [`LoadError::Parse`].
            ///
            /// ```
            /// use llm_bulkhead::config::*;
            #[doc = concat!("assert!(matches!(", stringify!($ty), "::from_file(\"/nonexistent/x.yaml\".as_ref()), Err(LoadError::UnsupportedFormat { .. })));")]
            /// ```
            pub fn from_file(path: &Path) -> Result<Self, LoadError> {
                let (format, text) = read(path)?;
                parse(format, &text)
            }

            /// Parses
            #[doc = $what]
            /// from JSON (feature `json`).
            ///
            /// # Errors
            /// As [`parse`](Self::parse).
            ///
            /// ```
            /// use llm_bulkhead::config::*;
            #[doc = concat!("let v = ", stringify!($ty), "::default();")]
            #[doc = concat!("assert_eq!(", stringify!($ty), "::from_json(&v.to_json()).unwrap(), v);")]
            /// ```
            #[cfg(feature = "json")]
            #[cfg_attr(docsrs, doc(cfg(feature = "json")))]
            pub fn from_json(text: &str) -> Result<Self, LoadError> {
                parse(Format::Json, text)
            }

            /// Writes
            #[doc = $what]
            /// as pretty JSON (feature `json`).
            ///
            /// ```
            /// use llm_bulkhead::config::*;
            #[doc = concat!("assert!(", stringify!($ty), "::default().to_json().starts_with('{'));")]
            /// ```
            #[cfg(feature = "json")]
            #[cfg_attr(docsrs, doc(cfg(feature = "json")))]
            pub fn to_json(&self) -> String {
                write(Format::Json, self)
            }

            /// Parses
            #[doc = $what]
            /// from TOML (feature `toml`).
            ///
            /// # Errors
            /// As [`parse`](Self::parse).
            ///
            /// ```
            /// use llm_bulkhead::config::*;
            #[doc = concat!("let v = ", stringify!($ty), "::default();")]
            #[doc = concat!("assert_eq!(", stringify!($ty), "::from_toml(&v.to_toml()).unwrap(), v);")]
            /// ```
            #[cfg(feature = "toml")]
            #[cfg_attr(docsrs, doc(cfg(feature = "toml")))]
            pub fn from_toml(text: &str) -> Result<Self, LoadError> {
                parse(Format::Toml, text)
            }

            /// Writes
            #[doc = $what]
            /// as TOML (feature `toml`).
            ///
            /// ```
            /// use llm_bulkhead::config::*;
            #[doc = concat!("assert!(", stringify!($ty), "::default().to_toml().contains(\"max_concurrent = 0\"));")]
            /// ```
            #[cfg(feature = "toml")]
            #[cfg_attr(docsrs, doc(cfg(feature = "toml")))]
            pub fn to_toml(&self) -> String {
                write(Format::Toml, self)
            }
        }
    };
}

text_methods!(BulkheadConfig, "a bulkhead configuration");
text_methods!(LimitsConfig, "a limits snapshot");

/// What [`apply_limits_file`] did.
///
/// ```
/// use llm_bulkhead::config::FileOutcome;
/// let o = FileOutcome::NotNewer { file_revision: 3, current_revision: 5 };
/// assert!(!o.applied());
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum FileOutcome {
    /// The file's snapshot was newer and is now installed (boxed: two snapshots are large).
    Applied(Box<LimitsChange>),
    /// The file's revision is not newer than the current one: nothing was changed.
    NotNewer {
        /// The file's revision.
        file_revision: u64,
        /// The revision that stays current.
        current_revision: u64,
    },
}

impl FileOutcome {
    /// Whether the snapshot was installed.
    ///
    /// ```
    /// # use llm_bulkhead::config::FileOutcome;
    /// assert!(!FileOutcome::NotNewer { file_revision: 1, current_revision: 1 }.applied());
    /// ```
    #[must_use]
    pub fn applied(&self) -> bool {
        matches!(self, FileOutcome::Applied(_))
    }
}

/// Reads a [`LimitsConfig`] from a `.json` or `.toml` file and applies it to `bulkhead` only
/// if its revision is newer than the current one. A poller can call it on every change of the
/// file (or on a timer): an unchanged file is [`FileOutcome::NotNewer`], not an error.
///
/// # Errors
/// Reading, parsing or resolving the file ([`LoadError`]), or an invalid snapshot
/// ([`LoadError::Apply`] with [`ApplyLimitsError::Invalid`]). Nothing is installed then.
///
/// ```
/// use llm_bulkhead::config::{apply_limits_file, FileOutcome};
/// use llm_bulkhead::Bulkhead;
/// let dir = std::env::temp_dir().join(format!("llm-bulkhead-doc-{}", std::process::id()));
/// std::fs::create_dir_all(&dir)?;
/// let path = dir.join("limits.json");
/// std::fs::write(&path, r#"{"revision": 2, "max_concurrent": 0, "max_queue": 0}"#)?;
/// let b = Bulkhead::new(8)?;
/// assert!(apply_limits_file(&b, &path)?.applied());
/// assert_eq!(b.limits().max_concurrent, 0);
/// assert_eq!(apply_limits_file(&b, &path)?, FileOutcome::NotNewer { file_revision: 2, current_revision: 2 });
/// # std::fs::remove_dir_all(&dir)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn apply_limits_file(bulkhead: &Bulkhead, path: &Path) -> Result<FileOutcome, LoadError> {
    let config = LimitsConfig::from_file(path)?;
    let current = bulkhead.limits().revision;
    if config.revision <= current {
        return Ok(FileOutcome::NotNewer {
            file_revision: config.revision,
            current_revision: current,
        });
    }
    match config.apply(bulkhead) {
        Ok(change) => Ok(FileOutcome::Applied(Box::new(change))),
        // A newer snapshot was installed between the check and the apply.
        Err(LoadError::Apply(ApplyLimitsError::StaleRevision { attempted, current })) => {
            Ok(FileOutcome::NotNewer {
                file_revision: attempted,
                current_revision: current.revision,
            })
        }
        Err(e) => Err(e),
    }
}
