//! The pools' atomic words and their versioned limits.
//!
//! A [`Gauge`] is one bounded count (a provider's connections, the global guard, a partition's
//! tokens): `held` in the low 48 bits, `tentative` (how many decisions not yet final hold
//! some of `held`) in the high 16. A partition's [`ActiveWord`] packs active requests, their
//! tentative part and retries in flight, so that the retry budget, which depends on the active
//! count, is checked and charged in one CAS. A tentative part counts decisions in progress, at
//! most one per thread: 16 bits hold 65,535 threads deciding on one word at once.
//!
//! Every step is a CAS that takes a unit only if the new count stays within the limit: no count
//! ever exceeds the limit it was checked against, at any instant (a fetch-add followed by a
//! check, envoy#2927, passes the limit for a moment and refuses others meanwhile). A step that
//! finds its count full while decisions in progress hold part of it waits for them rather
//! than refusing (`step`): a refusal is explained by committed units.
//!
//! Limits live in a [`LimitCell`]: a sequence lock (an even version while stable, odd while a
//! writer stores) whose writers are serialised by the pools' reconfiguration mutex. A decision
//! reads the version, the fields, takes its steps, and checks the version again; a change
//! means a reconfiguration overlapped it, and it undoes its steps and decides again.

use crate::sync::{AtomicU64, Ordering};

/// One unit of the tentative count of a [`Gauge`].
const G_TENT: u64 = 1 << 48;
/// The held part of a [`Gauge`] word.
const G_HELD: u64 = G_TENT - 1;

/// The largest limit a [`Gauge`] can hold (connections, the global guard, tokens).
pub(crate) const MAX_GAUGE: u64 = G_HELD;

/// A bounded count with a tentative part (module docs).
#[derive(Default)]
pub(crate) struct Gauge(AtomicU64);

/// Why a step was refused: the count was full with committed units. `waited` when it first
/// waited for decisions in progress (their tentative units) to be confirmed or undone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Full {
    pub(crate) waited: bool,
}

/// How many times a step that waits for decisions in progress spins before it yields its
/// time slice to them (one of them may be preempted). Under loom every wait yields.
#[cfg(not(loom))]
const SPINS: u32 = 64;

impl Gauge {
    /// Takes `n` units if `held + n <= limit`, as a tentative unit when `tentative`.
    ///
    /// # Memory ordering
    /// SeqCst: the pools' steps and the limits' versions form one total order, which the
    /// overlap check of a decision relies on.
    #[inline]
    pub(crate) fn take(&self, n: u64, limit: u64, tentative: bool) -> Result<(), Full> {
        let mark = if tentative { G_TENT } else { 0 };
        #[cfg(loom)]
        if crate::sync::broken_variant("LLM_BULKHEAD_LOOM_POOLS_CHECK_THEN_ACT") {
            // Broken on purpose: check, then add (envoy#2927); `loom-tests/tests/pools.rs`
            // finds two admissions on one connection.
            if (self.0.load(Ordering::SeqCst) & G_HELD) + n > limit {
                return Err(Full { waited: false });
            }
            self.0.fetch_add(n + mark, Ordering::SeqCst);
            return Ok(());
        }
        step(&self.0, |cur| {
            // Saturating: a demand of any size is a refusal, never an overflow.
            let fits = (cur & G_HELD).saturating_add(n) <= limit;
            // The tentative part counts decisions, not their units (a token demand is many):
            // while any is in progress, the committed units alone may leave room.
            let undecided = cur >> 48 != 0;
            (fits.then(|| (cur + n + mark, ())), undecided)
        })
    }

    /// A tentative unit becomes final.
    #[inline]
    pub(crate) fn confirm(&self) {
        self.0.fetch_sub(G_TENT, Ordering::SeqCst);
    }

    /// Gives back `n` units (a tentative one, when `tentative`: an undo).
    #[inline]
    pub(crate) fn give(&self, n: u64, tentative: bool) {
        let mark = if tentative { G_TENT } else { 0 };
        let before = self.0.fetch_sub(n + mark, Ordering::SeqCst);
        debug_assert!(before & G_HELD >= n, "gauge underflow");
    }

    /// The held count (tentative units included).
    pub(crate) fn held(&self) -> u64 {
        self.0.load(Ordering::SeqCst) & G_HELD
    }
}

