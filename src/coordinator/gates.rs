//! The coordinator's counters as atomics, shared by the uncontended path (no mutex) and the
//! queued path (under the wait's mutex): the client word, one word per provider, the
//! cooldown gate, and the table of running keys.
//!
//! # The uncontended path
//!
//! A submit first tries [`Gates::try_admit`]: a CAS on the client word (which also says
//! whether anybody waits and whether the coordinator is closed), a CAS on its provider's word,
//! one load of the provider's cooldown gate, the key's claim in the running-key table (`keys`:
//! one CAS and one store), the ticket id, and for a paced provider a CAS on its last-start
//! stamp (last: nothing is undone after it). It reads the monotonic clock only when the gate
//! holds a cooldown, the provider is paced, or the caller needs the start instant (an attempt
//! timeout, recorded events). Anything it cannot take undoes what it took and sends the ticket
//! to the queued path, which judges it under the mutex. A completion opens its bracket (below) with
//! one add (`fetch_add`, then the look at `WAITERS`: if somebody waits it takes the add back
//! at once, having changed nothing, and goes under the mutex), frees the key and the provider
//! slot, and closes the bracket giving its client slot back ([`close_release`]). The
//! admission's bracket closes with a plain subtraction (it still holds its slot, so it
//! cannot be the last owner). Nine locked RMWs for the pair, against the core's two.
//!
//! A `cooldown` whose deadline is no later than the gate changes nothing and returns after one
//! load ([`ProviderGate::covers`]); the mutex is taken only to extend a cooldown.
//!
//! # Why the queued path sees no half-done uncontended operation
//!
//! The client word's `WAITERS` bit is up whenever a ticket is queued: the queued path raises
//! it (under the mutex) *before* it judges a newcomer that may have to queue (one that can
//! start while nobody is queued jumps nobody and is started without it), and lowers it only
//! when the queue is empty. Every uncontended operation is bracketed in the client word: its
//! first RMW (a CAS that fails while `WAITERS` is up) adds one to `BUSY`, its last takes it off. Having raised
//! `WAITERS`, the queued path waits until `BUSY` is zero before it judges anything: from then
//! until the queue is empty again, no uncontended operation starts (an admission goes to the
//! queued path, a completion gives its slots back under the mutex and runs the start rule
//! there), and none is half done. So the start rule scans a state that only changes under the
//! mutex: it is the same as if every operation took the mutex (COORDINATOR.md §4.2, C1), and a
//! slot or key freed while a ticket is queued always reaches the start rule (no lost wake-up).
//!
//! A half-done operation seen by a scan would break that: a completion that freed its key in
//! the middle of a scan would let a later ticket for that key start ahead of an earlier one
//! judged a moment before (I6); an admission's undo, the same.
//!
//! The wait for `BUSY` to drain spins under the mutex (a few dozen spin hints, then yields:
//! an operation in flight on another core is done within them); it happens only when a
//! ticket must queue while an uncontended operation is in flight, which then needs no lock to
//! finish. It is a wait, not a help: an uncontended operation preempted inside its bracket
//! (a few dozen instructions) delays the queued path until it runs again. Not waiting would
//! let a scan see it half done (above); helping would need its steps published.
//!
//! # Pacing
//!
//! A paced provider's last start is one atomic stamp, set with a CAS that checks the gap, by
//! both paths: the uncontended start, and the queued path's start (which checks readiness
//! first, then claims, then stamps, undoing the claim if an uncontended start took the gap
//! meanwhile; that can happen only while nobody is queued, since with a ticket queued no
//! uncontended start runs). The mutex side reads the stamp for `readyAt` and the snapshot.
//!
//! # Lifetime
//!
//! The client word also holds `DETACHED` (the last handle is gone) and `FREED` (the joint
//! reference was given up): see `Shared`, "Lifetime". The RMW that gives the last slot back
//! after `DETACHED` sets `FREED` in the same CAS, so exactly one thread gives the joint
//! reference up, and an uncontended completion's closing RMW is made by [`close_release`], a
//! function of the word alone, so no reference to these gates is a live argument when another
//! thread may free them.
//!
//! # Memory ordering
//!
//! Every RMW on the client and provider words is `AcqRel` (loads `Acquire`): the bracket's
//! closing RMW is a release that the queued path's drain (an acquire load that reads it, or a
//! later value of its release sequence) synchronises with, so it sees every change of the key
//! table and the provider words made inside the bracket. The key table's slots have their own
//! locks (`keys`). The cooldown gate is raised with `fetch_max` under the wait's mutex and cleared (once
//! expired) only by a CAS from the exact expired value, so a raise is never lost.

