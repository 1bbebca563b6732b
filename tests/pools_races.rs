//! Two races of the pools, each pinned with the pause hooks (feature `testing`).
//!
//! **An undone unit refuses no one.** A pools decision takes its units by tentative steps and undoes them when a later step
//! refuses it. A request that meets such a unit must not be refused because of it: it waits
//! for the decision in progress to be confirmed or undone, and is refused only when the
//! committed holders explain the refusal (`src/pools/engine.rs`, "Spurious refusals").
//!
//! Decision D holds its partition's last
//! unit tentatively and is stopped there; request R comes to the same partition; D is then
//! refused by its token budget and gives the unit back. Every serial order admits R (D is
//! refused in all of them), so R must be admitted.

//!
//! **A freed unit goes to the queued waiter, not to a racing newcomer.** Partition `a-x`
//! waits on overflow; `b-z` rejects; the global guard has one unit, held by `b-z`. A waiter
//! of `a-x` is queued for it. The release of `b-z` is stopped after it gave the unit back and
//! before it hands it on; a newcomer to `b-z` (nobody waits there) comes meanwhile. The
//! waiter is older: it must start, and the newcomer be refused.

use llm_bulkhead::pools::*;
use llm_bulkhead::testing::{clear_pause_hook, set_pause_hook, PausePoint};
use std::future::Future;
use std::pin::Pin;
use std::sync::{mpsc, Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

/// Partition `p-c`: one active unit, a token budget of 10.
fn pools() -> Pools {
    let mut config = PoolsConfig::single("p", "c", 1);
    config.partitions.get_mut("p-c").unwrap().token_budget = Some(10);
    Pools::new(&config).unwrap()
}

enum Seen {
    /// R met D's tentative unit and waits for it.
    MetTentative,
    /// R's decision returned: admitted or not.
    Done(Result<(), Reason>),
}

#[test]
fn a_unit_that_is_undone_refuses_no_one() {
    let pools = pools();
    let id = pools.partition("p-c").unwrap();
    let (at_pause, paused) = mpsc::channel();
    let (go_tx, go) = mpsc::channel::<()>();
    let (seen_tx, seen) = mpsc::channel();
    std::thread::scope(|s| {
        // D: 11 tokens, more than the budget: refused at its token step, after its active
        // unit is taken. Stopped while it holds that unit.
        let d = s.spawn(|| {
            set_pause_hook(move |p| {
                if p == PausePoint::PoolsTentativeTaken {
                    at_pause.send(()).unwrap();
                    go.recv().unwrap();
                }
            });
            let mut req = PoolRequest::new(1, id);
            req.tokens = 11;
            let out = pools.try_admit(&req).map(drop).map_err(|r| r.reason);
            clear_pause_hook();
            out
        });
        paused.recv().unwrap();
        assert_eq!(pools.stats().partitions[0].tentative, 1);
        // R: no tokens; the partition's only unit is D's, still tentative.
        let r = s.spawn(|| {
            let tx = seen_tx.clone();
            set_pause_hook(move |p| {
                if p == PausePoint::PoolsMetTentative {
                    tx.send(Seen::MetTentative).unwrap();
                }
            });
            let out = pools.try_admit(&PoolRequest::new(2, id));
            clear_pause_hook();
            seen_tx
                .send(Seen::Done(out.as_ref().map(|_| ()).map_err(|r| r.reason)))
                .unwrap();
            out.map(drop)
        });
        // R either waits for D (and says so) or returns first: a refusal no serial order makes.
        match seen.recv().unwrap() {
            Seen::MetTentative => {}
            Seen::Done(out) => {
                go_tx.send(()).unwrap();
                d.join().unwrap().ok();
                panic!("R decided while D's unit was tentative: {out:?}");
            }
        }
        go_tx.send(()).unwrap();
        assert_eq!(d.join().unwrap(), Err(Reason::TokenBudgetReached));
        assert!(
            r.join().unwrap().is_ok(),
            "R was refused by D's undone unit"
        );
    });
    let p = &pools.stats().partitions[0];
    assert_eq!((p.active, p.tentative, p.tokens), (0, 0, 0), "{p:?}");
    assert_eq!(p.admitted, 1);
}

/// `a-x` (provider a, waits, pending 4) and `b-z` (provider b, rejects), one unit each, and
/// a global guard of one.
fn two_partitions_one_guard() -> Pools {
    let mut config = PoolsConfig::single("a", "x", 1);
    config.extend_with("b", "z", 1);
    config.global.max_active = 1;
    config.classes.get_mut("x").unwrap().overflow = Overflow::Wait;
    let part = config.partitions.get_mut("a-x").unwrap();
    (part.pending_limit, part.queue_max_age_ms) = (4, 600_000);
    Pools::new(&config).unwrap()
}

#[test]
fn a_freed_unit_goes_to_the_waiter_not_to_a_newcomer() {
    let pools = two_partitions_one_guard();
    let (ax, bz) = (
        pools.partition("a-x").unwrap(),
        pools.partition("b-z").unwrap(),
    );
    let held = pools.try_admit(&PoolRequest::new(1, bz)).unwrap();
    let (at_pause, paused) = mpsc::channel();
    let (go_tx, go) = mpsc::channel::<()>();
    std::thread::scope(|s| {
        let waiter = s.spawn(|| pools.admit_blocking(&PoolRequest::new(2, ax), None));
        while pools.stats().partitions[ax.index()].pending == 0 {
            std::thread::yield_now();
        }
        // The release, stopped between giving the unit back and handing it on.
        let releaser = s.spawn(move || {
            set_pause_hook(move |p| {
                if p == PausePoint::PoolsReleased {
                    at_pause.send(()).unwrap();
                    go.recv().unwrap();
                }
            });
            held.complete(None);
            clear_pause_hook();
        });
        paused.recv().unwrap();
        assert_eq!(pools.stats().global.held, 0);
        let newcomer = pools.try_admit(&PoolRequest::new(3, bz));
        go_tx.send(()).unwrap();
        releaser.join().unwrap();
        let refused = newcomer.map(|jumped| {
            jumped.complete(None); // its release starts the waiter, before this test fails
        });
        let started = waiter.join().unwrap();
        let d = started.route().decisions();
        assert_eq!(
            (d[0].decision, d.last().unwrap().decision),
            (Decision::Queue, Decision::Dispatch),
            "the waiter did not start: {d:?}"
        );
        drop(started);
        let refused = refused.err().map(|r| r.reason);
        assert_eq!(
            refused,
            Some(Reason::GlobalLimitReached),
            "the newcomer jumped the waiter"
        );
    });
    let s = pools.stats();
    assert_eq!(s.global.held, 0, "{s:?}");
}

/// A clock the test moves.
#[derive(Clone)]
struct Clock(Arc<Mutex<Instant>>);

impl Clock {
    /// Starts an hour before now: a deadline on it is long past on the real clock.
    fn new() -> Clock {
        let start = Instant::now()
            .checked_sub(Duration::from_secs(3600))
            .unwrap();
        Clock(Arc::new(Mutex::new(start)))
    }
    fn now(&self) -> Instant {
        *self.0.lock().unwrap()
    }
    fn advance(&self, by: Duration) {
        *self.0.lock().unwrap() += by;
    }
}

/// What an observer saw, per request: its decisions and its completions.
#[derive(Default, Clone)]
struct Events(Arc<Mutex<Vec<(u64, String)>>>);

impl PoolsObserver for Events {
    fn on_decision(&self, e: &DecisionEvent<'_>) {
        let line = format!("{:?}", e.decision);
        self.0.lock().unwrap().push((e.request_id, line));
    }
    fn on_completion(&self, e: &CompletionEvent<'_>) {
        let line = format!("completed {:?}", e.failure_class);
        self.0.lock().unwrap().push((e.request_id, line));
    }
}

impl Events {
    fn of(&self, id: u64) -> Vec<String> {
        let all = self.0.lock().unwrap();
        all.iter()
            .filter(|(r, _)| *r == id)
            .map(|(_, l)| l.clone())
            .collect()
    }
}

/// Partition `p-w`: one unit, waits on overflow (pending 4, max age 60 s), on `clock`.
fn waiting_pools(clock: &Clock, seen: &Events) -> Pools {
    let mut config = PoolsConfig::single("p", "w", 1);
    config.classes.get_mut("w").unwrap().overflow = Overflow::Wait;
    let part = config.partitions.get_mut("p-w").unwrap();
    (part.pending_limit, part.queue_max_age_ms) = (4, 60_000);
    let c = clock.clone();
    Pools::with_clock(&config, Some(Box::new(seen.clone())), move || c.now()).unwrap()
}

/// `p-w` and its one unit, held by request 1.
fn one_held(pools: &Pools) -> (PartitionId, PoolPermit<'_>) {
    let id = pools.partition("p-w").unwrap();
    (id, pools.try_admit(&PoolRequest::new(1, id)).unwrap())
}

fn poll<F: Future>(f: Pin<&mut F>) -> Poll<F::Output> {
    f.poll(&mut Context::from_waker(Waker::noop()))
}

fn last_reason(out: &PoolOutcome<'_>) -> (Decision, Reason) {
    let d = *out.route().decisions().last().unwrap();
    (d.decision, d.reason)
}

/// A waiter's deadline is read on the injected clock, and the pools' operations on that clock
/// end it; the real clock (on which this deadline passed an hour ago) ends nothing.
#[test]
fn a_waiters_deadline_is_on_the_injected_clock() {
    let (clock, seen) = (Clock::new(), Events::default());
    let pools = waiting_pools(&clock, &seen);
    let (id, held) = one_held(&pools);
    let mut wait = Box::pin(pools.admit_async(PoolRequest::new(2, id), None));
    assert!(
        poll(wait.as_mut()).is_pending(),
        "timed out on the real clock"
    );
    let blocked = std::thread::scope(|s| {
        let blocking = s.spawn(|| pools.admit_blocking(&PoolRequest::new(3, id), None));
        while pools.stats().partitions[0].pending < 2 {
            std::thread::yield_now();
        }
        clock.advance(Duration::from_secs(59));
        pools.expire_waiters();
        assert_eq!(pools.stats().partitions[0].pending, 2);
        clock.advance(Duration::from_secs(2));
        pools.expire_waiters();
        blocking.join().unwrap()
    });
    assert_eq!(
        last_reason(&blocked),
        (Decision::Reject, Reason::QueueAgeExceeded)
    );
    let Poll::Ready(out) = poll(wait.as_mut()) else {
        panic!("the async waiter is still queued")
    };
    assert_eq!(
        last_reason(&out),
        (Decision::Reject, Reason::QueueAgeExceeded)
    );
    drop(held);
    assert_eq!(pools.stats().partitions[0].pending, 0);
}

/// An async waiter started by a release and then dropped: the start was a decision, so it
/// has its dispatch event, then its completion (cancelled), and the units come back.
#[test]
fn a_started_then_dropped_waiter_has_its_dispatch_event() {
    let (clock, seen) = (Clock::new(), Events::default());
    let pools = waiting_pools(&clock, &seen);
    let (id, held) = one_held(&pools);
    let mut wait = Box::pin(pools.admit_async(PoolRequest::new(2, id), None));
    assert!(poll(wait.as_mut()).is_pending());
    held.complete(None); // starts the waiter
    assert_eq!(pools.stats().partitions[0].active, 1);
    drop(wait);
    assert_eq!(
        seen.of(2),
        ["Queue", "Dispatch", "completed Some(Cancelled)"],
        "its events"
    );
    let p = &pools.stats().partitions[0];
    assert_eq!((p.active, p.pending, p.admitted, p.completed), (0, 0, 2, 2));
}

/// An async waiter started by a release just before it reads its passed deadline: it leaves
/// with its age as the reason and gives the start back exactly once, to the next waiter.
#[test]
fn a_start_that_meets_the_deadline_is_given_back_once() {
    let (clock, seen) = (Clock::new(), Events::default());
    let pools = waiting_pools(&clock, &seen);
    let (id, held) = one_held(&pools);
    let mut first = Box::pin(pools.admit_async(PoolRequest::new(2, id), None));
    assert!(poll(first.as_mut()).is_pending());
    clock.advance(Duration::from_secs(30));
    let mut second = Box::pin(pools.admit_async(PoolRequest::new(3, id), None));
    assert!(poll(second.as_mut()).is_pending());
    let (at_pause, paused) = mpsc::channel();
    let (go_tx, go) = mpsc::channel::<()>();
    let out = std::thread::scope(|s| {
        let a = s.spawn(move || {
            set_pause_hook(move |p| {
                if p == PausePoint::PoolsWaiterDeadline {
                    at_pause.send(()).unwrap();
                    go.recv().unwrap();
                }
            });
            let out = poll(first.as_mut());
            clear_pause_hook();
            out.map(|o| last_reason(&o))
        });
        paused.recv().unwrap();
        held.complete(None); // starts the first waiter: its deadline has not passed yet
        assert_eq!(pools.stats().partitions[0].pending, 1);
        clock.advance(Duration::from_secs(31)); // now it has
        go_tx.send(()).unwrap();
        a.join().unwrap()
    });
    assert_eq!(
        out,
        Poll::Ready((Decision::Reject, Reason::QueueAgeExceeded))
    );
    // Given back once: the second waiter has the unit, and nothing else is held.
    let Poll::Ready(started) = poll(second.as_mut()) else {
        panic!("the given-back start was not passed on")
    };
    let s = pools.stats();
    assert_eq!((s.global.held, s.partitions[0].active), (1, 1), "{s:?}");
    drop(started);
    let s = pools.stats();
    assert_eq!((s.global.held, s.providers[0].held), (0, 0), "{s:?}");
    let p = &s.partitions[0];
    assert_eq!(
        (p.active, p.pending, p.admitted, p.completed),
        (0, 0, 3, 3),
        "{p:?}"
    );
}
