//! The `quire` command line. (Being built.)
fn main() {}
