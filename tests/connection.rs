//! Servers the client cannot use (SPEC §5): nothing listening, a silent peer, a peer that
//! does not speak RESP, a wrong password or user, a database index that does not exist. Every
//! test talks to its own throwaway `redis-server` or listener (see `tests/support`).

mod support;

use std::time::Duration;

use fredlock::{Config, Error, LockClient, NotificationMode};
use support::{
    blackhole, bounded, connect, exists, hold_owner, mutex_keys, sharded_config, shown, shutdown,
    RedisServer, Resp, MODES,
};

fn quick(url: &str, prefix: &str) -> Config {
    let mut config = sharded_config(url, prefix, NotificationMode::Stream, 1);
    config.connect_timeout = Duration::from_secs(1);
    config.command_timeout = Duration::from_secs(1);
    config.reconnect_max_delay = Duration::from_millis(200);
    config
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_redis_is_a_connect_error() {
    support::init_tracing();
    let port = support::free_port(); // nothing listens here
    for mode in MODES {
        let mut config = quick(&format!("redis://127.0.0.1:{port}"), "fail-unreachable");
        config.notification = mode;
        let err = bounded("connect to a closed port", LockClient::connect(config))
            .await
            .expect_err("nothing listens");
        assert!(matches!(err, Error::Connect(_)), "{mode:?}: {err:?}");
        assert!(err.is_transient());
        shown(&err);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_server_gives_connect_or_timeout_error() {
    support::init_tracing();
    let (port, hole) = blackhole().await;
    for mode in MODES {
        let mut config = quick(&format!("redis://127.0.0.1:{port}"), "fail-blackhole");
        config.notification = mode;
        let err = bounded("connect to a blackhole", LockClient::connect(config))
            .await
            .expect_err("the blackhole never answers");
        assert!(
            matches!(err, Error::Connect(_) | Error::Timeout(_)),
            "{mode:?}: {err:?}"
        );
        shown(&err);
    }
    hole.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_speaking_server_gives_typed_error() {
    support::init_tracing();
    // Accepts, writes something that is not RESP, and closes.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let task = tokio::spawn(async move {
        use tokio::io::AsyncWriteExt;
        while let Ok((mut socket, _)) = listener.accept().await {
            let _ = socket.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n").await;
            let _ = socket.shutdown().await;
        }
    });
    let err = bounded(
        "connect to a non-Redis server",
        LockClient::connect(quick(&format!("redis://127.0.0.1:{port}"), "fail-garbage")),
    )
    .await
    .expect_err("not a Redis server");
    assert!(
        matches!(
            err,
            Error::Connect(_) | Error::Timeout(_) | Error::Redis(_) | Error::Protocol { .. }
        ),
        "{err:?}"
    );
    shown(&err);
    task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_password_is_an_auth_error() {
    support::init_tracing();
    let password = "s3cret-Pa55";
    let server = RedisServer::start_with(&["--requirepass", password]);
    let wrong = "not-the-Pa55word";

    for mode in MODES {
        let prefix = format!("fail-auth-{}", mode.as_str());
        for (what, url) in [
            ("wrong password", server.url_with_password(wrong)),
            (
                "wrong user",
                format!("redis://nobody:{password}@127.0.0.1:{}", server.port()),
            ),
        ] {
            let mut config = quick(&url, &prefix);
            config.notification = mode;
            let shown_config = format!("{config:?}");
            assert!(!shown_config.contains(wrong) && !shown_config.contains(password));
            let err = bounded(what, LockClient::connect(config))
                .await
                .expect_err(what);
            assert!(matches!(err, Error::Auth(_)), "{mode:?} {what}: {err:?}");
            let text = shown(&err);
            assert!(!text.contains(wrong) && !text.contains(password), "{text}");
            assert!(!format!("{err:?}").contains(wrong));
        }

        // No password at all: the server answers NOAUTH to the first command.
        let mut config = quick(&server.url(), &prefix);
        config.notification = mode;
        let err = bounded("no password", LockClient::connect(config))
            .await
            .expect_err("no password");
        assert!(
            matches!(err, Error::Auth(_)),
            "{mode:?} no password: {err:?}"
        );
        shown(&err);

        // The right password works, and never shows in Debug output.
        let config = sharded_config(&server.url_with_password(password), &prefix, mode, 1);
        let locks = connect(config).await;
        assert!(!format!("{locks:?}").contains(password));
        assert!(!format!("{:?}", locks.config()).contains(password));
        let mutex = locks.mutex("authed").expect("mutex");
        let guard = bounded("lock", mutex.lock()).await.expect("lock");
        let keys = mutex_keys(&prefix, 1, "authed");
        assert_eq!(
            hold_owner(&server, &keys.hold).as_deref(),
            Some(guard.owner().id())
        );
        bounded("unlock", guard.unlock()).await.expect("unlock");
        shutdown(&locks).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_database_index_is_a_typed_error() {
    support::init_tracing();
    let server = RedisServer::start(); // 16 databases
    let err = bounded(
        "connect to db 99",
        LockClient::connect(quick(
            &format!("redis://127.0.0.1:{}/99", server.port()),
            "fail-db",
        )),
    )
    .await
    .expect_err("db 99 does not exist");
    assert!(
        matches!(
            err,
            Error::Connect(_) | Error::Redis(_) | Error::InvalidConfig(_)
        ),
        "{err:?}"
    );
    shown(&err);
    assert!(
        server.keys("*").is_empty(),
        "nothing may be written to db 0"
    );

    // The last database works, and the lock's keys land there.
    let locks = connect(sharded_config(
        &format!("redis://127.0.0.1:{}/15", server.port()),
        "fail-db",
        NotificationMode::Stream,
        1,
    ))
    .await;
    let guard = bounded("lock", locks.mutex("in-db-15").expect("mutex").lock())
        .await
        .expect("lock");
    let keys = mutex_keys("fail-db", 1, "in-db-15");
    let mut conn = server.connect().expect("connect");
    assert_eq!(
        conn.cmd(&["SELECT", "15"]).expect("select"),
        Resp::Simple("OK".into())
    );
    assert_eq!(
        conn.cmd(&["HGET", &keys.hold, "o"])
            .expect("hget")
            .as_str()
            .as_deref(),
        Some(guard.owner().id())
    );
    assert!(!exists(&server, &keys.hold), "db 0 must stay empty");
    bounded("unlock", guard.unlock()).await.expect("unlock");
    shutdown(&locks).await;
}
