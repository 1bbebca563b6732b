//! Conformance driver: runs one operation sequence through the real [`Bulkhead`] and the
//! sequential [`Model`] side by side and reports the first divergence.
//!
//! The property tests generate [`Op`] sequences with proptest; the fuzz target and its corpus
//! replay decode them from bytes with [`decode`]. Every step compares decisions (admitted or
//! the exact [`Rejection`](crate::Rejection)), the revision and reservation of each admission,
//! usage and release reports (ids aside), errors, and the full [`Stats`](crate::Stats). At the
//! end every remaining admission is released and both sides must be back at zero.
//!
//! ```
//! use llm_bulkhead::conformance::{run, Op, Setup};
//! let setup = Setup { max_concurrent: 1, max_queue: 0, budget: Some((1_000, 100)), initial_revision: 0, classes: vec![], default_class: 0, wait_for_tokens: false };
//! let ops = [
//!     Op::Acquire { input: 600, max_output: 300, high: false, class: 0 },
//!     Op::Acquire { input: 0, max_output: 0, high: true, class: 0 },
//!     Op::Report { pick: 0, input: 700, output: 400, reconcile: None },
//!     Op::Release { pick: 0, usage: None },
//! ];
//! run(&setup, &ops).unwrap();
//! ```

use crate::model::{Handle, Model, ModelError, WaitId, Waited};
use crate::{
    Admission, BudgetLimits, Bulkhead, ClassLimits, Demand, LimitsSnapshot, Priority, Reconcile,
    Reservation, Usage,
};
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

/// Initial configuration of a run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Setup {
    /// Global concurrency limit.
    pub max_concurrent: u32,
    /// Queue bound.
    pub max_queue: u32,
    /// `(budget, high_priority_reserve)`, or no budget.
    pub budget: Option<(u64, u64)>,
    /// Revision of the initial limits.
    pub initial_revision: u64,
    /// Admission classes, named `c0`, `c1`, … (empty: no classes).
    pub classes: Vec<ClassLimits>,
    /// The default class (modulo the number of classes).
    pub default_class: usize,
    /// Token waiting ([`BulkheadBuilder::wait_for_tokens`](crate::BulkheadBuilder::wait_for_tokens)).
    pub wait_for_tokens: bool,
}

/// One operation. `pick` selects a live admission by index modulo the number live (the
/// operation is skipped when none is live).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// `try_acquire` with a reservation `input + max_output` (ignored without a budget).
    Acquire {
        /// Estimated input tokens.
        input: u64,
        /// Output cap.
        max_output: u64,
        /// High priority.
        high: bool,
        /// The class (modulo the number of classes; ignored without classes).
        class: u8,
    },
    /// `try_acquire` of a slot only, in the default class.
    AcquireSlot,
    /// `abandon_borrowed_concurrency` on a live admission.
    Abandon {
        /// Which admission.
        pick: usize,
    },
    /// `report_usage` on a live admission.
    Report {
        /// Which admission.
        pick: usize,
        /// Cumulative input.
        input: u64,
        /// Cumulative output.
        output: u64,
        /// `(remaining_output, safety_margin)` for progressive reconciliation.
        reconcile: Option<(u64, u64)>,
    },
    /// `release` of a live admission.
    Release {
        /// Which admission.
        pick: usize,
        /// Final usage `(input, output)`.
        usage: Option<(u64, u64)>,
    },
    /// Drop a live admission without releasing it explicitly.
    Drop {
        /// Which admission.
        pick: usize,
    },
    /// `apply_limits` with `revision = current + step` (step 0 is stale).
    Apply {
        /// Added to the current revision.
        step: u64,
        /// New `max_concurrent`.
        max_concurrent: u32,
        /// New `max_queue`.
        max_queue: u32,
        /// New `(budget, reserve)`, or none (invalid when the bulkhead has a budget).
        budget: Option<(u64, u64)>,
        /// New class limits (the first as many as the bulkhead has classes), or the current ones.
        classes: Option<[ClassLimits; 3]>,
    },
    /// `set_budget`.
    SetBudget {
        /// The new budget.
        budget: u64,
    },
    /// `close`.
    Close,
    /// An async `acquire`, polled once; if it queues, it is polled again after every later
    /// operation.
    Wait {
        /// Input tokens of the reservation.
        input: u64,
        /// Output cap of the reservation.
        max_output: u64,
        /// High priority.
        high: bool,
        /// The class (modulo the number of classes; ignored without classes).
        class: u8,
    },
    /// Drop a queued `acquire` future.
    CancelWait {
        /// Which waiter.
        pick: usize,
    },
    /// Cancel a queued `acquire`'s [`CancelToken`](crate::CancelToken) and poll it: it leaves
    /// with `aborted` (the model's [`Model::leave_wait`]).
    AbortWait {
        /// Which waiter.
        pick: usize,
    },
    /// As [`Op::Wait`] with a zero timeout: if it queues, it times out at its next poll,
    /// after this operation (the model's [`Model::leave_wait`] with `timeout`).
    WaitExpiring {
        /// Input tokens of the reservation.
        input: u64,
        /// Output cap of the reservation.
        max_output: u64,
        /// High priority.
        high: bool,
        /// The class (modulo the number of classes; ignored without classes).
        class: u8,
    },
}

