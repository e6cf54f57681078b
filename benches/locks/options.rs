//! The command line (parsed with `lexopt`).

use std::path::PathBuf;

use fredlock::NotificationMode;
use lexopt::prelude::*;

use crate::peers::LockKind;

pub const HELP: &str = "\
usage: cargo bench --bench locks -- [OPTIONS]

  --scenario LIST     comma-separated, default all: s1 s2 s2-fair s3 fair-handoff rw s4 s5 s6 s7
  --mode MODE         stream, pubsub or both (both)
  --peers LIST        peers run beside fredlock in s1, s2, s3 and s7: naive,rslock (both) or none
  --quick             shorter windows and fewer rounds
  --json PATH         every figure as JSON (target/bench-locks.json)
  --docs PATH         also write the report as a documentation page (e.g. docs/benchmarks.md)
  --cycles N          s1 cycles (5000; quick 1000)
  --warmup N          s1 warm-up cycles (500)
  --pings N           PINGs per reference measurement (2000)
  --seconds S         s2, s2-fair, rw window (5; quick 2)
  --processes N       s2, s2-fair, rw worker processes (4)
  --tasks N           s2, s2-fair, rw tasks per process (4)
  --s3-rounds N       s3 rounds per lock (10; quick 2)
  --s4-waiters N,N    s4 waiter counts (200,10000)
  --s5-rounds N       s5 rounds per mode (500; quick 100)
  --s6-reps N         s6 runs per variant (5; quick 1)
  --s7-shapes LIST    s7 processes x tasks (4x4,16x1,64x1)
  --s7-locks LIST     s7 rows: mutex,fair,rwlock,naive,rslock and ring, the FIFO floor (all)
  --s7-seconds S      s7 window per row (3; quick 1.5)
  --s7-rounds N       s7 runs of every row, the rows of a shape in turn; the median run (by
                      acq/s) is reported (3; quick 1)
  -h, --help          this text

Without REDIS_URL the bench starts its own redis-server on a free loopback port.";

/// One selectable scenario.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Scenario {
    S1,
    S2,
    S2Fair,
    S3,
    FairHandoff,
    Rw,
    S4,
    S5,
    S6,
    S7,
}

impl Scenario {
    pub const ALL: [Scenario; 10] = [
        Scenario::S1,
        Scenario::S2,
        Scenario::S2Fair,
        Scenario::S3,
        Scenario::FairHandoff,
        Scenario::Rw,
        Scenario::S4,
        Scenario::S5,
        Scenario::S6,
        Scenario::S7,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Scenario::S1 => "s1",
            Scenario::S2 => "s2",
            Scenario::S2Fair => "s2-fair",
            Scenario::S3 => "s3",
            Scenario::FairHandoff => "fair-handoff",
            Scenario::Rw => "rw",
            Scenario::S4 => "s4",
            Scenario::S5 => "s5",
            Scenario::S6 => "s6",
            Scenario::S7 => "s7",
        }
    }

    fn parse(item: &str) -> Result<Vec<Scenario>, String> {
        let found = match item {
            "all" => return Ok(Scenario::ALL.to_vec()),
            "s2fair" | "s2f" | "fair" => Some(Scenario::S2Fair),
            "handoff" | "fairhandoff" => Some(Scenario::FairHandoff),
            "rwlock" => Some(Scenario::Rw),
            "scale" => Some(Scenario::S7),
            other => Scenario::ALL.into_iter().find(|s| s.name() == other),
        };
        Ok(vec![
            found.ok_or_else(|| format!("unknown scenario {item:?}"))?
        ])
    }
}

/// One S7 shape: worker processes × tasks per process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    pub processes: usize,
    pub tasks: usize,
}

impl Shape {
    fn parse(item: &str) -> Result<Vec<Shape>, String> {
        let (p, t) = item
            .split_once(['x', '×'])
            .ok_or_else(|| format!("shape {item:?} is not PROCESSESxTASKS"))?;
        let number = |text: &str| {
            text.trim()
                .parse::<usize>()
                .ok()
                .filter(|&n| (1..=256).contains(&n))
                .ok_or_else(|| format!("shape {item:?}: counts must be in 1..=256"))
        };
        Ok(vec![Shape {
            processes: number(p)?,
            tasks: number(t)?,
        }])
    }

