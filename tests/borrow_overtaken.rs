//! A borrower overtaken by an install between its reservation on the shared word and its
//! step on its class word (`src/protocol/classed/moved.rs`, "A borrower's step"), made
//! deterministic with the pause hooks (feature `testing`).
//!
//! The borrower's reservation was checked under the limits of its tag. An install then
//! raises another class's floor, so the stored `U` passes `max_concurrent`, and a protected
//! demand of that class takes the collect-checked path: its collect does not see the
//! borrower, whose step is not in its class word yet, and it is admitted. Before the borrower
//! read the tag again after its class CAS, its step landed too, and the bulkhead held three
//! admissions under `max_concurrent` 2. Now the step, found overtaken, is decided under the
//! current limits, which refuse it, and is taken back.
//!
//! `.ci/run` requires the token borrower's test to fail with
//! `LLM_BULKHEAD_BORROW_UNVALIDATED=1`, which admits an overtaken borrower's step without
//! deciding it again, and with `LLM_BULKHEAD_NO_EPOCH_FLIP=1`, whose install leaves the class
//! words' `EPOCH` alone, so that the borrower, stepping after the install, passes for one
//! that stepped before it (`src/protocol/classed/moved.rs`, "A borrower's step"). The slot
//! borrower is reserved whole: its admission stands from its reservation, and what counts it
//! for `y` is the stored word's excess over `y`'s collect, so its test fails with
//! `LLM_BULKHEAD_EXACT_IGNORES_STORED=1`, which `.ci/run` requires.
//!
//! The last test needs no install: a borrower in flight while a usage report grows the tokens
//! held past the budget, and the collect-checked path's exact check, which now counts what
//! the stored word holds beyond its collect. `.ci/run` requires it to fail with
//! `LLM_BULKHEAD_EXACT_IGNORES_STORED=1`, which decides on the collect alone.
//!
//! The last two tests are the same race with a borrower whose tokens lie inside its class's
//! token floor, in part (it straddles the floor) or in whole (it borrows only a slot): that
//! part is reserved by no one, so neither the collect nor the stored word's excess shows it.
//! `.ci/run` requires both to fail with `LLM_BULKHEAD_BORROW_FLOOR_UNVALIDATED=1`, which skips
//! the protected step's check the borrower now makes of that part.
#![cfg(feature = "testing")]

use llm_bulkhead::testing::{clear_pause_hook, set_pause_hook, PausePoint};
use llm_bulkhead::{Admission, Bulkhead, ClassLimits, Demand, Rejection, Reservation, Usage};
use std::sync::mpsc::channel;
use std::thread;

/// Runs `decide` on a thread stopped at its first `BorrowReserved` (its reservation made, its
/// class step not taken); returns once it is stopped, with a sender that resumes it and its
/// handle.
fn stopped_borrower(
    decide: impl FnOnce() -> Result<Admission, Rejection> + Send + 'static,
) -> (
    std::sync::mpsc::Sender<()>,
    thread::JoinHandle<Result<Admission, Rejection>>,
) {
    let (stopped_tx, stopped) = channel();
    let (go_tx, go) = channel::<()>();
    let t = thread::spawn(move || {
        let mut first = true;
        set_pause_hook(move |p| {
            if p == PausePoint::BorrowReserved && std::mem::take(&mut first) {
                stopped_tx.send(()).unwrap();
                go.recv().unwrap();
            }
        });
        let out = decide();
        clear_pause_hook();
        out
    });
    stopped.recv().unwrap();
    (go_tx, t)
}

/// Two slots, classes `a` and `b` without floors (`c` too, for the second test, with the
/// floor `c_floor`); `b` holds one slot (borrowed).
fn bulkhead(c_floor: ClassLimits) -> (Bulkhead, Admission) {
    let b = Bulkhead::builder()
        .max_concurrent(2)
        .token_budget(100)
        .class("a", ClassLimits::default())
        .class("b", ClassLimits::default())
        .class("c", c_floor)
        .default_class("b")
        .build()
        .unwrap();
    let held = b.try_acquire(Demand::slot()).expect("b borrows a slot");
    (b, held)
}

