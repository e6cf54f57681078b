//! Shared integration-test harness.
//!
//! Every integration test includes this with `mod support;`. It provides:
//!
//! * [`RedisServer`]: a throwaway `redis-server` process on a free loopback
//!   port with its own temporary directory, which can be killed, paused
//!   (SIGSTOP/SIGCONT) and restarted on the same port.
//! * [`Resp`] / [`RespConn`]: a tiny synchronous RESP2 client for assertions
//!   that must not depend on the library under test.
//! * [`spawn_worker`] / [`wait_worker`] / [`WorkerHandle`]: run an ignored test
//!   of the current test binary as a separate OS process.
//! * [`init_tracing`]: opt-in log output controlled by `RUST_LOG`.
//!
//! Only std, `tempfile`, `libc` and `tracing-subscriber` are used here.
#![allow(dead_code)]

pub mod cluster;
pub mod sentinel;

use std::fmt;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

/// Environment variable that overrides the `redis-server` binary.
pub const REDIS_SERVER_ENV: &str = "FREDLOCK_REDIS_SERVER";

/// How long [`RedisServer`] waits for a freshly spawned server to answer PING.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(10);
/// Poll interval while waiting for the server to come up.
const STARTUP_POLL: Duration = Duration::from_millis(20);
/// How many ports [`RedisServer::start_with`] tries before giving up.
const START_ATTEMPTS: usize = 5;
/// Read/write timeout of the assertion client.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(5);
/// Name of the server log file inside the server's temporary directory.
const LOG_FILE: &str = "redis-server.log";

// ---------------------------------------------------------------------------
// Locating redis-server
// ---------------------------------------------------------------------------

/// The `redis-server` binary to use: `$FREDLOCK_REDIS_SERVER` if set and
/// non-empty, else `redis-server` found on `PATH`.
///
/// Panics with installation hints if neither is available.
pub fn redis_server_bin() -> PathBuf {
    if let Some(path) = std::env::var_os(REDIS_SERVER_ENV).filter(|p| !p.is_empty()) {
        let path = PathBuf::from(path);
        if !is_executable(&path) {
            panic!(
                "{REDIS_SERVER_ENV}={} does not point to an executable file",
                path.display()
            );
        }
        return path;
    }
    if let Some(paths) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&paths) {
            let candidate = dir.join("redis-server");
            if is_executable(&candidate) {
                return candidate;
            }
        }
    }
    panic!(
        "redis-server not found: the integration tests need a local redis-server binary. \
         Run `scripts/ensure-redis` (or `apt-get install redis-server`, `brew install redis`), \
         or set {REDIS_SERVER_ENV}=/path/to/redis-server"
    );
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// A loopback port that was free a moment ago (bind to port 0, read the port,
/// drop the listener). Racy by nature; callers retry on collision.
pub fn free_port() -> u16 {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind 127.0.0.1:0");
    listener.local_addr().expect("local_addr").port()
}

// ---------------------------------------------------------------------------
// RedisServer
// ---------------------------------------------------------------------------

/// A `redis-server` child process owned by a test.
///
/// The process is SIGKILLed when the value is dropped; its temporary
/// directory (dump/AOF files and the log) is removed afterwards.
pub struct RedisServer {
    child: Option<Child>,
    pid: u32,
    port: u16,
    password: Option<String>,
    extra_args: Vec<String>,
    // Declared last so it is dropped after the process has been killed.
    dir: tempfile::TempDir,
}

impl RedisServer {
    /// Start a server with the default test configuration.
    pub fn start() -> RedisServer {
        Self::start_with(&[])
    }

