//! No user code inside an operation (issue 26, item 1): a waiter's `Waker` is woken, cloned and
//! dropped outside the queue lock and outside every grace-period operation, so a waker that
//! blocks holds off no `apply_limits` (on its bulkhead or another), and one that panics leaves
//! nothing behind: the bulkhead's state is freed once its owners are gone, no decrement is
//! skipped, and the other waiters are still woken. Each scenario runs on the no-class path and
//! on the class path.
//!
//! The wakers are built from `std::task::Wake` impls (wake and drop) or a `RawWaker` (clone,
//! which `Wake` cannot hook). A waker that blocks waits on a gate the test opens only after an
//! `apply_limits` on the same bulkhead (`2^14 + 4` of them: more than a tag period, class tags
//! included, so an install would have to wait for an operation the waker held open) and one
//! on another bulkhead
//! have returned. The gate's wait gives up after [`GUARD`] and records it: a failure guard so a
//! broken build fails instead of hanging, never a synchronisation (every step waits for an
//! event: a channel message, a poll result).
//!
//! Freeing is observed with `testing::live_states` (as in `tests/lifetime_class_release.rs`),
//! so the tests take turns (`SERIAL`).
//!
//! Against the code before this change (wakers woken inside class operations, cloned and
//! dropped under the queue lock), nine of these fail: a waker blocking when cloned or dropped
//! (both paths: the install's pump waits for the queue lock), a waiter's or a drainer's waker
//! blocking when a class release wakes it, a drainer's when a class decision's undo wakes it
//! (the fourth install waits for the operation the wake ran in), and a waker that panics, or
//! whose drop panics, when a class release wakes it
//! (the release's pending-return mark, which the release then used, was never removed: the
//! state leaked). The others (the
//! no-class wakes, panics when cloned or replaced, a panic among several wake-ups, a waker
//! that releases) passed there too and guard against a regression.

#[path = "support/queue.rs"]
mod queue;

use llm_bulkhead::testing::live_states;
use llm_bulkhead::{Admission, Bulkhead, ClassLimits, Demand, Rejection, WaitOptions};
use queue::{settled, until_pending};
use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::task::{Context, Poll, RawWaker, RawWakerVTable, Wake, Waker};
use std::time::Duration;

/// How long a blocked waker waits for its gate before it gives up (a failure guard only).
const GUARD: Duration = Duration::from_secs(30);

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

#[derive(Clone, Copy, Debug)]
enum Path {
    Plain,
    Classed,
}

/// Two tests of scenario `$scenario`: `$name::plain` and `$name::classed`, taking turns.
macro_rules! both_paths {
    ($name:ident, $scenario:ident) => {
        mod $name {
            #[test]
            fn plain() {
                let _turn = super::serial();
                super::$scenario(super::Path::Plain);
            }
            #[test]
            fn classed() {
                let _turn = super::serial();
                super::$scenario(super::Path::Classed);
            }
        }
    };
}

fn bulkhead(path: Path, max_concurrent: u32) -> Bulkhead {
    let b = Bulkhead::builder()
        .max_concurrent(max_concurrent)
        .max_queue(8);
    match path {
        Path::Plain => b.build(),
        // No floors: every slot is borrowed, so a release has a shared decrease to make and
        // visits the queue from inside its operation.
        Path::Classed => b
            .class("x", ClassLimits::default())
            .default_class("x")
            .build(),
    }
    .unwrap()
}

/// `times` installs of the current limits under new revisions.
fn reconfigure(b: &Bulkhead, times: usize) {
    for _ in 0..times {
        let l = b.limits();
        b.apply_limits(l.with_revision(l.revision + 1)).unwrap();
    }
}

/// The reconfigurations a blocked waker must not hold off: a whole tag period of installs and a
/// few more on its own bulkhead (an install that completes a period over an operation in
/// progress waits for it, `src/grace.rs`) and one on another.
fn reconfigure_both(b: &Bulkhead, other: &Bulkhead) {
    reconfigure(b, (1 << 14) + 4);
    reconfigure(other, 1);
}

