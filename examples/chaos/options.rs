//! The command line: the parent's options and the hidden `--worker` options (parsed by lexopt).

use std::ffi::OsString;
use std::time::Duration;

use fredlock::NotificationMode;

use crate::scenario::{parse_mode, Scenario};

/// What the parent runs.
pub struct Options {
    pub scenarios: Vec<Scenario>,
    pub modes: Vec<NotificationMode>,
    pub seconds: u64,
    pub workers: usize,
    pub tasks: usize,
    pub markdown: Option<String>,
}

/// What one worker process runs (passed by the parent as `--worker --key value …`).
#[derive(Clone)]
pub struct WorkerOptions {
    pub lock_url: String,
    pub resource_url: String,
    pub prefix: String,
    pub mode: NotificationMode,
    pub lease: Duration,
    pub tasks: usize,
    pub start_ms: u64,
    pub until_ms: u64,
    /// `Config::replica_acks`.
    pub replica_acks: u32,
    /// A data-loss scenario: holds that outlive a loss are watched (see `worker`).
    pub data_loss: bool,
}

/// Either side of the binary.
pub enum Command {
    Parent(Options),
    Worker(WorkerOptions),
}

/// Every flag either side takes, as given (defaults are applied later).
#[derive(Default)]
struct Raw {
    worker: bool,
    data_loss: bool,
    scenario: Option<String>,
    modes: Option<String>,
    seconds: Option<u64>,
    workers: Option<usize>,
    tasks: Option<usize>,
    markdown: Option<String>,
    lock_url: Option<String>,
    resource_url: Option<String>,
    prefix: Option<String>,
    mode: Option<String>,
    lease_ms: Option<u64>,
    start_ms: Option<u64>,
    until_ms: Option<u64>,
    replica_acks: Option<u32>,
}

fn read_raw(args: impl IntoIterator<Item = OsString>) -> Result<Raw, lexopt::Error> {
    use lexopt::prelude::*;
    let mut parser = lexopt::Parser::from_args(args);
    let mut raw = Raw::default();
    while let Some(arg) = parser.next()? {
        match arg {
            Long("worker") => raw.worker = true,
            Long("data-loss") => raw.data_loss = true,
            Long("scenario") => raw.scenario = Some(parser.value()?.string()?),
            Long("modes") => raw.modes = Some(parser.value()?.string()?),
            Long("seconds") => raw.seconds = Some(parser.value()?.parse()?),
            Long("workers") => raw.workers = Some(parser.value()?.parse()?),
            Long("tasks") => raw.tasks = Some(parser.value()?.parse()?),
            Long("markdown") => raw.markdown = Some(parser.value()?.string()?),
            Long("lock-url") => raw.lock_url = Some(parser.value()?.string()?),
            Long("resource-url") => raw.resource_url = Some(parser.value()?.string()?),
            Long("prefix") => raw.prefix = Some(parser.value()?.string()?),
            Long("mode") => raw.mode = Some(parser.value()?.string()?),
            Long("lease-ms") => raw.lease_ms = Some(parser.value()?.parse()?),
            Long("start-ms") => raw.start_ms = Some(parser.value()?.parse()?),
            Long("until-ms") => raw.until_ms = Some(parser.value()?.parse()?),
            Long("replica-acks") => raw.replica_acks = Some(parser.value()?.parse()?),
            other => return Err(other.unexpected()),
        }
    }
    Ok(raw)
}

/// A worker flag the parent always passes.
fn required<T>(value: Option<T>, name: &str) -> Result<T, String> {
    value.ok_or_else(|| format!("--{name} is required"))
}

/// Parses the process arguments (without the program name).
pub fn parse(args: impl IntoIterator<Item = OsString>) -> Result<Command, String> {
    let raw = read_raw(args).map_err(|err| err.to_string())?;
    if raw.worker {
        WorkerOptions::parse(raw).map(Command::Worker)
    } else {
        parse_options(raw).map(Command::Parent)
    }
}

