//! In-flight de-duplication: identical requests share one upstream call (reference §9.2).
//!
//! A [`Dedup`] holds the calls in flight, keyed by a 128-bit [`DedupKey`]: by default a
//! stable hash of the **whole** request (field order is irrelevant, every field counts),
//! partitioned by a caller-given scope (a tenant) and by admission class. The map stores keys
//! only, never prompt text, and holds at most `max_in_flight` keys (a call that finds it full
//! runs on its own, counted in [`DedupStats::full`]).
//!
//! [`Dedup::run`] registers synchronously: the first caller of a key becomes the **leader**
//! and its work (typically an [`LlmBulkhead`](crate::llm::LlmBulkhead) `run`) starts; every
//! identical call while it is in flight becomes a **follower** and runs nothing. The work is
//! owned by the flight, not by the leader's caller: every participant drives it, so dropping
//! the leader's future (its caller was cancelled) does not cancel the call its followers wait
//! on; only when every participant is gone is the work dropped.
//!
//! Sharing needs a shareable result: `T: Clone` ([`Dedup::new`]) or a caller-given share
//! function ([`Dedup::with_share`]) for results that are not, such as a single-consumer
//! stream, so one stream is never handed to two callers. The leader always gets its own
//! result untouched; followers get shares made when the call completes. A leader's failure is
//! part of `T` (typically a `Result`) and reaches its followers the same way.
//!
//! Followers wait with their own cancellation (a [`CancelToken`](crate::CancelToken) in
//! [`FollowerOptions::cancel`], or dropping the future) and an explicit per-call timeout only
//! (a bulkhead's default timeout does not apply to them). A follower that leaves does not
//! cancel the call: the leader and the other followers go on.
//!
//! ```
//! use llm_bulkhead::llm::{Dedup, DedupKey, FollowerOptions, LlmRequest};
//! use std::sync::atomic::{AtomicU32, Ordering};
//! use std::sync::Arc;
//!
//! let dedup: Dedup<String> = Dedup::new(1_000);
//! let calls = Arc::new(AtomicU32::new(0));
//! let request = LlmRequest::new("gpt-4o", &["What is a bulkhead?"]);
//! let key = DedupKey::of_request(&request).partition("tenant-a", None);
//! let call = |calls: Arc<AtomicU32>| move || async move {
//!     calls.fetch_add(1, Ordering::SeqCst);
//!     "an answer".to_string()
//! };
//! let leader = dedup.run(Some(key), FollowerOptions::default(), call(calls.clone()));
//! let follower = dedup.run(Some(key), FollowerOptions::default(), call(calls.clone()));
//! let (a, b) = futures_lite::future::block_on(async { (leader.await, follower.await) });
//! assert_eq!((a.unwrap(), b.unwrap()), ("an answer".to_string(), "an answer".to_string()));
//! assert_eq!(calls.load(Ordering::SeqCst), 1); // one upstream call
//! assert_eq!(dedup.stats().hits, 1);
//! ```

use super::request::LlmRequest;
use crate::sync::{lock, AtomicU32, AtomicU64, AtomicUsize, Mutex, Ordering};
use crate::vocab::class::ClassId;
use crate::wait::cancel::CancelWake;
use std::collections::hash_map::{Entry, HashMap};
use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

mod canon;
pub(crate) mod events;
mod flight;
mod refs;
use canon::Canon;
pub use flight::DedupRun;
use flight::*;
use refs::*;