/// Waits until the waker blocks at `at`, runs [`reconfigure_both`] meanwhile (each call must
/// return while it blocks), then lets the waker go.
fn reconfigure_while_blocked(
    ctl: &Ctl,
    entered: &Receiver<&'static str>,
    at: &str,
    b: &Bulkhead,
    other: &Bulkhead,
) {
    assert_eq!(entered.recv_timeout(GUARD), Ok(at));
    reconfigure_both(b, other);
    ctl.open();
}

/// A blocking scenario's parts: the state count before it, two bulkheads of one path (the
/// second only reconfigured), a probe's control and where it reports blocking, a slot held on
/// the first.
type Scene = (
    u64,
    Bulkhead,
    Bulkhead,
    Arc<Ctl>,
    Receiver<&'static str>,
    Admission,
);

fn scene(path: Path) -> Scene {
    let base = live_states();
    let (b, other) = (bulkhead(path, 1), bulkhead(path, 1));
    let (ctl, entered) = Ctl::new();
    let held = b.try_acquire(Demand::slot()).unwrap();
    (base, b, other, ctl, entered, held)
}

/// Releases `held` on another thread, whose release wakes a waker that blocks; meanwhile
/// [`reconfigure_while_blocked`]. The waker was not held off.
fn release_while_blocked(
    held: Admission,
    ctl: &Ctl,
    entered: &Receiver<&'static str>,
    b: &Bulkhead,
    other: &Bulkhead,
) {
    std::thread::scope(|s| {
        let releaser = s.spawn(move || drop(held));
        reconfigure_while_blocked(ctl, entered, "wake", b, other);
        releaser.join().unwrap();
    });
    ctl.assert_not_held_off();
}

/// Drops `owners` (the last handles of the bulkheads made since `base`): every state is freed.
fn freed<T>(base: u64, owners: T) {
    drop(owners);
    assert_eq!(live_states(), base, "a bulkhead's state was not freed");
}

/// `b` is at rest ([`settled`]); it and `rest` go, and every state made since `base` is freed.
fn at_rest<T>(base: u64, b: Bulkhead, rest: T) {
    settled(&b);
    freed(base, (b, rest));
}

/// The waiter `f` was granted: it is ready with an admission (released here).
fn admitted<F: Future<Output = Result<Admission, Rejection>>>(mut f: Pin<Box<F>>) {
    assert!(matches!(
        poll(f.as_mut(), Waker::noop()),
        Poll::Ready(Ok(_))
    ));
}

/// What a probe waker does, shared with the test.
struct Ctl {
    open: Mutex<bool>,
    cv: Condvar,
    gave_up: AtomicBool,
    entered: Mutex<Sender<&'static str>>,
    block_wake: AtomicBool,
    panic_wake: AtomicBool,
    block_drop: AtomicBool,
    panic_drop: AtomicBool,
    block_clone: AtomicBool,
    panic_clone: AtomicBool,
    wakes: AtomicUsize,
    /// Released when woken: a waker that calls back into the bulkhead.
    release_on_wake: Mutex<Option<Admission>>,
}

impl Ctl {
    fn new() -> (Arc<Ctl>, Receiver<&'static str>) {
        let (tx, rx) = channel();
        let ctl = Ctl {
            open: Mutex::new(false),
            cv: Condvar::new(),
            gave_up: AtomicBool::new(false),
            entered: Mutex::new(tx),
            block_wake: AtomicBool::new(false),
            panic_wake: AtomicBool::new(false),
            block_drop: AtomicBool::new(false),
            panic_drop: AtomicBool::new(false),
            block_clone: AtomicBool::new(false),
            panic_clone: AtomicBool::new(false),
            wakes: AtomicUsize::new(0),
            release_on_wake: Mutex::new(None),
        };
        (Arc::new(ctl), rx)
    }

    /// Says where it blocks, then waits for the gate (giving up after [`GUARD`]).
    fn block(&self, at: &'static str) {
        let _ = self.entered.lock().unwrap().send(at);
        let open = self.open.lock().unwrap();
        let (_open, r) = self.cv.wait_timeout_while(open, GUARD, |o| !*o).unwrap();
        if r.timed_out() {
            self.gave_up.store(true, Ordering::SeqCst);
        }
    }

    fn open(&self) {
        *self.open.lock().unwrap() = true;
        self.cv.notify_all();
    }

    fn assert_not_held_off(&self) {
        assert!(
            !self.gave_up.load(Ordering::SeqCst),
            "the waker stayed blocked for {GUARD:?}: an install waited for it"
        );
    }

