//! The one integration-test binary of reins. Every test starts what it needs for real: a
//! database of its own (SQLite in a temp folder, or a fresh database in the PostgreSQL cluster that
//! `tests/run-all.sh` starts), and the real `reins` binary on loopback.

mod harness;

mod agent_approvals;
mod agent_confinement;
mod agent_processes;
mod api_fuzz;
mod bad_config;
mod call_kinds;
mod cancel_crash;
mod chaos;
mod child_runs;
mod cli;
mod cluster;
mod command_agent;
mod console;
mod crash_recovery;
mod disk_full;
mod docs;
mod dormant;
mod events;
mod faults;
mod fencing;
mod http_api;
mod http_client;
mod http_edge;
mod listing;
mod memory;
mod migrations;
mod newcomer;
mod node_files;
mod node_process;
mod notify;
mod openai_agent;
mod operators;
mod paging;
mod parked;
mod partition;
mod people;
mod private_pg;
mod retries;
mod retry;
mod runs_store;
mod scripts;
mod stale_owner;
mod storage;
mod users;
mod waiting;
mod waits;
mod wake;
mod webdriver;
mod workflows;
