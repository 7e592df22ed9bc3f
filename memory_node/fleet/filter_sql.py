"""The contract's `RowFilter` and orders compiled for PostgreSQL: the fleet store's SQL.

Each filter is a condition on `memory_observations` (alias `o`) evaluated before ranking, so a
filtered fleet answer is the exact one; `RowFilter.matches` is the reference the conditions are
property-tested against (test/fleet/test_filter_compilers_fleet.py), as the local store's are.
"""

from __future__ import annotations

import json
from typing import Any

from memory_node.core.types import RANGE_OPS_SQL, RowFilter, disc_slack


def ties(d: str) -> str:
    """Equal scores or times break by the robot's own row order (its local id), `d` (DESC:
    newest first, as on the robot), then by robot and store so a fleet order is total."""
    return f"o.local_id {d}, o.robot_id {d}, o.store_id {d}"


def _jsonb_values(value: Any) -> list[str]:
    """The JSON texts a tag equality filter matches (SQLite's json_extract sees true as 1, so
    true equals 1 and 1.0, and 0.0 equals false)."""
    out = [json.dumps(value)]
    if isinstance(value, bool):
        out.append(json.dumps(int(value)))
    elif isinstance(value, (int, float)) and value in (0, 1):
        out.append(json.dumps(bool(value)))
    return out


# The largest float whose square is 0.0 in IEEE arithmetic. PostgreSQL raises "value out of
# range: underflow" where a product of non-zero numbers rounds to 0 (SQLite and numpy give 0),
# so a difference this small is squared as 0 by hand: the same result, without the error.
SQUARE_ZERO = float.fromhex("0x1.6a09e667f3bccp-538")
# (column - %s)², its parameters: the centre, SQUARE_ZERO, the centre twice.
_SQUARE = "(CASE WHEN abs({0} - %s) <= %s THEN 0 ELSE ({0} - %s) * ({0} - %s) END)"


def where(filt: RowFilter) -> tuple[list[str], list[Any]]:
    """SQL conditions (on alias o) and their parameters: `filt` compiled for PostgreSQL
    (RowFilter.matches is the reference it is checked against)."""
    conds: list[str] = []
    params: list[Any] = []
    if not filt.include_archived:
        conds.append("o.archived_at IS NULL")
    if filt.robots:
        conds.append("o.robot_id = ANY(%s)")
        params.append(list(filt.robots))
    if filt.streams:
        conds.append("o.stream = ANY(%s)")
        params.append(list(filt.streams))
    if filt.near is not None:
        nx, ny = filt.near
        r = float(filt.radius)
        on_map = "o.map_id = %s AND " if filt.map_id is not None else ""
        map_param = [filt.map_id] if filt.map_id is not None else []
        # The GiST index finds a circle a hair wider than the disc (its distance is a
        # hypot, not the squares); the squared distance then decides exactly as the local
        # store does.
        m = disc_slack(filt.near, r)
        stand = ("(o.x IS NOT NULL AND point(o.x, o.y) <@ circle(point(%s, %s), %s)"
                 f" AND ({_SQUARE.format('o.x')} + {_SQUARE.format('o.y')}) <= %s)")
        sparams = [nx, ny, r + m, nx, SQUARE_ZERO, nx, nx, ny, SQUARE_ZERO, ny, ny, r * r]
        if filt.seen_near:
            # ... or a camera view that covers the disc: its box meets the disc's, then
            # the sector test of the robot's store.
            conds.append(f"{on_map}({stand} OR (o.view_box && box(point(%s, %s),"
                         " point(%s, %s)) AND memory_view_covers(o.view_x, o.view_y,"
                         " o.view_yaw, o.view_hfov, o.view_range, %s, %s, %s)))")
            params += [*map_param, *sparams, nx - r - m, ny - r - m, nx + r + m,
                       ny + r + m, nx, ny, r]
        else:
            conds.append(f"{on_map}{stand}")
            params += [*map_param, *sparams]
    time_window(conds, params, "o.t", filt.t_min, filt.t_max)
    from psycopg.types.json import Jsonb

    for key, value in filt.tags.items():
        if isinstance(value, dict):
            conds.append("jsonb_typeof(o.tags -> %s) = 'number'")
            params.append(key)
            for op, bound in value.items():
                sym = RANGE_OPS_SQL[op]
                conds.append(f"(o.tags ->> %s)::float8 {sym} %s")
                params += [key, float(bound)]
        elif value is None:
            conds.append("(o.tags -> %s IS NULL OR o.tags -> %s = 'null'::jsonb)")
            params += [key, key]
        else:
            vals = [Jsonb(json.loads(v)) for v in _jsonb_values(value)]
            conds.append("(CASE WHEN jsonb_typeof(o.tags -> %s) = 'array' THEN EXISTS ("
                         "SELECT 1 FROM jsonb_array_elements(o.tags -> %s) e"
                         " WHERE e = ANY(%s::jsonb[])) ELSE o.tags -> %s = ANY(%s::jsonb[])"
                         " END)")
            params += [key, key, vals, key, vals]
    return conds, params

def order(order_by: str) -> tuple[str, list[Any]]:
    if order_by in ("-time", "time", "score"):
        d = "ASC" if order_by == "time" else "DESC"
        return f"o.t {d}, {ties(d)}", []
    d = "DESC" if order_by.startswith("-") else "ASC"
    tag = order_by.lstrip("-")
    num = ("(CASE WHEN jsonb_typeof(o.tags -> %s) = 'number'"
           " THEN (o.tags ->> %s)::float8 END)")
    return f"{num} IS NULL, {num} {d}, o.t DESC, {ties('DESC')}", [tag, tag, tag, tag]


def time_window(conds: list[str], params: list[Any], column: str, t_min: float | None,
                 t_max: float | None) -> None:
    """Add `t_min <= column <= t_max` (either side optional) to a WHERE being built."""
    if t_min is not None:
        conds.append(f"{column} >= %s")
        params.append(float(t_min))
    if t_max is not None:
        conds.append(f"{column} <= %s")
        params.append(float(t_max))
