//! The VirtualMachine reconciler (placeholder, filled in below).
