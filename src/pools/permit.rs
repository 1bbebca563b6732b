//! What an admitted request and a charged retry hold, and how they give it back.

use super::events::{CompletionEvent, FailureClass};
use super::{PartitionId, Pools};
use crate::Priority;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// An admitted request: a unit of its partition, a connection of its provider and a unit of
/// the global guard (and its tokens, and a retry unit if it is a retry). Give them back with
/// [`complete`](Self::complete); dropping it gives them back too, with the failure class
/// [`FailureClass::Dropped`]. Either way they are given back exactly once.
///
/// ```
/// use llm_bulkhead::pools::*;
/// let pools = Pools::new(&PoolsConfig::single("p", "c", 1))?;
/// let id = pools.partition("p-c")?;
/// let permit = pools.try_admit(&PoolRequest::new(1, id))?;
/// assert!(pools.try_admit(&PoolRequest::new(2, id)).is_err());
/// permit.complete(None);
/// assert!(pools.try_admit(&PoolRequest::new(3, id)).is_ok());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[must_use = "dropping a permit gives its capacity back at once"]
pub struct PoolPermit<'p> {
    pub(crate) pools: &'p Pools,
    pub(crate) core: Core,
}

/// What a permit holds, whoever owns the [`Pools`] pointer.
#[derive(Clone, Copy)]
pub(crate) struct Core {
    pub(crate) partition: PartitionId,
    pub(crate) request_id: u64,
    pub(crate) priority: Priority,
    pub(crate) tokens: u64,
    /// The partition whose retry unit it holds, if it is a retry.
    pub(crate) retry: Option<PartitionId>,
    pub(crate) version: u64,
    pub(crate) started: Option<Instant>,
    pub(crate) done: bool,
}

impl Core {
    /// Gives everything back once, and emits the completion event.
    fn finish(&mut self, pools: &Pools, failure: Option<FailureClass>) {
        if std::mem::replace(&mut self.done, true) {
            return;
        }
        let e = &pools.engine;
        let pi = self.partition.0 as usize;
        // A retry admitted in its own partition gives both units back in one step.
        let own_retry = self.retry == Some(self.partition);
        pools.release(pi, self.tokens, own_retry);
        if let Some(r) = self.retry.filter(|_| !own_retry) {
            e.partitions[r.0 as usize].hot.active.give_retry();
        }
        if let Some(o) = &e.observer {
            let p = &e.partitions[pi];
            o.on_completion(&CompletionEvent {
                request_id: self.request_id,
                provider: &e.providers[p.provider].name,
                partition: &p.name,
                traffic_class: &e.classes[p.class],
                priority: self.priority,
                latency: self.started.map_or(Duration::ZERO, |s| s.elapsed()),
                failure_class: failure,
                limit_version: self.version,
                retry: self.retry.is_some(),
            });
        }
    }

    /// Takes the state out, leaving a finished one behind (for a move to another owner).
    fn take(&mut self) -> Core {
        let taken = *self;
        self.done = true;
        taken
    }
}