    /// Start a server with extra `redis-server` arguments appended to the
    /// defaults, e.g. `&["--requirepass", "pw"]` or `&["--maxmemory", "2mb"]`.
    /// Later arguments win, so `&["--appendonly", "yes"]` overrides the default.
    pub fn start_with(args: &[&str]) -> RedisServer {
        let extra_args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        let password = requirepass_of(&extra_args);
        let dir = tempfile::Builder::new()
            .prefix("fredlock-redis-")
            .tempdir()
            .expect("create temp dir for redis-server");

        let mut failures = Vec::new();
        for attempt in 1..=START_ATTEMPTS {
            let port = free_port();
            match spawn_and_wait(&dir, port, &extra_args, password.as_deref()) {
                Ok(child) => {
                    return RedisServer {
                        pid: child.id(),
                        child: Some(child),
                        port,
                        password,
                        extra_args,
                        dir,
                    };
                }
                Err(e) => failures.push(format!("attempt {attempt} on port {port}: {e}")),
            }
        }
        panic!(
            "redis-server did not come up after {START_ATTEMPTS} attempts:\n  {}\n--- log ---\n{}",
            failures.join("\n  "),
            read_log(dir.path())
        );
    }

    /// Start a server on a given port (no retry on another port): for cluster nodes, whose
    /// bus port (port + 10000) must be free too.
    pub fn start_on(port: u16, args: &[&str]) -> std::io::Result<RedisServer> {
        let extra_args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        let password = requirepass_of(&extra_args);
        let dir = tempfile::Builder::new()
            .prefix("fredlock-redis-")
            .tempdir()?;
        let child = spawn_and_wait(&dir, port, &extra_args, password.as_deref())?;
        Ok(RedisServer {
            pid: child.id(),
            child: Some(child),
            port,
            password,
            extra_args,
            dir,
        })
    }

    /// The TCP port the server listens on (unchanged by [`restart`](Self::restart)).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Pid of the current (or, after [`kill`](Self::kill), the last) process.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// `redis://127.0.0.1:PORT`
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// `redis://:PASSWORD@127.0.0.1:PORT`
    pub fn url_with_password(&self, password: &str) -> String {
        format!("redis://:{}@127.0.0.1:{}", password, self.port)
    }

    /// The password given with `--requirepass`, if any.
    pub fn password(&self) -> Option<&str> {
        self.password.as_deref()
    }

