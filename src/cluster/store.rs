//! Where lease tables live: the [`LeaseStore`] trait, its errors, and [`MemoryStore`] (the pure
//! allocator behind a mutex, on an injected clock: for tests and single-host simulations).

use super::allocator::{self, AllocError, LeaseTable, RenewReply, RenewRequest, StoreParams};
use crate::sync::{lock, Arc, Mutex};

/// Why a store call failed. The agent treats every one alike: it keeps its lease only until
/// its local validity ends, then degrades. None of them carries the store's URL.
///
/// ```
/// use llm_bulkhead::cluster::{AllocError, StoreError};
/// let e = StoreError::Refused(AllocError::AboveGlobal);
/// assert!(e.to_string().contains("global"));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreError {
    /// The allocator refused the request (same reasons in Rust and in the script).
    Refused(AllocError),
    /// The store could not be reached or did not answer in time (I/O kind only).
    Unreachable(String),
    /// A value under the crate's keys that the script cannot read: nothing was written, no
    /// share granted.
    Corrupt(String),
    /// The keys hold data of another format version or another program.
    Foreign(String),
    /// The server refused the script (scripting disabled, out of memory, a read-only replica).
    ScriptRefused(String),
    /// A server too old for the script (Redis before 5.0).
    OldServer(String),
    /// The server answered something that is not the script's reply.
    Protocol(String),
    /// An unreachable in-memory store (tests).
    Partitioned,
    /// A store URL that does not parse, or names a transport not built in (TLS needs the
    /// `redis` crate's TLS feature). The URL itself is not repeated.
    InvalidUrl,
}

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreError::Refused(e) => write!(f, "lease store refused the request: {e}"),
            StoreError::Unreachable(k) => write!(f, "lease store unreachable: {k}"),
            StoreError::Corrupt(d) => write!(f, "corrupt value under the lease keys: {d}"),
            StoreError::Foreign(d) => write!(f, "foreign data under the lease keys: {d}"),
            StoreError::ScriptRefused(d) => write!(f, "the server refused the lease script: {d}"),
            StoreError::OldServer(v) => write!(f, "server version {v} is older than 5.0"),
            StoreError::Protocol(d) => write!(f, "unexpected reply from the lease store: {d}"),
            StoreError::Partitioned => f.write_str("lease store partitioned away"),
            StoreError::InvalidUrl => f.write_str("invalid lease store URL (not repeated here)"),
        }
    }
}

impl std::error::Error for StoreError {}

impl From<AllocError> for StoreError {
    fn from(e: AllocError) -> Self {
        StoreError::Refused(e)
    }
}

/// A lease store: one atomic read-modify-write per call, at the store's clock.
///
/// ```
/// use llm_bulkhead::cluster::{Amounts, LeaseStore, MemoryStore, RenewRequest, StoreParams};
/// let p = StoreParams { global: Amounts::new(4, 0), floor: Amounts::ZERO, ttl_ms: 100, quarantine_ms: 100, classes: vec![] };
/// let mut s = MemoryStore::new();
/// let r = s.renew(&p, &RenewRequest::new("a", Amounts::ZERO, Amounts::ZERO, Amounts::new(1, 0))).unwrap();
/// assert!(r.learning);
/// ```
pub trait LeaseStore: Send {
    /// One renewal (see [`renew`](super::renew)).
    ///
    /// # Errors
    /// [`StoreError`]; nothing was granted.
    fn renew(&mut self, p: &StoreParams, req: &RenewRequest) -> Result<RenewReply, StoreError>;

    /// A graceful goodbye of a drained replica (see [`release`](super::release)).
    ///
    /// # Errors
    /// [`StoreError`]; the record stays until `ttl + quarantine`.
    fn release(&mut self, p: &StoreParams, req: &RenewRequest) -> Result<(), StoreError>;

    /// Bounds the next calls to `timeout` (connect, send and answer). The agent sets it before
    /// every renewal to the time left until its installed share must change, so a store that
    /// stops answering cannot hold the agent past its own deadline. The default ignores it
    /// (a store that never blocks).
    fn set_call_timeout(&mut self, timeout: std::time::Duration) {
        let _ = timeout;
    }
}

