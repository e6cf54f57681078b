//! Tests for the integration-test harness in `tests/support`.

mod support;

use std::time::Duration;

use support::{RedisServer, Resp, RespConn};

#[test]
fn start_set_get_keys_flushall() {
    support::init_tracing();
    let server = RedisServer::start();
    assert_ne!(server.port(), 6379);
    assert_eq!(server.url(), format!("redis://127.0.0.1:{}", server.port()));
    assert!(server.pid() > 0);

    assert_eq!(server.cmd(&["PING"]), Resp::Simple("PONG".into()));
    assert_eq!(server.cmd(&["SET", "h:a", "1"]), Resp::Simple("OK".into()));
    assert_eq!(
        server.cmd(&["SET", "h:b", "two"]),
        Resp::Simple("OK".into())
    );
    assert_eq!(
        server.cmd(&["SET", "other", "x"]),
        Resp::Simple("OK".into())
    );
    assert_eq!(server.cmd(&["GET", "h:b"]).as_str().as_deref(), Some("two"));
    assert_eq!(server.cmd(&["GET", "missing"]).as_str(), None);
    assert!(server.cmd(&["GET", "missing"]).is_nil());
    assert_eq!(server.cmd(&["INCR", "h:a"]).as_int(), 2);
    assert_eq!(server.cmd(&["GET", "h:a"]).as_int(), 2);

    let err = server.cmd(&["INCR", "h:b"]);
    assert!(err.is_error(), "{err:?}");
    assert!(err.error_message().unwrap().contains("not an integer"));

    assert_eq!(
        server.keys("h:*"),
        vec!["h:a".to_string(), "h:b".to_string()]
    );
    assert_eq!(server.cmd(&["DBSIZE"]).as_int(), 3);

    let list = server.cmd(&["RPUSH", "l", "x", "y"]);
    assert_eq!(list.as_int(), 2);
    let items = server.cmd(&["LRANGE", "l", "0", "-1"]).as_array();
    let items: Vec<_> = items.iter().map(|r| r.as_str().unwrap()).collect();
    assert_eq!(items, ["x", "y"]);

    server.flushall();
    assert!(server.keys("*").is_empty());
    assert_eq!(server.cmd(&["DBSIZE"]).as_int(), 0);

    let log = server.log();
    assert!(log.contains("Ready to accept connections"), "log:\n{log}");
}

#[test]
fn binary_args_round_trip() {
    let server = RedisServer::start();
    let value: Vec<u8> = (0u8..=255).chain([b'\r', b'\n', 0]).collect();
    let key: &[u8] = b"bin\x00key\r\n";
    assert_eq!(
        server.cmd_bytes(&[b"SET", key, &value]),
        Resp::Simple("OK".into())
    );
    assert_eq!(
        server.cmd_bytes(&[b"GET", key]),
        Resp::Bulk(Some(value.clone()))
    );
    assert_eq!(
        server.cmd_bytes(&[b"STRLEN", key]).as_int(),
        value.len() as i64
    );
}

#[test]
fn eval_and_persistent_connection() {
    let server = RedisServer::start();
    let mut conn = server.connect().unwrap();
    let reply = conn
        .cmd(&[
            "EVAL",
            "return {1, 'a', redis.call('SET', KEYS[1], ARGV[1])}",
            "1",
            "k",
            "v",
        ])
        .unwrap();
    let parts = reply.as_array();
    assert_eq!(parts[0], Resp::Int(1));
    assert_eq!(parts[1].as_str().as_deref(), Some("a"));
    assert_eq!(parts[2], Resp::Simple("OK".into()));

    // Pub/sub pushes can be read with read_reply.
    let sub = conn.cmd(&["SUBSCRIBE", "chan"]).unwrap().as_array();
    assert_eq!(sub[0].as_str().as_deref(), Some("subscribe"));
    assert_eq!(server.cmd(&["PUBLISH", "chan", "hello"]).as_int(), 1);
    let msg = conn.read_reply().unwrap().as_array();
    assert_eq!(msg[0].as_str().as_deref(), Some("message"));
    assert_eq!(msg[2].as_str().as_deref(), Some("hello"));
}