use super::keys::{KeyHome, KeyTable};
use super::TicketId;
use crate::sync::{lock, Arc, AtomicU64, Mutex, Ordering};
use crate::wait::cancel::CancelToken;
use crossbeam_utils::CachePadded;
use std::hash::Hash;
use std::time::Duration;

/// The client word's in-flight count (the low 32 bits).
pub(crate) const COUNT: u64 = u32::MAX as u64;
/// One uncontended operation in flight (bits 32..56).
const BUSY: u64 = 1 << 32;
/// The count of uncontended operations in flight.
const BUSY_MASK: u64 = ((1 << 24) - 1) << 32;
/// The last [`Coordinator`](super::Coordinator) handle is gone (lifetime: `Shared` docs).
const DETACHED: u64 = 1 << 60;
/// The joint reference was given up (set once, with or after `DETACHED`, when no slot is
/// held).
const FREED: u64 = 1 << 61;
/// Some ticket is queued (or a newcomer is being judged under the mutex).
pub(crate) const WAITERS: u64 = 1 << 62;
/// The coordinator is closed.
pub(crate) const CLOSED: u64 = 1 << 63;

/// One provider's limit and counters.
pub(crate) struct ProviderGate {
    /// Running invocations of the provider.
    in_flight: CachePadded<AtomicU64>,
    /// The limit (`u64::MAX`: none).
    limit: u64,
    /// The least gap between two starts (zero: no pacing).
    min_interval: Duration,
    /// The last start's monotonic instant in nanoseconds, plus one (0: never started;
    /// saturating). Stamped with a CAS by every start of a paced provider, on either path:
    /// the pacing's whole bookkeeping. On its own cache line: the fields around it are read
    /// by every start.
    last_start: CachePadded<AtomicU64>,
    /// The cooldown's not-before instant in nanoseconds (saturating; 0: none). It is at
    /// least the mutex-side not-before whenever that is still in the future.
    cool_until: AtomicU64,
}

impl ProviderGate {
    pub(crate) fn new(limit: Option<u32>, min_interval: Duration) -> Self {
        ProviderGate {
            in_flight: CachePadded::new(AtomicU64::new(0)),
            limit: limit.map_or(u64::MAX, u64::from),
            min_interval,
            last_start: CachePadded::new(AtomicU64::new(0)),
            cool_until: AtomicU64::new(0),
        }
    }

    /// Takes a provider slot if one is free.
    #[inline]
    fn claim(&self) -> bool {
        let mut n = self.in_flight.load(Ordering::Acquire);
        loop {
            if n >= self.limit {
                return false;
            }
            match self.in_flight.compare_exchange_weak(
                n,
                n + 1,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return true,
                Err(x) => n = x,
            }
        }
    }

    #[inline]
    fn unclaim(&self) {
        self.in_flight.fetch_sub(1, Ordering::AcqRel);
    }

    pub(crate) fn in_flight(&self) -> u32 {
        self.in_flight.load(Ordering::Acquire) as u32
    }

    /// Whether starts are paced (`min_interval` is not zero).
    pub(crate) fn paced(&self) -> bool {
        !self.min_interval.is_zero()
    }

    /// `lastStart + minInterval` (none without pacing or before the first start; saturating:
    /// a pacing deadline past the clock's end simply never comes).
    pub(crate) fn paced_until(&self) -> Option<Duration> {
        self.paced_after(self.last_start.load(Ordering::Acquire))
    }

