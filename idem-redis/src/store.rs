//! `RedisStore`: every transition one Lua function (or script), atomic on the server.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use idem_core::{
    Key, Record, Store, StoreError, Timestamp, key::StepName, raw::duration_millis, record::Lease,
    record::Steps, store::ClaimOutcome, store::ClaimRequest, store::Expiry, store::Operation,
    store::RenewOutcome, store::WriteOutcome,
};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use redis::{FromRedisValue, RedisResult, Value};

use crate::errors::{map, unexpected};
use crate::layout::{self, DEFAULT_PREFIX, PrefixError};
use crate::scripts::{Scripts, Transition};

/// The two kinds of connection, behind one store type.
#[derive(Clone)]
pub(crate) enum Connection {
    Standalone(Arc<Standalone>),
    Cluster(ClusterConnection),
}

/// One multiplexed connection to a standalone server, replaced when it stops answering.
///
/// Every request shares the one connection. A connection whose packets are dropped (a
/// network partition, a dead peer without a reset) fails no write and closes no socket: each
/// request only times out, and the manager keeps sending new ones down it. The chaos runs
/// measured that as a full outage until something closed the socket. So a request that
/// times out replaces the connection, once at a time, when the store knows how to make one.
pub(crate) struct Standalone {
    manager: std::sync::RwLock<ConnectionManager>,
    /// How to make a new connection: `None` for a manager the caller built.
    remake: Option<(redis::Client, ConnectionManagerConfig)>,
    replacing: std::sync::atomic::AtomicBool,
}

impl Standalone {
    fn manager(&self) -> ConnectionManager {
        self.manager
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Replaces the connection in the background after `err`, if it was a timeout.
    fn after<T>(self: &Arc<Self>, result: RedisResult<T>) -> RedisResult<T> {
        use std::sync::atomic::Ordering;
        if let Err(err) = &result
            && err.is_timeout()
            && let Some((client, config)) = self.remake.clone()
            && !self.replacing.swap(true, Ordering::SeqCst)
        {
            let this = Arc::clone(self);
            tokio::spawn(async move {
                if let Ok(fresh) = ConnectionManager::new_with_config(client, config).await {
                    *this
                        .manager
                        .write()
                        .unwrap_or_else(std::sync::PoisonError::into_inner) = fresh;
                }
                this.replacing.store(false, Ordering::SeqCst);
            });
        }
        result
    }
}

impl Connection {
    fn standalone(
        manager: ConnectionManager,
        remake: Option<(redis::Client, ConnectionManagerConfig)>,
    ) -> Self {
        Connection::Standalone(Arc::new(Standalone {
            manager: std::sync::RwLock::new(manager),
            remake,
            replacing: std::sync::atomic::AtomicBool::new(false),
        }))
    }

    /// Runs a plain command, routed by its key on a cluster.
    pub(crate) async fn query<T: FromRedisValue>(&self, cmd: &redis::Cmd) -> RedisResult<T> {
        match self {
            Connection::Standalone(one) => {
                let result = cmd.query_async(&mut one.manager()).await;
                one.after(result)
            }
            Connection::Cluster(cluster) => cmd.query_async(&mut cluster.clone()).await,
        }
    }

