-- memory_node fleet store: PostgreSQL >= 14 with pgvector (>= 0.8 for iterative HNSW scans).
-- Applied by `memory-sync --init-schema` (or by hand, as a role that may create objects).
-- Robots then need only the grants in README.md ("Fleet": least-privilege robot role).
CREATE EXTENSION IF NOT EXISTS vector;
CREATE EXTENSION IF NOT EXISTS btree_gist;

CREATE TABLE IF NOT EXISTS memory_fleet_meta (
    key   text PRIMARY KEY,
    value text NOT NULL
);
INSERT INTO memory_fleet_meta(key, value) VALUES ('schema_version', '2')
    ON CONFLICT (key) DO UPDATE
    SET value = greatest(memory_fleet_meta.value::int, EXCLUDED.value::int)::text;
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
    -- what a camera keyframe covered (seen_near): a sector in the row's map, and its box
    view_x double precision, view_y double precision, view_yaw double precision,
    view_hfov double precision, view_range double precision,
    view_box      box,
    synced_at     timestamptz NOT NULL DEFAULT now(),
    UNIQUE (robot_id, store_id, local_id)
);
CREATE INDEX IF NOT EXISTS memory_obs_stream_t ON memory_observations (stream, t)
    WHERE archived_at IS NULL;
CREATE INDEX IF NOT EXISTS memory_obs_t ON memory_observations (t) WHERE archived_at IS NULL;
CREATE INDEX IF NOT EXISTS memory_obs_robot_t ON memory_observations (robot_id, t);
CREATE INDEX IF NOT EXISTS memory_obs_map_xy ON memory_observations
    USING gist (map_id, point(x, y)) WHERE archived_at IS NULL AND x IS NOT NULL;

-- Version 2: camera views and named places (an existing version-1 store gains them here).
ALTER TABLE memory_observations
    ADD COLUMN IF NOT EXISTS view_x double precision,
    ADD COLUMN IF NOT EXISTS view_y double precision,
    ADD COLUMN IF NOT EXISTS view_yaw double precision,
    ADD COLUMN IF NOT EXISTS view_hfov double precision,
    ADD COLUMN IF NOT EXISTS view_range double precision,
    ADD COLUMN IF NOT EXISTS view_box box;
CREATE INDEX IF NOT EXISTS memory_obs_map_view ON memory_observations
    USING gist (map_id, view_box) WHERE view_box IS NOT NULL;

-- a * b and a / b as IEEE arithmetic (and SQLite, numpy, Python) give them: PostgreSQL raises
-- "value out of range: underflow" where a result of non-zero numbers rounds to 0, so these
-- decide that case on numbers scaled by 2^600 (exact) and answer 0 without the error.
CREATE OR REPLACE FUNCTION memory_mul(a float8, b float8) RETURNS float8
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT CASE WHEN a = 0 OR b = 0 OR abs(a) >= 1 OR abs(b) >= 1
                     OR (abs(a) >= 2::float8 ^ -537 AND abs(b) >= 2::float8 ^ -537) THEN a * b
                WHEN abs((a * 2::float8 ^ 600) * (b * 2::float8 ^ 600)) <= 2::float8 ^ 125
                     THEN 0::float8
                ELSE a * b END $$;
CREATE OR REPLACE FUNCTION memory_div(a float8, b float8) RETURNS float8
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT CASE WHEN a = 0 OR abs(b) <= 1 OR abs(a) >= 1 THEN a / b
                WHEN abs((a * 2::float8 ^ 600) / b) <= 2::float8 ^ -475 THEN 0::float8
                ELSE a / b END $$;

-- memory_view_covers for any numbers: every product and quotient through memory_mul and
-- memory_div (slower; taken where a number is outside what can underflow there).
CREATE OR REPLACE FUNCTION memory_view_covers_exact(x float8, y float8, yaw float8, hfov float8,
        rng float8, px float8, py float8, r float8) RETURNS boolean
    LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $$
DECLARE
    d float8 := sqrt(memory_mul(px - x, px - x) + memory_mul(py - y, py - y));
    half float8 := memory_div(hfov, 2);
    w float8; a float8; dx float8; dy float8; l2 float8; s float8; qx float8; qy float8;
