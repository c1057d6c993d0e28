//! The voter-set model checker stays runnable and keeps its verdicts (issue 15 item 2):
//! `model/run_members.sh quick` replays the hand-built counterexamples (m1, m4, a snapshot of
//! unstabilized entries: each mutant breaks a property, the rules as built block the
//! scenario), finds the wipe and damage mutants' violations by search, and runs the smallest
//! original and extension configurations exhaustively, each of which must violate nothing
//! and reach its goal. The script checks every verdict and exits 1 on the first wrong one.
//! Plain Python 3, which CI has (it builds a virtual environment for the Kafka tests).

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use quire_tests::run_bounded;

/// The quick set takes about a CPU-minute; the bound leaves room for a loaded machine.
const RUN_BOUND: Duration = Duration::from_secs(600);

#[test]
fn the_membership_model_keeps_its_verdicts() {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../model/run_members.sh");
    let out = run_bounded(Command::new("sh").arg(&script).arg("quick"), RUN_BOUND);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    assert!(
        out.status.success(),
        "the model's verdicts changed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    // Eleven verdicts, each on a line of its own.
    assert_eq!(
        stdout.lines().filter(|l| l.starts_with("ok ")).count(),
        11,
        "{stdout}"
    );
}
