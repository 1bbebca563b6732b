//! The coordinator's counters as atomics, shared by the uncontended path (no mutex) and the
//! queued path (under the wait's mutex): the client word, one word per provider, the
//! cooldown gate, and the table of running keys.
//!
//! # The uncontended path
//!
//! A submit first tries [`Gates::try_admit`]: one load of the client word (which says whether
//! anybody waits, whether the coordinator is closed and whether a client slot is free), one
//! load of the provider's cooldown gate, a CAS on its provider's word, then the commitment: a
//! CAS on the client word that takes a slot only while nobody waits and, in the same CAS, the
//! ticket id (`Gates`, "Ticket ids"); then the key's claim in the running-key table (`keys`:
//! one CAS and one store; the entry it writes is the invocation's record, so the invocation
//! itself is two words: `ticket` module, "Two words"). For a paced provider a CAS on its
//! last-start stamp follows (last: nothing is undone after it). It reads the monotonic clock
//! only when the gate holds a cooldown, the provider is paced, or the caller needs the start
//! instant (an attempt timeout, recorded events). Anything it cannot take undoes what it
//! took and sends the ticket to the queued path, which runs the start rule and then judges it
//! under the mutex.
//!
//! A completion gives its key back (a store: `keys`, "Seat 0's release without the lock") and
//! its provider slot, then its client slot with a CAS that looks at `WAITERS`
//! ([`release_client`]): if somebody waits, it changes nothing and the slot goes back under
//! the mutex instead, followed by the start rule. Five locked RMWs for the pair (client 2,
//! provider 2, the key's lock 1), against the core's two.
//!
//! A `cooldown` whose deadline is no later than the gate changes nothing and returns after one
//! load ([`ProviderGate::covers`]); the mutex is taken only to extend a cooldown.
//!
//! # Why the queued path loses no wake-up and lets nobody overtake
//!
//! The client word's `WAITERS` bit is up whenever a ticket is queued: the queued path raises
//! it (under the mutex) *before* it judges a newcomer that may have to queue (one that can
//! start while nobody is queued jumps nobody and is started without it), and lowers it only
//! when the queue is empty. While it is up, no uncontended operation takes or gives back a
//! client slot: an admission's commitment fails and it goes to the queued path; a
//! completion's last RMW fails and it gives the slot back under the mutex. Two consequences:
//!
//! * **No lost wake-up.** An admission that gives back what it claimed always goes under the
//!   mutex afterwards, where the start rule runs before it is judged. A completion gives its
//!   key and provider slot back without the mutex; if its last RMW comes after the raise, it
//!   fails and the completion runs the start rule under the mutex; if it comes before, the
//!   raise (an RMW later in the word's order) sees everything it did. So a slot or key freed
//!   while a ticket is queued always reaches the start rule.
//! * **No overtaking.** A scan may still see such a give-back half done: a key freed after the
//!   scan found it held for an older ticket and before it looks at a younger one. The queued
//!   path therefore keeps everything it found held as held until its transaction ends
//!   (`state::Blocked`): its decisions are those of the state with the give-back after them,
//!   and the giver's own start rule, in a later transaction, starts the older ticket (I6).
//!   A client slot cannot come free half way through (a completion's RMW fails while
//!   `WAITERS` is up), except by an admission's undo after its commitment (its key runs, the
//!   pacing gap was taken meanwhile, or its id cannot be told), which the same rule covers.
//!
//! So the start rule decides as if every operation took the mutex (COORDINATOR.md §4.2, C1).
//! Nothing waits for an uncontended operation: an operation preempted half way delays no
//! transaction (an earlier version made the queued path wait for a bracket in the client
//! word to drain, and paid two more RMWs per pair for the bracket).
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
//! reference up, and an uncontended completion's last RMW is made by [`release_client`], a
//! function of the word alone, so no reference to these gates is a live argument when another
//! thread may free them.
//!
//! # Memory ordering
//!
//! Every RMW on the client and provider words is `AcqRel` (loads `Acquire`): a completion's
//! last RMW is a release that the raise of `WAITERS` (an RMW later in the word's order)
//! synchronises with, so the queued path sees every give-back made before it. The key
//! table's slots have their own locks (`keys`). The cooldown gate is raised with `fetch_max` under the wait's mutex and cleared (once
//! expired) only by a CAS from the exact expired value, so a raise is never lost.

