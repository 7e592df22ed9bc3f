"""The memory view: a local web page (map, search, keyframes, visits, streams) over a small
JSON API, served by `memory-view` or by memory-node's `view_port`."""
