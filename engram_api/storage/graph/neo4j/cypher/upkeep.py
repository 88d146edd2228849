"""The Cypher of forgetting (``neo4j.deletion``: a message, a fact, a whole user) and of the maintenance
jobs (``neo4j.maintenance``: decay, reinforcement, clusters, feedback, learned weights).

Invariants: the package's (``neo4j.cypher``): every query filters on ``$user_id``, and model-provided text
is only ever a parameter. The exceptions are store-wide by design and return or write no user's content:
the decay driver's users with a fact due, the due backfill and the due recompute after a policy change
(ids, strengths and instants only), and the policy record.
"""

from __future__ import annotations

from engram_api.models import FeedbackRow
from engram_api.storage.graph.neo4j.cypher.schema import projection
from engram_api.storage.graph.neo4j.episodes import MICROS

__all__ = [
    "FORGET_USER_LABELS",
    "Q_ARCHIVE_DUE",
    "Q_ARCHIVE_SET",
    "Q_CLUSTERS",
    "Q_CLUSTERS_CREATE",
    "Q_CLUSTERS_DELETE",
    "Q_CLUSTERS_LINK_ENTITIES",
    "Q_CLUSTERS_LINK_FACTS",
    "Q_CLUSTER_MEMBERS",
    "Q_DUE_SET",
    "Q_FADING",
    "Q_FEEDBACK_ADD",
    "Q_FEEDBACK_ALL",
    "Q_FEEDBACK_USER",
    "Q_FORGET_EPISODE",
    "Q_FORGET_FACTS",
    "Q_FORGET_FACT_PLAN",
    "Q_FORGET_LINKS",
    "Q_FORGET_ORPHANS",
    "Q_FORGET_PLAN",
    "Q_FORGET_RESTORE",
    "Q_FORGET_SOURCED",
    "Q_FORGET_USER_SCAN",
    "Q_REDUE_FACTS",
    "Q_REDUE_SET",
    "Q_REINFORCE_READ",
    "Q_REINFORCE_SET",
    "Q_SET_FADING",
    "Q_UNDUE_FACTS",
    "Q_UNDUE_FACT_USERS",
    "Q_USERS_DUE",
    "Q_WEIGHTS_LOAD",
    "Q_WEIGHTS_SAVE",
]

