"""`streams`: each stream's counts and times, what the disk budget removed, caption progress
and cost, the named places and the vector indexes."""

from __future__ import annotations

from memory_node.core.contract import IndexInfo, PlaceInfo, StreamInfo, StreamsAnswer
from memory_node.core.operations.host import Host
from memory_node.core.operations.models import Models


class StreamsReport:
    """The streams answer of a robot's own memory."""

    def __init__(self, host: Host, models: Models):
        self.host = host
        self.models = models

    def answer(self) -> StreamsAnswer:
        """`streams`: each stream's counts and times, and the named places."""
        host = self.host
        entries = [StreamInfo(**e) for e in host._store.stream_stats()]
        disk, evicted, oldest = host._disk.streams_fields()
        for entry in entries:
            entry.evicted = evicted.get(entry.name, 0)
            entry.oldest_t = oldest.get(entry.name, entry.first_t)
            if entry.name == "camera":
                self.camera_extras(entry)
        return StreamsAnswer(streams=entries,
                             places=[PlaceInfo(**p.info()) for p in host._places.all()],
                             indexes=[IndexInfo(**g) for g in host._indexes.graph_info()]
                             or None,
                             **disk)

    def camera_extras(self, entry: StreamInfo) -> None:
        """Caption progress and cost (describer vlm), and rows awaiting a new embedding."""
        cfg = self.host.config
        if self.models.captions():
            counts = self.host._store.tag_counts("camera", "caption")
            entry.captioned = counts.get("done", 0)
            entry.pending = counts.get("pending", 0)
            entry.failed = counts.get("failed", 0)
            entry.caption_max_per_min = cfg.caption_max_per_min
            if self.models.captioner_job is not None:
                est = self.models.captioner_job.estimate(entry.pending)
            else:
                from memory_node.core.captioner import CAPTION_TOKENS, PROMPT_TOKENS

                ceiling = int(cfg.caption_max_per_min * 60)
                reqs = ceiling if entry.pending else 0
                est = {"caption_requests_per_hour": reqs,
                       "caption_tokens_per_hour": reqs * (PROMPT_TOKENS + CAPTION_TOKENS)}
            entry.caption_requests_per_hour = est["caption_requests_per_hour"]
            entry.caption_tokens_per_hour = est["caption_tokens_per_hour"]
        pending = self.host.reembed_pending()
        if pending:
            entry.reembed_pending = pending
