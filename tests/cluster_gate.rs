//! The cluster handle on an injected clock, no timing: admissions stop at the end of the
//! installed share's window even when the agent has not stepped (its thread late), and also
//! when the admitting thread is paused between the check and the commit; every admission
//! carries its deadline; the agent's step fires cut signals at the deadline, drops the work of
//! `run` there, and counts releases past the deadline.

#[path = "support/cluster_leased.rs"]
mod cluster_leased;

use cluster_leased::{poll_across_deadline, DropFlag, Manual, RENEWED};
use llm_bulkhead::cluster::{
    AgentEvent, Clock, ClusterAgent, ClusterConfig, ClusterRejection, ClusterRunError, MemoryStore,
    Phase,
};
use llm_bulkhead::{Bulkhead, Demand};
use std::pin::pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::Duration;

fn config() -> ClusterConfig {
    cluster_leased::agent_config("gate")
}

/// An agent alone on a table, past learning, holding all 8 slots: valid until
/// `RENEWED + 940`, then the floor (2) until `RENEWED + 1_440`.
fn leased() -> (
    Manual,
    MemoryStore,
    ClusterAgent,
    Bulkhead,
    Arc<Mutex<Vec<AgentEvent>>>,
) {
    let b = Bulkhead::new(8).unwrap();
    let (clock, store, agent, events) = cluster_leased::leased(&b);
    (clock, store, agent, b, events)
}

/// The agent has not stepped since its lease ended (a late thread): the bulkhead still has
/// the whole grant installed, but the handle admits nothing; after the floor's window, again.
#[test]
fn admissions_stop_at_the_window_when_the_agent_is_late() {
    let (clock, store, mut agent, b, _) = leased();
    let h = agent.handle();
    store.set_reachable(false);
    clock.set(RENEWED + 939);
    let last = h.try_acquire(Demand::slot()).expect("inside the window");
    clock.set(RENEWED + 940);
    assert_eq!(
        h.try_acquire(Demand::slot()).unwrap_err(),
        ClusterRejection::ShareLapsed
    );
    assert_eq!(b.stats().in_flight, 1, "given back: only `last` is held");
    // The core alone would have admitted: the grant is still installed.
    assert_eq!(b.limits().max_concurrent, 8);
    drop(b.try_acquire(Demand::slot()).unwrap());
    // The agent steps: the floor, with the floor's window; one slot is still held.
    agent.tick();
    assert_eq!(agent.status().phase, Phase::Floor);
    assert_eq!(b.limits().max_concurrent, 2);
    let floor = h.try_acquire(Demand::slot()).expect("the floor");
    assert!(matches!(
        h.try_acquire(Demand::slot()),
        Err(ClusterRejection::Refused(_))
    ));
    drop((last, floor));
    clock.set(RENEWED + 1_440);
    assert_eq!(
        h.try_acquire(Demand::slot()).unwrap_err(),
        ClusterRejection::ShareLapsed
    );
    assert_eq!(b.limits().max_concurrent, 2, "the agent has not stepped");
    agent.tick();
    assert_eq!(b.limits().max_concurrent, 0);
    assert!(agent.status().lapsed_refusals >= 2);
    // With share zero the core refuses by itself (and counts the refusal as pressure).
    assert!(matches!(
        h.try_acquire(Demand::slot()),
        Err(ClusterRejection::Refused(_))
    ));
}

/// The admitting thread called inside the window but was paused before the core's commit,
/// which came after it: the read after the commit refuses and gives the capacity back. (Time
/// read before the call says nothing: the clock is read once, after the commit.)
#[test]
fn a_thread_paused_across_the_window_end_admits_nothing() {
    let (clock, _store, agent, b, _) = leased();
    let h = agent.handle();
    clock.set(RENEWED + 939);
    clock.next_reads(&[RENEWED + 940]);
    assert_eq!(
        h.try_acquire(Demand::slot()).unwrap_err(),
        ClusterRejection::ShareLapsed
    );
    assert_eq!(b.stats().in_flight, 0, "nothing held");
}

/// Deadlines: `max_admission` after the admission; the agent's step fires the cut signal at
/// the deadline (and schedules itself for it), a release after the deadline is counted and
/// reported, one before it is not.
#[test]
fn deadlines_fire_cut_signals_and_count_overdue_releases() {
    let (clock, _store, mut agent, _b, events) = leased();
    let h = agent.handle();
    clock.set(RENEWED + 100);
    let late = h.try_acquire(Demand::slot()).unwrap();
    let early = h.try_acquire(Demand::slot()).unwrap();
    assert_eq!(late.deadline_ms(), RENEWED + 1_100);
    let cut = late.cut_signal();
    clock.set(RENEWED + 200);
    let next = agent.tick();
    assert!(next <= RENEWED + 1_100);
    drop(early);
    clock.set(RENEWED + 1_099);
    agent.tick();
    assert!(!cut.is_cut() && !late.is_overdue());
    clock.set(RENEWED + 1_100);
    agent.tick();
    assert!(cut.is_cut() && late.is_overdue());
    assert_eq!(agent.status().cut, 1);
    assert_eq!(agent.status().overdue, 0);
    drop(late);
    agent.tick();
    assert_eq!(agent.status().overdue, 1, "released after its deadline");
    let ev = events.lock().unwrap();
    assert!(ev.contains(&AgentEvent::AdmissionsCut { count: 1 }));
    assert!(ev.contains(&AgentEvent::OverdueReleased { total: 1 }));
}

