//! Integration tests of `tessera-dra`: one binary, a module per area.

mod differential;