# -------------------------------------------------------------------------------------- forget
Q_FORGET_PLAN = """
MATCH (ep:Episode {user_id: $user_id, id: $episode_id})
WITH ep, COLLECT {
  MATCH (ep)<-[:FROM]-(f:Fact {user_id: $user_id})
  WHERE NOT EXISTS { MATCH (f)-[:FROM]->(other:Episode) WHERE other <> ep }
  RETURN f.id
} AS doomed
RETURN doomed, COLLECT {
  MATCH (ep)<-[:FROM]-(e:Entity {user_id: $user_id}) RETURN e.id AS id
  UNION
  MATCH (f:Fact {user_id: $user_id})-[:SUBJECT|OBJECT]->(e:Entity {user_id: $user_id})
  WHERE f.id IN doomed RETURN e.id AS id
} AS candidates, COLLECT { MATCH (c:Chunk {user_id: $user_id}) WHERE c.episode_id = ep.id RETURN c.id } AS chunks
"""
Q_FORGET_FACT_PLAN = """
MATCH (f:Fact {user_id: $user_id, id: $fact_id})
RETURN [f.id] AS doomed, COLLECT { MATCH (f)-[:SUBJECT|OBJECT]->(e:Entity {user_id: $user_id}) RETURN e.id } AS candidates,
       [] AS chunks
"""
Q_FORGET_LINKS = """
RETURN COLLECT { MATCH (f:Fact {user_id: $user_id}) WHERE f.id IN $doomed AND f.superseded_by IS NOT NULL
                 RETURN [f.id, f.superseded_by] } AS doomed_links,
       COLLECT { MATCH (g:Fact {user_id: $user_id}) WHERE g.superseded_by IN $doomed AND NOT g.id IN $doomed
                 RETURN [g.id, g.superseded_by] } AS older,
       COLLECT { UNWIND $doomed AS fid MATCH (f:Fact {user_id: $user_id, id: fid})
                 WHERE f.embedding IS NOT NULL RETURN f.id }
       + COLLECT { UNWIND $candidates AS eid MATCH (e:Entity {user_id: $user_id, id: eid})
                   WHERE e.embedding IS NOT NULL RETURN e.id } AS vectored
"""
Q_FORGET_RESTORE = """
UNWIND $rows AS r
MATCH (g:Fact {user_id: $user_id, id: r.fact_id})
SET g.superseded_by = r.successor,
    g.valid_until = CASE WHEN r.successor IS NULL THEN null ELSE g.valid_until END,
    g.updated_at = $now
"""
Q_FORGET_FACTS = """
UNWIND $doomed AS fid
MATCH (f:Fact {user_id: $user_id, id: fid})
DETACH DELETE f
"""
Q_FORGET_SOURCED = (
    "MATCH (:Episode {user_id: $user_id, id: $episode_id})<-[:FROM]-(f:Fact {user_id: $user_id}) RETURN f.id AS id"
)
Q_FORGET_EPISODE = "MATCH (ep:Episode {user_id: $user_id, id: $episode_id}) DETACH DELETE ep"
Q_FORGET_ORPHANS = """
UNWIND $candidates AS eid
MATCH (e:Entity {user_id: $user_id, id: eid})
WHERE NOT EXISTS { MATCH (e)-[:FROM]->(:Episode) } AND NOT EXISTS { MATCH (e)<-[:SUBJECT|OBJECT]-(:Fact) }
WITH e, e.id AS id, COLLECT { MATCH (e)-[:HAS_ALIAS]->(a:Alias) RETURN a } AS aliases
FOREACH (a IN aliases | DETACH DELETE a)
DETACH DELETE e
RETURN id
"""
Q_FORGET_USER_SCAN = """
RETURN COLLECT { MATCH (f:Fact {user_id: $user_id}) RETURN f.id } AS facts,
       COLLECT { MATCH (e:Entity {user_id: $user_id}) RETURN e.id } AS entities,
       COLLECT { MATCH (f:Fact {user_id: $user_id}) WHERE f.embedding IS NOT NULL RETURN f.id }
       + COLLECT { MATCH (e:Entity {user_id: $user_id}) WHERE e.embedding IS NOT NULL RETURN e.id } AS vectored,
       COUNT { MATCH (ep:Episode {user_id: $user_id}) } AS episodes
"""
# Labels are constants of this module; one statement per label keeps each delete on an index.
FORGET_USER_LABELS = (
    "Fact",
    "Alias",
    "Entity",
    "EntityEdit",
    "Chunk",
    "Episode",
    "Cluster",
    "Feedback",
    "Removal",
    "User",
)

