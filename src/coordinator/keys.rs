//! The table of running keys: a key is in it exactly while an invocation of it runs, so it
//! holds at most `client_limit` keys however many distinct keys pass through (memory stays
//! flat). A running key's entry is the invocation's record too (its ticket, provider, start
//! and receipt instants, signal), so the invocation itself carries only its [`Seat`].
//!
//! # Layout
//!
//! A fixed array of slots, each with a one-word spin lock. A key's *home* is the slot its hash
//! picks. A home has seats: seat 0 in the slot itself, and, when keys that share the home run
//! at once (a collision), seats 1, 2, … in a small vector of the slot's own. Every operation
//! on a key locks its home, so two claims of one key are serialised by that lock, whichever
//! seat the key ends up in. An invocation reaches its entry by its seat (home and index):
//! the release and the signal compare no key.
//!
//! A claim with no collision is one CAS (the lock) and one store (the unlock), with no hash
//! map. The release of seat 0 takes no lock at all (below): it is one load and one store, so a
//! key costs the uncontended pair one locked instruction. The key is hashed once per
//! invocation ([`KeyTable::home_of`], before the claim).
//!
//! # Seat 0's release without the lock
//!
//! Beside its lock, a slot has a word `live`: 0 while seat 0 is free, the running
//! invocation's provider + 1 while it is taken. Only claims write seat 0's entry, under the
//! lock, and they store `live` after the entry; every reader of entries (a claim's key
//! comparisons, a snapshot, the close's scan of signals, the invocation's own accessors) holds
//! the lock and treats seat 0 as empty while `live` is 0. So the invocation that holds seat 0
//! frees it with a store of 0 and never touches the entry again: its key and signal stay in
//! the seat, dead, until the next claim of seat 0 replaces them (dropped after that claim's
//! unlock; a table holds at most one dead entry per slot, so memory stays flat). A key's
//! release needs its provider, which the invocation reads from `live` (it wrote it itself, or
//! it was handed the seat by the thread that did).
//!
//! The store is `Release` and a claim loads `live` with `Acquire`: everything the previous
//! invocation of a key did happens-before the next one's claim of that seat, so two
//! invocations of one key never overlap, in time or in memory (loom model 2 fails on a
//! `Relaxed` store).
//!
//! # Why a spin lock
//!
//! The critical sections are a few loads and stores, one key comparison per seat in use and,
//! for the queued path, one key clone (a collision's vector grows under it, rarely); the lock
//! is never held across user code that can block (a key's `Eq` and `Clone` excepted, as a
//! mutex would hold them too; keys are dropped after the unlock, a dead entry's by the claim
//! that replaces it, which on the queued path is still under the wait's mutex, where keys are
//! compared and cloned too). Readers that walk every slot (a snapshot, the close's scan of
//! signals) take each slot's lock in turn. A waiter spins briefly, then yields.
//!
//! # Memory ordering
//!
//! The lock is taken with an `Acquire` CAS and given back with a `Release` store: everything
//! a holder wrote to the slot happens-before the next holder's reads. `live`: above.

use super::TicketId;
use crate::sync::cell::UnsafeCell;
use crate::sync::{AtomicU32, AtomicUsize, Ordering};
use crate::wait::cancel::CancelToken;
use std::hash::{BuildHasher, Hash};
use std::time::{Duration, SystemTime};

/// A running invocation's entry, written at its claim.
pub(crate) struct Running<K> {
    pub(crate) key: K,
    pub(crate) ticket: TicketId,
    pub(crate) provider: usize,
    /// The start instant, when the start read the clock.
    pub(crate) started_at: Option<Duration>,
    /// When the ticket was received, on the wall clock.
    pub(crate) received_at: SystemTime,
    /// The invocation's signal, once somebody asked for it.
    pub(crate) signal: Option<CancelToken>,
}

/// A key handed to [`KeyTable::claim`]: owned, or borrowed and cloned on success.
pub(crate) trait ClaimKey<K> {
    fn key(&self) -> &K;
    fn into_key(self) -> K;
}

impl<K> ClaimKey<K> for K {
    fn key(&self) -> &K {
        self
    }
    fn into_key(self) -> K {
        self
    }
}

impl<K: Clone> ClaimKey<K> for &K {
    fn key(&self) -> &K {
        self
    }
    fn into_key(self) -> K {
        self.clone()
    }
}

