//! `--docs PATH`: the report as the project's benchmark page (`docs/benchmarks.md`): when,
//! where and at which commit it was measured, how to reproduce it, what the figures mean for a
//! user, and the tables of this one run. Nothing but the current state.

use std::path::Path;
use std::process::Command;

use crate::measure::{machine_json, progress};
use crate::options::Args;
use crate::run::Report;

/// The commit the bench was built from, `-dirty` when the library or the bench had changes.
fn commit() -> String {
    let git = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .ok()
            .filter(|out| out.status.success())
            .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_owned())
    };
    let Some(head) = git(&["rev-parse", "--short", "HEAD"]) else {
        return "unknown".to_owned();
    };
    let paths = [
        "status",
        "--porcelain",
        "--",
        "src",
        "lua",
        "benches",
        "Cargo.toml",
    ];
    match git(&paths) {
        Some(changes) if changes.is_empty() => head,
        _ => format!("{head}-dirty"),
    }
}

fn rustc_version() -> String {
    Command::new("rustc")
        .arg("--version")
        .output()
        .ok()
        .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_owned())
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| "unknown".to_owned())
}

/// The command line that reproduces this run.
fn command(args: &Args) -> String {
    let mut cmd = String::from("cargo bench --bench locks --");
    if args.quick {
        cmd += " --quick";
    }
    let all = crate::options::Scenario::ALL.len() == args.scenarios.len();
    if !all {
        let names: Vec<&str> = args.scenarios.iter().map(|s| s.name()).collect();
        cmd += &format!(" --scenario {}", names.join(","));
    }
    if args.modes.len() == 1 {
        cmd += &format!(" --mode {}", args.modes[0].as_str());
    }
    cmd + " --docs docs/benchmarks.md"
}

const MEANING: &str = "\
## What the figures mean for a user

* **Compare ratios, not microseconds.** Every figure stands beside the `PING` round trip of
  the same client measured in the same scenario; on a shared or virtual machine the round trip
  itself moves from one scenario to the next.
* **S1** is the cost of an uncontended `lock()` + `unlock()`: two script round trips. Its
  ratio to the hand-written `SET NX PX` + compare-and-delete cycle on the same fred client
  (\"naive\") is what fredlock's extra guarantees (fencing tokens, reentrancy, wake-ups) cost
  when nobody else wants the lock. The *CPU per cycle* column splits that cost: the CPU a
  cycle takes in the bench process (fredlock's code and fred's) and in the server (its two
  scripts against the naive cycle's `SET` and small script), each measured over cycles run
  alone.
* **S2 and S7** are many tasks and processes fighting for one lock, each holding it for a
  `GET` + `SET`. *acq/s* is throughput; *wait* is what one task experiences. The polling peers
  (naive, rslock) reach high throughput by letting the releasing task take the lock straight
  back while others sleep, so their longest waits are long; fredlock hands the lock to a
  waiting task on release. *Redis commands / acq* and *Redis CPU / acq* say what each
  acquisition costs the server: they should not grow with the number of processes.
* **FairMutex** grants in arrival order: S3 and the *FIFO inversions* columns count the pairs
  of waiters served out of order (an inversion needs arrivals more than 1 ms apart). Arrival is
  when the task called `lock()`; a fair lock can only serve calls in the order they reach
  Redis. In S2 and S7 every task makes its first call at one instant, and with dozens of
  processes on two CPUs the scheduler may hold a call made first for milliseconds while later
  ones reach Redis: the loops count inversions among the calls made after the ramp-up (once
  every task has acquired once), and show the count with the ramp-up beside it. The *longest
  wait* columns show the steady state (calls after the ramp-up) beside the window's and the
  whole run's; the targets judge the window's, ramp-up included.
* **FIFO floor: token ring** (S7) is not a lock: the tasks take turns in a fixed order that
  goes from process to process, each turn the same `GET` + `SET` followed by one `PUBLISH` to
  the next turn's channel (no script, lease, queue or fencing). It is the most a strictly
  first-come lock on one Redis can do on the machine of the run, the yardstick for FairMutex.
* **Violations** (overlapping holds, lost counter increments) must be 0 for every lock.
* **S4** is the memory and connections a waiting task costs, **S5** the wake-up latency of the
  two notification modes, **S6** how quickly waiters recover when the notifier connection is
  killed.
";

pub fn write(
    path: &Path,
    args: &Args,
    report: &Report,
    version: &str,
    tables: &str,
) -> Result<(), String> {
    let machine = machine_json(version);
    let text = |key: &str| machine[key].as_str().unwrap_or("unknown").to_owned();
    let mut out = String::from("# Benchmarks\n\n");
    out += "Generated by `benches/locks` (`cargo bench --bench locks`) in one run against a \
            real `redis-server`. The doc comments of `benches/locks/` define every figure \
            exactly; this page gives the figures of that run, the targets and whether they were \
            met. Nothing here is edited by hand: run the command below to refresh it.\n\n";
    out += "## Run\n\n| | |\n|---|---|\n";
    out += &format!("| date (UTC) | {} |\n", crate::support::utc_date());
    out += &format!("| fredlock commit | `{}` |\n", commit());
    out += &format!("| CPU | {} × {} |\n", machine["nproc"], text("cpu_model"));
    out += &format!("| memory | {} GiB |\n", machine["memory_gib"]);
    out += &format!("| kernel | Linux {} |\n", text("kernel"));
    out += &format!(
        "| Redis | {version}, loopback, no persistence{} |\n",
        if std::env::var("REDIS_URL").is_ok_and(|u| !u.is_empty()) {
            " (given by REDIS_URL)"
        } else {
            ", started by the bench"
        }
    );
    out += &format!("| Rust | {}, `bench` profile |\n", rustc_version());
    out += &format!(
        "| load average at the end | {} |\n\n",
        text("load_average_at_end")
    );
    out += "## How to reproduce\n\n```sh\n";
    out += &command(args);
    out += "\ncargo bench --bench locks -- --help          # every option\n";
    out +=
        "cargo bench --bench locks -- --scenario s7 --s7-shapes 4x4,64x1 --s7-locks mutex,naive\n";
    out += "```\n\nWithout `REDIS_URL` the bench starts its own `redis-server` on a free loopback \
            port and kills it at the end. S6 kills connections: point `REDIS_URL` only at a \
            server of your own.\n\n";
    out += MEANING;
    out += "\n## Figures\n\n";
    out += tables.trim_start_matches(|c| c != '\n').trim_start();
    if !report.errors.is_empty() {
        out += "\nSome scenarios failed in this run; see \"Failed scenarios\" above.\n";
    }
    std::fs::write(path, out).map_err(|err| format!("cannot write {}: {err}", path.display()))?;
    progress(&format!("wrote {}", path.display()));
    Ok(())
}
