"""Edge replicas: read-only copies of a primary database, kept fresh through Litestream.

The primary runs `litestream replicate` (`leasestar replicate --to URL`); each replica
runs `litestream restore -f` into a file it never serves, and applies what changed from
that file into the database it serves, one SQLite transaction per change
(`leasestar serve --replica-of URL`). `docs/replicas.md` says why it is built this way.

Modules: `layout` (the files beside a replica's database and how a database knows it is
one), `litestream` (the binary, its configuration and store listings), `apply` (copying
a followed file into the served database), `follower` (the process that runs it all) and
`status` (what `/health` and `/metrics` report).
"""