/// What a claim writes besides the key.
#[derive(Clone, Copy)]
pub(crate) struct Stamp {
    pub(crate) ticket: TicketId,
    pub(crate) provider: usize,
    pub(crate) started_at: Option<Duration>,
    pub(crate) received_at: SystemTime,
}

/// What a slot's lock guards: the keys homed here that run, seat 0 first.
struct Home<K> {
    first: Option<Running<K>>,
    more: Vec<Option<Running<K>>>,
}

impl<K> Home<K> {
    fn seat(&mut self, index: u32) -> &mut Option<Running<K>> {
        match index {
            0 => &mut self.first,
            i => &mut self.more[i as usize - 1],
        }
    }

    /// The running entries (`first_live`: seat 0 is taken, from the slot's `live`).
    fn each(&self, first_live: bool) -> impl Iterator<Item = &Running<K>> {
        let first = if first_live {
            self.first.as_ref()
        } else {
            None
        };
        first.into_iter().chain(self.more.iter().flatten())
    }
}

struct Slot<K> {
    /// 0: unlocked; 1: locked.
    locked: AtomicU32,
    /// 0: seat 0 is free (its entry, if any, is dead); else its invocation's provider + 1
    /// (module docs, "Seat 0's release without the lock").
    live: AtomicUsize,
    home: UnsafeCell<Home<K>>,
}

// SAFETY: `home` is only reached through a `Locked` guard, which exists only while its
// thread holds `locked` (module docs): one thread at a time, as with a mutex. The contents
// are `K`s and `CancelToken`s, sent between threads with the slot.
unsafe impl<K: Send> Sync for Slot<K> {}
/// A held slot lock; unlocks on drop (also when a key's `Clone` or `Eq` panics).
struct Locked<'a, K> {
    slot: &'a Slot<K>,
}

impl<K> Locked<'_, K> {
    /// Whether seat 0 is taken (`Acquire`: a free seat's last invocation happens-before).
    fn first_live(&self) -> bool {
        self.slot.live.load(Ordering::Acquire) != 0
    }

    fn with<R>(&mut self, f: impl FnOnce(&mut Home<K>) -> R) -> R {
        // SAFETY: this guard holds the slot's lock, so no other thread reaches `home` until
        // it is dropped; `&mut self` keeps this thread to one access at a time.
        self.slot.home.with_mut(|p| f(unsafe { &mut *p }))
    }
}

impl<K> Drop for Locked<'_, K> {
    fn drop(&mut self) {
        self.slot.locked.store(0, Ordering::Release);
    }
}

impl<K> Slot<K> {
    #[inline]
    fn lock(&self) -> Locked<'_, K> {
        // Broken variant (loom model `coordinator.rs`, model 8): no lock, so two claims of one
        // key touch its slot at once (loom reports the data race).
        #[cfg(loom)]
        if crate::sync::broken_variant("LLM_BULKHEAD_LOOM_COORDINATOR_KEY_NO_LOCK") {
            return Locked { slot: self };
        }
        let mut spins = 0u32;
        loop {
            if self
                .locked
                .compare_exchange_weak(0, 1, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
                return Locked { slot: self };
            }
            while self.locked.load(Ordering::Relaxed) != 0 {
                backoff(&mut spins);
            }
        }
    }
}

/// One turn of a wait for another thread's few instructions (a slot's holder): a spin hint for the first 64 turns, then a yield (a preempted
/// holder gets the core). Under loom every turn yields: the model must let the holder run.
pub(super) fn backoff(spins: &mut u32) {
    *spins += 1;
    if cfg!(loom) || *spins > 64 {
        crate::sync::thread::yield_now();
    } else {
        std::hint::spin_loop();
    }
}

/// A key's home slot in its [`KeyTable`] (from [`KeyTable::home_of`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct KeyHome(u32);

/// A running invocation's place in its [`KeyTable`]: its key's home and its seat there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Seat {
    home: KeyHome,
    index: u32,
}

impl Seat {
    /// The seat in 63 bits (shifted left by one: the caller's bit 0 stays free).
    #[inline]
    pub(crate) fn pack(self) -> u64 {
        (u64::from(self.index) << 32) | (u64::from(self.home.0) << 1)
    }

