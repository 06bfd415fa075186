"""Migrated PostgreSQL test databases, reused between the tests of one process.

Cloning the template costs about 0.4 s and dropping the clone about 0.8 s; the suite used to
do both for each of its hundreds of PostgreSQL tests. A pool hands a test a database that
an earlier test of this process used, made as good as new when it was given back:

- every other connection to it is terminated (a test's processes are gone by then; one
  that is not loses its connection);
- its schema is checked against the template's (tables, columns, defaults, indexes,
  constraints, triggers, functions, the migration version), and it accepts connections
  and holds no prepared transaction; a database that fails a check is dropped, never
  reused;
- every table but ``alembic_version`` is emptied and the sequences restarted, and the rows
  the migrations seed (``SEEDED``: the ``gates`` rows) are put back;
- it is renamed: each checkout has a name never handed out before, so a process a test
  left behind cannot reach the next test's data through the URL it was given.

Each process (each xdist worker) has its own pool, named after its pid, and drops it at the
end of the session. Tests that need an empty, unmigrated database create their own.
"""

from __future__ import annotations

import itertools
import os

import psycopg
from psycopg import sql

# Everything of the public schema a test could change and truncation would not undo.
FINGERPRINT = """
SELECT md5(string_agg(item, E'\\n' ORDER BY item)) FROM (
    SELECT format('rel %s %s', relname, relkind) AS item
      FROM pg_class WHERE relnamespace = 'public'::regnamespace
    UNION ALL
    SELECT format('col %s.%s %s %s %s', c.relname, a.attname,
                  format_type(a.atttypid, a.atttypmod), a.attnotnull,
                  pg_get_expr(d.adbin, d.adrelid))
      FROM pg_attribute a
      JOIN pg_class c ON c.oid = a.attrelid
      LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
     WHERE c.relnamespace = 'public'::regnamespace AND a.attnum > 0 AND NOT a.attisdropped
    UNION ALL
    SELECT format('idx %s', pg_get_indexdef(i.indexrelid))
      FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid
     WHERE c.relnamespace = 'public'::regnamespace
    UNION ALL
    SELECT format('con %s %s', conname, pg_get_constraintdef(oid))
      FROM pg_constraint WHERE connamespace = 'public'::regnamespace
    UNION ALL
    SELECT format('trg %s', pg_get_triggerdef(t.oid))
      FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
     WHERE c.relnamespace = 'public'::regnamespace AND NOT t.tgisinternal
    UNION ALL
    SELECT format('fn %s', oid::regprocedure) FROM pg_proc
     WHERE pronamespace = 'public'::regnamespace
    UNION ALL
    SELECT format('ns %s', nspname) FROM pg_namespace
     WHERE nspname NOT LIKE 'pg\\_%' AND nspname <> 'information_schema'
    UNION ALL
    SELECT format('ver %s', version_num) FROM alembic_version
) AS schema
"""
TABLES = """
SELECT tablename FROM pg_tables
 WHERE schemaname = 'public' AND tablename <> 'alembic_version' ORDER BY tablename
"""
# Rows the migrations insert, which a database as good as new has.
SEEDED = ("INSERT INTO gates (name) VALUES ('model')",)
SEQUENCES = "SELECT sequencename FROM pg_sequences WHERE schemaname = 'public'"
TERMINATE = """
SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
 WHERE datname = %s AND pid <> pg_backend_pid()
"""
# A database a test left closed to connections, or with a transaction prepared in it.
UNFIT = """
SELECT NOT datallowconn OR EXISTS (SELECT 1 FROM pg_prepared_xacts p WHERE p.database = %s)
  FROM pg_database WHERE datname = %s
"""
RENAME_ATTEMPTS = 5


class Broken(Exception):
    """A database given back that is not as good as new: it is dropped."""


class PgPool:
    """Databases cloned from ``template`` on the cluster ``admin_url`` reaches."""

    def __init__(self, admin_url: str, template: str) -> None:
        self.admin_url = admin_url
        self.template = template
        self.prefix = f"tether_pool_{os.getpid()}_"
        self._serial = itertools.count(1)
        self._free: list[str] = []
        self._all: set[str] = set()
        with psycopg.connect(self._url(template), autocommit=True) as conn:
            self.fingerprint = _fingerprint(conn)

    def _url(self, dbname: str) -> str:
        return f"{self.admin_url.rpartition('/')[0]}/{dbname}"

    def _admin(self) -> psycopg.Connection[tuple[object, ...]]:
        return psycopg.connect(self.admin_url, autocommit=True)

    def take(self) -> str:
        """The URL of a migrated database no other test holds, under a new name."""
        if self._free:
            return self._url(self._free.pop())
        name = f"{self.prefix}{next(self._serial)}"
        with self._admin() as admin:
            admin.execute(
                sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                    sql.Identifier(name), sql.Identifier(self.template)
                )
            )
        self._all.add(name)
        return self._url(name)

    def give_back(self, url: str) -> None:
        """Make the database as good as new, under a new name, for the next test; drop it
        if it cannot be."""
        name = url.rpartition("/")[2]
        try:
            self._free.append(self._renew(name))
        except (Broken, psycopg.Error):
            self._drop(name)

    def _renew(self, name: str) -> str:
        with self._admin() as admin:
            admin.execute(TERMINATE, (name,))
            unfit = admin.execute(UNFIT, (name, name)).fetchone()
            if unfit is None or unfit[0]:
                raise Broken(f"{name} refuses connections or holds a prepared transaction")
        with psycopg.connect(self._url(name), autocommit=True) as conn:
            if _fingerprint(conn) != self.fingerprint:
                raise Broken(f"{name}: its schema is not the template's")
            _empty(conn)
        renamed = f"{self.prefix}{next(self._serial)}"
        with self._admin() as admin:
            for attempt in range(RENAME_ATTEMPTS):
                admin.execute(TERMINATE, (name,))
                try:
                    admin.execute(
                        sql.SQL("ALTER DATABASE {} RENAME TO {}").format(
                            sql.Identifier(name), sql.Identifier(renamed)
                        )
                    )
                    break
                except psycopg.errors.ObjectInUse:  # a leftover process connected again
                    if attempt == RENAME_ATTEMPTS - 1:
                        raise
        self._all.discard(name)
        self._all.add(renamed)
        return renamed

    def _drop(self, name: str) -> None:
        with self._admin() as admin:
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )
        self._all.discard(name)

    def close(self) -> None:
        """Drop every database of the pool."""
        for name in sorted(self._all):
            self._drop(name)
        self._free.clear()


def _fingerprint(conn: psycopg.Connection[tuple[object, ...]]) -> str:
    row = conn.execute(FINGERPRINT).fetchone()
    assert row is not None
    return str(row[0])


def _empty(conn: psycopg.Connection[tuple[object, ...]]) -> None:
    """Delete every row but the migration version, restart the sequences and put back the
    migrations' seeded rows. DELETE, not TRUNCATE: on tables this small it takes
    milliseconds where TRUNCATE takes hundreds (new files per table). Foreign keys are
    not checked meanwhile (every row goes)."""
    tables = [str(row[0]) for row in conn.execute(TABLES)]
    sequences = [str(row[0]) for row in conn.execute(SEQUENCES)]
    with conn.transaction():
        conn.execute("SET LOCAL session_replication_role = replica")
        for table in tables:
            conn.execute(sql.SQL("DELETE FROM {}").format(sql.Identifier(table)))
        for sequence in sequences:
            conn.execute(sql.SQL("ALTER SEQUENCE {} RESTART").format(sql.Identifier(sequence)))
        for statement in SEEDED:
            conn.execute(statement)
