//! The Redis store does not reuse a connection that answered out of step. A fake server on
//! loopback (a few lines of RESP) answers the first renewal with a reply of the wrong shape, as
//! the rest of an earlier reply would look after a reply cut in two: the store reports a
//! protocol error and its next renewal opens a new connection, so it cannot read another
//! request's answer as its own.

use llm_bulkhead::cluster::{
    Amounts, ClusterConfig, LeaseStore, RedisStore, RenewRequest, StoreError,
};
use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Reads one RESP command (an array of bulk strings); `None` at the end of the stream.
fn command(r: &mut impl BufRead) -> Option<Vec<String>> {
    let mut line = String::new();
    r.read_line(&mut line).ok().filter(|&n| n > 0)?;
    let n: usize = line.trim().strip_prefix('*')?.parse().ok()?;
    let mut parts = Vec::with_capacity(n);
    for _ in 0..n {
        line.clear();
        r.read_line(&mut line).ok()?;
        let len: usize = line.trim().strip_prefix('$')?.parse().ok()?;
        let mut buf = vec![0; len + 2];
        r.read_exact(&mut buf).ok()?;
        buf.truncate(len);
        parts.push(String::from_utf8_lossy(&buf).into_owned());
    }
    Some(parts)
}

/// The script's hash, as a real server answers `SCRIPT LOAD`.
fn hash() -> String {
    let source = include_str!("../src/cluster/lease.lua");
    redis::Script::new(source).get_hash().to_string()
}

/// A fake server: connection `k` (from 1) answers every `EVALSHA` with `reply(k)` and
/// `SCRIPT LOAD` with `sha`.
fn fake(reply: fn(usize) -> String, sha: String) -> (String, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("redis://{}/", listener.local_addr().unwrap());
    let conns = Arc::new(AtomicUsize::new(0));
    let counter = conns.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().map_while(Result::ok) {
            let k = counter.fetch_add(1, Ordering::SeqCst) + 1;
            let sha = sha.clone();
            std::thread::spawn(move || {
                let mut w = stream.try_clone().unwrap();
                let mut r = BufReader::new(stream);
                while let Some(cmd) = command(&mut r) {
                    let name = cmd
                        .first()
                        .map(|c| c.to_ascii_uppercase())
                        .unwrap_or_default();
                    let answer = match name.as_str() {
                        "INFO" => {
                            let body = "# Server\r\nredis_version:7.0.15\r\n";
                            format!("${}\r\n{body}\r\n", body.len())
                        }
                        "SCRIPT" => format!("${}\r\n{sha}\r\n", sha.len()),
                        "EVALSHA" => reply(k),
                        _ => "+OK\r\n".to_string(),
                    };
                    if w.write_all(answer.as_bytes()).is_err() {
                        return;
                    }
                }
            });
        }
    });
    (url, conns)
}

#[test]
fn a_reply_out_of_step_drops_the_connection() {
    // Connection 1 answers with two integers (not the script's six); later ones correctly.
    let (url, conns) = fake(
        |k| {
            if k == 1 {
                "*2\r\n:1\r\n:2\r\n".to_string()
            } else {
                "*6\r\n:1\r\n:0\r\n:7\r\n:3\r\n:1000\r\n:0\r\n".to_string()
            }
        },
        hash(),
    );
    let config = ClusterConfig::new("desync", "b");
    let p = config.store_params(Amounts::new(4, 0));
    let mut store = RedisStore::open(&url, &config)
        .unwrap()
        .with_timeout(Duration::from_secs(5));
    let req = RenewRequest::new("r", Amounts::ZERO, Amounts::ZERO, Amounts::new(1, 0));
    assert!(matches!(
        store.renew(&p, &req),
        Err(StoreError::Protocol(_))
    ));
    let reply = store.renew(&p, &req).unwrap();
    assert_eq!(reply.granted, Amounts::new(1, 0));
    assert_eq!(
        conns.load(Ordering::SeqCst),
        2,
        "a new connection after the bad reply"
    );
}

/// A server that answers `SCRIPT LOAD` with another hash is not running the lease script: a
/// typed error, no connection kept, no panic (the client's own check is a debug assertion).
#[test]
fn a_server_naming_another_script_hash_is_refused() {
    let (url, conns) = fake(
        |_| "*6\r\n:1\r\n:0\r\n:7\r\n:3\r\n:1000\r\n:0\r\n".into(),
        "0".repeat(40),
    );
    let config = ClusterConfig::new("desync", "b");
    let p = config.store_params(Amounts::new(4, 0));
    let mut store = RedisStore::open(&url, &config).unwrap();
    let req = RenewRequest::new("r", Amounts::ZERO, Amounts::ZERO, Amounts::new(1, 0));
    for n in 1..=2 {
        assert!(matches!(
            store.renew(&p, &req),
            Err(StoreError::Protocol(_))
        ));
        assert_eq!(conns.load(Ordering::SeqCst), n);
    }
}
