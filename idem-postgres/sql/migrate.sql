-- idem's table. {table} is the configured (validated, quoted) table name; index names are
-- derived from it (`"<table>-<what>"`, which no table name idem accepts can equal). Every statement is idempotent: migrate() may run at every
-- start, from many processes at once (it runs under an advisory lock).
-- No CHECK constraints: PostgreSQL prepares each one's expression again on every insert and
-- update. What they held (a known state, a 32-byte fingerprint and a 16-byte attempt, a
-- token of at least 1) idem's own statements test before they act on a row they do not
-- decode, and every read refuses a row without it as corrupt. A table made by an older
-- idem keeps its constraints, which change no answer; dropping them is the operator's
-- choice (CHANGELOG.md).
CREATE TABLE IF NOT EXISTS {table} (
    scope       text        NOT NULL,
    key         text        NOT NULL,
    fingerprint bytea       NOT NULL,
    state       text        NOT NULL,
    token       bigint      NOT NULL,
    attempt     bytea       NOT NULL,
    lease_until timestamptz NOT NULL,
    created_at  timestamptz NOT NULL,
    expires_at  timestamptz NOT NULL,
    response    bytea,
    -- Checkpoints: step name -> base64 of its value.
    steps       jsonb       NOT NULL DEFAULT '{}'::jsonb,
    -- Whether the last claim took over from another attempt.
    resumed     boolean     NOT NULL DEFAULT false,
    PRIMARY KEY (scope, key)
);

-- purge_expired scans by expiry.
CREATE INDEX IF NOT EXISTS {index_expires_at} ON {table} (expires_at);

-- Listing for operators, oldest first (Admin::list).
CREATE INDEX IF NOT EXISTS {index_created} ON {table} (created_at, scope, key);

-- Finding stuck work: in-progress records by lease end.
CREATE INDEX IF NOT EXISTS {index_in_progress_lease} ON {table} (lease_until)
    WHERE state = 'in_progress';