    /// The server's working directory (dump/AOF files, log).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Whether a server process is currently owned (i.e. not killed).
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// SIGKILL the server and reap it. Idempotent.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            signal(child.id(), libc::SIGCONT);
            signal(child.id(), libc::SIGKILL);
            let _ = child.wait();
        }
    }

    /// Freeze the server (SIGSTOP): connections stay open but nothing is served.
    pub fn stop_signal(&self) {
        assert!(self.child.is_some(), "stop_signal on a killed redis-server");
        assert!(
            signal(self.pid, libc::SIGSTOP),
            "SIGSTOP {} failed",
            self.pid
        );
    }

    /// Resume a server frozen with [`stop_signal`](Self::stop_signal).
    pub fn cont_signal(&self) {
        assert!(self.child.is_some(), "cont_signal on a killed redis-server");
        assert!(
            signal(self.pid, libc::SIGCONT),
            "SIGCONT {} failed",
            self.pid
        );
    }

    /// Kill the server (if running) and start a new process on the same port,
    /// in the same directory, with the same arguments. Data survives only if
    /// persistence was enabled (e.g. `--appendonly yes`).
    pub fn restart(&mut self) {
        self.kill();
        // The port may be briefly unavailable (e.g. grabbed as the local port
        // of some outgoing connection); retry on the same port for a while.
        let deadline = Instant::now() + STARTUP_TIMEOUT;
        let mut failures = Vec::new();
        loop {
            match spawn_and_wait(
                &self.dir,
                self.port,
                &self.extra_args,
                self.password.as_deref(),
            ) {
                Ok(child) => {
                    self.pid = child.id();
                    self.child = Some(child);
                    return;
                }
                Err(e) => failures.push(e.to_string()),
            }
            if Instant::now() >= deadline || failures.len() >= START_ATTEMPTS {
                panic!(
                    "redis-server did not restart on port {}:\n  {}\n--- log ---\n{}",
                    self.port,
                    failures.join("\n  "),
                    self.log()
                );
            }
            thread::sleep(Duration::from_millis(200));
        }
    }

    /// Content of the server's log file (all runs, including restarts).
    pub fn log(&self) -> String {
        read_log(self.dir.path())
    }

    // -- assertion client ---------------------------------------------------

    /// Open a connection, authenticated if the server has a password.
    pub fn connect(&self) -> io::Result<RespConn> {
        let mut conn = RespConn::connect(self.port)?;
        if let Some(pw) = &self.password {
            match conn.cmd(&["AUTH", pw])? {
                Resp::Simple(_) => {}
                other => {
                    return Err(io::Error::other(format!("AUTH failed: {other:?}")));
                }
            }
        }
        Ok(conn)
    }

    /// Open a connection without sending AUTH.
    pub fn connect_unauthenticated(&self) -> io::Result<RespConn> {
        RespConn::connect(self.port)
    }

    /// Run one command on a fresh connection; I/O errors are returned
    /// (e.g. after [`kill`](Self::kill)). Redis errors are `Ok(Resp::Error)`.
    pub fn try_cmd(&self, args: &[&str]) -> io::Result<Resp> {
        self.connect()?.cmd(args)
    }

    /// Run one command on a fresh connection; panics on I/O errors.
    /// Redis error replies are returned as [`Resp::Error`].
    pub fn cmd(&self, args: &[&str]) -> Resp {
        self.try_cmd(args)
            .unwrap_or_else(|e| panic!("redis command {args:?} on port {} failed: {e}", self.port))
    }

    /// Like [`try_cmd`](Self::try_cmd) with binary arguments.
    pub fn try_cmd_bytes(&self, args: &[&[u8]]) -> io::Result<Resp> {
        self.connect()?.cmd_bytes(args)
    }

    /// Like [`cmd`](Self::cmd) with binary arguments.
    pub fn cmd_bytes(&self, args: &[&[u8]]) -> Resp {
        self.try_cmd_bytes(args).unwrap_or_else(|e| {
            panic!(
                "redis command {:?} on port {} failed: {e}",
                args.iter()
                    .map(|a| String::from_utf8_lossy(a))
                    .collect::<Vec<_>>(),
                self.port
            )
        })
    }

    /// All keys matching `pattern` (via SCAN), sorted.
    pub fn keys(&self, pattern: &str) -> Vec<String> {
        let mut conn = self
            .connect()
            .unwrap_or_else(|e| panic!("connect to redis on port {}: {e}", self.port));
        let mut cursor = "0".to_string();
        let mut keys = Vec::new();
        loop {
            let reply = conn
                .cmd(&["SCAN", &cursor, "MATCH", pattern, "COUNT", "1000"])
                .unwrap_or_else(|e| panic!("SCAN failed: {e}"));
            let mut parts = reply.as_array().into_iter();
            cursor = parts
                .next()
                .and_then(|c| c.as_str())
                .expect("SCAN reply without cursor");
            if let Some(batch) = parts.next() {
                keys.extend(batch.as_array().into_iter().filter_map(|k| k.as_str()));
            }
            if cursor == "0" {
                break;
            }
        }
        keys.sort();
        keys.dedup();
        keys
    }

    /// The newest event of the stream `stream` (Stream mode): its wake rule and target.
    /// An entry has one field, `e`, holding `seq|rule|target|lock id`.
    pub fn last_event(&self, stream: &str) -> (String, String) {
        let entries = self
            .cmd(&["XREVRANGE", stream, "+", "-", "COUNT", "1"])
            .as_array();
        let entry = entries.first().expect("an event").as_array();
        let fields = entry.get(1).expect("fields").as_array();
        assert_eq!(fields.len(), 2, "one field per entry: {fields:?}");
        assert_eq!(fields[0].as_str().as_deref(), Some("e"), "{fields:?}");
        let event = fields[1].as_str().expect("an event string");
        let parts: Vec<&str> = event.splitn(4, '|').collect();
        assert_eq!(parts.len(), 4, "seq|rule|target|lock id: {event}");
        (parts[1].to_owned(), parts[2].to_owned())
    }

    /// FLUSHALL (synchronously); panics unless the server answers OK. The `SYNC` option exists
    /// from Redis 6.2 on; before, a plain FLUSHALL is always synchronous.
    pub fn flushall(&self) {
        let reply = if server_version() >= (6, 2, 0) {
            self.cmd(&["FLUSHALL", "SYNC"])
        } else {
            self.cmd(&["FLUSHALL"])
        };
        assert_eq!(reply, Resp::Simple("OK".into()), "FLUSHALL failed");
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        // Must never panic: kill() only ignores errors.
        self.kill();
    }
}