    /// The seat packed in `w` by [`pack`](Self::pack) (bit 0 ignored).
    #[inline]
    pub(crate) fn unpack(w: u64) -> Self {
        Seat {
            home: KeyHome((w as u32) >> 1),
            index: (w >> 32) as u32,
        }
    }
}

/// The running keys (module docs).
pub(crate) struct KeyTable<K> {
    slots: Box<[Slot<K>]>,
    hasher: Hasher,
}

/// Random per table, so that nobody can pick keys that share a home; fixed under loom, whose
/// models must run the same way in every execution.
#[cfg(not(loom))]
type Hasher = foldhash::fast::RandomState;
#[cfg(loom)]
type Hasher = foldhash::fast::FixedState;

impl<K: Hash + Eq> KeyTable<K> {
    /// Twice the keys that can run at once (so few homes collide), at least 16 and at most
    /// 1024 slots (a home's number then fits the 31 bits [`Seat::pack`] gives it).
    pub(crate) fn new(client_limit: u32) -> Self {
        let n = (client_limit as usize)
            .saturating_mul(2)
            .clamp(16, 1024)
            .next_power_of_two();
        KeyTable {
            slots: (0..n)
                .map(|_| Slot {
                    locked: AtomicU32::new(0),
                    live: AtomicUsize::new(0),
                    home: UnsafeCell::new(Home {
                        first: None,
                        more: Vec::new(),
                    }),
                })
                .collect(),
            hasher: Hasher::default(),
        }
    }

    /// `key`'s home: the one hash of the key an invocation makes.
    #[inline]
    pub(crate) fn home_of(&self, key: &K) -> KeyHome {
        let h = self.hasher.hash_one(key) as usize;
        KeyHome((h & (self.slots.len() - 1)) as u32)
    }

    fn slot(&self, at: KeyHome) -> &Slot<K> {
        &self.slots[at.0 as usize]
    }

    /// Claims `key` (whose home is `at`) with the entry `stamp` describes, if no invocation
    /// of it runs; its seat, or the key back. An owned key moves into the entry; a borrowed
    /// one is cloned into it, only when the claim succeeds (the queued path's scans judge
    /// many tickets that miss).
    #[inline]
    pub(crate) fn claim<Q: ClaimKey<K>>(
        &self,
        at: KeyHome,
        key: Q,
        stamp: Stamp,
    ) -> Result<Seat, Q> {
        let mut g = self.slot(at).lock();
        let first_live = g.first_live();
        let (index, dead) = g.with(|h| {
            if h.each(first_live).any(|r| r.key == *key.key()) {
                return Err(key);
            }
            let entry = Running {
                key: key.into_key(),
                ticket: stamp.ticket,
                provider: stamp.provider,
                started_at: stamp.started_at,
                received_at: stamp.received_at,
                signal: None,
            };
            Ok(if !first_live {
                (0, h.first.replace(entry))
            } else if let Some(i) = h.more.iter().position(Option::is_none) {
                h.more[i] = Some(entry);
                (i + 1, None)
            } else {
                h.more.push(Some(entry));
                (h.more.len(), None)
            })
        })?;
        if index == 0 {
            // After the entry (module docs): the holder's lock-free release reads it back.
            g.slot.live.store(stamp.provider + 1, Ordering::Release);
        }
        drop(g);
        // The seat's dead entry (user code: the key's drop) after the unlock.
        drop(dead);
        Ok(Seat {
            home: at,
            index: index as u32,
        })
    }

    /// Frees the key in `seat` under its slot's lock; `f` runs on its entry after the unlock
    /// (where the key is dropped: user code). `None` if the seat is empty (not while its
    /// invocation holds it).
    pub(crate) fn release<R>(&self, seat: Seat, f: impl FnOnce(Running<K>) -> R) -> Option<R> {
        let mut g = self.slot(seat.home).lock();
        let first_live = g.first_live();
        let entry = g.with(|h| {
            if seat.index == 0 {
                return if first_live { h.first.take() } else { None };
            }
            let e = h.seat(seat.index).take();
            // A collision's seats: the empty ones at the end go, and the vector's memory
            // with the last of them (memory follows the keys running at once).
            while h.more.last().is_some_and(Option::is_none) {
                h.more.pop();
            }
            if h.more.is_empty() {
                h.more = Vec::new();
            }
            e
        });
        if seat.index == 0 && first_live {
            g.slot.live.store(0, Ordering::Release);
        }
        drop(g);
        entry.map(f)
    }

