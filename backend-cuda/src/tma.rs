//! TMA tensor maps (being written).
