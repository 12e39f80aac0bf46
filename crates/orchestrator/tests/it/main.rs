//! Service integration tests: a real server on port 0, real script
//! processes, real storage on disk. One test binary, one module per area.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

mod approvals;
mod auth;
mod backends;
mod backup;
mod cli;
mod client;
mod compare;
mod conditions;
mod config;
mod dashboard;
mod doctor;
mod durability;
mod errors;
mod fakes;
mod faults;
mod harness;
mod http;
mod limits;
mod live;
mod locks;
mod migrate;
mod network;
mod operations;
mod provisioning;
mod reruns;
mod restart;
mod retention;
mod sandbox;
mod schedules;
mod secrets;
mod storage_moves;
mod systemd;
mod tasks;
mod testenv;
mod testenv_docker;
mod upgrades;
mod webhooks;
mod workflows;
