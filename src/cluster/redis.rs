//! The Redis lease store: every update is one `EVALSHA` of `lease.lua` (loaded with `SCRIPT
//! LOAD` on the first `NOSCRIPT`), on a blocking connection with read and write timeouts, at
//! the server's clock (`TIME` inside the script). Keys: `llm-bulkhead:{<namespace>/<budget>}:
//! v2:meta` and `…:v2:leases`; the braces keep them in one Redis Cluster slot, `v2` is the
//! format version (a key of another type or format is refused as foreign, never rewritten).
//!
//! Format 2 adds the per-class shares (class parameters in the table's parameters, one part per
//! class in each record, the class grants in the reply). A replica of format 1 reads only the
//! `v1` keys; so that it never grants itself a share this table does not count, every renewal
//! marks format 1's meta key (`…:v1:meta`, its `format` field) with format 2: a format-1
//! script then answers `LLMBH_FOREIGN` and its agent degrades fail-closed. A new format-2 table
//! learns for `ttl + quarantine`, which outlasts what a format-1 replica still holds, and so
//! does one that finds an unmarked format-1 table there (the mark deleted, a format-1 replica
//! started).

use super::allocator::{AllocError, RenewReply, RenewRequest, StoreParams};
use super::lease::ClusterConfig;
use super::store::{LeaseStore, StoreError};
use super::{Amounts, ClassShare};
use std::time::{Duration, Instant};

const FORMAT: &str = "llm-bulkhead-lease/2";
const SOURCE: &str = include_str!("lease.lua");

/// A lease store in Redis 5.0 or later (or Valkey). The URL (`redis://`, `redis+unix://`; it
/// may carry a password) is used to connect and is never printed: not in errors, not in
/// `Debug`.
///
/// ```no_run
/// use llm_bulkhead::cluster::{ClusterConfig, RedisStore};
/// let store = RedisStore::open("redis://:secret@127.0.0.1:6379/", &ClusterConfig::new("gw", "openai"))?;
/// assert!(!format!("{store:?}").contains("secret"));
/// # Ok::<(), llm_bulkhead::cluster::StoreError>(())
/// ```
pub struct RedisStore {
    client: redis::Client,
    conn: Option<redis::Connection>,
    keys: [String; 2],
    old_meta: String,
    script: redis::Script,
    timeout: Duration,
    call_timeout: Duration,
    round_trips: u64,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("keys", &self.keys)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl RedisStore {
    /// A store for `config`'s budget at `url`. Connects lazily (at the first call), so a
    /// server that is down now is not an error here.
    ///
    /// # Errors
    /// [`StoreError::InvalidUrl`].
    ///
    /// ```
    /// use llm_bulkhead::cluster::{ClusterConfig, RedisStore, StoreError};
    /// let e = RedisStore::open("http://user:pw@host/", &ClusterConfig::new("a", "b")).unwrap_err();
    /// assert_eq!(e, StoreError::InvalidUrl);
    /// assert!(!e.to_string().contains("pw"));
    /// ```
    pub fn open(url: &str, config: &ClusterConfig) -> Result<Self, StoreError> {
        let client = redis::Client::open(url).map_err(|_| StoreError::InvalidUrl)?;
        let base = format!("llm-bulkhead:{{{}/{}}}", config.namespace, config.budget);
        Ok(RedisStore {
            client,
            conn: None,
            keys: [format!("{base}:v2:meta"), format!("{base}:v2:leases")],
            old_meta: format!("{base}:v1:meta"),
            script: redis::Script::new(SOURCE),
            timeout: Duration::from_millis(500),
            call_timeout: Duration::from_millis(500),
            round_trips: 0,
        })
    }

    /// With another timeout for connecting, reading and writing (default 500 ms). Set it well
    /// below the TTL: a renewal that takes longer leaves less of the lease.
    ///
    /// ```
    /// # use llm_bulkhead::cluster::{ClusterConfig, RedisStore};
    /// # use std::time::{Duration, Instant};
    /// let s = RedisStore::open("redis://127.0.0.1/", &ClusterConfig::new("a", "b")).unwrap()
    ///     .with_timeout(Duration::from_millis(100));
    /// # let _ = s;
    /// ```
    #[must_use]
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self.call_timeout = timeout;
        self
    }