/// Gives `a` a floor of one slot: the stored `U` passes `max_concurrent`.
fn raise_a_floor(b: &Bulkhead) {
    let a = b.class_id("a").unwrap();
    let floor = ClassLimits {
        protected_concurrent: 1,
        ..ClassLimits::default()
    };
    b.apply_limits(b.limits().with_revision(1).with_class(a, floor))
        .unwrap();
}

/// The race: `x` (demand `d`) stops after its reservation, `a`'s floor is raised, `y` (class
/// `a`, a slot) decides, `x` resumes; then [`at_most_two`].
fn overtaken(b: &Bulkhead, held: Admission, d: Demand) {
    let bx = b.clone();
    let (go, x) = stopped_borrower(move || bx.try_acquire(d));
    raise_a_floor(b);
    let a = b.class_id("a").unwrap();
    let y = b.try_acquire(Demand::slot().in_class(a));
    go.send(()).unwrap();
    let x = x.join().unwrap();
    at_most_two(b, held, x, y);
}

/// With `held`, `x` and `y`, at most two admissions are held (and counted), and none is left
/// once they are released.
fn at_most_two(
    b: &Bulkhead,
    held: Admission,
    x: Result<Admission, Rejection>,
    y: Result<Admission, Rejection>,
) {
    let admitted = 1 + u32::from(x.is_ok()) + u32::from(y.is_ok());
    assert!(
        admitted <= 2,
        "{admitted} admissions under max_concurrent 2 (x: {:?}, y: {:?})",
        x.as_ref().map(Admission::revision),
        y.as_ref().map(Admission::revision),
    );
    assert_eq!(b.stats().in_flight, u64::from(admitted));
    drop((x, y, held));
    assert_eq!(b.stats().in_flight, 0, "everything released");
}

/// `x` (class `b`) borrows the second slot and stops after its reservation; `a`'s floor is
/// raised; `y` (class `a`, inside its new floor) decides on the collect-checked path; `x`
/// resumes. At most two admissions may be held. `x` is reserved whole, so it stands from its
/// reservation (`src/protocol/classed/moved.rs`, "A borrower's step"), and `y`'s exact check
/// counts it in the stored word's excess over its collect: `y` is refused.
#[test]
fn a_slot_borrower_overtaken_by_a_floor_raise_is_counted() {
    let (b, held) = bulkhead(ClassLimits::default());
    overtaken(&b, held, Demand::slot());
}

/// The same race for a borrower of tokens only: `x` (class `c`, inside `c`'s floor of one
/// slot, with 50 tokens above its floor of none) reserves only tokens, and its slot is one
/// that `U` counted in `c`'s floor. Once `a`'s floor is raised too, `y` (class `a`) and `x`
/// cannot both have a slot.
#[test]
fn a_token_borrower_overtaken_by_a_floor_raise_is_decided_again() {
    let c_floor = ClassLimits {
        protected_concurrent: 1,
        ..ClassLimits::default()
    };
    let (b, held) = bulkhead(c_floor);
    let c = b.class_id("c").unwrap();
    overtaken(
        &b,
        held,
        Demand::tokens(Reservation::new(0, 50).unwrap()).in_class(c),
    );
}

/// No install at all: a borrower of tokens is in flight (its 20 tokens reserved on the shared
/// word, its class step not taken) when a usage report grows another admission's hold past
/// the budget, so a demand inside `p`'s token floor takes the collect-checked path. Its
/// collect does not show the borrower's tokens; decided on the collect alone, it was admitted
/// (`T = 60 + 40 ≤ 100`), the borrower's step landed, and admissions held 120 tokens under a
/// budget of 100 (the 30 of growth aside, 90 of which 40 were admitted past it). The exact
/// check now adds what the stored word holds beyond the collect's own accounting (20 here).
#[test]
fn a_token_borrower_in_flight_while_usage_grows_is_counted() {
    let b = growth_bulkhead(ClassLimits::default());
    let p = b.class_id("p").unwrap();
    against_growth(&b, (30, 60), tokens(20), tokens(40).in_class(p));
}

