"""The parts of a robot's own memory engine, built together (they call each other)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from memory_node.core.operations.host import CompactPart, Host, SavePart, Storage, StreamsPart
from memory_node.core.operations.models import Models
from memory_node.core.operations.repair import StartupRepair
from memory_node.core.operations.saving import NoteSaving
from memory_node.core.operations.search import SearchResolver
from memory_node.core.operations.storage import LocalStorage
from memory_node.core.operations.streams import StreamsReport
from memory_node.core.operations.upkeep import Upkeep
from memory_node.core.operations.visits import VisitFinder


@dataclass
class EngineParts:
    """The operations that differ between memories: a robot's own directory (the default)
    or a store served from elsewhere (the fleet's passes its own)."""

    storage: Storage
    search: SearchResolver
    visits: VisitFinder
    save: SavePart
    compact: CompactPart
    streams: StreamsPart


def local_parts(host: Host, models: Models, repair: StartupRepair,
                llm_settings: Any) -> EngineParts:
    """The parts of an engine over a robot's own memory directory."""
    saving = NoteSaving(host, models, repair)
    upkeep = Upkeep(host, saving, llm_settings)
    return EngineParts(storage=LocalStorage(host, models, repair, saving, upkeep),
                       search=SearchResolver(host), visits=VisitFinder(host), save=saving,
                       compact=upkeep, streams=StreamsReport(host, models))
