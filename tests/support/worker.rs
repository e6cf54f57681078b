//! Worker processes: an ignored test of the current test binary run as a separate OS process,
//! reporting results on stdout.

use std::fmt;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use super::server::signal;

// ---------------------------------------------------------------------------
// Worker processes
// ---------------------------------------------------------------------------

/// Set (to "1") in the environment of every process started by [`spawn_worker`].
pub const WORKER_ENV: &str = "FREDLOCK_TEST_WORKER";
/// Prefix of the stdout lines a worker reports results with.
pub const RESULT_PREFIX: &str = "RESULT ";
/// Default bound for [`wait_worker`].
pub const WORKER_TIMEOUT: Duration = Duration::from_secs(120);

/// Start the ignored test `test_name` of the current test binary as a separate
/// process with extra environment variables. Stdout is piped (see
/// [`wait_worker`]), stderr is inherited.
///
/// The worker side is an ignored test that returns early unless
/// [`is_worker`] is true and reads its parameters with [`worker_param`]:
///
/// ```ignore
/// #[test]
/// #[ignore]
/// fn worker_entry() {
///     if !support::is_worker() { return; }
///     let url = support::worker_param("REDIS_URL").unwrap();
///     support::emit_result(format_args!("acquired {url}"));
/// }
/// ```
pub fn spawn_worker(test_name: &str, envs: &[(&str, String)]) -> Child {
    worker_command(test_name, envs)
        .spawn()
        .unwrap_or_else(|e| panic!("failed to spawn worker {test_name}: {e}"))
}

fn worker_command(test_name: &str, envs: &[(&str, String)]) -> Command {
    let exe = std::env::current_exe().expect("current_exe");
    let mut cmd = Command::new(exe);
    cmd.args([
        "--ignored",
        "--exact",
        test_name,
        "--nocapture",
        "--test-threads=1",
    ])
    .env(WORKER_ENV, "1")
    .envs(envs.iter().map(|(k, v)| (*k, v.as_str())))
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::inherit());
    cmd
}

/// Wait (at most 120 s, then kill and panic) for a worker from
/// [`spawn_worker`] and return its `RESULT ` lines with the prefix stripped.
/// Panics with the captured stdout if the worker failed.
pub fn wait_worker(child: Child) -> Vec<String> {
    wait_worker_timeout(child, WORKER_TIMEOUT)
}

/// [`wait_worker`] with a custom bound.
pub fn wait_worker_timeout(mut child: Child, timeout: Duration) -> Vec<String> {
    let stdout = child
        .stdout
        .take()
        .expect("worker stdout must be piped (use spawn_worker)");
    let reader = thread::spawn(move || {
        let mut out = Vec::new();
        let _ = BufReader::new(stdout).read_to_end(&mut out);
        String::from_utf8_lossy(&out).into_owned()
    });
    let status = wait_child_bounded(&mut child, timeout);
    let output = reader.join().unwrap_or_default();
    match status {
        None => panic!(
            "worker pid {} did not finish within {timeout:?}; killed it. stdout:\n{output}",
            child.id()
        ),
        Some(status) if !status.success() => {
            panic!(
                "worker pid {} failed with {status}. stdout:\n{output}",
                child.id()
            )
        }
        Some(_) => output.lines().filter_map(result_of_line).collect(),
    }
}

/// Wait for `child` up to `timeout`; on timeout SIGKILL it, reap it and
/// return `None`.
fn wait_child_bounded(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) if Instant::now() < deadline => thread::sleep(Duration::from_millis(20)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
        }
    }
}

/// Extract the payload of a result line. With `--test-threads=1` libtest
/// prints `test NAME ... ` without a newline before the test runs, so the
/// first result line may carry that prefix.
fn result_of_line(line: &str) -> Option<String> {
    if let Some(rest) = line.strip_prefix(RESULT_PREFIX) {
        return Some(rest.to_string());
    }
    let idx = line.find(RESULT_PREFIX)?;
    if line.starts_with("test ") && line[..idx].ends_with(" ... ") {
        Some(line[idx + RESULT_PREFIX.len()..].to_string())
    } else {
        None
    }
}

