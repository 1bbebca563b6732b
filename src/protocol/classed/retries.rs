//! The full protocol's loop (`super`, "Rare paths" and "Precision"): an attempt, the
//! collect-checked path when it asks for it, and a refusal explained by a collect, retried
//! while the collect contradicts it, each attempt in its own grace-period operation.

use super::*;

/// How often a refusal that a collect contradicts is decided again before it is reported
/// ([`explain_final`]). Each retry waits a little longer (`Backoff::snooze`: a few spins, then
/// `yield_now` on every retry after the seventh), outside any operation, so that a decider
/// stopped between two steps (preempted, on a machine with more runnable threads than cores)
/// gets the CPU and finishes.
///
/// How long such a decider stays stopped decides the count. Measured with
/// `tests/spurious_refusals.rs` (4 threads on 2 cores, installs at 2% and 30% of operations,
/// a histogram of the retries each contended decision needed, kept out of the code): of about
/// 10,000 decisions per run that a collect contradicted at least once, all but a few dozen were
/// settled (admitted, or refused by a collect) at the first retry; 5 to 10 per run needed 16 or
/// more, and one in four runs needed between 128 and 255 (it took 152 µs). With 16 (the count
/// before), those were reported after retries: in 12 runs of each build, alternated, 110
/// refusals reported after retries were flagged spurious with 16, and none with 256 (one in
/// 12 further runs). A retry after the seventh costs one collect and one `yield_now` (about a
/// microsecond when nothing else is runnable), so a refusal reported after all of them waited
/// about a quarter of a millisecond, or handed the CPU to runnable threads as many times: the
/// rare price of not refusing spuriously. A thread stopped for good between two steps (a
/// debugger) makes every refusal that the collect contradicts pay it.
///
/// Under loom the count stays 16: the models explore the retries' interleavings, and the
/// count decides precision, not safety.
const FITS_RETRIES: u32 = if cfg!(loom) { 16 } else { 256 };

/// [`FITS_RETRIES`] for a queued head (or a newcomer to an empty queue), decided under the
/// queue mutex: a refusal no collect confirmed does not end its wait
/// (`class_pump::may_wait`), and the step in progress that caused it visits the queue when it
/// lands or is taken back; so it is not retried long while others wait for the mutex.
const QUEUED_FITS_RETRIES: u32 = 16;

/// The full protocol: retries, the collect-checked path, and refusals explained by a collect.
#[inline(never)]
pub(super) fn acquire_contended(shared: &Shared, req: Req) -> Result<Admitted, Refused> {
    acquire_contended_with(shared, req, |f| *f)
}

/// [`acquire_contended`], with the refusal handed to `refused` by reference where it was
/// explained.
#[inline(always)]
pub(super) fn acquire_contended_with<T>(
    shared: &Shared,
    req: Req,
    refused: impl Fn(&Refused) -> T,
) -> Result<Admitted, T> {
    let backoff = crossbeam_utils::Backoff::new();
    let mut retries_after_refusal = 0;
    let bound = if req.in_queue {
        QUEUED_FITS_RETRIES
    } else {
        FITS_RETRIES
    };
    loop {
        // One grace-period operation per attempt, left before the attempt's backoff: a
        // decision that waits for another decider's step waits outside any operation, so that
        // no install is held off by its waiting (`crate::grace`).
        let explained = {
            let _op = crate::grace::op(shared.grace_id);
            let outcome = match attempt(shared, req) {
                Attempt::Slow => slow(shared, req),
                other => other,
            };
            match outcome {
                Attempt::Admitted(a) => return Ok(a),
                Attempt::Retry | Attempt::Slow => None,
                Attempt::Refused(reason) => Some((reason, explain(shared, req, reason, &refused))),
            }
        };
        match explained {
            None => backoff.spin(),
            Some((_, Explained::Refused(rej))) => return Err(rej),
            // The collect says the demand fits: another decider's step was in progress (a
            // release between its two words, a reservation about to be taken back, a
            // migration). Decide again, a bounded number of times (lock-free: each retry
            // follows some other operation's progress), before reporting the refusal.
            Some((_, Explained::Fits)) if retries_after_refusal < bound => {
                retries_after_refusal += 1;
                backoff.snooze();
            }
            Some((reason, Explained::Fits)) => {
                return Err(refused(&explain_final(shared, req, reason)))
            }
            Some((_, Explained::TagMoved)) => {}
        }
    }
}
