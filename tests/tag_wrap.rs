//! Deterministic regressions for ABA on the limits tags (issue 11): an operation is stopped
//! between the read its decision depends on and the CAS that commits it (the `testing`
//! feature's pause hook, no debugger, no sleep), while another thread installs exactly as many
//! snapshots as it takes for the tag to come back to the value the stopped operation read.
//!
//! Before the grace period, the installs completed and the stopped CAS then succeeded against a
//! word that was bit-identical again, with limits (or floors) that were no longer current: the
//! class case over-admitted (`in_flight 5` with `max_concurrent 4`), the no-class case admitted
//! under revision 0 after `apply_limits` had installed `max_concurrent 1`. Now the install that
//! would complete the tag period waits, before it bumps the tag, for every operation of its
//! bulkhead that may still hold a tag that old, so the installer reports that it is waiting on
//! the stopped thread and cannot get further; the test
//! then lets the stopped thread go, its CAS fails (the tag moved by one) and it decides again
//! under the current limits.
//!
//! Each test is written so that both outcomes are deterministic: the control thread waits for
//! whichever comes first of "the installer finished" (then the stale CAS is resumed and the
//! invariants are checked) and "the installer waits in the grace period". The tests that need
//! the wait also run its broken variant, in which the installer thread skips it
//! (`testing::skip_grace_period_on_this_thread`), and check that the invariant then fails
//! exactly as the bug would make it fail: each regression is shown to catch what it guards.
//!
//! A class tag is the class's version mod the limits tag's period (`src/grace.rs`, "Class
//! versions"), so four changes of a class's limits (which brought a 2-bit class tag back)
//! wait for nothing and leave the stopped release exact, and only a whole period of them
//! waits. `.ci/run` also runs the four-change regressions with
//! `LLM_BULKHEAD_NARROW_CLASS_VERSION=1` (a class tag mod 4 again, with no wait of its own)
//! and requires them to fail.
//!
//! A class release takes one of two paths. A protected admission's release reads its class
//! word and the floors of its tag, then CASes (the window is before the CAS,
//! `PausePoint::ClassCas`). A borrowed admission's release returns its slot with one
//! `fetch_sub` and reads the floors of the replaced word's tag afterwards (the window is after
//! the `fetch_sub`, `PausePoint::ClassReturned`): stopped before its `fetch_sub` it would find
//! the class word already migrated and compute a correct decrease, with or without the grace
//! period, so that regression stops it after.
#![cfg(feature = "testing")]

use llm_bulkhead::testing::{
    clear_pause_hook, set_pause_hook, skip_grace_period_on_this_thread, PausePoint,
};
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
    race_with(b, point, stopped, installs, None)
}

