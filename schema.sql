-- leasestar: the one source of the tables.
--
-- Applied on every start with CREATE ... IF NOT EXISTS; the schema version lives in
-- PRAGMA user_version (set by app/database.py, which refuses a newer one).
--
-- Design, so that the read path does no per-row Python work:
--   * `body` holds each applicant as the API serves it (canonical JSON), compressed
--     alone with a zstd dictionary of `body_dictionaries` (applicants/bodies.py says
--     how and why). A page is the bodies of the matching rows, concatenated in SQL and
--     decompressed into one comma-joined buffer.
--   * Every sortable or filterable field is also a typed column, so ORDER BY and
--     WHERE run on indexes. Datetimes are integer microseconds since the Unix epoch
--     (UTC), so comparison is by instant; strings compare by code point (BINARY).
--   * `change_seq` is a strictly increasing sequence moved by every write to a row;
--     `sync_state.change_seq` is its high-water mark and doubles as the data version
--     that keys cached counts.

CREATE TABLE IF NOT EXISTS applicants (
    id                 TEXT    NOT NULL PRIMARY KEY,
    change_seq         INTEGER NOT NULL,
    integration_id     TEXT    NOT NULL,
    integration_vendor TEXT    NOT NULL,
    x_id               TEXT    NOT NULL,
    x_property_id      TEXT    NOT NULL,
    property_id        TEXT    NOT NULL,
    created_at         INTEGER NOT NULL,
    updated_at         INTEGER NOT NULL,
    last_seen          INTEGER NOT NULL,
    first_name         TEXT,
    middle_name        TEXT,
    last_name          TEXT,
    email_1            TEXT,
    -- digits of phone_1 only, so the phone filter is an index lookup
    phone_1_digits     TEXT,
    date_of_birth      TEXT,
    city               TEXT,
    state              TEXT,
    zip                TEXT,
    -- hash of every non-service field: tells an import whether a record changed
    content_hash       BLOB    NOT NULL,
    -- one byte naming the dictionary, then a zstd frame (applicants/bodies.py)
    body               BLOB    NOT NULL
);

-- The zstd dictionaries bodies are compressed with, trained on the records themselves;
-- never changed or dropped, so that every stored body can be read. `ratio` is what the
-- dictionary gave its own sample: a write whose records do much worse trains another.
CREATE TABLE IF NOT EXISTS body_dictionaries (
    number     INTEGER NOT NULL PRIMARY KEY CHECK (number BETWEEN 1 AND 100),
    dictionary BLOB    NOT NULL,
    ratio      REAL    NOT NULL
);

-- The upsert key: source systems reuse ids across integrations and properties.
CREATE UNIQUE INDEX IF NOT EXISTS applicants_source_key
    ON applicants (integration_id, x_property_id, x_id);
CREATE UNIQUE INDEX IF NOT EXISTS applicants_change_seq ON applicants (change_seq);

-- One index per sortable field, with the id tiebreak, so every single-key ordering
-- (either direction) is an index walk.
-- The default ordering's index also carries the two date filters, so a date window on
-- the default order is checked from the index alone, without reading each row.
CREATE INDEX IF NOT EXISTS applicants_by_created_at
    ON applicants (created_at, id, updated_at, last_seen);