    pub fn label(self) -> String {
        format!("{}×{}", self.processes, self.tasks)
    }
}

/// Command-line settings of the parent process.
#[derive(Debug, Clone)]
pub struct Args {
    pub quick: bool,
    pub json: PathBuf,
    pub docs: Option<PathBuf>,
    pub scenarios: Vec<Scenario>,
    pub modes: Vec<NotificationMode>,
    pub peers: Vec<LockKind>,
    pub cycles: u64,
    pub warmup: u64,
    pub pings: u64,
    pub seconds: f64,
    pub processes: usize,
    pub tasks: usize,
    pub s3_rounds: usize,
    pub handoff_batches_10: usize,
    pub handoff_batches_1000: usize,
    pub s4_waiters: Vec<usize>,
    pub s5_rounds: usize,
    pub s6_reps: usize,
    pub s7_shapes: Vec<Shape>,
    pub s7_locks: Vec<LockKind>,
    pub s7_seconds: f64,
    /// S7 rounds: every row of a shape runs this many times, the rows in turn.
    pub s7_rounds: usize,
}

/// A comma-separated list, each item parsed by `item` (which may expand to several).
fn list<T: PartialEq>(
    text: &str,
    item: impl Fn(&str) -> Result<Vec<T>, String>,
) -> Result<Vec<T>, String> {
    let mut out = Vec::new();
    for part in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        for value in item(&part.to_ascii_lowercase())? {
            if !out.contains(&value) {
                out.push(value);
            }
        }
    }
    Ok(out)
}

fn lock_kinds(text: &str, allowed: &[LockKind]) -> Result<Vec<LockKind>, String> {
    list(text, |item| match item {
        "all" => Ok(allowed.to_vec()),
        "none" => Ok(Vec::new()),
        name => match LockKind::parse(name) {
            Ok(kind) if allowed.contains(&kind) => Ok(vec![kind]),
            _ => Err(format!("{name:?} is not one of {allowed:?}")),
        },
    })
}

fn parse_modes(text: &str) -> Result<Vec<NotificationMode>, String> {
    match text {
        "both" => Ok(vec![NotificationMode::Stream, NotificationMode::PubSub]),
        one => Ok(vec![parse_mode(one)?]),
    }
}

pub fn parse_mode(text: &str) -> Result<NotificationMode, String> {
    match text {
        "stream" => Ok(NotificationMode::Stream),
        "pubsub" => Ok(NotificationMode::PubSub),
        other => Err(format!(
            "mode must be stream, pubsub or both, got {other:?}"
        )),
    }
}

impl Args {
    /// `Ok(None)` for `--help`.
    pub fn parse(raw: Vec<String>) -> Result<Option<Args>, String> {
        Args::parse_lexopt(raw).map_err(|err| err.to_string())
    }