    /// Frees the key in `seat` for the invocation that holds it; its provider. Seat 0 without
    /// the lock (module docs); its signal stays in the dead entry. `None` if the seat is empty
    /// (not while its invocation holds it).
    #[inline]
    pub(crate) fn release_held(&self, seat: Seat) -> Option<usize> {
        if seat.index != 0 {
            return self.release(seat, |e| e.provider);
        }
        let slot = self.slot(seat.home);
        // `Relaxed`: the holder's claim wrote it, in this thread or in one that handed it
        // the seat, and nobody else writes it while the seat is held.
        let provider = slot.live.load(Ordering::Relaxed).checked_sub(1)?;
        // Broken variant (loom model `coordinator.rs`, model 2): a `Relaxed` release lets the
        // next invocation of the key start without seeing this one's work.
        #[cfg(loom)]
        let order =
            if crate::sync::broken_variant("LLM_BULKHEAD_LOOM_COORDINATOR_KEY_RELEASE_RELAXED") {
                Ordering::Relaxed
            } else {
                Ordering::Release
            };
        #[cfg(not(loom))]
        let order = Ordering::Release;
        slot.live.store(0, order);
        Some(provider)
    }

    /// Runs `f` on the entry in `seat` (`None` if the seat is empty).
    pub(crate) fn with<R>(&self, seat: Seat, f: impl FnOnce(&mut Running<K>) -> R) -> Option<R> {
        let mut g = self.slot(seat.home).lock();
        if seat.index == 0 && !g.first_live() {
            return None;
        }
        g.with(|h| h.seat(seat.index).as_mut().map(f))
    }

    /// The signal of the invocation in `seat`, made on first use (cancelled at once if
    /// `closed()`: the close's scan may have passed this slot). A fresh token if the seat is
    /// empty (not while its invocation holds it).
    pub(crate) fn signal(&self, seat: Seat, closed: impl Fn() -> bool) -> CancelToken {
        self.with(seat, |e| {
            e.signal
                .get_or_insert_with(|| {
                    let s = CancelToken::new();
                    if closed() {
                        s.cancel();
                    }
                    s
                })
                .clone()
        })
        .unwrap_or_default()
    }

    /// Runs `f` on every running entry, slot by slot.
    fn each(&self, mut f: impl FnMut(&Running<K>)) {
        for s in self.slots.iter() {
            let mut g = s.lock();
            let first_live = g.first_live();
            g.with(|h| h.each(first_live).for_each(&mut f));
        }
    }

    /// Every running invocation's signal made so far.
    pub(crate) fn signals(&self) -> Vec<CancelToken> {
        let mut out = Vec::new();
        self.each(|e| out.extend(e.signal.clone()));
        out
    }

    /// Every running key and its ticket.
    pub(crate) fn running(&self) -> Vec<(K, TicketId)>
    where
        K: Clone,
    {
        let mut out = Vec::new();
        self.each(|e| out.push((e.key.clone(), e.ticket)));
        out
    }

