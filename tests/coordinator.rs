//! Coordinator tests (fake clocks), one per seed sentence.