/// Where engine and model disagreed.
#[derive(Clone, Debug)]
pub struct Divergence {
    /// Index of the operation (`ops.len()` for the final release-all check).
    pub step: usize,
    /// What the engine did.
    pub engine: String,
    /// What the model did.
    pub model: String,
}

impl fmt::Display for Divergence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "step {}: engine {} but model {}",
            self.step, self.engine, self.model
        )
    }
}

impl std::error::Error for Divergence {}

fn same<T: fmt::Debug + PartialEq>(step: usize, engine: T, model: T) -> Result<(), Divergence> {
    if engine == model {
        Ok(())
    } else {
        Err(Divergence {
            step,
            engine: format!("{engine:?}"),
            model: format!("{model:?}"),
        })
    }
}

fn budget_limits(b: Option<(u64, u64)>) -> Option<BudgetLimits> {
    b.map(|(budget, high_priority_reserve)| BudgetLimits {
        budget,
        high_priority_reserve,
    })
}

/// Runs `ops` through engine and model.
///
/// # Errors
/// The first [`Divergence`]. A setup both sides refuse identically is a pass.
pub fn run(setup: &Setup, ops: &[Op]) -> Result<(), Divergence> {
    run_counting(setup, ops).map(drop)
}

/// [`run`], returning how many admissions bypassed queued waiters (in-floor newcomers,
/// [`Model::bypassed`]), so that a test can show its operation mix exercises the rule.
///
/// # Errors
/// As [`run`].
pub fn run_counting(setup: &Setup, ops: &[Op]) -> Result<u64, Divergence> {
    let mut table = crate::ClassTable::default();
    let names: Vec<String> = (0..setup.classes.len().min(crate::MAX_CLASSES))
        .map(|i| format!("c{i}"))
        .collect();
    let name_refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let default_class = if names.is_empty() {
        0
    } else {
        setup.default_class % names.len()
    };
    let mut builder = Bulkhead::builder()
        .max_concurrent(setup.max_concurrent)
        .max_queue(setup.max_queue)
        .initial_revision(setup.initial_revision)
        .wait_for_tokens(setup.wait_for_tokens);
    for (name, limits) in names.iter().zip(&setup.classes) {
        table.push(*limits);
        builder = builder.class(name.clone(), *limits);
    }
    if !names.is_empty() {
        builder = builder.default_class(names[default_class].clone());
    }
    if let Some((b, h)) = setup.budget {
        builder = builder.token_budget(b).high_priority_reserve(h);
    }
    let first = LimitsSnapshot {
        revision: setup.initial_revision,
        max_concurrent: setup.max_concurrent,
        max_queue: setup.max_queue,
        token_budget: budget_limits(setup.budget),
        classes: table,
    };
    let (engine, mut model) = match (
        builder.build(),
        Model::with_classes(first, &name_refs, default_class)
            .map(|m| m.with_token_waiting(setup.wait_for_tokens)),
    ) {
        (Ok(e), Ok(mut m)) => {
            m.class_owner = e.shared.class_owner;
            (e, m)
        }
        (Err(e), Err(m)) => return same(0, e, m).map(|()| 0),
        (e, m) => {
            return same(
                0,
                format!("{:?}", e.map(drop)),
                format!("{:?}", m.map(drop)),
            )
            .map(|()| 0)
        }
    };
    let mut live: Vec<(Admission, Handle)> = Vec::new();
    let mut waiting: Vec<Waiting<'_>> = Vec::new();
    for (step, op) in ops.iter().enumerate() {
        match *op {
            Op::Wait {
                input,
                max_output,
                high,
                class,
            }
            | Op::WaitExpiring {
                input,
                max_output,
                high,
                class,
            } => {
                let expiring = matches!(op, Op::WaitExpiring { .. });
                let Ok(r) = Reservation::new(input, max_output) else {
                    continue;
                };
                let d = in_class(
                    &engine,
                    Demand::tokens(r).with_priority(if high {
                        Priority::High
                    } else {
                        Priority::Normal
                    }),
                    class,
                );
                let token = crate::CancelToken::new();
                let options = crate::WaitOptions {
                    timeout: if expiring {
                        crate::QueueTimeout::After(std::time::Duration::ZERO)
                    } else {
                        crate::QueueTimeout::Default
                    },
                    cancel: Some(token.clone()),
                };
                let mut f = Box::pin(engine.acquire(d, options));
                match (poll_once(f.as_mut()), model.acquire_wait(d)) {
                    (Poll::Ready(Ok(a)), Ok(Waited::Admitted(h))) => {
                        admitted(step, a, h, &model, &mut live)?
                    }
                    (Poll::Ready(Err(e)), Err(m)) => same(step, e, m)?,
                    (Poll::Pending, Ok(Waited::Queued(id))) => waiting.push(Waiting {
                        future: f,
                        id,
                        token,
                        expiring,
                    }),
                    (e, m) => same(
                        step,
                        format!("{:?}", e.map(|r| r.map(|a| a.revision()))),
                        format!("{m:?}"),
                    )?,
                }
            }
            Op::CancelWait { pick: p } => {
                if !waiting.is_empty() {
                    let w = waiting.swap_remove(p % waiting.len());
                    drop(w.future);
                    model.cancel_wait(w.id);
                }
            }
            Op::AbortWait { pick: p } => {
                if !waiting.is_empty() {
                    let mut w = waiting.remove(p % waiting.len());
                    w.token.cancel();
                    let e = poll_once(w.future.as_mut());
                    let m = model.leave_wait(w.id, crate::RejectReason::Aborted);
                    finished(step, e, m, &mut model, &mut live)?;
                }
            }
            op => apply_op(step, op, &engine, &mut model, &mut live)?,
        }
        poll_waiting(step, &mut model, &mut live, &mut waiting)?;
        same(step, comparable(engine.stats()), model.stats())?;
    }
    let end = ops.len();
    let bypassed = model.bypassed();
    for w in waiting.drain(..) {
        drop(w.future);
        model.cancel_wait(w.id);
    }
    for (a, h) in live.drain(..) {
        let e = a.release(None).map_err(|e| e.error);
        let m = model.release(h, None);
        match (e, m) {
            (Ok(e), Ok(m)) => same(
                end,
                crate::ReleaseReport {
                    admission_id: m.admission_id,
                    ..e
                },
                m,
            )?,
            (e, m) => same(end, e.map(|_| ()).map_err(ModelError::Usage), m.map(|_| ()))?,
        }
    }
    let s = comparable(engine.stats());
    same(end, s.clone(), model.stats())?;
    same(end, (s.in_flight, s.admissions_in_flight), (0, 0))?;
    same(end, s.token_budget.map_or(0, |t| t.in_flight_tokens), 0)?;
    Ok(bypassed)
}

