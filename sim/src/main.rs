//! `quire-sim`: runs seeds of the deterministic simulation and reports every rule broken,
//! with the command that replays it.
//!
//! ```text
//! quire-sim --seeds 10000                      # seeds 0..10000, safety mode, every core
//! quire-sim --seeds 200000 --jobs 2            # a long campaign on 2 threads
//! quire-sim --seeds 2000 --mode liveness
//! quire-sim --seed 1234 --trace                # replay one seed, print its trace
//! quire-sim --mutate through-end --seeds 5000 --until-violation
//! quire-sim --mutate all --seeds 10000         # each mutation: the first seed that finds it
//! ```

use std::process::ExitCode;
use std::str::FromStr;

use clap::Parser;
use quire_sim::{
    default_jobs, run, run_seeds, Campaign, FaultSet, Mode, Mutation, RunReport, SimConfig,
};

/// Seeds of a campaign when `--seeds` is not given.
const SEEDS_DEFAULT: u64 = 100;
/// Seeds tried per mutation by `--mutate all` when `--seeds` is not given.
const MUTATION_SEEDS_DEFAULT: u64 = 10_000;

/// `--mutate`: one mutation by name, or `all` of them one after another.
#[derive(Clone, Copy, Debug)]
enum MutateArg {
    One(Mutation),
    All,
}

impl FromStr for MutateArg {
    type Err = String;
    fn from_str(s: &str) -> Result<MutateArg, String> {
        if s == "all" {
            Ok(MutateArg::All)
        } else {
            s.parse().map(MutateArg::One)
        }
    }
}