impl fmt::Debug for RedisServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisServer")
            .field("port", &self.port)
            .field("pid", &self.pid)
            .field("running", &self.child.is_some())
            .field("dir", &self.dir.path())
            .field("extra_args", &self.extra_args)
            .finish()
    }
}

/// Send `sig` to `pid`; true on success.
fn signal(pid: u32, sig: libc::c_int) -> bool {
    // SAFETY: kill(2) has no memory-safety preconditions.
    unsafe { libc::kill(pid as libc::pid_t, sig) == 0 }
}

fn requirepass_of(args: &[String]) -> Option<String> {
    // Later occurrences win, like redis-server's own parsing.
    args.windows(2)
        .filter(|w| w[0].eq_ignore_ascii_case("--requirepass"))
        .map(|w| w[1].clone())
        .next_back()
        .filter(|pw| !pw.is_empty())
}

fn read_log(dir: &Path) -> String {
    match std::fs::read(dir.join(LOG_FILE)) {
        Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
        Err(e) => format!("<no log: {e}>"),
    }
}

/// Version of the server binary the tests run ([`redis_server_bin`]), from its `--version`
/// output (`Redis server v=6.2.14 sha=...`). Valkey reports its own version, which starts at
/// 7.2 and has every Redis 7.2 feature, so comparisons against Redis versions hold for it too.
/// Panics if the version cannot be read: every check that depends on it would be wrong.
pub fn server_version() -> (u32, u32, u32) {
    static VERSION: std::sync::OnceLock<(u32, u32, u32)> = std::sync::OnceLock::new();
    *VERSION.get_or_init(|| {
        let bin = redis_server_bin();
        let out = Command::new(&bin)
            .arg("--version")
            .stdin(Stdio::null())
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        let parsed = out
            .split_whitespace()
            .find_map(|word| word.strip_prefix("v="))
            .map(|v| v.split('.').map(str::parse::<u32>).collect::<Vec<_>>());
        match parsed.as_deref() {
            Some([Ok(major), Ok(minor), Ok(patch)]) => (*major, *minor, *patch),
            _ => panic!("cannot read the version of {}: {out:?}", bin.display()),
        }
    })
}

/// True when the server is at least version `min`. Otherwise prints why the calling test
/// skips (`skipped: <why> ...`) and returns false; the test then returns at once:
///
/// ```ignore
/// if !support::requires((6, 0, 0), "ACL users") {
///     return;
/// }
/// ```
pub fn requires(min: (u32, u32, u32), why: &str) -> bool {
    let version = server_version();
    if version >= min {
        return true;
    }
    let v = |(a, b, c): (u32, u32, u32)| format!("{a}.{b}.{c}");
    eprintln!(
        "skipped: {why} (needs Redis {} or later; the server is {})",
        v(min),
        v(version)
    );
    false
}

/// Startup arguments that give an older server the Redis 7 defaults the tests rely on
/// (see `scripts/test-matrix`). Empty for Redis 7+ and Valkey, so their behaviour is unchanged.
///
/// * Redis 6.2 defaults `acl-pubsub-default` to `allchannels` (7.0: `resetchannels`), so
///   `ACL SETUSER u reset ... &{prefix:*` is refused there. The option exists since 6.2
///   (and so does the problem: before 6.2, ACL users have no channel rules at all).
fn compat_args() -> &'static [&'static str] {
    let (major, minor, _) = server_version();
    if (major, minor) == (6, 2) {
        &["--acl-pubsub-default", "resetchannels"]
    } else {
        &[]
    }
}

