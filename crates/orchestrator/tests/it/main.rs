//! Service integration tests: a real server on port 0, real script
//! processes, real storage on disk. One test binary, one module per area.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

mod auth;
mod backends;
mod backup;
mod cli;
<<<<<<< HEAD
mod dashboard;
=======
mod doctor;
>>>>>>> 44d68dc (Tests: storage-level backups (record for record, cross-backend, damaged/altered/foreign/newer archives, a store that never settles), readiness and the journal token line, doctor; POST /backup answers 409 for a store that keeps changing; api.md)
mod errors;
mod fakes;
mod faults;
mod harness;
mod http;
mod live;
mod migrate;
mod operations;
mod provisioning;
mod reruns;
mod restart;
<<<<<<< HEAD
mod schedules;
=======
mod systemd;
>>>>>>> 44d68dc (Tests: storage-level backups (record for record, cross-backend, damaged/altered/foreign/newer archives, a store that never settles), readiness and the journal token line, doctor; POST /backup answers 409 for a store that keeps changing; api.md)
mod tasks;
mod upgrades;
mod workflows;