CREATE INDEX IF NOT EXISTS applicants_by_updated_at ON applicants (updated_at, id);
CREATE INDEX IF NOT EXISTS applicants_by_last_seen ON applicants (last_seen, id);
CREATE INDEX IF NOT EXISTS applicants_by_x_id ON applicants (x_id, id);
CREATE INDEX IF NOT EXISTS applicants_by_x_property_id ON applicants (x_property_id, id);
CREATE INDEX IF NOT EXISTS applicants_by_property_id ON applicants (property_id, created_at, id);
CREATE INDEX IF NOT EXISTS applicants_by_integration_id ON applicants (integration_id, created_at, id);
-- property_id's and integration_id's indexes above, and last_name's below, go on after
-- their field in another order (a filter's default order; first_name): a sort by the
-- field alone needs (field, id), the total order the contract gives it, or SQLite
-- sorts every group of ties (~50-100 ms a page at 100,000 rows).
CREATE INDEX IF NOT EXISTS applicants_sorted_by_property_id ON applicants (property_id, id);
CREATE INDEX IF NOT EXISTS applicants_sorted_by_integration_id ON applicants (integration_id, id);
CREATE INDEX IF NOT EXISTS applicants_by_integration_vendor ON applicants (integration_vendor, id);
CREATE INDEX IF NOT EXISTS applicants_by_first_name ON applicants (first_name, id);
CREATE INDEX IF NOT EXISTS applicants_by_middle_name ON applicants (middle_name, id);
CREATE INDEX IF NOT EXISTS applicants_by_last_name ON applicants (last_name, first_name, id);
CREATE INDEX IF NOT EXISTS applicants_sorted_by_last_name ON applicants (last_name, id);
CREATE INDEX IF NOT EXISTS applicants_by_email_1 ON applicants (email_1, id);
CREATE INDEX IF NOT EXISTS applicants_by_email_1_nocase ON applicants (email_1 COLLATE NOCASE);
CREATE INDEX IF NOT EXISTS applicants_by_phone_1_digits ON applicants (phone_1_digits);
CREATE INDEX IF NOT EXISTS applicants_by_date_of_birth ON applicants (date_of_birth, id);
CREATE INDEX IF NOT EXISTS applicants_by_city ON applicants (city, id);
CREATE INDEX IF NOT EXISTS applicants_by_state ON applicants (state, id);
CREATE INDEX IF NOT EXISTS applicants_by_zip ON applicants (zip, id);

-- One row: the high-water mark of applicants.change_seq. Every write transaction
-- moves it, so it is also the data version that keys cached counts and ETags.
-- cursor_key signs pagination cursors, so a cursor cannot be forged or carried to
-- another database.
-- A new database starts its sequence at its creation time in microseconds, not at 0:
-- a database restored from an export (or any replacement) then numbers its writes
-- above every sequence the one it replaces handed out (which wrote less than one row a
-- microsecond), so a sync client that kept its last sequence receives all of the new
-- database's records instead of silently skipping its first writes. Within a database
-- the sequence only counts up; no clock orders the feed.
CREATE TABLE IF NOT EXISTS sync_state (
    singleton  INTEGER NOT NULL PRIMARY KEY CHECK (singleton = 1),
    change_seq INTEGER NOT NULL,
    cursor_key BLOB    NOT NULL
);
INSERT OR IGNORE INTO sync_state (singleton, change_seq, cursor_key)
    VALUES (1, CAST((julianday('now') - 2440587.5) * 86400000000 AS INTEGER), randomblob(32));

-- Per integration, the change sequence of the last write to one of its applicants,
-- moved by the writer in the same transaction as the rows. A scoped token's ETags are
-- keyed by the largest of its integrations' (`plan.scope_version`), so another tenant's
-- writes never change what a scoped token is told (issue 18): one lookup per integration
-- of this small table, as cheap as reading sync_state.
CREATE TABLE IF NOT EXISTS integration_versions (
    integration_id TEXT    NOT NULL PRIMARY KEY,
    change_seq     INTEGER NOT NULL
) WITHOUT ROWID;

-- API tokens, `lst_<token_id>_<secret>`. Only the SHA-256 of the whole token is stored;
-- the token itself is shown once. Lookup is by the public token_id, then the hashes are
-- compared in constant time, so timing tells nothing about any secret.
CREATE TABLE IF NOT EXISTS tokens (
    name         TEXT    NOT NULL PRIMARY KEY,
    token_id     TEXT    NOT NULL UNIQUE,
    token_hash   BLOB    NOT NULL,
    created_at   INTEGER NOT NULL,
    revoked_at   INTEGER,
    -- JSON array of integration ids the token may see; NULL means every integration
    integrations TEXT
);

-- Webhooks (issue 28, leasestar/webhooks/). A subscription is sent the changes committed
-- after it was created, in change order. Secrets sign, so they are stored as they are
-- (a hash could not sign): the file is as secret as the records themselves; no command
-- prints a secret after it was created. `previous_secret` still signs, beside the new
-- one, until `previous_until` (a rotation's grace period). `delivered_through` is the
-- change sequence up to which every event is done (delivered, or given up after the
-- retry horizon): the one cursor a restart resumes from, so an event is sent at least
-- once whatever moment the server was killed at.
CREATE TABLE IF NOT EXISTS webhook_subscriptions (
    id                TEXT    NOT NULL PRIMARY KEY,
    url               TEXT    NOT NULL,
    -- JSON array of integration ids; NULL means every integration
    integrations      TEXT,
    -- JSON array of DATA_NEW, DATA_UPDATE
    events            TEXT    NOT NULL,
    signing           TEXT    NOT NULL CHECK (signing IN ('propexo', 'standard')),
    secret            TEXT    NOT NULL,
    previous_secret   TEXT,
    previous_until    INTEGER,
    created_at        INTEGER NOT NULL,
    updated_at        INTEGER NOT NULL,
    revoked_at        INTEGER,
    -- set when the receiver answered 410 Gone: nothing more is sent
    disabled_at       INTEGER,
    disabled_reason   TEXT,
    delivered_through INTEGER NOT NULL
);

-- The outbox: one event per applicant row a write changed, inserted by the writer in the
-- data's own transaction, so a kill at any moment leaves both or neither. Keyed by the
-- change sequence of the row write it describes (one event per row write). `data` is
-- encoded as applicants.body is (applicants/bodies.py): DATA_NEW holds the stored body
-- itself (compressed, no second copy of the work), DATA_UPDATE the diff as plain JSON.
-- Written only while a subscription is active (webhooks/outbox.py says why); rows every
-- subscription is done with are deleted by the deliverer.
CREATE TABLE IF NOT EXISTS webhook_events (
    change_seq     INTEGER NOT NULL PRIMARY KEY,
    -- 96 random bits: unique without a second index for every write to maintain
    event_id       TEXT    NOT NULL,
    event_type     TEXT    NOT NULL,
    record_id      TEXT    NOT NULL,
    integration_id TEXT    NOT NULL,
    property_id    TEXT    NOT NULL,
    created_at     INTEGER NOT NULL,
    data           BLOB    NOT NULL
);

-- Every attempt to send an event to a subscription, and its answer, for `leasestar
-- webhook deliveries`: written by the deliverer after the attempt (an attempt a kill
-- cut short is made again, which is what at least once means).
CREATE TABLE IF NOT EXISTS webhook_attempts (
    subscription_id TEXT    NOT NULL,
    change_seq      INTEGER NOT NULL,
    attempt         INTEGER NOT NULL,
    attempted_at    INTEGER NOT NULL,
    -- delivered, retry, failed (gave up at the horizon) or gone (410: disabled)
    outcome         TEXT    NOT NULL,
    status          INTEGER,
    answer          TEXT    NOT NULL,
    next_attempt_at INTEGER,
    PRIMARY KEY (subscription_id, change_seq, attempt)
) WITHOUT ROWID;

-- What a token may do besides reading applicants: `webhooks` manages subscriptions over
-- HTTP (/v1/webhooks/). A table rather than a column of tokens, so older databases
-- gain it by schema.sql alone.
CREATE TABLE IF NOT EXISTS token_permissions (
    name       TEXT NOT NULL,
    permission TEXT NOT NULL CHECK (permission IN ('webhooks')),
    PRIMARY KEY (name, permission)
) WITHOUT ROWID;
