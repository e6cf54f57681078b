//! The script registry: every `lua/*.lua` file, loaded once per server and run with `EVALSHA`.
//!
//! Scripts are compiled into the binary with `include_str!`. Shared Lua functions live in the
//! library preludes of `lua/lib/` (hold bookkeeping, the wait queue, event emission); each
//! script lists the libraries it uses and gets prepended the functions of them that it calls
//! (directly or through another such function), so each rule is written once. Only those:
//! Redis runs a script's whole body on every call, and each `local function` it defines is a
//! closure built (and later collected) per call, which costs the server measurable time on the
//! hot paths.
//! The SHA1 of each final body is computed at first use; a `NOSCRIPT` reply (after `SCRIPT
//! FLUSH`, a restart or a failover to a node that never saw the script) is answered by one
//! `EVAL` of the full body, which also caches the script on that node again.
//!
//! Every script takes its KEYS and ARGV in one canonical order, one position per role (see
//! `lua/README.md`). [`ScriptKeys`] and [`ScriptArgs`] are the only places that build them, and
//! the unit tests check every script header against [`Key`] and the ARGV positions.

use std::collections::HashMap;
use std::sync::LazyLock;

use fred::clients::Client;
use fred::interfaces::{ClientLike, LuaInterface};
use fred::types::config::Options;
use fred::types::{ClusterHash, CustomCommand, Key as RedisKey, MultipleKeys, Value};

use crate::keys::LockKeys;

/// One Lua script.
pub(crate) struct Script {
    name: &'static str,
    body: String,
    sha: String,
    /// Whether the script issues fencing tokens (its header declares the fence argument): its
    /// last argument is then the fence argument, which [`crate::context::Context::run`] appends.
    issues_tokens: bool,
    /// How many KEYS its header declares (`KEYS[1]` .. `KEYS[n]`, a prefix of the canonical
    /// order); 0 for a batch script, whose keys come in groups.
    keys: usize,
}

impl Script {
    /// A script made of the library functions its source needs (from the type checks and the
    /// given library preludes) and its own source.
    fn new(
        catalog: &mut Catalog,
        name: &'static str,
        source: &str,
        libraries: &[&'static str],
    ) -> Script {
        let mut body = catalog.prelude_for(source, libraries);
        body.push_str(source);
        let sha = fred::util::sha1_hash(&body);
        let header = || source.lines().take_while(|line| line.starts_with("--"));
        let issues_tokens =
            header().any(|line| line.starts_with("-- ARGV[") && line.contains("] fence "));
        let keys = header()
            .filter_map(|line| line.strip_prefix("-- KEYS["))
            .filter_map(|rest| rest.split_once(']')?.0.parse::<usize>().ok())
            .max()
            .unwrap_or(0);
        Script {
            name,
            body,
            sha,
            issues_tokens,
            keys,
        }
    }

    /// Whether the script issues fencing tokens and takes the fence argument last.
    pub(crate) fn issues_tokens(&self) -> bool {
        self.issues_tokens
    }

    /// The script's file name without extension (for errors and traces).
    pub(crate) fn name(&self) -> &'static str {
        self.name
    }

    /// Runs the script with `EVALSHA`, falling back to `EVAL` once when the server lost it.
    /// The keys and arguments are borrowed: each call clones them into its command, which
    /// only bumps reference counts (fred keys and strings share their bytes).
    pub(crate) async fn run(
        &self,
        client: &Client,
        keys: &[RedisKey],
        args: &[Value],
    ) -> Result<Value, fred::error::Error> {
        self.sha_then_body(|text, by_body| {
            let (keys, args) = (MultipleKeys::from(keys.to_vec()), args.to_vec());
            async move {
                match by_body {
                    false => client.evalsha(text, keys, args).await,
                    true => client.eval(text, keys, args).await,
                }
            }
        })
        .await
    }

