//! The sizes of the values every decision returns (issue 13 §2), pinned so that a growth is
//! a visible decision: change the numbers here, and say why in the commit.

use llm_bulkhead::{Acquire, Admission, ClassId, Demand, Rejection};
use std::mem::size_of;

#[test]
#[cfg(target_pointer_width = "64")]
fn decision_values_keep_their_sizes() {
    let sizes = (
        size_of::<Admission>(),
        size_of::<Rejection>(),
        size_of::<Result<Admission, Rejection>>(),
        size_of::<Demand>(),
        size_of::<Option<ClassId>>(),
    );
    // Admission 96 (tokio's permit: 16; was 104, until whether usage was reported became a
    // flag of its class word instead of an `Option<Usage>` tag); Rejection 88 (was 104, then 72,
    // then 56 with a class refusal's numbers boxed: it keeps the raw numbers its decision saw and
    // explains itself on demand, a class refusal's packed inline so that refusing never
    // allocates; measured: the no-class pair and refusal cost the same at 80 and 88), so the
    // Result is the Admission's 96 (was 112, then 104); Demand grew from 32 to 40 when `ClassId` took its bulkhead's identity (issue 13
    // §3); `ClassId` is one `NonZeroU64` (56-bit serial, 8-bit index), so its `Option` is 8.
    assert_eq!(sizes, (96, 88, 96, 40, 8), "{sizes:?}");
}

/// The future of `acquire`: its node is built in place only when the demand must wait, but it
/// lives inside the future (the queue allocates nothing: `tests/queue_allocations.rs`), so the
/// future carries its size. Was 272 bytes.
#[test]
#[cfg(target_pointer_width = "64")]
fn the_acquire_future_keeps_its_size() {
    assert_eq!(size_of::<Acquire<'static>>(), 256, "the future's size");
}