use super::keys::{KeyTable, Running, Seat, Stamp};
use super::TicketId;
use crate::sync::{lock, Arc, AtomicU64, Mutex, Ordering};
use crate::wait::cancel::CancelToken;
use crossbeam_utils::CachePadded;
use std::hash::Hash;
use std::time::{Duration, SystemTime};

/// The client word's in-flight count (the low 32 bits).
pub(crate) const COUNT: u64 = u32::MAX as u64;
/// The last [`Coordinator`](super::Coordinator) handle is gone (lifetime: `Shared` docs).
const DETACHED: u64 = 1 << 60;
/// The joint reference was given up (set once, with or after `DETACHED`, when no slot is
/// held).
const FREED: u64 = 1 << 61;
/// Some ticket is queued (or a newcomer is being judged under the mutex).
pub(crate) const WAITERS: u64 = 1 << 62;
/// The coordinator is closed.
pub(crate) const CLOSED: u64 = 1 << 63;
/// The parity of the ticket counter's epoch (ticket ids: `Gates` docs).
const PARITY: u64 = 1 << 59;
/// The ticket counter's low bits: 27 (three under loom, whose models then cross an epoch).
#[cfg(not(loom))]
const CTR_BITS: u32 = 27;
#[cfg(loom)]
const CTR_BITS: u32 = 3;
/// One ticket in the client word's counter (bits 32..32 + `CTR_BITS`).
const CTR_ONE: u64 = 1 << 32;
/// The counter's last value in an epoch: no ticket takes it; the queued path, finding it,
/// starts the next epoch.
const CTR_MAX: u64 = (1 << CTR_BITS) - 1;

/// The ticket counter in client word `w`.
fn ctr(w: u64) -> u64 {
    (w >> 32) & CTR_MAX
}

/// The id of the ticket whose client-word RMW replaced `w`, read between epoch readings `e1`
/// (before the RMW) and `e2` (after it); `None` if it cannot be told (two epochs passed).
///
/// The epoch of `w` is `E` with `e1 ≤ E ≤ e2` (`Gates` docs, "Ticket ids"), and `w` carries
/// `E`'s parity: one epoch apart, the parity picks it.
fn fast_id(e1: u64, e2: u64, w: u64) -> Option<TicketId> {
    // Broken variant (loom model `coordinator.rs`, model 7): the epoch read after the RMW
    // alone, so a ticket whose RMW came before a wrap takes an id of the next epoch, which a
    // later ticket takes again.
    #[cfg(loom)]
    if crate::sync::broken_variant("LLM_BULKHEAD_LOOM_COORDINATOR_ID_EPOCH_AFTER") {
        return Some(TicketId(e2 << CTR_BITS | ctr(w)));
    }
    let e = if e1 == e2 {
        e1
    } else if e2 == e1 + 1 {
        if (e1 & 1) == (w & PARITY) >> 59 {
            e1
        } else {
            e2
        }
    } else {
        return None;
    };
    Some(TicketId(e << CTR_BITS | ctr(w)))
}

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

/// What the uncontended completion's last RMW ([`release_client`]) did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ClientBack {
    /// The slot went back; another thread may free the state from here.
    Given,
    /// The slot went back and this was the last owner: the caller takes the joint reference.
    Last,
    /// Somebody waits: nothing changed, the slot is still held; give it back under the mutex
    /// and run the start rule there.
    Waiters,
}

