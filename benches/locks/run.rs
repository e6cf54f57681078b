//! Orchestration: every selected scenario, per notification mode, then the report.

use std::time::{Duration, Instant};

use fred::interfaces::ClientLike;
use fredlock::{Lease, NotificationMode};

use crate::handoff::{run_handoff, HandoffResult};
use crate::loop_stats::LoopResult;
use crate::loops::{run_loop, run_rw, LoopSpec, RwResult};
use crate::measure::{load_average, now_us, progress};
use crate::options::{Args, Scenario};
use crate::peers::LockKind;
use crate::redis::{connect, delete_prefix, plain_client, redis_version};
use crate::report;
use crate::s1::{run_s1, S1Result};
use crate::s3::{run_s3, S3Result};
use crate::s4::{run_s4, S4Result};
use crate::s5::{run_s5, S5Result};
use crate::s6::{run_s6, S6Result};
use crate::s7::{run_s7, S7Result};

/// S4, S6: the holder's fixed lease (a waiter that waited for it to expire would show).
pub const LONG_LEASE: Duration = Duration::from_secs(120);

/// What every scenario of one notification mode needs.
pub struct ModeCtx<'a> {
    pub args: &'a Args,
    pub url: &'a str,
    pub mode: NotificationMode,
    /// Key prefix of this mode's clients (unique per run and mode); scenarios that need another
    /// layout append a suffix.
    pub prefix: String,
    /// The lease of the holders in S4 and S6 (see [`holder_lease`]).
    pub holder_lease: HolderLease,
}

impl ModeCtx<'_> {
    pub fn name(&self) -> &'static str {
        self.mode.as_str()
    }
}

/// Every result, per scenario and mode.
#[derive(Default)]
pub struct Report {
    pub s1: Vec<(NotificationMode, S1Result)>,
    pub s2: Vec<(NotificationMode, LoopResult)>,
    /// The peers in the S2 loop (they have no notification mode).
    pub s2_peers: Vec<(LockKind, LoopResult)>,
    pub s2_fair: Vec<(NotificationMode, LoopResult)>,
    pub s3: Vec<(NotificationMode, S3Result)>,
    /// The peers' S3 rounds (run once, with the first mode's settings).
    pub s3_peers: Option<S3Result>,
    pub handoff: Vec<(NotificationMode, HandoffResult)>,
    pub rw: Vec<(NotificationMode, RwResult)>,
    pub s4: Vec<(NotificationMode, S4Result)>,
    pub s5: Option<S5Result>,
    pub s6: Vec<(NotificationMode, S6Result)>,
    pub s7: Option<S7Result>,
    /// (scenario, mode, message) of every scenario that failed.
    pub errors: Vec<(Scenario, Option<NotificationMode>, String)>,
    /// Remarks for the reader (e.g. a workaround the bench had to take).
    pub notes: Vec<String>,
}

/// The lease of the S4 and S6 holders: a fixed one as specified, or, if fixed leases hang the
/// client, a watchdog lease of the same length (a waiter that waited for it would also wait
/// [`LONG_LEASE`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HolderLease {
    Fixed,
    Watchdog,
}

impl HolderLease {
    pub fn lease(self) -> Lease {
        match self {
            HolderLease::Fixed => Lease::fixed(LONG_LEASE),
            HolderLease::Watchdog => Lease::watchdog(LONG_LEASE),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            HolderLease::Fixed => "fixed",
            HolderLease::Watchdog => "watchdog",
        }
    }

    pub fn parse(text: &str) -> HolderLease {
        if text == "watchdog" {
            HolderLease::Watchdog
        } else {
            HolderLease::Fixed
        }
    }
}

/// How long the fixed-lease probe may take.
pub const LEASE_PROBE_LIMIT: Duration = Duration::from_secs(10);

/// Whether one acquisition with a fixed lease completes. It runs on a thread and runtime of
/// its own, so that a hang (a blocked thread) cannot take the bench with it.
pub async fn holder_lease(url: &str, mode: NotificationMode, prefix: &str) -> HolderLease {
    let (tx, rx) = std::sync::mpsc::channel();
    let (url, prefix) = (url.to_owned(), prefix.to_owned());
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("build a runtime");
        let works = runtime.block_on(async {
            let locks = connect(&url, mode, &prefix).await.ok()?;
            let lock = locks.mutex("lease-probe").ok()?;
            let lock = lock.with_lease(Lease::fixed(LONG_LEASE)).ok()?;
            let guard = lock.lock().await.ok()?;
            guard.unlock().await.ok()?;
            locks.shutdown().await.ok()
        });
        let _ = tx.send(works.is_some());
    });
    let answer = tokio::task::spawn_blocking(move || rx.recv_timeout(LEASE_PROBE_LIMIT)).await;
    match answer {
        Ok(Ok(true)) => HolderLease::Fixed,
        _ => HolderLease::Watchdog,
    }
}

/// Pushes `(mode, result)` into `list`, or records the error.
macro_rules! keep {
    ($report:ident . $list:ident, $scenario:expr, $mode:expr, $outcome:expr) => {
        match $outcome {
            Ok(result) => $report.$list.push(($mode, result)),
            Err(message) => failed($report, $scenario, Some($mode), message),
        }
    };
}