    /// Runs a pipeline on a standalone server (a Cluster's are routed by the caller).
    pub(crate) async fn query_pipeline<T: FromRedisValue>(
        &self,
        pipeline: &redis::Pipeline,
    ) -> RedisResult<T> {
        match self {
            Connection::Standalone(one) => {
                let result = pipeline.query_async(&mut one.manager()).await;
                one.after(result)
            }
            Connection::Cluster(cluster) => pipeline.query_async(&mut cluster.clone()).await,
        }
    }
}

/// An idem [`Store`] in Redis or Redis Cluster.
///
/// - Each transition is one Lua function (`lua/*.lua`), atomic on the server: a function of
///   idem's Redis Functions library, called with `FCALL` and the library loaded again
///   transparently where a server lacks it (a new node, a restart without persistence); on
///   a server without Functions (before Redis 7.0, or an ACL that allows scripts only), the
///   same code as a script, sent with `EVALSHA` and loaded again after `NOSCRIPT`.
/// - Each record is one hash whose key carries a `{...}` hash tag, so every script touches
///   one key in one cluster slot.
/// - Time is the server's (`TIME` inside the script), never the client's.
/// - Retention is `PEXPIREAT`: a record lives until it expires or, while in progress, until
///   its lease ends if that is later (a live owner's record is never absent), and Redis
///   deletes it then. A
///   result stored late moves the expiry (and the key's `PEXPIREAT`) to one retention
///   after it is stored. So
///   its [`Expiry`] is [`Expiry::Vanishes`]: `purge_expired` has nothing to do, and a key
///   claimed again after its record vanished starts a new lifetime at token 1 (the attempt
///   id still fences the old owner out).
/// - Durations are clamped to [`MAX_DURATION`](idem_core::raw::MAX_DURATION) before they reach
///   a script.
/// - A key prefix (default `idem:`) lets several applications share one Redis.
///
/// Read the crate docs for the server configuration the guarantees depend on.
///
/// ```no_run
/// use idem_core::Idempotency;
/// use idem_redis::RedisStore;
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let store = RedisStore::standalone("redis://127.0.0.1:6379").await?.with_prefix("billing:idem:")?;
/// let idem = Idempotency::new(store);
/// # let _ = idem;
/// let cluster = RedisStore::cluster(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002"]).await?;
/// # let _ = cluster;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct RedisStore {
    connection: Connection,
    prefix: Arc<str>,
    scripts: Arc<Scripts>,
}

/// Milliseconds for a script: clamped to `MAX_DURATION`, so every time the scripts compute
/// stays an exact integer in Lua and in range for `PEXPIREAT`.
fn millis(duration: Duration) -> u64 {
    duration_millis(duration)
}

fn timestamp(value: i64) -> Result<Timestamp, StoreError> {
    u64::try_from(value)
        .map(Timestamp::from_unix_millis)
        .map_err(|_| unexpected("a negative time"))
}

/// A number the scripts answer: a Lua number, which Redis sends as an integer reply.
fn int(value: &Value) -> Result<i64, StoreError> {
    match value {
        Value::Int(n) => Ok(*n),
        _ => Err(unexpected("a reply that is not a number")),
    }
}

/// Bytes the scripts answer: a Lua string, which Redis sends as a bulk string.
fn bytes(value: Value) -> Result<Vec<u8>, StoreError> {
    match value {
        Value::BulkString(bytes) => Ok(bytes),
        _ => Err(unexpected("a reply that is not a string")),
    }
}

fn steps(pairs: impl Iterator<Item = Value>) -> Result<Steps, StoreError> {
    let mut steps = Steps::new();
    let mut pairs = pairs;
    while let Some(name) = pairs.next() {
        let value = pairs
            .next()
            .ok_or_else(|| unexpected("a step without a value"))?;
        let name = String::from_utf8(bytes(name)?)
            .map_err(|_| unexpected("a step name that is not UTF-8"))?;
        steps.insert(name, bytes(value)?);
    }
    Ok(steps)
}

/// The claim's answer, from claim.lua's reply (its header lists the shapes); a reply it
/// cannot read is a corrupt record naming the key.
fn claim_answer(request: &ClaimRequest, reply: Value) -> Result<ClaimOutcome, StoreError> {
    read_claim_answer(request, reply).map_err(|err| err.for_key(&request.key))
}