/// The uncontended completion's last RMW, after its key and provider slot went back: gives
/// its client slot back if nobody waits. A function of the word alone, with no reference to
/// the gates as an argument: after this RMW another thread may free the state, unless it
/// returns [`ClientBack::Last`] (the caller then takes the joint reference) or
/// [`ClientBack::Waiters`] (nothing changed).
#[inline]
pub(crate) fn release_client(client: &AtomicU64) -> ClientBack {
    // Broken variant (loom model `coordinator.rs`, models 1 and 2): a completion that
    // ignores `WAITERS` gives its slot back outside the mutex and never runs the start rule,
    // so the ticket queued for its key waits forever.
    #[cfg(loom)]
    let flags =
        if crate::sync::broken_variant("LLM_BULKHEAD_LOOM_COORDINATOR_RELEASE_IGNORES_WAITERS") {
            0
        } else {
            WAITERS
        };
    #[cfg(not(loom))]
    let flags = WAITERS;
    let mut w = client.load(Ordering::Acquire);
    loop {
        if w & flags != 0 {
            return ClientBack::Waiters;
        }
        let mut n = w - 1;
        let last = n & (DETACHED | FREED | COUNT) == DETACHED;
        if last {
            n |= FREED;
        }
        match client.compare_exchange_weak(w, n, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) if last => return ClientBack::Last,
            Ok(_) => return ClientBack::Given,
            Err(x) => w = x,
        }
    }
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
///
/// # Ticket ids
///
/// A ticket's id is `epoch << CTR_BITS | counter`, taken by the same RMW that takes its
/// client slot on the uncontended path (no RMW of its own): the counter's low bits live in the
/// client word with the epoch's parity, the epoch in a word of its own. No ticket takes the
/// counter's last value ([`CTR_MAX`]): the uncontended path goes to the queued path there,
/// which, under the mutex, starts the next epoch: it stores `epoch + 1`, then sets the counter
/// past 0 (its own id) and flips the parity in one CAS. Only that path writes the epoch, so
/// under the mutex it is exact.
///
/// An uncontended start reads the epoch before its RMW (`e1`) and after it (`e2`). Its RMW
/// replaced a word of epoch `E`: the wrap that began `E` stored it before its CAS, which
/// precedes this RMW in the word's order (every write of the word is an RMW, so this RMW
/// synchronises with it), so `e2 ≥ E`; the wrap that ends `E` stores `E + 1` only after it
/// saw the counter at its last value, which this RMW or a later one wrote, so `e1 ≤ E`. One
/// epoch apart, the word's parity tells which; two apart (2^27 tickets during one start),
/// the start gives up and goes to the queued path. So ids are unique and, among the tickets
/// whose RMWs are ordered, in that order.
pub(crate) struct Gates<K: Hash + Eq + Clone> {
    /// `[CLOSED @63][WAITERS @62][FREED @61][DETACHED @60][PARITY @59][ticket counter
    /// @32..32 + CTR_BITS][client in flight @0..32]`.
    client: CachePadded<AtomicU64>,
    client_limit: u64,
    pub(crate) providers: Box<[ProviderGate]>,
    pub(crate) keys: KeyTable<K>,
    /// The ticket counter's epoch (module docs, "Ticket ids"), on its own cache line: read by
    /// every start, written once an epoch.
    epoch: CachePadded<AtomicU64>,
    /// The joint reference (set once the state is built; taken when `FREED` is set).
    joint: Mutex<Joint<K>>,
}

/// Why [`Gates::try_admit`] did not start a ticket: the queued path must judge it. An id the
/// attempt took is not reused: the queued path takes one under its mutex, so queued tickets'
/// ids follow the queue's order.
pub(crate) struct NotFast<K>(pub(crate) K);

/// Which claim of a start on the queued path missed ([`Gates::claim_queued`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Miss {
    /// No client slot: nobody can start.
    Client,
    /// The provider is full.
    Provider,
    /// The key runs.
    Key,
}

/// A fast start: the ticket, its seat in the key table, and, when the clock was read, the
/// start instant.
pub(crate) struct FastStart {
    pub(crate) ticket: TicketId,
    pub(crate) seat: Seat,
    pub(crate) now: Option<Duration>,
}