    fn parse_lexopt(raw: Vec<String>) -> Result<Option<Args>, lexopt::Error> {
        let mut quick = false;
        let mut json = PathBuf::from("target/bench-locks.json");
        let mut docs = None;
        let mut scenarios = Scenario::ALL.to_vec();
        let mut modes = vec![NotificationMode::Stream, NotificationMode::PubSub];
        let mut peers = LockKind::PEERS.to_vec();
        let (mut cycles, mut seconds, mut s3_rounds, mut s5_rounds, mut s6_reps) =
            (None, None, None, None, None);
        let (mut warmup, mut pings, mut processes, mut tasks) = (500, 2000, 4, 4);
        let mut s4_waiters = vec![200, 10_000];
        let mut s7_shapes = vec![(4, 4), (16, 1), (64, 1)]
            .into_iter()
            .map(|(processes, tasks)| Shape { processes, tasks })
            .collect();
        let mut s7_locks = LockKind::ALL.to_vec();
        let mut s7_seconds = None;
        let mut s7_rounds = None;
        let mut parser = lexopt::Parser::from_args(raw);
        while let Some(arg) = parser.next()? {
            match arg {
                Long("bench") => {} // added by `cargo bench`
                Short('h') | Long("help") => return Ok(None),
                Long("quick") => quick = true,
                Long("json") => json = parser.value()?.into(),
                Long("docs") => docs = Some(parser.value()?.into()),
                Long("scenario") | Long("scenarios") => {
                    scenarios = list(&parser.value()?.string()?, Scenario::parse)?;
                    scenarios.sort();
                }
                Long("mode") => modes = parse_modes(&parser.value()?.string()?)?,
                Long("peers") => peers = lock_kinds(&parser.value()?.string()?, &LockKind::PEERS)?,
                Long("cycles") => cycles = Some(parser.value()?.parse()?),
                Long("warmup") => warmup = parser.value()?.parse()?,
                Long("pings") => pings = parser.value()?.parse()?,
                Long("seconds") => seconds = Some(parser.value()?.parse()?),
                Long("processes") => processes = parser.value()?.parse()?,
                Long("tasks") => tasks = parser.value()?.parse()?,
                Long("s3-rounds") => s3_rounds = Some(parser.value()?.parse()?),
                Long("s4-waiters") => {
                    s4_waiters = list(&parser.value()?.string()?, |n| {
                        n.parse().map(|n| vec![n]).map_err(|_| format!("{n:?}"))
                    })?
                }
                Long("s5-rounds") => s5_rounds = Some(parser.value()?.parse()?),
                Long("s6-reps") => s6_reps = Some(parser.value()?.parse()?),
                Long("s7-shapes") => s7_shapes = list(&parser.value()?.string()?, Shape::parse)?,
                Long("s7-locks") => {
                    s7_locks = lock_kinds(&parser.value()?.string()?, &LockKind::ALL)?
                }
                Long("s7-seconds") => s7_seconds = Some(parser.value()?.parse()?),
                Long("s7-rounds") => s7_rounds = Some(parser.value()?.parse()?),
                _ => return Err(arg.unexpected()),
            }
        }
        let args = Args {
            quick,
            json,
            docs,
            scenarios,
            modes,
            peers,
            cycles: cycles.unwrap_or(if quick { 1000 } else { 5000 }),
            warmup,
            pings,
            seconds: seconds.unwrap_or(if quick { 2.0 } else { 5.0 }),
            processes,
            tasks,
            s3_rounds: s3_rounds.unwrap_or(if quick { 2 } else { 10 }),
            handoff_batches_10: 5,
            handoff_batches_1000: if quick { 1 } else { 2 },
            s4_waiters,
            s5_rounds: s5_rounds.unwrap_or(if quick { 100 } else { 500 }),
            s6_reps: s6_reps.unwrap_or(if quick { 1 } else { 5 }),
            s7_shapes,
            s7_locks,
            s7_seconds: s7_seconds.unwrap_or(if quick { 1.5 } else { 3.0 }),
            s7_rounds: s7_rounds.unwrap_or(if quick { 1 } else { 3 }),
        };
        args.check().map_err(lexopt::Error::from)?;
        Ok(Some(args))
    }

    fn check(&self) -> Result<(), String> {
        if self.cycles == 0 || self.pings == 0 {
            return Err("--cycles and --pings must be at least 1".into());
        }
        for (flag, seconds) in [
            ("--seconds", self.seconds),
            ("--s7-seconds", self.s7_seconds),
        ] {
            if !(seconds > 0.0 && seconds <= 3600.0) {
                return Err(format!("{flag} must be in (0, 3600], got {seconds}"));
            }
        }
        if self.processes == 0 || self.tasks == 0 || self.processes * self.tasks < 2 {
            return Err("S2 needs at least 2 tasks in all (--processes × --tasks)".into());
        }
        if self.s3_rounds == 0 || self.s5_rounds == 0 || self.s6_reps == 0 || self.s7_rounds == 0 {
            return Err(
                "--s3-rounds, --s5-rounds, --s6-reps and --s7-rounds must be at least 1".into(),
            );
        }
        if self.s4_waiters.iter().any(|&n| n == 0 || n > 100_000) {
            return Err("--s4-waiters must be in 1..=100000".into());
        }
        if self.scenarios.is_empty() || self.modes.is_empty() {
            return Err("--scenario and --mode need at least one value".into());
        }
        Ok(())
    }
}
