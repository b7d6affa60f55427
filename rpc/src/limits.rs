//! [`RpcLimits`]: what one server accepts. Every limit has a default, an option, and an
//! error (code [`crate::codes::LIMIT_EXCEEDED`]) that names the field to raise.

use std::time::Duration;

/// Server limits. Set with [`crate::Server::limits`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct RpcLimits {
    /// Calls (and notifications) running at once on one connection; one more is answered
    /// with a limit error at once (default 64). Batch elements count one each.
    pub max_in_flight: usize,
    /// Answers one connection holds that are not written yet (running calls included, and
    /// every error answer): at this many, the server stops reading the connection until
    /// answers leave (default 256). A client that sends calls and never reads the answers
    /// then stalls in its own writes instead of growing the server.
    pub max_queued_answers: usize,
    /// Bytes of responses one connection holds that are not written yet; as
    /// [`RpcLimits::max_queued_answers`] (default 64 MiB; one bigger response still goes,
    /// alone).
    pub max_queued_answer_bytes: u64,
    /// Bytes in one request line (plain JSON on the socket) or one HTTP body (default
    /// 64 MiB). Requests on ferry pipes are bounded by the pipe's own
    /// [`ferry_core::Limits`] instead.
    pub max_request_bytes: usize,
    /// Requests in one batch (default 1024).
    pub max_batch: usize,
    /// JSON values (numbers, strings, arrays, ...) in one plain JSON or HTTP request
    /// (default 1,048,576), counted on its bytes before it is parsed: parsed, each costs
    /// about 32 bytes, so `[0,0,...]` takes 17 times its text. Tensors travel as tensors
    /// (base64 inline, or a ferry pipe). Batch length and nesting depth (128) are checked
    /// the same way.
    pub max_request_values: usize,
    /// Bytes of big requests (plain JSON lines and HTTP bodies of 1 MiB or more) parsed
    /// and being answered at once, over the whole server (default 8 MiB). Parsed JSON costs
    /// 8 to 17 times its text until its call ends (and a Python handler's objects as much
    /// again), so this bounds what many big requests at once cost: one that finds no room
    /// waits, its connection not read meanwhile, until a big call ends. A request bigger
    /// than the whole budget goes alone.
    pub max_parse_bytes_in_flight: usize,
    /// A plain JSON connection (or an HTTP keep-alive connection) with no call running and
    /// nothing sent for this long is closed (default 5 minutes). So is a ferry pipe that
    /// holds nothing it would lose: no call running, no tensor reference or task of its
    /// own, no lease of server memory its peer still uses (a reader of a weights bundle
    /// stays connected however long it idles).
    pub idle_timeout: Duration,
    /// The longest a peer may take to send one request line (plain JSON) or the headers of
    /// one HTTP request, once it started (default 30 s): a slowloris connection is closed.
    pub request_timeout: Duration,
    /// Connections served at once (ferry pipes, plain JSON, HTTP); one more is refused
    /// with a message naming this field (default 512: below the usual limit of 1024 open
    /// files, so that refusing never needs a descriptor the process lacks).
    pub max_connections: usize,
    /// Bytes of tensors in one result sent inline (base64) to a plain JSON or HTTP client
    /// (default 64 MiB; base64 and the JSON text cost about 2.5 times that in memory). A
    /// bigger result is answered with a limit error naming this field; ferry pipes carry
    /// tensors without it (zero-copy over shm).
    pub max_inline_bytes: u64,
    /// Tasks (`ferry.task.submit`) held at once, running or finished and not yet fetched
    /// (default 1024).
    pub max_tasks: usize,
    /// Tasks one identity (a local user, the token's holders, one unauthenticated
    /// connection) may hold at once, counted like [`RpcLimits::max_tasks`] (default 256), so
    /// that one client cannot fill the table for everyone.
    pub max_tasks_per_identity: usize,
    /// How long a finished task's result is kept before it expires (default 10 minutes).
    pub task_ttl: Duration,
    /// The longest `wait_ms` a `ferry.task.result` may wait (default 60 s).
    pub max_task_wait: Duration,
    /// Tensor references ([`crate::remote`]) held at once (default 4096).
    pub max_refs: usize,
    /// Tensor references one identity may hold at once (default 1024).
    pub max_refs_per_identity: usize,
    /// Bytes of the tensors that references hold, all together (default 8 GiB).
    pub max_ref_bytes: u64,
    /// The time to live of a reference made without a connection to die with (over HTTP)
    /// and without a TTL of its own (default 10 minutes; at most
    /// [`crate::remote::MAX_REF_TTL`], 365 days: a longer one counts as that).
    pub ref_ttl: Duration,
}