impl PoolPermit<'_> {
    /// The partition that admitted the request.
    ///
    /// ```
    /// use llm_bulkhead::pools::*;
    /// let pools = Pools::new(&PoolsConfig::single("p", "c", 1))?;
    /// let id = pools.partition("p-c")?;
    /// assert_eq!(pools.try_admit(&PoolRequest::new(1, id))?.partition(), id);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn partition(&self) -> PartitionId {
        self.core.partition
    }

    /// The partition's limit version that admitted it.
    ///
    /// ```
    /// use llm_bulkhead::pools::*;
    /// let pools = Pools::new(&PoolsConfig::single("p", "c", 1))?;
    /// let id = pools.partition("p-c")?;
    /// assert_eq!(pools.try_admit(&PoolRequest::new(1, id))?.limit_version(), 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn limit_version(&self) -> u64 {
        self.core.version
    }

    /// Whether it holds a retry unit (it was admitted with a [`RetryCharge`]).
    ///
    /// ```
    /// use llm_bulkhead::pools::*;
    /// let pools = Pools::new(&PoolsConfig::single("p", "c", 1))?;
    /// let id = pools.partition("p-c")?;
    /// assert!(!pools.try_admit(&PoolRequest::new(1, id))?.is_retry());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn is_retry(&self) -> bool {
        self.core.retry.is_some()
    }

    /// Ends the request: gives everything back and emits its completion event with
    /// `failure` (`None`: success).
    ///
    /// ```
    /// use llm_bulkhead::pools::*;
    /// let pools = Pools::new(&PoolsConfig::single("p", "c", 1))?;
    /// let id = pools.partition("p-c")?;
    /// pools.try_admit(&PoolRequest::new(1, id))?.complete(Some(FailureClass::Timeout));
    /// assert_eq!(pools.stats().partitions[0].active, 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn complete(mut self, failure: Option<FailureClass>) {
        self.core.finish(self.pools, failure);
    }

    /// Moves the permit into one that owns its [`Pools`] through `pools` (the same pools):
    /// a `'static` permit that can move into a spawned task or a response body.
    ///
    /// # Errors
    /// The permit back, unchanged, if `pools` is not the pools that admitted it.
    ///
    /// ```
    /// use llm_bulkhead::pools::*;
    /// use std::sync::Arc;
    /// let pools = Arc::new(Pools::new(&PoolsConfig::single("p", "c", 1))?);
    /// let id = pools.partition("p-c")?;
    /// let owned = pools.try_admit(&PoolRequest::new(1, id))?.into_owned(&pools).unwrap();
    /// std::thread::spawn(move || owned.complete(None)).join().unwrap();
    /// assert_eq!(pools.stats().partitions[0].active, 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn into_owned(mut self, pools: &Arc<Pools>) -> Result<OwnedPoolPermit, Self> {
        if !std::ptr::eq(self.pools, Arc::as_ptr(pools)) {
            return Err(self);
        }
        Ok(OwnedPoolPermit {
            pools: pools.clone(),
            core: self.core.take(),
        })
    }
}

impl Drop for PoolPermit<'_> {
    fn drop(&mut self) {
        self.core.finish(self.pools, Some(FailureClass::Dropped));
    }
}

/// A [`PoolPermit`] that owns its [`Pools`] through an `Arc` (from
/// [`PoolPermit::into_owned`]): `'static`, so it can move into a spawned task or a response
/// body. It gives back the same units, the same way, exactly once.
///
/// ```
/// use llm_bulkhead::pools::*;
/// use std::sync::Arc;
/// let pools = Arc::new(Pools::new(&PoolsConfig::single("p", "c", 1))?);
/// let id = pools.partition("p-c")?;
/// let owned: OwnedPoolPermit = pools.try_admit(&PoolRequest::new(1, id))?.into_owned(&pools).unwrap();
/// drop(owned); // gives back, as a dropped permit does
/// assert!(pools.try_admit(&PoolRequest::new(2, id)).is_ok());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[must_use = "dropping a permit gives its capacity back at once"]
pub struct OwnedPoolPermit {
    pools: Arc<Pools>,
    core: Core,
}

