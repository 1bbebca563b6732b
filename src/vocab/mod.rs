//! The vocabulary (layer 1): what a caller asks for and what it is told back. Demands and
//! reservations, rejections and their reasons, errors, admission ids. A leaf: it imports no
//! word, protocol, queue or handle.

pub(crate) mod class;
pub(crate) mod class_name;
pub(crate) mod demand;
pub(crate) mod error;
pub(crate) mod id;
pub(crate) mod never_fits;
pub(crate) mod rejection;
