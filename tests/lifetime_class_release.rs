//! The class mode's last steps, with the state freed on another thread inside each of them,
//! deterministically on real threads: a class release held at `PausePoint::ClassReleaseGiven`
//! (it has left its operation and not yet returned) while the main thread drops the last
//! handle, which frees the state; a count-down of `alive` held at `PausePoint::CountedDown`
//! (its count given away, not yet returned) while the other thread reaches zero and frees, once
//! in the last handle's detach and once in a release; and a release held **inside** its
//! operation, after its class step and before its shared-word update, which the free must wait
//! for.
//!
//! What fails without the fix of the release's, the detach's and the count-down's arguments
//! (they took a `&Shared`, which must stay valid until the function returns) is **Miri only**:
//! under Stacked Borrows the free is a deallocation while that protected reference is alive
//! (`.ci/run` runs this file under Miri with `--features testing`). Natively nothing reads the
//! freed state, so no run of the old code would fail; natively these tests check that the free
//! does happen inside the window (`testing::live_states`), so the schedule they pin is the one
//! Miri needs to see. The last test fails natively on its broken variant
//! (`LLM_BULKHEAD_FREE_UNGUARDED=1`, the free that does not wait), which `.ci/run` requires.
//!
//! The tests of this file take turns (`SERIAL`): they read the process-wide `live_states`
//! count. Nothing here sleeps or times anything: the threads meet over channels inside the
//! pause hooks.
#![cfg(feature = "testing")]

use llm_bulkhead::testing::{clear_pause_hook, live_states, set_pause_hook, PausePoint};
use llm_bulkhead::{Admission, Bulkhead, ClassLimits, Demand};
use std::cell::Cell;
use std::rc::Rc;
use std::sync::{mpsc, Mutex};

static SERIAL: Mutex<()> = Mutex::new(());

/// A bulkhead of two global slots with the given classes (the first is the default).
fn build(classes: &[(&str, u32)]) -> Bulkhead {
    let mut b = Bulkhead::builder().max_concurrent(2);
    for &(name, floor) in classes {
        let limits = ClassLimits {
            protected_concurrent: floor,
            ..ClassLimits::default()
        };
        b = b.class(name, limits);
    }
    b.default_class(classes[0].0).build().unwrap()
}

/// Releases `admission` on a new thread, held at `ClassReleaseGiven` while this thread drops
/// `b`, the last handle: the drop must free the state there (the release's step let it go).
fn drop_the_last_handle_inside_the_release(b: Bulkhead, admission: Admission, base: u64) {
    let (go, releaser) = release_held_at(PausePoint::ClassReleaseGiven, admission);
    assert_eq!(
        live_states(),
        base + 1,
        "freed before the release let it go"
    );
    drop(b); // the last handle: every class word is empty, so this frees the state
    assert_eq!(
        live_states(),
        base,
        "the last handle frees the state while the release is still running"
    );
    go.send(()).unwrap();
    releaser.join().unwrap();
}

/// Releases `admission` on a new thread and returns once the release is held at `point`: the
/// sender that lets it go on, and the thread.
fn release_held_at(
    point: PausePoint,
    admission: Admission,
) -> (mpsc::Sender<()>, std::thread::JoinHandle<()>) {
    let (at_point, reached) = mpsc::channel();
    let (go, resume) = mpsc::channel::<()>();
    let releaser = std::thread::spawn(move || {
        set_pause_hook(move |p| {
            if p == point {
                at_point.send(()).unwrap();
                resume.recv().unwrap();
            }
        });
        drop(admission);
        clear_pause_hook();
    });
    reached.recv().unwrap();
    (go, releaser)
}

/// A release with a shared-word decrease (a class with no floor: its slot was borrowed) makes
/// it inside its operation; the last handle frees the state right after the release left the
/// operation, before `release` returns.
#[test]
fn the_last_handle_frees_the_state_after_a_borrowed_release_leaves_its_operation() {
    release_of_a_slot_in(&[("open", 0)]);
}

/// A release inside its class's floor (nothing for the shared word, no queue flag) returns its
/// slot in one CAS; the last handle frees the state right after the release left its
/// operation, before `release` returns.
#[test]
fn the_last_handle_frees_the_state_after_a_protected_release_gives_its_slot_back() {
    release_of_a_slot_in(&[("protected", 1)]);
}

/// One slot admitted in the first of `classes` (name, floor), then
/// [`drop_the_last_handle_inside_the_release`].
fn release_of_a_slot_in(classes: &[(&str, u32)]) {
    let _turn = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let base = live_states();
    let b = build(classes);
    let admission = b.try_acquire(Demand::slot()).unwrap();
    drop_the_last_handle_inside_the_release(b, admission, base);
}