    /// [`run`](Self::run), but each command is written at most once: fred does not re-send it
    /// after its connection broke, so a call whose reply was lost fails whether or not it ran.
    /// For a script that must not run twice and has no op id to answer a repeat with. (fred's
    /// `WithOptions` has no `EVALSHA`/`EVAL` of its own: the calls are custom commands, routed
    /// by the first key's slot.)
    pub(crate) async fn run_once(
        &self,
        client: &Client,
        keys: &[RedisKey],
        args: &[Value],
    ) -> Result<Value, fred::error::Error> {
        let once = client.with_options(&Options {
            max_attempts: Some(1),
            ..Default::default()
        });
        let slot = keys
            .first()
            .map_or(0, |key| fred::util::redis_keyslot(key.as_bytes()));
        self.sha_then_body(|text, by_body| {
            let mut call: Vec<Value> = Vec::with_capacity(2 + keys.len() + args.len());
            call.push(text.into());
            call.push((keys.len() as i64).into());
            call.extend(keys.iter().cloned().map(Value::from));
            call.extend(args.iter().cloned());
            let name = if by_body { "EVAL" } else { "EVALSHA" };
            let command = CustomCommand::new_static(name, ClusterHash::Custom(slot), false);
            let once = &once;
            async move { once.custom(command, call).await }
        })
        .await
    }

    /// Calls `call` with the script's SHA1 (`by_body` false), and once more with its body
    /// (`by_body` true) when the server answers `NOSCRIPT` (it never saw the script, or lost
    /// it), which also caches the script there again.
    async fn sha_then_body<'a, F, Fut>(&'a self, call: F) -> Result<Value, fred::error::Error>
    where
        F: Fn(&'a str, bool) -> Fut,
        Fut: std::future::Future<Output = Result<Value, fred::error::Error>>,
    {
        match call(self.sha.as_str(), false).await {
            Err(err) if err.details().starts_with("NOSCRIPT") => {
                tracing::debug!(
                    script = self.name,
                    "script not cached on the server, reloading"
                );
                call(self.body.as_str(), true).await
            }
            other => other,
        }
    }
}

/// The top-level definitions of the library preludes, each read once however many scripts
/// use it: the registry is built when a client connects, in every process of a fleet at once
/// when it starts, so building it must cost next to nothing.
#[derive(Default)]
struct Catalog {
    libraries: Vec<(&'static str, Vec<Definition>)>,
}

/// One top-level definition of a library: its name, its text, and the distinct words of that
/// text (whichever of them name other definitions are what it uses).
struct Definition {
    name: &'static str,
    block: &'static str,
    words: Vec<&'static str>,
}

impl Catalog {
    /// Where the definitions of `library` are in `libraries`, read on first use.
    fn read(&mut self, library: &'static str) -> usize {
        if let Some(at) = self.libraries.iter().position(|(text, _)| *text == library) {
            return at;
        }
        let definitions = lua_definitions(library)
            .into_iter()
            .map(|(name, block)| {
                let mut words: Vec<&str> = identifiers(block).collect();
                words.sort_unstable();
                words.dedup();
                Definition { name, block, words }
            })
            .collect();
        self.libraries.push((library, definitions));
        self.libraries.len() - 1
    }

