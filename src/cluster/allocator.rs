//! The store-side decision, pure: one renewal (or release) of one replica's lease against the
//! lease table, at the store's clock. No I/O. [`MemoryStore`](super::MemoryStore) runs it as
//! is; the Redis script (`super::redis`, `lease.lua`) is the same algorithm in Lua, and
//! `tests/cluster_redis.rs` checks that the two agree on random tables against a real server.
//!
//! A replica's reservation is `max(applied, granted, held)` per resource, counted while its
//! record lives (`renewed_at + ttl + quarantine` in store time). Every grant is capped by
//! `global − Σ other reservations`, so after every write `Σ reservations ≤ global` (I2). Each
//! class's floor and ceiling are split the same way, per class (`super::classes`).

use super::classes::{self, ClassParams, ClassRecord, ClassShare, ClassUse};
use std::collections::BTreeMap;

/// The largest amount (slots or tokens) the lease table accepts: 2⁴⁰. Sums over 1,024 replicas
/// stay below 2⁵³, the range the Redis script's Lua numbers hold exactly.
pub const MAX_AMOUNT: u64 = 1 << 40;

/// The most replicas one budget's table holds (see [`MAX_AMOUNT`]).
pub const MAX_REPLICAS: usize = 1_024;

/// The most admission classes one budget splits.
pub const MAX_CLASSES: usize = 64;

/// An amount of each resource a lease carries: global slots and in-flight tokens.
///
/// ```
/// use llm_bulkhead::cluster::Amounts;
/// let a = Amounts::new(4, 1_000);
/// assert_eq!(a.max(Amounts::new(2, 3_000)), Amounts::new(4, 3_000));
/// assert!(Amounts::new(1, 1).fits_in(a));
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Amounts {
    /// Concurrency slots.
    pub slots: u64,
    /// In-flight tokens (0 without a token budget).
    pub tokens: u64,
}

impl Amounts {
    /// Nothing.
    pub const ZERO: Amounts = Amounts {
        slots: 0,
        tokens: 0,
    };

    /// `slots` slots and `tokens` tokens.
    ///
    /// ```
    /// # use llm_bulkhead::cluster::Amounts;
    /// assert_eq!(Amounts::new(1, 2).tokens, 2);
    /// ```
    #[must_use]
    pub const fn new(slots: u64, tokens: u64) -> Self {
        Amounts { slots, tokens }
    }

    /// The larger of each resource.
    ///
    /// ```
    /// # use llm_bulkhead::cluster::Amounts;
    /// assert_eq!(Amounts::new(1, 5).max(Amounts::new(2, 3)), Amounts::new(2, 5));
    /// ```
    #[must_use]
    pub fn max(self, o: Amounts) -> Amounts {
        Amounts::new(self.slots.max(o.slots), self.tokens.max(o.tokens))
    }

    /// The smaller of each resource.
    ///
    /// ```
    /// # use llm_bulkhead::cluster::Amounts;
    /// assert_eq!(Amounts::new(1, 5).min(Amounts::new(2, 3)), Amounts::new(1, 3));
    /// ```
    #[must_use]
    pub fn min(self, o: Amounts) -> Amounts {
        Amounts::new(self.slots.min(o.slots), self.tokens.min(o.tokens))
    }

    /// Whether each resource is at most `o`'s.
    ///
    /// ```
    /// # use llm_bulkhead::cluster::Amounts;
    /// assert!(!Amounts::new(1, 5).fits_in(Amounts::new(2, 3)));
    /// ```
    #[must_use]
    pub fn fits_in(self, o: Amounts) -> bool {
        self.slots <= o.slots && self.tokens <= o.tokens
    }

    fn saturating_sub(self, o: Amounts) -> Amounts {
        Amounts::new(
            self.slots.saturating_sub(o.slots),
            self.tokens.saturating_sub(o.tokens),
        )
    }

    pub(crate) fn add(self, o: Amounts) -> Amounts {
        Amounts::new(self.slots + o.slots, self.tokens + o.tokens)
    }
}

