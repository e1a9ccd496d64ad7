//! longhaul-quic's integration tests, one binary: sessions over real QUIC on
//! loopback (scripted or hostile peers, races between the control stream
//! and the data streams) and the `wan` controller against a simulated
//! bottleneck. The deterministic tests of the session cores are unit tests
//! (`src/core/*_sim.rs`).

mod common;
mod flood;
mod fresh;
mod hostile;
mod jumbo;
mod placement_error;
mod settle_race;
mod wan_sim;