/// One CAS step on `word`: `decide(cur)` gives the new value and the result when the count
/// has room, and whether the count may have room without the tentative units of decisions
/// in progress.
///
/// A count that is full only with such units is not a refusal: one of those decisions may be
/// refused at a later step and undo its unit, and a refusal then would be one that no serial
/// order makes. The step waits for them instead (spins, then yields) and decides on what
/// they leave: it refuses only when the committed units alone fill the count. The wait is
/// bounded by the few steps of the decisions it waits for: a decision in progress waits only
/// at a later step than the one it holds a tentative unit on (active, tokens, connection,
/// guard, in that order), so no wait is ever circular.
#[inline(always)]
fn step<R>(word: &AtomicU64, decide: impl Fn(u64) -> (Option<(u64, R)>, bool)) -> Result<R, Full> {
    let mut cur = word.load(Ordering::SeqCst);
    let mut waits = 0;
    loop {
        match decide(cur) {
            (Some((next, r)), _) => {
                match word.compare_exchange_weak(cur, next, Ordering::SeqCst, Ordering::SeqCst) {
                    Ok(_) => return Ok(r),
                    Err(now) => cur = now,
                }
            }
            (None, false) => return Err(Full { waited: waits != 0 }),
            (None, true) => {
                #[cfg(loom)]
                if crate::sync::broken_variant("LLM_BULKHEAD_LOOM_POOLS_REFUSE_TENTATIVE") {
                    // Broken on purpose: a count full with tentative units refuses at once;
                    // `loom-tests/tests/pools.rs` finds a request refused by an undone unit.
                    return Err(Full { waited: false });
                }
                wait_for_decisions(&mut waits);
                cur = word.load(Ordering::SeqCst);
            }
        }
    }
}

/// One wait of a step for the decisions in progress on its word ([`step`]).
#[cold]
#[inline(never)]
fn wait_for_decisions(waits: &mut u32) {
    if *waits == 0 {
        crate::sync::pause(crate::sync::PausePoint::PoolsMetTentative);
    }
    *waits += 1;
    #[cfg(loom)]
    crate::sync::thread::yield_now();
    #[cfg(not(loom))]
    if *waits > SPINS {
        crate::sync::thread::yield_now();
    } else {
        core::hint::spin_loop();
    }
}

/// Bits of an [`ActiveWord`]: active (24) | tentative (16) | retries (24).
const A_ACTIVE: u64 = (1 << 24) - 1;
const A_TENT: u64 = 1 << 24;
const A_RETRY: u64 = 1 << 40;

/// The largest active limit of a partition.
pub(crate) const MAX_ACTIVE: u64 = A_ACTIVE;
/// The largest number of retries a partition can count.
pub(crate) const MAX_RETRIES: u64 = (1 << 24) - 1;

/// A partition's active requests and retries in flight, in one word (module docs).
#[derive(Default)]
pub(crate) struct ActiveWord(AtomicU64);

/// One read of an [`ActiveWord`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ActiveCount {
    /// Active requests, tentative ones included.
    pub(crate) active: u64,
    /// Decisions that hold an active unit but are not final yet.
    pub(crate) tentative: u64,
    /// Retries in flight: charged, in back-off or on their attempt.
    pub(crate) retries: u64,
}

impl ActiveCount {
    fn of(w: u64) -> Self {
        ActiveCount {
            active: w & A_ACTIVE,
            tentative: (w >> 24) & 0xffff,
            retries: w >> 40,
        }
    }
}

/// The retry budget's limit, Envoy's shape: `max(percent × (active + pending) / 100, min)`.
#[inline]
pub(crate) fn retry_limit(percent: u64, min: u64, active: u64, pending: u64) -> u64 {
    (percent * (active + pending) / 100).max(min)
}

impl ActiveWord {
    /// Takes a tentative active unit if `active < cap`; `enforce == false` (observe mode) takes
    /// it in any case and reports whether it would have been refused.
    #[inline]
    pub(crate) fn take(&self, cap: u64, enforce: bool) -> Result<bool, Full> {
        step(&self.0, |cur| {
            let c = ActiveCount::of(cur);
            let over = c.active >= cap;
            let fits = !(over && enforce || c.active >= A_ACTIVE);
            // Without the units of decisions in progress, would it fit?
            let committed = c.active - c.tentative;
            let committed_fits = !(committed >= cap && enforce || committed >= A_ACTIVE);
            (fits.then(|| (cur + 1 + A_TENT, over)), committed_fits)
        })
    }

    /// The tentative unit becomes final.
    #[inline]
    pub(crate) fn confirm(&self) {
        self.0.fetch_sub(A_TENT, Ordering::SeqCst);
    }

