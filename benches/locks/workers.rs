//! Worker processes. The bench re-executes itself as `<bench> --bench-worker <JSON
//! parameters>`, with the Redis URL in the environment (kept out of `ps` output).
//!
//! * `loop` (s2, s2-fair, rw, s7; see [`crate::loops`]): prints `READY`, waits for
//!   `GO <start µs>` on stdin, runs its tasks until start + seconds, then prints one JSON array
//!   per acquisition (see [`Record`]), a `{"wakeups": n}` object and `DONE`.
//! * `s3` (see [`crate::s3`]): prints `READY`; for each `START <lock kind> <name> <index>` line
//!   starts a task that takes the lock, does `GET` + `SET` of a counter, unlocks and prints
//!   `ACQ <index> <start> <acquire> <release> <done> <ok>` (wall-clock µs); ends on `QUIT`.
//! * `s4` (see [`crate::s4`]): runs S4 for one number of waiters and prints one JSON object.

use std::io::Write;
use std::process::Stdio;
use std::time::Duration;

use serde_json::{json, Value as Json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::mpsc;

use fredlock::NotificationMode;

use crate::options::parse_mode;
use crate::peers::Side;

/// First argument of a re-executed worker process; the second is its JSON parameters.
pub const WORKER_FLAG: &str = "--bench-worker";
/// Environment variable carrying the Redis URL to the workers.
const WORKER_URL_ENV: &str = "FREDLOCK_BENCH_URL";
/// How long the parent waits for every worker to connect.
const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// Margin between `GO` and the common start instant, so every worker sleeps until it.
pub const START_DELAY_US: u64 = 250_000;
/// Extra time allowed after a timed window for the workers to finish and report.
pub const FINISH_GRACE: Duration = Duration::from_secs(60);

// --- Worker processes (parent side) ----------------------------------------------------------

/// A running worker process: its stdin, and its stdout lines as a channel.
pub struct Worker {
    pub id: usize,
    pub child: Child,
    pub stdin: Option<ChildStdin>,
    pub lines: mpsc::UnboundedReceiver<String>,
}

impl Worker {
    /// Starts `<this bench> --bench-worker <params>` with the URL in the environment.
    pub fn spawn(url: &str, id: usize, params: Json) -> Result<Worker, String> {
        let exe = std::env::current_exe().map_err(|err| format!("current_exe: {err}"))?;
        let mut child = Command::new(exe)
            .arg(WORKER_FLAG)
            .arg(params.to_string())
            .env(WORKER_URL_ENV, url)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .map_err(|err| format!("cannot start worker {id}: {err}"))?;
        let stdin = child.stdin.take();
        let mut stdout = BufReader::new(child.stdout.take().expect("piped stdout")).lines();
        let (tx, lines) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok(Some(line)) = stdout.next_line().await {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Ok(Worker {
            id,
            child,
            stdin,
            lines,
        })
    }

    /// The next stdout line; an error on timeout or when the worker ended.
    pub async fn next_line(&mut self, limit: Duration) -> Result<String, String> {
        match tokio::time::timeout(limit, self.lines.recv()).await {
            Ok(Some(line)) => Ok(line),
            Ok(None) => Err(format!("worker {} ended its output early", self.id)),
            Err(_) => Err(format!("worker {} said nothing within {limit:?}", self.id)),
        }
    }

    pub async fn wait_ready(&mut self) -> Result<(), String> {
        match self.next_line(READY_TIMEOUT).await?.as_str() {
            "READY" => Ok(()),
            other => Err(format!(
                "worker {} said {other:?} instead of READY",
                self.id
            )),
        }
    }

    pub async fn send(&mut self, line: &str) -> Result<(), String> {
        let stdin = self
            .stdin
            .as_mut()
            .ok_or_else(|| format!("worker {}: stdin closed", self.id))?;
        stdin
            .write_all(format!("{line}\n").as_bytes())
            .await
            .map_err(|err| format!("cannot write to worker {}: {err}", self.id))?;
        stdin.flush().await.map_err(|err| err.to_string())
    }

    /// Closes stdin and waits for a successful exit.
    pub async fn finish(mut self) -> Result<(), String> {
        drop(self.stdin.take());
        let status = tokio::time::timeout(FINISH_GRACE, self.child.wait())
            .await
            .map_err(|_| format!("worker {} did not exit", self.id))?
            .map_err(|err| format!("worker {}: {err}", self.id))?;
        if status.success() {
            Ok(())
        } else {
            Err(format!("worker {} failed ({status})", self.id))
        }
    }
}

/// Starts `count` workers and waits until every one has said `READY`.
pub async fn start_workers(
    url: &str,
    count: usize,
    params: impl Fn(usize) -> Json,
) -> Result<Vec<Worker>, String> {
    let mut workers = Vec::new();
    for id in 0..count {
        workers.push(Worker::spawn(url, id, params(id))?);
    }
    for worker in &mut workers {
        worker.wait_ready().await?;
    }
    Ok(workers)
}

/// One acquisition, in wall-clock µs.
#[derive(Debug, Clone, Copy)]
pub struct Record {
    /// `process * tasks + task`.
    pub task: u64,
    /// `lock()` called.
    pub start: u64,
    /// `lock()` returned.
    pub acquire: u64,
    /// `unlock()` called: the end of the critical section.
    pub release: u64,
    /// `unlock()` returned.
    pub done: u64,
    /// `unlock()` succeeded.
    pub unlock_ok: bool,
    /// A read (shared hold, `GET` only) rather than a write (`GET` + `SET`).
    pub read: bool,
}

impl Record {
    pub fn to_line(self) -> String {
        json!([
            self.task,
            self.start,
            self.acquire,
            self.release,
            self.done,
            u8::from(self.unlock_ok),
            u8::from(self.read)
        ])
        .to_string()
    }

    pub fn from_json(value: &Json) -> Option<Record> {
        let items = value.as_array()?;
        let num = |i: usize| items.get(i).and_then(Json::as_u64);
        Some(Record {
            task: num(0)?,
            start: num(1)?,
            acquire: num(2)?,
            release: num(3)?,
            done: num(4)?,
            unlock_ok: num(5)? == 1,
            read: num(6)? == 1,
        })
    }
}

/// What one worker process reported.
#[derive(Default)]
pub struct WorkerReport {
    pub records: Vec<Record>,
    pub wakeups: u64,
}

/// Collects every worker's records (see [`collect`]).
pub async fn collect_all(workers: Vec<Worker>) -> Result<Vec<WorkerReport>, String> {
    let tasks: Vec<_> = workers
        .into_iter()
        .map(|worker| tokio::spawn(collect(worker)))
        .collect();
    let mut reports = Vec::new();
    for task in tasks {
        reports.push(task.await.map_err(|err| err.to_string())??);
    }
    Ok(reports)
}

/// Reads a worker's records until `DONE`, then waits for it to exit successfully.
pub async fn collect(mut worker: Worker) -> Result<WorkerReport, String> {
    let mut report = WorkerReport::default();
    let id = worker.id;
    loop {
        let line = worker
            .lines
            .recv()
            .await
            .ok_or_else(|| format!("worker {id} ended without DONE"))?;
        if line == "DONE" {
            break;
        }
        let value: Json = serde_json::from_str(&line)
            .map_err(|err| format!("worker {id}: bad line {line:?}: {err}"))?;
        if let Some(wakeups) = value.get("wakeups").and_then(Json::as_u64) {
            report.wakeups = wakeups;
        } else {
            let record = Record::from_json(&value)
                .ok_or_else(|| format!("worker {id}: bad record {line:?}"))?;
            report.records.push(record);
        }
    }
    worker.finish().await?;
    Ok(report)
}

/// The worker process: parses its parameters and runs its role. Returns the exit code.
pub fn child_main(raw: &[String]) -> i32 {
    let params = match raw {
        [params] => match serde_json::from_str::<Json>(params) {
            Ok(params) => params,
            Err(err) => {
                eprintln!("bench worker: bad parameters: {err}");
                return 2;
            }
        },
        _ => {
            eprintln!("bench worker: expected one JSON argument, got {raw:?}");
            return 2;
        }
    };
    let Ok(url) = std::env::var(WORKER_URL_ENV) else {
        eprintln!("bench worker: {WORKER_URL_ENV} unset");
        return 2;
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("build the tokio runtime");
    match runtime.block_on(run(&params, &url)) {
        Ok(()) => 0,
        Err(message) => {
            eprintln!("bench worker ({}): {message}", params["role"]);
            1
        }
    }
}

pub fn text<'a>(params: &'a Json, key: &str) -> Result<&'a str, String> {
    params[key]
        .as_str()
        .ok_or_else(|| format!("parameter {key} missing"))
}

pub fn number(params: &Json, key: &str) -> Result<u64, String> {
    params[key]
        .as_u64()
        .ok_or_else(|| format!("parameter {key} missing"))
}

pub fn float(params: &Json, key: &str) -> Result<f64, String> {
    params[key]
        .as_f64()
        .ok_or_else(|| format!("parameter {key} missing"))
}

/// What a worker process was given.
pub struct ChildCtx<'a> {
    pub params: &'a Json,
    pub url: &'a str,
    pub mode: NotificationMode,
    /// The run's key prefix.
    pub prefix: &'a str,
}

