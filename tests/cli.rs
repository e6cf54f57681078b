//! The `fredlock` command-line tool against a real redis-server: `list`, `show` (text and
//! JSON), `force-unlock`, and its exit statuses.

mod support;

use std::process::Output;

use fredlock::{Error, NotHeldReason, NotificationMode, Owner};
use support::{config, connect, mutex_keys, shutdown, RedisServer};

/// Runs the tool with `args` against `server` (off the runtime's threads: it blocks).
async fn fredlock(server: &RedisServer, args: &[&str]) -> Output {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_fredlock"));
    command
        .args(["--url", &server.url(), "--prefix", "cli"])
        .args(args);
    tokio::task::spawn_blocking(move || command.output().expect("the tool runs"))
        .await
        .unwrap()
}

fn stdout(output: &Output) -> String {
    assert!(
        output.status.success(),
        "status {:?}, stderr {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tool_lists_shows_and_frees_locks() {
    support::init_tracing();
    let server = RedisServer::start();
    let unused = fredlock(&server, &["list"]).await;
    assert_eq!(unused.status.code(), Some(1), "no layout recorded yet");

    let mut used = config(&server, "cli", NotificationMode::PubSub);
    used.shards = 3;
    let service = connect(used).await;
    let owner = Owner::new();
    let guard = service
        .mutex("orders")
        .unwrap()
        .with_owner(&owner)
        .lock()
        .await
        .unwrap();
    let pool = service.semaphore("pool", 4).unwrap();
    let permit = pool.acquire().await.unwrap();

    let listed = stdout(&fredlock(&server, &["list"]).await);
    assert!(
        listed.contains("mutex") && listed.contains("orders"),
        "{listed}"
    );
    assert!(
        listed.contains("sem") && listed.contains("pool"),
        "{listed}"
    );

    let shown = stdout(&fredlock(&server, &["show", "mutex", "orders"]).await);
    assert!(shown.contains(owner.id()), "{shown}");
    assert!(
        shown.contains(&guard.fencing_token().to_string()),
        "{shown}"
    );

    let json = stdout(&fredlock(&server, &["--json", "show", "sem", "pool"]).await);
    let report: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(report["kind"], "sem");
    assert_eq!(report["permits"], 4);
    assert_eq!(report["held"], 1);
    assert_eq!(
        report["holders"][0]["fencing_token"],
        permit.fencing_token()
    );
    assert!(report["holders"][0]["remaining_ms"].is_u64());

    let freed = stdout(&fredlock(&server, &["force-unlock", "mutex", "orders"]).await);
    assert!(freed.contains("freed"), "{freed}");
    match guard.unlock().await {
        Err(Error::NotHeld {
            reason: NotHeldReason::Expired,
            ..
        }) => {}
        other => panic!("a force-unlocked hold: {other:?}"),
    }
    let again = stdout(&fredlock(&server, &["force-unlock", "mutex", "orders"]).await);
    assert!(again.contains("was not held"), "{again}");

    let freed = stdout(&fredlock(&server, &["--json", "force-unlock", "sem", "pool"]).await);
    let freed: serde_json::Value = serde_json::from_str(&freed).unwrap();
    assert_eq!(freed["freed"], true, "{freed}");

    let refused = fredlock(&server, &["show", "lock", "orders"]).await;
    assert_eq!(refused.status.code(), Some(2), "an unknown kind");
    let refused = fredlock(&server, &["force-unlock", "mutex", ""]).await;
    assert_eq!(refused.status.code(), Some(2), "an empty name");
    assert!(permit.unlock().await.is_err(), "the permit was taken back");
    shutdown(&service).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_and_show_write_nothing_and_list_goes_on_past_a_foreign_key() {
    support::init_tracing();
    let server = RedisServer::start();
    let service = connect(config(&server, "cli", NotificationMode::Stream)).await;
    let guard = service.mutex("a").unwrap().lock().await.unwrap();
    let permit = service.semaphore("b", 2).unwrap().acquire().await.unwrap();
    // A foreign value where a lock of the prefix would live.
    let foreign = mutex_keys("cli", 16, "zz").hold;
    server.cmd(&["SET", &foreign, "not a lock"]);
    let before = snapshot_all(&server);

    let listed = fredlock(&server, &["list"]).await;
    assert_eq!(listed.status.code(), Some(1), "one lock could not be read");
    let text = String::from_utf8_lossy(&listed.stdout);
    for name in ["  a", "  b", "  zz  ("] {
        assert!(text.contains(name), "{name:?} in {text}");
    }
    let json = fredlock(&server, &["--json", "list"]).await;
    let entries: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    let entries = entries.as_array().unwrap();
    assert_eq!(entries.len(), 3, "{entries:?}");
    assert!(entries
        .iter()
        .any(|e| e["name"] == "zz" && e["error"].is_string()));
    assert!(entries.iter().any(|e| e["name"] == "a" && e["held"] == 1));
    stdout(&fredlock(&server, &["show", "sem", "b"]).await);
    assert_eq!(snapshot_all(&server), before, "list and show wrote nothing");

    guard.unlock().await.unwrap();
    permit.unlock().await.unwrap();
    shutdown(&service).await;
}

/// Every key of the server, with its type (the values of lock keys change with time: a
/// lease's end, not a tool's write).
fn snapshot_all(server: &RedisServer) -> Vec<(String, String)> {
    let mut keys: Vec<(String, String)> = server
        .keys("*")
        .into_iter()
        .map(|key| {
            let kind = server.cmd(&["TYPE", &key]).as_str().unwrap_or_default();
            (key, kind)
        })
        .collect();
    keys.sort();
    keys
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unusable_arguments_exit_2_before_any_connection() {
    // No server at all: what is refused is refused before a connection is tried.
    let port = support::free_port().to_string();
    let url = format!("redis://127.0.0.1:{port}");
    let long = "n".repeat(fredlock::MAX_NAME_LEN + 1);
    for (args, says) in [
        (&["show", "mutex", ""][..], "name"),
        (&["force-unlock", "sem", &long], "name"),
        (&["--prefix", "a b", "list"], "key_prefix"),
        (&["--url", "nonsense", "list"], "url"),
    ] {
        let args: Vec<String> = ["--url", &url]
            .iter()
            .chain(args)
            .map(|arg| arg.to_string())
            .collect();
        let output = tokio::task::spawn_blocking(move || {
            std::process::Command::new(env!("CARGO_BIN_EXE_fredlock"))
                .args(&args)
                .output()
                .expect("the tool runs")
        })
        .await
        .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains(says), "{says}: {stderr}");
        assert!(!stderr.contains("connect"), "{stderr}");
    }
}

#[test]
fn closed_output_streams_are_not_a_crash() {
    // `fredlock --help | head -0` and a bad command with stderr closed: the tool still exits
    // with its status (0 and 2), not with a panic (101).
    use std::process::{Command, Stdio};
    for (args, status) in [(&["--help"][..], 0), (&["bogus"][..], 2)] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_fredlock"))
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the tool starts");
        // Both pipes closed before the tool writes anything.
        drop(child.stdout.take());
        drop(child.stderr.take());
        let exit = child.wait().expect("the tool exits");
        assert_eq!(exit.code(), Some(status), "{args:?}");
    }
}
