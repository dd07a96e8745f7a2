//! Model sources for tests and the demo, on loopback, that the **real** download clients talk to.
//! Each is a simulation of a public service (named so in its documentation) that reproduces what
//! the clients rely on, counts the bytes it serves (the "download once" number) and can be
//! rate-limited to play a WAN link.
//!
//! - [`hub`]: a Hugging Face Hub simulation for `hf download` (`HF_ENDPOINT`), with generated
//!   model repositories ([`hub::model_files`]), branches, tags that can be moved, gated
//!   repositories;
//! - [`content`]: deterministic generated file contents (any byte range on demand).
//!
//! `hub-sim` (this crate's binary) serves a Hub from the command line.

pub mod content;
pub mod hub;