    fn wakes(&self) -> usize {
        self.wakes.load(Ordering::SeqCst)
    }
}

/// A waker from a `Wake` impl: counts its wake-ups, and blocks or panics when woken or when
/// its last reference is dropped, as its `Ctl` says.
struct Probe(Arc<Ctl>);

impl Wake for Probe {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.0.wakes.fetch_add(1, Ordering::SeqCst);
        if self.0.block_wake.swap(false, Ordering::SeqCst) {
            self.0.block("wake");
        }
        if self.0.panic_wake.swap(false, Ordering::SeqCst) {
            panic!("a waker that panics when woken");
        }
        let release = self.0.release_on_wake.lock().unwrap().take();
        drop(release);
    }
}

impl Drop for Probe {
    fn drop(&mut self) {
        if self.0.block_drop.swap(false, Ordering::SeqCst) {
            self.0.block("drop");
        }
        if self.0.panic_drop.swap(false, Ordering::SeqCst) && !std::thread::panicking() {
            panic!("a waker that panics when dropped");
        }
    }
}

fn probe(ctl: &Arc<Ctl>) -> Waker {
    Waker::from(Arc::new(Probe(Arc::clone(ctl))))
}

/// A waker whose clone blocks or panics (once) as its `Ctl` says (`Wake` has no clone hook).
fn cloning_probe(ctl: &Arc<Ctl>) -> Waker {
    fn clone(p: *const ()) -> RawWaker {
        // SAFETY: `p` is the `Arc<Ctl>` pointer made below, kept alive by this waker.
        let ctl = unsafe { &*(p as *const Ctl) };
        if ctl.block_clone.swap(false, Ordering::SeqCst) {
            ctl.block("clone");
        }
        if ctl.panic_clone.swap(false, Ordering::SeqCst) {
            panic!("a waker that panics when cloned");
        }
        // SAFETY: as above; one more strong count for the clone.
        unsafe { Arc::increment_strong_count(p as *const Ctl) };
        RawWaker::new(p, &VTABLE)
    }
    fn wake(p: *const ()) {
        wake_by_ref(p);
        drop_waker(p);
    }
    fn wake_by_ref(p: *const ()) {
        // SAFETY: as in `clone`.
        let ctl = unsafe { &*(p as *const Ctl) };
        ctl.wakes.fetch_add(1, Ordering::SeqCst);
    }
    fn drop_waker(p: *const ()) {
        // SAFETY: one strong count per waker, made by `into_raw` or `clone`.
        unsafe { Arc::decrement_strong_count(p as *const Ctl) };
    }
    static VTABLE: RawWakerVTable = RawWakerVTable::new(clone, wake, wake_by_ref, drop_waker);
    let p = Arc::into_raw(Arc::clone(ctl)) as *const ();
    // SAFETY: the vtable's functions follow the `RawWaker` contract for this pointer.
    unsafe { Waker::from_raw(RawWaker::new(p, &VTABLE)) }
}

fn poll<F: Future>(f: Pin<&mut F>, w: &Waker) -> Poll<F::Output> {
    f.poll(&mut Context::from_waker(w))
}

/// Polls (with a no-op waker) until the future is ready.
fn until_ready<F: Future>(mut f: Pin<&mut F>) -> F::Output {
    loop {
        if let Poll::Ready(out) = poll(f.as_mut(), Waker::noop()) {
            return out;
        }
        std::thread::yield_now();
    }
}

fn wait() -> WaitOptions {
    WaitOptions::default()
}

// ---- a waker that blocks ----

/// A release hands its slot to a waiter whose waker blocks when woken: installs on the same
/// bulkhead and on another return while it blocks.
fn blocking_wake(path: Path) {
    let (base, b, other, ctl, entered, held) = scene(path);
    let waker = probe(&ctl);
    let mut f = Box::pin(b.acquire(Demand::slot(), wait()));
    assert!(poll(f.as_mut(), &waker).is_pending());
    drop(waker);
    ctl.block_wake.store(true, Ordering::SeqCst);
    // The release grants the waiter and wakes it: the wake blocks on the releasing thread.
    release_while_blocked(held, &ctl, &entered, &b, &other);
    admitted(f);
    at_rest(base, b, other);
}