/// Spawn redis-server on `port` and wait until it answers PING. On failure
/// the process is killed and reaped.
fn spawn_and_wait(
    dir: &tempfile::TempDir,
    port: u16,
    extra_args: &[String],
    password: Option<&str>,
) -> io::Result<Child> {
    let log = File::options()
        .create(true)
        .append(true)
        .open(dir.path().join(LOG_FILE))?;
    let log_err = log.try_clone()?;
    let port_s = port.to_string();
    let mut child = Command::new(redis_server_bin())
        .args(["--port", &port_s, "--bind", "127.0.0.1"])
        .arg("--dir")
        .arg(dir.path())
        .args(["--save", "", "--appendonly", "no"])
        .args(["--protected-mode", "no", "--daemonize", "no"])
        .args(compat_args())
        .args(extra_args)
        .current_dir(dir.path())
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log_err)
        .spawn()?;

    match wait_until_up(&mut child, port, password) {
        Ok(()) => Ok(child),
        Err(e) => {
            signal(child.id(), libc::SIGKILL);
            let _ = child.wait();
            Err(e)
        }
    }
}

fn wait_until_up(child: &mut Child, port: u16, password: Option<&str>) -> io::Result<()> {
    let deadline = Instant::now() + STARTUP_TIMEOUT;
    loop {
        if let Some(status) = child.try_wait()? {
            return Err(io::Error::other(format!(
                "redis-server exited during startup with {status}"
            )));
        }
        if ping_ok(port) {
            // Make sure the answer came from *our* process and not from some
            // other server that already owned the port (our child would be
            // about to exit with "Address already in use").
            return match server_pid(port, password) {
                Some(pid) if pid != child.id() => Err(io::Error::other(format!(
                    "port {port} is served by another redis-server (pid {pid})"
                ))),
                _ => Ok(()),
            };
        }
        if Instant::now() >= deadline {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("no PONG on port {port} within {STARTUP_TIMEOUT:?}"),
            ));
        }
        thread::sleep(STARTUP_POLL);
    }
}

/// PING answered with `+PONG`, or `-NOAUTH` (password configured: also up).
fn ping_ok(port: u16) -> bool {
    let Ok(mut conn) = RespConn::connect_timeout(port, Duration::from_millis(500)) else {
        return false;
    };
    match conn.cmd(&["PING"]) {
        Ok(Resp::Simple(s)) => s == "PONG",
        Ok(Resp::Error(e)) => e.starts_with("NOAUTH"),
        _ => false,
    }
}

/// `process_id` from `INFO server`, if it can be obtained.
fn server_pid(port: u16, password: Option<&str>) -> Option<u32> {
    let mut conn = RespConn::connect_timeout(port, Duration::from_secs(1)).ok()?;
    if let Some(pw) = password {
        if conn.cmd(&["AUTH", pw]).ok()?.is_error() {
            return None;
        }
    }
    let info = conn.cmd(&["INFO", "server"]).ok()?.as_str_opt()?;
    info.lines()
        .find_map(|l| l.strip_prefix("process_id:"))
        .and_then(|v| v.trim().parse().ok())
}

// ---------------------------------------------------------------------------
// RESP2 client
// ---------------------------------------------------------------------------

/// A RESP2 reply.
#[derive(Clone, PartialEq, Eq)]
pub enum Resp {
    Simple(String),
    Error(String),
    Int(i64),
    Bulk(Option<Vec<u8>>),
    Array(Option<Vec<Resp>>),
}

impl Resp {
    /// The integer value; numeric simple/bulk strings are parsed as well.
    /// Panics on anything else.
    pub fn as_int(&self) -> i64 {
        match self {
            Resp::Int(i) => *i,
            Resp::Simple(s) => s
                .parse()
                .unwrap_or_else(|_| panic!("expected integer reply, got {self:?}")),
            Resp::Bulk(Some(b)) => String::from_utf8_lossy(b)
                .parse()
                .unwrap_or_else(|_| panic!("expected integer reply, got {self:?}")),
            other => panic!("expected integer reply, got {other:?}"),
        }
    }

