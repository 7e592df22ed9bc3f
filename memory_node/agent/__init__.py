"""Agent adapter: skills, MCP server, system-prompt text, per-turn pose context.

- `client`: `MemoryClient` (the one interface) and `EngineClient` (in-process, no ROS)
- `ros_client`: `RosClient` (the ROS services and TF; imports rclpy when built)
- `skills`: the skill list, OpenAI-style specs and calls
- `answers`: the text lines skills answer
- `prompt`: `MEMORY_PROMPT_SECTION`, `pose_line`, `prepend_pose`
- `recorder`: `SkillCallRecorder` (optional trail of the agent's skill calls)
- `mcp_server`: `memory-mcp`

Nothing is imported here, so `import memory_node.agent.skills` loads neither rclpy nor the MCP
SDK.
"""