fn read_claim_answer(request: &ClaimRequest, reply: Value) -> Result<ClaimOutcome, StoreError> {
    // The two common answers come bare (claim.lua's header says why): a completed
    // record's response, and the server's time when the claim made a fresh record.
    let items = match reply {
        Value::BulkString(response) => return Ok(ClaimOutcome::replay(response)),
        Value::Int(now) => return fresh_claim(request, now),
        other => array(other)?,
    };
    let mut items = items.into_iter();
    let kind = bytes(
        items
            .next()
            .ok_or_else(|| unexpected("an empty claim reply"))?,
    )?;
    let mut next = || {
        items
            .next()
            .ok_or_else(|| unexpected("a short claim reply"))
    };
    Ok(match kind.as_slice() {
        b"claimed" => {
            let token =
                u64::try_from(int(&next()?)?).map_err(|_| unexpected("a negative token"))?;
            let lease_until = timestamp(int(&next()?)?)?;
            let resumed = int(&next()?)? == 1;
            let created_at = timestamp(int(&next()?)?)?;
            let lease = lease_of(request, token, lease_until, created_at);
            ClaimOutcome::claimed(lease, resumed, steps(items)?)
        }
        b"replay_failure" => ClaimOutcome::replay_failure(bytes(next()?)?),
        b"in_flight" => {
            let millis =
                u64::try_from(int(&next()?)?).map_err(|_| unexpected("a negative wait"))?;
            ClaimOutcome::in_flight(Duration::from_millis(millis))
        }
        b"mismatch" => ClaimOutcome::Mismatch,
        _ => return Err(unexpected("an unknown claim answer")),
    })
}

/// The lease of a claim that made a fresh record at the server's time `now`: token 1, no
/// steps, its lease ending `request.lease` later, as claim.lua wrote it.
fn fresh_claim(request: &ClaimRequest, now: i64) -> Result<ClaimOutcome, StoreError> {
    let created_at = timestamp(now)?;
    let lease_until = now
        .checked_add_unsigned(millis(request.lease))
        .ok_or_else(|| unexpected("a time past the largest a lease may end"))?;
    let lease = lease_of(request, 1, timestamp(lease_until)?, created_at);
    Ok(ClaimOutcome::claimed(lease, false, Steps::new()))
}

/// The lease a claim granted `request`.
fn lease_of(
    request: &ClaimRequest,
    token: u64,
    lease_until: Timestamp,
    created_at: Timestamp,
) -> Lease {
    Lease::new(
        request.key.clone(),
        token,
        request.attempt,
        lease_until,
        created_at,
    )
    .with_retention(request.retention)
}

fn array(value: Value) -> Result<Vec<Value>, StoreError> {
    match value {
        Value::Array(items) => Ok(items),
        _ => Err(unexpected("a reply that is not an array")),
    }
}

impl RedisStore {
    /// Connects to a standalone Redis (or a primary behind a proxy) at `url`, through a
    /// [`ConnectionManager`] that reconnects by itself.
    ///
    /// # Errors
    /// [`StoreError`] when the URL is invalid or the server does not answer.
    pub async fn standalone(url: &str) -> Result<Self, StoreError> {
        Self::standalone_with_config(url, ConnectionManagerConfig::new()).await
    }

    /// [`RedisStore::standalone`] with the connection's timeouts and reconnection set by
    /// `config`. With a response timeout set, a request that times out replaces the
    /// connection, so a connection that silently stopped answering (packets dropped, no
    /// reset) costs one timeout per request in flight, not an outage.
    ///
    /// ```no_run
    /// use idem_redis::RedisStore;
    /// use redis::aio::ConnectionManagerConfig;
    /// use std::time::Duration;
    ///
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let config = ConnectionManagerConfig::new()
    ///     .set_response_timeout(Some(Duration::from_secs(2)))
    ///     .set_connection_timeout(Some(Duration::from_secs(1)));
    /// let store = RedisStore::standalone_with_config("redis://127.0.0.1:6379", config).await?;
    /// # let _ = store;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// [`StoreError`] when the URL is invalid or the server does not answer.
    pub async fn standalone_with_config(
        url: &str,
        config: ConnectionManagerConfig,
    ) -> Result<Self, StoreError> {
        let setup = |err| map(Operation::Setup, err);
        let client = redis::Client::open(url).map_err(setup)?;
        let manager = ConnectionManager::new_with_config(client.clone(), config.clone())
            .await
            .map_err(setup)?;
        Ok(Self::new(Connection::standalone(
            manager,
            Some((client, config)),
        )))
    }

    /// Connects to a Redis Cluster through any of its `nodes`.
    ///
    /// # Errors
    /// [`StoreError`] when a URL is invalid or the cluster does not answer.
    pub async fn cluster<I, T>(nodes: I) -> Result<Self, StoreError>
    where
        I: IntoIterator<Item = T>,
        T: redis::IntoConnectionInfo,
    {
        let setup = |err| map(Operation::Setup, err);
        let client = redis::cluster::ClusterClient::new(nodes).map_err(setup)?;
        let connection = client.get_async_connection().await.map_err(setup)?;
        Ok(Self::from_cluster_connection(connection))
    }

