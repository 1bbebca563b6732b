//! Models of the coordinator's own code (`src/coordinator/`, not a miniature): its uncontended
//! path (atomic client and provider words, the sharded key table, no mutex) against its queued
//! path (the wait's mutex), with fake clocks.
//!
//! 1. A completion on the uncontended path against a newcomer on the uncontended path, with a
//!    ticket queued for the completing key (client limit 1): the freed slot goes to the queued
//!    ticket, inside the completion or inside the newcomer's own queued judgement, never to
//!    the newcomer (no over-admission, no overtaking); the queued ticket is started (a lost
//!    start leaves its owner parked forever: loom reports a deadlock). Broken variants:
//!    `LLM_BULKHEAD_LOOM_COORDINATOR_FAST_IGNORES_WAITERS=1` (the uncontended admission does
//!    not look at the `WAITERS` bit: the newcomer takes the slot between the completion's
//!    `fetch_sub` and its start rule) and `LLM_BULKHEAD_LOOM_COORDINATOR_RELEASE_IGNORES_WAITERS=1`
//!    (a completion never runs the start rule: the queued ticket is never started);
//! 2. a ticket queued for a running key against that key's completion, which frees the key
//!    with a store (no lock): whichever comes first, the ticket starts (no lost wake-up), and
//!    its work sees the last invocation's (loom checks every access to the work's cell).
//!    Broken variants `..._RELEASE_IGNORES_WAITERS=1` and
//!    `LLM_BULKHEAD_LOOM_COORDINATOR_KEY_RELEASE_RELAXED=1` (the store is `Relaxed`: a claim
//!    that reads it is not ordered after the work, and loom reports the two accesses);
//! 3. two uncontended admissions for the last client slot: exactly one starts (no
//!    over-admission), the other is judged by the queued path and refused;
//! 4. two uncontended admissions racing for one pacing gap of a paced provider: exactly one
//!    starts, the other queues until the deadline. Broken variant
//!    `LLM_BULKHEAD_LOOM_COORDINATOR_PACE_STORE=1` (the pacing stamp is a check and a store,
//!    not a CAS: both start);
//! 5. the last handle dropped while the last uncontended invocation completes: the state is
//!    freed exactly once, after both. Broken variant
//!    `LLM_BULKHEAD_LOOM_COORDINATOR_DETACH_STALE=1` (the last handle reads the slot count
//!    before it marks `DETACHED`: the completion between them sees no `DETACHED`, the handle
//!    saw the slot held, and the state leaks).
//!
//! 6. a completion against a scan (a snapshot's catch-up) with two tickets queued for the
//!    completing key: the completion frees the key without the mutex before its last RMW, so
//!    the scan may find it held for the older ticket and free for the younger; the older
//!    starts, never the younger. Broken variant `LLM_BULKHEAD_LOOM_COORDINATOR_SCAN_FORGETS=1`
//!    (the scan does not keep what it found held: the younger ticket overtakes).
//! 7. ticket ids across an epoch of the ticket counter (three bits under loom): an uncontended
//!    start whose id comes from the client word races a queued submit that starts the next
//!    epoch; every id stays unique. Broken variant
//!    `LLM_BULKHEAD_LOOM_COORDINATOR_ID_EPOCH_AFTER=1` (the uncontended start reads the epoch
//!    after its RMW only: it takes an id of the next epoch, which a later ticket takes again).
//!
//! 8. two uncontended admissions of one key: exactly one starts. Broken variant
//!    `LLM_BULKHEAD_LOOM_COORDINATOR_KEY_NO_LOCK=1` (a key's slot in the running-key table
//!    without its lock: the two claims race on it).
#![cfg(loom)]

mod common;

use common::model;
use llm_bulkhead::coordinator::testing::ManualClocks;
use llm_bulkhead::coordinator::{Coordinator, Invocation, ProviderLimits, SubmitOptions};
use loom::thread;
use std::time::Duration;

fn coordinator(client_limit: u32, queue_cap: usize) -> Coordinator<u8> {
    let clocks = ManualClocks::new(Duration::ZERO);
    build(&clocks, client_limit, queue_cap, ProviderLimits::default())
}

/// One provider `a` with `limits`, on `clocks`.
fn build(
    clocks: &ManualClocks,
    client_limit: u32,
    queue_cap: usize,
    limits: ProviderLimits,
) -> Coordinator<u8> {
    Coordinator::builder()
        .client_limit(client_limit)
        .queue_cap(queue_cap)
        .provider("a", limits)
        .clocks(clocks.clocks())
        .build()
        .unwrap()
}