    /// The definitions of the type checks and of `libraries` that `source` uses, directly or
    /// through one another, in library order. A library is a sequence of top-level `local`
    /// definitions (functions and constants) after its header comment.
    fn prelude_for(&mut self, source: &str, libraries: &[&'static str]) -> String {
        let read: Vec<usize> = std::iter::once(CHECK)
            .chain(libraries.iter().copied())
            .map(|library| self.read(library))
            .collect();
        let functions: Vec<&Definition> = read
            .into_iter()
            .flat_map(|at| self.libraries[at].1.iter())
            .collect();
        let mut defined: HashMap<&str, Vec<usize>> = HashMap::new();
        for (index, definition) in functions.iter().enumerate() {
            defined.entry(definition.name).or_default().push(index);
        }
        let mut needed = vec![false; functions.len()];
        let mut pending: Vec<usize> = Vec::new();
        let mut mark = |word: &str, pending: &mut Vec<usize>| {
            for &index in defined.get(word).into_iter().flatten() {
                if !needed[index] {
                    needed[index] = true;
                    pending.push(index);
                }
            }
        };
        for word in identifiers(source) {
            mark(word, &mut pending);
        }
        while let Some(index) = pending.pop() {
            for word in &functions[index].words {
                mark(word, &mut pending);
            }
        }
        let mut prelude = String::new();
        for (definition, _) in functions.iter().zip(&needed).filter(|(_, needed)| **needed) {
            prelude.push_str(definition.block);
            if !definition.block.ends_with('\n') {
                prelude.push('\n');
            }
        }
        prelude
    }
}

/// The (name, block) of every top-level definition of a library: a `local function` or a
/// `local` constant, each block running to the next definition.
fn lua_definitions(library: &str) -> Vec<(&str, &str)> {
    let mut starts: Vec<usize> = library
        .match_indices("local ")
        .map(|(at, _)| at)
        .filter(|&at| at == 0 || library.as_bytes()[at - 1] == b'\n')
        .collect();
    starts.push(library.len());
    starts
        .windows(2)
        .map(|bounds| {
            let block = &library[bounds[0]..bounds[1]];
            let head = block["local ".len()..].trim_start_matches("function ");
            let name = head
                .split(|c: char| !is_identifier(c))
                .next()
                .unwrap_or_default();
            (name, block)
        })
        .collect()
}

/// The Lua identifiers (and numbers) of `text`, in order: its maximal runs of identifier
/// characters.
fn identifiers(text: &str) -> impl Iterator<Item = &str> {
    // By bytes: identifier characters are ASCII, and no other byte of a UTF-8 text is one.
    text.as_bytes()
        .split(|byte| !is_identifier(char::from(*byte)))
        .filter(|word| !word.is_empty())
        .filter_map(|word| std::str::from_utf8(word).ok())
}

fn is_identifier(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Library preludes (`lua/lib/`): shared Lua functions, written once.
const CHECK: &str = include_str!("../lua/lib/check.lua");
const NOTIFY: &str = include_str!("../lua/lib/notify.lua");
const HOLD: &str = include_str!("../lua/lib/hold.lua");
const RW: &str = include_str!("../lua/lib/rw.lua");
const FENCE: &str = include_str!("../lua/lib/fence.lua");
const LATCH: &str = include_str!("../lua/lib/latch.lua");

macro_rules! scripts {
    ($($field:ident: [$($lib:ident),*]),* $(,)?) => {
        /// Every script of the crate, one per state change (plus read-only inspection).
        pub(crate) struct Scripts {
            $(pub(crate) $field: Script,)*
        }

        /// The registry, built by [`prepare`] when a client connects (or by a first use).
        pub(crate) static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| {
            let mut catalog = Catalog::default();
            Scripts {
                $($field: Script::new(
                    &mut catalog,
                    stringify!($field),
                    include_str!(concat!("../lua/", stringify!($field), ".lua")),
                    &[$($lib),*],
                ),)*
            }
        });

        /// (file name, source) of every script, for the header checks.
        #[cfg(test)]
        const SOURCES: &[(&str, &str)] = &[
            $((stringify!($field), include_str!(concat!("../lua/", stringify!($field), ".lua"))),)*
            ("check", CHECK),
            ("notify", NOTIFY),
            ("hold", HOLD),
            ("rw", RW),
            ("fence", FENCE),
            ("latch", LATCH),
        ];

        impl Scripts {
            #[cfg(test)]
            fn all(&self) -> Vec<&Script> {
                vec![$(&self.$field),*]
            }
        }
    };
}

scripts! {
    hold_acquire: [FENCE, NOTIFY, HOLD],
    hold_take: [FENCE],
    hold_free: [FENCE, NOTIFY, HOLD],
    hold_release: [FENCE, NOTIFY, HOLD],
    hold_leave: [FENCE, NOTIFY, HOLD],
    hold_force_unlock: [FENCE, NOTIFY, HOLD],
    hold_heartbeat: [FENCE, NOTIFY, HOLD],
    inbox_keep: [],
    rw_acquire: [FENCE, NOTIFY, HOLD, RW],
    rw_release: [FENCE, NOTIFY, HOLD, RW],
    rw_leave: [FENCE, NOTIFY, HOLD, RW],
    rw_heartbeat: [FENCE, NOTIFY, HOLD, RW],
    rw_renew: [FENCE, NOTIFY, HOLD, RW],
    rw_inspect: [FENCE, NOTIFY, HOLD, RW],
    rw_force_unlock: [FENCE, NOTIFY, HOLD, RW],
    hold_renew: [FENCE, HOLD],
    hold_inspect: [],
    hold_describe: [FENCE, NOTIFY],
    rw_describe: [FENCE, NOTIFY, HOLD, RW],
    latch_set: [HOLD, LATCH],
    latch_wait: [LATCH],
    latch_count_down: [NOTIFY, LATCH],
    latch_delete: [NOTIFY, HOLD, LATCH],
    latch_describe: [NOTIFY, LATCH],
}

/// Builds the registry now if no call built it yet (see [`Catalog`]).
pub(crate) fn prepare() {
    LazyLock::force(&SCRIPTS);
}

/// A key role and its position in the KEYS of every script that takes it (`lua/README.md`): a
/// script takes the keys of a prefix of this order, so the discriminant is the 1-based
/// position.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Key {
    /// The lock's hash.
    Hold = 1,
    /// The lock's wait queue, a sorted set (`lua/lib/hold.lua`, `lua/lib/rw.lua`).
    Queue = 2,
    /// The shard's fence key.
    Fence = 3,
    /// The shard's event stream or channel, the base name of the clients' inboxes.
    Events = 4,
    /// A count-down latch's record of the calls that changed it lately (`lua/lib/latch.lua`).
    Ops = 5,
    /// The ends of a read-write lock's (or a semaphore's) read holds, a sorted set
    /// (`lua/lib/rw.lua`).
    Reads = 6,
}

impl Key {
    /// Every role, in the canonical order.
    const ALL: [Key; 6] = [
        Key::Hold,
        Key::Queue,
        Key::Fence,
        Key::Events,
        Key::Ops,
        Key::Reads,
    ];
}

/// The name of the [`Key::Queue`] key of a lock.
const QUEUE: &str = "wait";

/// The name of the [`Key::Ops`] key of a latch.
const OPS: &str = "op";

/// The name of the [`Key::Reads`] key of a read-write lock or a semaphore.
const READS: &str = "read";

/// The KEYS of one lock's scripts, in the canonical order: the one place that orders them.
/// Key names are built per call (a lock handle stays small; a call allocates its keys anyway).
#[derive(Clone, Copy)]
pub(crate) struct ScriptKeys<'a> {
    lock: &'a LockKeys,
}