/// An env var of the worker process (`None` if unset or not UTF-8).
pub fn worker_param(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

/// Whether this process was started by [`spawn_worker`]. Worker tests should
/// return immediately otherwise (e.g. under `cargo test -- --ignored`).
pub fn is_worker() -> bool {
    std::env::var_os(WORKER_ENV).is_some_and(|v| v == "1")
}

/// Report a result line from a worker (`RESULT <value>` on its own line).
pub fn emit_result(value: impl fmt::Display) {
    let mut out = io::stdout().lock();
    // Leading newline: detach from a pending `test NAME ... ` from libtest.
    let _ = write!(out, "\n{RESULT_PREFIX}{value}\n");
    let _ = out.flush();
}

/// A running worker whose `RESULT ` lines can be observed while it runs, e.g.
/// to wait until it holds a lock before SIGKILLing it.
pub struct WorkerHandle {
    child: Child,
    lines: mpsc::Receiver<String>,
    output: std::sync::Arc<std::sync::Mutex<String>>,
    reader: Option<thread::JoinHandle<()>>,
}

/// Like [`spawn_worker`], but returns a [`WorkerHandle`].
pub fn spawn_worker_handle(test_name: &str, envs: &[(&str, String)]) -> WorkerHandle {
    let mut child = spawn_worker(test_name, envs);
    let stdout = child.stdout.take().expect("piped stdout");
    let (tx, rx) = mpsc::channel();
    let output = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let sink = output.clone();
    let reader = thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if let Ok(mut out) = sink.lock() {
                out.push_str(&line);
                out.push('\n');
            }
            if let Some(result) = result_of_line(&line) {
                let _ = tx.send(result);
            }
        }
    });
    WorkerHandle {
        child,
        lines: rx,
        output,
        reader: Some(reader),
    }
}

impl WorkerHandle {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The next `RESULT ` payload, or `None` if none arrives within `timeout`
    /// (or the worker's stdout closed).
    pub fn next_result(&self, timeout: Duration) -> Option<String> {
        self.lines.recv_timeout(timeout).ok()
    }

    /// Like [`next_result`](Self::next_result) but panics (with the output so
    /// far) when nothing arrives.
    pub fn expect_result(&self, timeout: Duration) -> String {
        self.next_result(timeout).unwrap_or_else(|| {
            panic!(
                "worker pid {} produced no RESULT line within {timeout:?}. stdout so far:\n{}",
                self.pid(),
                self.output()
            )
        })
    }

    /// Stdout captured so far.
    pub fn output(&self) -> String {
        self.output.lock().map(|o| o.clone()).unwrap_or_default()
    }

    /// Send a signal (e.g. `libc::SIGKILL`, `libc::SIGSTOP`) to the worker.
    pub fn signal(&self, sig: libc::c_int) -> bool {
        signal(self.child.id(), sig)
    }

    /// SIGKILL the worker and reap it (simulates a crashed client).
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
    }

    /// Wait (bounded by 120 s) and return the remaining `RESULT ` payloads
    /// not yet taken with [`next_result`](Self::next_result). Panics if the
    /// worker fails.
    pub fn wait(mut self) -> Vec<String> {
        let status = wait_child_bounded(&mut self.child, WORKER_TIMEOUT);
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
        match status {
            None => panic!(
                "worker pid {} did not finish within {WORKER_TIMEOUT:?}; killed it. stdout:\n{}",
                self.child.id(),
                self.output()
            ),
            Some(s) if !s.success() => panic!(
                "worker pid {} failed with {s}. stdout:\n{}",
                self.child.id(),
                self.output()
            ),
            Some(_) => self.lines.try_iter().collect(),
        }
    }
}

impl Drop for WorkerHandle {
    fn drop(&mut self) {
        if self.reader.is_some() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