    /// A store over a connection manager you configured yourself. The store cannot make
    /// a new one: prefer [`RedisStore::standalone_with_config`], which replaces a
    /// connection that stops answering.
    pub fn from_connection_manager(manager: ConnectionManager) -> Self {
        Self::new(Connection::standalone(manager, None))
    }

    /// A store over a cluster connection you configured yourself.
    pub fn from_cluster_connection(connection: ClusterConnection) -> Self {
        Self::new(Connection::Cluster(connection))
    }

    fn new(connection: Connection) -> Self {
        Self {
            connection,
            prefix: DEFAULT_PREFIX.into(),
            scripts: Arc::new(Scripts::new()),
        }
    }

    /// Puts every record under `prefix` (default `idem:`), so several applications can
    /// share one Redis.
    ///
    /// # Errors
    /// [`PrefixError`] when the prefix holds `{` or `}` or is over 128 bytes.
    pub fn with_prefix(mut self, prefix: &str) -> Result<Self, PrefixError> {
        layout::check_prefix(prefix)?;
        self.prefix = prefix.into();
        Ok(self)
    }

    fn key(&self, key: &Key) -> Vec<u8> {
        layout::record_key(&self.prefix, key)
    }

    pub(crate) fn connection(&self) -> &Connection {
        &self.connection
    }

    pub(crate) fn prefix(&self) -> &str {
        &self.prefix
    }

    pub(crate) fn scripts(&self) -> &Scripts {
        &self.scripts
    }

    pub(crate) fn record_key(&self, key: &Key) -> Vec<u8> {
        self.key(key)
    }

    async fn fenced(
        &self,
        operation: Operation,
        transition: &Transition,
        lease: &Lease,
        extra: &[&[u8]],
    ) -> Result<i64, StoreError> {
        let mut call = self.scripts.call(transition, &self.key(&lease.key));
        call.arg(lease.token).arg(&lease.attempt.as_bytes()[..]);
        for arg in extra {
            call.arg(*arg);
        }
        self.scripts
            .run::<i64>(&self.connection, transition, &call)
            .await
            .map_err(|err| map(operation, err).for_key(&lease.key))
    }

    async fn write(
        &self,
        operation: Operation,
        transition: &Transition,
        lease: &Lease,
        extra: &[&[u8]],
    ) -> Result<WriteOutcome, StoreError> {
        Ok(
            match self.fenced(operation, transition, lease, extra).await? {
                1 => WriteOutcome::Applied,
                _ => WriteOutcome::Fenced,
            },
        )
    }
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.connection {
            Connection::Standalone(_) => "standalone",
            Connection::Cluster(_) => "cluster",
        };
        f.debug_struct("RedisStore")
            .field("connection", &kind)
            .field("prefix", &self.prefix)
            .finish()
    }
}

#[async_trait]
impl Store for RedisStore {
    async fn claim(&self, request: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        let mut call = self
            .scripts
            .call(&self.scripts.claim, &self.key(&request.key));
        call.arg(&request.fingerprint.as_bytes()[..])
            .arg(&request.attempt.as_bytes()[..])
            .arg(millis(request.lease))
            .arg(millis(request.retention));
        let reply: Value = self
            .scripts
            .run(&self.connection, &self.scripts.claim, &call)
            .await
            .map_err(|err| map(Operation::Claim, err).for_key(&request.key))?;
        claim_answer(request, reply)
    }

    async fn complete(&self, lease: &Lease, response: &[u8]) -> Result<WriteOutcome, StoreError> {
        let retention = millis(lease.retention).to_string();
        self.write(
            Operation::Complete,
            &self.scripts.complete,
            lease,
            &[response, retention.as_bytes()],
        )
        .await
    }