/// The identity of a call for de-duplication: a 128-bit hash (XXH3-128) of a canonical
/// encoding of the request, optionally partitioned by scope and class. Holds no text.
///
/// ```
/// use llm_bulkhead::llm::{DedupKey, LlmRequest};
/// let a: LlmRequest = serde_json::from_str(r#"{"model":"m","temperature":0,"messages":[{"role":"user","content":"hi"}]}"#).unwrap();
/// let b: LlmRequest = serde_json::from_str(r#"{"messages":[{"content":"hi","role":"user"}],"temperature":0,"model":"m"}"#).unwrap();
/// let c: LlmRequest = serde_json::from_str(r#"{"model":"m","temperature":1,"messages":[{"role":"user","content":"hi"}]}"#).unwrap();
/// assert_eq!(DedupKey::of_request(&a), DedupKey::of_request(&b)); // field order is irrelevant
/// assert_ne!(DedupKey::of_request(&a), DedupKey::of_request(&c)); // every field counts
/// assert_ne!(DedupKey::of_request(&a).partition("t1", None), DedupKey::of_request(&a).partition("t2", None));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DedupKey(u128);

impl DedupKey {
    /// The default key: the whole request (model, messages with their roles, content and
    /// every other field, system prompt, `max_tokens`, `extra_input_tokens`, and every
    /// unknown top-level field), with object keys in sorted order.
    #[must_use]
    pub fn of_request(request: &LlmRequest) -> DedupKey {
        let mut h = Canon::new();
        h.request(request);
        DedupKey(h.finish())
    }

    /// [`of_request`](Self::of_request) inside partition `scope` and `class`, in one pass
    /// (the same key as `of_request(request).partition(scope, class)` would not be: this one
    /// hashes the partition and the request together, and is cheaper).
    ///
    /// ```
    /// # use llm_bulkhead::llm::{DedupKey, LlmRequest};
    /// let r = LlmRequest::new("m", &["hi"]);
    /// assert_eq!(DedupKey::for_request(&r, "t", None), DedupKey::for_request(&r, "t", None));
    /// assert_ne!(DedupKey::for_request(&r, "t", None), DedupKey::for_request(&r, "u", None));
    /// ```
    #[must_use]
    pub fn for_request(request: &LlmRequest, scope: &str, class: Option<ClassId>) -> DedupKey {
        let mut h = Canon::new();
        h.tag(10);
        h.partition(scope, class);
        h.request(request);
        DedupKey(h.finish())
    }
    /// A key from caller-chosen bytes (a custom key function's output). Empty bytes opt out
    /// of de-duplication (`None`), as an empty key does in the reference.
    ///
    /// ```
    /// # use llm_bulkhead::llm::DedupKey;
    /// assert!(DedupKey::of_bytes(b"").is_none());
    /// assert_eq!(DedupKey::of_bytes(b"same"), DedupKey::of_bytes(b"same"));
    /// ```
    #[must_use]
    pub fn of_bytes(raw: &[u8]) -> Option<DedupKey> {
        if raw.is_empty() {
            return None;
        }
        let mut h = Canon::new();
        h.tag(8);
        h.bytes(raw);
        Some(DedupKey(h.finish()))
    }

    /// This key inside partition `scope` (a tenant; `""` for none) and `class` (with
    /// admission classes, equal requests of different classes never share a call).
    ///
    /// ```
    /// # use llm_bulkhead::llm::DedupKey;
    /// let k = DedupKey::of_bytes(b"x").unwrap();
    /// assert_ne!(k.partition("", None), k);
    /// assert_eq!(k.partition("a", None), k.partition("a", None));
    /// ```
    #[must_use]
    pub fn partition(self, scope: &str, class: Option<ClassId>) -> DedupKey {
        let mut h = Canon::new();
        h.tag(9);
        h.partition(scope, class);
        h.bytes(&self.0.to_le_bytes());
        DedupKey(h.finish())
    }

    /// This key in the space of one result type (`tag`): calls whose results have different
    /// types never share a flight of a type-erased map.
    pub(super) fn typed(self, tag: u64) -> DedupKey {
        DedupKey(self.0 ^ u128::from(tag).wrapping_mul(0x9E37_79B9_7F4A_7C15_F39C_C060_5CED_C835))
    }