    /// The keys this store writes (meta, leases).
    ///
    /// ```
    /// # use llm_bulkhead::cluster::{ClusterConfig, RedisStore};
    /// let s = RedisStore::open("redis://127.0.0.1/", &ClusterConfig::new("gw", "x")).unwrap();
    /// assert_eq!(s.keys()[0], "llm-bulkhead:{gw/x}:v2:meta");
    /// ```
    #[must_use]
    pub fn keys(&self) -> &[String; 2] {
        &self.keys
    }

    /// Commands sent to the server so far (connection set-up, version check, script load and
    /// every `EVALSHA`): the store traffic this replica causes.
    ///
    /// ```
    /// # use llm_bulkhead::cluster::{ClusterConfig, RedisStore};
    /// assert_eq!(RedisStore::open("redis://127.0.0.1/", &ClusterConfig::new("a", "b")).unwrap().round_trips(), 0);
    /// ```
    #[must_use]
    pub fn round_trips(&self) -> u64 {
        self.round_trips
    }

    /// The connection, opened and checked (server version ≥ 5.0) if there is none.
    /// The connection, opened and checked (server version ≥ 5.0, script loaded) if there is
    /// none; every step bounded by what is left until `deadline`.
    fn connection(&mut self, deadline: Instant) -> Result<(), StoreError> {
        if self.conn.is_some() {
            return Ok(());
        }
        // The client's connect waits its timeout for the socket and again for each reply of
        // its set-up pipeline (CLIENT SETINFO twice, AUTH, SELECT): a quarter of what is left
        // keeps the whole connect inside the deadline against a server that stopped answering.
        let mut conn = self
            .client
            .get_connection_with_timeout(left(deadline)? / 4)
            .map_err(map_error)?;
        self.round_trips += 3;
        bound(&conn, deadline)?;
        let info: String = redis::cmd("INFO")
            .arg("server")
            .query(&mut conn)
            .map_err(map_error)?;
        check_version(&info)?;
        // Loaded here, inside the deadline, so that the call's EVALSHA does not meet NOSCRIPT
        // (which would cost two more round trips, each with the whole timeout).
        bound(&conn, deadline)?;
        // By hand rather than `Script::load`, which only debug-asserts the server's hash (a
        // panic in a debug build, nothing in a release one): a server that names another hash
        // is not running this script.
        let hash: String = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(SOURCE)
            .query(&mut conn)
            .map_err(map_error)?;
        if hash != self.script.get_hash() {
            return Err(StoreError::Protocol(
                "SCRIPT LOAD answered another hash".into(),
            ));
        }
        self.conn = Some(conn);
        Ok(())
    }

    fn call(
        &mut self,
        op: &str,
        p: &StoreParams,
        req: &RenewRequest,
    ) -> Result<redis::Value, StoreError> {
        // One deadline for the whole call: connect, version check, script load and EVALSHA.
        let deadline = Instant::now() + self.call_timeout;
        self.connection(deadline)?;
        let conn = self.conn.as_mut().ok_or(StoreError::Partitioned)?;
        if let Err(e) = bound(conn, deadline) {
            self.conn = None;
            return Err(e);
        }
        let mut inv = self.script.prepare_invoke();
        inv.key(&self.keys[0])
            .key(&self.keys[1])
            .key(&self.old_meta)
            .arg(op)
            .arg(FORMAT);
        for n in [
            p.global.slots,
            p.global.tokens,
            p.floor.slots,
            p.floor.tokens,
            p.ttl_ms,
            p.quarantine_ms,
        ] {
            inv.arg(n);
        }
        inv.arg(&req.replica);
        let (a, h, w) = (req.applied, req.held, req.wants);
        for n in [
            a.slots, a.tokens, h.slots, h.tokens, w.slots, w.tokens, req.epoch, req.seq,
        ] {
            inv.arg(n);
        }
        let (classes, uses) = class_args(p, req);
        inv.arg(classes).arg(uses);
        let r = inv.invoke::<redis::Value>(conn);
        self.round_trips += 1;
        r.map_err(|e| {
            // A connection that failed once is not trusted again: a late reply, or the rest of a
            // reply cut in two (a parse error, not an I/O one), could be read as the answer to
            // the next request. Only the script's own typed refusals leave it in step.
            if !e.code().is_some_and(|c| c.starts_with("LLMBH_")) {
                self.conn = None;
            }
            map_error(e)
        })
    }
}

