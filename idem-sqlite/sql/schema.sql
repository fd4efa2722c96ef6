-- idem's tables. Every statement is idempotent: opening a database runs this file.
CREATE TABLE IF NOT EXISTS idem_schema (
    version INTEGER NOT NULL
);

CREATE TABLE IF NOT EXISTS idem_records (
    scope       TEXT    NOT NULL,
    key         TEXT    NOT NULL,
    fingerprint BLOB    NOT NULL CHECK (length(fingerprint) = 32),
    state       TEXT    NOT NULL CHECK (state IN ('in_progress', 'completed', 'failed')),
    token       INTEGER NOT NULL CHECK (token >= 1),
    attempt     BLOB    NOT NULL CHECK (length(attempt) = 16),
    lease_until INTEGER NOT NULL, -- milliseconds since the Unix epoch
    created_at  INTEGER NOT NULL,
    expires_at  INTEGER NOT NULL,
    response    BLOB,
    PRIMARY KEY (scope, key)
) WITHOUT ROWID;

-- purge_expired scans by expiry.
CREATE INDEX IF NOT EXISTS idem_records_expires_at ON idem_records (expires_at);

CREATE TABLE IF NOT EXISTS idem_steps (
    scope TEXT NOT NULL,
    key   TEXT NOT NULL,
    step  TEXT NOT NULL,
    value BLOB NOT NULL,
    PRIMARY KEY (scope, key, step)
) WITHOUT ROWID;

-- Listing for operators, oldest first (Admin::list), and finding stuck work.
CREATE INDEX IF NOT EXISTS idem_records_created ON idem_records (created_at, scope, key);
CREATE INDEX IF NOT EXISTS idem_records_in_progress_lease ON idem_records (lease_until)
    WHERE state = 'in_progress';
