//! Security properties against a real `redis-server`: owner tokens that cannot be guessed or
//! borrowed, secrets kept out of logs and `Debug` output, and TLS (with `--features tls`). The
//! least-privilege ACL user is tested in `tests/acl.rs`.

mod support;

use std::collections::HashSet;
use std::io::Write;
use std::sync::{Arc, Mutex as StdMutex, OnceLock};
use std::time::Duration;

use fredlock::{Error, Lease, LockClient, LostCause, Owner};
use support::{bounded, connect, eventually, sharded_config, shutdown, RedisServer, MODES};

/// The hold hash of lock `name` of `kind` ("mutex", "fair", "rw") under `prefix`, via SCAN.
fn hold_key(server: &RedisServer, prefix: &str, kind: &str, name: &str) -> String {
    let keys = server.keys(&format!("{{{prefix}:*}}:{kind}:{name}"));
    assert_eq!(keys.len(), 1, "one hold key for {kind}:{name}: {keys:?}");
    keys[0].clone()
}

// ---------------------------------------------------------------------------
// 1. Owner tokens
// ---------------------------------------------------------------------------

/// Owner ids are UUID v4s (122 random bits): 32 lower-case hex digits with the version and
/// variant nibbles of v4, never repeated, and never shown in full by `Debug`.
#[test]
fn owner_ids_are_unguessable_and_distinct() {
    const OWNERS: usize = 10_000;
    let mut seen = HashSet::with_capacity(OWNERS);
    for _ in 0..OWNERS {
        let owner = Owner::new();
        let id = owner.id();
        assert_eq!(id.len(), 32, "{id}");
        assert!(
            id.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)),
            "{id}"
        );
        // xxxxxxxx xxxx Mxxx Nxxx …: M = 4 (version), N in 8..=b (RFC 4122 variant).
        assert_eq!(&id[12..13], "4", "not a v4 UUID: {id}");
        assert!("89ab".contains(&id[16..17]), "not an RFC 4122 UUID: {id}");
        let shown = format!("{owner:?}");
        assert!(!shown.contains(id), "Debug shows the whole id: {shown}");
        assert!(seen.insert(id.to_owned()), "owner id repeated: {id}");
    }
    // Clones keep the identity; fresh owners never compare equal.
    let owner = Owner::new();
    assert_eq!(owner.clone(), owner);
    assert_ne!(Owner::new(), owner);
}

