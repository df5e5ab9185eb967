//! Queue tree, water-filling fair share and DRF ordering.
