//! [`RedisServer`]: a throwaway `redis-server` process on a free loopback port, and how the
//! binary is found and its version read.

use std::fmt;
use std::fs::File;
use std::io;
use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use super::resp::{Resp, RespConn};

/// Environment variable that overrides the `redis-server` binary.
pub const REDIS_SERVER_ENV: &str = "FREDLOCK_REDIS_SERVER";

/// How long [`RedisServer`] waits for a freshly spawned server to answer PING.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(10);
/// Poll interval while waiting for the server to come up.
const STARTUP_POLL: Duration = Duration::from_millis(20);
/// How many ports [`RedisServer::start_with`] tries before giving up.
const START_ATTEMPTS: usize = 5;
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
pub(super) fn signal(pid: u32, sig: libc::c_int) -> bool {
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