/// The last handle's detach gives its own count away while an admission still holds its class
/// word; held at `CountedDown` there, it lets the admission's release (on another thread)
/// empty the detached word, count down to zero and free the state, before `count_down` and
/// `detach` return.
#[test]
fn a_release_frees_the_state_while_the_last_handles_detach_is_counting_down() {
    let _turn = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let base = live_states();
    let b = build(&[("open", 0)]);
    let admission = b.try_acquire(Demand::slot()).unwrap();
    let (go, start) = mpsc::channel::<()>();
    let (released, done) = mpsc::channel();
    let releaser = std::thread::spawn(move || {
        start.recv().unwrap();
        drop(admission); // empties the detached class word and counts `alive` down to zero
        released.send(live_states()).unwrap();
    });
    // With one class, held by the admission, the detach counts down only its own count.
    let fired = Rc::new(Cell::new(0));
    let seen = Rc::new(Cell::new(None));
    let (f, s) = (fired.clone(), seen.clone());
    set_pause_hook(move |p| {
        if p == PausePoint::CountedDown {
            f.set(f.get() + 1);
            go.send(()).unwrap();
            s.set(Some(done.recv().unwrap()));
        }
    });
    drop(b); // the last handle
    clear_pause_hook();
    assert_eq!(fired.get(), 1, "the detach's own count-down, once");
    assert_eq!(
        seen.get(),
        Some(base),
        "the release frees the state while the detach is still counting down"
    );
    assert_eq!(live_states(), base);
    releaser.join().unwrap();
}

/// A release empties its class word after the last handle's detach set `DETACHED` on it but
/// before the detach counted itself down; held at `CountedDown` in the release's count-down,
/// it lets the detach finish, reach zero and free the state, before the release's
/// `count_down` returns.
#[test]
fn the_last_handle_frees_the_state_while_a_release_is_counting_down() {
    let _turn = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let base = live_states();
    // The admission holds the first class word; the detach counts the second (empty) one down
    // before its own count, and is held there while the release runs.
    let b = build(&[("held", 0), ("idle", 0)]);
    let admission = b.try_acquire(Demand::slot()).unwrap();
    let (go, start) = mpsc::channel::<()>();
    let (at_point, reached) = mpsc::channel();
    let (free, resume) = mpsc::channel::<()>();
    let releaser = std::thread::spawn(move || {
        set_pause_hook(move |p| {
            if p == PausePoint::CountedDown {
                at_point.send(()).unwrap();
                resume.recv().unwrap();
            }
        });
        start.recv().unwrap();
        drop(admission);
        clear_pause_hook();
    });
    let fired = Rc::new(Cell::new(0));
    let f = fired.clone();
    set_pause_hook(move |p| {
        if p == PausePoint::CountedDown {
            f.set(f.get() + 1);
            if f.get() == 1 {
                // The idle class's count is down; the held word is detached, our count left.
                go.send(()).unwrap();
                reached.recv().unwrap(); // the release gave its count away, not reaching zero
            }
        }
    });
    drop(b); // the last handle: its own count-down reaches zero and frees the state
    clear_pause_hook();
    assert_eq!(fired.get(), 1, "the idle class word's count-down, once");
    assert_eq!(
        live_states(),
        base,
        "the last handle frees the state while the release is still counting down"
    );
    free.send(()).unwrap();
    releaser.join().unwrap();
}

/// A borrowed release is held at `ClassReturned`: its slot is back in the class word (which is
/// now empty) and its shared-word decrease not yet made. The last handle's drop, on another
/// thread, decides to free the state, and must first wait for the release's operation: it
/// reaches `FreeWaits` with the state still allocated; the release, let go, finishes; only then
/// is the state freed. With the wait left out (`LLM_BULKHEAD_FREE_UNGUARDED=1`, the broken
/// variant `.ci/run` requires this test to fail on) the drop frees at once, which this test
/// reports before the release could touch the freed state.
#[test]
fn the_free_waits_for_a_release_inside_its_operation() {
    let _turn = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let base = live_states();
    let b = build(&[("open", 0)]);
    let admission = b.try_acquire(Demand::slot()).unwrap();
    assert!(admission.resources().borrowed_concurrency);
    let (go, releaser) = release_held_at(PausePoint::ClassReturned, admission);
    let (events, seen) = mpsc::channel();
    let waits = events.clone();
    let dropper = std::thread::spawn(move || {
        set_pause_hook(move |p| {
            if p == PausePoint::FreeWaits {
                waits.send("waits").unwrap();
            }
        });
        drop(b); // the last handle: the class word is empty, so this decides to free
        clear_pause_hook();
        events.send("freed").unwrap();
    });
    let first = seen.recv().unwrap();
    if first != "waits" {
        // Keep the release parked for good: resumed, it would update the freed shared word.
        std::mem::forget(go);
        panic!("the last handle freed the state while a release was inside its operation");
    }
    assert_eq!(live_states(), base + 1, "freed before the release left");
    go.send(()).unwrap();
    releaser.join().unwrap();
    assert_eq!(seen.recv().unwrap(), "freed");
    dropper.join().unwrap();
    assert_eq!(live_states(), base);
}