/// A hold taken under owner A cannot be entered by a handle bound to another owner B (no
/// re-entry, no waiting through), for every lock kind; A's own handle re-enters with the same
/// token; only the documented admin operation `force_unlock` gets B in, and A learns it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_is_entered_only_with_its_owner_token() {
    let server = RedisServer::start();
    for mode in MODES {
        let prefix = format!("sec-owner-{}", mode.as_str());
        let locks = connect(sharded_config(&server.url(), &prefix, mode, 2)).await;
        let (a, b) = (Owner::new(), Owner::new());
        // A's renewals run every 100 ms, so a force-unlock shows on its guard promptly.
        let lease = Lease::watchdog(Duration::from_millis(300));

        for (kind, fair) in [("mutex", false), ("fair", true)] {
            let name = format!("owned-{kind}");
            let handle = if fair {
                locks.fair_mutex(&name).map(fredlock::Mutex::from)
            } else {
                locks.mutex(&name)
            }
            .expect("handle");
            let mine = handle
                .clone()
                .with_owner(&a)
                .with_lease(lease)
                .expect("lease");
            let theirs = handle.clone().with_owner(&b);
            let held = bounded("lock", mine.lock()).await.expect("lock A");
            let stored = server.cmd(&["HGET", &hold_key(&server, &prefix, kind, &name), "o"]);
            assert_eq!(stored.as_str().as_deref(), Some(a.id()), "{kind}");
            assert!(
                !format!("{held:?}").contains(a.id()),
                "guard Debug leaks the id"
            );

            let tried = bounded("try B", theirs.try_lock()).await.expect("try B");
            assert!(tried.is_none(), "{mode:?} {kind}: owner B entered A's hold");
            let waited = bounded("wait B", theirs.lock_timeout(Duration::from_millis(200)))
                .await
                .expect("wait B");
            assert!(
                waited.is_none(),
                "{mode:?} {kind}: owner B got in by waiting"
            );
            let state = bounded("state", handle.state()).await.expect("state");
            assert_eq!(state.hold_count, 1, "{kind}: B changed the hold");
            assert_eq!(state.fencing_token, Some(held.fencing_token()));

            let again = bounded("re-enter A", mine.try_lock())
                .await
                .expect("re-enter A")
                .expect("A re-enters its own hold");
            assert_eq!(again.fencing_token(), held.fencing_token());
            assert_eq!(
                bounded("state", handle.state())
                    .await
                    .expect("s")
                    .hold_count,
                2
            );

            // The admin way in: A's guards learn that their hold is gone.
            assert!(bounded("force", theirs.force_unlock())
                .await
                .expect("force"));
            let taken = bounded("lock B", theirs.lock()).await.expect("lock B");
            assert!(taken.fencing_token() > held.fencing_token());
            let cause = bounded("A learns", held.lost()).await;
            assert!(
                matches!(cause, LostCause::KeyDeleted | LostCause::OwnerChanged),
                "{kind}: {cause:?}"
            );
            assert!(bounded("stale unlock", again.unlock()).await.is_err());
            drop(held);
            bounded("unlock B", taken.unlock()).await.expect("unlock B");
        }

        let rw = locks.rwlock("owned-rw").expect("rwlock");
        let mine = rw.clone().with_owner(&a).with_lease(lease).expect("lease");
        let theirs = rw.clone().with_owner(&b);
        let write = bounded("write A", mine.write()).await.expect("write A");
        assert!(bounded("try_write B", theirs.try_write())
            .await
            .expect("tw")
            .is_none());
        assert!(bounded("try_read B", theirs.try_read())
            .await
            .expect("tr")
            .is_none());
        let timed = bounded("write B", theirs.write_timeout(Duration::from_millis(200)))
            .await
            .expect("write_timeout B");
        assert!(timed.is_none(), "{mode:?}: B got a write hold beside A's");
        let nested = bounded("write A again", mine.try_write())
            .await
            .expect("tw A")
            .expect("A re-enters its write hold");
        assert_eq!(nested.fencing_token(), write.fencing_token());
        let state = bounded("state", rw.state()).await.expect("state");
        assert_eq!((state.write_hold_count, state.readers), (2, 0));
        assert!(bounded("force", theirs.force_unlock())
            .await
            .expect("force"));
        let taken = bounded("write B", theirs.write()).await.expect("write B");
        assert!(taken.fencing_token() > write.fencing_token());
        bounded("A learns", write.lost()).await;
        drop((write, nested));
        bounded("unlock B", taken.unlock()).await.expect("unlock B");
        shutdown(&locks).await;
    }
}

// ---------------------------------------------------------------------------
// 3. Secrets in logs and Debug output
// ---------------------------------------------------------------------------

/// An in-memory sink for the process-wide `tracing` subscriber of this test binary.
#[derive(Clone, Default)]
struct Captured(Arc<StdMutex<Vec<u8>>>);

