//! Exhaustive test-side mirrors of the refusal detail types, which are `#[non_exhaustive]`
//! (a test outside the crate can neither build them by literal nor destructure them without
//! `..`). A test writes the expected value as a literal of the mirror, which names every field
//! the test knows, and compares it with `Mirror::of(&actual)`, which reads those fields.
#![allow(dead_code)]

use llm_bulkhead as lb;

/// Mirrors [`lb::TokenCapacity`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TokenCapacity {
    pub budget: u64,
    pub in_flight_tokens: u64,
    pub effective_budget: u64,
    pub available: u64,
    pub requested: u64,
}

impl TokenCapacity {
    pub fn of(t: &lb::TokenCapacity) -> Self {
        TokenCapacity {
            budget: t.budget,
            in_flight_tokens: t.in_flight_tokens,
            effective_budget: t.effective_budget,
            available: t.available,
            requested: t.requested,
        }
    }

    /// The mirror of an optional token capacity (`detail().token_budget`).
    pub fn of_opt(t: &Option<lb::TokenCapacity>) -> Option<Self> {
        t.as_ref().map(Self::of)
    }
}

/// Mirrors [`lb::SharedAmount`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SharedAmount {
    pub capacity: u64,
    pub in_use: u64,
    pub available: u64,
    pub requested_borrowed: u64,
}

impl SharedAmount {
    pub fn of(a: &lb::SharedAmount) -> Self {
        SharedAmount {
            capacity: a.capacity,
            in_use: a.in_use,
            available: a.available,
            requested_borrowed: a.requested_borrowed,
        }
    }

    pub fn of_opt(a: &Option<lb::SharedAmount>) -> Option<Self> {
        a.as_ref().map(Self::of)
    }
}

/// Mirrors [`lb::SharedCapacity`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SharedCapacity {
    pub concurrency: SharedAmount,
    pub token_budget: Option<SharedAmount>,
}

impl SharedCapacity {
    pub fn of(s: &lb::SharedCapacity) -> Self {
        SharedCapacity {
            concurrency: SharedAmount::of(&s.concurrency),
            token_budget: SharedAmount::of_opt(&s.token_budget),
        }
    }
}

/// Mirrors [`lb::ClassTokenCapacity`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClassTokenCapacity {
    pub in_flight_tokens: u64,
    pub protected_tokens: u64,
    pub protected_tokens_in_use: u64,
    pub borrowed_tokens: u64,
    pub available_protected_tokens: u64,
    pub max_tokens: Option<u64>,
    pub available: Option<u64>,
    pub requested: u64,
}

impl ClassTokenCapacity {
    pub fn of(t: &lb::ClassTokenCapacity) -> Self {
        ClassTokenCapacity {
            in_flight_tokens: t.in_flight_tokens,
            protected_tokens: t.protected_tokens,
            protected_tokens_in_use: t.protected_tokens_in_use,
            borrowed_tokens: t.borrowed_tokens,
            available_protected_tokens: t.available_protected_tokens,
            max_tokens: t.max_tokens,
            available: t.available,
            requested: t.requested,
        }
    }
}

/// Mirrors [`lb::ClassCapacity`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClassCapacity {
    pub id: String,
    pub in_flight: u64,
    pub protected_concurrent: u64,
    pub protected_concurrent_in_use: u64,
    pub borrowed_concurrent: u64,
    pub available_protected_concurrent: u64,
    pub max_concurrent: Option<u64>,
    pub available_concurrent: Option<u64>,
    pub token_budget: Option<ClassTokenCapacity>,
}

impl ClassCapacity {
    pub fn of(c: &lb::ClassCapacity) -> Self {
        ClassCapacity {
            id: c.id.clone(),
            in_flight: c.in_flight,
            protected_concurrent: c.protected_concurrent,
            protected_concurrent_in_use: c.protected_concurrent_in_use,
            borrowed_concurrent: c.borrowed_concurrent,
            available_protected_concurrent: c.available_protected_concurrent,
            max_concurrent: c.max_concurrent,
            available_concurrent: c.available_concurrent,
            token_budget: c.token_budget.as_ref().map(ClassTokenCapacity::of),
        }
    }
}

/// Mirrors [`lb::ClassDetail`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClassDetail {
    pub shared: SharedCapacity,
    pub class: ClassCapacity,
}

impl ClassDetail {
    pub fn of(d: &lb::ClassDetail) -> Self {
        ClassDetail {
            shared: SharedCapacity::of(&d.shared),
            class: ClassCapacity::of(&d.class),
        }
    }
}

/// Mirrors [`lb::Resources`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Resources {
    pub borrowed_concurrency: bool,
    pub borrowed_tokens: u64,
}

impl Resources {
    pub fn of(r: lb::Resources) -> Self {
        Resources {
            borrowed_concurrency: r.borrowed_concurrency,
            borrowed_tokens: r.borrowed_tokens,
        }
    }
}

/// Mirrors [`lb::DrainReport`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DrainReport {
    pub drained: bool,
    pub in_flight: u64,
    pub pending: u64,
}

impl DrainReport {
    pub fn of(r: lb::DrainReport) -> Self {
        DrainReport {
            drained: r.drained,
            in_flight: r.in_flight,
            pending: r.pending,
        }
    }
}

/// Mirrors [`lb::CapacityDetail`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CapacityDetail {
    pub in_flight: u64,
    pub pending: u64,
    pub max_concurrent: u64,
    pub max_queue: u64,
    pub token_budget: Option<TokenCapacity>,
    pub classes: Option<ClassDetail>,
}

impl CapacityDetail {
    pub fn of(d: &lb::CapacityDetail) -> Self {
        CapacityDetail {
            in_flight: d.in_flight,
            pending: d.pending,
            max_concurrent: d.max_concurrent,
            max_queue: d.max_queue,
            token_budget: TokenCapacity::of_opt(&d.token_budget),
            classes: d.classes.as_deref().map(ClassDetail::of),
        }
    }
}
