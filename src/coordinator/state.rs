//! The coordinator's admission state (COORDINATOR.md §2–§4) as a [`multi_wait`] state: the
//! eligibility test of §3 is [`Admit::try_start`], and the clock's catch-up runs the start
//! rule and the timeouts at every intermediate instant (§5 `advance`).
//!
//! [`multi_wait`]: crate::wait::multi

use super::gates::{Gates, Miss};
use super::keys::{Seat, Stamp};
use crate::sync::Arc;
use crate::wait::multi::{Admit, Leave, Start, Txn};
use std::hash::Hash;
use std::time::{Duration, SystemTime};

use super::{Event, EventKind, TicketId};

/// One provider's name and cooldown (its limit, in-flight count and pacing stamp are atomics
/// in [`Gates`]).
#[derive(Debug)]
pub(crate) struct Provider {
    pub(crate) name: String,
    pub(crate) not_before: Option<Duration>,
}

/// A queued or starting ticket.
#[derive(Debug)]
pub(crate) struct Request<K> {
    pub(crate) ticket: TicketId,
    pub(crate) provider: usize,
    pub(crate) key: K,
    pub(crate) deadline: Option<Duration>,
    /// When it was received, on the wall clock (written into its key's entry at the start).
    pub(crate) received_at: SystemTime,
}

/// A started ticket's holdings: a client slot, a provider slot and its key's seat in the
/// running-key table, whose entry records the rest (ticket, provider, instants, signal).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Grant {
    pub(crate) seat: Seat,
}

/// What the queued path found held in the current transaction while `WAITERS` was up, kept
/// held for the rest of it.
///
/// A completion gives its key and provider slot back without the mutex, then its client slot
/// with a CAS that sees `WAITERS` and goes under the mutex instead (`gates` module docs); a
/// fast admission that misses gives back what it took, then goes under the mutex too. So a
/// scan may see a key or a provider slot come free half way through, and a later ticket for
/// it would overtake an older one judged a moment before (COORDINATOR.md I6). Judging
/// everything found held as held until the mutex is released makes the transaction's
/// decisions those of one state (the state with those give-backs after it); each giver runs
/// the start rule in its own transaction after this one, where the oldest eligible ticket
/// starts. Only while `WAITERS` is up: a give-back whose last RMW preceded the raise is seen
/// whole, and one whose last RMW follows it comes under the mutex.
pub(crate) struct Blocked<K> {
    /// `WAITERS` is up (raised by this state, under the mutex).
    on: bool,
    /// Something was remembered since the last clear.
    dirty: bool,
    client: bool,
    providers: Box<[bool]>,
    keys: foldhash::HashSet<K>,
}

impl<K: Hash + Eq + Clone> Blocked<K> {
    pub(crate) fn new(providers: usize) -> Self {
        Blocked {
            on: false,
            dirty: false,
            client: false,
            providers: vec![false; providers].into_boxed_slice(),
            keys: foldhash::HashSet::default(),
        }
    }

    /// Forgets everything (a new transaction, or `WAITERS` raised or lowered).
    fn clear(&mut self) {
        if self.dirty {
            self.dirty = false;
            self.client = false;
            self.providers.fill(false);
            self.keys.clear();
        }
    }

    /// Whether `r` meets something held earlier in this transaction (and which: `Nobody`
    /// for the client).
    fn meets(&self, r: &Request<K>) -> Option<Start<Grant>> {
        if !self.on {
            return None;
        }
        if self.client {
            return Some(Start::Nobody);
        }
        if self.providers[r.provider] || (!self.keys.is_empty() && self.keys.contains(&r.key)) {
            return Some(Start::NotYet);
        }
        None
    }

    /// Remembers the claim that missed for `r`.
    fn missed(&mut self, r: &Request<K>, miss: Miss) {
        if !self.on {
            return;
        }
        self.dirty = true;
        match miss {
            Miss::Client => self.client = true,
            Miss::Provider => self.providers[r.provider] = true,
            Miss::Key => {
                self.keys.insert(r.key.clone());
            }
        }
    }

