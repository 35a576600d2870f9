//! The `reins` binary's library: configuration, the HTTP control plane, and the composition root
//! that wires them to a node's actors. This is the only crate that knows HTTP and JSON wire shapes.

pub mod admin;
pub mod cli;
pub mod config;
pub mod console;
pub mod http;
pub mod serve;
