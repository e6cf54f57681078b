//! The FIFO floor: a token ring, the least that any first-come-first-served lock built on one
//! Redis can do when its turns go from process to process.
//!
//! Why it is in the bench: a fair lock serves its waiters in arrival order, so under load
//! nearly every hand-off wakes another process, one that has slept since its last turn. The
//! polling peers re-take their lock in the releasing task instead (95–99 % of their
//! acquisitions), which no fair lock may do. This ring measures what strict turn-taking costs
//! on the machine of the run with nothing else in the way: no script, no lease, no queue, no
//! fencing. A turn is the loop's critical section (`GET` + `SET`) and one `PUBLISH` to the
//! channel of the next turn, whose process waits for it on a subscription.
//!
//! The order is fixed and alternates processes: task `t` of process `p` takes turn
//! `t × processes + p`, so with several processes every hand-off crosses to another one, as a
//! fair lock's does when its queue interleaves processes. Its acquisitions/s are the ceiling
//! for a Redis-mediated FIFO hand-off, the yardstick for `FairMutex` beside it in S7.

use std::sync::Arc;
use std::time::Duration;

use fred::clients::Client;
use fred::interfaces::{ClientLike, EventInterface, PubsubInterface};
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use crate::redis::plain_client;

/// How long a task waits for its turn before it gives the run up (the ring lost its token).
const TURN_TIMEOUT: Duration = Duration::from_secs(10);

/// One process's side of the ring, shared by its tasks.
struct Shared {
    publisher: Client,
    subscriber: Client,
    /// The turns of this process's tasks, by task index.
    turns: Vec<Notify>,
    processes: usize,
    total: usize,
    /// The channel name of every turn is this followed by the turn number.
    channel: String,
    dispatcher: JoinHandle<()>,
}

/// The ring as one task of a process sees it: the lock and, once its turn came, the guard.
#[derive(Clone)]
pub struct Ring {
    shared: Arc<Shared>,
    turn: usize,
}

impl Ring {
    /// Joins the ring whose turn channels start with `channel` as process `process` of
    /// `processes`, each with `tasks` tasks, passing turns on through `publisher` (the
    /// client of the critical section, as the naive peer releases through it): subscribes to the channels of this process's turns (before the caller says `READY`,
    /// so no hand-off is published to a channel nobody listens on yet). Process 0's first task
    /// holds the first turn. The returned value stands for task 0; see [`Ring::for_task`].
    pub async fn join(
        url: &str,
        publisher: Client,
        channel: String,
        process: usize,
        processes: usize,
        tasks: usize,
    ) -> Result<Ring, String> {
        let subscriber = plain_client(url).await?;
        let turns: Vec<Notify> = (0..tasks).map(|_| Notify::new()).collect();
        let mut messages = subscriber.message_rx();
        for task in 0..tasks {
            let turn = task * processes + process;
            subscriber
                .subscribe(format!("{channel}{turn}"))
                .await
                .map_err(|err| format!("SUBSCRIBE failed: {err}"))?;
        }
        if process == 0 {
            turns[0].notify_one();
        }
        let shared = Arc::new_cyclic(|weak: &std::sync::Weak<Shared>| {
            let weak = weak.clone();
            let prefix = channel.clone();
            let dispatcher = tokio::spawn(async move {
                loop {
                    let message = match messages.recv().await {
                        Ok(message) => message,
                        Err(tokio::sync::broadcast::error::RecvError::Lagged(missed)) => {
                            eprintln!("ring: the subscriber missed {missed} turns");
                            continue;
                        }
                        Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                    };
                    let Some(shared) = weak.upgrade() else { return };
                    let turn = message
                        .channel
                        .strip_prefix(prefix.as_str())
                        .and_then(|n| n.parse::<usize>().ok());
                    if let Some(notify) = turn.and_then(|t| shared.turns.get(t / shared.processes))
                    {
                        notify.notify_one();
                    }
                }
            });
            Shared {
                publisher,
                subscriber,
                turns,
                processes,
                total: processes * tasks,
                channel,
                dispatcher,
            }
        });
        Ok(Ring {
            shared,
            turn: process,
        })
    }

    /// The ring as task `task` of this process sees it.
    pub fn for_task(&self, task: usize) -> Ring {
        Ring {
            shared: self.shared.clone(),
            turn: task * self.shared.processes + self.turn % self.shared.processes,
        }
    }

    /// Waits for this task's turn.
    pub async fn lock(&self) -> Result<(), String> {
        let notify = &self.shared.turns[self.turn / self.shared.processes];
        tokio::time::timeout(TURN_TIMEOUT, notify.notified())
            .await
            .map_err(|_| {
                format!(
                    "ring: turn {} did not come within {TURN_TIMEOUT:?}",
                    self.turn
                )
            })
    }

    /// Passes the turn on to the next one. A process whose tasks have all ended (the run's
    /// window is over for it) has closed its subscription, and a `PUBLISH` to its turn reaches
    /// nobody: the turn then goes to the one after, so the tasks still waiting get theirs.
    pub async fn unlock(&self) -> Result<(), String> {
        for step in 1..self.shared.total {
            let next = (self.turn + step) % self.shared.total;
            let heard: i64 = self
                .shared
                .publisher
                .publish(format!("{}{next}", self.shared.channel), "t")
                .await
                .map_err(|err| format!("PUBLISH failed: {err}"))?;
            if heard > 0 {
                return Ok(());
            }
        }
        Ok(())
    }

    /// Closes the subscription (the publisher belongs to the caller).
    pub async fn close(&self) {
        self.shared.dispatcher.abort();
        let _ = self.shared.subscriber.quit().await;
    }
}