impl OwnedPoolPermit {
    /// The partition that admitted the request.
    ///
    /// ```
    /// use llm_bulkhead::pools::*;
    /// let pools = std::sync::Arc::new(Pools::new(&PoolsConfig::single("p", "c", 1))?);
    /// let id = pools.partition("p-c")?;
    /// let owned = pools.try_admit(&PoolRequest::new(1, id))?.into_owned(&pools).unwrap();
    /// assert_eq!(owned.partition(), id);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn partition(&self) -> PartitionId {
        self.core.partition
    }

    /// The pools that admitted it.
    ///
    /// ```
    /// use llm_bulkhead::pools::*;
    /// let pools = std::sync::Arc::new(Pools::new(&PoolsConfig::single("p", "c", 1))?);
    /// let id = pools.partition("p-c")?;
    /// let owned = pools.try_admit(&PoolRequest::new(1, id))?.into_owned(&pools).unwrap();
    /// assert_eq!(owned.pools().name(owned.partition()), "p-c");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn pools(&self) -> &Arc<Pools> {
        &self.pools
    }

    /// Ends the request, as [`PoolPermit::complete`] does.
    ///
    /// ```
    /// use llm_bulkhead::pools::*;
    /// let pools = std::sync::Arc::new(Pools::new(&PoolsConfig::single("p", "c", 1))?);
    /// let id = pools.partition("p-c")?;
    /// let owned = pools.try_admit(&PoolRequest::new(1, id))?.into_owned(&pools).unwrap();
    /// owned.complete(Some(FailureClass::UpstreamError));
    /// assert_eq!(pools.stats().partitions[0].completed, 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn complete(mut self, failure: Option<FailureClass>) {
        self.core.finish(&self.pools, failure);
    }
}

impl Drop for OwnedPoolPermit {
    fn drop(&mut self) {
        self.core.finish(&self.pools, Some(FailureClass::Dropped));
    }
}

impl std::fmt::Debug for OwnedPoolPermit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OwnedPoolPermit")
            .field("partition", &self.core.partition)
            .field("request_id", &self.core.request_id)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for PoolPermit<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PoolPermit")
            .field("partition", &self.core.partition)
            .field("request_id", &self.core.request_id)
            .field("retry", &self.core.retry)
            .field("version", &self.core.version)
            .finish()
    }
}

/// A retry charged to a partition's retry budget, held through its back-off: pass it to
/// [`Pools::admit_retry`] when the back-off ends (the admission then holds it until the
/// attempt ends), or drop it to give the unit back (the retry was abandoned).
///
/// ```
/// use llm_bulkhead::pools::*;
/// let mut config = PoolsConfig::single("p", "c", 4);
/// config.partitions.get_mut("p-c").unwrap().retry = RetryConfig { percent: 0, min: 1 };
/// let pools = Pools::new(&config)?;
/// let id = pools.partition("p-c")?;
/// let charge = pools.charge_retry(7, id)?;            // decided: counted from now
/// assert!(pools.charge_retry(8, id).is_err());       // min 1: the budget is full
/// let permit = pools.admit_retry(&PoolRequest::new(7, id), charge).into_permit().unwrap();
/// assert_eq!(pools.stats().partitions[0].retries_in_flight, 1);
/// permit.complete(None);                              // the attempt ended
/// assert_eq!(pools.stats().partitions[0].retries_in_flight, 0);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[must_use = "dropping a charge gives the retry unit back at once"]
pub struct RetryCharge<'p> {
    pub(crate) pools: &'p Pools,
    pub(crate) partition: PartitionId,
    pub(crate) live: bool,
}

impl RetryCharge<'_> {
    /// The partition charged.
    ///
    /// ```
    /// use llm_bulkhead::pools::*;
    /// let pools = Pools::new(&PoolsConfig::single("p", "c", 4))?;
    /// let id = pools.partition("p-c")?;
    /// assert_eq!(pools.charge_retry(1, id)?.partition(), id);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn partition(&self) -> PartitionId {
        self.partition
    }

    /// Hands the unit over to an admission (it stops being this charge's to give back).
    pub(crate) fn take(mut self) -> PartitionId {
        self.live = false;
        self.partition
    }
}

impl Drop for RetryCharge<'_> {
    fn drop(&mut self) {
        if self.live {
            let p = &self.pools.engine.partitions[self.partition.0 as usize];
            p.hot.active.give_retry();
        }
    }
}

impl std::fmt::Debug for RetryCharge<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RetryCharge")
            .field("partition", &self.partition)
            .field("live", &self.live)
            .finish()
    }
}
