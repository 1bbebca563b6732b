//! The public handles (layer 7): `Bulkhead` (builder, decisions, reconfiguration), the
//! `Admission` guard, and the advisory decision.

pub(crate) mod admission;
pub(crate) mod advice;
pub(crate) mod builder;
pub(crate) mod bulkhead;
pub(crate) mod events;
