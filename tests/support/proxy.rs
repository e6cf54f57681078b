//! [`ReplyDropper`]: a TCP proxy in front of a `redis-server` that can swallow the next reply
//! from Redis and cut the connection, as a network failure between "the command ran" and "its
//! reply arrived" would. fred then reconnects (and re-sends what it may re-send). It can also
//! hold back every `SUBSCRIBE` for a while, as a slow link to the server would.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The proxy; it runs until the test's runtime ends.
pub struct ReplyDropper {
    port: u16,
    faults: Arc<Faults>,
}

#[derive(Default)]
struct Faults {
    /// The next reply is swallowed.
    armed: AtomicBool,
    /// How long a write that carries a `SUBSCRIBE` is held back (ms).
    subscribe_delay_ms: AtomicU64,
}

impl ReplyDropper {
    /// A proxy on a free loopback port in front of the server on `upstream`.
    pub async fn start(upstream: u16) -> ReplyDropper {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let port = listener.local_addr().expect("addr").port();
        let faults = Arc::new(Faults::default());
        let shared = faults.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let faults = shared.clone();
                tokio::spawn(async move {
                    if let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)).await {
                        pipe(client, server, faults).await;
                    }
                });
            }
        });
        ReplyDropper { port, faults }
    }

    /// The URL of the proxy.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// A client configuration through the proxy under `prefix`, whose notifier stays silent
    /// while a reply is being swallowed (its blocking read outlasts any test).
    pub fn config(&self, prefix: &str) -> fredlock::Config {
        let mut config = fredlock::Config::new(self.url());
        config.key_prefix = prefix.into();
        config.notifier_block = std::time::Duration::from_secs(120);
        config
    }

    /// The next reply from Redis, on any connection, is swallowed and its connection cut.
    pub fn arm(&self) {
        self.faults.armed.store(true, Ordering::SeqCst);
    }

    /// From now on, every write that carries a `SUBSCRIBE` reaches Redis `delay` late (and the
    /// writes after it on its connection with it).
    pub fn delay_subscriptions(&self, delay: Duration) {
        let ms = delay.as_millis() as u64;
        self.faults.subscribe_delay_ms.store(ms, Ordering::SeqCst);
    }
}

async fn pipe(client: TcpStream, server: TcpStream, faults: Arc<Faults>) {
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let upstream = async {
        let mut buf = vec![0u8; 16 * 1024];
        while let Ok(n) = client_read.read(&mut buf).await {
            let delay = faults.subscribe_delay_ms.load(Ordering::SeqCst);
            if delay > 0 && buf[..n].windows(9).any(|w| w == b"SUBSCRIBE") {
                tokio::time::sleep(Duration::from_millis(delay)).await;
            }
            if n == 0 || server_write.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
    };
    let downstream = async {
        let mut buf = vec![0u8; 16 * 1024];
        while let Ok(n) = server_read.read(&mut buf).await {
            if n == 0 || faults.armed.swap(false, Ordering::SeqCst) {
                break; // reply swallowed: drop both directions
            }
            if client_write.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
    };
    tokio::select! {
        _ = upstream => {}
        _ = downstream => {}
    }
}
