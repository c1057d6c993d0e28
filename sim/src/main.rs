//! `quire-sim`: runs seeds of the deterministic simulation and reports every rule broken,
//! with the seed that replays it.
//!
//! ```text
//! quire-sim --seeds 10000                      # seeds 0..10000, safety mode
//! quire-sim --seeds 2000 --mode liveness
//! quire-sim --seed 1234 --trace                # replay one seed, print its trace
//! quire-sim --mutate through-end --seeds 5000 --until-violation
//! ```

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use clap::Parser;
use quire_sim::{run, FaultSet, Mode, Mutation, RunReport, RunStats, SimConfig};

/// Deterministic simulation of a Quire cluster with the no-loss checker.
#[derive(Debug, Parser)]
#[command(name = "quire-sim", version)]
struct Args {
    /// Run exactly this seed (replay).
    #[arg(long, conflicts_with = "seeds")]
    seed: Option<u64>,
    /// Run this many seeds, from --base on.
    #[arg(long, default_value_t = 100)]
    seeds: u64,
    /// First seed of --seeds.
    #[arg(long, default_value_t = 0)]
    base: u64,
    /// safety (faults all the time) or liveness (faults stop; progress within a bound).
    #[arg(long, default_value = "safety")]
    mode: Mode,
    /// Switch a protocol rule off (test-only): through-end, adopt-longest, wiped-votes,
    /// forget-epoch.
    #[arg(long)]
    mutate: Option<Mutation>,
    /// Let bit flips hit a store's last durable record (read as a torn tail by the WAL).
    #[arg(long)]
    tail_flips: bool,
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
    /// Worker threads (default: the machine's parallelism).
    #[arg(long)]
    jobs: Option<usize>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let config = SimConfig {
        mode: args.mode,
        mutation: args.mutate,
        faults: FaultSet {
            tail_flips: args.tail_flips,
        },
        duration_ms: args.duration_ms,
        trace: args.trace,
        end_to_end_only: args.end_to_end_only,
        fetch_events_max: args.fetch_events_max,
        ..SimConfig::default()
    };
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
    let jobs = args
        .jobs
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .max(1);
    let started = Instant::now();
    let next = AtomicU64::new(args.base);
    let end = args.base + args.seeds;
    let stop = AtomicBool::new(false);
    let totals = Mutex::new((RunStats::default(), Vec::<RunReport>::new()));
    std::thread::scope(|scope| {
        for _ in 0..jobs {
            scope.spawn(|| loop {
                if stop.load(Ordering::Relaxed) {
                    return;
                }
                let seed = next.fetch_add(1, Ordering::Relaxed);
                if seed >= end {
                    return;
                }
                let report = run(seed, &config);
                let mut t = totals
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                t.0.add(&report.stats);
                if !report.passed() {
                    print_report(&report, &config, args.trace);
                    t.1.push(report);
                    if args.until_violation {
                        stop.store(true, Ordering::Relaxed);
                    }
                }
            });
        }
    });
    let (stats, failures) = totals
        .into_inner()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let secs = started.elapsed().as_secs_f64();
    println!(
        "mode {:?}{}: {} seeds from {} in {secs:.1} s ({:.0} seeds/s), {} failed",
        config.mode,
        config
            .mutation
            .map(|m| format!(", mutation {m}"))
            .unwrap_or_default(),
        stats.runs,
        args.base,
        stats.runs as f64 / secs.max(1e-9),
        failures.len()
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
        "  masters elected {}, broker crashes {} pauses {}, store crashes {} pauses {} wipes {}, bit flips {}, tail cuts {}, fsync EIO {}, ENOSPC {}, partitions {}",
        stats.masters,
        stats.broker_crashes,
        stats.broker_pauses,
        stats.store_crashes,
        stats.store_pauses,
        stats.store_wipes,
        stats.bit_flips,
        stats.tail_cuts,
        stats.fsync_eio,
        stats.enospc,
        stats.partitions
    );
    println!(
        "  events {}, messages delivered {} dropped {} duplicated {}, mutated steps {}",
        stats.events,
        stats.messages_delivered,
        stats.messages_dropped,
        stats.messages_duplicated,
        stats.mutated
    );
    if let Some(first) = failures.iter().map(|r| r.seed).min() {
        println!("first failing seed: {first}");
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
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
    let mut replay = format!(
        "cargo run -p quire-sim --release -- --seed {} --mode {}",
        report.seed,
        match config.mode {
            Mode::Safety => "safety",
            Mode::Liveness => "liveness",
        }
    );
    if let Some(m) = config.mutation {
        replay.push_str(&format!(" --mutate {m}"));
    }
    if config.faults.tail_flips {
        replay.push_str(" --tail-flips");
    }
    if config.duration_ms != SimConfig::default().duration_ms {
        replay.push_str(&format!(" --duration-ms {}", config.duration_ms));
    }
    println!("  replay: {replay} --trace");
}