both_paths!(
    a_waker_that_blocks_when_woken_holds_off_no_install,
    blocking_wake
);

/// The release that leaves the bulkhead idle wakes a drainer whose waker blocks: installs
/// return meanwhile.
fn blocking_drain_wake(path: Path) {
    let (base, b, other, ctl, entered, held) = scene(path);
    let mut drain = Box::pin(b.drain(None));
    assert!(poll(drain.as_mut(), &probe(&ctl)).is_pending());
    ctl.block_wake.store(true, Ordering::SeqCst);
    release_while_blocked(held, &ctl, &entered, &b, &other);
    let Poll::Ready(report) = poll(drain.as_mut(), Waker::noop()) else {
        panic!("the drain ends once the bulkhead is idle")
    };
    assert!(report.drained);
    drop(drain);
    at_rest(base, b, other);
}

both_paths!(
    a_drainer_whose_waker_blocks_holds_off_no_install,
    blocking_drain_wake
);

/// A release wakes a waiter whose waker releases another admission of the bulkhead (a call
/// back into it, from where the first release delivers its wake-ups): that release hands its
/// slot to the next waiter, which is woken too.
fn releasing_wake(path: Path) {
    let base = live_states();
    let b = bulkhead(path, 2);
    let (first, _) = Ctl::new();
    let (second, _) = Ctl::new();
    let held = b.try_acquire(Demand::slot()).unwrap();
    *first.release_on_wake.lock().unwrap() = Some(b.try_acquire(Demand::slot()).unwrap());
    let mut fa = Box::pin(b.acquire(Demand::slot(), wait()));
    let mut fb = Box::pin(b.acquire(Demand::slot(), wait()));
    assert!(poll(fa.as_mut(), &probe(&first)).is_pending());
    assert!(poll(fb.as_mut(), &probe(&second)).is_pending());
    drop(held);
    assert_eq!((first.wakes(), second.wakes()), (1, 1));
    admitted(fa);
    admitted(fb);
    at_rest(base, b, ());
}

both_paths!(
    a_waker_that_releases_when_woken_passes_the_slot_on,
    releasing_wake
);

/// A class decision's fast attempt takes its step back (the bulkhead was closed between its
/// read and its class-word CAS, `PausePoint::ClassCas`), and that undo, inside the attempt's
/// operation, finds the queue flagged for a drainer and leaves the bulkhead idle: the
/// drainer's waker, which blocks, is woken only after the attempt left its operation, so
/// installs return meanwhile.
#[test]
fn a_drainer_woken_by_a_class_attempts_undo_holds_off_no_install() {
    let _turn = serial();
    let base = live_states();
    let floor = ClassLimits {
        protected_concurrent: 1,
        ..ClassLimits::default()
    };
    let b = Bulkhead::builder()
        .max_concurrent(2)
        .max_queue(8)
        .class("x", floor)
        .default_class("x")
        .build()
        .unwrap();
    let other = bulkhead(Path::Classed, 1);
    let (ctl, entered) = Ctl::new();
    // A drainer stays registered (its future is not polled again), so the class words keep
    // their queue flag with nobody queued: the fast attempt runs, and its undo pumps.
    let held = b.try_acquire(Demand::slot()).unwrap();
    let mut drain = Box::pin(b.drain(None));
    assert!(poll(drain.as_mut(), &probe(&ctl)).is_pending());
    drop(held);
    assert_eq!(ctl.wakes(), 1);
    ctl.block_wake.store(true, Ordering::SeqCst);
    let (paused_tx, paused) = channel();
    let (go_tx, go) = channel::<()>();
    std::thread::scope(|s| {
        let decider = s.spawn(|| {
            let mut first = true;
            llm_bulkhead::testing::set_pause_hook(move |p| {
                if p == llm_bulkhead::testing::PausePoint::ClassCas && std::mem::take(&mut first) {
                    paused_tx.send(()).unwrap();
                    go.recv().unwrap();
                }
            });
            let r = b.try_acquire(Demand::slot()).map(drop);
            llm_bulkhead::testing::clear_pause_hook();
            r
        });
        paused.recv().unwrap();
        b.close();
        go_tx.send(()).unwrap();
        reconfigure_while_blocked(&ctl, &entered, "wake", &b, &other);
        let refused = decider.join().unwrap().unwrap_err();
        assert_eq!(refused.reason, llm_bulkhead::RejectReason::Shutdown);
    });
    ctl.assert_not_held_off();
    assert_eq!(ctl.wakes(), 2);
    drop(drain);
    assert_eq!(b.stats().in_flight, 0);
    freed(base, (b, other));
}

