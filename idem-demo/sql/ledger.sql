-- The shop's ledger: one row per debit. `debit_key` is the downstream key the HTTP
-- service derives per execution (NULL in the in-process shop); the unique index makes
-- the ledger refuse a second debit of one execution.
PRAGMA journal_mode = WAL;
CREATE TABLE IF NOT EXISTS ledger (
    payment   INTEGER PRIMARY KEY,
    order_id  TEXT    NOT NULL,
    cents     INTEGER NOT NULL,
    debit_key TEXT    UNIQUE
);