fn parse_options(raw: Raw) -> Result<Options, String> {
    let scenario = raw.scenario.unwrap_or_else(|| "all".to_owned());
    let scenarios = if scenario == "all" {
        Scenario::ALL.to_vec()
    } else {
        scenario
            .split(',')
            .map(|name| Scenario::parse(name).ok_or_else(|| format!("unknown scenario {name:?}")))
            .collect::<Result<_, _>>()?
    };
    let modes = raw.modes.unwrap_or_else(|| "stream,pubsub".to_owned());
    let modes = modes
        .split(',')
        .map(|m| parse_mode(m).ok_or_else(|| format!("unknown mode {m:?}")))
        .collect::<Result<_, _>>()?;
    let options = Options {
        scenarios,
        modes,
        seconds: raw.seconds.unwrap_or(20),
        workers: raw.workers.unwrap_or(4),
        tasks: raw.tasks.unwrap_or(4),
        markdown: raw.markdown,
    };
    if !(1..=600).contains(&options.seconds) || options.workers < 1 || options.tasks < 1 {
        return Err("--seconds must be 1..=600, --workers and --tasks at least 1".into());
    }
    Ok(options)
}

impl Options {
    /// The command that reproduces this run and writes the report to its place in the
    /// repository (whatever `--markdown` said).
    pub fn reproduce(&self) -> String {
        let mut command = String::from("cargo run --release --example chaos --");
        if self.scenarios != Scenario::ALL {
            let names: Vec<&str> = self.scenarios.iter().map(|s| s.name()).collect();
            command.push_str(&format!(" --scenario {}", names.join(",")));
        }
        let modes: Vec<&str> = self.modes.iter().map(|m| m.as_str()).collect();
        if modes != ["stream", "pubsub"] {
            command.push_str(&format!(" --modes {}", modes.join(",")));
        }
        for (flag, value, default) in [
            ("seconds", self.seconds, 20),
            ("workers", self.workers as u64, 4),
            ("tasks", self.tasks as u64, 4),
        ] {
            if value != default {
                command.push_str(&format!(" --{flag} {value}"));
            }
        }
        command.push_str(" --markdown docs/reliability.md");
        command
    }
}

impl WorkerOptions {
    fn parse(raw: Raw) -> Result<WorkerOptions, String> {
        let mode = required(raw.mode, "mode")?;
        Ok(WorkerOptions {
            lock_url: required(raw.lock_url, "lock-url")?,
            resource_url: required(raw.resource_url, "resource-url")?,
            prefix: required(raw.prefix, "prefix")?,
            mode: parse_mode(&mode).ok_or_else(|| format!("unknown mode {mode:?}"))?,
            lease: Duration::from_millis(required(raw.lease_ms, "lease-ms")?),
            tasks: required(raw.tasks, "tasks")?,
            start_ms: required(raw.start_ms, "start-ms")?,
            until_ms: required(raw.until_ms, "until-ms")?,
            replica_acks: raw.replica_acks.unwrap_or(0),
            data_loss: raw.data_loss,
        })
    }

    pub fn to_args(&self) -> Vec<String> {
        let pairs = [
            ("lock-url", self.lock_url.clone()),
            ("resource-url", self.resource_url.clone()),
            ("prefix", self.prefix.clone()),
            ("mode", self.mode.as_str().to_owned()),
            ("lease-ms", self.lease.as_millis().to_string()),
            ("tasks", self.tasks.to_string()),
            ("start-ms", self.start_ms.to_string()),
            ("until-ms", self.until_ms.to_string()),
            ("replica-acks", self.replica_acks.to_string()),
        ];
        let mut args = vec!["--worker".to_owned()];
        if self.data_loss {
            args.push("--data-loss".to_owned());
        }
        for (key, value) in pairs {
            args.push(format!("--{key}"));
            args.push(value);
        }
        args
    }
}