impl<'a> ScriptKeys<'a> {
    /// The keys of `lock`.
    pub(crate) fn new(lock: &'a LockKeys) -> Self {
        ScriptKeys { lock }
    }

    /// The lock these keys are of.
    pub(crate) fn lock(&self) -> &'a LockKeys {
        self.lock
    }

    fn key(&self, role: Key) -> String {
        match role {
            Key::Hold => self.lock.key(""),
            Key::Queue => self.lock.key(QUEUE),
            Key::Fence => self.lock.fence().to_owned(),
            Key::Events => self.lock.events().to_owned(),
            Key::Ops => self.lock.key(OPS),
            Key::Reads => self.lock.key(READS),
        }
    }

    /// `KEYS[1..=last]` of a script that works on this lock.
    pub(crate) fn through(&self, last: Key) -> Vec<String> {
        Key::ALL[..last as usize]
            .iter()
            .map(|&role| self.key(role))
            .collect()
    }

    /// The KEYS of `script`, which works on this one lock: the prefix of the canonical order
    /// that its header declares (`lua/README.md`).
    pub(crate) fn for_script(&self, script: &Script) -> Vec<String> {
        Key::ALL[..script.keys.min(Key::ALL.len())]
            .iter()
            .map(|&role| self.key(role))
            .collect()
    }

    /// The keys of `roles`, in that order: one lock's group in a batch script.
    pub(crate) fn of(&self, roles: &[Key]) -> Vec<String> {
        roles.iter().map(|&role| self.key(role)).collect()
    }
}