    /// String value: `Some` for simple/bulk strings (lossy UTF-8) and integers,
    /// `None` for nil bulk/array replies. Panics on errors and arrays, so a
    /// failing command shows up with its message.
    pub fn as_str(&self) -> Option<String> {
        match self {
            Resp::Simple(s) => Some(s.clone()),
            Resp::Bulk(Some(b)) => Some(String::from_utf8_lossy(b).into_owned()),
            Resp::Int(i) => Some(i.to_string()),
            Resp::Bulk(None) | Resp::Array(None) => None,
            Resp::Error(e) => panic!("expected string reply, got error: {e}"),
            Resp::Array(Some(_)) => panic!("expected string reply, got {self:?}"),
        }
    }

    /// Non-panicking variant of [`as_str`](Self::as_str): `None` for anything
    /// that is not a simple/bulk string or integer.
    pub fn as_str_opt(&self) -> Option<String> {
        match self {
            Resp::Simple(_) | Resp::Bulk(Some(_)) | Resp::Int(_) => self.as_str(),
            _ => None,
        }
    }

    /// Raw bytes of a bulk or simple string; `None` for nil.
    pub fn as_bytes(&self) -> Option<Vec<u8>> {
        match self {
            Resp::Bulk(b) => b.clone(),
            Resp::Simple(s) => Some(s.clone().into_bytes()),
            Resp::Array(None) => None,
            other => panic!("expected bulk string reply, got {other:?}"),
        }
    }

    /// The elements of an array reply (empty for a nil array). Panics otherwise.
    pub fn as_array(&self) -> Vec<Resp> {
        match self {
            Resp::Array(Some(items)) => items.clone(),
            Resp::Array(None) => Vec::new(),
            other => panic!("expected array reply, got {other:?}"),
        }
    }

    pub fn is_error(&self) -> bool {
        matches!(self, Resp::Error(_))
    }

    /// Nil bulk string or nil array.
    pub fn is_nil(&self) -> bool {
        matches!(self, Resp::Bulk(None) | Resp::Array(None))
    }

    /// The message of an error reply.
    pub fn error_message(&self) -> Option<&str> {
        match self {
            Resp::Error(e) => Some(e),
            _ => None,
        }
    }
}

impl fmt::Debug for Resp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Resp::Simple(s) => write!(f, "Simple({s:?})"),
            Resp::Error(e) => write!(f, "Error({e:?})"),
            Resp::Int(i) => write!(f, "Int({i})"),
            Resp::Bulk(None) => write!(f, "Bulk(nil)"),
            Resp::Bulk(Some(b)) => match std::str::from_utf8(b) {
                Ok(s) => write!(f, "Bulk({s:?})"),
                Err(_) => write!(f, "Bulk({b:?})"),
            },
            Resp::Array(None) => write!(f, "Array(nil)"),
            Resp::Array(Some(items)) => f.debug_list().entries(items).finish(),
        }
    }
}

/// A persistent synchronous RESP2 connection (useful for MULTI, CLIENT
/// commands or reading pub/sub pushes with [`read_reply`](Self::read_reply)).
pub struct RespConn {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

impl RespConn {
    /// Connect to `127.0.0.1:port` with the default 5 s timeouts.
    pub fn connect(port: u16) -> io::Result<RespConn> {
        Self::connect_timeout(port, CLIENT_TIMEOUT)
    }