/// `d` in class `class` (modulo the number of classes; unchanged without classes).
fn in_class(engine: &Bulkhead, d: Demand, class: u8) -> Demand {
    let n = engine.class_names().len();
    if n == 0 {
        d
    } else {
        d.in_class(crate::ClassId::new(
            engine.shared.class_owner,
            usize::from(class) % n,
        ))
    }
}

/// The engine's statistics without the measured wait durations (the model does not model
/// time; it counts the waits that ended through `queue_waits.ended` only on the engine side).
fn comparable(mut s: crate::Stats) -> crate::Stats {
    s.queue_waits = Default::default();
    s
}

/// An engine admission and its model handle from a wait: same revision and reservation; both
/// join the live set.
fn admitted(
    step: usize,
    a: Admission,
    h: Handle,
    model: &Model,
    live: &mut Vec<(Admission, Handle)>,
) -> Result<(), Divergence> {
    same(
        step,
        Some((a.revision(), a.reservation())),
        model.admission(h),
    )?;
    live.push((a, h));
    Ok(())
}

/// A queued `acquire` future of the engine and its waiter in the model.
struct Waiting<'a> {
    future: Pin<Box<crate::Acquire<'a>>>,
    id: WaitId,
    /// The future's cancel token ([`Op::AbortWait`]).
    token: crate::CancelToken,
    /// Queued with a zero timeout ([`Op::WaitExpiring`]): it times out at its next poll.
    expiring: bool,
}

