//! Reconfiguration waits for nobody else (issue 26, item 1): an install waits for nothing
//! outside its own bulkhead and never for user code, and `limits()`, `stats()` and
//! `would_admit()` never wait for an install in progress.
//!
//! Each scenario is one that hung before (4 runs of 4): a subscriber of a class refusal ran
//! inside the decision's grace-period operation, and an install waited (holding the
//! reconfiguration lock) for every operation in progress, of any bulkhead. Every scenario makes
//! enough installs to complete a whole tag period (eight: a class tag has four values), so an
//! install would have to wait for an operation that were still in progress across them.
//!
//! No timing: the threads meet on barriers and channels; a watchdog (20 s) only turns a hang
//! into a failure, it never synchronises anything.
#![cfg(feature = "testing")]

use llm_bulkhead::testing::{clear_pause_hook, set_pause_hook, PausePoint};
use llm_bulkhead::{Bulkhead, ClassLimits, Demand, Event};
use std::sync::mpsc;
use std::sync::{Arc, Barrier, Mutex};
use std::thread;
use std::time::Duration;

/// Installs a whole tag period twice over.
const INSTALLS: usize = 8;

/// Fails the test if `f` does not finish within the watchdog's bound (a hang detector only).
fn completes<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(20))
        .unwrap_or_else(|_| panic!("{what}: did not complete (deadlock)"))
}

/// A bulkhead with one class `a` whose ceiling is one slot: the second demand is refused at
/// the class ceiling, on the class protocol's full path (where its subscribers used to run).
fn one_slot_class() -> Bulkhead {
    Bulkhead::builder()
        .max_concurrent(4)
        .class(
            "a",
            ClassLimits {
                max_concurrent: Some(1),
                ..ClassLimits::default()
            },
        )
        .default_class("a")
        .build()
        .unwrap()
}

/// `n` installs on `b`, each a revision above the current one (a concurrent installer's
/// revision is taken into account: a stale one is retried).
fn reconfigure(b: &Bulkhead, n: usize) {
    let mut done = 0;
    while done < n {
        let cur = b.limits();
        let next = cur
            .with_revision(cur.revision + 1)
            .with_max_queue(cur.max_queue ^ 1);
        if b.apply_limits(next).is_ok() {
            done += 1;
        }
    }
}

/// [`reconfigure`], each install also changing class `a`'s limits (its ceiling goes from 1 to
/// 2 and back): a class's tag is its version, which only a change of its own limits moves, so
/// these installs move the class tag each time (it comes back after a whole tag period, as the
/// limits tag does).
fn reconfigure_class(b: &Bulkhead, n: usize) {
    let a = b.class_id("a").unwrap();
    let mut done = 0;
    while done < n {
        let cur = b.limits();
        let ceiling = cur.classes.get(a).unwrap().max_concurrent;
        let next = cur.with_revision(cur.revision + 1).with_class(
            a,
            ClassLimits {
                max_concurrent: Some(if ceiling == Some(1) { 2 } else { 1 }),
                ..ClassLimits::default()
            },
        );
        if b.apply_limits(next).is_ok() {
            done += 1;
        }
    }
}

/// A whole tag period of installs and a few more: the install that completes the period over
/// an operation in progress waits for it.
const PAST_A_PERIOD: usize = (1 << 14) + 4;

/// A thread that makes `n` installs on `b` (changing class `a`'s limits each time,
/// [`reconfigure_class`]) and reports on the channel, first,
/// `"waiting"` if one of them waits in a grace period, then `"done"`.
fn reporting_installer(
    b: &Bulkhead,
    n: usize,
) -> (thread::JoinHandle<()>, mpsc::Receiver<&'static str>) {
    let (tx, rx) = mpsc::channel();
    let b = b.clone();
    let installer = thread::spawn(move || {
        let waiting = tx.clone();
        let mut told = false;
        set_pause_hook(move |p| {
            if p == PausePoint::GracePeriod && !told {
                told = true;
                let _ = waiting.send("waiting");
            }
        });
        reconfigure_class(&b, n);
        clear_pause_hook();
        let _ = tx.send("done");
    });
    (installer, rx)
}

