//! An SDK-style client over the coordinator: two providers, `primary` and `backup`. The
//! primary answers its first call with 429 and `Retry-After: 1`; the client parses the header
//! and puts the primary in cooldown; its queued calls wait (without a busy loop) and start
//! when the second is over, while the backup keeps serving. The providers are simulated in
//! process (no network). Runs in about a second:
//!
//! ```text
//! cargo run --example coordinator --features coordinator
//! ```

use llm_bulkhead::coordinator::{
    parse_retry_after, AdmissionError, Coordinator, CoordinatorError, ProviderLimits, SubmitOptions,
};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

/// A provider's answer: a completion, or 429 with a `Retry-After` header value.
enum Answer {
    Ok(String),
    TooManyRequests { retry_after: String },
}

/// A simulated provider: `rate_limited_calls` first calls answer 429.
struct FakeProvider {
    name: &'static str,
    rate_limited_calls: AtomicU32,
}

impl FakeProvider {
    fn call(&self, prompt: &str) -> Answer {
        let left = self.rate_limited_calls.load(Ordering::SeqCst);
        if left > 0
            && self
                .rate_limited_calls
                .compare_exchange(left, left - 1, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
        {
            return Answer::TooManyRequests {
                retry_after: "1".into(),
            };
        }
        std::thread::sleep(Duration::from_millis(20)); // the model thinks
        Answer::Ok(format!("{} answered {prompt:?}", self.name))
    }
}

// The fields are read through `Debug` (printed on failure), which dead-code analysis ignores.
#[allow(dead_code)]
#[derive(Debug)]
enum ClientError {
    /// Admission refused the call (overflow, timeout, close): not a provider failure.
    Admission(AdmissionError),
    /// The provider answered 429 (the client recorded its cooldown).
    RateLimited(Duration),
}

/// The SDK-style client: every call goes through the coordinator.
struct Client {
    coordinator: Coordinator,
    providers: Vec<Arc<FakeProvider>>,
    started: Instant,
}

impl Client {
    fn complete(
        &self,
        provider: &str,
        conversation: &str,
        prompt: &str,
    ) -> Result<String, ClientError> {
        let p = self
            .providers
            .iter()
            .find(|p| p.name == provider)
            .expect("known provider");
        let options = SubmitOptions {
            admission_timeout: Some(Duration::from_secs(5)),
            attempt_timeout: Some(Duration::from_secs(30)),
        };
        let ticket = self
            .coordinator
            .submit(provider, conversation, options)
            .map_err(|e| match e {
                CoordinatorError::Admission(a) => ClientError::Admission(a),
                other => panic!("bad input: {other}"),
            })?;
        // One conversation runs one call at a time (its key); the provider's slot is held
        // until the call returns (the invocation's drop is the `finally`).
        let invocation = ticket.wait_blocking().map_err(ClientError::Admission)?;
        let at = self.started.elapsed().as_millis();
        match p.call(prompt) {
            Answer::Ok(text) => {
                println!("{at:>5} ms  {provider:<8} {conversation:<6} ok");
                Ok(text)
            }
            Answer::TooManyRequests { retry_after } => {
                let delay = parse_retry_after(&retry_after, SystemTime::now())
                    .unwrap_or(Duration::from_secs(1));
                // Only ever extends the provider's not-before time.
                self.coordinator
                    .cooldown(provider, delay)
                    .expect("known provider");
                println!("{at:>5} ms  {provider:<8} {conversation:<6} 429, Retry-After: {retry_after} -> cooldown {delay:?}");
                drop(invocation);
                Err(ClientError::RateLimited(delay))
            }
        }
    }
}

fn main() {
    let coordinator: Coordinator = Coordinator::builder()
        .client_limit(4)
        .queue_cap(32)
        .provider(
            "primary",
            ProviderLimits {
                limit: Some(2),
                min_interval: Duration::from_millis(10),
            },
        )
        .provider(
            "backup",
            ProviderLimits {
                limit: Some(2),
                min_interval: Duration::ZERO,
            },
        )
        .build()
        .expect("valid limits");
    let client = Arc::new(Client {
        coordinator: coordinator.clone(),
        providers: vec![
            Arc::new(FakeProvider {
                name: "primary",
                rate_limited_calls: AtomicU32::new(1),
            }),
            Arc::new(FakeProvider {
                name: "backup",
                rate_limited_calls: AtomicU32::new(0),
            }),
        ],
        started: Instant::now(),
    });
    // The first primary call gets the 429 before the other callers arrive.
    let first = client.complete("primary", "conv-0", "hello");
    assert!(
        matches!(first, Err(ClientError::RateLimited(_))),
        "{first:?}"
    );
    let s = coordinator.snapshot();
    println!(
        "          primary cooling until {:?} (now {:?})",
        s.providers[0].cooling_until, s.now
    );

    let threads: Vec<_> = (0..6)
        .map(|i| {
            let client = client.clone();
            std::thread::spawn(move || {
                let provider = if i % 2 == 0 { "primary" } else { "backup" };
                client.complete(provider, &format!("conv-{}", i + 1), "tell me a story")
            })
        })
        .collect();
    let mut ok = 0;
    for t in threads {
        match t.join().unwrap() {
            Ok(_) => ok += 1,
            Err(e) => println!("          failed: {e:?}"),
        }
    }
    let s = coordinator.snapshot();
    println!(
        "          {ok} of 6 calls answered; at rest: {} in flight, {} queued",
        s.client_in_flight,
        s.queue.len()
    );
    assert_eq!(ok, 6);
    assert_eq!((s.client_in_flight, s.queue.len()), (0, 0));
}