    fn paced_after(&self, last: u64) -> Option<Duration> {
        if !self.paced() || last == 0 {
            return None;
        }
        Some(Duration::from_nanos(last - 1).saturating_add(self.min_interval))
    }

    /// Stamps a start at `stamp` if pacing allows a start at instant `at` (`at >=
    /// lastStart + minInterval`, C2 inclusive); `false` changes nothing. A CAS, so two
    /// starts racing for one pacing gap (the uncontended path, or the queued path while
    /// nobody is queued) cannot both have it. Always `true` without pacing.
    pub(crate) fn pace(&self, at: Duration, stamp: Duration) -> bool {
        if !self.paced() {
            return true;
        }
        let stamped = nanos(stamp).saturating_add(1);
        let mut last = self.last_start.load(Ordering::Acquire);
        loop {
            if self.paced_after(last).is_some_and(|ready| at < ready) {
                return false;
            }
            // Broken variant (loom model `coordinator.rs`, model 4): a check and a store
            // instead of the CAS, so two starts racing for one pacing gap both have it.
            #[cfg(loom)]
            if crate::sync::broken_variant("LLM_BULKHEAD_LOOM_COORDINATOR_PACE_STORE") {
                self.last_start.store(stamped, Ordering::Release);
                return true;
            }
            match self.last_start.compare_exchange_weak(
                last,
                stamped,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return true,
                Err(x) => last = x,
            }
        }
    }

    /// Whether the cooldown gate already holds `until` or later: a cooldown to `until`
    /// changes nothing (the gate is the not-before instant once it was raised and until the
    /// fast path clears it after it passed; a saturated `until` is never covered).
    pub(crate) fn covers(&self, until: Duration) -> bool {
        let n = nanos(until);
        n < u64::MAX && n <= self.cool_until.load(Ordering::Acquire)
    }

    /// Raises the cooldown gate to `until` (called under the wait's mutex with the new
    /// not-before instant).
    pub(crate) fn cool(&self, until: Duration) {
        let n = nanos(until);
        if n > 0 {
            self.cool_until.fetch_max(n, Ordering::AcqRel);
        }
    }
}

/// Subtracts `sub` from the client word `client`. If that leaves it `DETACHED` with no client
/// slot held and not yet `FREED`, the same RMW sets `FREED` and this returns `true`: the
/// caller alone then takes the joint reference ([`Gates::take_joint`]), and nobody else can
/// (a later start and give-back on the queued path, by a timer, finds `FREED` set).
#[inline]
fn sub_client(client: &AtomicU64, sub: u64) -> bool {
    let mut w = client.load(Ordering::Acquire);
    loop {
        let mut n = w - sub;
        let last = n & (DETACHED | FREED | COUNT) == DETACHED;
        if last {
            n |= FREED;
        }
        match client.compare_exchange_weak(w, n, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return last,
            Err(x) => w = x,
        }
    }
}

/// The uncontended completion's closing RMW ([`Gates::release_open`] first): closes its
/// bracket and gives its client slot back. A function of the word alone, with no reference
/// to the gates as an argument: after this RMW another thread may free the state, unless it
/// returns `true` (this was the last owner: the caller takes the joint reference).
#[inline]
pub(crate) fn close_release(client: &AtomicU64) -> bool {
    sub_client(client, BUSY + 1)
}

/// `d` in nanoseconds, saturating.
fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// The reference to the coordinator's state that its running invocations hold jointly
/// (`Shared` docs, "Lifetime"): given up by the one operation that sees the last handle and
/// the last client slot gone.
pub(crate) type Joint<K> = Option<std::sync::Arc<super::Shared<K>>>;

/// What a start holds: a client slot, a provider slot, a key.
pub(crate) struct Gates<K: Hash + Eq + Clone> {
    /// `[CLOSED @63][WAITERS @62][FREED @61][DETACHED @60][BUSY: uncontended operations in
    /// flight @32..56][client in flight @0..32]`.
    client: CachePadded<AtomicU64>,
    client_limit: u64,
    pub(crate) providers: Box<[ProviderGate]>,
    pub(crate) keys: KeyTable<K>,
    /// The next ticket id, on its own cache line: written by every submit, while the fields
    /// around it are only read.
    next_ticket: CachePadded<AtomicU64>,
    /// The joint reference (set once the state is built; taken when `FREED` is set).
    joint: Mutex<Joint<K>>,
}

