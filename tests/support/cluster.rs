//! A real Redis Cluster on loopback: N masters with R replicas each, created with
//! `redis-cli --cluster create`, every node a [`RedisServer`] killed by pid on drop.

use std::net::{Ipv4Addr, TcpListener};
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use super::{RedisServer, Resp};

const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// A running cluster.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

/// A port whose cluster bus port (port + 10000) is free too.
fn cluster_port() -> u16 {
    for _ in 0..1000 {
        let Ok(listener) = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)) else {
            continue;
        };
        let Ok(port) = listener.local_addr().map(|a| a.port()) else {
            continue;
        };
        if port > 55_000 {
            continue;
        }
        if TcpListener::bind((Ipv4Addr::LOCALHOST, port + 10_000)).is_ok() {
            return port;
        }
    }
    panic!("no free port pair for a cluster node");
}

fn redis_cli() -> String {
    std::env::var("FREDLOCK_REDIS_CLI").unwrap_or_else(|_| "redis-cli".to_owned())
}

impl RedisCluster {
    /// Starts `masters` masters with `replicas` replicas each and waits until the cluster is
    /// healthy everywhere.
    pub fn start(masters: usize, replicas: usize) -> RedisCluster {
        let args = [
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            "2000",
            "--cluster-replica-validity-factor",
            "0",
        ];
        let mut nodes = Vec::new();
        while nodes.len() < masters * (1 + replicas) {
            if let Ok(node) = RedisServer::start_on(cluster_port(), &args) {
                nodes.push(node);
            }
        }
        let addresses: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect();
        let output = Command::new(redis_cli())
            .arg("--cluster")
            .arg("create")
            .args(&addresses)
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .output()
            .expect("redis-cli (package redis-tools) must be installed for cluster tests");
        assert!(
            output.status.success(),
            "redis-cli --cluster create failed:\n{}\n{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        let cluster = RedisCluster { nodes };
        cluster.wait_healthy();
        cluster
    }

    /// Waits until every running node says `cluster_state:ok` and agrees on the masters.
    pub fn wait_healthy(&self) {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            let healthy = self.nodes.iter().filter(|n| n.is_running()).all(|node| {
                let state_ok = node
                    .try_cmd(&["CLUSTER", "INFO"])
                    .ok()
                    .and_then(|info| info.as_str_opt())
                    .is_some_and(|info| info.contains("cluster_state:ok"));
                // Replicas must have finished their sync (WAIT and failovers depend on it).
                let synced = node
                    .try_cmd(&["INFO", "replication"])
                    .ok()
                    .and_then(|info| info.as_str_opt())
                    .is_some_and(|info| {
                        !info.contains("role:slave") || info.contains("master_link_status:up")
                    });
                state_ok && synced
            });
            if healthy && self.views_agree() {
                return;
            }
            assert!(Instant::now() < deadline, "cluster never became healthy");
            thread::sleep(Duration::from_millis(100));
        }
    }

    /// Whether every running node's `CLUSTER NODES` shows the same roles (which node is a
    /// master, which one replicates which master). Redis 6.2 spreads a new replica's role
    /// over the cluster bus only with later pings, seconds after `master_link_status:up`;
    /// until its master knows it, `CLUSTER FAILOVER` on the replica times out silently.
    fn views_agree(&self) -> bool {
        let views: Vec<Option<Vec<(String, bool, String)>>> = self
            .nodes
            .iter()
            .filter(|n| n.is_running())
            .map(|node| {
                let nodes = node.try_cmd(&["CLUSTER", "NODES"]).ok()?.as_str_opt()?;
                let mut roles: Vec<(String, bool, String)> = nodes
                    .lines()
                    .filter_map(|line| {
                        let f: Vec<&str> = line.split_whitespace().collect();
                        let replica = f.get(2)?.split(',').any(|flag| flag == "slave");
                        Some((f[0].to_owned(), replica, f.get(3)?.to_string()))
                    })
                    .collect();
                roles.sort();
                Some(roles)
            })
            .collect();
        views.iter().all(|v| v.is_some() && *v == views[0])
    }

    /// `redis-cluster://` URL naming every node.
    pub fn url(&self) -> String {
        let mut nodes = self.nodes.iter().map(|n| format!("127.0.0.1:{}", n.port()));
        let first = nodes.next().expect("nodes");
        let rest: Vec<String> = nodes.map(|n| format!("node={n}")).collect();
        format!("redis-cluster://{first}?{}", rest.join("&"))
    }

    /// Indexes of the nodes that are running masters.
    pub fn masters(&self) -> Vec<usize> {
        (0..self.nodes.len())
            .filter(|&i| self.role(i).as_deref() == Some("master"))
            .collect()
    }

    fn role(&self, i: usize) -> Option<String> {
        let node = &self.nodes[i];
        if !node.is_running() {
            return None;
        }
        let info = node.try_cmd(&["INFO", "replication"]).ok()?.as_str_opt()?;
        info.lines()
            .find_map(|l| l.strip_prefix("role:"))
            .map(|r| r.trim().to_owned())
    }

    /// The index of the master serving `key`.
    pub fn master_of(&self, key: &str) -> usize {
        let slot = self.nodes[self.masters()[0]]
            .cmd(&["CLUSTER", "KEYSLOT", key])
            .as_int();
        self.masters()
            .into_iter()
            .find(|&i| {
                let slots = self.nodes[i].cmd(&["CLUSTER", "SLOTS"]);
                let me = self.nodes[i].port() as i64;
                slots.as_array().iter().any(|range| {
                    let parts = range.as_array();
                    parts.len() >= 3
                        && parts[0].as_int() <= slot
                        && slot <= parts[1].as_int()
                        && parts[2].as_array().get(1).map(Resp::as_int) == Some(me)
                })
            })
            .expect("a master owns every slot")
    }

    /// Index of a replica of master `master`.
    pub fn replica_of(&self, master: usize) -> usize {
        let master_port = self.nodes[master].port().to_string();
        (0..self.nodes.len())
            .find(|&i| {
                i != master
                    && self.nodes[i].is_running()
                    && self.nodes[i]
                        .try_cmd(&["INFO", "replication"])
                        .ok()
                        .and_then(|r| r.as_str_opt())
                        .is_some_and(|info| {
                            info.contains("role:slave")
                                && info.contains(&format!("master_port:{master_port}"))
                        })
            })
            .expect("the master has a replica")
    }

    /// Promotes `replica` with `CLUSTER FAILOVER` and waits until it is a master.
    pub fn failover(&self, replica: usize) {
        assert_eq!(
            self.nodes[replica].cmd(&["CLUSTER", "FAILOVER"]),
            Resp::Simple("OK".into())
        );
        self.wait_role(replica, "master");
        self.wait_healthy();
    }

    /// Kills master `master` and waits until one of its replicas took over.
    pub fn kill_master(&mut self, master: usize) -> usize {
        let replica = self.replica_of(master);
        self.nodes[master].kill();
        self.wait_role(replica, "master");
        self.wait_healthy();
        replica
    }

    fn wait_role(&self, node: usize, role: &str) {
        let deadline = Instant::now() + READY_TIMEOUT;
        while self.role(node).as_deref() != Some(role) {
            assert!(Instant::now() < deadline, "node {node} never became {role}");
            thread::sleep(Duration::from_millis(100));
        }
    }
}
