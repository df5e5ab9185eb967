//! Generated protocol code (filled in by the protocol work).