    /// The key's value. Keys are process-local: the value may change between versions of
    /// the crate (the encoding it hashes is no format), so do not persist it.
    ///
    /// ```
    /// # use llm_bulkhead::llm::DedupKey;
    /// assert_ne!(DedupKey::of_bytes(b"x").unwrap().as_u128(), 0);
    /// ```
    #[must_use]
    pub fn as_u128(self) -> u128 {
        self.0
    }
}

/// A follower's wait options: an explicit timeout and a cancellation token (dropping the
/// future also leaves). Neither cancels the shared call: only this follower leaves.
///
/// ```
/// use llm_bulkhead::llm::FollowerOptions;
/// use llm_bulkhead::CancelToken;
/// use std::time::Duration;
/// let o = FollowerOptions { timeout: Some(Duration::from_secs(5)), cancel: Some(CancelToken::new()) };
/// assert!(FollowerOptions::default().timeout.is_none());
/// # let _ = o;
/// ```
#[derive(Clone, Debug, Default)]
pub struct FollowerOptions {
    /// Give up waiting on the leader's call after this long (`timeout`); the call goes on.
    pub timeout: Option<Duration>,
    /// Give up waiting once this token is cancelled ([`DedupError::Cancelled`]); the call goes
    /// on for the leader and the other followers. A cancellation wakes the follower at once.
    pub cancel: Option<crate::CancelToken>,
}

/// Why a follower got no result.
///
/// ```
/// use llm_bulkhead::llm::DedupError;
/// assert_eq!(DedupError::Timeout.to_string(), "timed out waiting for the shared call");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DedupError {
    /// The follower's own timeout passed first; the shared call was not cancelled.
    Timeout,
    /// The share function panicked for this follower (the leader's result is untouched).
    Unshareable,
    /// The follower's own cancellation token fired first; the shared call was not cancelled.
    Cancelled,
}

impl std::fmt::Display for DedupError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DedupError::Timeout => f.write_str("timed out waiting for the shared call"),
            DedupError::Unshareable => f.write_str("the shared result could not be shared"),
            DedupError::Cancelled => f.write_str("cancelled waiting for the shared call"),
        }
    }
}

impl std::error::Error for DedupError {}

/// De-duplication counters.
///
/// ```
/// let d: llm_bulkhead::llm::Dedup<u8> = llm_bulkhead::llm::Dedup::new(8);
/// assert_eq!(d.stats(), llm_bulkhead::llm::DedupStats::default());
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct DedupStats {
    /// Keys in flight now.
    pub active: usize,
    /// Followers that joined a call in flight (counted even if they then fail).
    pub hits: u64,
    /// Calls that led a flight.
    pub leaders: u64,
    /// Calls that ran on their own because the map was full.
    pub full: u64,
    /// Followers that got no result because it could not be shared with them (a share
    /// function that panicked, or, through [`LlmBulkhead::run_shared_with`](crate::llm::LlmBulkhead::run_shared_with),
    /// one that declined).
    pub unshareable: u64,
    /// Followers that gave up at their own timeout (the shared call went on).
    pub timeouts: u64,
    /// Followers whose own cancellation token fired while they waited (the shared call went
    /// on).
    #[cfg_attr(feature = "serde", serde(default))]
    pub cancelled: u64,
}

type Work<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// A follower deadline for a timeout too large to add to the current instant: about a
/// century, so it never expires in practice.
const FAR: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// The map's keys are already uniform 128-bit hashes: hash them by taking their low 64 bits.
#[derive(Clone, Copy, Default)]
struct KeyHasher(u64);

impl std::hash::Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }
    fn write_u128(&mut self, v: u128) {
        self.0 = v as u64;
    }
}

type FlightMap<T> = HashMap<u128, Entered<T>, std::hash::BuildHasherDefault<KeyHasher>>;

/// A key's flight in the map (its address, not a counted reference: [`FlightPtr`]), and
/// whether a follower ever joined it (read and written under the map's lock only): a leader
/// whose flight nobody joined completes under the map's lock alone, without the flight's
/// (nobody else can reach the flight once its key is gone).
struct Entered<T> {
    flight: FlightPtr<T>,
    joined: bool,
}
type ShareFn<T> = Box<dyn Fn(&T) -> T + Send + Sync>;