    /// The table's total capacity in entries: its slots and their collision seats (a test
    /// shows it stays flat).
    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn capacity(&self) -> usize {
        self.slots.len()
            + self
                .slots
                .iter()
                .map(|s| s.lock().with(|h| h.more.capacity()))
                .sum::<usize>()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// Two distinct keys that share a home in `t`.
    fn colliding(t: &KeyTable<u64>) -> (u64, u64) {
        let home = |k: &u64| t.home_of(k);
        let a = 0;
        let b = (1..).find(|b| home(b) == home(&a)).unwrap();
        (a, b)
    }

    fn stamp(id: u64) -> Stamp {
        Stamp {
            ticket: TicketId(id),
            provider: 0,
            started_at: None,
            received_at: SystemTime::UNIX_EPOCH,
        }
    }

    #[test]
    fn a_key_whose_home_is_taken_gets_a_seat_of_its_own_and_stays_unique() {
        let t = KeyTable::<u64>::new(1);
        let (a, b) = colliding(&t);
        let claim = |k: u64, id| t.claim(t.home_of(&k), k, stamp(id));
        let release = |s: Seat| t.release(s, |e| (e.ticket, e.signal)).unwrap();
        let sa = claim(a, 1).unwrap();
        let sb = claim(b, 2).expect("b takes the home's second seat");
        assert_ne!(sa, sb);
        assert_eq!(claim(b, 3), Err(b), "b runs (second seat)");
        assert_eq!(claim(a, 3), Err(a), "a runs (first seat)");
        let mut running = t.running();
        running.sort();
        assert_eq!(running, vec![(a, TicketId(1)), (b, TicketId(2))]);
        let s = t.signal(sb, || false);
        assert_eq!(t.signals().len(), 1);
        // The first seat frees; b is still found in its own.
        let (id, signal) = release(sa);
        assert_eq!(id, TicketId(1));
        assert!(signal.is_none());
        assert_eq!(claim(b, 3), Err(b), "b still runs");
        let sa = claim(a, 4).expect("a back in the first seat");
        let (id, back) = release(sb);
        assert_eq!(id, TicketId(2));
        back.expect("b's signal").cancel();
        assert!(s.is_cancelled(), "the same signal");
        assert_eq!(t.capacity(), t.slots.len(), "the empty seat's memory went");
        let sb = claim(b, 5).expect("b takes a second seat again");
        assert_eq!(release(sb).0, TicketId(5));
        assert_eq!(release(sa).0, TicketId(4));
        assert!(t.running().is_empty());
        assert!(t.release(sa, |_| ()).is_none(), "an empty seat");
        let sb = claim(b, 6).expect("b in the first seat");
        assert_eq!(t.running(), vec![(b, TicketId(6))]);
        assert_eq!(t.with(sb, |e| e.ticket), Some(TicketId(6)));
    }

    /// Seat 0's holder frees it without the lock: the seat reads as empty at once, and the
    /// dead entry (its key, its signal) is replaced by the next claim.
    #[test]
    fn the_holder_of_seat_0_frees_it_without_the_lock() {
        let t = KeyTable::<u64>::new(1);
        let (a, b) = colliding(&t);
        let mut s = stamp(1);
        s.provider = 3;
        let sa = t.claim(t.home_of(&a), a, s).unwrap();
        let signal = t.signal(sa, || false);
        let sb = t.claim(t.home_of(&b), b, stamp(2)).unwrap();
        assert_eq!(t.release_held(sa), Some(3), "its provider");
        assert_eq!(t.release_held(sa), None, "freed once");
        assert!(t.with(sa, |_| ()).is_none());
        assert!(t.release(sa, |_| ()).is_none());
        assert_eq!(t.running(), vec![(b, TicketId(2))]);
        assert_eq!(
            t.signals().len(),
            0,
            "a dead entry's signal is not a running one's"
        );
        assert!(!signal.is_cancelled());
        // b still runs in its own seat; a is claimed again, into seat 0.
        assert_eq!(t.claim(t.home_of(&b), b, stamp(3)), Err(b));
        let sa2 = t.claim(t.home_of(&a), a, stamp(4)).unwrap();
        assert_eq!(sa2, sa);
        assert_eq!(
            t.with(sa2, |e| (e.ticket, e.signal.is_none())),
            Some((TicketId(4), true))
        );
        assert_eq!(t.release_held(sb), Some(0));
        assert_eq!(t.release_held(sa2), Some(0));
        assert!(t.running().is_empty());
    }

    /// Threads claim and release two keys that share a home: a key is never claimed twice.
    #[test]
    fn colliding_keys_are_never_claimed_twice_across_threads() {
        use crate::sync::{AtomicBool, AtomicU64};
        let t = KeyTable::<u64>::new(1);
        let (a, b) = colliding(&t);
        let held = [AtomicBool::new(false), AtomicBool::new(false)];
        let ids = AtomicU64::new(0);
        std::thread::scope(|s| {
            for i in 0..4 {
                let (t, held, ids) = (&t, &held, &ids);
                s.spawn(move || {
                    for n in 0..5_000 {
                        let which = (i + n) % 2;
                        let key = [a, b][which];
                        let id = ids.fetch_add(1, Ordering::Relaxed);
                        if let Ok(seat) = t.claim(t.home_of(&key), key, stamp(id)) {
                            assert!(!held[which].swap(true, Ordering::AcqRel), "claimed twice");
                            held[which].store(false, Ordering::Release);
                            assert_eq!(t.release(seat, |e| e.key), Some(key));
                        }
                    }
                });
            }
        });
        assert!(t.running().is_empty());
    }
}
