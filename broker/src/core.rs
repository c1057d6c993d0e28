//! Pure replication state machines (being built).