    /// Connect with `timeout` used for connecting, reading and writing.
    pub fn connect_timeout(port: u16, timeout: Duration) -> io::Result<RespConn> {
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        let stream = TcpStream::connect_timeout(&addr, timeout)?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))?;
        Ok(RespConn {
            reader: BufReader::new(stream.try_clone()?),
            writer: stream,
        })
    }

    /// Change the read/write timeout.
    pub fn set_timeout(&mut self, timeout: Duration) -> io::Result<()> {
        self.writer.set_read_timeout(Some(timeout))?;
        self.writer.set_write_timeout(Some(timeout))
    }

    pub fn cmd(&mut self, args: &[&str]) -> io::Result<Resp> {
        let args: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
        self.cmd_bytes(&args)
    }

    pub fn cmd_bytes(&mut self, args: &[&[u8]]) -> io::Result<Resp> {
        self.send_bytes(args)?;
        self.read_reply()
    }

    /// Send a command without reading the reply.
    pub fn send(&mut self, args: &[&str]) -> io::Result<()> {
        let args: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
        self.send_bytes(&args)
    }

    pub fn send_bytes(&mut self, args: &[&[u8]]) -> io::Result<()> {
        let mut buf = Vec::with_capacity(16 + args.iter().map(|a| a.len() + 16).sum::<usize>());
        write!(buf, "*{}\r\n", args.len())?;
        for arg in args {
            write!(buf, "${}\r\n", arg.len())?;
            buf.extend_from_slice(arg);
            buf.extend_from_slice(b"\r\n");
        }
        self.writer.write_all(&buf)?;
        self.writer.flush()
    }

    /// Read the next reply (or pub/sub message).
    pub fn read_reply(&mut self) -> io::Result<Resp> {
        read_resp(&mut self.reader)
    }
}

fn read_line(r: &mut impl BufRead) -> io::Result<String> {
    let mut line = Vec::new();
    let n = r.read_until(b'\n', &mut line)?;
    if n == 0 {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "connection closed by redis",
        ));
    }
    if !line.ends_with(b"\r\n") {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("malformed RESP line {:?}", String::from_utf8_lossy(&line)),
        ));
    }
    line.truncate(line.len() - 2);
    String::from_utf8(line).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

fn parse_len(s: &str) -> io::Result<i64> {
    s.parse()
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, format!("bad RESP length {s:?}")))
}

fn read_resp(r: &mut impl BufRead) -> io::Result<Resp> {
    let line = read_line(r)?;
    let (kind, rest) = line
        .split_at_checked(1)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "empty RESP line"))?;
    match kind {
        "+" => Ok(Resp::Simple(rest.to_string())),
        "-" => Ok(Resp::Error(rest.to_string())),
        ":" => Ok(Resp::Int(parse_len(rest)?)),
        "$" => {
            let len = parse_len(rest)?;
            if len < 0 {
                return Ok(Resp::Bulk(None));
            }
            let mut data = vec![0u8; len as usize + 2];
            r.read_exact(&mut data)?;
            if !data.ends_with(b"\r\n") {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "bulk string not terminated by CRLF",
                ));
            }
            data.truncate(len as usize);
            Ok(Resp::Bulk(Some(data)))
        }
        "*" => {
            let len = parse_len(rest)?;
            if len < 0 {
                return Ok(Resp::Array(None));
            }
            let mut items = Vec::with_capacity(len as usize);
            for _ in 0..len {
                items.push(read_resp(r)?);
            }
            Ok(Resp::Array(Some(items)))
        }
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("unsupported RESP reply {line:?}"),
        )),
    }
}

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

// ---------------------------------------------------------------------------
// Tracing
// ---------------------------------------------------------------------------

/// Install a `tracing_subscriber` fmt subscriber filtered by `RUST_LOG`
/// (default `warn`), writing through libtest's capture. Safe to call many
/// times; only the first call in a process has an effect.
pub fn init_tracing() {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_test_writer()
        .try_init();
}

/// A script as `src/scripts.rs` composes it: the type-check prelude, the libraries, the
/// script. For tests that drive the Lua protocol directly with `EVAL`.
pub fn composed(libraries: &[&str], script: &str) -> String {
    let mut body = String::from(include_str!("../../lua/lib/check.lua"));
    body.push('\n');
    for library in libraries {
        body.push_str(library);
        body.push('\n');
    }
    body.push_str(script);
    body
}
