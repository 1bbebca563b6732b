//! Deterministic regressions for ABA on the limits tags (issue 11): an operation is stopped
//! between the read its decision depends on and the CAS that commits it (the `testing`
//! feature's pause hook, no debugger, no sleep), while another thread installs exactly as many
//! snapshots as it takes for the tag to come back to the value the stopped operation read.
//!
//! Before the grace period, the installs completed and the stopped CAS then succeeded against a
//! word that was bit-identical again, with limits (or floors) that were no longer current: the
//! class case over-admitted (`in_flight 5` with `max_concurrent 4`), the no-class case admitted
//! under revision 0 after `apply_limits` had installed `max_concurrent 1`. Now `apply_limits`
//! waits, before it returns, for every operation that may still hold the previous tag, so the
//! installer reports that it is waiting on the stopped thread and cannot get further; the test
//! then lets the stopped thread go, its CAS fails (the tag moved by one) and it decides again
//! under the current limits.
//!
//! Each test is written so that both outcomes are deterministic: the control thread waits for
//! whichever comes first of "the installer finished" (the bug: then the stale CAS is resumed
//! and the invariants are checked, and fail) and "the installer waits in the grace period" (the
//! fix).
#![cfg(feature = "testing")]

use llm_bulkhead::testing::{clear_pause_hook, set_pause_hook, PausePoint};
use llm_bulkhead::{Bulkhead, ClassLimits, Demand, LimitsSnapshot};
use std::sync::mpsc;
use std::thread;

/// What the installer thread reports.
#[derive(Debug, PartialEq, Eq)]
enum Installer {
    /// It reached the grace period of its first install (the fix).
    InGrace,
    /// It installed every snapshot without waiting (the bug).
    Done,
}

/// Runs `stopped` on a thread that is held at its first `point` until the installer has either
/// finished `installs` or reported the grace period; returns what `stopped` returned and what
/// the installer reported first.
fn race<T: Send + 'static>(
    b: &Bulkhead,
    point: PausePoint,
    stopped: impl FnOnce(&Bulkhead) -> T + Send + 'static,
    installs: Vec<LimitsSnapshot>,
) -> (T, Installer) {
    let (at_point_tx, at_point_rx) = mpsc::channel::<()>();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let b1 = b.clone();
    let stopped = thread::spawn(move || {
        let mut first = Some((at_point_tx, go_rx));
        set_pause_hook(move |p| {
            if p == point {
                if let Some((at, go)) = first.take() {
                    at.send(()).unwrap();
                    go.recv().unwrap();
                }
            }
        });
        let out = stopped(&b1);
        clear_pause_hook();
        out
    });
    at_point_rx
        .recv()
        .expect("the stopped operation reaches its pause point");

    let (report_tx, report_rx) = mpsc::channel::<Installer>();
    let b2 = b.clone();
    let installer = thread::spawn(move || {
        let tx = report_tx.clone();
        let mut told = false;
        set_pause_hook(move |p| {
            if p == PausePoint::GracePeriod && !told {
                told = true;
                let _ = tx.send(Installer::InGrace);
            }
        });
        for s in installs {
            b2.apply_limits(s).unwrap();
        }
        clear_pause_hook();
        let _ = report_tx.send(Installer::Done);
    });
    let first = report_rx.recv().unwrap();
    go_tx.send(()).unwrap();
    let out = stopped.join().unwrap();
    installer.join().unwrap();
    (out, first)
}

/// Admits as many `demand`s as the bulkhead lets through, and returns them.
fn fill(b: &Bulkhead, demand: Demand) -> Vec<llm_bulkhead::Admission> {
    let mut held = Vec::new();
    while let Ok(a) = b.try_acquire(demand) {
        held.push(a);
        assert!(held.len() <= 64, "no bulkhead here has 64 slots");
    }
    held
}

#[test]
fn a_class_release_stopped_across_four_installs_keeps_u_exact() {
    // Class a has no floor, then a floor of 2 from revision 1 on; the fourth install lands on
    // the ring slot (and the 2-bit class tag) the stopped release read.
    let b = Bulkhead::builder()
        .max_concurrent(4)
        .class("a", ClassLimits::default())
        .class("b", ClassLimits::default())
        .default_class("b")
        .build()
        .unwrap();
    let (a, cb) = (b.class_id("a").unwrap(), b.class_id("b").unwrap());
    let held = b.try_acquire(Demand::slot().in_class(a)).unwrap();
    let floor2 = ClassLimits {
        protected_concurrent: 2,
        ..ClassLimits::default()
    };
    let installs: Vec<LimitsSnapshot> = (1..=4)
        .map(|rev| b.limits().with_revision(rev).with_class(a, floor2))
        .collect();
    let ((), first) = race(&b, PausePoint::ClassCas, move |_| drop(held), installs);

    // U must be exact again: the floor of a (2) plus what b may borrow (2), no more.
    let in_b = fill(&b, Demand::slot().in_class(cb));
    let in_a = fill(&b, Demand::slot().in_class(a));
    assert_eq!((in_a.len(), in_b.len()), (2, 2));
    let s = b.stats();
    assert!(
        s.in_flight <= 4,
        "in_flight {} with max_concurrent 4",
        s.in_flight
    );
    drop((in_a, in_b));
    let s = b.stats();
    assert_eq!((s.in_flight, s.admissions_in_flight), (0, 0));
    assert_eq!(
        first,
        Installer::InGrace,
        "apply_limits waited for the stopped release"
    );
}

#[test]
fn a_decision_stopped_across_a_whole_tag_period_fails_its_cas() {
    // 2^14 installs bring the 14-bit tag of the no-class word back to 0; the last one leaves
    // max_concurrent at 1.
    let b = Bulkhead::new(2).unwrap();
    let held = b.try_acquire(Demand::slot()).unwrap();
    let period = 1u64 << 14;
    let installs: Vec<LimitsSnapshot> = (1..=period)
        .map(|rev| {
            b.limits()
                .with_revision(rev)
                .with_max_concurrent(if rev % 2 == 0 { 1 } else { 2 })
        })
        .collect();
    let (out, first) = race(
        &b,
        PausePoint::DecisionCas,
        |b| b.try_acquire(Demand::slot()).map(|a| a.revision()),
        installs,
    );
    assert_eq!(b.limits().max_concurrent, 1);
    match out {
        Ok(revision) => assert_ne!(revision, 0, "admitted under a superseded snapshot"),
        Err(r) => assert_eq!(r.reason, llm_bulkhead::RejectReason::ConcurrencyLimit),
    }
    assert_eq!(b.stats().in_flight, 1, "one held against a limit of 1");
    drop(held);
    assert_eq!(
        first,
        Installer::InGrace,
        "apply_limits waited for the stopped decision"
    );
}