/// The store-side parameters of one budget. Every request carries them; a table created with
/// other parameters refuses the request ([`AllocError::ConfigMismatch`]).
///
/// ```
/// use llm_bulkhead::cluster::{Amounts, StoreParams};
/// let p = StoreParams { global: Amounts::new(8, 0), floor: Amounts::new(1, 0), ttl_ms: 1_000,
///                      quarantine_ms: 2_000, classes: vec![] };
/// assert_eq!(p.hold_ms(), 3_000);
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct StoreParams {
    /// The global limits the replicas share.
    pub global: Amounts,
    /// The share each live replica is offered at least (when the global limits have room).
    pub floor: Amounts,
    /// Lease time to live, store milliseconds.
    pub ttl_ms: u64,
    /// Quarantine after the TTL before a silent replica's reservation is handed out.
    pub quarantine_ms: u64,
    /// The admission classes whose floors and ceilings are split too, in the bulkhead's order
    /// (empty: a bulkhead without classes).
    pub classes: Vec<ClassParams>,
}

impl StoreParams {
    /// `ttl + quarantine`: how long a record outlives its last renewal, and how long learning
    /// mode lasts.
    ///
    /// ```
    /// # use llm_bulkhead::cluster::{Amounts, StoreParams};
    /// let p = StoreParams { global: Amounts::new(1, 0), floor: Amounts::ZERO, ttl_ms: 5, quarantine_ms: 7, classes: vec![] };
    /// assert_eq!(p.hold_ms(), 12);
    /// ```
    #[must_use]
    pub fn hold_ms(&self) -> u64 {
        self.ttl_ms.saturating_add(self.quarantine_ms)
    }
}

/// The table's header: which incarnation of the table this is, and its write count.
///
/// ```
/// use llm_bulkhead::cluster::{Amounts, Meta, StoreParams};
/// let p = StoreParams { global: Amounts::new(1, 0), floor: Amounts::ZERO, ttl_ms: 5, quarantine_ms: 7, classes: vec![] };
/// let m = Meta { epoch: 1, seq: 0, learning_until: 12, params: p };
/// assert_eq!(m.seq, 0);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Meta {
    /// Store time (ms) at which the table was created: a new value means the store lost it.
    pub epoch: u64,
    /// Writes since creation.
    pub seq: u64,
    /// No replica grows before this store time (ms).
    pub learning_until: u64,
    /// The parameters the table was created with.
    pub params: StoreParams,
}

/// One replica's record.
///
/// ```
/// use llm_bulkhead::cluster::{Amounts, Record};
/// let r = Record { applied: Amounts::new(2, 0), granted: Amounts::new(1, 0), held: Amounts::new(3, 0),
///                  wants: Amounts::ZERO, renewed_at: 0, classes: vec![] };
/// assert_eq!(r.reserved(), Amounts::new(3, 0));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// The share the replica had installed when it sent its last renewal.
    pub applied: Amounts,
    /// The share the store granted at that renewal.
    pub granted: Amounts,
    /// What the replica had in flight when it sent it.
    pub held: Amounts,
    /// Its demand.
    pub wants: Amounts,
    /// Store time (ms) of that renewal.
    pub renewed_at: u64,
    /// Per class, in the order of the table's class parameters.
    pub classes: Vec<ClassRecord>,
}

impl Record {
    /// What the store keeps reserved for this replica: `max(applied, granted, held)`. A grant
    /// is reserved before the replica applies it; a smaller grant frees nothing until the
    /// replica reports it applied and that its work in flight fits.
    ///
    /// ```
    /// # use llm_bulkhead::cluster::{Amounts, Record};
    /// let r = Record { applied: Amounts::new(5, 0), granted: Amounts::new(1, 0), held: Amounts::ZERO,
    ///                  wants: Amounts::ZERO, renewed_at: 0, classes: vec![] };
    /// assert_eq!(r.reserved().slots, 5);
    /// ```
    #[must_use]
    pub fn reserved(&self) -> Amounts {
        self.applied.max(self.granted).max(self.held)
    }
}

/// The whole state of one budget in the store. `meta: None` is an empty store.
///
/// ```
/// use llm_bulkhead::cluster::LeaseTable;
/// assert!(LeaseTable::default().records.is_empty());
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LeaseTable {
    /// The header, absent in an empty (or wiped) store.
    pub meta: Option<Meta>,
    /// Records by replica id.
    pub records: BTreeMap<String, Record>,
}