/// Deterministic simulation of a Quire cluster with the no-loss checker.
#[derive(Debug, Parser)]
#[command(name = "quire-sim", version)]
struct Args {
    /// Run exactly this seed (replay).
    #[arg(long, conflicts_with = "seeds")]
    seed: Option<u64>,
    /// Run this many seeds, from --base on (default 100; with `--mutate all`, the most
    /// seeds tried per mutation, default 10,000).
    #[arg(long)]
    seeds: Option<u64>,
    /// First seed of --seeds.
    #[arg(long, default_value_t = 0)]
    base: u64,
    /// safety (faults all the time) or liveness (faults stop; progress within a bound).
    #[arg(long, default_value = "safety")]
    mode: Mode,
    /// Switch a protocol rule off (test-only), by name (an unknown name is refused with
    /// the list), or `all`: for each mutation, run seeds until the first that finds it and
    /// print a table; fails if one is not found within --seeds.
    #[arg(long)]
    mutate: Option<MutateArg>,
    /// Let bit flips hit a store's last durable record (read as a torn tail by the WAL).
    #[arg(long)]
    tail_flips: bool,
    /// Retention drawn from the seed (checkpoint trims, store trims, `Trimmed` answers);
    /// known limits fail some liveness seeds (docs/testing.md)
    #[arg(long)]
    retention: bool,
    /// Crash new masters: each seed draws how often a broker crashes 1-60 ms after it
    /// becomes master (short-lived masters, partial writes; Raft's Figure 8)
    #[arg(long)]
    master_crashes: bool,
    /// Start from empty cluster files: the first master is bound by the real bootstrap
    /// probe
    #[arg(long)]
    bootstrap: bool,
    /// Consumers commit durable cursors and restart from them
    #[arg(long)]
    cursors: bool,
    /// Simulated ms per safety run.
    #[arg(long, default_value_t = SimConfig::default().duration_ms)]
    duration_ms: u64,
    /// Stop at the first seed that breaks a rule.
    #[arg(long)]
    until_violation: bool,
    /// Check only lost or wrong data, not the protocol invariants checked online.
    #[arg(long)]
    end_to_end_only: bool,
    /// Events per takeover fetch (default: drawn from the seed, 16..=256).
    #[arg(long)]
    fetch_events_max: Option<u32>,
    /// Print the trace of failing seeds (of the one seed with --seed).
    #[arg(long)]
    trace: bool,
    /// Threads the seeds are spread over (default: the machine's available parallelism).
    /// The failing seeds found do not depend on it.
    #[arg(long)]
    jobs: Option<usize>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let config = SimConfig {
        mode: args.mode,
        mutation: match args.mutate {
            Some(MutateArg::One(m)) => Some(m),
            Some(MutateArg::All) | None => None,
        },
        faults: FaultSet {
            tail_flips: args.tail_flips,
            retention: args.retention,
            master_crashes: args.master_crashes,
            bootstrap: args.bootstrap,
            cursors: args.cursors,
        },
        duration_ms: args.duration_ms,
        trace: args.trace,
        end_to_end_only: args.end_to_end_only,
        fetch_events_max: args.fetch_events_max,
        ..SimConfig::default()
    };
    let jobs = args.jobs.unwrap_or_else(default_jobs).max(1);
    if let Some(seed) = args.seed {
        let report = run(seed, &config);
        print_report(&report, &config, true);
        println!(
            "seed {seed}: {} ({} events, {} messages acked, {} checked, trace hash {:016x})",
            if report.passed() { "ok" } else { "VIOLATION" },
            report.stats.events,
            report.stats.messages_acked,
            report.stats.messages_checked,
            report.trace_hash
        );
        return if report.passed() {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        };
    }
    if matches!(args.mutate, Some(MutateArg::All)) {
        let seeds = args.seeds.unwrap_or(MUTATION_SEEDS_DEFAULT);
        return find_mutations(&config, args.base..args.base + seeds, jobs);
    }
    let seeds = args.seeds.unwrap_or(SEEDS_DEFAULT);
    let trace = args.trace;
    let campaign = run_seeds(
        &config,
        args.base..args.base + seeds,
        jobs,
        args.until_violation,
        &|r: &RunReport| eprintln!("seed {} failed (report at the end)", r.seed),
    );
    for r in &campaign.failures {
        print_report(r, &config, trace);
    }
    print_summary(&campaign, &config, args.base, jobs);
    if let Some(first) = campaign.first_failure() {
        println!("first failing seed: {first}");
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// `--mutate all`: for each mutation the simulation knows, the first seed of `seeds` that
/// breaks a rule with it on; fails if one of them breaks none.
fn find_mutations(base: &SimConfig, seeds: std::ops::Range<u64>, jobs: usize) -> ExitCode {
    let mut rows = Vec::new();
    for m in Mutation::ALL {
        let config = SimConfig {
            mutation: Some(m),
            ..base.clone()
        };
        let c = run_seeds(&config, seeds.clone(), jobs, true, &|_: &RunReport| {});
        let found = c.failures.first().map(|r| {
            let kinds: Vec<String> = r.violations.iter().map(ToString::to_string).collect();
            (r.seed, kinds.join("; "))
        });
        match &found {
            Some((seed, what)) => println!(
                "{m}: found at seed {seed} after {} seeds ({:.1} s): {what}",
                seed - seeds.start + 1,
                c.wall.as_secs_f64()
            ),
            None => println!(
                "{m}: NOT FOUND in {} seeds ({:.1} s, the mutation changed {} steps)",
                c.seeds_run,
                c.wall.as_secs_f64(),
                c.stats.mutated
            ),
        }
        rows.push((m, found.map(|(seed, _)| seed), c.wall));
    }
    println!();
    println!("| mutation | first seed | seeds tried | wall s |");
    println!("| --- | --- | --- | --- |");
    let mut missing = 0;
    for (m, first, wall) in &rows {
        match first {
            Some(seed) => println!(
                "| `{m}` | {seed} | {} | {:.1} |",
                seed - seeds.start + 1,
                wall.as_secs_f64()
            ),
            None => {
                missing += 1;
                println!(
                    "| `{m}` | not found | {} | {:.1} |",
                    seeds.end - seeds.start,
                    wall.as_secs_f64()
                );
            }
        }
    }
    if missing == 0 {
        println!("every mutation found (mode {:?}, jobs {jobs})", base.mode);
        ExitCode::SUCCESS
    } else {
        println!("{missing} of {} mutations not found", Mutation::ALL.len());
        ExitCode::FAILURE
    }
}

fn print_summary(c: &Campaign, config: &SimConfig, base: u64, jobs: usize) {
    let stats = &c.stats;
    println!(
        "mode {:?}{}: {} seeds from {base}, {} failed, {:.1} s wall on {jobs} threads, {:.0} seeds/s, {:.0} simulated s per wall s",
        config.mode,
        config
            .mutation
            .map(|m| format!(", mutation {m}"))
            .unwrap_or_default(),
        c.seeds_run,
        c.failures.len(),
        c.wall.as_secs_f64(),
        c.seeds_per_s(),
        c.simulated_per_wall_s()
    );
    println!(
        "  batches {} (ok {}, unknown {}, failed {}), messages acked {}, messages checked {}, stabilized offsets {}",
        stats.batches,
        stats.batches_ok,
        stats.batches_unknown,
        stats.batches_failed,
        stats.messages_acked,
        stats.messages_checked,
        stats.stabilized
    );
    println!(
        "  masters elected {}, broker crashes {} pauses {}, store crashes {} pauses {} wipes {} (replaced {}), bit flips {}, tail cuts {}, fsync EIO {}, ENOSPC {}, partitions {}, handoffs {} (done {}, failed {})",
        stats.masters,
        stats.broker_crashes,
        stats.broker_pauses,
        stats.store_crashes,
        stats.store_pauses,
        stats.store_wipes,
        stats.replacements,
        stats.bit_flips,
        stats.tail_cuts,
        stats.fsync_eio,
        stats.enospc,
        stats.partitions,
        stats.handoffs,
        stats.handoffs_done,
        stats.handoffs_failed
    );
    println!(
        "  retention: store trims {}, checkpoint parts stabilized {}, messages consumed {} (superseded copies {}), fetches answered trimmed {}; cursor commits acked {}, consumer restarts {}",
        stats.store_trims,
        stats.checkpoint_parts,
        stats.messages_consumed,
        stats.superseded_reads,
        stats.fetches_trimmed,
        stats.cursor_commits_acked,
        stats.consumer_restarts
    );
    println!(
        "  events {}, messages delivered {} dropped {} duplicated {}, mutated steps {}",
        stats.events,
        stats.messages_delivered,
        stats.messages_dropped,
        stats.messages_duplicated,
        stats.mutated
    );
}

fn print_report(report: &RunReport, config: &SimConfig, trace: bool) {
    if trace {
        for line in &report.trace {
            println!("{line}");
        }
    }
    if report.passed() {
        return;
    }
    println!("seed {} FAILED ({})", report.seed, report.setup);
    for v in &report.violations {
        println!("  {v}");
    }
    println!("  replay: {} --trace", config.replay_command(report.seed));
}