BEGIN
    IF d <= r THEN RETURN true; END IF;
    IF d > rng + r THEN RETURN false; END IF;
    -- the bearing's angle to the heading, wrapped to (-pi, pi]
    w := atan2(py - y, px - x) - yaw + pi();
    w := w - 2 * pi() * trunc(memory_div(w, 2 * pi()));
    IF w <= 0 THEN w := w + 2 * pi(); END IF;
    IF abs(w - pi()) <= half THEN RETURN true; END IF;
    FOREACH a IN ARRAY ARRAY[yaw - half, yaw + half] LOOP
        dx := memory_mul(rng, cos(a));
        dy := memory_mul(rng, sin(a));
        l2 := memory_mul(dx, dx) + memory_mul(dy, dy);
        s := CASE WHEN l2 = 0 THEN 0
                  ELSE greatest(0, least(1, memory_div(memory_mul(px - x, dx)
                                                       + memory_mul(py - y, dy), l2))) END;
        qx := px - (x + memory_mul(s, dx));
        qy := py - (y + memory_mul(s, dy));
        IF sqrt(memory_mul(qx, qx) + memory_mul(qy, qy)) <= r THEN RETURN true; END IF;
    END LOOP;
    RETURN false;
END $$;

-- Whether the disc (px, py, r) meets the sector at (x, y) along yaw, hfov wide, rng deep: the
-- same test, operation for operation, as the robot's store (memory_node/core/types.py,
-- view_covers). With coordinates and yaw 0 or within 1e-9..1e9 in size, hfov 0 or within
-- 1e-9..1e3, range within 1e-6..1e6 and r below 1e30 no product or quotient below can round
-- to 0 (nor overflow), so plain float8 arithmetic runs; other numbers take the _exact twin.
CREATE OR REPLACE FUNCTION memory_view_covers(x float8, y float8, yaw float8, hfov float8,
        rng float8, px float8, py float8, r float8) RETURNS boolean
    LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $$
DECLARE
    d float8; half float8;
    w float8; a float8; dx float8; dy float8; l2 float8; s float8; qx float8; qy float8;
BEGIN
    IF NOT ((x = 0 OR abs(x) BETWEEN 1e-9 AND 1e9) AND (y = 0 OR abs(y) BETWEEN 1e-9 AND 1e9)
            AND (px = 0 OR abs(px) BETWEEN 1e-9 AND 1e9)
            AND (py = 0 OR abs(py) BETWEEN 1e-9 AND 1e9)
            AND (yaw = 0 OR abs(yaw) BETWEEN 1e-9 AND 1e9)
            AND (hfov = 0 OR abs(hfov) BETWEEN 1e-9 AND 1e3)
            AND rng BETWEEN 1e-6 AND 1e6 AND abs(r) < 1e30) THEN
        RETURN memory_view_covers_exact(x, y, yaw, hfov, rng, px, py, r);
    END IF;
    d := sqrt((px - x) * (px - x) + (py - y) * (py - y));
    IF d <= r THEN RETURN true; END IF;
    IF d > rng + r THEN RETURN false; END IF;
    half := hfov / 2;
    -- the bearing's angle to the heading, wrapped to (-pi, pi]
    w := atan2(py - y, px - x) - yaw + pi();
    w := w - 2 * pi() * trunc(w / (2 * pi()));
    IF w <= 0 THEN w := w + 2 * pi(); END IF;
    IF abs(w - pi()) <= half THEN RETURN true; END IF;
    FOREACH a IN ARRAY ARRAY[yaw - half, yaw + half] LOOP
        dx := rng * cos(a);
        dy := rng * sin(a);
        l2 := dx * dx + dy * dy;
        s := CASE WHEN l2 = 0 THEN 0
                  ELSE greatest(0, least(1, ((px - x) * dx + (py - y) * dy) / l2)) END;
        qx := px - (x + s * dx);
        qy := py - (y + s * dy);
        IF sqrt(qx * qx + qy * qy) <= r THEN RETURN true; END IF;
    END LOOP;
    RETURN false;
END $$;

-- Named places of each robot's memory (its notes, stream `places`), per local store: the
-- newest naming of a name wins, a removal keeps the row with `removed`. `map_id`: the map the
-- point is in, as for observations.
CREATE TABLE IF NOT EXISTS memory_places (
    robot_id  text NOT NULL,
    store_id  text NOT NULL,
    name_key  text NOT NULL,            -- the name without case or repeated blanks
    name      text NOT NULL,
    map_id    text,
    x double precision, y double precision, radius double precision,
    frame     text,
    t         double precision NOT NULL, -- when it was named (or removed)
    removed   boolean NOT NULL DEFAULT false,
    synced_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (robot_id, store_id, name_key)
);
