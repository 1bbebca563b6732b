//! The LLM layer's clock seam: where a timed run ([`LlmBulkhead::run_timed`] and its siblings)
//! reads the time. [`SystemClock`] is the real one; [`ManualClock`] moves only when told, so
//! that a test checks exact durations without sleeping. Untimed calls read no clock at all.
//!
//! [`LlmBulkhead::run_timed`]: super::LlmBulkhead::run_timed

use crate::sync::{AtomicU64, Ordering};
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A monotonic clock for the timing of runs ([`LlmBulkhead::with_clock`]). `now` never goes
/// back; it may be called from any thread, while the run's admission is held.
///
/// [`LlmBulkhead::with_clock`]: super::LlmBulkhead::with_clock
///
/// ```
/// use llm_bulkhead::llm::{Clock, SystemClock};
/// let c = SystemClock;
/// assert!(c.now() <= c.now());
/// ```
pub trait Clock: Send + Sync {
    /// The current instant.
    ///
    /// ```
    /// use llm_bulkhead::llm::{Clock, ManualClock};
    /// let c = ManualClock::new();
    /// assert_eq!(c.now(), c.origin());
    /// ```
    fn now(&self) -> Instant;
}

/// The real clock: [`Instant::now`] (the default of an [`LlmBulkhead`](super::LlmBulkhead)).
///
/// ```
/// use llm_bulkhead::llm::{Clock, SystemClock};
/// let before = std::time::Instant::now();
/// assert!(SystemClock.now() >= before);
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    #[inline]
    fn now(&self) -> Instant {
        Instant::now()
    }
}

/// A clock that moves only when told: its instants are its origin (the real instant it was
/// made at) plus what [`advance`](Self::advance) added. Clones share the time.
///
/// ```
/// use llm_bulkhead::llm::{Clock, ManualClock};
/// use std::time::Duration;
/// let c = ManualClock::new();
/// let twin = c.clone();
/// c.advance(Duration::from_millis(30));
/// assert_eq!(twin.now() - twin.origin(), Duration::from_millis(30));
/// ```
#[derive(Clone)]
pub struct ManualClock {
    origin: Instant,
    /// Nanoseconds added since the origin.
    offset: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock standing at its origin.
    ///
    /// ```
    /// use llm_bulkhead::llm::{Clock, ManualClock};
    /// let c = ManualClock::new();
    /// assert_eq!(c.elapsed(), std::time::Duration::ZERO);
    /// ```
    #[must_use]
    pub fn new() -> ManualClock {
        ManualClock {
            origin: Instant::now(),
            offset: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Moves the clock forward by `d` (saturating at `u64::MAX` nanoseconds from the origin).
    ///
    /// ```
    /// use llm_bulkhead::llm::ManualClock;
    /// use std::time::Duration;
    /// let c = ManualClock::new();
    /// c.advance(Duration::from_secs(2));
    /// assert_eq!(c.elapsed(), Duration::from_secs(2));
    /// ```
    pub fn advance(&self, d: Duration) {
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        // Relaxed: the offset is the only state; whoever reads it after an advance that
        // happened before (joined threads, a channel) sees it.
        let _ = self
            .offset
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |o| {
                Some(o.saturating_add(ns))
            });
    }

    /// The instant the clock started at.
    ///
    /// ```
    /// use llm_bulkhead::llm::{Clock, ManualClock};
    /// let c = ManualClock::new();
    /// assert_eq!(c.now(), c.origin());
    /// ```
    #[must_use]
    pub fn origin(&self) -> Instant {
        self.origin
    }

    /// How far the clock was moved since its origin.
    ///
    /// ```
    /// use llm_bulkhead::llm::ManualClock;
    /// assert_eq!(ManualClock::new().elapsed(), std::time::Duration::ZERO);
    /// ```
    #[must_use]
    pub fn elapsed(&self) -> Duration {
        Duration::from_nanos(self.offset.load(Ordering::Relaxed))
    }
}

impl Default for ManualClock {
    fn default() -> Self {
        ManualClock::new()
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Instant {
        // An instant this far from the origin is not representable only after centuries.
        self.origin
            .checked_add(self.elapsed())
            .unwrap_or(self.origin)
    }
}

impl fmt::Debug for ManualClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ManualClock")
            .field("elapsed", &self.elapsed())
            .finish()
    }
}
