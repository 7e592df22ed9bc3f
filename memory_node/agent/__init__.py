"""Agent adapter: skills, MCP server, system-prompt text, per-turn pose context."""