impl ChildCtx<'_> {
    /// The clients for the given fredlock shard count (a fredlock client only if asked).
    pub async fn side(&self, shards: u16, with_fredlock: bool) -> Result<Side, String> {
        Side::open(self.url, self.mode, self.prefix, shards, with_fredlock).await
    }
}

async fn run(params: &Json, url: &str) -> Result<(), String> {
    let worker = ChildCtx {
        params,
        url,
        mode: parse_mode(text(params, "mode")?)?,
        prefix: text(params, "prefix")?,
    };
    match text(params, "role")? {
        "loop" => crate::loops::child(&worker).await,
        "s3" => crate::s3::child(&worker).await,
        "s4" => crate::s4::child(&worker).await,
        other => Err(format!("unknown role {other:?}")),
    }
}

/// One line on stdout, flushed.
pub fn say(line: &str) -> Result<(), String> {
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{line}")
        .and_then(|_| stdout.flush())
        .map_err(|err| format!("stdout: {err}"))
}

/// Child side: waits for the parent's `GO <start µs>` line and returns the start instant.
pub async fn wait_go() -> Result<u64, String> {
    let mut stdin = BufReader::new(tokio::io::stdin()).lines();
    let line = stdin
        .next_line()
        .await
        .map_err(|err| format!("stdin: {err}"))?
        .unwrap_or_default();
    line.trim()
        .strip_prefix("GO ")
        .and_then(|t| t.parse().ok())
        .ok_or_else(|| format!("expected GO <µs>, got {line:?}"))
}
