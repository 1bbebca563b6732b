//! A Redis server for the cluster tests: the one `.ci/run` started (its URL in
//! `LLM_BULKHEAD_REDIS_URL`), or a private `redis-server` on a Unix socket in a temporary
//! directory with no persistence, started here and killed on drop. Without either the test
//! prints why and skips, except under CI (`CI` set), where it fails.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Server {
    pub url: String,
    child: Option<Child>,
    dir: Option<PathBuf>,
}

impl Server {
    /// The shared server if `.ci/run` gave one, else a private one.
    pub fn get(test: &str) -> Option<Server> {
        if let Ok(url) = std::env::var("LLM_BULKHEAD_REDIS_URL") {
            return Some(Server {
                url,
                child: None,
                dir: None,
            });
        }
        Server::private(test)
    }

    /// A private server (always; for tests that restart it).
    pub fn private(test: &str) -> Option<Server> {
        let dir = std::env::temp_dir().join(format!("llmbh-redis-{}-{test}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut s = Server {
            url: format!("redis+unix://{}", dir.join("redis.sock").display()),
            child: None,
            dir: Some(dir),
        };
        match s.start() {
            Ok(()) => Some(s),
            Err(why) if std::env::var_os("CI").is_some() => {
                panic!("CI needs redis-server for the cluster tests: {why}")
            }
            Err(why) => {
                eprintln!("SKIPPED ({test}): no Redis: {why}");
                None
            }
        }
    }

    fn start(&mut self) -> Result<(), String> {
        let dir = self.dir.clone().ok_or("not a private server")?;
        let sock = dir.join("redis.sock");
        let _ = std::fs::remove_file(&sock);
        let child = Command::new("redis-server")
            .args(["--port", "0", "--unixsocket"])
            .arg(&sock)
            .args(["--save", "", "--appendonly", "no", "--dir"])
            .arg(&dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("redis-server: {e}"))?;
        self.child = Some(child);
        // Bounded wait for the socket to answer.
        let until = Instant::now() + Duration::from_secs(10);
        while Instant::now() < until {
            if let Ok(mut c) =
                redis::Client::open(self.url.as_str()).and_then(|c| c.get_connection())
            {
                if redis::cmd("PING").query::<String>(&mut c).is_ok() {
                    return Ok(());
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Err("redis-server did not answer within 10 s".into())
    }

    /// Kills a private server (SIGKILL: no save) and starts it again empty.
    pub fn restart(&mut self) {
        self.kill();
        self.start().unwrap();
    }

    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn conn(&self) -> redis::Connection {
        redis::Client::open(self.url.as_str())
            .unwrap()
            .get_connection()
            .unwrap()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
        if let Some(d) = self.dir.take() {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

/// A namespace no other test (or earlier run on a shared server) uses.
pub fn namespace(test: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!("t{}-{nanos}-{test}", std::process::id())
}

/// Short timings for the cluster tests and figures: `ttl_ms`, admissions of at most 200 ms, a
/// floor of one slot and 100 tokens held 100 ms, and the shortest quarantine `validate` accepts.
pub fn quick_config(ns: &str, ttl_ms: u64) -> llm_bulkhead::cluster::ClusterConfig {
    use llm_bulkhead::cluster::{Amounts, ClusterConfig};
    let c = ClusterConfig::new(ns, "b")
        .ttl(Duration::from_millis(ttl_ms))
        .max_admission(Duration::from_millis(200))
        .floor(Amounts::new(1, 100))
        .floor_hold(Duration::from_millis(100));
    let q = c.needed_quarantine_ms();
    c.quarantine(Duration::from_millis(q))
}