impl<K: Hash + Eq + Clone> Gates<K> {
    pub(crate) fn new(client_limit: u32, providers: Box<[ProviderGate]>) -> Arc<Self> {
        Arc::new(Gates {
            client: CachePadded::new(AtomicU64::new(0)),
            client_limit: u64::from(client_limit),
            providers,
            keys: KeyTable::new(client_limit),
            epoch: CachePadded::new(AtomicU64::new(0)),
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

    /// The client word, for the uncontended completion's last RMW ([`release_client`]).
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

    /// The next ticket id, on the queued path (under the wait's mutex, which alone writes the
    /// epoch): the counter's next value, or, at its last value, the next epoch's first.
    pub(crate) fn next_ticket(&self) -> TicketId {
        let e = self.epoch.load(Ordering::Acquire);
        let mut w = self.client.load(Ordering::Acquire);
        loop {
            let (n, id) = if ctr(w) == CTR_MAX {
                // The next epoch is published before the word shows it (`Gates` docs).
                self.epoch.store(e + 1, Ordering::Release);
                let n = ((w & !(CTR_MAX << 32)) ^ PARITY) + CTR_ONE;
                (n, (e + 1) << CTR_BITS)
            } else {
                (w + CTR_ONE, e << CTR_BITS | ctr(w))
            };
            match self
                .client
                .compare_exchange_weak(w, n, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return TicketId(id),
                Err(x) => w = x,
            }
        }
    }

    pub(crate) fn client_in_flight(&self) -> u32 {
        (self.client.load(Ordering::Acquire) & COUNT) as u32
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.client.load(Ordering::Acquire) & CLOSED != 0
    }

    /// Raises `WAITERS` (the queued path, under the mutex, before it judges a newcomer that
    /// may have to queue; module docs). From this RMW on, no uncontended operation takes or
    /// gives back a client slot: every one that has not done so yet goes under the mutex.
    pub(crate) fn raise_waiters(&self) {
        self.client.fetch_or(WAITERS, Ordering::AcqRel);
    }

    /// Lowers `WAITERS` (under the mutex, once the queue is empty).
    pub(crate) fn lower_waiters(&self) {
        self.client.fetch_and(!WAITERS, Ordering::AcqRel);
    }

    /// Closes: every later fast admission fails (the queued path reports the close).
    pub(crate) fn close(&self) {
        self.client.fetch_or(CLOSED, Ordering::AcqRel);
    }

    /// Takes a client slot on the queued path (under the mutex), if one is free.
    fn claim_client(&self) -> bool {
        let limit = self.client_limit;
        let w = self.client.load(Ordering::Acquire);
        self.take_client(w, 1, |w| w & COUNT < limit).is_some()
    }

    /// Whether the client word `w` lets an uncontended start take a slot: nobody waits, not
    /// closed, a slot free.
    #[inline]
    fn fast_open(&self, w: u64) -> bool {
        // Broken variant (loom model `coordinator.rs`, model 1): a fast admission that does
        // not look at `WAITERS` can take a slot a completion freed for a queued ticket.
        #[cfg(loom)]
        let flags =
            if crate::sync::broken_variant("LLM_BULKHEAD_LOOM_COORDINATOR_FAST_IGNORES_WAITERS") {
                CLOSED
            } else {
                WAITERS | CLOSED
            };
        #[cfg(not(loom))]
        let flags = WAITERS | CLOSED;
        w & flags == 0 && w & COUNT < self.client_limit && ctr(w) != CTR_MAX
    }

    /// The uncontended start's commitment: takes a client slot and the next ticket id while
    /// nobody waits, from the word `w` read earlier; `None` changes nothing.
    #[inline]
    fn commit_client(&self, w: u64) -> Option<TicketId> {
        let e1 = self.epoch.load(Ordering::Acquire);
        let w = self.take_client(w, 1 + CTR_ONE, |w| self.fast_open(w))?;
        // Under loom, the start that takes the epoch's last id lets another thread run before
        // its second reading: the queued path may start the next epoch right here (model 7).
        #[cfg(loom)]
        if ctr(w) == CTR_MAX - 1 {
            crate::sync::thread::yield_now();
        }
        let e2 = self.epoch.load(Ordering::Acquire);
        let id = fast_id(e1, e2, w);
        if id.is_none() {
            // Two epochs passed during this start: the slot goes back, the queued path
            // takes an id it can tell.
            drop(self.unclaim_client());
        }
        id
    }

    /// Adds `add` to the word with a CAS while `open` says the word allows it, starting from
    /// `w` (a changed word is judged again); the word it replaced.
    #[inline]
    fn take_client(&self, mut w: u64, add: u64, open: impl Fn(u64) -> bool) -> Option<u64> {
        loop {
            if !open(w) {
                return None;
            }
            match self
                .client
                .compare_exchange_weak(w, w + add, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return Some(w),
                Err(x) => w = x,
            }
        }
    }

    /// Gives a client slot back: under the mutex (a completion while somebody waits, a
    /// queued start's undo), or by an uncontended attempt that missed after its commitment
    /// (which then goes under the mutex). The joint reference if that was the last owner, to
    /// drop once nothing else touches the state (the caller holds a reference of its own).
    #[must_use]
    pub(crate) fn unclaim_client(&self) -> Joint<K> {
        if sub_client(&self.client, 1) {
            self.take_joint()
        } else {
            None
        }
    }

    /// The uncontended start (module docs): a look at the client word, the cooldown gate,
    /// then the provider slot, the key (and the ticket id), the client slot, and for a paced
    /// provider the pacing stamp. `clock` is read only when the gate holds a cooldown, the
    /// provider is paced, or `need_now`. On any miss everything taken goes back and the key
    /// is returned for the queued path, which runs
    /// the start rule before it judges the ticket: a claim that a scan saw held meanwhile
    /// reaches the start rule after it went back.
    #[inline]
    pub(crate) fn try_admit(
        &self,
        provider: usize,
        key: K,
        need_now: bool,
        received_at: SystemTime,
        clock: impl FnOnce() -> Duration,
    ) -> Result<FastStart, NotFast<K>> {
        let p = &self.providers[provider];
        let w = self.client.load(Ordering::Acquire);
        if !self.fast_open(w) {
            return Err(NotFast(key));
        }
        let cool = p.cool_until.load(Ordering::Acquire);
        let mut now = None;
        if cool != 0 || need_now || p.paced() {
            let n = clock();
            now = Some(n);
            if cool != 0 {
                if nanos(n) < cool {
                    return Err(NotFast(key));
                }
                // Expired: later admissions need not read the clock. Only from this exact
                // value, so a cooldown raised meanwhile stays.
                let _ = p
                    .cool_until
                    .compare_exchange(cool, 0, Ordering::AcqRel, Ordering::Relaxed);
            }
        }
        if !p.claim() {
            return Err(NotFast(key));
        }
        let Some(ticket) = self.commit_client(w) else {
            p.unclaim();
            return Err(NotFast(key));
        };
        // A miss after the commitment gives the provider and client slots back (the client
        // slot was held, so this is not the last owner: the caller holds a handle too).
        let miss = |key| {
            p.unclaim();
            drop(self.unclaim_client());
            Err(NotFast(key))
        };
        let stamp = Stamp {
            ticket,
            provider,
            started_at: now,
            received_at,
        };
        let seat = match self.keys.claim(self.keys.home_of(&key), key, stamp) {
            Ok(seat) => seat,
            Err(key) => return miss(key),
        };
        // Pacing last: its stamp is the start's commitment (nothing is undone after it).
        if let Some(n) = now.filter(|_| p.paced()) {
            if !p.pace(n, n) {
                return match self.keys.release(seat, |e| e.key) {
                    Some(key) => miss(key),
                    None => unreachable!("a seat just claimed is taken"),
                };
            }
        }
        Ok(FastStart { ticket, seat, now })
    }

    /// The queued path's start (under the mutex; readiness already checked): client,
    /// provider, key, undone on a miss; the key's seat, or which claim missed.
    pub(crate) fn claim_queued(&self, key: &K, stamp: Stamp) -> Result<Seat, Miss> {
        if !self.claim_client() {
            return Err(Miss::Client);
        }
        let p = &self.providers[stamp.provider];
        if !p.claim() {
            drop(self.unclaim_client());
            return Err(Miss::Provider);
        }
        match self.keys.claim(self.keys.home_of(key), key, stamp) {
            Ok(seat) => Ok(seat),
            Err(_) => {
                p.unclaim();
                drop(self.unclaim_client());
                Err(Miss::Key)
            }
        }
    }

    /// A completion's first two steps, without the mutex: gives back its key (seat 0 without
    /// the key's lock: `keys` module docs) and its provider slot. The caller then gives the
    /// client slot back with [`release_client`], a function of the word alone, or, if
    /// somebody waits, under the mutex with [`unclaim_client`](Self::unclaim_client)
    /// followed by the start rule. A scan under the mutex may see these two steps done and
    /// the third not yet: it treats what it saw held as held for the rest of its transaction
    /// (`State`'s blocked set), and the start rule runs again after the third step.
    #[inline]
    pub(crate) fn give_back_fast(&self, seat: Seat) {
        if let Some(provider) = self.keys.release_held(seat) {
            self.providers[provider].unclaim();
        }
    }

    /// Gives back a start's key, provider slot and client slot under the mutex (the start
    /// rule runs after it); returns the entry and, if that was the last owner, the joint
    /// reference, to drop after the mutex (the caller holds a reference of its own).
    pub(crate) fn release_locked(&self, seat: Seat) -> (Option<Running<K>>, Joint<K>) {
        let entry = self.keys.release(seat, |e| e);
        if let Some(e) = &entry {
            self.providers[e.provider].unclaim();
        }
        (entry, self.unclaim_client())
    }

    /// The signal of the invocation in `seat` (made on first use).
    pub(crate) fn signal(&self, seat: Seat) -> CancelToken {
        self.keys.signal(seat, || self.is_closed())
    }

    /// Every running invocation's signal made so far (the close cancels them; a signal made
    /// later sees `CLOSED` under its slot's lock and is made cancelled).
    pub(crate) fn signals(&self) -> Vec<CancelToken> {
        self.keys.signals()
    }
}
