//! Runs on a cluster-managed bulkhead (feature `cluster`): [`LlmBulkhead::clustered`].
//!
//! A refusal for a token reservation the installed share can never hold, while the global
//! limits can (share zero while the table learns, or a small share), answers
//! [`RunError::Cluster`]`(`[`ClusterRunError::Refused`]`(`[`ClusterRejection::ShareTooSmall`]`))`:
//! retry it (the agent's next renewal asks for room for it). Only a reservation above the
//! global limits is the core's never-fits [`RunError::Rejected`].
//!
//! Two steps join a run, both only on a bulkhead built over a
//! [`ClusterBulkhead`](crate::cluster::ClusterBulkhead), so a plain run carries neither:
//! * **the window**, right after the core's commit (a run that waited in the queue included):
//!   one read of the agent's clock; an admission that committed after the installed share's
//!   window ended is given back at once and the run answers
//!   [`RunError::Cluster`]`(`[`ClusterRunError::Refused`]`(`[`ClusterRejection::ShareLapsed`]`))`
//!   without running the work;
//! * **the deadline**: the admission's cut signal (fired by the agent's step at
//!   `max_admission`) fires the run's stop signal with [`StopCause::Cut`]. The async `run`
//!   drops the work's future there (a stream included: the usage reported so far settles the
//!   tokens), `run_blocking` sets [`RunContext::stop_requested`] and answers when the work
//!   returns; either way the answer is [`ClusterRunError::Cut`]. The capacity stays held until
//!   the work really ended, and a release after the deadline is counted as overdue, as on the
//!   handle. The cut is registered with the agent only when something waits for it (`run`'s
//!   work once it first returns `Pending`, or a [`RunContext::stop_signal`]); a `run_blocking`
//!   work that only reads `stop_requested` reads the agent's step (one load) and registers
//!   nothing, so `AgentStatus::cut` (signals fired) does not count it, while its release is
//!   in `AgentStatus::overdue`.

use super::context::Inner;
use super::*;
use crate::cluster::{ClusterBulkhead, ClusterRejection, ClusterRunError, CutSignal, Ticket};

/// What a context of a cluster admission holds: the ticket (deadline, overdue count) and,
/// once something waits for the cut, its registration (none before: a run that only asks
/// whether it was cut reads the agent's step, and registers nothing).
pub(in crate::llm) struct ClusterHold {
    pub(in crate::llm) ticket: Ticket,
    cut: Option<CutSignal>,
}

/// Fires the run's stop signal when the admission's cut fires (the agent's thread wakes it).
struct CutBridge(Arc<StopState>);

fn bridge(state: &Arc<StopState>) -> Waker {
    Waker::from(Arc::new(CutBridge(Arc::clone(state))))
}

impl Wake for CutBridge {
    fn wake(self: Arc<Self>) {
        self.0.fire(StopCause::Cut);
    }
}

impl LlmBulkhead {
    /// A front end for the bulkhead a cluster agent manages, whose runs admit through the
    /// share's window and carry the admission deadline (the module docs of
    /// [`cluster`](crate::cluster), A3 and A4): a run whose commit falls after the installed
    /// share's window answers [`RunError::Cluster`] with
    /// [`ClusterRejection::ShareLapsed`], and a run still going at `max_admission` is cut
    /// ([`ClusterRunError::Cut`], [`StopCause::Cut`]). Only `run`, `run_blocking` and their
    /// timed forms admit on it: `run_shared` and the request-level acquires refuse as
    /// invalid (field `cluster`), since neither can carry the deadline to its work (admit
    /// through [`ClusterBulkhead::try_acquire`] instead). Observe mode's bypasses hold no
    /// admission, so they are outside the share by design.
    ///
    /// ```
    /// use llm_bulkhead::cluster::{ClusterAgent, ClusterConfig, ClusterRejection, ClusterRunError, MemoryStore};
    /// use llm_bulkhead::llm::{LlmBulkhead, LlmRequest, NaiveEstimator, RunError, RunOptions};
    /// use llm_bulkhead::Bulkhead;
    /// let agent = ClusterAgent::new(Bulkhead::new(4).unwrap(), Box::new(MemoryStore::new()),
    ///     ClusterConfig::new("gateway", "provider")).unwrap();
    /// let llm = LlmBulkhead::clustered(&agent.handle(), NaiveEstimator);
    /// // No lease yet: share zero, the core refuses.
    /// let r = llm.run_blocking(&LlmRequest::default(), RunOptions::default(), |_| Ok::<_, ()>(()));
    /// assert!(matches!(r, Err(RunError::Rejected(_))));
    /// ```
    pub fn clustered(
        handle: &ClusterBulkhead,
        estimator: impl TokenEstimator + 'static,
    ) -> LlmBulkhead {
        let mut llm = LlmBulkhead::new(handle.bulkhead().clone(), estimator);
        llm.cluster = Some(handle.window().clone());
        llm
    }

