-- Whether the schema of a schema-qualified table exists. Checked before CREATE SCHEMA,
-- which asks for the CREATE privilege on the database even when the schema exists: a role
-- granted CREATE on its schema only must still be able to migrate.
SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)
