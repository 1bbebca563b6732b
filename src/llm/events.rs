//! The LLM layer's events ([`LlmEvent`]): observe mode's bypasses and de-duplication. The core
//! delivers them in the bulkhead's one event stream as [`Event::Extension`], in the order they
//! happen among the core's own events, to the same subscribers; this module names them again.

use super::dedup::events::DedupEvent;
use super::observe::events::{BypassEvent, BypassReleaseEvent, BypassUsageEvent};
use crate::Event;

/// An event of the LLM layer, read from an [`Event`] with [`LlmEvent::of`]. Its name
/// ([`Event::name`]) is `bypass`, `bypass_usage`, `bypass_release` or `dedup`.
///
/// ```
/// use llm_bulkhead::llm::{LlmBulkhead, LlmEvent, LlmRequest, Mode, NaiveEstimator, RunOptions};
/// use llm_bulkhead::{Bulkhead, Event};
/// use std::sync::{Arc, Mutex};
/// let llm = LlmBulkhead::new(Bulkhead::new(0).unwrap(), NaiveEstimator);
/// let seen = Arc::new(Mutex::new(Vec::new()));
/// let log = seen.clone();
/// let sub = llm.bulkhead().subscribe(move |e: &Event| match LlmEvent::of(e) {
///     Some(LlmEvent::Bypass(b)) => log.lock().unwrap().push(format!("bypass {}", b.reason.as_str())),
///     Some(LlmEvent::BypassRelease(_)) => log.lock().unwrap().push("bypass_release".into()),
///     _ => {}
/// });
/// let observe = RunOptions { mode: Mode::observe(), ..RunOptions::default() };
/// llm.run_blocking(&LlmRequest::default(), observe, |_| Ok::<_, ()>(())).unwrap();
/// assert_eq!(*seen.lock().unwrap(), ["bypass concurrency_limit", "bypass_release"]);
/// # drop(sub);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LlmEvent<'a> {
    /// Observe mode ran refused work without an admission.
    Bypass(&'a BypassEvent),
    /// Bypassed work reported usage.
    BypassUsage(&'a BypassUsageEvent),
    /// Bypassed work finished.
    BypassRelease(&'a BypassReleaseEvent),
    /// A de-duplicated run joined a call in flight, or got no result from it.
    Dedup(&'a DedupEvent),
}

impl<'a> LlmEvent<'a> {
    /// The LLM layer's event `event` carries (`None` for the core's events).
    ///
    /// ```
    /// use llm_bulkhead::llm::LlmEvent;
    /// use llm_bulkhead::{Bulkhead, Event};
    /// let b = Bulkhead::new(1).unwrap();
    /// let mut next = b.limits();
    /// next.revision += 1;
    /// let change = b.apply_limits(next).unwrap();
    /// assert_eq!(LlmEvent::of(&Event::Reconfigure(Box::new(change))), None);
    /// ```
    #[must_use]
    pub fn of(event: &'a Event) -> Option<LlmEvent<'a>> {
        let Event::Extension(x) = event else {
            return None;
        };
        if let Some(e) = x.downcast_ref() {
            return Some(LlmEvent::Bypass(e));
        }
        if let Some(e) = x.downcast_ref() {
            return Some(LlmEvent::BypassUsage(e));
        }
        if let Some(e) = x.downcast_ref() {
            return Some(LlmEvent::BypassRelease(e));
        }
        x.downcast_ref().map(LlmEvent::Dedup)
    }

    /// The event's name (as [`Event::name`]).
    ///
    /// ```
    /// use llm_bulkhead::llm::{DedupEvent, LlmEvent};
    /// fn name(e: &DedupEvent) -> &'static str { LlmEvent::Dedup(e).name() }
    /// # let _ = name;
    /// ```
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            LlmEvent::Bypass(_) => "bypass",
            LlmEvent::BypassUsage(_) => "bypass_usage",
            LlmEvent::BypassRelease(_) => "bypass_release",
            LlmEvent::Dedup(_) => "dedup",
        }
    }
}

/// Makes `$t` a payload of [`Event::Extension`] named `$name` (the type has a `class:
/// Option<String>` field, `PartialEq`, `Debug` and, with `serde`, `Serialize`).
macro_rules! payload {
    ($t:ty, $name:literal) => {
        impl crate::record::events::Payload for $t {
            fn name(&self) -> &'static str {
                $name
            }
            fn class(&self) -> Option<&str> {
                self.class.as_deref()
            }
            fn as_any(&self) -> &dyn std::any::Any {
                self
            }
            fn eq_payload(&self, other: &dyn crate::record::events::Payload) -> bool {
                other.as_any().downcast_ref::<$t>() == Some(self)
            }
            #[cfg(feature = "serde")]
            fn fields(&self) -> &dyn erased_serde::Serialize {
                self
            }
        }
    };
}
pub(crate) use payload;

/// Emits the LLM layer's event `make` builds to the subscribers of `bulkhead`, if any: one
/// `Relaxed` flag load when nobody subscribes (nothing is built or allocated then).
#[inline]
pub(crate) fn emit<P: crate::record::events::Payload>(
    bulkhead: &crate::Bulkhead,
    make: impl FnOnce() -> P,
) {
    crate::handle::events::emit(&bulkhead.shared, || {
        Event::Extension(crate::record::events::ExtensionEvent::new(make()))
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_names_agree_with_the_payloads() {
        let d = DedupEvent {
            class: Some("a".into()),
            outcome: super::super::dedup::events::DedupOutcome::Joined,
        };
        let e = Event::Extension(crate::record::events::ExtensionEvent::new(d.clone()));
        assert_eq!(
            (e.name(), LlmEvent::of(&e).map(LlmEvent::name)),
            ("dedup", Some("dedup"))
        );
        assert_eq!(LlmEvent::of(&e), Some(LlmEvent::Dedup(&d)));
        let Event::Extension(x) = &e else { panic!() };
        assert_eq!(x.class(), Some("a"));
        assert_eq!(e.clone(), e);
        let other = DedupEvent { class: None, ..d };
        assert_ne!(
            e,
            Event::Extension(crate::record::events::ExtensionEvent::new(other))
        );
    }
}
