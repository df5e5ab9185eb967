//! The simulator's integration tests, one binary with a module per area: the bundled sample
//! (`sim_sample`), the published openb numbers (`sim_fill`) and every decision against the
//! recorded digests (`exact_decisions`, digests in `golden/`).

mod exact_decisions;
mod sim_fill;
mod sim_sample;