#[test]
fn restart_keeps_port_and_dir() {
    let mut server = RedisServer::start();
    let port = server.port();
    let pid = server.pid();
    let dir = server.dir().to_path_buf();
    assert_eq!(server.cmd(&["SET", "k", "v"]), Resp::Simple("OK".into()));

    server.restart();
    assert_eq!(server.port(), port);
    assert_eq!(server.dir(), dir.as_path());
    assert_ne!(server.pid(), pid);
    assert_eq!(server.cmd(&["PING"]), Resp::Simple("PONG".into()));
    // No persistence by default: the data is gone.
    assert_eq!(server.cmd(&["GET", "k"]), Resp::Bulk(None));
    // The log spans both runs.
    assert_eq!(
        server.log().matches("Ready to accept connections").count(),
        2
    );
}

#[test]
fn restart_with_aof_keeps_data() {
    let mut server = RedisServer::start_with(&["--appendonly", "yes"]);
    assert_eq!(
        server.cmd(&["CONFIG", "GET", "appendonly"]).as_array()[1]
            .as_str()
            .as_deref(),
        Some("yes")
    );
    assert_eq!(server.cmd(&["SET", "k", "v"]), Resp::Simple("OK".into()));
    let pid = server.pid();
    server.restart();
    assert_ne!(server.pid(), pid);
    assert_eq!(server.cmd(&["GET", "k"]).as_str().as_deref(), Some("v"));
}

#[test]
fn kill_makes_ping_fail() {
    let mut server = RedisServer::start();
    assert!(server.try_cmd(&["PING"]).is_ok());
    let pid = server.pid();
    server.kill();
    assert!(!server.is_running());
    assert!(server.try_cmd(&["PING"]).is_err());
    // The process is gone (reaped): signal 0 fails.
    assert_ne!(unsafe { libc::kill(pid as libc::pid_t, 0) }, 0);
    // kill is idempotent and restart brings it back on the same port.
    server.kill();
    server.restart();
    assert_eq!(server.cmd(&["PING"]), Resp::Simple("PONG".into()));
}

#[test]
fn requirepass_auth() {
    let server = RedisServer::start_with(&["--requirepass", "pw"]);
    assert_eq!(server.password(), Some("pw"));
    assert_eq!(
        server.url_with_password("pw"),
        format!("redis://:pw@127.0.0.1:{}", server.port())
    );

    // cmd() authenticates automatically.
    assert_eq!(server.cmd(&["SET", "k", "v"]), Resp::Simple("OK".into()));
    assert_eq!(server.cmd(&["GET", "k"]).as_str().as_deref(), Some("v"));

    // Without AUTH the server refuses.
    let mut raw = server.connect_unauthenticated().unwrap();
    let reply = raw.cmd(&["GET", "k"]).unwrap();
    assert!(
        reply
            .error_message()
            .is_some_and(|e| e.starts_with("NOAUTH")),
        "{reply:?}"
    );
    let wrong = raw.cmd(&["AUTH", "nope"]).unwrap();
    assert!(wrong.is_error(), "{wrong:?}");
    assert_eq!(raw.cmd(&["AUTH", "pw"]).unwrap(), Resp::Simple("OK".into()));
    assert_eq!(
        raw.cmd(&["GET", "k"]).unwrap().as_str().as_deref(),
        Some("v")
    );
}

#[test]
fn extra_args_are_applied() {
    let server = RedisServer::start_with(&["--maxmemory", "2mb"]);
    let reply = server.cmd(&["CONFIG", "GET", "maxmemory"]).as_array();
    assert_eq!(reply[1].as_str().as_deref(), Some("2097152"));
    let save = server.cmd(&["CONFIG", "GET", "save"]).as_array();
    assert_eq!(save[1].as_str().as_deref(), Some(""));
}

