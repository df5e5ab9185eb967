//! (filled in by the scheduling-core / simulator work)
