//! A Sentinel deployment on loopback: one master, one replica and three sentinels, every
//! process killed by pid on drop.

use std::fs;
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use super::{free_port, redis_server_bin, RedisServer, RespConn};

const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// The service name the sentinels monitor.
pub const SERVICE: &str = "fredlock";

/// One sentinel process.
pub struct Sentinel {
    child: Child,
    pub port: u16,
    _dir: tempfile::TempDir,
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Sentinel {
    /// Runs one command against this sentinel.
    pub fn cmd(&self, args: &[&str]) -> std::io::Result<super::Resp> {
        RespConn::connect(self.port)?.cmd(args)
    }
}

/// Master, replica and sentinels.
pub struct SentinelSetup {
    pub servers: Vec<RedisServer>,
    pub sentinels: Vec<Sentinel>,
}

impl SentinelSetup {
    pub fn start() -> SentinelSetup {
        let master = RedisServer::start();
        let replica_of =
            ["--replicaof", "127.0.0.1", &master.port().to_string()].map(str::to_owned);
        let replica =
            RedisServer::start_with(&replica_of.iter().map(String::as_str).collect::<Vec<_>>());
        let sentinels = (0..3).map(|_| start_sentinel(master.port())).collect();
        let setup = SentinelSetup {
            servers: vec![master, replica],
            sentinels,
        };
        setup.wait_ready();
        setup
    }

    /// `redis-sentinel://` URL naming every sentinel.
    pub fn url(&self) -> String {
        let mut ports = self.sentinels.iter().map(|s| s.port);
        let first = ports.next().expect("sentinels");
        let rest: Vec<String> = ports.map(|p| format!("node=127.0.0.1:{p}")).collect();
        format!(
            "redis-sentinel://127.0.0.1:{first}/?{}&sentinelServiceName={SERVICE}",
            rest.join("&")
        )
    }

    /// The port the sentinels currently name as master.
    pub fn master_port(&self) -> Option<u16> {
        let reply = self
            .sentinels
            .first()?
            .cmd(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE])
            .ok()?;
        reply.as_array().get(1)?.as_str()?.parse().ok()
    }

    /// Index of the server with `port`.
    pub fn server_on(&self, port: u16) -> usize {
        self.servers
            .iter()
            .position(|s| s.port() == port)
            .expect("known server")
    }

    /// Waits until all sentinels agree on the master and could promote every replica, and the
    /// replicas are in sync.
    pub fn wait_ready(&self) {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if self.ready() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "sentinel setup never became ready"
            );
            thread::sleep(Duration::from_millis(100));
        }
    }

    fn ready(&self) -> bool {
        let Some(master) = self.master_port() else {
            return false;
        };
        let agreed = self.sentinels.iter().all(|s| {
            s.cmd(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE])
                .ok()
                .and_then(|r| r.as_array().get(1).and_then(|p| p.as_str()))
                .and_then(|p| p.parse::<u16>().ok())
                == Some(master)
        });
        let replicas: Vec<u16> = self
            .servers
            .iter()
            .filter(|s| s.is_running() && s.port() != master)
            .map(RedisServer::port)
            .collect();
        let promotable = self.sentinels.iter().all(|s| {
            let ports = promotable_replicas(s, master);
            replicas.iter().all(|port| ports.contains(port))
        });
        let synced = self
            .servers
            .iter()
            .filter(|s| s.is_running() && s.port() != master)
            .all(|s| {
                s.try_cmd(&["INFO", "replication"])
                    .ok()
                    .and_then(|i| i.as_str_opt())
                    .is_some_and(|i| {
                        i.contains("master_link_status:up")
                            && i.contains(&format!("master_port:{master}"))
                    })
            });
        agreed && promotable && synced
    }

    /// Waits until the sentinels name a master other than `old`.
    pub fn wait_new_master(&self, old: u16) -> u16 {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Some(port) = self.master_port().filter(|&p| p != old) {
                return port;
            }
            assert!(Instant::now() < deadline, "no failover happened");
            thread::sleep(Duration::from_millis(100));
        }
    }
}

/// Ports of the replicas of `master` that `sentinel` would promote now, by the rules of its
/// replica selection: the sentinel reaches the replica (no `disconnected`, `s_down` or
/// `o_down` flag), priority is not 0, and the replica's last `INFO` reply showed its link to
/// this master up (`master-link-status` ok, `master-link-down-time` 0).
///
/// The replica's own `INFO` saying `master_link_status:up` is not enough: a sentinel polls a
/// replica's `INFO` only every second while its link is down, and Redis 5.0 reports a replica
/// that never reached its master as `master_link_down_since_seconds:<now>`, down since 1970
/// (6.2 and later: -1). For up to a second after the replica synced, the sentinel still holds
/// that figure, far beyond the 10 x down-after-milliseconds it accepts, and `SENTINEL FAILOVER`
/// answers `NOGOODSLAVE No suitable replica to promote`.
fn promotable_replicas(sentinel: &Sentinel, master: u16) -> Vec<u16> {
    let Ok(reply) = sentinel.cmd(&["SENTINEL", "REPLICAS", SERVICE]) else {
        return Vec::new();
    };
    reply
        .as_array()
        .iter()
        .filter_map(|replica| {
            // A flat array of field names and values.
            let fields = replica.as_array();
            let field = |name: &str| {
                fields
                    .chunks(2)
                    .find(|pair| pair[0].as_str().as_deref() == Some(name))
                    .and_then(|pair| pair.get(1)?.as_str())
            };
            let promotable = field("flags").as_deref() == Some("slave")
                && field("slave-priority").is_some_and(|p| p != "0")
                && field("master-link-status").as_deref() == Some("ok")
                && field("master-link-down-time").as_deref() == Some("0")
                && field("master-port") == Some(master.to_string());
            if promotable {
                field("port")?.parse().ok()
            } else {
                None
            }
        })
        .collect()
}

fn start_sentinel(master_port: u16) -> Sentinel {
    for _ in 0..5 {
        let port = free_port();
        let dir = tempfile::Builder::new()
            .prefix("fredlock-sentinel-")
            .tempdir()
            .expect("temp dir");
        let conf = dir.path().join("sentinel.conf");
        fs::write(
            &conf,
            format!(
                "port {port}\nbind 127.0.0.1\ndir {}\nsentinel monitor {SERVICE} 127.0.0.1 {master_port} 2\n\
                 sentinel down-after-milliseconds {SERVICE} 1000\nsentinel failover-timeout {SERVICE} 5000\n\
                 sentinel parallel-syncs {SERVICE} 1\n",
                dir.path().display()
            ),
        )
        .expect("write sentinel.conf");
        let log = fs::File::create(dir.path().join("sentinel.log")).expect("log");
        let child = Command::new(redis_server_bin())
            .arg(&conf)
            .arg("--sentinel")
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .stdin(Stdio::null())
            .spawn()
            .expect("spawn sentinel");
        let sentinel = Sentinel {
            child,
            port,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if sentinel.cmd(&["PING"]).is_ok() {
                return sentinel;
            }
            thread::sleep(Duration::from_millis(20));
        }
    }
    panic!("no sentinel came up");
}