/// A replica's renewal (or release) request.
///
/// ```
/// use llm_bulkhead::cluster::{Amounts, RenewRequest};
/// let r = RenewRequest::new("a", Amounts::ZERO, Amounts::ZERO, Amounts::new(4, 0));
/// assert_eq!((r.epoch, r.seq), (0, 0));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RenewRequest {
    /// The replica's id, unique per process start.
    pub replica: String,
    /// The share it has installed now.
    pub applied: Amounts,
    /// What it has in flight now.
    pub held: Amounts,
    /// Its demand (at most the global limits).
    pub wants: Amounts,
    /// The table epoch of its last reply (0: none yet).
    pub epoch: u64,
    /// The table sequence of its last reply (0: none yet).
    pub seq: u64,
    /// Per class, in the order of the store parameters' classes (empty without classes).
    pub classes: Vec<ClassUse>,
}

impl RenewRequest {
    /// A first request (no reply seen yet).
    ///
    /// ```
    /// # use llm_bulkhead::cluster::{Amounts, RenewRequest};
    /// assert_eq!(RenewRequest::new("a", Amounts::ZERO, Amounts::ZERO, Amounts::ZERO).replica, "a");
    /// ```
    #[must_use]
    pub fn new(replica: &str, applied: Amounts, held: Amounts, wants: Amounts) -> Self {
        RenewRequest {
            replica: replica.to_owned(),
            applied,
            held,
            wants,
            epoch: 0,
            seq: 0,
            classes: Vec::new(),
        }
    }

    /// With these class reports (one per class of the store parameters, in their order).
    ///
    /// ```
    /// # use llm_bulkhead::cluster::{Amounts, ClassShare, ClassUse, RenewRequest};
    /// let u = ClassUse::new("chat", ClassShare::ZERO, Amounts::ZERO, Amounts::new(1, 0));
    /// let r = RenewRequest::new("a", Amounts::ZERO, Amounts::ZERO, Amounts::ZERO).with_classes(vec![u]);
    /// assert_eq!(r.classes.len(), 1);
    /// ```
    #[must_use]
    pub fn with_classes(mut self, classes: Vec<ClassUse>) -> Self {
        self.classes = classes;
        self
    }
}

/// The store's answer to a renewal.
///
/// ```
/// use llm_bulkhead::cluster::{Amounts, RenewReply};
/// let r = RenewReply { granted: Amounts::new(2, 0), epoch: 1, seq: 1, now_ms: 0, learning: false,
///                      classes: vec![] };
/// assert_eq!(r.granted.slots, 2);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RenewReply {
    /// The share the replica may install, valid for one TTL from when it sent the request.
    pub granted: Amounts,
    /// The table's epoch.
    pub epoch: u64,
    /// The table's sequence after this write.
    pub seq: u64,
    /// The store time (ms) of the decision.
    pub now_ms: u64,
    /// Whether the table is in learning mode (nobody grows).
    pub learning: bool,
    /// The class shares granted, in the order of the store parameters' classes.
    pub classes: Vec<ClassShare>,
}

/// Why the store refused a request; nothing changed.
///
/// ```
/// use llm_bulkhead::cluster::AllocError;
/// assert!(AllocError::ConfigMismatch.to_string().contains("parameters"));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AllocError {
    /// The table was created with other [`StoreParams`].
    ConfigMismatch,
    /// A demand above the global limits, or an amount above [`MAX_AMOUNT`].
    AboveGlobal,
    /// The table holds [`MAX_REPLICAS`] live records already.
    TooManyReplicas,
    /// A release while work is still in flight or a share installed.
    NotDrained,
    /// A class report that names a class the store's parameters do not have (or not in their
    /// order), or a class name the store cannot hold.
    UnknownClass,
    /// A class demand above the class's global ceiling.
    AboveClassLimit,
}