type NowFn = dyn Fn() -> u64 + Send + Sync;

struct Inner {
    table: LeaseTable,
    up: bool,
    calls: u64,
}

/// An in-memory lease store with an injected clock (ms). Clones share one table.
///
/// ```
/// use llm_bulkhead::cluster::{Amounts, LeaseStore, MemoryStore, RenewRequest, StoreError, StoreParams};
/// let p = StoreParams { global: Amounts::new(4, 0), floor: Amounts::ZERO, ttl_ms: 100, quarantine_ms: 100, classes: vec![] };
/// let mut s = MemoryStore::with_clock(|| 1_000);
/// s.set_reachable(false);
/// let req = RenewRequest::new("a", Amounts::ZERO, Amounts::ZERO, Amounts::ZERO);
/// assert_eq!(s.renew(&p, &req), Err(StoreError::Partitioned));
/// ```
#[derive(Clone)]
pub struct MemoryStore {
    inner: Arc<Mutex<Inner>>,
    now: Arc<NowFn>,
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStore").finish_non_exhaustive()
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryStore {
    /// A store on the system's wall clock.
    ///
    /// ```
    /// # use llm_bulkhead::cluster::MemoryStore;
    /// assert!(MemoryStore::new().table().records.is_empty());
    /// ```
    #[must_use]
    pub fn new() -> Self {
        Self::with_clock(|| {
            let d = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default();
            u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
        })
    }

    /// A store whose time (ms) is `now()`.
    ///
    /// ```
    /// # use llm_bulkhead::cluster::MemoryStore;
    /// assert_eq!(MemoryStore::with_clock(|| 7).calls(), 0);
    /// ```
    #[must_use]
    pub fn with_clock(now: impl Fn() -> u64 + Send + Sync + 'static) -> Self {
        MemoryStore {
            inner: Arc::new(Mutex::new(Inner {
                table: LeaseTable::default(),
                up: true,
                calls: 0,
            })),
            now: Arc::new(now),
        }
    }

    /// Cuts the store off (`false`) or heals it, for every clone.
    ///
    /// ```
    /// # use llm_bulkhead::cluster::MemoryStore;
    /// MemoryStore::new().set_reachable(true);
    /// ```
    pub fn set_reachable(&self, up: bool) {
        lock(&self.inner).up = up;
    }

    /// Loses every key, as a restart without persistence does.
    ///
    /// ```
    /// # use llm_bulkhead::cluster::MemoryStore;
    /// MemoryStore::new().wipe();
    /// ```
    pub fn wipe(&self) {
        lock(&self.inner).table = LeaseTable::default();
    }

    /// A copy of the table.
    ///
    /// ```
    /// # use llm_bulkhead::cluster::MemoryStore;
    /// assert!(MemoryStore::new().table().meta.is_none());
    /// ```
    #[must_use]
    pub fn table(&self) -> LeaseTable {
        lock(&self.inner).table.clone()
    }

    /// Calls that reached the store (renewals and releases).
    ///
    /// ```
    /// # use llm_bulkhead::cluster::MemoryStore;
    /// assert_eq!(MemoryStore::new().calls(), 0);
    /// ```
    #[must_use]
    pub fn calls(&self) -> u64 {
        lock(&self.inner).calls
    }
}

impl LeaseStore for MemoryStore {
    fn renew(&mut self, p: &StoreParams, req: &RenewRequest) -> Result<RenewReply, StoreError> {
        let now = (self.now)();
        let mut g = lock(&self.inner);
        if !g.up {
            return Err(StoreError::Partitioned);
        }
        g.calls += 1;
        Ok(allocator::renew(&mut g.table, p, req, now)?)
    }

    fn release(&mut self, p: &StoreParams, req: &RenewRequest) -> Result<(), StoreError> {
        let mut g = lock(&self.inner);
        if !g.up {
            return Err(StoreError::Partitioned);
        }
        g.calls += 1;
        Ok(allocator::release(&mut g.table, p, req)?)
    }
}