    async fn fail(&self, lease: &Lease, response: &[u8]) -> Result<WriteOutcome, StoreError> {
        let retention = millis(lease.retention).to_string();
        self.write(
            Operation::Fail,
            &self.scripts.fail,
            lease,
            &[response, retention.as_bytes()],
        )
        .await
    }

    async fn release(&self, lease: &Lease) -> Result<WriteOutcome, StoreError> {
        self.write(Operation::Release, &self.scripts.release, lease, &[])
            .await
    }

    async fn renew(&self, lease: &Lease, extend: Duration) -> Result<RenewOutcome, StoreError> {
        let extend = millis(extend).to_string();
        let retention = millis(lease.retention).to_string();
        let lease_until = self
            .fenced(
                Operation::Renew,
                &self.scripts.renew,
                lease,
                &[extend.as_bytes(), retention.as_bytes()],
            )
            .await?;
        if lease_until < 0 {
            return Ok(RenewOutcome::Fenced);
        }
        Ok(RenewOutcome::Renewed(
            lease.clone().with_lease_until(timestamp(lease_until)?),
        ))
    }

    async fn checkpoint(
        &self,
        lease: &Lease,
        step: &StepName,
        value: &[u8],
    ) -> Result<WriteOutcome, StoreError> {
        let retention = millis(lease.retention).to_string();
        self.write(
            Operation::Checkpoint,
            &self.scripts.checkpoint,
            lease,
            &[step.as_str().as_bytes(), value, retention.as_bytes()],
        )
        .await
    }

    async fn get(&self, key: &Key) -> Result<Option<Record>, StoreError> {
        let call = self.scripts.call(&self.scripts.get, &self.key(key));
        let reply: Value = self
            .scripts
            .run(&self.connection, &self.scripts.get, &call)
            .await
            .map_err(|err| map(Operation::Get, err).for_key(key))?;
        let items = array(reply)?;
        if items.is_empty() {
            return Ok(None);
        }
        let mut items = items.into_iter();
        let mut next = || items.next().ok_or_else(|| unexpected("a short record"));
        let fingerprint = bytes(next()?)?;
        let state = bytes(next()?)?;
        let token = int(&next()?)?;
        let attempt = bytes(next()?)?;
        let lease_until = int(&next()?)?;
        let created_at = int(&next()?)?;
        let expires_at = int(&next()?)?;
        let has_response = int(&next()?)? == 1;
        let response = bytes(next()?)?;
        let mut parts = Record::parts(key.clone())
            .fingerprint(&fingerprint)
            .state(state)
            .token(token)
            .attempt(&attempt)
            .lease_until_millis(lease_until)
            .created_at_millis(created_at)
            .expires_at_millis(expires_at)
            .response(has_response.then_some(response));
        for (name, value) in steps(items)? {
            parts = parts.step(name, value);
        }
        parts.build().map(Some)
    }

    /// Redis deletes each record itself (`PEXPIREAT`) at the moment it becomes absent, so
    /// there is never anything left to purge.
    async fn purge_expired(&self, _limit: usize) -> Result<usize, StoreError> {
        Ok(0)
    }

    fn expiry(&self) -> Expiry {
        Expiry::Vanishes
    }
}

#[cfg(test)]
mod claim_answer_tests {
    use std::time::Duration;

    use idem_core::store::{ClaimOutcome, ClaimRequest};
    use idem_core::{Fingerprint, Key, StoreError, Timestamp};
    use redis::Value;

    use super::claim_answer;

    fn request() -> ClaimRequest {
        ClaimRequest::new(
            Key::new("orders", "k1").unwrap(),
            Fingerprint::of_bytes("a"),
            Duration::from_secs(30),
            Duration::from_secs(3600),
        )
    }

    /// The lease, whether it resumed, and the steps of a `Claimed` answer.
    fn claimed(
        answer: Result<ClaimOutcome, StoreError>,
    ) -> (idem_core::record::Lease, bool, idem_core::record::Steps) {
        match answer.unwrap() {
            ClaimOutcome::Claimed {
                lease,
                resumed,
                steps,
                ..
            } => (lease, resumed, steps),
            other => panic!("{other:?}"),
        }
    }

    fn string(text: &str) -> Value {
        Value::BulkString(text.as_bytes().to_vec())
    }

