"""The engine's operations, one module per job, composed by `MemoryEngine` (core/engine.py).

The engine is a facade: it keeps the contract's names and the open parts (store, indexes,
notes, places, backend), and hands each operation to the part that does it:
- `models`: the embedders, the describer and captioner, and query vectors;
- `storage`: opening and closing a robot's memory directory (`LocalStorage`);
- `repair`: start-up repair of notes and vectors left behind by a crash or a full disk;
- `search`: resolving a search into a plan and answering it through the planner;
- `visits`: visits to a circle, through the planner and its backend like search;
- `saving`: notes (Markdown first, folding repeats, catching up) and place naming;
- `streams`: the streams answer;
- `upkeep`: compaction and the disk budget, on request and in the background.

A memory served from elsewhere (the fleet store) passes its own parts for what differs
(`EngineParts`) instead of overriding the engine's methods.
"""
