//! Models of the multi-resource wait (`src/wait/multi.rs`): a waiter that needs two resources
//! (`a` and `b`), each held by another thread.
//!
//! 1. the hand-off when the holders release: whichever release frees the last resource starts
//!    the waiter inside that release; the blocked waiter is woken and gets its grant (a lost
//!    start leaves it parked forever: loom reports a deadlock). Broken variant
//!    `LLM_BULKHEAD_LOOM_MULTIWAIT_NO_START_RULE=1` (no start rule after a change) fails it;
//! 2. a waiter's cancellation against the release that starts it: either the waiter was
//!    removed (it held nothing) or its grant went back; in both cases every resource is free
//!    at the end and a second waiter queued behind it is started. Broken variant
//!    `LLM_BULKHEAD_LOOM_MULTIWAIT_CANCEL_DROPS_GRANT=1` (a cancel that finds the grant drops
//!    it) fails it: the resources leak and the second waiter never starts;
//! 3. an async waiter (its future polled on its own thread) against the releases: woken once,
//!    started, nothing left behind;
//! 4. the coordinator's hand-off (a client slot and a key): the completion of the running
//!    invocation of key `k` against a newcomer of key `j` submitted at the same time, with a
//!    waiter of key `k` queued: the freed slot always goes to the queued waiter, never to the
//!    newcomer (which queues). With `LLM_BULKHEAD_LOOM_MULTIWAIT_NO_START_RULE=1` the newcomer
//!    can take the slot (or the waiter is never started).
#![cfg(loom)]

mod common;

use common::model;
use llm_bulkhead::multi_wait::{Admit, Leave, MultiWait, Start, Submitted, WaitFuture, Waited};
use loom::sync::Arc;
use loom::thread;

/// Two resources; a request names which it needs.
#[derive(Debug)]
struct Two {
    a: bool,
    b: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Need {
    a: bool,
    b: bool,
}

const BOTH: Need = Need { a: true, b: true };

impl Admit for Two {
    type Request = Need;
    type Grant = Need;
    fn try_start(&mut self, r: &Need) -> Start<Need> {
        if (r.a && !self.a) || (r.b && !self.b) {
            return Start::NotYet;
        }
        self.a &= !r.a;
        self.b &= !r.b;
        Start::Now(*r)
    }
    fn give_back(&mut self, g: Need) {
        self.a |= g.a;
        self.b |= g.b;
    }
}

fn both_held() -> (Arc<MultiWait<Two>>, Need, Need) {
    let w = Arc::new(MultiWait::new(Two { a: true, b: true }));
    let Ok(Submitted::Started(ga)) = w.submit(Need { a: true, b: false }) else {
        panic!("a is free")
    };
    let Ok(Submitted::Started(gb)) = w.submit(Need { a: false, b: true }) else {
        panic!("b is free")
    };
    (w, ga, gb)
}

fn assert_all_free(w: &MultiWait<Two>) {
    let (a, b) = w.read(|s, _| (s.a, s.b));
    assert!(a && b, "a resource leaked: a={a} b={b}");
    assert_eq!(w.queued(), 0);
    assert_eq!(w.uncollected(), 0);
}

#[test]
fn the_release_of_the_last_resource_starts_the_waiter() {
    model(|| {
        let (w, ga, gb) = both_held();
        let Ok(Submitted::Queued(id)) = w.submit(BOTH) else {
            panic!("both are held")
        };
        let w1 = w.clone();
        let ra = thread::spawn(move || w1.update(|s| s.give_back(ga)));
        let w2 = w.clone();
        let rb = thread::spawn(move || w2.update(|s| s.give_back(gb)));
        let got = w.wait_blocking(id, None);
        ra.join().unwrap();
        rb.join().unwrap();
        assert_eq!(got, Waited::Started(BOTH));
        assert_eq!(w.wakes() <= 1, true, "woken more than once");
        w.update(|s| s.give_back(BOTH));
        assert_all_free(&w);
    });
}

#[test]
fn a_cancel_against_the_starting_release_leaks_nothing() {
    model(|| {
        let (w, ga, gb) = both_held();
        let Ok(Submitted::Queued(first)) = w.submit(BOTH) else {
            panic!()
        };
        let Ok(Submitted::Queued(second)) = w.submit(BOTH) else {
            panic!()
        };
        w.update(|s| s.give_back(ga));
        let w1 = w.clone();
        let releaser = thread::spawn(move || w1.update(|s| s.give_back(gb)));
        // The first waiter's owner gives up while the release may be starting it.
        w.cancel(first, Leave::Cancelled);
        releaser.join().unwrap();
        assert_eq!(w.wait_blocking(first, None), Waited::Left(Leave::Cancelled));
        // Whatever happened to the first waiter, the second one starts.
        assert_eq!(w.wait_blocking(second, None), Waited::Started(BOTH));
        w.update(|s| s.give_back(BOTH));
        assert_all_free(&w);
    });
}

#[test]
fn an_async_waiter_against_the_releases() {
    model(|| {
        let (w, ga, gb) = both_held();
        let Ok(Submitted::Queued(id)) = w.submit(BOTH) else {
            panic!()
        };
        let w1 = w.clone();
        let ra = thread::spawn(move || w1.update(|s| s.give_back(ga)));
        let w2 = w.clone();
        let rb = thread::spawn(move || w2.update(|s| s.give_back(gb)));
        let got = loom::future::block_on(WaitFuture::new(w.clone(), id));
        ra.join().unwrap();
        rb.join().unwrap();
        assert_eq!(got, Waited::Started(BOTH));
        w.update(|s| s.give_back(BOTH));
        assert_all_free(&w);
    });
}

/// A client slot and running keys: the coordinator's hand-off in miniature.
struct SlotAndKeys {
    free: u32,
    running: Vec<u8>,
}

impl Admit for SlotAndKeys {
    type Request = u8;
    type Grant = u8;
    fn try_start(&mut self, key: &u8) -> Start<u8> {
        if self.free == 0 {
            return Start::Nobody;
        }
        if self.running.contains(key) {
            return Start::NotYet;
        }
        self.free -= 1;
        self.running.push(*key);
        Start::Now(*key)
    }
    fn give_back(&mut self, key: u8) {
        self.free += 1;
        self.running.retain(|k| *k != key);
    }
}

#[test]
fn a_completion_hands_its_slot_to_the_queued_ticket_not_to_a_racing_newcomer() {
    model(|| {
        let w = Arc::new(MultiWait::new(SlotAndKeys {
            free: 1,
            running: vec![],
        }));
        let Ok(Submitted::Started(k)) = w.submit(b'k') else {
            panic!("the slot is free")
        };
        let Ok(Submitted::Queued(waiter)) = w.submit(b'k') else {
            panic!("key k runs")
        };
        let w1 = w.clone();
        let completion = thread::spawn(move || w1.update(|s| s.give_back(k)));
        let newcomer = w.submit(b'j');
        completion.join().unwrap();
        let Ok(Submitted::Queued(late)) = newcomer else {
            panic!("a newcomer took the slot freed for the queued ticket: {newcomer:?}")
        };
        assert_eq!(w.wait_blocking(waiter, None), Waited::Started(b'k'));
        w.update(|s| s.give_back(b'k'));
        assert_eq!(w.wait_blocking(late, None), Waited::Started(b'j'));
        w.update(|s| s.give_back(b'j'));
        let (free, running) = w.read(|s, _| (s.free, s.running.len()));
        assert_eq!((free, running, w.queued(), w.uncollected()), (1, 0, 0, 0));
    });
}