/// The calls in flight of one result type (see the module docs). Cloning shares the map.
///
/// # Memory ordering
/// Registration, completion and departure happen under the map's and the flight's mutexes
/// (map before flight when both are held; completion takes them one after the other), so a
/// follower either joins a flight before its completion (and is given a share) or finds the
/// key free and leads a new one. The work itself (in the flight's allocation, not boxed) is
/// touched only by the participant that claimed it (an `Acquire` compare-and-swap on the
/// flight's claim word, given back with `Release`; without the flight's mutex when nothing
/// else is to be checked), and dropped by the one that marked the flight done. The map holds
/// each flight's address, not a counted reference: the participant that settles a flight
/// removes its key before it lets go of the flight. Counters are relaxed statistics.
pub struct Dedup<T> {
    inner: Arc<Inner<T>>,
}

impl<T> Clone for Dedup<T> {
    fn clone(&self) -> Self {
        Dedup {
            inner: self.inner.clone(),
        }
    }
}

impl<T> std::fmt::Debug for Dedup<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dedup")
            .field("max_in_flight", &self.inner.max_in_flight)
            .finish_non_exhaustive()
    }
}

/// The flights in flight, and the counters that change only with the map, kept under its
/// lock (plain integers: no atomic operation of their own).
struct Registry<T> {
    map: FlightMap<T>,
    hits: u64,
    leaders: u64,
    full: u64,
}

pub(super) struct Inner<T> {
    flights: Mutex<Registry<T>>,
    max_in_flight: usize,
    share: ShareFn<T>,
    unshareable: AtomicU64,
    timeouts: AtomicU64,
    cancelled: AtomicU64,
}

impl<T: Clone + Send + 'static> Dedup<T> {
    /// De-duplication of a `Clone` result, holding at most `max_in_flight` keys.
    ///
    /// ```
    /// let d: llm_bulkhead::llm::Dedup<String> = llm_bulkhead::llm::Dedup::new(10_000);
    /// assert_eq!(d.stats().active, 0);
    /// ```
    pub fn new(max_in_flight: usize) -> Dedup<T> {
        Dedup::with_share(max_in_flight, T::clone)
    }
}

