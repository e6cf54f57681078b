//! The test kit: what the integration tests share beyond the servers themselves — the
//! notification modes to run under, a [`Config`] builder, bounded waits and a checked connect.
//!
//! Bounded waits ([`bounded`], [`eventually`], [`eventually_async`]) only turn hangs into
//! failures; no test asserts how long anything took.

use std::fmt::Debug;
use std::future::Future;
use std::time::Duration;

use fredlock::{Config, Error, LockClient, NotificationMode};

use tokio::task::JoinHandle;

use super::cluster::RedisCluster;
use super::sentinel::SentinelSetup;
use super::RedisServer;

/// Every notification mode, for the tests that run once per mode.
pub const MODES: [NotificationMode; 2] = [NotificationMode::Stream, NotificationMode::PubSub];

/// Generous bound that only catches hangs.
pub const HANG: Duration = Duration::from_secs(30);

/// Interval of the polls in [`eventually`] and [`eventually_async`].
const POLL: Duration = Duration::from_millis(10);

/// What a test connects to: a URL, or a server (cluster, Sentinel setup) that knows its own.
pub trait Target {
    fn url(&self) -> String;
}

impl Target for str {
    fn url(&self) -> String {
        self.to_owned()
    }
}

impl Target for String {
    fn url(&self) -> String {
        self.clone()
    }
}

impl Target for RedisServer {
    fn url(&self) -> String {
        RedisServer::url(self)
    }
}

impl Target for RedisCluster {
    fn url(&self) -> String {
        RedisCluster::url(self)
    }
}

impl Target for SentinelSetup {
    fn url(&self) -> String {
        SentinelSetup::url(self)
    }
}

/// The default configuration for `target`, with key prefix `prefix` and notification `mode`;
/// tests set any other field on the result.
pub fn config(target: &(impl Target + ?Sized), prefix: &str, mode: NotificationMode) -> Config {
    let mut config = Config::new(target.url());
    config.key_prefix = prefix.to_owned();
    config.notification = mode;
    config
}

/// [`config`] with `shards` shards and 5 s connect and command timeouts (the defaults today,
/// stated so that the tests that rely on them do not change with the defaults).
pub fn sharded_config(
    target: &(impl Target + ?Sized),
    prefix: &str,
    mode: NotificationMode,
    shards: u16,
) -> Config {
    let mut config = config(target, prefix, mode);
    config.shards = shards;
    config.connect_timeout = Duration::from_secs(5);
    config.command_timeout = Duration::from_secs(5);
    config
}

/// The mode named by [`NotificationMode::as_str`] (worker processes get it as a string).
pub fn parse_mode(name: &str) -> NotificationMode {
    MODES
        .into_iter()
        .find(|mode| mode.as_str() == name)
        .unwrap_or_else(|| panic!("unknown notification mode {name:?}"))
}

/// `fut`'s output; panics if it takes longer than [`HANG`].
pub async fn bounded<F: Future>(what: &str, fut: F) -> F::Output {
    match tokio::time::timeout(HANG, fut).await {
        Ok(out) => out,
        Err(_) => panic!("{what}: no answer within {HANG:?} (hang)"),
    }
}

/// Polls `cond` until it holds; panics after [`HANG`].
pub async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + HANG;
    while !cond() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: condition not reached within {HANG:?}"
        );
        tokio::time::sleep(POLL).await;
    }
}

/// [`eventually`] for an asynchronous check.
pub async fn eventually_async<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + HANG;
    while !check().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: condition not reached within {HANG:?}"
        );
        tokio::time::sleep(POLL).await;
    }
}

/// A connected client; panics (showing the configuration, whose Debug hides passwords) if the
/// connection fails or hangs.
pub async fn connect(config: Config) -> LockClient {
    let shown = format!("{config:?}");
    bounded("connect", LockClient::connect(config))
        .await
        .unwrap_or_else(|e| panic!("connect with {shown}: {e}"))
}

/// Display and Debug of an error must work and say something; returns the Display text.
pub fn shown(err: &Error) -> String {
    let text = err.to_string();
    eprintln!("[observed] {err:?} => {text}");
    assert!(!text.is_empty(), "empty Display for {err:?}");
    assert!(!format!("{err:?}").is_empty());
    text
}

/// A TCP listener that accepts connections and never answers (nor closes them): its port, and
/// the task to abort when done.
pub async fn blackhole() -> (u16, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind blackhole");
    let port = listener.local_addr().expect("addr").port();
    let task = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    (port, task)
}

/// Shuts `client` down; panics if that fails or hangs.
pub async fn shutdown(client: &LockClient) {
    bounded("shutdown", client.shutdown())
        .await
        .expect("shutdown");
}

/// Runs `scenario` once per notification mode on one fresh server, with two connected
/// clients under one key prefix per mode (`<prefix>-<mode>`), and shuts them down after it.
pub async fn in_both_modes<F, Fut>(prefix: &str, scenario: F)
where
    F: Fn(NotificationMode, LockClient, LockClient) -> Fut,
    Fut: Future<Output = ()>,
{
    super::init_tracing();
    let server = RedisServer::start();
    in_both_modes_on(&server, prefix, scenario).await;
}

/// [`in_both_modes`] on `server`, for a scenario that also reaches the server directly.
pub async fn in_both_modes_on<F, Fut>(server: &RedisServer, prefix: &str, scenario: F)
where
    F: Fn(NotificationMode, LockClient, LockClient) -> Fut,
    Fut: Future<Output = ()>,
{
    for mode in MODES {
        let prefix = format!("{prefix}-{}", mode.as_str());
        let first = connect(config(server, &prefix, mode)).await;
        let second = connect(config(server, &prefix, mode)).await;
        scenario(mode, first.clone(), second.clone()).await;
        shutdown(&first).await;
        shutdown(&second).await;
    }
}

/// Today's date (UTC) as `YYYY-MM-DD`, for the generated report pages of the bench and the
/// chaos suite (days to civil date, proleptic Gregorian calendar).
pub fn utc_date() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let z = (secs / 86_400) as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}")
}

/// A task's result; panics if the task panicked or hangs.
pub async fn joined<T>(what: &str, task: JoinHandle<T>) -> T {
    bounded(what, task)
        .await
        .unwrap_or_else(|e| panic!("{what}: the task failed: {e}"))
}

/// Polls `fut` once: it must still be pending (it waits for Redis, or for the lock).
pub async fn poll_once<F: Future + Unpin>(what: &str, fut: &mut F)
where
    F::Output: Debug,
{
    tokio::select! {
        biased;
        out = fut => panic!("{what}: finished at its first poll: {out:?}"),
        _ = std::future::ready(()) => {}
    }
}

/// Runs `ask`, an acquisition of `client`'s that follows one of its deferred releases (a
/// worker loop: unlock, then lock again), on this current-thread runtime: polled once, it
/// names itself the release's successor before the release task can run, so it takes the
/// release over (checked on the client's stats). Returns it spawned, to finish.
pub async fn take_over_deferred<F>(client: &LockClient, what: &str, ask: F) -> JoinHandle<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Debug + Send + 'static,
{
    assert_eq!(
        client.stats().deferred_releases,
        1,
        "{what}: the release waits"
    );
    let mut ask = Box::pin(ask);
    poll_once(what, &mut ask).await;
    assert_eq!(client.stats().deferred_releases, 0, "{what}: taken over");
    tokio::spawn(ask)
}
