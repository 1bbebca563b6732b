//! The multi-resource wait (`llm_bulkhead::multi_wait`): eligibility-ordered FIFO, starts
//! inside the releasing operation, wakes counted (no thundering herd), cancel / timeout /
//! close leaking nothing, blocking and async waiters (tokio and futures-lite).

use llm_bulkhead::multi_wait::{
    Admit, Cancel, Leave, MultiWait, Refused, Start, Submitted, WaitFuture, Waited,
};
use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A global slot count plus named resources (each held by at most one grant).
#[derive(Debug, Default)]
struct Res {
    global: u32,
    busy: HashSet<&'static str>,
    cap: usize,
    left: Vec<(u32, Option<Leave>)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Req {
    id: u32,
    needs: Vec<&'static str>,
}

impl Admit for Res {
    type Request = Req;
    type Grant = Req;
    fn try_start(&mut self, r: &Req) -> Start<Req> {
        if self.global == 0 {
            return Start::Nobody;
        }
        if r.needs.iter().any(|n| self.busy.contains(n)) {
            return Start::NotYet;
        }
        self.global -= 1;
        self.busy.extend(r.needs.iter().copied());
        Start::Now(r.clone())
    }
    fn give_back(&mut self, g: Req) {
        self.global += 1;
        for n in &g.needs {
            assert!(self.busy.remove(n), "{n} given back twice");
        }
    }
    fn may_queue(&mut self, _: &Req, queued: usize) -> bool {
        queued < self.cap
    }
    fn left_queue(&mut self, r: &Req, why: Option<Leave>) {
        self.left.push((r.id, why));
    }
}

fn req(id: u32, needs: &[&'static str]) -> Req {
    Req {
        id,
        needs: needs.to_vec(),
    }
}

fn res(global: u32, cap: usize) -> MultiWait<Res> {
    MultiWait::new(Res {
        global,
        cap,
        ..Res::default()
    })
}

fn started(s: Result<Submitted<Req>, Refused>) -> Req {
    match s {
        Ok(Submitted::Started(g)) => g,
        other => panic!("expected a start, got {other:?}"),
    }
}

fn queued(s: Result<Submitted<Req>, Refused>) -> llm_bulkhead::multi_wait::WaiterId {
    match s {
        Ok(Submitted::Queued(id)) => id,
        other => panic!("expected a queue place, got {other:?}"),
    }
}

fn assert_at_rest(w: &MultiWait<Res>, global: u32) {
    let (g, busy) = w.read(|s, _| (s.global, s.busy.len()));
    assert_eq!((g, busy), (global, 0), "resources leaked");
    assert_eq!((w.queued(), w.uncollected()), (0, 0));
}

#[test]
fn a_blocked_waiter_blocks_nobody_behind_it_and_the_oldest_eligible_starts_first() {
    let w = res(3, 10);
    let held = started(w.submit(req(0, &["x"])));
    let blocked = queued(w.submit(req(1, &["x", "y"])));
    // Not blocked by waiter 1 (it needs x): starts now, no queue place.
    let free = started(w.submit(req(2, &["y"])));
    let behind = queued(w.submit(req(3, &["y"])));
    let later = queued(w.submit(req(4, &["y"])));
    // y is freed: waiter 1 still needs x, so 3 (the oldest that can) starts; 4 stays.
    w.update(|s| s.give_back(free));
    assert_eq!(
        w.wait_blocking(behind, None),
        Waited::Started(req(3, &["y"]))
    );
    assert_eq!(w.queued(), 2);
    w.update(|s| s.give_back(req(3, &["y"])));
    // y free again, x still held: 4 starts, 1 waits.
    assert_eq!(
        w.wait_blocking(later, None),
        Waited::Started(req(4, &["y"]))
    );
    w.update(|s| s.give_back(req(4, &["y"])));
    w.update(|s| s.give_back(held));
    assert_eq!(
        w.wait_blocking(blocked, None),
        Waited::Started(req(1, &["x", "y"]))
    );
    w.update(|s| s.give_back(req(1, &["x", "y"])));
    assert_at_rest(&w, 3);
    let order: Vec<u32> = w.read(|s, _| s.left.iter().map(|l| l.0).collect());
    assert_eq!(order, vec![3, 4, 1]);
}

#[test]
fn nobody_ends_the_scan_and_the_queue_cap_refuses_without_a_trace() {
    let w = res(1, 1);
    let g = started(w.submit(req(0, &[])));
    let a = queued(w.submit(req(1, &["a"])));
    assert_eq!(w.submit(req(2, &["b"])), Err(Refused::Full));
    assert_eq!(w.queued(), 1);
    w.update(|s| s.give_back(g));
    assert_eq!(w.wait_blocking(a, None), Waited::Started(req(1, &["a"])));
    w.update(|s| s.give_back(req(1, &["a"])));
    assert_at_rest(&w, 1);
}

struct CountingWaker(std::sync::atomic::AtomicUsize);

impl std::task::Wake for CountingWaker {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// A release that makes one of many registered waiters startable wakes that one only; each
/// later release wakes the next one only.
#[test]
fn a_release_wakes_only_the_waiter_it_starts() {
    let w = res(100, 100);
    let mut held = started(w.submit(req(0, &["hot"])));
    let mut waiters: Vec<_> = (1..=8)
        .map(|i| {
            let counter = Arc::new(CountingWaker(Default::default()));
            let f = Box::pin(WaitFuture::new(&w, queued(w.submit(req(i, &["hot"])))));
            (counter, f)
        })
        .collect();
    for (c, f) in &mut waiters {
        let waker = std::task::Waker::from(c.clone());
        assert!(f
            .as_mut()
            .poll(&mut std::task::Context::from_waker(&waker))
            .is_pending());
    }
    for i in 0..8 {
        w.update(|s| s.give_back(held));
        let counts: Vec<usize> = waiters
            .iter()
            .map(|(c, _)| c.0.load(std::sync::atomic::Ordering::SeqCst))
            .collect();
        let expect: Vec<usize> = (0..8).map(|j| usize::from(j <= i)).collect();
        assert_eq!(counts, expect, "after release {i}");
        assert_eq!(w.wakes(), i as u64 + 1);
        let (c, f) = &mut waiters[i];
        let waker = std::task::Waker::from(c.clone());
        match f.as_mut().poll(&mut std::task::Context::from_waker(&waker)) {
            std::task::Poll::Ready(Waited::Started(g)) => held = g,
            other => panic!("{other:?}"),
        }
    }
    w.update(|s| s.give_back(held));
    drop(waiters);
    assert_at_rest(&w, 100);
}

#[test]
fn cancel_timeout_and_close_remove_and_leak_nothing() {
    let w = res(1, 10);
    let g = started(w.submit(req(0, &[])));
    let a = queued(w.submit(req(1, &[])));
    let b = queued(w.submit(req(2, &[])));
    let c = queued(w.submit(req(3, &[])));
    assert_eq!(w.cancel(a, Leave::Cancelled), Cancel::Removed(req(1, &[])));
    assert_eq!(w.wait_blocking(a, None), Waited::Left(Leave::Cancelled));
    let past = Instant::now();
    assert_eq!(
        w.wait_blocking(b, Some(past)),
        Waited::Left(Leave::TimedOut)
    );
    assert_eq!(w.close(), vec![(c, req(3, &[]))]);
    assert_eq!(w.wait_blocking(c, None), Waited::Left(Leave::Closed));
    assert_eq!(w.submit(req(4, &[])), Err(Refused::Closed));
    // A grant taken before close is given back as usual.
    w.update(|s| s.give_back(g));
    assert_at_rest(&w, 1);
    let left: Vec<_> = w.read(|s, _| s.left.clone());
    assert_eq!(
        left,
        vec![
            (1, Some(Leave::Cancelled)),
            (2, Some(Leave::TimedOut)),
            (3, Some(Leave::Closed))
        ]
    );
}

#[test]
fn a_cancel_that_finds_a_grant_gives_it_to_the_next_waiter() {
    let w = res(1, 10);
    let g = started(w.submit(req(0, &[])));
    let a = queued(w.submit(req(1, &[])));
    let b = queued(w.submit(req(2, &[])));
    w.update(|s| s.give_back(g));
    // `a` started but its owner gives up before collecting: the grant passes to `b`.
    assert_eq!(w.cancel(a, Leave::Cancelled), Cancel::GaveBack);
    assert_eq!(w.wait_blocking(a, None), Waited::Left(Leave::Cancelled));
    assert_eq!(w.wait_blocking(b, None), Waited::Started(req(2, &[])));
    w.update(|s| s.give_back(req(2, &[])));
    assert_at_rest(&w, 1);
}

#[test]
fn a_deadline_that_loses_to_a_start_returns_the_grant() {
    let w = res(1, 10);
    let g = started(w.submit(req(0, &[])));
    let a = queued(w.submit(req(1, &[])));
    w.update(|s| s.give_back(g));
    let past = Instant::now();
    assert_eq!(w.wait_blocking(a, Some(past)), Waited::Started(req(1, &[])));
    w.update(|s| s.give_back(req(1, &[])));
    assert_at_rest(&w, 1);
}

#[test]
fn a_blocking_waiter_with_a_far_deadline_is_started_by_another_thread() {
    let w = Arc::new(res(1, 10));
    let g = started(w.submit(req(0, &[])));
    let a = queued(w.submit(req(1, &[])));
    let w2 = w.clone();
    let t = std::thread::spawn(move || {
        w2.wait_blocking(a, Some(Instant::now() + Duration::from_secs(600)))
    });
    w.update(|s| s.give_back(g));
    assert_eq!(t.join().unwrap(), Waited::Started(req(1, &[])));
    w.update(|s| s.give_back(req(1, &[])));
    assert_at_rest(&w, 1);
}

#[test]
fn futures_on_tokio_start_and_dropped_futures_leak_nothing() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .unwrap();
    rt.block_on(async {
        let w = Arc::new(res(1, 10));
        let g = started(w.submit(req(0, &[])));
        let a = queued(w.submit(req(1, &[])));
        let dropped = queued(w.submit(req(2, &[])));
        let c = queued(w.submit(req(3, &[])));
        let fa = tokio::spawn(WaitFuture::new(w.clone(), a));
        // Polled once then dropped: its waiter is removed.
        let mut fd = Box::pin(WaitFuture::new(w.clone(), dropped));
        assert!(futures_lite::future::poll_once(&mut fd).await.is_none());
        drop(fd);
        w.update(|s| s.give_back(g));
        let got = fa.await.unwrap();
        assert_eq!(got, Waited::Started(req(1, &[])));
        // Dropping the future of a waiter that started gives its grant to the next one.
        let fc = WaitFuture::new(w.clone(), c);
        w.update(|s| s.give_back(req(1, &[])));
        drop(fc);
        assert_at_rest(&w, 1);
    });
}

#[test]
fn futures_on_futures_lite() {
    let w = Arc::new(res(1, 10));
    let g = started(w.submit(req(0, &[])));
    let a = queued(w.submit(req(1, &[])));
    let w2 = w.clone();
    let t = std::thread::spawn(move || futures_lite::future::block_on(WaitFuture::new(w2, a)));
    w.update(|s| s.give_back(g));
    assert_eq!(t.join().unwrap(), Waited::Started(req(1, &[])));
    w.update(|s| s.give_back(req(1, &[])));
    assert_at_rest(&w, 1);
}

/// A waker whose clone, wake and drop try the `MultiWait`'s lock: if any ran under it, the
/// `try_lock`-like probe (a `queued()` call from inside) would deadlock the test.
#[test]
fn no_waker_code_runs_under_the_lock() {
    use std::task::{RawWaker, RawWakerVTable, Waker};
    thread_local!(static TARGET: std::cell::Cell<*const MultiWait<Res>> = const { std::cell::Cell::new(std::ptr::null()) });
    fn probe() {
        TARGET.with(|t| {
            let p = t.get();
            if !p.is_null() {
                // SAFETY: the test keeps the MultiWait alive while the waker lives.
                let _ = unsafe { &*p }.queued();
            }
        });
    }
    unsafe fn clone(p: *const ()) -> RawWaker {
        probe();
        RawWaker::new(p, &VTABLE)
    }
    unsafe fn wake(_: *const ()) {
        probe();
    }
    unsafe fn drop_w(_: *const ()) {
        probe();
    }
    static VTABLE: RawWakerVTable = RawWakerVTable::new(clone, wake, wake, drop_w);
    let w = res(1, 10);
    TARGET.with(|t| t.set(&w));
    // SAFETY: the vtable's functions ignore the data pointer.
    let waker = unsafe { Waker::from_raw(RawWaker::new(std::ptr::null(), &VTABLE)) };
    let mut cx = std::task::Context::from_waker(&waker);
    let g = started(w.submit(req(0, &[])));
    let a = queued(w.submit(req(1, &[])));
    let mut f = WaitFuture::new(&w, a);
    assert!(std::pin::Pin::new(&mut f).poll(&mut cx).is_pending());
    // A different waker identity: re-registration clones and drops outside the lock.
    w.update(|s| s.give_back(g));
    assert!(std::pin::Pin::new(&mut f).poll(&mut cx).is_ready());
    drop(f);
    w.update(|s| s.give_back(req(1, &[])));
    TARGET.with(|t| t.set(std::ptr::null()));
    drop(waker);
    assert_at_rest(&w, 1);
}

use std::future::Future;