/// A slot for a bulkhead a subscriber reaches, cleared at the end so that the subscription
/// (which the bulkhead holds) does not keep its own bulkhead alive.
type Slot = Arc<Mutex<Option<Bulkhead>>>;

fn slot(b: &Bulkhead) -> Slot {
    Arc::new(Mutex::new(Some(b.clone())))
}

fn get(s: &Slot) -> Bulkhead {
    s.lock()
        .unwrap()
        .clone()
        .expect("the bulkhead is still there")
}

/// Whether `e` is a refusal (the subscribers below react to refusals only: an install emits a
/// reconfiguration event, to which they must not answer with another install).
fn refusal(e: &Event) -> bool {
    matches!(e, Event::Reject(_))
}

#[test]
fn a_subscriber_reads_the_refusing_bulkhead_while_another_thread_installs() {
    let b = one_slot_class();
    let held = b.try_acquire(Demand::slot()).unwrap();
    let me = slot(&b);
    let seen = me.clone();
    let sub = b.subscribe(move |e| {
        if !refusal(e) {
            return;
        }
        let b = get(&seen);
        // Another thread changes the class's limits while this subscriber runs, and reports
        // when it has finished or when it waits in a grace period.
        let (installer, rx) = reporting_installer(&b, INSTALLS);
        let first = rx.recv().unwrap();
        // Readers never wait for the install, whatever it is doing.
        let _ = b.stats();
        let _ = b.limits();
        let _ = b.would_admit(&Demand::slot());
        installer.join().unwrap();
        assert_eq!(first, "done", "the install waited for this subscriber");
    });
    let b2 = b.clone();
    completes(
        "subscriber reading while another thread installs",
        move || {
            assert!(b2.try_acquire(Demand::slot()).is_err());
        },
    );
    assert_eq!(b.limits().revision, INSTALLS as u64);
    drop((sub, held));
    me.lock().unwrap().take();
}

#[test]
fn two_refused_threads_whose_subscriber_installs_on_their_bulkhead() {
    let b = one_slot_class();
    let held = b.try_acquire(Demand::slot()).unwrap();
    let me = slot(&b);
    let seen = me.clone();
    // Both refused threads are inside their subscribers before either installs.
    let both = Arc::new(Barrier::new(2));
    let sub = b.subscribe(move |e| {
        if refusal(e) {
            both.wait();
            reconfigure(&get(&seen), INSTALLS);
        }
    });
    let refused = |b: Bulkhead| move || assert!(b.try_acquire(Demand::slot()).is_err());
    let t1 = thread::spawn(refused(b.clone()));
    let t2 = thread::spawn(refused(b.clone()));
    completes(
        "two refused threads installing from their subscribers",
        move || {
            t1.join().unwrap();
            t2.join().unwrap();
        },
    );
    assert_eq!(b.limits().revision, 2 * INSTALLS as u64);
    drop((sub, held));
    me.lock().unwrap().take();
}

#[test]
fn subscribers_of_two_bulkheads_reconfigure_each_other() {
    let (a, b) = (one_slot_class(), one_slot_class());
    let held = (
        a.try_acquire(Demand::slot()).unwrap(),
        b.try_acquire(Demand::slot()).unwrap(),
    );
    let (sa, sb) = (slot(&a), slot(&b));
    let both = Arc::new(Barrier::new(2));
    // Refused on `a`, reconfigure `b`; refused on `b`, reconfigure `a`.
    let cross = |other: Slot, both: Arc<Barrier>| {
        move |e: &Event| {
            if refusal(e) {
                both.wait();
                reconfigure(&get(&other), INSTALLS);
            }
        }
    };
    let suba = a.subscribe(cross(sb.clone(), both.clone()));
    let subb = b.subscribe(cross(sa.clone(), both));
    let refused = |b: Bulkhead| move || assert!(b.try_acquire(Demand::slot()).is_err());
    let t1 = thread::spawn(refused(a.clone()));
    let t2 = thread::spawn(refused(b.clone()));
    completes(
        "A's subscriber reconfigures B while B's reconfigures A",
        move || {
            t1.join().unwrap();
            t2.join().unwrap();
        },
    );
    assert_eq!(
        (a.limits().revision, b.limits().revision),
        (INSTALLS as u64, INSTALLS as u64)
    );
    drop((suba, subb, held));
    sa.lock().unwrap().take();
    sb.lock().unwrap().take();
}