impl<T: Send + 'static> Dedup<T> {
    /// De-duplication whose followers get `share(&result)`, for results that are not `Clone`
    /// or must not be handed out twice (a stream: `share` opens a fresh one). The leader gets
    /// the original.
    ///
    /// ```
    /// use llm_bulkhead::llm::Dedup;
    /// // A result that must not be cloned as is: followers get their own copy, marked.
    /// let d: Dedup<(String, bool)> = Dedup::with_share(100, |r: &(String, bool)| (r.0.clone(), true));
    /// # let _ = d;
    /// ```
    pub fn with_share(
        max_in_flight: usize,
        share: impl Fn(&T) -> T + Send + Sync + 'static,
    ) -> Dedup<T> {
        Dedup {
            inner: Arc::new(Inner {
                flights: Mutex::new(Registry {
                    map: FlightMap::default(),
                    hits: 0,
                    leaders: 0,
                    full: 0,
                }),
                max_in_flight,
                share: Box::new(share),
                unshareable: AtomicU64::new(0),
                timeouts: AtomicU64::new(0),
                cancelled: AtomicU64::new(0),
            }),
        }
    }

    /// Runs `work` for `key`, or joins the call already in flight for it. Registration
    /// happens here, synchronously; `key: None` opts out (the work runs on its own). `work`
    /// is called only by a leader (or a solo call).
    ///
    /// # Cancel safety
    /// Dropping a follower's future leaves the flight; dropping the leader's does not cancel
    /// the call while followers wait (they drive it). The work is dropped only when no
    /// participant is left.
    ///
    /// ```
    /// use llm_bulkhead::llm::{Dedup, DedupKey, FollowerOptions};
    /// let d: Dedup<u32> = Dedup::new(8);
    /// let r = futures_lite::future::block_on(d.run(DedupKey::of_bytes(b"k"), FollowerOptions::default(), || async { 7 }));
    /// assert_eq!(r, Ok(7));
    /// assert_eq!(d.stats().active, 0); // settled: the key is free again
    /// ```
    pub fn run<F, Fut>(
        &self,
        key: Option<DedupKey>,
        options: FollowerOptions,
        work: F,
    ) -> DedupRun<T>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = T> + Send + 'static,
    {
        let inner = self.inner.clone();
        let Some(key) = key else {
            return DedupRun::solo(inner, Box::pin(work()));
        };
        let mut reg = lock(&inner.flights);
        let len = reg.map.len();
        // One probe of the map: the entry is looked up and, when free, filled in place.
        let vacant = match reg.map.entry(key.0) {
            Entry::Occupied(mut e) => {
                // SAFETY: the entry is in the map, read under the map's lock (`FlightPtr`).
                let named = unsafe { e.get().flight.get() };
                let mut st = lock(named.st());
                // Relaxed: `DONE` is turned on under the flight's lock, held here.
                if named.head().flags.load(Ordering::Relaxed) & DONE == 0 {
                    let id = st.followers.len();
                    st.followers.push(Share::Waiting);
                    st.participants += 1;
                    drop(st);
                    // SAFETY: as above.
                    let flight = unsafe { e.get().flight.counted() };
                    e.get_mut().joined = true;
                    reg.hits += 1;
                    drop(reg);
                    return DedupRun {
                        inner,
                        role: Role::Follower {
                            key: key.0,
                            flight,
                            id,
                        },
                        timeout: options.timeout,
                        deadline: None,
                        timer: None,
                        cancel: options.cancel.map(CancelWake::new),
                    };
                }
                // Settled, its entry not yet removed: this call starts a new flight in its
                // place (the settled one does not count against the bound).
                drop(st);
                if len > inner.max_in_flight {
                    e.remove();
                    None
                } else {
                    Some(Entry::Occupied(e))
                }
            }
            Entry::Vacant(e) => (len < inner.max_in_flight).then_some(Entry::Vacant(e)),
        };
        let Some(slot) = vacant else {
            reg.full += 1;
            drop(reg);
            return DedupRun::solo(inner, Box::pin(work()));
        };
        let flight = new_flight(work());
        let entered = Entered {
            flight: FlightPtr::of(&flight),
            joined: false,
        };
        match slot {
            // The settled flight's address is forgotten (it was no counted reference).
            Entry::Occupied(mut e) => drop(e.insert(entered)),
            Entry::Vacant(e) => drop(e.insert(entered)),
        }
        reg.leaders += 1;
        drop(reg);
        DedupRun {
            inner,
            role: Role::Leader { key: key.0, flight },
            timeout: None,
            deadline: None,
            timer: None,
            cancel: None,
        }
    }

    /// The counters and the number of keys in flight.
    ///
    /// ```
    /// let d: llm_bulkhead::llm::Dedup<u8> = llm_bulkhead::llm::Dedup::new(8);
    /// assert_eq!((d.stats().active, d.stats().hits), (0, 0));
    /// ```
    #[must_use = "stats() is a snapshot: reading it changes nothing"]
    pub fn stats(&self) -> DedupStats {
        let (active, hits, leaders, full) = {
            let reg = lock(&self.inner.flights);
            (reg.map.len(), reg.hits, reg.leaders, reg.full)
        };
        DedupStats {
            active,
            hits,
            leaders,
            full,
            unshareable: self.inner.unshareable.load(Ordering::Relaxed),
            timeouts: self.inner.timeouts.load(Ordering::Relaxed),
            cancelled: self.inner.cancelled.load(Ordering::Relaxed),
        }
    }
}
