//! The configuration's formats and errors.

use crate::{ApplyLimitsError, ConfigError};
use std::fmt;
use std::path::{Path, PathBuf};

/// A text format of the configuration types.
///
/// ```
/// use llm_bulkhead::config::Format;
/// assert_eq!(Format::from_path("limits.toml".as_ref()), Some(Format::Toml));
/// assert_eq!(Format::from_path("limits.JSON".as_ref()), Some(Format::Json));
/// assert_eq!(Format::from_path("limits.yaml".as_ref()), None);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Format {
    /// JSON (feature `json`).
    Json,
    /// TOML (feature `toml`).
    Toml,
}

impl Format {
    /// The format named by a file's extension (`.json` or `.toml`, any case).
    ///
    /// ```
    /// # use llm_bulkhead::config::Format;
    /// assert_eq!(Format::from_path("a/b.Toml".as_ref()), Some(Format::Toml));
    /// ```
    #[must_use]
    pub fn from_path(path: &Path) -> Option<Format> {
        let ext = path.extension()?.to_str()?.to_ascii_lowercase();
        match ext.as_str() {
            "json" => Some(Format::Json),
            "toml" => Some(Format::Toml),
            _ => None,
        }
    }

    /// The format's name.
    ///
    /// ```
    /// assert_eq!(llm_bulkhead::config::Format::Toml.as_str(), "toml");
    /// ```
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Format::Json => "json",
            Format::Toml => "toml",
        }
    }
}

/// Why a configuration could not be read, resolved or applied. Nothing was changed.
///
/// ```
/// use llm_bulkhead::config::{BulkheadConfig, LoadError};
/// let e = BulkheadConfig::from_json(r#"{"max_concurrent": -1}"#).unwrap_err();
/// assert!(matches!(e, LoadError::Parse { ref path, .. } if path == "max_concurrent"));
/// assert!(e.to_string().starts_with("max_concurrent: invalid value: integer `-1`, expected u32"));
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub enum LoadError {
    /// The file could not be read.
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The file's extension names no format this build can read.
    UnsupportedFormat {
        /// The file.
        path: PathBuf,
    },
    /// The text is not a valid configuration: a syntax error, an unknown field, a missing
    /// required field, a value out of its type's range.
    Parse {
        /// The format.
        format: Format,
        /// The dotted path of the offending field (empty at the top level).
        path: String,
        /// The parser's message (with the line and column where the parser gives them).
        message: String,
    },
    /// A limits snapshot names a class the bulkhead does not have.
    UnknownClass {
        /// The name given.
        class: String,
        /// The bulkhead's classes.
        known: Vec<String>,
    },
    /// A limits snapshot omits one of the bulkhead's classes.
    MissingClass {
        /// The class not named.
        class: String,
    },
    /// A limits snapshot has classes, and the bulkhead has none.
    UnexpectedClasses,
    /// The values break a rule (a bound, a floor above a ceiling, ...).
    Invalid(ConfigError),
    /// `apply_limits` refused the snapshot (a stale revision, or an invalid snapshot).
    Apply(ApplyLimitsError),
    /// The estimator settings are invalid (feature `llm`).
    #[cfg(feature = "llm")]
    #[cfg_attr(docsrs, doc(cfg(feature = "llm")))]
    Estimator(crate::llm::EstimateError),
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LoadError::Io { path, source } => write!(f, "reading {}: {source}", path.display()),
            LoadError::UnsupportedFormat { path } => write!(
                f,
                "{}: the extension names no format this build reads (.json with feature `json`, .toml with feature `toml`)",
                path.display()
            ),
            LoadError::Parse { path, message, .. } if path.is_empty() || path == "." => {
                f.write_str(message)
            }
            LoadError::Parse { path, message, .. } => write!(f, "{path}: {message}"),
            // The name is the snapshot's, of any length: quoted bounded.
            LoadError::UnknownClass { class, known } => write!(
                f,
                "admission_classes: unknown class {:?} (the bulkhead's classes are {known:?})",
                bounded(class)
            ),
            LoadError::MissingClass { class } => write!(
                f,
                "admission_classes: class {class:?} is missing (a snapshot names every class)"
            ),
            LoadError::UnexpectedClasses => f.write_str(
                "admission_classes: must be omitted because the bulkhead has no admission classes",
            ),
            LoadError::Invalid(e) => fmt::Display::fmt(e, f),
            LoadError::Apply(e) => fmt::Display::fmt(e, f),
            #[cfg(feature = "llm")]
            LoadError::Estimator(e) => write!(f, "estimator: {e}"),
        }
    }
}

impl std::error::Error for LoadError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            LoadError::Io { source, .. } => Some(source),
            LoadError::Invalid(e) => Some(e),
            LoadError::Apply(e) => Some(e),
            #[cfg(feature = "llm")]
            LoadError::Estimator(e) => Some(e),
            _ => None,
        }
    }
}

impl From<ConfigError> for LoadError {
    fn from(e: ConfigError) -> LoadError {
        LoadError::Invalid(e)
    }
}

/// The most characters of a parser's message (and of a field's path) an error keeps. A
/// configuration is operator input that error messages end up in logs with: a 10 MB value or
/// line is quoted as a short excerpt, never whole.
pub(crate) const MAX_QUOTED: usize = 160;

/// `s` cut to at most [`MAX_QUOTED`] characters (on a character boundary), saying how much was
/// left out.
pub(crate) fn bounded(s: &str) -> String {
    match s.char_indices().nth(MAX_QUOTED) {
        None => s.to_owned(),
        Some((cut, _)) => format!("{}... ({} more bytes)", &s[..cut], s.len() - cut),
    }
}