/// Submits a ticket for key `key` that starts at once.
fn start(c: &Coordinator<u8>, key: u8) -> Invocation<u8> {
    let t = c.submit("a", key, SubmitOptions::default()).unwrap();
    assert!(t.is_started(), "key {key} should start at once");
    t.wait_blocking().unwrap()
}

fn assert_at_rest(c: &Coordinator<u8>) {
    let s = c.snapshot();
    assert_eq!(s.client_in_flight, 0, "client slot leaked: {s:?}");
    assert_eq!(s.providers[0].in_flight, 0, "provider slot leaked: {s:?}");
    assert!(s.running.is_empty(), "key leaked: {s:?}");
    assert!(s.queue.is_empty(), "ticket left queued: {s:?}");
}

#[test]
fn a_completion_hands_its_slot_to_the_queued_ticket_not_to_an_uncontended_newcomer() {
    model(|| {
        let c = coordinator(1, 2);
        let running = start(&c, 1);
        let queued = c.submit("a", 1, SubmitOptions::default()).unwrap();
        assert!(!queued.is_started(), "key 1 is running");
        let c2 = c.clone();
        let newcomer = thread::spawn(move || {
            let t = c2.submit("a", 2, SubmitOptions::default()).unwrap();
            let started = t.is_started();
            (t, started)
        });
        running.complete();
        let (newcomer, started_at_once) = newcomer.join().unwrap();
        assert!(
            !started_at_once,
            "the newcomer took the slot the completion freed for the queued ticket"
        );
        let first = queued.wait_blocking().expect("the queued ticket starts");
        assert_eq!(c.snapshot().client_in_flight, 1);
        first.complete();
        newcomer
            .wait_blocking()
            .expect("then the newcomer")
            .complete();
        assert_at_rest(&c);
    });
}

/// A ticket for a running key against that key's completion, which frees the key with a
/// store (no lock): whichever comes first, the ticket starts, and its work sees the last
/// invocation's.
#[test]
fn a_ticket_queued_while_its_key_completes_is_started_after_its_work() {
    model(|| {
        // Client limit 2: the later ticket can take the uncontended path while the first runs.
        let c = coordinator(2, 1);
        let work = std::sync::Arc::new(loom::cell::UnsafeCell::new(0u32));
        let running = start(&c, 1);
        let (c2, w2) = (c.clone(), work.clone());
        let later = thread::spawn(move || {
            // Queued (key 1 runs) or started at once (the completion came first).
            let inv = c2
                .submit("a", 1, SubmitOptions::default())
                .unwrap()
                .wait_blocking()
                .expect("the later ticket starts");
            // SAFETY: only the invocation holding key 1 touches `work` (what the model checks:
            // loom reports two unordered accesses).
            w2.with_mut(|p| unsafe { *p += 1 });
            inv.complete();
        });
        // SAFETY: as above.
        work.with_mut(|p| unsafe { *p += 1 });
        running.complete();
        later.join().unwrap();
        // SAFETY: both invocations are done (the join orders them before this).
        assert_eq!(work.with(|p| unsafe { *p }), 2);
        assert_at_rest(&c);
    });
}

/// Two uncontended admissions, of `keys.0` here and `keys.1` on another thread, with no queue:
/// how many started; the state is at rest once both are dropped.
fn race_two_admissions(client_limit: u32, keys: (u8, u8)) -> usize {
    let c = coordinator(client_limit, 0);
    let c2 = c.clone();
    let other = thread::spawn(move || c2.submit("a", keys.1, SubmitOptions::default()).ok());
    let mine = c.submit("a", keys.0, SubmitOptions::default()).ok();
    let other = other.join().unwrap();
    let started = [&mine, &other]
        .iter()
        .filter(|t| t.as_ref().is_some_and(|t| t.is_started()))
        .count();
    assert_eq!(c.snapshot().client_in_flight as usize, started);
    drop((mine, other));
    assert_at_rest(&c);
    started
}

/// Two uncontended admissions for the last client slot (client limit 1, no queue): exactly one
/// starts, the other is refused with overflow after the queued path judged it; nothing leaks.
#[test]
fn two_uncontended_admissions_for_the_last_slot_start_one() {
    model(|| {
        let started = race_two_admissions(1, (1, 2));
        assert_eq!(started, 1, "the client limit of 1 admitted {started}");
    });
}