    /// Gives back an active unit (tentative: an undo), and a retry unit when `retry`.
    #[inline]
    pub(crate) fn give(&self, tentative: bool, retry: bool) {
        let d = 1 + if tentative { A_TENT } else { 0 } + if retry { A_RETRY } else { 0 };
        let before = self.0.fetch_sub(d, Ordering::SeqCst);
        debug_assert!(before & A_ACTIVE >= 1, "active underflow");
    }

    /// Charges a retry if the retries in flight stay within
    /// `max(percent × (active + pending) / 100, min)`, read in the same CAS: `Ok(limit)`, or
    /// `Err(limit)` (the budget is full). Active counts final units only (a tentative one may
    /// be undone). `enforce == false` charges in any case and returns `Ok` with the flag.
    #[inline]
    pub(crate) fn charge_retry(
        &self,
        percent: u64,
        min: u64,
        pending: u64,
        enforce: bool,
    ) -> Result<(u64, bool), u64> {
        let mut cur = self.0.load(Ordering::SeqCst);
        #[cfg(loom)]
        if crate::sync::broken_variant("LLM_BULKHEAD_LOOM_POOLS_RETRY_CHECK_THEN_ACT") {
            // Broken on purpose: check, then add (tower's `TpsBudget` shape);
            // `loom-tests/tests/pools.rs` finds two retries in a budget of one.
            let c = ActiveCount::of(cur);
            let limit = retry_limit(percent, min, c.active - c.tentative, pending);
            if c.retries >= limit && enforce {
                return Err(limit);
            }
            self.0.fetch_add(A_RETRY, Ordering::SeqCst);
            return Ok((limit, false));
        }
        loop {
            let c = ActiveCount::of(cur);
            let limit = retry_limit(percent, min, c.active - c.tentative, pending);
            let over = c.retries >= limit;
            if over && enforce || c.retries >= MAX_RETRIES {
                return Err(limit);
            }
            match self.0.compare_exchange_weak(
                cur,
                cur + A_RETRY,
                Ordering::SeqCst,
                Ordering::SeqCst,
            ) {
                Ok(_) => return Ok((limit, over)),
                Err(now) => cur = now,
            }
        }
    }

    /// Gives back a retry unit alone (a retry whose attempt never started).
    #[inline]
    pub(crate) fn give_retry(&self) {
        let before = self.0.fetch_sub(A_RETRY, Ordering::SeqCst);
        debug_assert!(before >> 40 >= 1, "retry underflow");
    }

    /// One read of the word.
    pub(crate) fn read(&self) -> ActiveCount {
        ActiveCount::of(self.0.load(Ordering::SeqCst))
    }
}

/// A sequence-locked set of `N` limit words with a version (module docs). Writers must be
/// serialised by the caller (the pools' reconfiguration mutex).
pub(crate) struct LimitCell<const N: usize> {
    version: AtomicU64,
    words: [AtomicU64; N],
}

impl<const N: usize> LimitCell<N> {
    pub(crate) fn new(words: [u64; N]) -> Self {
        LimitCell {
            version: AtomicU64::new(2),
            words: words.map(AtomicU64::new),
        }
    }

    /// A consistent read: `(version, words)`. The version is even and counts stores: a
    /// decision carries `version / 2`.
    #[inline]
    pub(crate) fn read(&self) -> (u64, [u64; N]) {
        loop {
            let v = self.version.load(Ordering::SeqCst);
            if v & 1 == 0 {
                let words = core::array::from_fn(|i| self.words[i].load(Ordering::SeqCst));
                if self.version.load(Ordering::SeqCst) == v {
                    return (v, words);
                }
            }
            crate::sync::thread::yield_now();
        }
    }

    /// Whether the version is still `v`: no store began since the read that returned it.
    #[inline]
    pub(crate) fn unchanged(&self, v: u64) -> bool {
        self.version.load(Ordering::SeqCst) == v
    }

    /// Stores new words (the caller holds the reconfiguration mutex); returns the new version.
    pub(crate) fn store(&self, words: [u64; N]) -> u64 {
        let v = self.version.load(Ordering::SeqCst);
        self.version.store(v + 1, Ordering::SeqCst);
        for (w, x) in self.words.iter().zip(words) {
            w.store(x, Ordering::SeqCst);
        }
        self.version.store(v + 2, Ordering::SeqCst);
        v + 2
    }
}