    /// Whether the bulkhead is cluster-managed ([`clustered`](Self::clustered)).
    ///
    /// ```
    /// # use llm_bulkhead::llm::*; use llm_bulkhead::Bulkhead;
    /// assert!(!LlmBulkhead::new(Bulkhead::new(1).unwrap(), NaiveEstimator).is_clustered());
    /// ```
    #[must_use]
    pub fn is_clustered(&self) -> bool {
        self.cluster.is_some()
    }
}

impl RunContext {
    /// The window check, right after the commit; then the cut bridged to the stop signal.
    /// On `Err` the caller drops the context, which gives the admission back. A bypassed run
    /// holds no admission and is left alone.
    #[inline(never)]
    pub(in crate::llm) fn enter_cluster(
        &mut self,
        window: &crate::cluster::ClusterWindow,
    ) -> Result<(), ClusterRejection> {
        if matches!(self.inner, Inner::Bypassed(_)) {
            return Ok(());
        }
        let ticket = window.check()?;
        self.cluster = Some(ClusterHold { ticket, cut: None });
        Ok(())
    }

    /// The stop signal `state` fires at the cut from now on (a [`StopSignal`] was asked for):
    /// registered once, and fired at once if the deadline passed already.
    pub(super) fn arm_cut(&mut self, state: &Arc<StopState>) {
        let Some(hold) = self.cluster.as_mut() else {
            return;
        };
        if hold.cut.is_none() {
            hold.cut = Some(hold.ticket.cut_signal(Some(bridge(state))));
        }
        if hold.ticket.passed() {
            state.fire(StopCause::Cut);
        }
    }

    /// The cluster admission deadline (the agent's clock, ms): `None` on a bulkhead that is
    /// not cluster-managed, and for a bypassed run.
    ///
    /// ```
    /// # use llm_bulkhead::llm::*; use llm_bulkhead::Bulkhead;
    /// let llm = LlmBulkhead::new(Bulkhead::new(1).unwrap(), NaiveEstimator);
    /// llm.run_blocking(&LlmRequest::default(), RunOptions::default(), |ctx| {
    ///     assert_eq!(ctx.cluster_deadline_ms(), None); Ok::<_, ()>(()) }).unwrap();
    /// ```
    #[must_use]
    pub fn cluster_deadline_ms(&self) -> Option<u64> {
        self.cluster.as_ref().map(|c| c.ticket.deadline_ms())
    }
}

/// The async `run` of a cluster admission without a borrowed-slot deadline: the work raced
/// against the cut; a work dropped at the cut has its tokens settled with its last usage
/// report. The cut is registered when the work first waits (a work that completes in its
/// first poll registers nothing).
pub(in crate::llm) async fn until_cut<R, E, U, F>(
    ctx: &mut RunContext,
    work: F,
    usage: &U,
) -> Result<R, RunError<E>>
where
    U: UsageFrom<R>,
    F: AsyncFnOnce(&mut RunContext) -> Result<R, E>,
{
    let Some(arm) = ctx.cluster.as_ref().map(|h| h.ticket.arm()) else {
        let out = work(ctx).await;
        return settle(ctx, out, usage);
    };
    let state = ctx.stop.state.get_or_insert_with(Default::default).clone();
    let signal = StopSignal {
        state: Arc::clone(&state),
        caller: None,
    };
    let mut cut: Option<CutSignal> = None;
    let out = {
        let mut running = std::pin::pin!(work(ctx));
        std::future::poll_fn(|cx| {
            if let Poll::Ready(out) = running.as_mut().poll(cx) {
                return Poll::Ready(Some(out));
            }
            if cut.is_none() {
                cut = Some(arm.register(Some(bridge(&state))));
            }
            signal.register(cx.waker());
            // The bridge fires the state before it wakes: registering first misses no cut.
            match arm.passed() || signal.deadline_fired() {
                true => Poll::Ready(None),
                false => Poll::Pending,
            }
        })
        .await
    };
    drop(cut);
    match out {
        Some(out) => {
            let answer = settle(ctx, out, usage);
            ctx.cut_answer(answer)
        }
        None => {
            ctx.finish(None);
            Err(RunError::Cluster(ClusterRunError::Cut))
        }
    }
}