/// Why [`Gates::try_admit`] did not start a ticket: the queued path must judge it.
pub(crate) struct NotFast<K>(pub(crate) K);

/// A fast start: the ticket, its key and its home, and, when the clock was read, the start
/// instant.
pub(crate) struct FastStart<K> {
    pub(crate) ticket: TicketId,
    pub(crate) key: K,
    pub(crate) home: KeyHome,
    pub(crate) now: Option<Duration>,
}

impl<K: Hash + Eq + Clone> Gates<K> {
    pub(crate) fn new(client_limit: u32, providers: Box<[ProviderGate]>) -> Arc<Self> {
        Arc::new(Gates {
            client: CachePadded::new(AtomicU64::new(0)),
            client_limit: u64::from(client_limit),
            providers,
            keys: KeyTable::new(client_limit),
            next_ticket: CachePadded::new(AtomicU64::new(0)),
            joint: Mutex::new(None),
        })
    }

    /// Hands the gates the joint reference (once, when the state is built).
    pub(crate) fn hold_joint(&self, joint: std::sync::Arc<super::Shared<K>>) {
        *lock(&self.joint) = Some(joint);
    }

    /// The joint reference, taken by the one thread whose RMW set `FREED` (it stays in the
    /// gates until then, so the state cannot be freed under that thread).
    pub(crate) fn take_joint(&self) -> Joint<K> {
        lock(&self.joint).take()
    }

    /// The client word, for the uncontended completion's closing RMW ([`close_release`]).
    pub(crate) fn client_word(&self) -> &AtomicU64 {
        &self.client
    }

    /// The last handle is gone: marks `DETACHED`; returns the joint reference if no client
    /// slot is held (else the last invocation to complete gives it up).
    pub(crate) fn detach(&self) -> Joint<K> {
        // Broken variant (loom model `coordinator.rs`, model 5): the slot count read before
        // `DETACHED` is set, not by the same RMW. A completion between the two sees no
        // `DETACHED` and this sees its slot still held: nobody gives the joint reference up.
        #[cfg(loom)]
        if crate::sync::broken_variant("LLM_BULKHEAD_LOOM_COORDINATOR_DETACH_STALE") {
            let seen = self.client.load(Ordering::Acquire);
            self.client.fetch_or(DETACHED, Ordering::AcqRel);
            if seen & COUNT == 0 && self.client.fetch_or(FREED, Ordering::AcqRel) & FREED == 0 {
                return self.take_joint();
            }
            return None;
        }
        let mut w = self.client.load(Ordering::Acquire);
        loop {
            let mut n = w | DETACHED;
            let last = n & (FREED | COUNT) == 0;
            if last {
                n |= FREED;
            }
            match self
                .client
                .compare_exchange_weak(w, n, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return if last { self.take_joint() } else { None },
                Err(x) => w = x,
            }
        }
    }

    /// The next ticket id (submit order).
    pub(crate) fn next_ticket(&self) -> TicketId {
        TicketId(self.next_ticket.fetch_add(1, Ordering::Relaxed))
    }

    pub(crate) fn client_in_flight(&self) -> u32 {
        (self.client.load(Ordering::Acquire) & COUNT) as u32
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.client.load(Ordering::Acquire) & CLOSED != 0
    }

    /// Raises `WAITERS` and waits until no uncontended operation is in flight (the queued
    /// path, under the mutex, before it judges a newcomer; module docs).
    pub(crate) fn raise_waiters(&self) {
        let mut w = self.client.fetch_or(WAITERS, Ordering::AcqRel) | WAITERS;
        // Broken variant (loom model `coordinator.rs`, model 2): without the wait, a
        // completion in flight frees its key after the judgement saw it held, outside the
        // mutex and without the start rule: the ticket queued for the key waits forever.
        #[cfg(loom)]
        if crate::sync::broken_variant("LLM_BULKHEAD_LOOM_COORDINATOR_NO_DRAIN") {
            return;
        }
        let mut spins = 0;
        while w & BUSY_MASK != 0 {
            super::keys::backoff(&mut spins);
            w = self.client.load(Ordering::Acquire);
        }
    }

