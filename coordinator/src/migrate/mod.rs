//! `tessera-coordinator migrate`: another scheduler's objects read from files or a cluster
//! and printed as Tessera's, with what does not carry over said beside each. `kai.rs` is the
//! pure translation of KAI Scheduler's Queue, PodGroup and pods; `source.rs` reads the
//! documents (multi-document YAML files, `List`s, or KAI's objects and pods in a cluster).

pub mod kai;
pub mod source;