#[test]
fn a_subscriber_blocked_on_a_refusal_of_a_holds_back_nothing_on_b() {
    let a = one_slot_class();
    let b = one_slot_class();
    let held = a.try_acquire(Demand::slot()).unwrap();
    // A logging sink blocked on I/O: the subscriber blocks until the test lets it go.
    let (inside_tx, inside_rx) = mpsc::channel::<()>();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let sink = Mutex::new((inside_tx, go_rx));
    let sub = a.subscribe(move |e| {
        if refusal(e) {
            let s = sink.lock().unwrap();
            s.0.send(()).unwrap();
            s.1.recv().unwrap();
        }
    });
    let a2 = a.clone();
    let refused = thread::spawn(move || assert!(a2.try_acquire(Demand::slot()).is_err()));
    inside_rx.recv().unwrap();
    // While it blocks: B's installs complete, and so do B's readers.
    let b2 = b.clone();
    completes("installs on B while a subscriber of A blocks", move || {
        reconfigure(&b2, INSTALLS);
        let _ = (b2.limits(), b2.stats(), b2.would_admit(&Demand::slot()));
    });
    // And A's own installs and readers too: the subscriber runs outside every operation.
    let a3 = a.clone();
    completes("installs on A while a subscriber of A blocks", move || {
        reconfigure(&a3, INSTALLS);
        let _ = (a3.limits(), a3.stats(), a3.would_admit(&Demand::slot()));
    });
    go_tx.send(()).unwrap();
    refused.join().unwrap();
    assert_eq!(b.limits().revision, INSTALLS as u64);
    drop((sub, held));
}

#[test]
fn a_panicking_subscriber_holds_back_no_install() {
    let b = one_slot_class();
    let held = b.try_acquire(Demand::slot()).unwrap();
    let sub = b.subscribe(|e| {
        if refusal(e) {
            panic!("a subscriber that panics");
        }
    });
    for _ in 0..3 {
        assert!(b.try_acquire(Demand::slot()).is_err());
    }
    let b2 = b.clone();
    completes("installs after panicking subscribers", move || {
        reconfigure(&b2, INSTALLS)
    });
    assert_eq!(b.stats().subscriber_panics, 3);
    drop((sub, held));
    let s = b.stats();
    assert_eq!((s.in_flight, s.limits.revision), (0, INSTALLS as u64));
}

#[test]
fn readers_do_not_wait_for_an_install_held_in_its_grace_period() {
    // A class release stopped before its CAS holds an operation open across a whole tag
    // period: the install that would complete the period waits for it (the grace period), and
    // meanwhile `limits()`, `stats()` and `would_admit()` answer at once.
    let b = one_slot_class();
    let a = b.try_acquire(Demand::slot()).unwrap();
    let (at_tx, at_rx) = mpsc::channel::<()>();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let releaser = thread::spawn(move || {
        let mut first = Some((at_tx, go_rx));
        set_pause_hook(move |p| {
            if p == PausePoint::ClassCas {
                if let Some((at, go)) = first.take() {
                    at.send(()).unwrap();
                    go.recv().unwrap();
                }
            }
        });
        drop(a);
        clear_pause_hook();
    });
    at_rx.recv().unwrap();
    let (installer, wait_rx) = reporting_installer(&b, PAST_A_PERIOD);
    assert_eq!(
        wait_rx.recv().unwrap(),
        "waiting",
        "the install completed a tag period over a stopped operation"
    );
    let b3 = b.clone();
    let revision = completes("readers while an install waits", move || {
        let _ = (b3.stats(), b3.would_admit(&Demand::slot()));
        b3.limits().revision
    });
    // Every install before the one that waits has been published.
    assert!(
        (3..PAST_A_PERIOD as u64).contains(&revision),
        "revision {revision}"
    );
    go_tx.send(()).unwrap();
    releaser.join().unwrap();
    installer.join().unwrap();
    assert_eq!(b.stats().in_flight, 0);
}