impl std::fmt::Display for AllocError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            AllocError::ConfigMismatch => "the lease table was created with other parameters",
            AllocError::AboveGlobal => "a demand above the global limits",
            AllocError::TooManyReplicas => "the lease table is full",
            AllocError::NotDrained => "release refused: work still in flight or a share installed",
            AllocError::UnknownClass => "a class the lease table does not know",
            AllocError::AboveClassLimit => "a class demand above the class's global ceiling",
        })
    }
}

impl std::error::Error for AllocError {}

/// Checks a request's amounts before anything changes.
fn check_request(p: &StoreParams, req: &RenewRequest) -> Result<(), AllocError> {
    let g = p.global;
    let too_big = [req.applied, req.held, req.wants, g, p.floor]
        .iter()
        .any(|a| a.slots > MAX_AMOUNT || a.tokens > MAX_AMOUNT);
    if too_big || !req.wants.fits_in(g) {
        return Err(AllocError::AboveGlobal);
    }
    check_classes(p, req)
}

/// Checks the class parameters and reports: known names in the parameters' order, limits
/// within the global ones, demands within the class ceilings.
fn check_classes(p: &StoreParams, req: &RenewRequest) -> Result<(), AllocError> {
    if req.classes.len() != p.classes.len() {
        return Err(AllocError::UnknownClass);
    }
    let mut floors = Amounts::ZERO;
    for (c, u) in p.classes.iter().zip(&req.classes) {
        if !classes::good_name(&c.name) || c.name != u.name {
            return Err(AllocError::UnknownClass);
        }
        let amounts = [
            c.floor,
            c.ceiling,
            c.min,
            u.applied.floor,
            u.applied.ceiling,
        ];
        if amounts
            .iter()
            .chain([&u.held, &u.wants])
            .any(|a| a.slots > MAX_AMOUNT || a.tokens > MAX_AMOUNT)
            || !c.min.fits_in(c.floor)
            || !c.floor.fits_in(c.ceiling)
            || !c.ceiling.fits_in(p.global)
        {
            return Err(AllocError::AboveGlobal);
        }
        floors = floors.add(c.floor);
        if !u.wants.fits_in(c.ceiling) {
            return Err(AllocError::AboveClassLimit);
        }
    }
    if !floors.fits_in(p.global) || p.classes.len() > MAX_CLASSES {
        return Err(AllocError::AboveGlobal);
    }
    Ok(())
}

/// The table's header at `now`, created if missing, and whether the request reveals lost state.
fn header(
    table: &mut LeaseTable,
    p: &StoreParams,
    req: &RenewRequest,
    now: u64,
) -> Result<Meta, AllocError> {
    let hold = p.hold_ms();
    // An empty store cannot tell a first start from lost state: it always learns first.
    let mut meta = table.meta.clone().unwrap_or(Meta {
        epoch: now.max(1),
        seq: 0,
        learning_until: now.saturating_add(hold),
        params: p.clone(),
    });
    // A class the table was not created with is named as such before the parameters differ.
    let known = |name: &str| meta.params.classes.iter().any(|c| c.name == name);
    if !req.classes.iter().all(|u| known(&u.name)) {
        return Err(AllocError::UnknownClass);
    }
    if meta.params != *p {
        return Err(AllocError::ConfigMismatch);
    }
    // A replica that saw another epoch, or a later write than the table has, holds a share the
    // table no longer counts; it matters only if it has something installed or in flight.
    let lost = req.epoch != 0 && (req.epoch != meta.epoch || req.seq > meta.seq);
    if lost && req.applied.max(req.held) != Amounts::ZERO {
        meta.learning_until = meta.learning_until.max(now.saturating_add(hold));
    }
    Ok(meta)
}

/// Drops the records whose hold (`renewed_at + ttl + quarantine`) has passed at `now`.
fn reclaim(table: &mut LeaseTable, p: &StoreParams, now: u64) {
    let hold = p.hold_ms();
    table
        .records
        .retain(|_, r| r.renewed_at.saturating_add(hold) > now);
}

