-- memory_node fleet store: PostgreSQL >= 14 with pgvector (>= 0.8 for iterative HNSW scans).
-- Applied by `memory-sync --init-schema` (or by hand, as a role that may create objects).
-- Robots then need only the grants in README.md ("Fleet": least-privilege robot role).
CREATE EXTENSION IF NOT EXISTS vector;
CREATE EXTENSION IF NOT EXISTS btree_gist;

CREATE TABLE IF NOT EXISTS memory_fleet_meta (
    key   text PRIMARY KEY,
    value text NOT NULL
);
INSERT INTO memory_fleet_meta(key, value) VALUES ('schema_version', '1')
    ON CONFLICT (key) DO NOTHING;
INSERT INTO memory_fleet_meta(key, value) VALUES ('fleet_uuid', md5(random()::text || clock_timestamp()::text))
    ON CONFLICT (key) DO NOTHING;

-- One row per robot: the map its `map` frame belongs to (robots that share a map server give
-- the same map id), written by its memory-sync.
CREATE TABLE IF NOT EXISTS memory_robots (
    robot_id  text PRIMARY KEY,
    map_id    text NOT NULL,
    last_sync timestamptz NOT NULL DEFAULT now()
);

-- Sync progress per (robot, local store): the highest outbox position acknowledged. Written
-- in the same transaction as the rows it acknowledges.
CREATE TABLE IF NOT EXISTS memory_sync_state (
    robot_id   text NOT NULL,
    store_id   text NOT NULL,   -- the local memory.db's db_uuid
    acked_seq  bigint NOT NULL DEFAULT 0,
    rows_total bigint NOT NULL DEFAULT 0,
    updated    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (robot_id, store_id)
);

-- Embedding models seen, with their dimension (an HNSW index needs a fixed one).
CREATE TABLE IF NOT EXISTS memory_models (
    model_id text PRIMARY KEY,
    dim      integer NOT NULL
);

-- Every observation of every robot: (robot_id, store_id, local_id) is the row's identity, so
-- a re-sent batch updates nothing and a replaced disk (new store_id) never overwrites.
CREATE TABLE IF NOT EXISTS memory_observations (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    robot_id      text NOT NULL,
    store_id      text NOT NULL,
    local_id      bigint NOT NULL,
    stream        text NOT NULL,
    t             double precision NOT NULL,
    map_id        text,
    x double precision, y double precision, z double precision, yaw double precision,
    frame         text,
    pose_source   text NOT NULL DEFAULT 'none',
    tags          jsonb NOT NULL DEFAULT '{}',
    text          text NOT NULL DEFAULT '',
    ref           text,
    model_id      text,
    note_key      text,
    emb           vector,
    archived_at   double precision,   -- set when the robot's compaction archived the row
    archive_reason text,
    kept_local_id bigint,             -- the row it was folded into (same robot and store)
    synced_at     timestamptz NOT NULL DEFAULT now(),
    UNIQUE (robot_id, store_id, local_id)
);
CREATE INDEX IF NOT EXISTS memory_obs_stream_t ON memory_observations (stream, t)
    WHERE archived_at IS NULL;
CREATE INDEX IF NOT EXISTS memory_obs_t ON memory_observations (t) WHERE archived_at IS NULL;
CREATE INDEX IF NOT EXISTS memory_obs_robot_t ON memory_observations (robot_id, t);
CREATE INDEX IF NOT EXISTS memory_obs_map_xy ON memory_observations
    USING gist (map_id, point(x, y)) WHERE archived_at IS NULL AND x IS NOT NULL;