/// A waiter's first poll clones a waker that blocks: installs return meanwhile.
fn blocking_clone(path: Path) {
    let (base, b, other, ctl, entered, held) = scene(path);
    ctl.block_clone.store(true, Ordering::SeqCst);
    let waker = cloning_probe(&ctl);
    let (queued_tx, queued) = channel();
    std::thread::scope(|s| {
        let waiter = s.spawn(|| {
            let mut f = pin!(b.acquire(Demand::slot(), wait()));
            let first = poll(f.as_mut(), &waker);
            queued_tx.send(()).unwrap();
            assert!(first.is_pending());
            until_ready(f).map(drop)
        });
        reconfigure_while_blocked(&ctl, &entered, "clone", &b, &other);
        queued.recv().unwrap();
        drop(held);
        assert!(waiter.join().unwrap().is_ok());
    });
    ctl.assert_not_held_off();
    drop(waker);
    at_rest(base, b, other);
}

both_paths!(
    a_waker_that_blocks_when_cloned_holds_off_no_install,
    blocking_clone
);

/// A queued waiter is polled again with another waker, which drops the one it had: that drop
/// blocks, and installs return meanwhile.
fn blocking_drop(path: Path) {
    let (base, b, other, ctl, entered, held) = scene(path);
    let (queued_tx, queued) = channel();
    std::thread::scope(|s| {
        let waiter = s.spawn(|| {
            let mut f = pin!(b.acquire(Demand::slot(), wait()));
            let first = probe(&ctl);
            assert!(poll(f.as_mut(), &first).is_pending());
            // The queue now holds the only reference to the first waker.
            drop(first);
            ctl.block_drop.store(true, Ordering::SeqCst);
            let second = probe(&Ctl::new().0);
            assert!(poll(f.as_mut(), &second).is_pending());
            queued_tx.send(()).unwrap();
            until_ready(f).map(drop)
        });
        reconfigure_while_blocked(&ctl, &entered, "drop", &b, &other);
        queued.recv().unwrap();
        drop(held);
        assert!(waiter.join().unwrap().is_ok());
    });
    ctl.assert_not_held_off();
    at_rest(base, b, other);
}

both_paths!(
    a_waker_that_blocks_when_dropped_holds_off_no_install,
    blocking_drop
);

// ---- a waker that panics ----

/// A release hands its slot to a waiter whose waker panics when woken. The panic reaches the
/// releaser after the release is complete: the granted waiter has its admission, the next
/// release reaches the next waiter, and once everything is dropped the state is freed.
fn panicking_wake_on_release(path: Path) {
    panicking_on_release(path, &|bad| &bad.panic_wake);
}

/// As [`panicking_wake_on_release`], with a waker whose drop panics: the wake consumes the
/// queue's reference, the last one.
fn panicking_drop_on_release(path: Path) {
    panicking_on_release(path, &|bad| &bad.panic_drop);
}

fn panicking_on_release(path: Path, arm: &dyn Fn(&Ctl) -> &AtomicBool) {
    let base = live_states();
    let b = bulkhead(path, 1);
    let (bad, _) = Ctl::new();
    let (good, _) = Ctl::new();
    let held = b.try_acquire(Demand::slot()).unwrap();
    let mut fa = Box::pin(b.acquire(Demand::slot(), wait()));
    let mut fb = Box::pin(b.acquire(Demand::slot(), wait()));
    assert!(poll(fa.as_mut(), &probe(&bad)).is_pending());
    assert!(poll(fb.as_mut(), &probe(&good)).is_pending());
    arm(&bad).store(true, Ordering::SeqCst);
    let released = catch_unwind(AssertUnwindSafe(|| drop(held)));
    assert!(released.is_err(), "the waker's panic reaches the releaser");
    assert_eq!(bad.wakes(), 1);
    let Poll::Ready(Ok(a)) = poll(fa.as_mut(), Waker::noop()) else {
        panic!("the panicking waker's waiter was granted")
    };
    drop(a);
    assert_eq!(good.wakes(), 1, "the next waiter was woken");
    assert!(matches!(
        poll(fb.as_mut(), Waker::noop()),
        Poll::Ready(Ok(_))
    ));
    drop((fa, fb));
    at_rest(base, b, ());
}

