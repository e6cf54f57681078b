//! The parent's side of a worker process: spawn it, read its statistics, stop or kill it by pid.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::options::WorkerOptions;
use crate::stats::WorkerStats;

/// Sends `sig` to `pid`; true on success.
pub fn signal(pid: u32, sig: libc::c_int) -> bool {
    // SAFETY: kill(2) has no memory-safety preconditions.
    unsafe { libc::kill(pid as libc::pid_t, sig) == 0 }
}

/// A worker process and the last statistics it printed.
pub struct Worker {
    child: Child,
    pub pid: u32,
    stats: Arc<StdMutex<Option<WorkerStats>>>,
    done: Arc<AtomicBool>,
    reader: Option<JoinHandle<()>>,
    /// Killed on purpose (sigkill scenario) or because it hung.
    killed: bool,
    exited: bool,
}

impl Worker {
    pub fn spawn(options: &WorkerOptions) -> std::io::Result<Worker> {
        let exe = std::env::current_exe()?;
        let mut child = Command::new(exe)
            .args(options.to_args())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| std::io::Error::other("worker stdout not piped"))?;
        let stats = Arc::new(StdMutex::new(None));
        let done = Arc::new(AtomicBool::new(false));
        let (sink, finished) = (stats.clone(), done.clone());
        let reader = std::thread::spawn(move || read_worker_output(stdout, &sink, &finished));
        Ok(Worker {
            pid: child.id(),
            child,
            stats,
            done,
            reader: Some(reader),
            killed: false,
            exited: false,
        })
    }

    pub fn is_live(&self) -> bool {
        !self.killed && !self.exited
    }

    pub fn kill(&mut self) {
        signal(self.pid, libc::SIGCONT);
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.killed = true;
        self.join_reader();
    }

    fn join_reader(&mut self) {
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
    }

    /// Waits until `deadline` for the exit; false when it had to be killed.
    pub fn wait_until(&mut self, deadline: Instant) -> bool {
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                self.exited = true;
                self.join_reader();
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.kill();
        false
    }

    /// Exited without its final `DONE` report (a crash).
    pub fn crashed(&self) -> bool {
        self.exited && !self.done.load(Ordering::Acquire)
    }

    pub fn last_stats(&self) -> Option<WorkerStats> {
        self.stats.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        if self.is_live() {
            self.kill();
        }
    }
}

fn read_worker_output(
    stdout: std::process::ChildStdout,
    sink: &StdMutex<Option<WorkerStats>>,
    done: &AtomicBool,
) {
    for line in BufReader::new(stdout).lines() {
        let Ok(line) = line else { break };
        let (tag, json) = line.split_once(' ').unwrap_or((line.as_str(), ""));
        if tag != "STATS" && tag != "DONE" {
            continue;
        }
        if let Ok(stats) = serde_json::from_str::<WorkerStats>(json) {
            *sink.lock().unwrap_or_else(|p| p.into_inner()) = Some(stats);
        }
        if tag == "DONE" {
            done.store(true, Ordering::Release);
        }
    }
}
