//! The words (layer 2): the packed atomic state words and the limits they are read against.
//! The no-class state word (`state`), the limits snapshot and its ring (`limits`), the class
//! table (`classes`). They know no protocol: the protocols that change them are in
//! `crate::protocol`.

pub(crate) mod class_word;
pub(crate) mod classes;
pub(crate) mod floors;
pub(crate) mod limits;
pub(crate) mod state;