/// [`race`]; with `broken` (a per-thread switch of `llm_bulkhead::testing`), the installer's
/// `apply_limits` run that broken variant (no grace-period wait), and it
/// reports only when it has finished.
fn race_with<T: Send + 'static>(
    b: &Bulkhead,
    point: PausePoint,
    stopped: impl FnOnce(&Bulkhead) -> T + Send + 'static,
    installs: Vec<LimitsSnapshot>,
    broken: Option<fn(bool)>,
) -> (T, Installer) {
    let skip_grace = broken.is_some();
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
            if p == PausePoint::GracePeriod && !told && !skip_grace {
                told = true;
                let _ = tx.send(Installer::InGrace);
            }
        });
        if let Some(switch) = broken {
            switch(true);
        }
        for s in installs {
            b2.apply_limits(s).unwrap();
        }
        if let Some(switch) = broken {
            switch(false);
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

/// Two classes `a` (floor `a_floor`) and `b` (the default, no floor) on 4 slots.
fn two_classes(a_floor: u32) -> (Bulkhead, llm_bulkhead::ClassId, llm_bulkhead::ClassId) {
    let b = Bulkhead::builder()
        .max_concurrent(4)
        .class(
            "a",
            ClassLimits {
                protected_concurrent: a_floor,
                ..ClassLimits::default()
            },
        )
        .class("b", ClassLimits::default())
        .default_class("b")
        .build()
        .unwrap();
    let (a, cb) = (b.class_id("a").unwrap(), b.class_id("b").unwrap());
    (b, a, cb)
}

/// Revisions 1 to `n`, each a change of class `a`'s limits: its floor goes to `a_floor` and a
/// ceiling of 4 (harmless on 4 slots) comes and goes. A class tag is the class's version (one
/// per change of its limits) mod the limits tag's period, `2^14`: `n = 4` moves `a`'s class
/// tag four times (the period it had when it was 2 bits wide), `n = 2^14` brings it back to
/// the value of revision 0 and rewrites the floors entry it named.
fn class_changes(
    b: &Bulkhead,
    a: llm_bulkhead::ClassId,
    a_floor: u32,
    n: u64,
) -> Vec<LimitsSnapshot> {
    (1..=n)
        .map(|rev| {
            let limits = ClassLimits {
                protected_concurrent: a_floor,
                max_concurrent: (rev % 2 == 0).then_some(4),
                ..ClassLimits::default()
            };
            b.limits().with_revision(rev).with_class(a, limits)
        })
        .collect()
}

/// After the race, how many slots classes `a` and `b` can take (`b` first), every admission
/// released again, and the global invariants checked.
fn capacity_after(
    b: &Bulkhead,
    a: llm_bulkhead::ClassId,
    cb: llm_bulkhead::ClassId,
) -> (usize, usize) {
    let in_b = fill(b, Demand::slot().in_class(cb));
    let in_a = fill(b, Demand::slot().in_class(a));
    let s = b.stats();
    assert!(
        s.in_flight <= 4,
        "in_flight {} with max_concurrent 4",
        s.in_flight
    );
    let out = (in_a.len(), in_b.len());
    drop((in_a, in_b));
    let s = b.stats();
    assert_eq!((s.in_flight, s.admissions_in_flight), (0, 0));
    out
}

/// A release of class `a` raced against `n` changes of `a`'s limits: an admission of `a` (floor
/// `floor_before`) is released on a thread stopped at `point` while the installs move `a`'s
/// floor to `floor_after`. `waits`: whether the installer must report that it waits for the
/// stopped release (it must finish first otherwise). With `broken` (no grace-period wait), it
/// must finish first. Afterwards `a` and `b` must be able to take exactly `capacity` slots.
fn assert_release_race(
    (floor_before, floor_after): (u32, u32),
    point: PausePoint,
    (n, waits): (u64, bool),
    broken: Option<fn(bool)>,
    capacity: (usize, usize),
) {
    let (b, a, cb) = two_classes(floor_before);
    let held = b.try_acquire(Demand::slot().in_class(a)).unwrap();
    assert_eq!(held.resources().borrowed_concurrency, floor_before == 0);
    let installs = class_changes(&b, a, floor_after, n);
    let ((), first) = race_with(&b, point, move |_| drop(held), installs, broken);
    let expected = if waits && broken.is_none() {
        Installer::InGrace
    } else {
        Installer::Done
    };
    assert_eq!(
        first, expected,
        "apply_limits waited for the stopped release iff its class tag came back"
    );
    assert_eq!(
        capacity_after(&b, a, cb),
        capacity,
        "(slots a, slots b) after the race"
    );
}

/// A protected admission of `a` (floor 1) released while the floor goes to 0: the release reads
/// its class word and the floors of its tag, and is stopped before its CAS.
const PROTECTED: ((u32, u32), PausePoint) = ((1, 0), PausePoint::ClassCas);

/// A borrowed admission of `a` (no floor yet) released while the floor goes to 2: its
/// `fetch_sub` has returned the slot, and it is stopped before it reads the floors of the
/// replaced word's tag.
const BORROWED: ((u32, u32), PausePoint) = ((0, 2), PausePoint::ClassReturned);

/// Four changes of a class's limits (its old tag period): nobody waits.
const FOUR: (u64, bool) = (4, false);
/// A whole tag period of changes: the last one waits for the stopped release.
const PERIOD: (u64, bool) = (1 << 14, true);

/// The broken variant: no grace-period wait.
const NO_GRACE: Option<fn(bool)> = Some(skip_grace_period_on_this_thread);

// The first two are the regressions `.ci/run` runs with `LLM_BULKHEAD_NARROW_CLASS_VERSION=1`
// (a class tag mod 4 again, without a wait of its own) and requires to fail: the protected
// release's stale CAS then succeeds on the bit-identical word and subtracts nothing for a
// slot the new floor of 0 makes borrowed (b takes 3), and the borrowed release reads the
// floors of revision 4 (a floor of 2) for a word accounted under revision 0 and subtracts
// nothing for the slot it borrowed (b borrows 1).

#[test]
fn a_protected_class_release_stopped_across_four_class_changes_is_not_waited_for() {
    // With no floor left, U must be exact again: b takes all 4 slots.
    assert_release_race(PROTECTED.0, PROTECTED.1, FOUR, None, (0, 4));
}

#[test]
fn a_borrowed_class_release_stopped_across_four_class_changes_is_not_waited_for() {
    // U exact again: the floor of a (2) plus what b may borrow (2), no more.
    assert_release_race(BORROWED.0, BORROWED.1, FOUR, None, (2, 2));
}

#[test]
fn a_protected_class_release_stopped_across_a_whole_tag_period_keeps_u_exact() {
    assert_release_race(PROTECTED.0, PROTECTED.1, PERIOD, None, (0, 4));
}

#[test]
fn a_borrowed_class_release_stopped_across_a_whole_tag_period_keeps_u_exact() {
    assert_release_race(BORROWED.0, BORROWED.1, PERIOD, None, (2, 2));
}

#[test]
fn without_the_grace_period_a_protected_class_release_leaves_u_too_high() {
    // The broken variant: the stale CAS succeeds on the bit-identical word and subtracts
    // nothing (the slot was inside the old floor of 1), though under the new floor of 0 it was
    // borrowed: U stays one too high and b can take only 3 slots.
    assert_release_race(PROTECTED.0, PROTECTED.1, PERIOD, NO_GRACE, (0, 3));
}

#[test]
fn without_the_grace_period_a_borrowed_class_release_leaves_u_too_high() {
    // The broken variant: the release reads the floors of revision 2^14 (a floor of 2) for a
    // word accounted under revision 0 (no floor) and subtracts nothing for the slot it
    // borrowed: U stays one too high and b can borrow only 1 slot.
    assert_release_race(BORROWED.0, BORROWED.1, PERIOD, NO_GRACE, (2, 1));
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

/// Eight installs on a classed bulkhead that change no class's limits: `max_concurrent`
/// alternates 3 and 4 (ending at `last`). A class's tag is its version, which only a change of
/// its own limits moves, so these leave every class word alone and wrap no tag.
fn eight_global_installs(b: &Bulkhead, last: u32) -> Vec<LimitsSnapshot> {
    (1..=8)
        .map(|rev| {
            let mc = if rev == 8 { last } else { 3 + (rev % 2) as u32 };
            b.limits().with_revision(rev).with_max_concurrent(mc)
        })
        .collect()
}

/// A class release stopped at `point` (floor `floor` for `a`) while eight installs that change
/// no class's limits complete: the installs do not wait for it (no class tag comes back), and
/// afterwards `a` and `b` can take exactly `capacity` slots.
fn assert_release_not_waited(floor: u32, point: PausePoint, capacity: (usize, usize)) {
    let (b, a, cb) = two_classes(floor);
    let held = b.try_acquire(Demand::slot().in_class(a)).unwrap();
    assert_eq!(held.resources().borrowed_concurrency, floor == 0);
    let installs = eight_global_installs(&b, 4);
    let ((), first) = race(&b, point, move |_| drop(held), installs);
    assert_eq!(
        first,
        Installer::Done,
        "apply_limits waited for a class operation though no class tag came back"
    );
    assert_eq!(capacity_after(&b, a, cb), capacity);
}

#[test]
fn installs_that_change_no_class_limits_do_not_wait_for_a_stopped_protected_release() {
    // a keeps its floor of 1: it takes 1, b borrows the other 3.
    assert_release_not_waited(1, PausePoint::ClassCas, (1, 3));
}

#[test]
fn installs_that_change_no_class_limits_do_not_wait_for_a_stopped_borrowed_release() {
    // No floor: b takes all 4.
    assert_release_not_waited(0, PausePoint::ClassReturned, (0, 4));
}

#[test]
fn installs_that_change_no_class_limits_do_not_wait_for_a_stopped_class_decision() {
    // One slot held by b; a's decision is stopped before its class CAS while eight installs
    // leave max_concurrent at 1: it must not admit a second slot under the old limits.
    let (b, a, cb) = two_classes(1);
    let held = b.try_acquire(Demand::slot().in_class(cb)).unwrap();
    let installs = eight_global_installs(&b, 1);
    let (out, first) = race(
        &b,
        PausePoint::ClassCas,
        move |b| {
            b.try_acquire(Demand::slot().in_class(a))
                .map(|x| x.revision())
        },
        installs,
    );
    assert_eq!(
        first,
        Installer::Done,
        "apply_limits waited for the decision"
    );
    assert_eq!(b.limits().max_concurrent, 1);
    match out {
        Ok(revision) => panic!("admitted under revision {revision} beyond max_concurrent 1"),
        Err(r) => assert_eq!(r.reason, llm_bulkhead::RejectReason::ConcurrencyLimit),
    }
    assert_eq!(b.stats().in_flight, 1);
    drop(held);
    assert_eq!(capacity_after(&b, a, cb), (1, 0));
}
