//! The table of running keys: a key is in it exactly while an invocation of it runs, so it
//! holds at most `client_limit` keys however many distinct keys pass through (memory stays
//! flat).
//!
//! # Layout
//!
//! A fixed array of slots, each with a one-word spin lock. A key's *home* is the slot its hash
//! picks; it lives there, or, when its home holds another key (a collision), in one overflow
//! map under a mutex, counted in its home's `overflow`. Every operation on a key locks its
//! home first, so two claims of one key are serialised by that lock whether the key ends up
//! at home or in the overflow: the home's entry and its `overflow` count say where to look,
//! and the overflow map is only read or changed by a thread holding the key's home.
//!
//! A claim and a release with no collision are one CAS (the lock) and one store (the unlock)
//! each, with no hash map: that is the uncontended path's whole cost for the key. The key is
//! hashed once per invocation ([`KeyTable::home_of`], before the claim); its home travels in
//! the grant to the release and the signal.
//!
//! # Why a spin lock
//!
//! The critical sections are a few loads and stores, one key clone (a claim) and one key
//! comparison; the lock is never held across user code that can block (a key's `Clone` and
//! `Eq` excepted, as a mutex would hold them too). Readers that walk every slot (a snapshot,
//! the close's scan of signals) take each slot's lock in turn. A waiter spins briefly, then
//! yields.
//!
//! # Memory ordering
//!
//! The lock is taken with an `Acquire` CAS and given back with a `Release` store: everything
//! a holder wrote to the slot happens-before the next holder's reads.

use super::TicketId;
use crate::sync::cell::UnsafeCell;
use crate::sync::{lock, AtomicU32, Mutex, Ordering};
use crate::wait::cancel::CancelToken;
use std::hash::{BuildHasher, Hash};

/// A running key's entry: its ticket, and the invocation's signal once somebody asked for it.
struct Entry {
    ticket: TicketId,
    signal: Option<CancelToken>,
}

/// What a slot's lock guards: the key at home here, and how many keys homed here live in
/// the overflow map.
struct Home<K> {
    running: Option<(K, Entry)>,
    overflow: u32,
}

struct Slot<K> {
    /// 0: unlocked; 1: locked.
    locked: AtomicU32,
    home: UnsafeCell<Home<K>>,
}

// SAFETY: `home` is only reached through a `Locked` guard, which exists only while its
// thread holds `locked` (module docs): one thread at a time, as with a mutex. The contents
// are `K` and `CancelToken`s, sent between threads with the slot.
unsafe impl<K: Send> Sync for Slot<K> {}

/// A held slot lock; unlocks on drop (also when a key's `Clone` or `Eq` panics).
struct Locked<'a, K> {
    slot: &'a Slot<K>,
}

impl<K> Locked<'_, K> {
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
        // Broken variant (loom model `coordinator.rs`, model 2): no lock, so a claim and a
        // release of one key touch its slot at once (loom reports the data race).
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

/// The running keys (module docs).
pub(crate) struct KeyTable<K> {
    slots: Box<[Slot<K>]>,
    /// Keys whose home holds another key, with their entries.
    overflow: Mutex<foldhash::HashMap<K, Entry>>,
    hasher: Hasher,
}

/// Random per table, so that nobody can pick keys that share a home; fixed under loom, whose
/// models must run the same way in every execution (a collision takes the overflow's mutex).
#[cfg(not(loom))]
type Hasher = foldhash::fast::RandomState;
#[cfg(loom)]
type Hasher = foldhash::fast::FixedState;

impl<K: Hash + Eq + Clone> KeyTable<K> {
    /// Twice the keys that can run at once (so few homes collide), at least 16 and at most
    /// 1024 slots.
    pub(crate) fn new(client_limit: u32) -> Self {
        let n = (client_limit as usize)
            .saturating_mul(2)
            .clamp(16, 1024)
            .next_power_of_two();
        KeyTable {
            slots: (0..n)
                .map(|_| Slot {
                    locked: AtomicU32::new(0),
                    home: UnsafeCell::new(Home {
                        running: None,
                        overflow: 0,
                    }),
                })
                .collect(),
            overflow: Mutex::new(foldhash::HashMap::default()),
            hasher: Hasher::default(),
        }
    }

    /// `key`'s home: the one hash of the key an invocation makes, kept in its grant for
    /// every later operation on the key (release, signal).
    #[inline]
    pub(crate) fn home_of(&self, key: &K) -> KeyHome {
        let h = self.hasher.hash_one(key) as usize;
        KeyHome((h & (self.slots.len() - 1)) as u32)
    }

    fn home(&self, at: KeyHome) -> &Slot<K> {
        &self.slots[at.0 as usize]
    }

    /// Claims `key` (whose home is `at`) for the ticket `ticket()` names, if no invocation
    /// of it runs.
    #[inline]
    pub(crate) fn claim(
        &self,
        at: KeyHome,
        key: &K,
        ticket: impl FnOnce() -> TicketId,
    ) -> Option<TicketId> {
        let mut g = self.home(at).lock();
        g.with(|h| {
            if h.running.as_ref().is_some_and(|(k, _)| k == key) {
                return None;
            }
            if h.overflow > 0 && lock(&self.overflow).contains_key(key) {
                return None;
            }
            let entry = Entry {
                ticket: ticket(),
                signal: None,
            };
            let t = entry.ticket;
            if h.running.is_none() {
                h.running = Some((key.clone(), entry));
            } else {
                lock(&self.overflow).insert(key.clone(), entry);
                h.overflow += 1;
            }
            Some(t)
        })
    }

