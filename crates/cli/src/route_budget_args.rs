//! `loadlink route` flags for the peer budgets ([`loadlink_router::budget::Budgets`]): what a
//! worker or client may send before the router refuses it. One flag per field, its default taken
//! from `Budgets::default()`; durations are whole milliseconds (`-ms` flags). Flattened into
//! `RouteArgs`, so they are also `--config` file keys.

use anyhow::{Result, ensure};
use clap::Args;
use loadlink_router::RouterConfig;
use loadlink_router::budget::Budgets;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// The budgets every flag shows and starts from.
fn d() -> Budgets {
    Budgets::default()
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[derive(Args, Serialize, Deserialize)]
pub struct BudgetArgs {
    /// Largest `/server_info` body read when discovering a worker (bytes); a larger one fails
    /// the discovery and is counted as body_too_large.
    #[arg(long, default_value_t = d().discovery_body_bytes)]
    discovery_max_body_bytes: usize,
    /// One discovery attempt (`GET /server_info`), connect to last body byte, must end within
    /// this many ms; a worker that stalls mid-body is counted as timed_out.
    #[arg(long, default_value_t = ms(d().discovery_timeout))]
    discovery_timeout_ms: u64,
    /// Largest load-poll body (`/v1/loads`, `/metrics` of workers without a load socket), bytes.
    #[arg(long, default_value_t = d().poll_body_bytes)]
    load_poll_max_body_bytes: usize,
    /// Largest body of one worker's answer to a fan-out such as `/v1/models` (bytes).
    #[arg(long, default_value_t = d().fanout_body_bytes)]
    fanout_max_body_bytes: usize,
    /// One fan-out request to one worker (headers and body) must end within this many ms.
    #[arg(long, default_value_t = ms(d().fanout_timeout))]
    fanout_timeout_ms: u64,
    /// DP ranks believed of one worker that advertises no dp_size; a rank beyond it (or beyond
    /// the advertised dp_size) is refused as rank_out_of_range.
    #[arg(long, default_value_t = d().max_ranks)]
    max_ranks: usize,
    /// Largest load-stream message (bytes); a load message is under 200 bytes, larger ones are
    /// dropped by libzmq and counted as load_message_too_large.
    #[arg(long, default_value_t = d().load_message_bytes)]
    load_message_max_bytes: usize,
    /// Largest KV-event batch (bytes); larger ones are counted as kv_message_too_large.
    #[arg(long, default_value_t = d().kv_message_bytes)]
    kv_message_max_bytes: usize,
    /// Bytes one subscription socket may queue; its receive high-water mark is this divided by
    /// the stream's largest message.
    #[arg(long, default_value_t = d().socket_queue_bytes)]
    socket_queue_bytes: usize,
    /// Messages one stream may have handled per ingest wakeup before other streams get a turn.
    #[arg(long, default_value_t = d().wakeup_messages)]
    ingest_batch_messages: usize,
    /// KV-index blocks one worker rank may hold; past it that rank is priced from the approximate
    /// tree and the excess is counted as index_quota.
    #[arg(long, default_value_t = d().index_blocks_per_rank)]
    kv_index_max_blocks_per_rank: usize,
    /// Dial the KV-event hosts a worker advertises instead of its URL's host (only routable
    /// ones). Off: a worker cannot point the router at another host.
    #[arg(long, default_value_t = d().trust_advertised_hosts)]
    trust_advertised_hosts: bool,
    /// Consecutive empty answers (NXDOMAIN, no records, an empty file) of a membership source
    /// before the workers it added are removed.
    #[arg(long, default_value_t = d().membership_empty_answers)]
    membership_empty_answers: u32,
    /// Threads that parse, tokenize and hash large request bodies off the async executor at once
    /// (0: one per core).
    #[arg(long, default_value_t = d().request_work_threads)]
    request_work_threads: usize,
    /// Large-body jobs that may wait for a request-work thread; beyond it a request is answered
    /// 503 with Retry-After and counted as request_too_large.
    #[arg(long, default_value_t = d().request_work_queue)]
    request_work_queue: usize,
    /// Bodies up to this many bytes are worked inline on the executor (the hop to a thread costs
    /// more than the work); larger ones go to the request-work pool.
    #[arg(long, default_value_t = d().request_work_inline_bytes)]
    request_work_inline_bytes: usize,
}

impl BudgetArgs {
    /// Sets `cfg.budgets`; a budget of 0 where 0 would refuse everything is an error naming
    /// its flag.
    pub fn apply(&self, cfg: &mut RouterConfig) -> Result<()> {
        for (flag, v) in [
            (
                "--discovery-max-body-bytes",
                self.discovery_max_body_bytes as u64,
            ),
            ("--discovery-timeout-ms", self.discovery_timeout_ms),
            (
                "--load-poll-max-body-bytes",
                self.load_poll_max_body_bytes as u64,
            ),
            ("--fanout-max-body-bytes", self.fanout_max_body_bytes as u64),
            ("--fanout-timeout-ms", self.fanout_timeout_ms),
            ("--max-ranks", self.max_ranks as u64),
            (
                "--load-message-max-bytes",
                self.load_message_max_bytes as u64,
            ),
            ("--kv-message-max-bytes", self.kv_message_max_bytes as u64),
            ("--socket-queue-bytes", self.socket_queue_bytes as u64),
            ("--ingest-batch-messages", self.ingest_batch_messages as u64),
            (
                "--kv-index-max-blocks-per-rank",
                self.kv_index_max_blocks_per_rank as u64,
            ),
            (
                "--membership-empty-answers",
                u64::from(self.membership_empty_answers),
            ),
        ] {
            ensure!(v > 0, "{flag} must be at least 1, got 0");
        }
        // Field by field, so a budget added to `Budgets` later keeps its default until its flag
        // is added here.
        let b = &mut cfg.budgets;
        b.discovery_body_bytes = self.discovery_max_body_bytes;
        b.discovery_timeout = Duration::from_millis(self.discovery_timeout_ms);
        b.poll_body_bytes = self.load_poll_max_body_bytes;
        b.fanout_body_bytes = self.fanout_max_body_bytes;
        b.fanout_timeout = Duration::from_millis(self.fanout_timeout_ms);
        b.max_ranks = self.max_ranks;
        b.load_message_bytes = self.load_message_max_bytes;
        b.kv_message_bytes = self.kv_message_max_bytes;
        b.socket_queue_bytes = self.socket_queue_bytes;
        b.wakeup_messages = self.ingest_batch_messages;
        b.index_blocks_per_rank = self.kv_index_max_blocks_per_rank;
        b.trust_advertised_hosts = self.trust_advertised_hosts;
        b.membership_empty_answers = self.membership_empty_answers;
        b.request_work_threads = self.request_work_threads;
        b.request_work_queue = self.request_work_queue;
        b.request_work_inline_bytes = self.request_work_inline_bytes;
        Ok(())
    }
}