/// Two uncontended admissions to a paced provider (`min_interval` 1 s, the fake clock stopped)
/// with room for both: the pacing stamp lets exactly one start; the other queues, and starts
/// when the clock reaches the pacing deadline.
#[test]
fn two_admissions_racing_for_one_pacing_gap_start_one() {
    model(|| {
        let clocks = ManualClocks::new(Duration::ZERO);
        let paced = ProviderLimits {
            limit: None,
            min_interval: Duration::from_secs(1),
        };
        let c = build(&clocks, 2, 2, paced);
        let c2 = c.clone();
        let other = thread::spawn(move || c2.submit("a", 2, SubmitOptions::default()).unwrap());
        let mine = c.submit("a", 1, SubmitOptions::default()).unwrap();
        let other = other.join().unwrap();
        let started = [&mine, &other].iter().filter(|t| t.is_started()).count();
        assert_eq!(started, 1, "one pacing gap started {started}");
        let s = c.snapshot();
        assert_eq!(s.queue.len(), 1, "{s:?}");
        assert_eq!(s.providers[0].paced_until, Some(Duration::from_secs(1)));
        clocks.scheduler.advance(Duration::from_secs(1));
        assert_eq!(c.snapshot().client_in_flight, 2, "the paced ticket started");
        drop((mine, other));
        assert_at_rest(&c);
    });
}

/// The last handle goes while the last (uncontended) invocation completes on another thread:
/// the state is freed exactly once, after both (the invocation holds no reference count: its
/// client slot keeps the state alive). The wall clock's `Arc` counts the state's hold on it.
#[test]
fn the_last_handle_and_the_last_invocation_free_the_state_once() {
    model(|| {
        let clocks = ManualClocks::new(Duration::ZERO);
        let c = build(&clocks, 1, 0, ProviderLimits::default());
        let inv = start(&c, 1);
        let done = thread::spawn(move || inv.complete());
        drop(c);
        done.join().unwrap();
        assert_eq!(
            std::sync::Arc::strong_count(&clocks.wall),
            1,
            "the state was not freed"
        );
    });
}

#[test]
fn a_key_freed_during_a_scan_goes_to_the_older_of_two_queued_tickets() {
    model(|| {
        let c = coordinator(2, 2);
        let running = start(&c, 1);
        let older = c.submit("a", 1, SubmitOptions::default()).unwrap();
        let younger = c.submit("a", 1, SubmitOptions::default()).unwrap();
        assert!(
            !older.is_started() && !younger.is_started(),
            "key 1 is running"
        );
        let completion = thread::spawn(move || running.complete());
        // A scan of the queue (the snapshot catches the clock up and runs the start rule).
        drop(c.snapshot());
        completion.join().unwrap();
        let s = c.snapshot();
        assert_eq!(
            s.running,
            vec![(1, older.id())],
            "the younger ticket overtook the older one: {s:?}"
        );
        assert_eq!(s.queue, vec![younger.id()]);
        older.wait_blocking().unwrap().complete();
        younger.wait_blocking().unwrap().complete();
        assert_at_rest(&c);
    });
}

#[test]
fn ticket_ids_stay_unique_across_an_epoch_of_the_counter() {
    model(|| {
        // Client limit 4, queue cap 1. Six tickets started and completed: the counter (three
        // bits under loom) is at 6, its last value for an uncontended start.
        let c = coordinator(4, 1);
        let mut ids = Vec::new();
        for key in 10..16 {
            let inv = start(&c, key);
            ids.push(inv.ticket());
            inv.complete();
        }
        // Takes the queued path (the counter is at its last value) or the uncontended one;
        // either way it may start the next epoch.
        let c2 = c.clone();
        let other = thread::spawn(move || {
            let t = c2.submit("a", 4, SubmitOptions::default()).unwrap();
            let id = t.id();
            (t, id)
        });
        // Takes id 6 on the uncontended path, or goes the queued way after the other.
        let racing = c.submit("a", 3, SubmitOptions::default()).unwrap();
        ids.push(racing.id());
        let (other, id) = other.join().unwrap();
        ids.push(id);
        // Six more tickets in the next epoch: a wrong id of the racer's would come again here.
        for key in 20..26 {
            let t = c.submit("a", key, SubmitOptions::default()).unwrap();
            ids.push(t.id());
            t.wait_blocking().unwrap().complete();
        }
        let mut sorted = ids.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(
            sorted.len(),
            ids.len(),
            "a ticket id was given twice: {ids:?}"
        );
        racing.wait_blocking().unwrap().complete();
        other.wait_blocking().unwrap().complete();
        assert_at_rest(&c);
    });
}

/// Model 8: two uncontended admissions of one key: exactly one starts, the other is judged by
/// the queued path (the key runs, no queue: overflow); the key's slot is claimed under its
/// lock, so the two claims never touch it at once.
#[test]
fn two_uncontended_admissions_of_one_key_start_one() {
    model(|| {
        let started = race_two_admissions(2, (1, 1));
        assert_eq!(started, 1, "two invocations of key 1 started: {started}");
    });
}
