//! The store's conformance suite: the same behavioural tests against PostgreSQL, SQLite and the
//! simulation store (see `harness.rs`). PostgreSQL tests need `REINS_TEST_PG`.

mod dormant;
mod events;
mod fencing;
mod harness;
mod leases;
mod notify;
mod operators;
mod retries;
mod runs;
mod sent_events;
mod storage;
mod users;
mod workflows;