    /// This transaction gave a grant back under the mutex: what it held is free.
    fn freed(&mut self, provider: usize, key: &K) {
        self.client = false;
        self.providers[provider] = false;
        self.keys.remove(key);
    }
}

/// Admission state (COORDINATOR.md §2).
pub(crate) struct State<K: Hash + Eq + Clone> {
    /// The instant the start rule is applied at (moves instant by instant in a catch-up).
    pub(crate) now: Duration,
    /// The latest clock reading of an operation: when a start actually happens. Equal to
    /// `now` except while a late timer or a jumped clock is caught up, instant by instant;
    /// a start is then decided at its instant but stamped (pacing, attempt timeout) with
    /// the reading, so the gap between actual starts never falls below `min_interval`.
    pub(crate) clock_now: Duration,
    pub(crate) queue_cap: usize,
    pub(crate) providers: Vec<Provider>,
    /// The slots, keys and flags, shared with the uncontended path.
    pub(crate) gates: Arc<Gates<K>>,
    /// Queued tickets (`WAITERS` is up while this is not zero).
    pub(crate) queued: usize,
    /// Events since the last drain, when recording (`None`: not recording).
    pub(crate) events: Option<Vec<Event>>,
    /// The instant of the earliest wake-up handed to the scheduler and not fired yet.
    pub(crate) scheduled: Option<Duration>,
    /// What this transaction found held ([`Blocked`]).
    pub(crate) blocked: Blocked<K>,
}

impl<K: Hash + Eq + Clone> State<K> {
    /// `readyAt(p)`: the later of the cooldown and the pacing deadline; `None` = −∞ (§3, C5,
    /// C12).
    pub(crate) fn ready_at(&self, provider: usize) -> Option<Duration> {
        let paced = self.gates.providers[provider].paced_until();
        match (self.providers[provider].not_before, paced) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        }
    }

    pub(crate) fn record(&mut self, ticket: TicketId, kind: EventKind) {
        let at = self.now;
        if let Some(e) = &mut self.events {
            e.push(Event { at, ticket, kind });
        }
    }

    /// Raises `WAITERS` (under the mutex, before a newcomer that may have to queue is judged
    /// again): what was found held before it is forgotten.
    pub(crate) fn raise_waiters(&mut self) {
        self.gates.raise_waiters();
        self.blocked.clear();
        self.blocked.on = true;
    }

    /// Lowers `WAITERS` (the queue is empty).
    pub(crate) fn lower_waiters(&mut self) {
        self.gates.lower_waiters();
        self.blocked.clear();
        self.blocked.on = false;
    }

    /// Gives a completion's client slot back under the mutex (its key and provider slot went
    /// back before, without it); the joint reference if that was the last owner.
    pub(crate) fn client_back(&mut self) -> super::gates::Joint<K> {
        self.blocked.client = false;
        self.gates.unclaim_client()
    }

    /// Raises a provider's not-before instant to `until` (never lowers it: C11, I7).
    pub(crate) fn cool(&mut self, provider: usize, until: Duration) {
        let p = &mut self.providers[provider];
        if p.not_before.is_none_or(|nb| until > nb) {
            p.not_before = Some(until);
            self.gates.providers[provider].cool(until);
        }
    }
}

impl<K: Hash + Eq + Clone> Admit for State<K> {
    type Request = Request<K>;
    type Grant = Grant;

    /// Eligibility (§3): a client slot, a provider slot, the provider ready (inclusive, C2),
    /// the key idle (client-wide keys, C6). The start takes all of them and stamps the pacing.
    fn try_start(&mut self, r: &Request<K>) -> Start<Grant> {
        let now = self.now;
        if self.ready_at(r.provider).is_some_and(|at| now < at) {
            return Start::NotYet;
        }
        // Broken variant (loom model `coordinator.rs`, model 6): a scan that forgets what it
        // found held lets a later ticket for a key freed half way through overtake an older one.
        #[cfg(loom)]
        let forget = crate::sync::broken_variant("LLM_BULKHEAD_LOOM_COORDINATOR_SCAN_FORGETS");
        #[cfg(not(loom))]
        let forget = false;
        if !forget {
            if let Some(held) = self.blocked.meets(r) {
                return held;
            }
        }
        let stamp = now.max(self.clock_now);
        let claimed = self.gates.claim_queued(
            &r.key,
            Stamp {
                ticket: r.ticket,
                provider: r.provider,
                started_at: Some(stamp),
                received_at: r.received_at,
            },
        );
        let seat = match claimed {
            Ok(seat) => seat,
            Err(miss) => {
                self.blocked.missed(r, miss);
                return if miss == Miss::Client {
                    Start::Nobody
                } else {
                    Start::NotYet
                };
            }
        };
        // The pacing stamp, checked again: with nobody queued an uncontended start may have
        // stamped since the check above (with a ticket queued none runs, and this holds).
        if !self.gates.providers[r.provider].pace(now, stamp) {
            drop(self.gates.release_locked(seat));
            return Start::NotYet;
        }
        self.record(r.ticket, EventKind::Start);
        Start::Now(Grant { seat })
    }