/// The largest level `l` with `Σ min(w, l) ≤ cap` (max-min water-filling), for one resource.
fn level(wants: &[u64], cap: u64) -> u64 {
    let (mut lo, mut hi) = (0u64, cap);
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        let sum: u64 = wants.iter().map(|&w| w.min(mid)).sum();
        if sum <= cap {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    lo
}

/// One resource's fair target for the replica whose demand is `mine`, among `all` demands
/// (each raised to the floor): its demand plus an equal part of the spare when the demands fit,
/// the max-min level otherwise.
pub(crate) fn fair(all: &[u64], mine: u64, cap: u64) -> u64 {
    let sum: u64 = all.iter().sum();
    if sum <= cap {
        mine + (cap - sum) / all.len() as u64
    } else {
        mine.min(level(all, cap))
    }
}

/// One renewal of `req.replica` at store time `now_ms` (ms): validates, creates the header if
/// the store is empty, reclaims expired records, computes the grant and writes the record.
/// On an error nothing changed.
///
/// # Errors
/// [`AllocError`]: parameters that differ from the table's, a demand above the global limits,
/// a full table.
///
/// ```
/// use llm_bulkhead::cluster::{renew, Amounts, LeaseTable, RenewRequest, StoreParams};
/// let p = StoreParams { global: Amounts::new(8, 0), floor: Amounts::new(1, 0), ttl_ms: 1_000, quarantine_ms: 2_000, classes: vec![] };
/// let mut t = LeaseTable::default();
/// let want = Amounts::new(6, 0);
/// // A new table learns first: a replica that held nothing gets nothing.
/// let r = renew(&mut t, &p, &RenewRequest::new("a", Amounts::ZERO, Amounts::ZERO, want), 0).unwrap();
/// assert_eq!((r.granted, r.learning), (Amounts::ZERO, true));
/// // After ttl + quarantine it gets its demand and an equal part of the spare.
/// let r = renew(&mut t, &p, &RenewRequest::new("a", Amounts::ZERO, Amounts::ZERO, want), 3_000).unwrap();
/// assert_eq!(r.granted.slots, 8);
/// ```
pub fn renew(
    table: &mut LeaseTable,
    p: &StoreParams,
    req: &RenewRequest,
    now_ms: u64,
) -> Result<RenewReply, AllocError> {
    check_request(p, req)?;
    let mut meta = header(table, p, req, now_ms)?;
    let mut next = table.clone();
    reclaim(&mut next, p, now_ms);
    next.records.remove(&req.replica);
    if next.records.len() >= MAX_REPLICAS {
        return Err(AllocError::TooManyReplicas);
    }
    let others = next
        .records
        .values()
        .fold(Amounts::ZERO, |s, r| s.add(r.reserved()));
    let avail = p.global.saturating_sub(others);
    let learning = now_ms < meta.learning_until;
    let target = if learning {
        // No growth: a replica keeps at most what it uses (valid under the lost state, where
        // everything fitted); one that held nothing gets nothing.
        req.applied.max(req.held)
    } else {
        let mine = req.wants.max(p.floor);
        let demands: Vec<Amounts> = next
            .records
            .values()
            .map(|r| r.wants.max(p.floor))
            .chain(std::iter::once(mine))
            .collect();
        let s: Vec<u64> = demands.iter().map(|a| a.slots).collect();
        let t: Vec<u64> = demands.iter().map(|a| a.tokens).collect();
        Amounts::new(
            fair(&s, mine.slots, p.global.slots),
            fair(&t, mine.tokens, p.global.tokens),
        )
    };
    let granted = target.min(avail);
    // A record written under other class parameters cannot be counted class by class.
    if next
        .records
        .values()
        .any(|r| r.classes.len() != p.classes.len())
    {
        return Err(AllocError::ConfigMismatch);
    }
    let others: Vec<&[ClassRecord]> = next.records.values().map(|r| &r.classes[..]).collect();
    let class_grants = classes::split(
        &p.classes,
        p.global,
        &others,
        &req.classes,
        granted,
        learning,
    );
    meta.seq += 1;
    let (epoch, seq) = (meta.epoch, meta.seq);
    next.records.insert(
        req.replica.clone(),
        Record {
            applied: req.applied,
            granted,
            held: req.held,
            wants: req.wants,
            renewed_at: now_ms,
            classes: req
                .classes
                .iter()
                .zip(&class_grants)
                .map(|(u, g)| ClassRecord {
                    applied: u.applied,
                    granted: *g,
                    held: u.held,
                    wants: u.wants,
                })
                .collect(),
        },
    );
    next.meta = Some(meta);
    *table = next;
    Ok(RenewReply {
        granted,
        epoch,
        seq,
        now_ms,
        learning,
        classes: class_grants,
    })
}

/// A graceful goodbye: removes `req.replica`'s record, so its reservation is free at once.
/// Only a drained replica may leave (nothing installed, nothing in flight). An unknown replica
/// or an empty store: nothing to do.
///
/// # Errors
/// [`AllocError::NotDrained`], [`AllocError::ConfigMismatch`]; nothing changed.
///
/// ```
/// use llm_bulkhead::cluster::{release, renew, Amounts, LeaseTable, RenewRequest, StoreParams};
/// let p = StoreParams { global: Amounts::new(8, 0), floor: Amounts::ZERO, ttl_ms: 1, quarantine_ms: 1, classes: vec![] };
/// let mut t = LeaseTable::default();
/// renew(&mut t, &p, &RenewRequest::new("a", Amounts::ZERO, Amounts::ZERO, Amounts::ZERO), 0).unwrap();
/// release(&mut t, &p, &RenewRequest::new("a", Amounts::ZERO, Amounts::ZERO, Amounts::ZERO)).unwrap();
/// assert!(t.records.is_empty());
/// ```
pub fn release(
    table: &mut LeaseTable,
    p: &StoreParams,
    req: &RenewRequest,
) -> Result<(), AllocError> {
    if req.applied.max(req.held) != Amounts::ZERO {
        return Err(AllocError::NotDrained);
    }
    let Some(mut meta) = table.meta.clone() else {
        return Ok(());
    };
    if meta.params != *p {
        return Err(AllocError::ConfigMismatch);
    }
    if table.records.remove(&req.replica).is_some() {
        meta.seq += 1;
        table.meta = Some(meta);
    }
    Ok(())
}

/// `Σ reserved` over the records that live at `now_ms`: what I2 bounds by the global limits.
///
/// ```
/// use llm_bulkhead::cluster::{reserved_total, Amounts, LeaseTable, StoreParams};
/// let p = StoreParams { global: Amounts::new(8, 0), floor: Amounts::ZERO, ttl_ms: 1, quarantine_ms: 1, classes: vec![] };
/// assert_eq!(reserved_total(&LeaseTable::default(), &p, 0), Amounts::ZERO);
/// ```
#[must_use]
pub fn reserved_total(table: &LeaseTable, p: &StoreParams, now_ms: u64) -> Amounts {
    live(table, p, now_ms).fold(Amounts::ZERO, |s, r| s.add(r.reserved()))
}

/// `Σ reserved` per class (floors and ceilings) over the records that live at `now_ms`: what
/// I2 bounds per class by the class's global floor and ceiling (a ceiling at the global limit
/// is not split; its sum is bounded by [`reserved_total`] instead).
///
/// ```
/// use llm_bulkhead::cluster::{reserved_class_totals, Amounts, LeaseTable, StoreParams};
/// let p = StoreParams { global: Amounts::new(8, 0), floor: Amounts::ZERO, ttl_ms: 1, quarantine_ms: 1, classes: vec![] };
/// assert!(reserved_class_totals(&LeaseTable::default(), &p, 0).is_empty());
/// ```
#[must_use]
pub fn reserved_class_totals(table: &LeaseTable, p: &StoreParams, now_ms: u64) -> Vec<ClassShare> {
    let n = p.classes.len();
    let records: Vec<&[ClassRecord]> = live(table, p, now_ms)
        .filter(|r| r.classes.len() == n)
        .map(|r| &r.classes[..])
        .collect();
    classes::reserved_sums(n, &records)
}

fn live<'a>(
    table: &'a LeaseTable,
    p: &StoreParams,
    now_ms: u64,
) -> impl Iterator<Item = &'a Record> {
    let hold = p.hold_ms();
    table
        .records
        .values()
        .filter(move |r| r.renewed_at.saturating_add(hold) > now_ms)
}