/// The ARGV of a script, in the canonical order (`lua/README.md`): the call (`ARGV[1..=5]`),
/// the event arguments (`ARGV[6..=8]`), the side or kind (`ARGV[9]`), the script's own
/// arguments, the fence argument last. Each section can only be added at its position.
pub(crate) struct ScriptArgs(Vec<Value>);

impl ScriptArgs {
    /// Arguments of the call section.
    const CALL: usize = 5;
    /// Position of the side or kind.
    const KIND: usize = 9;

    /// The call of an acquisition: owner, lease ms, op id, waiter id, waiter lease ms (0 for a
    /// try).
    pub(crate) fn acquire(
        owner: &str,
        lease_ms: i64,
        op: &str,
        waiter: &str,
        waiter_lease_ms: i64,
    ) -> Self {
        ScriptArgs(vec![
            owner.into(),
            lease_ms.into(),
            op.into(),
            waiter.into(),
            waiter_lease_ms.into(),
        ])
    }

    /// The call of a release: owner, token, op id, all flag, retry window ms.
    pub(crate) fn release(owner: &str, token: u64, op: &str, all: bool, window_ms: i64) -> Self {
        ScriptArgs(vec![
            owner.into(),
            token.to_string().into(),
            op.into(),
            if all { "1" } else { "0" }.into(),
            window_ms.into(),
        ])
    }

    /// A script that takes no section: its own arguments from `ARGV[1]`.
    pub(crate) fn own(args: impl IntoIterator<Item = Value>) -> Self {
        ScriptArgs(args.into_iter().collect())
    }

    /// A script without a call (force unlock): the call positions are passed empty.
    pub(crate) fn no_call() -> Self {
        ScriptArgs(vec![Value::from(""); Self::CALL])
    }

    /// `hold_leave`, `rw_leave`: only a waiter id, at the position of an acquisition's waiter
    /// id.
    pub(crate) fn leave(waiter: &str) -> Self {
        let mut args = Self::no_call();
        args.0[3] = waiter.into();
        args
    }

    /// Sets the op id at its place in the call section, in a script without a call of a lock
    /// (a latch's `try_set_count` and `delete`).
    pub(crate) fn op(mut self, op: &str) -> Self {
        self.0[2] = op.into();
        self
    }

    /// Sets the retry window (ms) at its place in the call section, in a script without a
    /// call (`hold_leave`, `hold_force_unlock`: where the lock ends up free).
    pub(crate) fn window(mut self, window_ms: i64) -> Self {
        self.0[4] = window_ms.into();
        self
    }

    /// The event arguments (mode, stream cap, lock id), right after the call.
    pub(crate) fn events(mut self, events: Vec<Value>) -> Self {
        debug_assert_eq!(
            (self.0.len(), events.len()),
            (Self::CALL, 3),
            "event arguments"
        );
        self.0.extend(events);
        self
    }

    /// The read-write side (`"read"`/`"write"`), right after the event arguments.
    pub(crate) fn kind(mut self, kind: &'static str) -> Self {
        debug_assert_eq!(self.0.len() + 1, Self::KIND, "side or kind");
        self.0.push(kind.into());
        self
    }

    /// The script's own arguments (and the fence argument, always last), after the sections.
    pub(crate) fn extra(mut self, args: impl IntoIterator<Item = Value>) -> Self {
        self.0.extend(args);
        self
    }

    pub(crate) fn into_vec(self) -> Vec<Value> {
        self.0
    }
}

/// Reads a script reply that must be an array of whole numbers: integers, or decimal strings
/// (the scripts return fencing tokens as the text they read them as, `lua/lib/fence.lua`:
/// turning a 16-digit token into a Lua number costs the server more than its parsing here).
pub(crate) fn int_array(script: &'static str, value: Value) -> crate::Result<Vec<i64>> {
    let protocol = |detail: String| crate::Error::Protocol { script, detail };
    match value {
        Value::Array(items) => items
            .into_iter()
            .map(|item| {
                match &item {
                    Value::Integer(i) => Some(*i),
                    Value::String(text) => decimal(text.as_bytes()),
                    Value::Bytes(bytes) => decimal(bytes),
                    _ => None,
                }
                .ok_or_else(|| protocol(format!("expected whole numbers, got {item:?}")))
            })
            .collect(),
        other => Err(protocol(format!("expected an array, got {other:?}"))),
    }
}

