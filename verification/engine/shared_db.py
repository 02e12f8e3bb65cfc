"""A shared, read-only Hypothesis example database for the dev profile.

When GitHub Actions uploads the suite's database as an artifact (see
.github/workflows/verify.yml) and a token is present (GITHUB_TOKEN, with
GDN_SHARED_DB_REPO="owner/repo"), the dev profile reads it through
GitHubArtifactDatabase wrapped in ReadOnlyDatabase, multiplexed with the
local database. Without a token, or offline, only the local one is used.
"""

from __future__ import annotations

import os

from hypothesis.database import MultiplexedDatabase, ReadOnlyDatabase

REPO_ENV = "GDN_SHARED_DB_REPO"
ARTIFACT = "hypothesis-example-db"


def database_for_dev(local):
    token = os.environ.get("GITHUB_TOKEN")
    repo = os.environ.get(REPO_ENV, "")
    if not token or "/" not in repo:
        return local
    try:
        from hypothesis.database import GitHubArtifactDatabase
    except ImportError:  # older Hypothesis
        return local
    owner, name = repo.split("/", 1)
    shared = GitHubArtifactDatabase(owner, name, artifact_name=ARTIFACT)
    return MultiplexedDatabase(local, ReadOnlyDatabase(shared))