    /// Lowers `WAITERS` (under the mutex, once the queue is empty).
    pub(crate) fn lower_waiters(&self) {
        self.client.fetch_and(!WAITERS, Ordering::AcqRel);
    }

    /// Closes: every later fast admission fails (the queued path reports the close).
    pub(crate) fn close(&self) {
        self.client.fetch_or(CLOSED, Ordering::AcqRel);
    }

    /// Takes a client slot if one is free. `fast`: only while nobody waits and not closed,
    /// and it opens the uncontended bracket (`BUSY`, module docs).
    fn claim_client(&self, fast: bool) -> bool {
        let flags = if fast { WAITERS | CLOSED } else { 0 };
        let add = if fast { BUSY + 1 } else { 1 };
        // Broken variant (loom model `coordinator.rs`, model 1): a fast admission that does
        // not look at `WAITERS` can take a slot a completion freed for a queued ticket.
        #[cfg(loom)]
        let flags =
            if crate::sync::broken_variant("LLM_BULKHEAD_LOOM_COORDINATOR_FAST_IGNORES_WAITERS") {
                flags & !WAITERS
            } else {
                flags
            };
        let mut w = self.client.load(Ordering::Acquire);
        loop {
            if w & flags != 0 || w & COUNT >= self.client_limit {
                return false;
            }
            match self
                .client
                .compare_exchange_weak(w, w + add, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return true,
                Err(x) => w = x,
            }
        }
    }

    /// Closes the uncontended bracket, giving back `slots` client slots with it; the joint
    /// reference if that was the last owner.
    #[must_use]
    fn end_fast(&self, slots: u64) -> Joint<K> {
        if sub_client(&self.client, BUSY + slots) {
            self.take_joint()
        } else {
            None
        }
    }

    /// Gives a client slot back (under the mutex); the joint reference if that was the last
    /// owner.
    #[must_use]
    fn unclaim_client(&self) -> Joint<K> {
        if sub_client(&self.client, 1) {
            self.take_joint()
        } else {
            None
        }
    }

    /// The uncontended start (module docs): client, provider, cooldown gate, key. `clock` is
    /// read only when the gate holds a cooldown or `need_now`. On any miss everything taken
    /// goes back and the key is returned for the queued path.
    #[inline]
    pub(crate) fn try_admit(
        &self,
        provider: usize,
        key: K,
        need_now: bool,
        clock: impl FnOnce() -> Duration,
    ) -> Result<FastStart<K>, NotFast<K>> {
        let p = &self.providers[provider];
        if !self.claim_client(true) {
            return Err(NotFast(key));
        }
        if !p.claim() {
            drop(self.end_fast(1));
            return Err(NotFast(key));
        }
        let cool = p.cool_until.load(Ordering::Acquire);
        let mut now = None;
        if cool != 0 || need_now || p.paced() {
            let n = clock();
            now = Some(n);
            if cool != 0 {
                if nanos(n) < cool {
                    p.unclaim();
                    drop(self.end_fast(1));
                    return Err(NotFast(key));
                }
                // Expired: later admissions need not read the clock. Only from this exact
                // value, so a cooldown raised meanwhile stays.
                let _ = p
                    .cool_until
                    .compare_exchange(cool, 0, Ordering::AcqRel, Ordering::Relaxed);
            }
        }
        let home = self.keys.home_of(&key);
        let Some(ticket) = self.keys.claim(home, &key, || self.next_ticket()) else {
            p.unclaim();
            drop(self.end_fast(1));
            return Err(NotFast(key));
        };
        // Pacing last: its stamp is the start's commitment (nothing is undone after it).
        if let Some(n) = now.filter(|_| p.paced()) {
            if !p.pace(n, n) {
                drop(self.keys.release(home, &key, ticket));
                p.unclaim();
                drop(self.end_fast(1));
                return Err(NotFast(key));
            }
        }
        // Closes the bracket; the slot stays held, so this cannot be the last owner: a
        // plain subtraction (no loop, no lifetime check).
        self.client.fetch_sub(BUSY, Ordering::AcqRel);
        Ok(FastStart {
            ticket,
            key,
            home,
            now,
        })
    }