    fn give_back(&mut self, g: Grant) {
        // Under the mutex; the start rule runs after this (the wait's give-back). The
        // transaction's caller holds an `Arc` of its own, so the joint reference (if this was
        // the last owner) is not the last reference (`Shared`, "Lifetime").
        let (entry, joint) = self.gates.release_locked(g.seat);
        if let Some(e) = &entry {
            self.blocked.freed(e.provider, &e.key);
        }
        drop((entry, joint));
    }

    fn begin(&mut self) {
        self.blocked.clear();
    }

    /// The queue cap counts queued tickets only (C13).
    fn may_queue(&mut self, _: &Request<K>, queued: usize) -> bool {
        queued < self.queue_cap
    }

    fn left_queue(&mut self, r: &Request<K>, why: Option<Leave>) {
        self.queued -= 1;
        if self.queued == 0 {
            self.lower_waiters();
        }
        match why {
            Some(Leave::TimedOut) => self.record(r.ticket, EventKind::Timeout),
            Some(Leave::Closed) => self.record(r.ticket, EventKind::Closed),
            Some(Leave::Cancelled) => self.record(r.ticket, EventKind::Cancelled),
            None => {}
        }
    }
}

/// The next instant after `after` and not after `until` at which something can happen: a
/// queued ticket's deadline, or the ready instant of a provider with a queued ticket.
pub(crate) fn next_instant<K: Hash + Eq + Clone>(
    t: &Txn<'_, State<K>>,
    after: Duration,
    until: Option<Duration>,
) -> Option<Duration> {
    t.read(|s, queue| {
        let mut best: Option<Duration> = None;
        let mut consider = |at: Duration| {
            if at > after && until.is_none_or(|u| at <= u) && best.is_none_or(|b| at < b) {
                best = Some(at);
            }
        };
        for r in queue {
            if let Some(d) = r.deadline {
                consider(d);
            }
            if let Some(at) = s.ready_at(r.provider) {
                consider(at);
            }
        }
        best
    })
}

/// Starts, then timeouts, at the current instant (§4.1: starts before timeouts, C3).
fn settle<K: Hash + Eq + Clone>(t: &mut Txn<'_, State<K>>) {
    t.start_eligible();
    let now = t.state().now;
    t.remove_where(|_, r| r.deadline.is_some_and(|d| d <= now), Leave::TimedOut);
}

/// Brings the state's clock to `now`, settling at every intermediate instant in time order
/// (§5 `advance`): each start and timeout is decided at its exact instant (a start is stamped
/// with the clock reading, see [`State::clock_now`]), and a start sets the
/// pacing that the following instants see. A clock reading earlier than the state's (it
/// cannot happen with a monotonic clock) leaves the time where it is.
pub(crate) fn catch_up<K: Hash + Eq + Clone>(t: &mut Txn<'_, State<K>>, now: Duration) {
    let s = t.state();
    s.clock_now = s.clock_now.max(now);
    // An empty queue has no deadline or ready time to step through: jump straight to `now`.
    while t.queued() > 0 {
        let cur = t.state().now;
        match next_instant(t, cur, Some(now)) {
            Some(n) => {
                t.state().now = n;
                settle(t);
            }
            None => break,
        }
    }
    let s = t.state();
    s.now = s.now.max(now);
    settle(t);
}
