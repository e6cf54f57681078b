use fred::prelude::*;
use fredlock::{Config, LockClient};
use std::time::{Duration, Instant};

fn p50(mut v: Vec<Duration>) -> f64 {
    v.sort();
    v[v.len() / 2].as_secs_f64() * 1e6
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let url = std::env::var("REDIS_URL").unwrap();
    let locks = LockClient::connect(Config::new(&url)).await.unwrap();
    let redis = locks.redis().clone();
    let m = locks.mutex("probe").unwrap();
    let ret1: String = redis.script_load("return 1").await.unwrap();
    for round in 0..3 {
        let mut ping = vec![];
        let mut ev = vec![];
        let mut cyc = vec![];
        let mut l = vec![];
        let mut u = vec![];
        for _ in 0..3000 {
            let t = Instant::now();
            let _: String = redis.ping(None).await.unwrap();
            ping.push(t.elapsed());
            let t = Instant::now();
            let _: i64 = redis
                .evalsha(
                    &ret1,
                    vec!["{p:0}:mutex:x", "{p:0}:mutex.fence:x", "{p:0}:mutex.wait:x"],
                    vec![
                        "0123456789abcdef0123456789abcdef",
                        "30000",
                        "0123456789abcdef0123456789abcdef",
                        "0",
                        "0",
                    ],
                )
                .await
                .unwrap();
            ev.push(t.elapsed());
            let t = Instant::now();
            let g = m.lock().await.unwrap();
            l.push(t.elapsed());
            let t2 = Instant::now();
            g.unlock().await.unwrap();
            u.push(t2.elapsed());
            cyc.push(t.elapsed());
        }
        println!("round {round}: ping {:.1} evalsha(ret1,3k5a) {:.1} lock {:.1} unlock {:.1} cycle {:.1} ratio {:.2}", p50(ping.clone()), p50(ev), p50(l), p50(u), p50(cyc.clone()), p50(cyc)/p50(ping));
    }
    locks.shutdown().await.unwrap();
}