/// A budget of 100 tokens and eight slots; classes `p` (a token floor of 50), `q` (limits
/// `q_limits`) and `g` (the default, no floors).
fn growth_bulkhead(q_limits: ClassLimits) -> Bulkhead {
    Bulkhead::builder()
        .max_concurrent(8)
        .token_budget(100)
        .class(
            "p",
            ClassLimits {
                protected_tokens: 50,
                ..ClassLimits::default()
            },
        )
        .class("q", q_limits)
        .class("g", ClassLimits::default())
        .default_class("g")
        .build()
        .unwrap()
}

/// `r` tokens, no input.
fn tokens(r: u64) -> Demand {
    Demand::tokens(Reservation::new(0, r).unwrap())
}

/// `borrower` stopped in flight (its reservation made, its class step not taken) while a
/// usage report grows an admission of the default class from `from` to `to` tokens, past the
/// budget of 100, and then `inside`, a demand inside `p`'s token floor, which the stored `V`
/// sends to the collect-checked path: never both admitted, and nothing held at the end.
fn against_growth(b: &Bulkhead, (from, to): (u64, u64), borrower: Demand, inside: Demand) {
    let mut grows = b
        .try_acquire(tokens(from))
        .expect("the default class borrows");
    let bx = b.clone();
    let (go, x) = stopped_borrower(move || bx.try_acquire(borrower));
    assert_eq!(grows.report_usage(Usage::new(0, to)).unwrap().held, to);
    let y = b.try_acquire(inside);
    go.send(()).unwrap();
    let x = x.join().unwrap();
    assert!(
        !(x.is_ok() && y.is_ok()),
        "both admitted, with {to} tokens held already, under a budget of 100"
    );
    drop((x, y, grows));
    let s = b.stats();
    assert_eq!(
        (s.in_flight, s.token_budget.unwrap().in_flight_tokens),
        (0, 0),
        "everything released"
    );
}

/// A borrower whose tokens lie (partly) inside its class's token floor: that part is in the
/// stored `V` as the floor, reserved by no one, so a collect that misses the borrower's step
/// misses it too. A usage report grows another hold past the budget while the borrower is in
/// flight, and a demand of 45 tokens inside `p`'s token floor takes the collect-checked path:
/// decided on the collect and the stored word's excess (the tokens the borrower borrowed),
/// it was admitted, and the borrower's step landed. The borrower now validates its in-floor
/// part as a protected step does, with the load after its class CAS (`moved`, "A borrower's
/// step"); `.ci/run` requires both tests to fail with `LLM_BULKHEAD_BORROW_FLOOR_UNVALIDATED=1`.
///
/// `q_floor` is `q`'s class limits; the borrower asks for `r` tokens in `q` with nothing held.
fn borrower_inside_its_token_floor(q_floor: ClassLimits, r: u64) {
    let b = growth_bulkhead(q_floor);
    let (p, q) = (b.class_id("p").unwrap(), b.class_id("q").unwrap());
    against_growth(&b, (10, 40), tokens(r).in_class(q), tokens(45).in_class(p));
}

/// The borrower straddles its floor (`q`: a token floor of 20, a demand of 25): it borrows
/// 5 tokens, reserved on the shared word, and the other 20 are inside the floor. Before the
/// fix, 110 tokens were held under a budget of 100 (`40 + 25 + 45` at the decision).
#[test]
fn a_borrower_straddling_its_token_floor_in_flight_is_counted() {
    let q_floor = ClassLimits {
        protected_tokens: 20,
        ..ClassLimits::default()
    };
    borrower_inside_its_token_floor(q_floor, 25);
}

/// The borrower borrows a slot (`q` has no concurrency floor) and its 20 tokens are all
/// inside its token floor of 20: nothing of its tokens is reserved on the shared word.
#[test]
fn a_slot_borrower_with_its_tokens_inside_its_floor_in_flight_is_counted() {
    let q_floor = ClassLimits {
        protected_tokens: 20,
        ..ClassLimits::default()
    };
    borrower_inside_its_token_floor(q_floor, 20);
}