/// The class parameters and the class reports as the script reads them.
fn class_args(p: &StoreParams, req: &RenewRequest) -> (String, String) {
    let classes: Vec<String> = p
        .classes
        .iter()
        .map(|c| {
            let (f, x, m) = (c.floor, c.ceiling, c.min);
            format!(
                "{},{},{},{},{},{},{}",
                c.name, f.slots, f.tokens, x.slots, x.tokens, m.slots, m.tokens
            )
        })
        .collect();
    let uses: Vec<String> = req
        .classes
        .iter()
        .map(|u| {
            let (f, x, h, w) = (u.applied.floor, u.applied.ceiling, u.held, u.wants);
            format!(
                "{}:{}:{}:{}:{}:{}:{}:{}:{}",
                u.name, f.slots, f.tokens, x.slots, x.tokens, h.slots, h.tokens, w.slots, w.tokens
            )
        })
        .collect();
    (classes.join(";"), uses.join(";"))
}

/// What is left until `deadline` (at least 1 ms), or a timeout if nothing is.
fn left(deadline: Instant) -> Result<Duration, StoreError> {
    let d = deadline.saturating_duration_since(Instant::now());
    if d < Duration::from_millis(1) {
        return Err(StoreError::Unreachable("timed out".into()));
    }
    Ok(d)
}

/// Sets the connection's read and write timeouts to what is left until `deadline`.
fn bound(conn: &redis::Connection, deadline: Instant) -> Result<(), StoreError> {
    let t = Some(left(deadline)?);
    conn.set_read_timeout(t).map_err(map_error)?;
    conn.set_write_timeout(t).map_err(map_error)
}

/// Refuses servers before 5.0 (scripts not replicated as effects by default, so `TIME` before a
/// write is unsafe there).
fn check_version(info: &str) -> Result<(), StoreError> {
    let v = info
        .lines()
        .find_map(|l| l.strip_prefix("redis_version:"))
        .map(str::trim)
        .unwrap_or("");
    let major: u32 = v
        .split('.')
        .next()
        .and_then(|m| m.parse().ok())
        .unwrap_or(0);
    if major < 5 {
        return Err(StoreError::OldServer(v.chars().take(20).collect()));
    }
    Ok(())
}

/// A [`StoreError`] from a client error, with the server's own words only (never the URL).
fn map_error(e: redis::RedisError) -> StoreError {
    let detail = || {
        e.detail()
            .unwrap_or("")
            .chars()
            .take(120)
            .collect::<String>()
    };
    match e.code() {
        Some("LLMBH_REFUSED") => {
            let a = match e.detail().unwrap_or("") {
                "ConfigMismatch" => AllocError::ConfigMismatch,
                "AboveGlobal" => AllocError::AboveGlobal,
                "TooManyReplicas" => AllocError::TooManyReplicas,
                "NotDrained" => AllocError::NotDrained,
                "UnknownClass" => AllocError::UnknownClass,
                "AboveClassLimit" => AllocError::AboveClassLimit,
                _ => return StoreError::Protocol(detail()),
            };
            return StoreError::Refused(a);
        }
        Some("LLMBH_CORRUPT") => return StoreError::Corrupt(detail()),
        Some("LLMBH_FOREIGN") => return StoreError::Foreign(detail()),
        Some("LLMBH_BADARG") => return StoreError::Protocol(detail()),
        _ => {}
    }
    if e.is_timeout() {
        return StoreError::Unreachable("timed out".into());
    }
    if e.is_io_error() || e.is_connection_dropped() {
        return StoreError::Unreachable("connection failed".into());
    }
    match e.kind() {
        redis::ErrorKind::AuthenticationFailed => {
            StoreError::Unreachable("authentication failed".into())
        }
        redis::ErrorKind::Server(_) | redis::ErrorKind::Extension => {
            let code = e
                .code()
                .unwrap_or("ERR")
                .chars()
                .take(30)
                .collect::<String>();
            StoreError::ScriptRefused(format!("{code} {}", detail()))
        }
        _ => StoreError::Protocol(e.category().chars().take(60).collect()),
    }
}