impl Default for RpcLimits {
    fn default() -> Self {
        RpcLimits {
            max_in_flight: 64,
            max_queued_answers: 256,
            max_queued_answer_bytes: 64 << 20,
            max_request_bytes: 64 << 20,
            max_batch: 1024,
            max_request_values: 1 << 20,
            max_parse_bytes_in_flight: 8 << 20,
            idle_timeout: Duration::from_secs(300),
            request_timeout: Duration::from_secs(30),
            max_connections: 512,
            max_inline_bytes: 64 << 20,
            max_tasks: 1024,
            max_tasks_per_identity: 256,
            task_ttl: Duration::from_secs(600),
            max_task_wait: Duration::from_secs(60),
            max_refs: 4096,
            max_refs_per_identity: 1024,
            max_ref_bytes: 8 << 30,
            ref_ttl: Duration::from_secs(600),
        }
    }
}

impl RpcLimits {
    /// Sets [`RpcLimits::max_in_flight`] (at least 1).
    #[must_use]
    pub fn max_in_flight(mut self, n: usize) -> Self {
        self.max_in_flight = n.max(1);
        self
    }

    /// Sets [`RpcLimits::max_queued_answers`] (at least 1).
    #[must_use]
    pub fn max_queued_answers(mut self, n: usize) -> Self {
        self.max_queued_answers = n.max(1);
        self
    }

    /// Sets [`RpcLimits::max_queued_answer_bytes`] (at least 1).
    #[must_use]
    pub fn max_queued_answer_bytes(mut self, n: u64) -> Self {
        self.max_queued_answer_bytes = n.max(1);
        self
    }

    /// Sets [`RpcLimits::max_request_bytes`].
    #[must_use]
    pub fn max_request_bytes(mut self, n: usize) -> Self {
        self.max_request_bytes = n.max(2);
        self
    }

    /// Sets [`RpcLimits::max_batch`] (at least 1).
    #[must_use]
    pub fn max_batch(mut self, n: usize) -> Self {
        self.max_batch = n.max(1);
        self
    }

    /// Sets [`RpcLimits::max_request_values`] (at least 1).
    #[must_use]
    pub fn max_request_values(mut self, n: usize) -> Self {
        self.max_request_values = n.max(1);
        self
    }

    /// Sets [`RpcLimits::max_parse_bytes_in_flight`] (at least 1 MiB).
    #[must_use]
    pub fn max_parse_bytes_in_flight(mut self, n: usize) -> Self {
        self.max_parse_bytes_in_flight = n.max(1 << 20);
        self
    }

    /// Sets [`RpcLimits::idle_timeout`].
    #[must_use]
    pub fn idle_timeout(mut self, d: Duration) -> Self {
        self.idle_timeout = d.max(Duration::from_millis(1));
        self
    }

    /// Sets [`RpcLimits::request_timeout`].
    #[must_use]
    pub fn request_timeout(mut self, d: Duration) -> Self {
        self.request_timeout = d.max(Duration::from_millis(1));
        self
    }

    /// Sets [`RpcLimits::max_connections`] (at least 1).
    #[must_use]
    pub fn max_connections(mut self, n: usize) -> Self {
        self.max_connections = n.max(1);
        self
    }

    /// Sets [`RpcLimits::max_inline_bytes`].
    #[must_use]
    pub fn max_inline_bytes(mut self, n: u64) -> Self {
        self.max_inline_bytes = n;
        self
    }

    /// Sets [`RpcLimits::max_tasks`].
    #[must_use]
    pub fn max_tasks(mut self, n: usize) -> Self {
        self.max_tasks = n;
        self
    }

    /// Sets [`RpcLimits::max_tasks_per_identity`].
    #[must_use]
    pub fn max_tasks_per_identity(mut self, n: usize) -> Self {
        self.max_tasks_per_identity = n;
        self
    }

    /// Sets [`RpcLimits::task_ttl`].
    #[must_use]
    pub fn task_ttl(mut self, d: Duration) -> Self {
        self.task_ttl = d;
        self
    }

    /// Sets [`RpcLimits::max_refs`].
    #[must_use]
    pub fn max_refs(mut self, n: usize) -> Self {
        self.max_refs = n;
        self
    }

    /// Sets [`RpcLimits::max_refs_per_identity`].
    #[must_use]
    pub fn max_refs_per_identity(mut self, n: usize) -> Self {
        self.max_refs_per_identity = n;
        self
    }

    /// Sets [`RpcLimits::max_ref_bytes`].
    #[must_use]
    pub fn max_ref_bytes(mut self, n: u64) -> Self {
        self.max_ref_bytes = n;
        self
    }

    /// Sets [`RpcLimits::ref_ttl`] (at most [`crate::remote::MAX_REF_TTL`], 365 days).
    #[must_use]
    pub fn ref_ttl(mut self, d: Duration) -> Self {
        self.ref_ttl = d.min(crate::remote::MAX_REF_TTL);
        self
    }

    /// Sets [`RpcLimits::max_task_wait`].
    #[must_use]
    pub fn max_task_wait(mut self, d: Duration) -> Self {
        self.max_task_wait = d;
        self
    }
}
