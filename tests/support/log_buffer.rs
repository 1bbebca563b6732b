//! A `tracing` writer that keeps what it is given, for tests that read their log lines.
#![allow(dead_code)]

use std::sync::{Arc, Mutex};

/// A log sink shared by its clones: give one clone to the subscriber, read the other.
#[derive(Clone, Default)]
pub struct Buffer(pub Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Buffer {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