/// A future that finished (`e`) against the model's answer (`m`).
fn finished(
    step: usize,
    e: Poll<Result<Admission, crate::Rejection>>,
    m: Option<Result<Handle, crate::Rejection>>,
    model: &mut Model,
    live: &mut Vec<(Admission, Handle)>,
) -> Result<(), Divergence> {
    match (e, m) {
        (Poll::Ready(Ok(a)), Some(Ok(h))) => admitted(step, a, h, model, live),
        (Poll::Ready(Err(e)), Some(Err(m))) => same(step, e, m),
        (e, m) => same(
            step,
            format!("{:?}", e.map(|r| r.map(|a| a.revision()))),
            format!("{:?}", m.map(|r| r.map(|_| ()))),
        ),
    }
}

fn poll_once<F: Future>(f: Pin<&mut F>) -> Poll<F::Output> {
    f.poll(&mut Context::from_waker(Waker::noop()))
}

/// Polls every queued future; those that finished must match the model's answers, the others
/// must have none yet.
fn poll_waiting(
    step: usize,
    model: &mut Model,
    live: &mut Vec<(Admission, Handle)>,
    waiting: &mut Vec<Waiting<'_>>,
) -> Result<(), Divergence> {
    let mut i = 0;
    while i < waiting.len() {
        let id = waiting[i].id;
        match poll_once(waiting[i].future.as_mut()) {
            Poll::Pending => {
                same(step, false, model.answered(id))?;
                i += 1;
            }
            Poll::Ready(e) => {
                // An expiring waiter that was not answered left with `timeout`.
                let m = if waiting[i].expiring {
                    model.leave_wait(id, crate::RejectReason::Timeout)
                } else {
                    model.take_answer(id)
                };
                drop(waiting.remove(i));
                finished(step, Poll::Ready(e), m, model, live)?;
            }
        }
    }
    Ok(())
}

fn pick(live: &[(Admission, Handle)], i: usize) -> Option<usize> {
    (!live.is_empty()).then(|| i % live.len())
}

