//! A pools decision takes its units by tentative steps and undoes them when a later step
//! refuses it. A request that meets such a unit must not be refused because of it: it waits
//! for the decision in progress to be confirmed or undone, and is refused only when the
//! committed holders explain the refusal (`src/pools/engine.rs`, "Spurious refusals").
//!
//! Pinned with the pause hooks (feature `testing`): decision D holds its partition's last
//! unit tentatively and is stopped there; request R comes to the same partition; D is then
//! refused by its token budget and gives the unit back. Every serial order admits R (D is
//! refused in all of them), so R must be admitted.

use llm_bulkhead::pools::*;
use llm_bulkhead::testing::{clear_pause_hook, set_pause_hook, PausePoint};
use std::sync::mpsc;

/// Partition `p-c`: one active unit, a token budget of 10.
fn pools() -> Pools {
    let mut config = PoolsConfig::single("p", "c", 1);
    config.partitions.get_mut("p-c").unwrap().token_budget = Some(10);
    Pools::new(&config).unwrap()
}

enum Seen {
    /// R met D's tentative unit and waits for it.
    MetTentative,
    /// R's decision returned: admitted or not.
    Done(Result<(), Reason>),
}

#[test]
fn a_unit_that_is_undone_refuses_no_one() {
    let pools = pools();
    let id = pools.partition("p-c").unwrap();
    let (at_pause, paused) = mpsc::channel();
    let (go_tx, go) = mpsc::channel::<()>();
    let (seen_tx, seen) = mpsc::channel();
    std::thread::scope(|s| {
        // D: 11 tokens, more than the budget: refused at its token step, after its active
        // unit is taken. Stopped while it holds that unit.
        let d = s.spawn(|| {
            set_pause_hook(move |p| {
                if p == PausePoint::PoolsTentativeTaken {
                    at_pause.send(()).unwrap();
                    go.recv().unwrap();
                }
            });
            let mut req = PoolRequest::new(1, id);
            req.tokens = 11;
            let out = pools.try_admit(&req).map(drop).map_err(|r| r.reason);
            clear_pause_hook();
            out
        });
        paused.recv().unwrap();
        assert_eq!(pools.stats().partitions[0].tentative, 1);
        // R: no tokens; the partition's only unit is D's, still tentative.
        let r = s.spawn(|| {
            let tx = seen_tx.clone();
            set_pause_hook(move |p| {
                if p == PausePoint::PoolsMetTentative {
                    tx.send(Seen::MetTentative).unwrap();
                }
            });
            let out = pools.try_admit(&PoolRequest::new(2, id));
            clear_pause_hook();
            seen_tx
                .send(Seen::Done(out.as_ref().map(|_| ()).map_err(|r| r.reason)))
                .unwrap();
            out.map(drop)
        });
        // R either waits for D (and says so) or returns first: a refusal no serial order makes.
        match seen.recv().unwrap() {
            Seen::MetTentative => {}
            Seen::Done(out) => {
                go_tx.send(()).unwrap();
                d.join().unwrap().ok();
                panic!("R decided while D's unit was tentative: {out:?}");
            }
        }
        go_tx.send(()).unwrap();
        assert_eq!(d.join().unwrap(), Err(Reason::TokenBudgetReached));
        assert!(
            r.join().unwrap().is_ok(),
            "R was refused by D's undone unit"
        );
    });
    let p = &pools.stats().partitions[0];
    assert_eq!((p.active, p.tentative, p.tokens), (0, 0, 0), "{p:?}");
    assert_eq!(p.admitted, 1);
}
