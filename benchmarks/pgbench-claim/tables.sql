-- Four copies of idem's table for benchmarks/pgbench-claim/run.sh: ta as idem makes it
-- (primary key, expiry, listing and stuck-work indexes), tb with the listing index on
-- created_at alone, tc without the listing index, td without the stuck-work index.
CREATE EXTENSION IF NOT EXISTS pg_stat_statements;
DROP TABLE IF EXISTS ta, tb, tc, td;
CREATE TABLE ta (scope text NOT NULL, key text NOT NULL, fingerprint bytea NOT NULL,
    state text NOT NULL, token bigint NOT NULL, attempt bytea NOT NULL,
    lease_until timestamptz NOT NULL, created_at timestamptz NOT NULL,
    expires_at timestamptz NOT NULL, response bytea,
    steps jsonb NOT NULL DEFAULT '{}'::jsonb, resumed boolean NOT NULL DEFAULT false,
    PRIMARY KEY (scope, key));
CREATE TABLE tb (LIKE ta INCLUDING ALL);
CREATE TABLE tc (LIKE ta INCLUDING ALL);
CREATE TABLE td (LIKE ta INCLUDING ALL);
CREATE INDEX ON ta (expires_at);
CREATE INDEX ON tb (expires_at);
CREATE INDEX ON tc (expires_at);
CREATE INDEX ON td (expires_at);
CREATE INDEX ON ta (created_at, scope, key);
CREATE INDEX ON tb (created_at);
CREATE INDEX ON td (created_at, scope, key);
CREATE INDEX ON ta (lease_until) WHERE state = 'in_progress';
CREATE INDEX ON tb (lease_until) WHERE state = 'in_progress';
CREATE INDEX ON tc (lease_until) WHERE state = 'in_progress';
-- The benchmark's raw loop's table (idem-bench's RawPostgres), for fresh_traw.pgb.
DROP TABLE IF EXISTS traw;
CREATE TABLE traw (k text PRIMARY KEY, state text NOT NULL, response bytea);