fn apply_op(
    step: usize,
    op: Op,
    engine: &Bulkhead,
    model: &mut Model,
    live: &mut Vec<(Admission, Handle)>,
) -> Result<(), Divergence> {
    match op {
        Op::Acquire { .. } | Op::AcquireSlot => {
            let demand = match op {
                Op::Acquire {
                    input,
                    max_output,
                    high,
                    class,
                } => match Reservation::new(input, max_output) {
                    Ok(r) => {
                        let d = Demand::tokens(r).with_priority(if high {
                            Priority::High
                        } else {
                            Priority::Normal
                        });
                        in_class(engine, d, class)
                    }
                    Err(_) => return Ok(()),
                },
                _ => Demand::slot(),
            };
            match (engine.try_acquire(demand), model.try_acquire(demand)) {
                (Ok(a), Ok(h)) => {
                    let model_view = model.admission(h);
                    same(step, Some((a.revision(), a.reservation())), model_view)?;
                    same(step, Some((a.class(), a.resources())), model.resources(h))?;
                    live.push((a, h));
                }
                (Err(e), Err(m)) => same(step, e, m)?,
                (e, m) => same(
                    step,
                    format!("{:?}", e.map(|a| a.revision())),
                    format!("{:?}", m.map(|_| ())),
                )?,
            }
        }
        Op::Report {
            pick: p,
            input,
            output,
            reconcile,
        } => {
            let Some(i) = pick(live, p) else {
                return Ok(());
            };
            let usage = Usage::new(input, output);
            let rc = reconcile.map(|(remaining_output, safety_margin)| Reconcile {
                remaining_output,
                safety_margin,
            });
            let (a, h) = &mut live[i];
            let e = a.report_usage_reconciled(usage, rc);
            let m = model.report_usage(*h, usage, rc);
            match (e, m) {
                (Ok(e), Ok(m)) => same(
                    step,
                    crate::UsageReport {
                        admission_id: m.admission_id,
                        ..e
                    },
                    m,
                )?,
                (e, m) => same(
                    step,
                    e.map(|_| ()).map_err(ModelError::Usage),
                    m.map(|_| ()),
                )?,
            }
        }
        Op::Release { pick: p, usage } => {
            let Some(i) = pick(live, p) else {
                return Ok(());
            };
            let (a, h) = live.swap_remove(i);
            let usage = usage.map(|(i, o)| Usage::new(i, o));
            match (a.release(usage), model.release(h, usage)) {
                (Ok(e), Ok(m)) => same(
                    step,
                    crate::ReleaseReport {
                        admission_id: m.admission_id,
                        ..e
                    },
                    m,
                )?,
                (Err(e), Err(m)) => {
                    same(step, &ModelError::Usage(e.error.clone()), &m)?;
                    live.push((*e.admission, h));
                }
                (e, m) => same(
                    step,
                    format!("{:?}", e.map(|_| ())),
                    format!("{:?}", m.map(|_| ())),
                )?,
            }
        }
        Op::Drop { pick: p } => {
            let Some(i) = pick(live, p) else {
                return Ok(());
            };
            let (a, h) = live.swap_remove(i);
            drop(a);
            same(step, Ok(()), model.release(h, None).map(|_| ()))?;
        }
        Op::Apply {
            step: s,
            max_concurrent,
            max_queue,
            budget,
            classes,
        } => {
            let cur = engine.limits();
            let mut table = cur.classes;
            if let Some(new) = classes {
                for (i, l) in new.iter().enumerate().take(table.len()) {
                    // The engine's own id of a position its table has: always set.
                    let _ =
                        table.set_checked(crate::ClassId::new(engine.shared.class_owner, i), *l);
                }
            }
            let snap = LimitsSnapshot {
                revision: cur.revision.saturating_add(s),
                max_concurrent,
                max_queue,
                token_budget: budget_limits(budget),
                classes: table,
            };
            same(step, engine.apply_limits(snap), model.apply_limits(snap))?;
        }
        Op::SetBudget { budget } => {
            // The model has no set_budget: it is apply_limits of the current snapshot with
            // revision + 1 and the new budget, which is exactly what the engine promises.
            let cur = engine.limits();
            let expected = match cur.token_budget {
                None => Err(()),
                Some(b) => Ok(cur
                    .with_revision(cur.revision + 1)
                    .with_token_budget(Some(BudgetLimits { budget, ..b }))),
            };
            let e = engine.set_budget(budget);
            match expected {
                Err(()) => same(step, e.is_err(), true)?,
                Ok(snap) => same(step, e, model.apply_limits(snap))?,
            }
        }
        Op::Abandon { pick: p } => {
            let Some(i) = pick(live, p) else {
                return Ok(());
            };
            let (a, h) = &mut live[i];
            same(step, a.abandon_borrowed_concurrency(), model.abandon(*h))?;
        }
        Op::Close => {
            engine.close();
            model.close();
        }
        // Handled by `run`, which owns the queued futures.
        Op::Wait { .. }
        | Op::WaitExpiring { .. }
        | Op::CancelWait { .. }
        | Op::AbortWait { .. } => {}
    }
    Ok(())
}

