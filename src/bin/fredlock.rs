//! `fredlock`: look at the locks that services keep in Redis, and free a stuck one.
//!
//! ```text
//! fredlock [--url URL] [--prefix PREFIX] [--json] list
//! fredlock [--url URL] [--prefix PREFIX] [--json] show KIND NAME
//! fredlock [--url URL] [--prefix PREFIX] [--json] force-unlock KIND NAME
//! ```
//!
//! KIND is `mutex`, `fair`, `rw`, `sem` or `latch`. The tool takes the layout the services
//! recorded under the prefix, so it needs neither their shard count nor their notification
//! mode. `list` and `show` only read, over one connection (an `Inspector`: no layout record,
//! marker key or notifier of its own); `list` reports a lock it cannot read and goes on.
//! `force-unlock` connects as a client (`LockClient::connect_as_recorded`) and takes every hold
//! of the lock back (a latch: opens it) and wakes its waiters, as the handles' `force_unlock`
//! does. Exit status: 0 done, 1 a Redis or lock error (`list`: any lock), 2 bad arguments
//! (among them a URL, prefix or lock name that cannot be used: found before connecting).

use std::io::Write;
use std::process::ExitCode;

use fredlock::{Config, HoldSide, Inspector, LockClient, LockKind, LockReport, MAX_NAME_LEN};

const USAGE: &str = "\
usage: fredlock [--url URL] [--prefix PREFIX] [--json] COMMAND

commands:
  list                        every lock under the prefix that has state in Redis
  show KIND NAME              a lock's holders (owner, count, token, lease left) and waiters
  force-unlock KIND NAME      take every hold back and wake the waiters (a latch: open it)

KIND: mutex, fair, rw, sem, latch
options:
  --url URL        the Redis URL (default: $REDIS_URL, else redis://127.0.0.1:6379)
  --prefix PREFIX  the key prefix the services use (default: fredlock)
  --json           print JSON
  -h, --help       this text
A NAME that starts with '-' goes after '--': fredlock show mutex -- -name";

/// What the command line asks for.
struct Args {
    url: String,
    prefix: Option<String>,
    json: bool,
    command: Command,
}

enum Command {
    List,
    Show(LockKind, String),
    ForceUnlock(LockKind, String),
}

fn main() -> ExitCode {
    let (args, config) = match parse(std::env::args_os().skip(1)) {
        Ok(Some(args)) => match args.config() {
            Ok(config) => (args, config),
            // A URL or prefix that cannot be used is a bad argument too (status 2), found
            // before any connection is tried.
            Err(message) => {
                complain(&message);
                return ExitCode::from(2);
            }
        },
        Ok(None) => {
            print(&format!("{USAGE}\n"));
            return ExitCode::SUCCESS;
        }
        Err(message) => {
            complain(&format!("{message}\n\n{USAGE}"));
            return ExitCode::from(2);
        }
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build();
    let outcome = match runtime {
        Ok(runtime) => runtime.block_on(run(args, config)),
        Err(err) => Err(format!("cannot start the runtime: {err}")),
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            complain(&message);
            ExitCode::from(1)
        }
    }
}

/// Writes `text` to standard output; a closed pipe (`fredlock list | head`) is not an error,
/// and nothing here panics (`println!` would).
fn print(text: &str) {
    let mut stdout = std::io::stdout().lock();
    let _ = stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush());
}

/// `fredlock: <message>` on standard error, without panicking when it is closed.
fn complain(message: &str) {
    let _ = writeln!(std::io::stderr().lock(), "fredlock: {message}");
}

/// The arguments, or None for `--help`.
fn parse(raw: impl IntoIterator<Item = std::ffi::OsString>) -> Result<Option<Args>, String> {
    use lexopt::prelude::*;
    let mut parser = lexopt::Parser::from_args(raw);
    let mut url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let (mut prefix, mut json, mut words) = (None, false, Vec::new());
    while let Some(arg) = parser.next().map_err(|err| err.to_string())? {
        match arg {
            Long("url") => url = text(parser.value())?,
            Long("prefix") => prefix = Some(text(parser.value())?),
            Long("json") => json = true,
            Short('h') | Long("help") => return Ok(None),
            Value(word) => words.push(text(Ok(word))?),
            other => return Err(other.unexpected().to_string()),
        }
    }
    let lock = |words: &[String]| match words {
        [kind, name] => {
            let kind = LockKind::parse(kind).ok_or_else(|| format!("unknown kind {kind:?}"))?;
            // The names a lock may have (see `LockClient::mutex`): any other is a bad
            // argument, not a Redis error after a connection.
            if name.is_empty() || name.len() > MAX_NAME_LEN {
                return Err(format!(
                    "a lock name is 1 to {MAX_NAME_LEN} bytes, this one is {}",
                    name.len()
                ));
            }
            Ok((kind, name.clone()))
        }
        _ => Err("expected KIND NAME".to_owned()),
    };
    let command = match words.split_first() {
        Some((command, [])) if command == "list" => Command::List,
        Some((command, rest)) if command == "show" => {
            let (kind, name) = lock(rest)?;
            Command::Show(kind, name)
        }
        Some((command, rest)) if command == "force-unlock" => {
            let (kind, name) = lock(rest)?;
            Command::ForceUnlock(kind, name)
        }
        Some((command, _)) => return Err(format!("unknown command or arguments: {command:?}")),
        None => return Err("no command".into()),
    };
    Ok(Some(Args {
        url,
        prefix,
        json,
        command,
    }))
}

