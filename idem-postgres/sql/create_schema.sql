-- The schema of a schema-qualified table, created when missing so that migrate() works on
-- a fresh database. {schema} is the validated, quoted schema name.
CREATE SCHEMA IF NOT EXISTS {schema};