both_paths!(
    a_waker_that_panics_when_a_release_wakes_it_leaks_nothing,
    panicking_wake_on_release
);
both_paths!(
    a_waker_whose_drop_panics_when_a_release_wakes_it_leaks_nothing,
    panicking_drop_on_release
);

/// One pump answers three waiters whose middle waker panics: the other two are woken all the
/// same, by a release (inside a class operation on the class path) and by `close`.
fn panicking_wake_among_others(path: Path) {
    let base = live_states();
    let b = bulkhead(path, 1);
    let held = b.try_acquire(Demand::slot()).unwrap();
    let ctls: Vec<_> = (0..3).map(|_| Ctl::new().0).collect();
    let mut fs: Vec<_> = (0..3)
        .map(|_| Box::pin(b.acquire(Demand::slot(), wait())))
        .collect();
    for (f, ctl) in fs.iter_mut().zip(&ctls) {
        assert!(poll(f.as_mut(), &probe(ctl)).is_pending());
    }
    ctls[1].panic_wake.store(true, Ordering::SeqCst);
    let closed = catch_unwind(AssertUnwindSafe(|| b.close()));
    assert!(closed.is_err(), "the waker's panic reaches the caller");
    for ctl in &ctls {
        assert_eq!(ctl.wakes(), 1, "every waiter was woken");
    }
    for f in &mut fs {
        assert!(matches!(
            poll(f.as_mut(), Waker::noop()),
            Poll::Ready(Err(_))
        ));
    }
    drop(fs);
    drop(held);
    assert_eq!(b.stats().in_flight, 0);
    freed(base, b);
}

both_paths!(
    a_waker_that_panics_keeps_no_other_waiter_from_its_wakeup,
    panicking_wake_among_others
);

/// A waiter's first poll clones a waker that panics: nothing was queued, nothing is held.
fn panicking_clone(path: Path) {
    let base = live_states();
    let b = bulkhead(path, 1);
    let (ctl, _) = Ctl::new();
    let held = b.try_acquire(Demand::slot()).unwrap();
    let waker = cloning_probe(&ctl);
    ctl.panic_clone.store(true, Ordering::SeqCst);
    let polled = catch_unwind(AssertUnwindSafe(|| {
        let mut f = Box::pin(b.acquire(Demand::slot(), wait()));
        let _ = poll(f.as_mut(), &waker);
    }));
    assert!(polled.is_err(), "the clone's panic reaches the poller");
    // Another waiter queues and is served: the panic left no flag or waiter behind.
    let mut f = Box::pin(b.acquire(Demand::slot(), wait()));
    assert!(poll(f.as_mut(), &waker).is_pending());
    assert_eq!(b.stats().pending, 1);
    drop(held);
    admitted(f);
    at_rest(base, b, waker);
}

both_paths!(
    a_waker_that_panics_when_cloned_leaves_nothing_behind,
    panicking_clone
);

/// A queued waiter polled with a new waker drops the old one, which panics: the waiter stays
/// queued with the new waker and is served.
fn panicking_drop(path: Path) {
    let base = live_states();
    let b = bulkhead(path, 1);
    let (old, _) = Ctl::new();
    let (new, _) = Ctl::new();
    let held = b.try_acquire(Demand::slot()).unwrap();
    let mut f = Box::pin(b.acquire(Demand::slot(), wait()));
    assert!(poll(f.as_mut(), &probe(&old)).is_pending());
    old.panic_drop.store(true, Ordering::SeqCst);
    let fresh = probe(&new);
    let polled = catch_unwind(AssertUnwindSafe(|| poll(f.as_mut(), &fresh).is_pending()));
    assert!(polled.is_err(), "the drop's panic reaches the poller");
    until_pending(&b, 1);
    drop(held);
    assert_eq!(new.wakes(), 1, "the new waker is the one woken");
    admitted(f);
    at_rest(base, b, ());
}

both_paths!(
    a_waker_that_panics_when_dropped_leaves_nothing_behind,
    panicking_drop
);