/// A whole number written in decimal digits (no sign, no leading zero, no other character).
fn decimal(text: &[u8]) -> Option<i64> {
    let leading_zero = text.len() > 1 && text[0] == b'0';
    if text.is_empty() || leading_zero || !text.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(text).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_read_tokens_as_integers_or_decimal_text_and_nothing_else() {
        let reply = Value::Array(vec![
            Value::Integer(1),
            Value::String("1764260000123456".into()),
            Value::Bytes(b"7".to_vec().into()),
        ]);
        assert_eq!(
            int_array("t", reply).ok(),
            Some(vec![1, 1_764_260_000_123_456, 7])
        );
        for bad in ["", "01", "-1", "1a", " 1", "99999999999999999999"] {
            let reply = Value::Array(vec![Value::String(bad.into())]);
            assert!(
                matches!(int_array("t", reply), Err(crate::Error::Protocol { .. })),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn every_script_documents_keys_argv_and_return() {
        for (file, source) in SOURCES {
            assert!(
                source.starts_with(&format!("-- {file}.lua")),
                "{file}: header"
            );
            let library = ["check", "notify", "hold", "rw", "fence", "latch"].contains(file);
            if !library {
                for word in ["KEYS", "ARGV", "Returns"] {
                    assert!(source.contains(word), "{file}: header lacks {word}");
                }
            }
        }
    }

    /// A script's body carries exactly the library definitions it uses: each `fl_` function
    /// and `FL_` constant it names is defined in it, once, and it defines none that nothing
    /// uses. A script's own top-level locals count as definitions too, and are used.
    #[test]
    fn every_script_carries_the_library_functions_it_calls_and_no_others() {
        for script in SCRIPTS.all() {
            let body = &script.body;
            let defined: Vec<&str> = lua_definitions(body)
                .iter()
                .map(|(name, _)| *name)
                .collect();
            let mut called: Vec<&str> = identifiers(body)
                .filter(|word| word.starts_with("fl_") || word.starts_with("FL_"))
                .collect();
            called.sort_unstable();
            called.dedup();
            for name in &called {
                let definitions = defined.iter().filter(|defined| *defined == name).count();
                assert_eq!(
                    definitions, 1,
                    "{}: {name} defined {definitions} times",
                    script.name
                );
            }
            for name in &defined {
                let uses = body.match_indices(name).count();
                assert!(
                    uses > 1,
                    "{}: {name} is defined but never called",
                    script.name
                );
            }
        }
    }

    /// Position of each KEYS role name a header may use (`lua/README.md`).
    const KEY_NAMES: &[(&str, Key)] = &[
        ("hold", Key::Hold),
        ("queue", Key::Queue),
        ("fence", Key::Fence),
        ("events", Key::Events),
        ("ops", Key::Ops),
        ("reads", Key::Reads),
    ];

    /// Position of each shared ARGV role (`lua/README.md`); other names are a script's own.
    const ARG_NAMES: &[(&str, usize)] = &[
        ("owner", 1),
        ("lease", 2),
        ("token", 2),
        ("op", 3),
        ("waiter", 4),
        ("all", 4),
        ("waiter-lease", 5),
        ("window", 5),
        ("mode", 6),
        ("maxlen", 7),
        ("lock-id", 8),
        ("side", ScriptArgs::KIND),
        ("kind", ScriptArgs::KIND),
    ];

    /// The `(position, role)` pairs a header documents as `<array>[<number>] <role>`; entries
    /// with a computed index (`KEYS[2i]`) or a range (`ARGV[1..5]`) are skipped.
    fn documented<'a>(header: &'a str, array: &str) -> Vec<(usize, &'a str)> {
        let mut found = Vec::new();
        let opening = format!("{array}[");
        for (at, _) in header.match_indices(&opening) {
            let rest = &header[at + opening.len()..];
            let Some((index, tail)) = rest.split_once(']') else {
                continue;
            };
            let Ok(position) = index.parse::<usize>() else {
                continue;
            };
            let role = tail
                .trim_start()
                .split(|c: char| c.is_whitespace() || c == ',')
                .next()
                .unwrap_or("");
            found.push((position, role));
        }
        found
    }

    /// Every script header follows the canonical KEYS and ARGV order: a KEYS role at its
    /// position and the keys a prefix of the order (no gap); the shared ARGV roles at their
    /// positions and the fence argument last. Batch scripts have per-item groups (their own
    /// ARGV layout); their fixed KEYS entries are checked all the same.
    #[test]
    fn every_script_header_follows_the_canonical_order() {
        let libraries = ["check", "notify", "hold", "rw", "fence", "latch"];
        for (file, source) in SOURCES {
            if libraries.contains(file) {
                continue;
            }
            let header: String = source
                .lines()
                .take_while(|line| line.starts_with("--"))
                .map(|line| format!("{line}\n"))
                .collect();
            let batch = header.contains("A batch script");
            let keys = documented(&header, "KEYS");
            for &(position, role) in &keys {
                let Some(&(_, key)) = KEY_NAMES.iter().find(|(name, _)| *name == role) else {
                    panic!("{file}: KEYS[{position}] names no known role: {role:?}");
                };
                if !batch {
                    assert_eq!(position, key as usize, "{file}: KEYS[{position}] {role}");
                }
            }
            if !batch {
                let mut positions: Vec<usize> =
                    keys.iter().map(|&(position, _)| position).collect();
                positions.sort_unstable();
                positions.dedup();
                let prefix: Vec<usize> = (1..=positions.len()).collect();
                assert_eq!(positions, prefix, "{file}: KEYS not a prefix of the order");
                let args = documented(&header, "ARGV");
                for &(position, role) in &args {
                    if let Some(&(_, canonical)) = ARG_NAMES.iter().find(|(name, _)| *name == role)
                    {
                        assert_eq!(position, canonical, "{file}: ARGV[{position}] {role}");
                    }
                }
                let last = args.iter().map(|&(position, _)| position).max();
                for &(position, role) in &args {
                    if role == "fence" {
                        assert_eq!(
                            Some(position),
                            last,
                            "{file}: the fence argument is not last"
                        );
                    }
                }
            }
        }
    }

    /// A script that works on one lock is passed the keys its header declares: the
    /// read-write scripts through `reads`, the exclusive ones through `events`.
    #[test]
    fn a_script_is_passed_the_keys_its_header_declares() {
        let lock = crate::keys::Keyspace::new("p", 1, false)
            .lock("rw", "x")
            .expect("a lock name");
        let keys = ScriptKeys::new(&lock);
        let cases = [
            (&SCRIPTS.rw_leave, Key::Reads),
            (&SCRIPTS.rw_describe, Key::Reads),
            (&SCRIPTS.hold_leave, Key::Events),
            (&SCRIPTS.hold_describe, Key::Events),
            (&SCRIPTS.latch_describe, Key::Events),
        ];
        for (script, last) in cases {
            assert_eq!(
                keys.for_script(script),
                keys.through(last),
                "{}",
                script.name
            );
        }
        assert_eq!(SCRIPTS.rw_heartbeat.keys, 0, "a batch script");
    }

    #[test]
    fn the_key_order_has_one_position_per_role() {
        for (at, key) in Key::ALL.iter().enumerate() {
            assert_eq!(*key as usize, at + 1, "{key:?}");
        }
    }

    #[test]
    fn scripts_use_only_redis_5_commands() {
        let banned = [
            "GETDEL",
            "LPOS",
            "XAUTOCLAIM",
            "MINID",
            "'GT'",
            "'LT'",
            "COPY",
            "LMOVE",
            "EXPIRETIME",
            "ZRANGESTORE",
            "'KEEPTTL'",
        ];
        for script in SCRIPTS.all() {
            for word in banned {
                assert!(!script.body.contains(word), "{} uses {word}", script.name);
            }
            assert_eq!(script.sha.len(), 40);
        }
    }
}