fn text(value: Result<std::ffi::OsString, lexopt::Error>) -> Result<String, String> {
    value
        .map_err(|err| err.to_string())?
        .into_string()
        .map_err(|raw| format!("not UTF-8: {raw:?}"))
}

impl Args {
    /// The configuration the arguments give, checked (`Config::validate`).
    fn config(&self) -> Result<Config, String> {
        let mut config = Config::new(self.url.clone());
        if let Some(prefix) = &self.prefix {
            config.key_prefix.clone_from(prefix);
        }
        config.validate().map_err(|err| err.to_string())?;
        Ok(config)
    }
}

async fn run(args: Args, config: Config) -> Result<(), String> {
    let failed = |err: fredlock::Error| err.to_string();
    let mut out = String::new();
    let done = match &args.command {
        Command::ForceUnlock(kind, name) => {
            let locks = LockClient::connect_as_recorded(config)
                .await
                .map_err(failed)?;
            let done = force_unlock(&locks, *kind, name).await.map_err(failed);
            let closed = locks.shutdown().await.map_err(failed);
            let freed = done.and_then(|freed| closed.map(|()| freed))?;
            if args.json {
                let report = serde_json::json!({"kind": kind, "name": name, "freed": freed});
                out = json(&report)?;
            } else {
                let what = if freed { "freed" } else { "was not held" };
                out = format!("{kind} {name:?} {what}\n");
            }
            Ok(())
        }
        Command::List | Command::Show(..) => {
            let inspector = Inspector::connect(config).await.map_err(failed)?;
            let done = read(&inspector, &args.command, args.json, &mut out).await;
            let closed = inspector.close().await.map_err(failed);
            done.and(closed)
        }
    };
    // Whatever was gathered is printed, also before an error (`list` goes on past a lock it
    // cannot read).
    print(&out);
    done
}

/// `list` and `show`: what they print goes into `out`.
async fn read(
    inspector: &Inspector,
    command: &Command,
    json_out: bool,
    out: &mut String,
) -> Result<(), String> {
    match command {
        Command::Show(kind, name) => {
            let report = inspector
                .inspect(*kind, name)
                .await
                .map_err(|err| err.to_string())?;
            *out = if json_out {
                json(&report)?
            } else {
                shown(&report)
            };
            Ok(())
        }
        _ => {
            let names = inspector.list().await.map_err(|err| err.to_string())?;
            let mut rows = Vec::new();
            let mut unreadable = 0;
            for (kind, name) in names {
                let report = inspector.inspect(kind, &name).await;
                unreadable += usize::from(report.is_err());
                rows.push((kind, name, report));
            }
            *out = if json_out {
                listed_json(&rows)?
            } else {
                listed(&rows)
            };
            match unreadable {
                0 => Ok(()),
                n => Err(format!("{n} lock(s) could not be read")),
            }
        }
    }
}

type Row = (LockKind, String, fredlock::Result<LockReport>);

/// `list` as a table: a lock that could not be read shows its error.
fn listed(rows: &[Row]) -> String {
    let mut out = format!("{:<6} {:>5} {:>7}  NAME\n", "KIND", "HELD", "QUEUED");
    for (kind, name, report) in rows {
        // Names may hold any character: escaped, so that each lock stays on one line.
        let name = name.escape_debug();
        match report {
            Ok(report) => out.push_str(&format!(
                "{:<6} {:>5} {:>7}  {name}\n",
                kind.as_str(),
                report.held,
                report.queued
            )),
            Err(err) => out.push_str(&format!(
                "{:<6} {:>5} {:>7}  {name}  ({err})\n",
                kind.as_str(),
                "?",
                "?"
            )),
        }
    }
    out
}

/// `list` as JSON: the reports, and an entry with the error for a lock that could not be read.
fn listed_json(rows: &[Row]) -> Result<String, String> {
    let entries: Vec<serde_json::Value> = rows
        .iter()
        .map(|(kind, name, report)| match report {
            Ok(report) => serde_json::to_value(report).map_err(|err| err.to_string()),
            Err(err) => {
                Ok(serde_json::json!({"kind": kind, "name": name, "error": err.to_string()}))
            }
        })
        .collect::<Result<_, _>>()?;
    json(&entries)
}