/// `run`: work that outlives its deadline is woken at the agent's step, dropped, and answered
/// `Cut`; its admission is released then.
#[test]
fn run_drops_the_work_at_its_deadline() {
    let (clock, _store, mut agent, b, _) = leased();
    let h = agent.handle();
    clock.set(RENEWED + 10);
    let dropped = Arc::new(AtomicBool::new(false));
    let flag = DropFlag(dropped.clone());
    let work = async move {
        let _flag = flag;
        std::future::pending::<()>().await;
    };
    let mut fut = pin!(h.run(Demand::slot(), work));
    assert_eq!(
        poll_across_deadline(fut.as_mut(), &clock, &mut agent, &b, RENEWED + 1_010),
        Poll::Ready(Err(ClusterRunError::Cut))
    );
    assert!(dropped.load(Ordering::SeqCst), "the work was dropped");
    assert_eq!(b.stats().in_flight, 0);
    // Work that ends in time returns its output.
    assert_eq!(
        futures_lite::future::block_on(h.run(Demand::slot(), async { 7 })),
        Ok(7)
    );
}

/// The window narrows before a new share is installed. A renewal during a long floor (here
/// `floor_hold` 2 s, longer than a lease) brings back the whole grant with a validity that
/// ends *before* the floor's window would have. The agent's thread is held right after
/// `apply_limits` (its `Installed` callback runs there) while the clock passes the new
/// validity: the handle must refuse, not admit under the new share with the floor's window.
#[test]
fn a_new_share_never_runs_on_the_old_window() {
    let clock = Manual::default();
    let c2 = clock.clone();
    let store = MemoryStore::with_clock(move || c2.now_ms());
    let b = Bulkhead::new(8).unwrap();
    let c = config()
        .floor_hold(Duration::from_millis(2_000))
        .quarantine(Duration::from_millis(4_000));
    let handle: Arc<Mutex<Option<llm_bulkhead::cluster::ClusterBulkhead>>> = Arc::default();
    let seen: Arc<Mutex<Vec<Result<(), ClusterRejection>>>> = Arc::default();
    let (h2, s2, c3) = (handle.clone(), seen.clone(), clock.clone());
    let mut agent = ClusterAgent::with_clock(
        b.clone(),
        Box::new(store.clone()),
        c,
        Arc::new(clock.clone()),
    )
    .unwrap()
    .on_event(move |e| {
        if let AgentEvent::Installed { share, .. } = e {
            let h = h2.lock().unwrap();
            if let (Some(h), 8) = (h.as_ref(), share.slots) {
                // Held here past the new validity (renewed at `at`, valid until `at + 940`).
                let at = c3.now_ms();
                c3.next_reads(&[at + 950]);
                s2.lock()
                    .unwrap()
                    .push(h.try_acquire(Demand::slot()).map(drop));
            }
        }
    });
    agent.tick();
    clock.set(5_001); // past learning (ttl + quarantine)
    agent.tick();
    assert_eq!(b.limits().max_concurrent, 8);
    *handle.lock().unwrap() = Some(agent.handle());
    seen.lock().unwrap().clear();
    // Cut off: the floor (2) from 5_001 + 940, for 2 s.
    store.set_reachable(false);
    clock.set(5_001 + 940);
    agent.tick();
    assert_eq!(b.limits().max_concurrent, 2);
    // Healed; the next attempt (`ttl / 10` after the failure) gets the whole grant again,
    // valid 940 ms from then, which ends before the floor's 2 s would have.
    store.set_reachable(true);
    clock.set(5_001 + 1_040);
    agent.tick();
    assert_eq!(b.limits().max_concurrent, 8);
    assert_eq!(
        *seen.lock().unwrap(),
        vec![Err(ClusterRejection::ShareLapsed)],
        "admitted under the new share on the floor's window"
    );
}

/// A clock that may lag more than the margin is refused; the coarse clock (one kernel tick,
/// 1-10 ms) fits the default 50 ms margin and runs an agent.
#[test]
fn a_clock_coarser_than_the_margin_is_refused() {
    struct Lagging;
    impl Clock for Lagging {
        fn now_ms(&self) -> u64 {
            0
        }
        fn resolution_ms(&self) -> u64 {
            51
        }
    }
    let b = Bulkhead::new(8).unwrap();
    let e = ClusterAgent::with_clock(
        b.clone(),
        Box::new(MemoryStore::new()),
        config(),
        Arc::new(Lagging),
    )
    .unwrap_err();
    assert_eq!(
        e,
        llm_bulkhead::cluster::ClusterConfigError::ClockTooCoarse { resolution_ms: 51 }
    );
    #[cfg(target_os = "linux")]
    {
        let coarse = llm_bulkhead::cluster::CoarseClock::new();
        assert!((1..=50).contains(&coarse.resolution_ms()));
        let store = MemoryStore::with_clock(move || coarse.now_ms());
        let mut agent =
            ClusterAgent::with_clock(b.clone(), Box::new(store), config(), Arc::new(coarse))
                .unwrap();
        agent.tick();
        assert!(
            agent.handle().try_acquire(Demand::slot()).is_err(),
            "learning"
        );
    }
}