/// The script's renewal reply, checked: six integers and four per class, a grant within the
/// global limits and class grants within the class limits.
fn parse_renew(v: &redis::Value, p: &StoreParams) -> Result<RenewReply, StoreError> {
    let bad = || StoreError::Protocol("renew reply".into());
    let redis::Value::Array(items) = v else {
        return Err(bad());
    };
    let n: Vec<u64> = items
        .iter()
        .map(int)
        .collect::<Option<_>>()
        .ok_or_else(bad)?;
    if n.len() != 6 + 4 * p.classes.len() {
        return Err(bad());
    }
    let [gs, gt, epoch, seq, now_ms, learning] = n[..6] else {
        return Err(bad());
    };
    let granted = Amounts::new(gs, gt);
    // Never more than the global limits, whatever the server says.
    if !granted.fits_in(p.global) || learning > 1 {
        return Err(bad());
    }
    let classes: Vec<ClassShare> = n[6..]
        .chunks_exact(4)
        .map(|g| ClassShare {
            floor: Amounts::new(g[0], g[1]),
            ceiling: Amounts::new(g[2], g[3]),
        })
        .collect();
    // Nor more than the class limits (a ceiling at the global limit: the global limits).
    let within = classes
        .iter()
        .zip(&p.classes)
        .all(|(g, c)| g.floor.fits_in(c.floor) && g.ceiling.fits_in(c.ceiling));
    if !within {
        return Err(bad());
    }
    Ok(RenewReply {
        granted,
        epoch,
        seq,
        now_ms,
        learning: learning == 1,
        classes,
    })
}

fn int(v: &redis::Value) -> Option<u64> {
    match v {
        redis::Value::Int(n) => u64::try_from(*n).ok(),
        _ => None,
    }
}

impl LeaseStore for RedisStore {
    fn renew(&mut self, p: &StoreParams, req: &RenewRequest) -> Result<RenewReply, StoreError> {
        let v = self.call("renew", p, req)?;
        let reply = parse_renew(&v, p);
        if reply.is_err() {
            // A reply of the wrong shape may be another request's: the connection is out of
            // step.
            self.conn = None;
        }
        reply
    }

    fn set_call_timeout(&mut self, timeout: Duration) {
        self.call_timeout = timeout.clamp(Duration::from_millis(1), self.timeout);
    }

    fn release(&mut self, p: &StoreParams, req: &RenewRequest) -> Result<(), StoreError> {
        match self.call("release", p, req)? {
            redis::Value::Int(0) => Ok(()),
            _ => {
                self.conn = None;
                Err(StoreError::Protocol("release reply".into()))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn servers_before_5_are_refused() {
        let info = |v: &str| format!("# Server\r\nredis_version:{v}\r\nredis_mode:standalone\r\n");
        assert_eq!(
            check_version(&info("4.0.14")),
            Err(StoreError::OldServer("4.0.14".into()))
        );
        assert!(check_version(&info("5.0.0")).is_ok());
        assert!(check_version(&info("7.0.15")).is_ok());
        assert!(matches!(
            check_version("garbage"),
            Err(StoreError::OldServer(_))
        ));
    }
}