async fn force_unlock(locks: &LockClient, kind: LockKind, name: &str) -> fredlock::Result<bool> {
    match kind {
        LockKind::Mutex => locks.mutex(name)?.force_unlock().await,
        LockKind::FairMutex => locks.fair_mutex(name)?.force_unlock().await,
        LockKind::RwLock => locks.rwlock(name)?.force_unlock().await,
        LockKind::Semaphore => {
            // The count does not matter to a force release.
            locks.semaphore(name, 1)?.force_release().await
        }
        LockKind::Latch => locks.count_down_latch(name)?.delete().await,
        _ => Err(fredlock::Error::InvalidConfig(format!(
            "cannot force {kind}"
        ))),
    }
}

fn json<T: serde::Serialize>(value: &T) -> Result<String, String> {
    serde_json::to_string_pretty(value)
        .map(|text| text + "\n")
        .map_err(|err| err.to_string())
}

/// A report as text, one line per fact, then a table of holders and one of waiters.
fn shown(report: &LockReport) -> String {
    let mut out = format!("{} {:?}\n", report.kind, report.name);
    let mut line = |label: &str, value: String| out.push_str(&format!("  {label:<11} {value}\n"));
    line("held", report.held.to_string());
    line("queued", report.queued.to_string());
    if let Some(token) = report.last_token {
        line("last token", token.to_string());
    }
    if let Some(permits) = report.permits {
        line("permits", permits.to_string());
    }
    if let Some(count) = report.count {
        line("count", count.to_string());
    }
    if !report.holders.is_empty() {
        out.push_str("  holders:\n");
        for holder in &report.holders {
            let side = match holder.side {
                HoldSide::Exclusive => "excl",
                _ => "shared",
            };
            out.push_str(&format!(
                "    {side:<6} owner {} count {} token {} lease left {}\n",
                id(&holder.owner),
                holder.hold_count,
                holder.fencing_token,
                ms(holder.remaining)
            ));
        }
    }
    if !report.waiters.is_empty() {
        out.push_str("  waiters (head first):\n");
        for waiter in &report.waiters {
            let listening = match waiter.listening {
                Some(true) => "yes",
                Some(false) => "no (client gone)",
                None => "-",
            };
            out.push_str(&format!(
                "    client {} waiter {} owner {} waited {} listening {listening}\n",
                id(&waiter.client),
                id(&waiter.waiter),
                id(&waiter.owner),
                ms(waiter.waited)
            ));
        }
    }
    out
}

fn ms(duration: Option<std::time::Duration>) -> String {
    duration.map_or_else(|| "-".into(), |d| format!("{} ms", d.as_millis()))
}

/// An id as read from Redis, for a line of text: "-" when empty, and escaped when it holds
/// anything but printable ASCII without spaces (fredlock writes no other; a foreign hash may).
fn id(text: &str) -> String {
    if text.is_empty() {
        "-".to_owned()
    } else if text.bytes().all(|b| b.is_ascii_graphic()) {
        text.to_owned()
    } else {
        format!("{text:?}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(words: &[&str]) -> Result<Option<Args>, String> {
        parse(words.iter().map(Into::into))
    }

    #[test]
    fn ids_are_escaped_only_when_they_need_it() {
        assert_eq!(id(""), "-");
        assert_eq!(id("owner-1.a:b"), "owner-1.a:b");
        assert_eq!(id("a b"), "\"a b\"");
        assert_eq!(id("x\ny\u{1b}"), "\"x\\ny\\u{1b}\"");
    }

    #[test]
    fn commands_and_options_parse() {
        let args = parsed(&[
            "--url",
            "redis://h:1",
            "--prefix",
            "p",
            "--json",
            "show",
            "rw",
            "a b",
        ])
        .unwrap()
        .unwrap();
        assert_eq!(
            (args.url.as_str(), args.prefix.as_deref(), args.json),
            ("redis://h:1", Some("p"), true)
        );
        assert!(matches!(args.command, Command::Show(LockKind::RwLock, ref name) if name == "a b"));
        assert!(matches!(
            parsed(&["list"]).unwrap().unwrap().command,
            Command::List
        ));
        assert!(matches!(
            parsed(&["force-unlock", "sem", "pool"])
                .unwrap()
                .unwrap()
                .command,
            Command::ForceUnlock(LockKind::Semaphore, _)
        ));
        assert!(parsed(&["--help"]).unwrap().is_none());
    }

    #[test]
    fn bad_arguments_are_refused() {
        for words in [
            &[][..],
            &["show", "lock", "x"],
            &["show", "mutex"],
            &["list", "x"],
            &["drop"],
            &["--bogus", "list"],
            &["show", "mutex", ""],
        ] {
            assert!(parsed(words).is_err(), "{words:?}");
        }
        let long = "n".repeat(MAX_NAME_LEN + 1);
        assert!(parsed(&["force-unlock", "sem", &long]).is_err());
        assert!(parsed(&["show", "sem", &long[1..]]).is_ok());
        for words in [
            &["--prefix", "a b", "list"][..],
            &["--url", "nonsense", "list"],
        ] {
            let args = parsed(words).unwrap().unwrap();
            assert!(args.config().is_err(), "{words:?}");
        }
    }
}