    /// The queued path's start (under the mutex; readiness already checked): client,
    /// provider, key, undone on a miss; the key's home. `Err(true)`: no client slot (nobody
    /// can start).
    pub(crate) fn claim_queued(
        &self,
        provider: usize,
        key: &K,
        ticket: TicketId,
    ) -> Result<KeyHome, bool> {
        if !self.claim_client(false) {
            return Err(true);
        }
        let p = &self.providers[provider];
        if !p.claim() {
            drop(self.unclaim_client());
            return Err(false);
        }
        let home = self.keys.home_of(key);
        if self.keys.claim(home, key, || ticket).is_none() {
            p.unclaim();
            drop(self.unclaim_client());
            return Err(false);
        }
        Ok(home)
    }

    /// Gives back a start's key and provider slot without the mutex, inside the uncontended
    /// bracket, if nobody waits: `Some`, with the invocation's signal if one was made (to
    /// drop after). The caller then closes the bracket and gives the client slot back with
    /// [`close_release`], a function of the word alone. Returns `None`, having given back
    /// nothing, if somebody waits: the caller then gives everything back with
    /// [`release_locked`](Self::release_locked) under the mutex and runs the start rule there.
    #[inline]
    pub(crate) fn release_open(
        &self,
        provider: usize,
        home: KeyHome,
        key: &K,
        ticket: TicketId,
    ) -> Option<Option<CancelToken>> {
        // Broken variant (loom model `coordinator.rs`, models 1 and 2): a completion that
        // ignores `WAITERS` gives back outside the mutex and never runs the start rule, so
        // the ticket queued for its key waits forever.
        #[cfg(loom)]
        let flags =
            if crate::sync::broken_variant("LLM_BULKHEAD_LOOM_COORDINATOR_RELEASE_IGNORES_WAITERS")
            {
                0
            } else {
                WAITERS
            };
        #[cfg(not(loom))]
        let flags = WAITERS;
        // One add, then the look: no load before it and no retry loop. If somebody waits,
        // the bracket was opened with nothing done inside it; it is closed again at once
        // (the queued path's drain waited for it a moment, and saw no change).
        if self.client.fetch_add(BUSY, Ordering::AcqRel) & flags != 0 {
            self.client.fetch_sub(BUSY, Ordering::AcqRel);
            return None;
        }
        let signal = self.keys.release(home, key, ticket);
        self.providers[provider].unclaim();
        Some(signal)
    }

    /// Gives back a start's key, provider slot and client slot under the mutex (the start
    /// rule runs after it); returns the signal and, if that was the last owner, the joint
    /// reference, to drop after the mutex (the caller holds a reference of its own).
    pub(crate) fn release_locked(
        &self,
        provider: usize,
        home: KeyHome,
        key: &K,
        ticket: TicketId,
    ) -> (Option<CancelToken>, Joint<K>) {
        let signal = self.keys.release(home, key, ticket);
        self.providers[provider].unclaim();
        (signal, self.unclaim_client())
    }

    /// The signal of the invocation of `ticket` running `key` (home `home`; made on first
    /// use).
    pub(crate) fn signal(&self, home: KeyHome, key: &K, ticket: TicketId) -> CancelToken {
        self.keys.signal(home, key, ticket, || self.is_closed())
    }

    /// Every running invocation's signal made so far (the close cancels them; a signal made
    /// later sees `CLOSED` under its slot's lock and is made cancelled).
    pub(crate) fn signals(&self) -> Vec<CancelToken> {
        self.keys.signals()
    }
}