impl Captured {
    fn text(&self) -> String {
        let bytes = self.0.lock().unwrap_or_else(|p| p.into_inner());
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let mut bytes = self.0.lock().unwrap_or_else(|p| p.into_inner());
        bytes.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Installs (once) a TRACE-level subscriber for every target (fredlock, and fred through the
/// `log` bridge) writing into memory, and returns its buffer.
fn captured_logs() -> &'static Captured {
    static CAPTURED: OnceLock<Captured> = OnceLock::new();
    CAPTURED.get_or_init(|| {
        let sink = Captured::default();
        let writer = sink.clone();
        tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .try_init()
            .expect("this test binary installs the only subscriber");
        sink
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passwords_never_reach_logs_or_debug_output() {
    const PASSWORD: &str = "s3cret-pw";
    const WRONG: &str = "wr0ng-pw";
    let logs = captured_logs();
    let server = RedisServer::start_with(&["--requirepass", PASSWORD]);
    let mut shown = Vec::new();

    for mode in MODES {
        let prefix = format!("sec-pw-{}", mode.as_str());
        let config = sharded_config(&server.url_with_password(PASSWORD), &prefix, mode, 2);
        shown.push(format!("{config:?} {config:#?} {}", config.redacted_url()));
        let locks = connect(config.clone()).await;
        shown.push(format!("{locks:?} {locks:#?}"));
        let mutex = locks.mutex("pw-cycle").expect("mutex");
        let guard = bounded("lock", mutex.lock()).await.expect("lock");
        shown.push(format!("{guard:?} {mutex:?}"));
        let waiting = {
            let mutex = mutex.clone();
            tokio::spawn(async move { mutex.lock().await })
        };
        eventually("the waiter waits", || locks.stats().waiting == 1).await;
        bounded("unlock", guard.unlock()).await.expect("unlock");
        let next = bounded("waiter", waiting)
            .await
            .expect("task")
            .expect("lock");
        drop(next);

        let mut wrong = config.clone();
        wrong.url = server.url_with_password(WRONG);
        wrong.connect_timeout = Duration::from_secs(2);
        let err = bounded("wrong password", LockClient::connect(wrong.clone()))
            .await
            .expect_err("wrong password");
        assert!(matches!(err, Error::Auth(_)), "{err:?}");
        shown.push(format!("{wrong:?} {err} {err:?} {err:#?}"));
        let mut source = std::error::Error::source(&err);
        while let Some(cause) = source {
            shown.push(format!("{cause} {cause:?}"));
            source = cause.source();
        }
        // An error from a closed client.
        shutdown(&locks).await;
        let closed = bounded("after shutdown", mutex.lock())
            .await
            .expect_err("closed");
        shown.push(format!("{closed} {closed:?}"));
    }

    let logs = logs.text();
    assert!(
        logs.contains("fredlock"),
        "the subscriber captured nothing from fredlock:\n{logs}"
    );
    for (what, text) in [("logs", &logs), ("Debug/Display", &shown.join("\n"))] {
        for secret in [PASSWORD, WRONG] {
            assert!(!text.contains(secret), "{what} contain {secret:?}:\n{text}");
        }
    }
}

// ---------------------------------------------------------------------------
// 4. TLS
// ---------------------------------------------------------------------------

#[cfg(feature = "tls")]
mod tls {
    use super::*;
    use fred::interfaces::ClientLike;
    use fred::rustls::pki_types::pem::PemObject;
    use fred::rustls::pki_types::CertificateDer;
    use fred::rustls::{ClientConfig, RootCertStore};
    use fred::types::config::{Config as FredConfig, TlsConnector};
    use fredlock::NotificationMode;
    use std::path::Path;
    use std::process::Command;
    use support::mutex_handoff;

    /// Runs `openssl` with `args` in `dir`; panics with its output on failure.
    fn openssl(dir: &Path, args: &[&str]) {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .expect("run the openssl CLI");
        assert!(
            out.status.success(),
            "openssl {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// A throwaway CA and a server certificate for IP 127.0.0.1 signed by it (P-256 keys):
    /// `ca.crt`, `server.crt`, `server.key` in `dir`.
    fn make_certificates(dir: &Path) {
        let ec = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];
        let mut ca = vec![
            "req",
            "-x509",
            "-days",
            "2",
            "-subj",
            "/CN=fredlock test CA",
        ];
        ca.extend(ec);
        ca.extend([
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ]);
        openssl(dir, &ca);
        let mut csr = vec!["req", "-subj", "/CN=127.0.0.1", "-keyout", "server.key"];
        csr.extend(ec);
        csr.extend(["-out", "server.csr"]);
        openssl(dir, &csr);
        std::fs::write(
            dir.join("server.ext"),
            "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n",
        )
        .expect("write extensions");
        openssl(
            dir,
            &[
                "x509",
                "-req",
                "-in",
                "server.csr",
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-days",
                "2",
                "-extfile",
                "server.ext",
                "-out",
                "server.crt",
            ],
        );
    }

    /// A server with a plain port (for the harness and assertions) and a TLS port (for the lock
    /// clients), retrying with other ports on a collision.
    fn start_tls_server(certs: &Path) -> (RedisServer, u16) {
        let file = |name: &str| certs.join(name).to_string_lossy().into_owned();
        let (cert, key, ca) = (file("server.crt"), file("server.key"), file("ca.crt"));
        let mut failures = Vec::new();
        for _ in 0..5 {
            let tls_port = support::free_port();
            let tls_port_arg = tls_port.to_string();
            let args = [
                "--tls-port",
                tls_port_arg.as_str(),
                "--tls-cert-file",
                cert.as_str(),
                "--tls-key-file",
                key.as_str(),
                "--tls-ca-cert-file",
                ca.as_str(),
                "--tls-auth-clients",
                "no",
            ];
            match RedisServer::start_on(support::free_port(), &args) {
                Ok(server) => return (server, tls_port),
                Err(err) => failures.push(err.to_string()),
            }
        }
        panic!("no TLS redis-server: {failures:?}");
    }

    /// A connected fred client for `rediss://127.0.0.1:port` trusting only the throwaway CA.
    async fn tls_client(certs: &Path, port: u16) -> fred::clients::Client {
        let mut roots = RootCertStore::empty();
        let ca = CertificateDer::from_pem_file(certs.join("ca.crt")).expect("parse ca.crt");
        roots.add(ca).expect("trust the CA");
        let rustls = ClientConfig::builder()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let mut config =
            FredConfig::from_url(&format!("rediss://127.0.0.1:{port}")).expect("rediss url");
        config.tls = Some(TlsConnector::from(rustls).into());
        let client = fred::clients::Client::new(config, None, None, None);
        bounded("TLS connect", client.init())
            .await
            .expect("TLS handshake");
        client
    }

    /// Local ports (`laddr`) of every connection but the one asking.
    fn server_side_ports(server: &RedisServer) -> Vec<String> {
        let list = server
            .cmd(&["CLIENT", "LIST"])
            .as_str()
            .expect("CLIENT LIST");
        list.lines()
            .filter(|line| !line.contains("cmd=client|list"))
            .filter_map(|line| {
                line.split_whitespace()
                    .find_map(|f| f.strip_prefix("laddr="))
            })
            .filter_map(|addr| addr.rsplit(':').next().map(str::to_owned))
            .collect()
    }

    /// Lock cycle and an event wakeup over TLS in both modes; every lock connection (commands
    /// and notifier) uses the TLS port.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn tls_lock_cycle_and_event_wakeup() {
        if !support::requires((6, 0, 0), "TLS") {
            return;
        }
        let certs = tempfile::tempdir().expect("tempdir");
        make_certificates(certs.path());
        let (server, tls_port) = start_tls_server(certs.path());
        for mode in MODES {
            let prefix = format!("sec-tls-{}", mode.as_str());
            let config = sharded_config("redis://unused", &prefix, mode, 2);
            let holder = bounded(
                "from_client",
                LockClient::from_client(tls_client(certs.path(), tls_port).await, config.clone()),
            )
            .await
            .expect("TLS lock client");
            let waiter = bounded(
                "from_client",
                LockClient::from_client(tls_client(certs.path(), tls_port).await, config),
            )
            .await
            .expect("TLS lock client");
            let ports = server_side_ports(&server);
            assert!(ports.len() >= 4, "{ports:?}");
            assert!(
                ports.iter().all(|p| *p == tls_port.to_string()),
                "a lock connection bypassed TLS: {ports:?} (TLS port {tls_port})"
            );

            let mutex = |client: &LockClient| client.mutex("tls-cycle").expect("mutex");
            mutex_handoff(&mutex(&holder), &mutex(&waiter), &waiter).await;
            let fair = |client: &LockClient| {
                client
                    .fair_mutex("tls-fair")
                    .map(fredlock::Mutex::from)
                    .expect("fair")
            };
            mutex_handoff(&fair(&holder), &fair(&waiter), &waiter).await;

            for client in [&holder, &waiter] {
                shutdown(client).await;
                let _ = client.redis().quit().await;
            }
        }
    }

    /// A client that does not trust the server's CA is refused with a connect error.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn tls_untrusted_certificate_is_refused() {
        if !support::requires((6, 0, 0), "TLS") {
            return;
        }
        let certs = tempfile::tempdir().expect("tempdir");
        make_certificates(certs.path());
        let (_server, tls_port) = start_tls_server(certs.path());
        let mut config = sharded_config(
            &format!("rediss://127.0.0.1:{tls_port}"),
            "sec-tls-untrusted",
            NotificationMode::Stream,
            2,
        );
        config.connect_timeout = Duration::from_secs(3);
        let err = bounded("connect", LockClient::connect(config))
            .await
            .expect_err("the throwaway CA is not a system root");
        assert!(matches!(err, Error::Connect(_)), "{err:?}");
        eprintln!("untrusted certificate: {err}");
    }
}