/// Decodes a byte string into a setup and operations (the fuzz target's input format). Every
/// byte string decodes to something; small values are favoured so limits are hit exactly.
///
/// ```
/// let (setup, ops) = llm_bulkhead::conformance::decode(&[1, 2, 3, 4, 5, 6, 7, 8, 9]);
/// assert!(setup.max_concurrent <= 8);
/// assert!(!ops.is_empty());
/// ```
pub fn decode(bytes: &[u8]) -> (Setup, Vec<Op>) {
    let mut cur = Cursor(bytes);
    let flags = cur.byte();
    let mc = cur.byte();
    let max_concurrent = u32::from((mc & 0x7f) % 9);
    let budget = (flags & 1 == 1).then(|| (cur.tokens(), cur.tokens() / 4));
    let mut classes = Vec::new();
    let mut default_class = 0;
    if flags & 0x08 != 0 {
        let b = cur.byte();
        default_class = usize::from(b >> 4);
        for _ in 0..1 + b % 3 {
            classes.push(cur.class_limits(budget.is_some()));
        }
    }
    let setup = Setup {
        max_concurrent,
        max_queue: u32::from(flags >> 4),
        budget,
        initial_revision: u64::from(flags >> 1 & 3),
        classes,
        default_class,
        wait_for_tokens: mc & 0x80 != 0,
    };
    let mut ops = Vec::new();
    while !cur.0.is_empty() {
        let tag = cur.byte();
        let op = match tag % 10 {
            0..=2 => Op::Acquire {
                input: cur.tokens(),
                max_output: cur.tokens(),
                high: tag & 0x10 != 0,
                class: tag >> 5,
            },
            3 => Op::AcquireSlot,
            4 => Op::Report {
                pick: cur.byte().into(),
                input: cur.tokens(),
                output: cur.tokens(),
                reconcile: (tag & 0x10 != 0).then(|| (cur.tokens(), cur.tokens())),
            },
            5 | 6 => Op::Release {
                pick: cur.byte().into(),
                usage: (tag & 0x10 != 0).then(|| (cur.tokens(), cur.tokens())),
            },
            7 => Op::Drop {
                pick: cur.byte().into(),
            },
            8 => {
                let b = cur.byte();
                Op::Apply {
                    step: u64::from(b % 3),
                    max_concurrent: if b & 0x80 != 0 {
                        crate::MAX_SLOTS + 1
                    } else {
                        u32::from(cur.byte() % 9)
                    },
                    max_queue: u32::from(b >> 4 & 3),
                    budget: (tag & 0x10 == 0).then(|| (cur.tokens(), cur.tokens())),
                    classes: (tag & 0x20 != 0).then(|| {
                        let has_budget = tag & 0x10 == 0;
                        [
                            cur.class_limits(has_budget),
                            cur.class_limits(has_budget),
                            cur.class_limits(has_budget),
                        ]
                    }),
                }
            }
            _ if tag & 0xc0 == 0x40 => Op::Wait {
                input: cur.tokens(),
                max_output: cur.tokens(),
                high: tag & 0x10 != 0,
                class: tag >> 5 & 1,
            },
            _ if tag & 0xc0 == 0xc0 && tag & 0x30 == 0x30 => Op::WaitExpiring {
                input: cur.tokens(),
                max_output: cur.tokens(),
                high: false,
                class: 0,
            },
            _ if tag & 0xc0 == 0xc0 && tag & 0x20 != 0 => Op::AbortWait {
                pick: cur.byte().into(),
            },
            _ if tag & 0xc0 == 0xc0 => Op::CancelWait {
                pick: cur.byte().into(),
            },
            _ if tag & 0x20 != 0 => Op::Abandon {
                pick: cur.byte().into(),
            },
            _ if tag & 0x10 != 0 => Op::SetBudget {
                budget: cur.tokens(),
            },
            _ => Op::Close,
        };
        ops.push(op);
    }
    (setup, ops)
}

struct Cursor<'a>(&'a [u8]);

impl Cursor<'_> {
    /// Small class limits: floors 0–3, ceilings absent or 0–5 slots; token fields only with a
    /// budget (so that most tables are valid).
    fn class_limits(&mut self, budget: bool) -> ClassLimits {
        let b = self.byte();
        let mut l = ClassLimits {
            protected_concurrent: u32::from(b % 4),
            max_concurrent: (b & 0x04 != 0).then_some(u32::from((b >> 3) % 6)),
            ..ClassLimits::default()
        };
        if budget {
            let t = self.byte();
            l.protected_tokens = u64::from(t % 8) * 100;
            l.max_tokens = (t & 0x80 != 0).then_some(u64::from((t >> 3) % 16) * 100);
        }
        l
    }

    fn byte(&mut self) -> u8 {
        match self.0.split_first() {
            Some((b, rest)) => {
                self.0 = rest;
                *b
            }
            None => 0,
        }
    }

    /// Token amounts in units of 100, with an occasional huge value to reach the bounds.
    fn tokens(&mut self) -> u64 {
        match self.byte() {
            250 => crate::MAX_TOKENS,
            251 => crate::MAX_TOKENS + 1,
            252 => u64::MAX,
            253 => u64::MAX / 2 + 1,
            b => u64::from(b % 32) * 100,
        }
    }
}
