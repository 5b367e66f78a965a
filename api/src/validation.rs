//! Validation table (filled in below).