    /// Frees `key` (whose home is `at`), which `ticket` holds; returns its signal, if one
    /// was made (the table's copy of the key and the signal are dropped after the lock: user
    /// code).
    #[inline]
    pub(crate) fn release(&self, at: KeyHome, key: &K, ticket: TicketId) -> Option<CancelToken> {
        let mut g = self.home(at).lock();
        let (k, entry) = g.with(|h| {
            if h.running.as_ref().is_some_and(|(_, e)| e.ticket == ticket) {
                let (k, e) = h.running.take()?;
                Some((Some(k), e))
            } else if h.overflow > 0 {
                let e = lock(&self.overflow).remove(key)?;
                h.overflow -= 1;
                Some((None, e))
            } else {
                None
            }
        })?;
        drop(g);
        drop(k);
        entry.signal
    }

    /// The signal of the invocation running `key` (home `at`) for `ticket`, made on first
    /// use (cancelled at once if `closed()`: the close's scan may have passed this slot).
    pub(crate) fn signal(
        &self,
        at: KeyHome,
        key: &K,
        ticket: TicketId,
        closed: impl Fn() -> bool,
    ) -> CancelToken {
        let make = |e: &mut Entry| {
            e.signal
                .get_or_insert_with(|| {
                    let s = CancelToken::new();
                    if closed() {
                        s.cancel();
                    }
                    s
                })
                .clone()
        };
        let mut g = self.home(at).lock();
        g.with(|h| match &mut h.running {
            Some((_, e)) if e.ticket == ticket => make(e),
            _ if h.overflow > 0 => match lock(&self.overflow).get_mut(key) {
                Some(e) if e.ticket == ticket => make(e),
                _ => CancelToken::new(),
            },
            // Not running (cannot happen while the invocation holds the key): a fresh token.
            _ => CancelToken::new(),
        })
    }

    /// Runs `f` on every running key and its entry, slot by slot, then the overflow.
    fn each(&self, mut f: impl FnMut(&K, &Entry)) {
        for s in self.slots.iter() {
            s.lock().with(|h| {
                if let Some((k, e)) = &h.running {
                    f(k, e);
                }
            });
        }
        for (k, e) in lock(&self.overflow).iter() {
            f(k, e);
        }
    }

    /// Every running invocation's signal made so far.
    pub(crate) fn signals(&self) -> Vec<CancelToken> {
        let mut out = Vec::new();
        self.each(|_, e| out.extend(e.signal.clone()));
        out
    }

    /// Every running key and its ticket.
    pub(crate) fn running(&self) -> Vec<(K, TicketId)> {
        let mut out = Vec::new();
        self.each(|k, e| out.push((k.clone(), e.ticket)));
        out
    }

    /// The table's total capacity: its slots and the overflow map's (a test shows it stays
    /// flat).
    #[cfg(feature = "testing")]
    pub(crate) fn capacity(&self) -> usize {
        self.slots.len() + lock(&self.overflow).capacity()
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

    #[test]
    fn a_key_whose_home_is_taken_lives_in_the_overflow_and_stays_unique() {
        let t = KeyTable::<u64>::new(1);
        let (a, b) = colliding(&t);
        let claim = |k: &u64, id| t.claim(t.home_of(k), k, || TicketId(id));
        let release = |k: &u64, id| t.release(t.home_of(k), k, TicketId(id));
        assert_eq!(claim(&a, 1), Some(TicketId(1)));
        assert_eq!(claim(&b, 2), Some(TicketId(2)), "b overflows");
        assert_eq!(claim(&b, 3), None, "b runs (in the overflow)");
        assert_eq!(claim(&a, 3), None, "a runs (at home)");
        let mut running = t.running();
        running.sort();
        assert_eq!(running, vec![(a, TicketId(1)), (b, TicketId(2))]);
        let s = t.signal(t.home_of(&b), &b, TicketId(2), || false);
        assert_eq!(t.signals().len(), 1);
        // The home frees; b is still found in the overflow.
        assert!(release(&a, 1).is_none());
        assert_eq!(claim(&b, 3), None, "b still runs");
        assert_eq!(claim(&a, 4), Some(TicketId(4)), "a back at home");
        let back = release(&b, 2).expect("b's signal");
        back.cancel();
        assert!(s.is_cancelled(), "the same signal");
        assert_eq!(claim(&b, 5), Some(TicketId(5)), "b overflows again");
        assert!(release(&b, 5).is_none());
        assert!(release(&a, 4).is_none());
        assert!(t.running().is_empty());
        assert_eq!(claim(&b, 6), Some(TicketId(6)), "b at home");
        assert_eq!(t.running(), vec![(b, TicketId(6))]);
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
                        let id = || TicketId(ids.fetch_add(1, Ordering::Relaxed));
                        if let Some(ticket) = t.claim(t.home_of(&key), &key, id) {
                            assert!(!held[which].swap(true, Ordering::AcqRel), "claimed twice");
                            held[which].store(false, Ordering::Release);
                            t.release(t.home_of(&key), &key, ticket);
                        }
                    }
                });
            }
        });
        assert!(t.running().is_empty());
    }
}