# --------------------------------------------------------------------------------- maintenance
# Only the facts due (engram_fact_user_due); archived facts have no due, so the index never holds them.
Q_ARCHIVE_DUE = """
MATCH (f:Fact {user_id: $user_id})
WHERE f.archive_due_at <= $now AND f.archived = false
WITH f ORDER BY f.archive_due_at, f.id LIMIT $batch
RETURN f.id AS id, f.strength AS strength, coalesce(f.last_decay_at, f.created_at) AS since
"""
Q_ARCHIVE_SET = """
UNWIND $rows AS r
MATCH (f:Fact {user_id: $user_id, id: r.id})
SET f.strength = r.strength, f.archived = true, f.archive_due_at = null, f.last_decay_at = $now, f.updated_at = $now
"""
Q_DUE_SET = """
UNWIND $rows AS r
MATCH (f:Fact {user_id: $user_id, id: r.id})
SET f.archive_due_at = r.due
"""
# The decay job's to-do list, from the due index alone (engram_fact_due): every user's facts, by design.
Q_USERS_DUE = """
MATCH (f:Fact) WHERE f.archive_due_at <= $now
RETURN DISTINCT f.user_id AS user_id ORDER BY user_id
"""
# `engram migrate`'s backfill of facts stored before read-time decay (a scan of every fact, once).
Q_UNDUE_FACT_USERS = """
MATCH (f:Fact) WHERE f.archived = false AND f.archive_due_at IS NULL RETURN DISTINCT f.user_id AS user_id
"""
Q_UNDUE_FACTS = """
MATCH (f:Fact {user_id: $user_id}) WHERE f.archived = false AND f.archive_due_at IS NULL
RETURN f.id AS id, f.strength AS strength, coalesce(f.last_decay_at, f.created_at) AS since
"""
# The decay policy the stored dues were computed with (``GraphStore.refresh_dues``), on the schema marker
# (`engram migrate` sets only its version and migrated_at, so it keeps them; a process opens only a
# migrated database, so the node is there).
Q_FADING = """
MATCH (s:EngramSchema {name: 'engram'}) WHERE s.decay_per_day IS NOT NULL
RETURN s.decay_per_day AS per_day, s.archive_threshold AS threshold
"""
Q_SET_FADING = """
MATCH (s:EngramSchema {name: 'engram'}) SET s.decay_per_day = $per_day, s.archive_threshold = $threshold
"""
# The recompute after a policy change: every user's unarchived facts, a page by id (engram_fact_id's index).
# The reference instant comes back as epoch microseconds too, to compare with, not a DateTime: one sent
# back as a parameter need not equal the stored one (its zone).
_SINCE = "coalesce(f.last_decay_at, f.created_at)"
Q_REDUE_FACTS = f"""
MATCH (f:Fact) WHERE f.id > $after AND f.archived = false
WITH f ORDER BY f.id LIMIT $batch
RETURN f.id AS id, f.strength AS strength, {_SINCE} AS since, {MICROS.format(t=_SINCE)} AS since_us
"""
# Only a fact still as read: no user lock is held, so a write in between (a reinforcement, a restatement,
# an archival) keeps the due it computed itself.
Q_REDUE_SET = f"""
UNWIND $rows AS r
MATCH (f:Fact {{id: r.id}})
WHERE f.archived = false AND f.strength = r.strength AND {MICROS.format(t=_SINCE)} = r.since_us
SET f.archive_due_at = r.due
"""
Q_REINFORCE_READ = """
UNWIND $ids AS fid
MATCH (f:Fact {user_id: $user_id, id: fid})
RETURN DISTINCT f.id AS id, f.strength AS strength, f.archived AS archived,
       coalesce(f.last_decay_at, f.created_at) AS since
"""
Q_REINFORCE_SET = """
UNWIND $rows AS r
MATCH (f:Fact {user_id: $user_id, id: r.id})
SET f.strength = r.strength, f.archived = false, f.archive_due_at = r.due, f.last_decay_at = $now,
    f.updated_at = $now
"""
Q_CLUSTERS_DELETE = "MATCH (c:Cluster {user_id: $user_id}) DETACH DELETE c"
Q_CLUSTERS_CREATE = "UNWIND $rows AS row CREATE (c:Cluster) SET c = row"
Q_CLUSTERS_LINK_FACTS = """
UNWIND $links AS l
MATCH (c:Cluster {user_id: $user_id, id: l.cluster_id})
MATCH (f:Fact {user_id: $user_id, id: l.node_id})
CREATE (c)-[:HAS_MEMBER]->(f)
"""
Q_CLUSTERS_LINK_ENTITIES = """
UNWIND $links AS l
MATCH (c:Cluster {user_id: $user_id, id: l.cluster_id})
MATCH (e:Entity {user_id: $user_id, id: l.node_id})
CREATE (c)-[:HAS_MEMBER]->(e)
"""
Q_CLUSTERS = "MATCH (c:Cluster {user_id: $user_id}) RETURN c {.*} AS row"
Q_CLUSTER_MEMBERS = """
MATCH (c:Cluster {user_id: $user_id})-[:HAS_MEMBER]->(n {user_id: $user_id})
RETURN c.id AS owner, CASE WHEN n:Fact THEN 'fact' ELSE 'entity' END AS kind, n.id AS node_id
"""
Q_FEEDBACK_ADD = "UNWIND $rows AS row CREATE (fb:Feedback) SET fb = row"
_FEEDBACK = projection("fb", tuple(FeedbackRow.model_fields), "")
# `seq` (insertion order) breaks ties between rows stored with the same created_at: later first.
Q_FEEDBACK_USER = f"""
MATCH (fb:Feedback {{user_id: $user_id}})
RETURN {_FEEDBACK} AS row ORDER BY fb.created_at DESC, fb.seq DESC LIMIT $limit
"""
Q_FEEDBACK_ALL = f"""
MATCH (fb:Feedback)
RETURN {_FEEDBACK} AS row ORDER BY fb.created_at DESC, fb.seq DESC LIMIT $limit
"""
Q_WEIGHTS_SAVE = "MERGE (w:Weights {scope: $row.scope}) SET w = $row"
Q_WEIGHTS_LOAD = "MATCH (w:Weights {scope: $scope}) RETURN w {.*} AS row"
