//! The LLM layer: chat requests as gateways receive them, and token estimation.
//!
//! This layer turns a provider-shaped request into the [`Reservation`](crate::Reservation) the
//! admission core works with. It needs the default `serde` feature (requests are deserialised
//! from the JSON a gateway already has).
//!
//! ```
//! use llm_bulkhead::llm::{LlmRequest, ModelAwareEstimator, TokenEstimator};
//! use llm_bulkhead::{Bulkhead, Demand};
//!
//! let request: LlmRequest = serde_json::from_str(r#"{
//!     "model": "claude-sonnet-4-5",
//!     "system": "You are terse.",
//!     "messages": [{"role": "user", "content": [{"type": "text", "text": "Hello"}, {"type": "image", "source": {}}]}],
//!     "max_tokens": 1024
//! }"#)?;
//! let estimator = ModelAwareEstimator::builder().opaque_block_tokens(1_500).build()?;
//! let reservation = estimator.estimate(&request)?;
//! assert_eq!(reservation.max_output(), 1_024);
//!
//! let bulkhead = Bulkhead::builder().max_concurrent(8).token_budget(100_000).build()?;
//! let admission = bulkhead.try_acquire(Demand::tokens(reservation))?;
//! # drop(admission);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod adaptive;
mod clock;
mod dedup;
mod estimate;
mod events;
pub(crate) mod observe;
mod request;
mod run;
mod shared_run;

pub use adaptive::{AdaptiveEstimator, AdaptiveEstimatorBuilder, Correction};
pub use clock::{Clock, ManualClock, SystemClock};
pub use dedup::events::{DedupEvent, DedupOutcome};
pub use dedup::{Dedup, DedupError, DedupKey, DedupRun, DedupStats, FollowerOptions};
pub use estimate::{
    EstimateError, ModelAwareEstimator, ModelAwareEstimatorBuilder, NaiveEstimator,
    OpaqueBlockTokens, ReservationOverride, TokenEstimator, BUILT_IN_RATIOS,
    DEFAULT_MAX_PARSED_PARTS, DEFAULT_MAX_PARTS, DEFAULT_OUTPUT_CAP, MAX_OUTPUT_CAP, RATIO_RANGE,
};
pub use events::LlmEvent;
pub use observe::events::{BypassEvent, BypassReleaseEvent, BypassUsageEvent};
pub use observe::id::RunId;
pub use observe::stats::ObserveStats;
pub use observe::{AdmissionKind, Mode, ModeError, ShadowReasons};
pub use request::{utf16_len, Content, ContentBlock, LlmRequest, Message};
pub use run::{
    AcquireError, Deadline, DeadlineExpired, DeadlineTrigger, Detach, DetachedWork, LlmBulkhead,
    NoUsage, RunContext, RunError, RunOptions, RunTimed, RunTiming, StopCause, StopSignal,
    StopSignalFuture, Stopped, UsageFrom,
};
pub use shared_run::{BoxWork, DedupKeyFn, DedupSettings, LlmStats};