    #[test]
    fn a_bare_string_is_a_replay_even_an_empty_one() {
        for body in ["{\"ok\":true}", ""] {
            match claim_answer(&request(), string(body)).unwrap() {
                ClaimOutcome::Replay { response, .. } => assert_eq!(response, body.as_bytes()),
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn a_bare_integer_is_a_fresh_claim_at_that_time() {
        let request = request();
        let now = 1_700_000_000_123;
        let (lease, resumed, steps) = claimed(claim_answer(&request, Value::Int(now)));
        assert_eq!(lease.key, request.key);
        assert_eq!(lease.token, 1);
        assert_eq!(lease.attempt, request.attempt);
        assert_eq!(
            lease.created_at,
            Timestamp::from_unix_millis(1_700_000_000_123)
        );
        assert_eq!(
            lease.lease_until,
            Timestamp::from_unix_millis(1_700_000_030_123),
            "the lease ends the request's lease after the server's time"
        );
        assert_eq!(lease.retention, request.retention);
        assert!(!resumed);
        assert!(steps.is_empty());
    }

    #[test]
    fn a_time_no_lease_can_hold_is_refused() {
        for now in [-1, i64::MAX] {
            let answer = claim_answer(&request(), Value::Int(now));
            assert!(
                matches!(answer, Err(StoreError::Corrupt { .. })),
                "{now}: {answer:?}"
            );
        }
    }

    #[test]
    fn the_other_answers_are_tables() {
        let request = request();
        let taken_over = Value::Array(vec![
            string("claimed"),
            Value::Int(3),
            Value::Int(2_000),
            Value::Int(1),
            Value::Int(1_000),
            string("charge"),
            string("ch_1"),
        ]);
        let (lease, resumed, steps) = claimed(claim_answer(&request, taken_over));
        assert_eq!(lease.key, request.key);
        assert_eq!(lease.token, 3);
        assert_eq!(lease.attempt, request.attempt);
        assert_eq!(lease.lease_until, Timestamp::from_unix_millis(2_000));
        assert_eq!(lease.created_at, Timestamp::from_unix_millis(1_000));
        assert_eq!(lease.retention, request.retention);
        assert!(resumed);
        assert_eq!(steps.get("charge").map(Vec::as_slice), Some(&b"ch_1"[..]));
        // A fresh claim's retry by the same attempt (its first answer lost) gets the table
        // answer: the same lease as the bare one, not resumed, no steps.
        let fresh = claimed(claim_answer(&request, Value::Int(1_000)));
        let again = Value::Array(vec![
            string("claimed"),
            Value::Int(1),
            Value::Int(31_000),
            Value::Int(0),
            Value::Int(1_000),
        ]);
        assert_eq!(claimed(claim_answer(&request, again)), fresh);
        let failure = Value::Array(vec![string("replay_failure"), string("boom")]);
        assert!(matches!(
            claim_answer(&request, failure).unwrap(),
            ClaimOutcome::ReplayFailure { response, .. } if response == b"boom"
        ));
        let in_flight = Value::Array(vec![string("in_flight"), Value::Int(1_500)]);
        assert!(matches!(
            claim_answer(&request, in_flight).unwrap(),
            ClaimOutcome::InFlight { retry_after, .. } if retry_after == Duration::from_millis(1_500)
        ));
        let mismatch = Value::Array(vec![string("mismatch")]);
        assert!(matches!(
            claim_answer(&request, mismatch).unwrap(),
            ClaimOutcome::Mismatch
        ));
    }

    #[test]
    fn anything_else_is_refused_as_corrupt() {
        for reply in [
            Value::Nil,
            Value::Okay,
            Value::SimpleString("replay".to_owned()),
            Value::Array(vec![]),
            Value::Array(vec![string("replay"), string("body")]),
            Value::Array(vec![string("claimed"), Value::Int(1)]),
        ] {
            let answer = claim_answer(&request(), reply.clone());
            assert!(
                matches!(answer, Err(StoreError::Corrupt { key: Some(_), .. })),
                "{reply:?}: a corrupt record naming its key, not {answer:?}"
            );
        }
    }
}