#[test]
fn stop_and_cont_signal() {
    let server = RedisServer::start();
    let mut conn = RespConn::connect(server.port()).unwrap();
    assert_eq!(conn.cmd(&["PING"]).unwrap(), Resp::Simple("PONG".into()));

    server.stop_signal();
    conn.set_timeout(Duration::from_millis(300)).unwrap();
    let err = conn.cmd(&["PING"]).unwrap_err();
    assert!(
        matches!(
            err.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ),
        "{err:?}"
    );

    server.cont_signal();
    conn.set_timeout(Duration::from_secs(5)).unwrap();
    // The PING sent while stopped is answered first, then the new one.
    assert_eq!(conn.read_reply().unwrap(), Resp::Simple("PONG".into()));
    assert_eq!(conn.cmd(&["PING"]).unwrap(), Resp::Simple("PONG".into()));
}

#[test]
fn parallel_servers_get_distinct_ports() {
    let servers: Vec<_> = (0..4).map(|_| RedisServer::start()).collect();
    let mut ports: Vec<_> = servers.iter().map(|s| s.port()).collect();
    ports.sort();
    ports.dedup();
    assert_eq!(ports.len(), servers.len());
    for s in &servers {
        let info = s.cmd(&["INFO", "server"]).as_str().unwrap();
        assert!(info.contains(&format!("process_id:{}", s.pid())), "{info}");
    }
}

// --- worker processes ---------------------------------------------------------

#[test]
#[ignore]
fn worker_echo() {
    if !support::is_worker() {
        return;
    }
    let port: u16 = support::worker_param("ECHO_PORT").unwrap().parse().unwrap();
    let mut conn = RespConn::connect(port).unwrap();
    let n = conn.cmd(&["INCR", "workers"]).unwrap().as_int();
    support::emit_result(format_args!("pid {}", std::process::id()));
    println!("RESULT counter {n}");
    println!("noise that is not a result");
    if support::worker_param("ECHO_FAIL").is_some() {
        panic!("worker asked to fail");
    }
}

#[test]
fn worker_processes_report_results() {
    let server = RedisServer::start();
    let children: Vec<_> = (0..3)
        .map(|_| support::spawn_worker("worker_echo", &[("ECHO_PORT", server.port().to_string())]))
        .collect();
    let mut counters = Vec::new();
    for child in children {
        let pid = child.id();
        let results = support::wait_worker(child);
        assert_eq!(results.len(), 2, "{results:?}");
        assert_eq!(results[0], format!("pid {pid}"));
        counters.push(
            results[1]
                .strip_prefix("counter ")
                .unwrap()
                .parse::<i64>()
                .unwrap(),
        );
    }
    counters.sort();
    assert_eq!(counters, [1, 2, 3]);
    assert_eq!(server.cmd(&["GET", "workers"]).as_int(), 3);
}

#[test]
#[should_panic(expected = "failed with")]
fn failing_worker_panics_in_wait() {
    let server = RedisServer::start();
    let child = support::spawn_worker(
        "worker_echo",
        &[
            ("ECHO_PORT", server.port().to_string()),
            ("ECHO_FAIL", "1".to_string()),
            // Keep the expected panic's output short.
            ("RUST_BACKTRACE", "0".to_string()),
        ],
    );
    support::wait_worker(child);
}

#[test]
#[ignore]
fn worker_sleeper() {
    if !support::is_worker() {
        return;
    }
    support::emit_result("ready");
    std::thread::sleep(Duration::from_secs(60));
}

#[test]
fn worker_handle_observe_and_kill() {
    let worker = support::spawn_worker_handle("worker_sleeper", &[]);
    assert_eq!(worker.expect_result(Duration::from_secs(30)), "ready");
    let pid = worker.pid();
    worker.kill();
    assert_ne!(unsafe { libc::kill(pid as libc::pid_t, 0) }, 0);
}
