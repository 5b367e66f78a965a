//! Cluster API v1beta2 types generated from CAPI's published CRDs, plus hand-written contract helpers.