/// Runs every selected scenario and mode, prints the markdown report and writes the JSON.
/// Returns whether every scenario completed.
pub async fn bench(args: &Args, url: &str) -> Result<bool, String> {
    let run_id = format!("{}-{}", std::process::id(), now_us() / 1_000_000);
    let probe = plain_client(url).await?;
    let version = redis_version(&probe).await;
    let _ = probe.quit().await;
    let started = Instant::now();
    let mut ctxs: Vec<ModeCtx<'_>> = args
        .modes
        .iter()
        .map(|&mode| ModeCtx {
            args,
            url,
            mode,
            prefix: format!("fredlock-bench-{}-{run_id}", mode.as_str()),
            holder_lease: HolderLease::Fixed,
        })
        .collect();
    let mut report = Report::default();
    if args.scenarios.contains(&Scenario::S4) || args.scenarios.contains(&Scenario::S6) {
        // Probe every mode at once: a hanging probe costs its full time limit.
        let probes: Vec<_> = ctxs
            .iter()
            .map(|ctx| {
                let (url, mode, prefix) = (url.to_owned(), ctx.mode, ctx.prefix.clone());
                tokio::spawn(async move { holder_lease(&url, mode, &prefix).await })
            })
            .collect();
        for (ctx, probe) in ctxs.iter_mut().zip(probes) {
            ctx.holder_lease = probe.await.unwrap_or(HolderLease::Watchdog);
            if ctx.holder_lease == HolderLease::Watchdog {
                let note = format!(
                    "{}: an acquisition with a fixed lease did not complete within {:?} (a \
                     library hang); S4 and S6 holders use a {} s watchdog lease instead",
                    ctx.name(),
                    LEASE_PROBE_LIMIT,
                    LONG_LEASE.as_secs()
                );
                progress(&note);
                report.notes.push(note);
            }
        }
    }
    for &scenario in &args.scenarios {
        progress(&format!(
            "scenario {} (load average {}, {:.0} s so far)",
            scenario.name(),
            load_average(),
            started.elapsed().as_secs_f64()
        ));
        match scenario {
            Scenario::S5 => match run_s5(&ctxs).await {
                Ok(result) => report.s5 = Some(result),
                Err(message) => failed(&mut report, scenario, None, message),
            },
            Scenario::S7 => match run_s7(&ctxs).await {
                Ok(result) => report.s7 = Some(result),
                Err(message) => failed(&mut report, scenario, None, message),
            },
            _ => {
                for ctx in &ctxs {
                    run_mode(ctx, scenario, &mut report).await;
                }
                if let Some(first) = ctxs.first() {
                    run_peers(first, scenario, &mut report).await;
                }
            }
        }
    }
    let cleaner = plain_client(url).await?;
    for ctx in &ctxs {
        let deleted = delete_prefix(&cleaner, &ctx.prefix).await?;
        progress(&format!("mode {}: deleted {deleted} keys", ctx.name()));
    }
    let _ = cleaner.quit().await;
    progress(&format!(
        "all scenarios done in {:.0} s",
        started.elapsed().as_secs_f64()
    ));
    report::finish(args, &report, &version)?;
    Ok(report.errors.is_empty())
}

fn failed(
    report: &mut Report,
    scenario: Scenario,
    mode: Option<NotificationMode>,
    message: String,
) {
    progress(&format!(
        "{} {}: FAILED: {message}",
        scenario.name(),
        mode.map_or("", NotificationMode::as_str)
    ));
    report.errors.push((scenario, mode, message));
}

/// Runs one scenario (not S5, S7) in one mode.
async fn run_mode(ctx: &ModeCtx<'_>, scenario: Scenario, report: &mut Report) {
    let mode = ctx.mode;
    match scenario {
        Scenario::S1 => keep!(report.s1, scenario, mode, run_s1(ctx).await),
        Scenario::S2 => {
            let spec = LoopSpec::s2(ctx, "s2", LockKind::Mutex, 0.0);
            keep!(report.s2, scenario, mode, run_loop(ctx, &spec).await)
        }
        Scenario::S2Fair => {
            let spec = LoopSpec::s2(ctx, "s2-fair", LockKind::Fair, 0.0);
            keep!(report.s2_fair, scenario, mode, run_loop(ctx, &spec).await)
        }
        Scenario::S3 => keep!(
            report.s3,
            scenario,
            mode,
            run_s3(ctx, &[LockKind::Fair, LockKind::Mutex]).await
        ),
        Scenario::FairHandoff => keep!(report.handoff, scenario, mode, run_handoff(ctx).await),
        Scenario::Rw => keep!(report.rw, scenario, mode, run_rw(ctx).await),
        Scenario::S4 => keep!(report.s4, scenario, mode, run_s4(ctx).await),
        Scenario::S6 => keep!(report.s6, scenario, mode, run_s6(ctx).await),
        Scenario::S5 | Scenario::S7 => unreachable!("run for all modes at once"),
    }
}

/// The peers' runs of a scenario that has them outside its own code (S2, S3), once per run.
async fn run_peers(ctx: &ModeCtx<'_>, scenario: Scenario, report: &mut Report) {
    if ctx.args.peers.is_empty() {
        return;
    }
    match scenario {
        Scenario::S2 => {
            for &kind in &ctx.args.peers {
                let spec = LoopSpec::s2(ctx, &format!("s2 {}", kind.name()), kind, 0.0);
                match run_loop(ctx, &spec).await {
                    Ok(result) => report.s2_peers.push((kind, result)),
                    Err(message) => failed(report, scenario, None, message),
                }
            }
        }
        Scenario::S3 => match run_s3(ctx, &ctx.args.peers).await {
            Ok(result) => report.s3_peers = Some(result),
            Err(message) => failed(report, scenario, None, message),
        },
        _ => {}
    }
}
