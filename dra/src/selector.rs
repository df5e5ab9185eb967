//! CEL device selectors.
